"""A webhook receiver for tests/tests/webhooks.rs that trusts nothing of the fleet's code: every
request is verified with the Standard Webhooks library (`standardwebhooks` on PyPI) and decoded
as a CloudEvent with the CloudEvents SDK.

    python webhook_receiver.py <port> <secrets file> <out file>

The secrets file holds one `whsec_…` secret a line and is read again on every request (a test
adds the new secret after a rotation). A request is verified with each secret; it is accepted
(204) when at least one accepts it, and recorded as a JSON line in the out file:
{"webhook_id", "type", "run", "id", "verified": [true/false per secret], "content_type"}.
Otherwise it is answered 500. While the file `<out file>.fail` exists every request is answered
503 (a receiver that is down without going away). While the file `<out file>.redirect` exists,
every request is answered 307 to the URL it holds, and a line is added to `<out file>.redirected`.
"""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cloudevents.core.formats.json import JSONFormat
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

PORT = int(sys.argv[1])
SECRETS = sys.argv[2]
OUT = sys.argv[3]
LOCK = threading.Lock()


def secrets():
    with open(SECRETS) as f:
        return [line.strip() for line in f if line.strip()]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if os.path.exists(OUT + ".fail"):
            return self.answer(503)
        if os.path.exists(OUT + ".redirect"):
            with open(OUT + ".redirect") as f:
                to = f.read().strip()
            with LOCK:
                with open(OUT + ".redirected", "a") as f:
                    f.write(to + "\n")
            self.send_response(307)
            self.send_header("Location", to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        verified = []
        for secret in secrets():
            try:
                Webhook(secret).verify(body, headers)
                verified.append(True)
            except WebhookVerificationError:
                verified.append(False)
        if not any(verified):
            return self.answer(500)
        event = JSONFormat().read(None, body)
        line = {
            "webhook_id": headers.get("webhook-id"),
            "signatures": len(headers.get("webhook-signature", "").split(" ")),
            "content_type": headers.get("content-type"),
            "id": event.get_id(),
            "type": event.get_type(),
            "run": event.get_extension("deltarun"),
            "agent": event.get_extension("deltaagent"),
            "verified": verified,
        }
        with LOCK:
            with open(OUT, "a") as f:
                f.write(json.dumps(line) + "\n")
        self.answer(204)


server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
server.allow_reuse_address = True
print("listening", flush=True)
server.serve_forever()
