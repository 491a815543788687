"""The fleet's A2A server driven by the official A2A Python SDK (PyPI `a2a-sdk`), as
tests/tests/a2a.rs runs it: `a2a_client.py <gateway base URL> <scenario>`.

Each scenario checks what the SDK sees, and prints one JSON line (the last of its output) with
what it observed, for the Rust test to assert on as well. Push notifications are verified with
PyJWT against the JWKS the gateway serves. Run from outside the `a2a` package's directory
(its `types` module would shadow the standard library's).
"""

import asyncio
import hashlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import json
import sys
import threading
import time
import uuid

import httpx
import jwt
from google.protobuf import json_format, struct_pb2

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    UnsupportedOperationError,
)

BASE = sys.argv[1].rstrip("/")
SCENARIO = sys.argv[2]


def state_name(s):
    return TaskState.Name(s)


def message(text=None, data=None, task_id=None, skill=None):
    parts = []
    if text is not None:
        parts.append(Part(text=text))
    if data is not None:
        parts.append(Part(data=json_format.ParseDict(data, struct_pb2.Value())))
    m = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=parts)
    if task_id:
        m.task_id = task_id
    if skill:
        m.metadata.update({"skill": skill})
    return m


def question_of(task_or_status):
    """The data part of a status message: the question."""
    status = task_or_status.status
    for p in status.message.parts:
        if p.HasField("data"):
            return json_format.MessageToDict(p.data)
    return None


def status_text(status):
    return "\n".join(p.text for p in status.message.parts if p.text)


async def clients(http, streaming):
    card = await A2ACardResolver(http, BASE).get_agent_card()
    factory = ClientFactory(ClientConfig(streaming=streaming, httpx_client=http))
    return card, factory.create(card)


async def send(client, req):
    """The one task a non-streaming send returns."""
    out = None
    async for r in client.send_message(req):
        assert r.HasField("task"), r
        out = r.task
    assert out is not None
    return out


async def wait_state(client, task_id, want, within=60):
    deadline = time.monotonic() + within
    while True:
        t = await client.get_task(GetTaskRequest(id=task_id))
        if t.status.state in want:
            return t
        assert time.monotonic() < deadline, f"task {task_id} stuck in {state_name(t.status.state)}"
        await asyncio.sleep(0.2)


async def card_scenario(http):
    card, _ = await clients(http, False)
    d = json_format.MessageToDict(card)
    return {
        "name": card.name,
        "skills": sorted(s.id for s in card.skills),
        "bindings": [i.protocol_binding for i in card.supported_interfaces],
        "versions": [i.protocol_version for i in card.supported_interfaces],
        "urls": [i.url for i in card.supported_interfaces],
        "streaming": card.capabilities.streaming,
        "push": card.capabilities.push_notifications,
        "raw_keys": sorted(d.keys()),
    }


async def hello_scenario(http):
    _, client = await clients(http, False)
    task = await send(client, SendMessageRequest(message=message("the A2A test", skill="hello")))
    first = state_name(task.status.state)
    q = question_of(task)
    prompt_text = status_text(task.status)
    task = await send(client, SendMessageRequest(message=message("Ada", task_id=task.id)))
    after_answer = state_name(task.status.state)
    done = await wait_state(client, task.id, [TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED])
    result = "".join(p.text for a in done.artifacts for p in a.parts)
    # The same answer again: the task is no longer waiting, so it is refused.
    again = None
    try:
        await send(client, SendMessageRequest(message=message("Ada", task_id=task.id)))
    except UnsupportedOperationError as e:
        again = (e.data or {}).get("code")
    return {
        "task_id": task.id,
        "context_id": task.context_id,
        "first": first,
        "question": q,
        "prompt_text": prompt_text,
        "after_answer": after_answer,
        "final": state_name(done.status.state),
        "result": result,
        "again": again,
    }


async def bad_answer_scenario(http):
    _, client = await clients(http, False)
    task = await send(client, SendMessageRequest(message=message("9.9.9", skill="deployer")))
    q = question_of(task)
    code = None
    message_text = None
    try:
        await send(client, SendMessageRequest(message=message("maybe", task_id=task.id)))
    except InvalidParamsError as e:
        code = (e.data or {}).get("code")
        message_text = str(e)
    still = await client.get_task(GetTaskRequest(id=task.id))
    missing = None
    try:
        await client.get_task(GetTaskRequest(id=str(uuid.uuid4())))
    except Exception as e:  # noqa: BLE001
        missing = type(e).__name__
    return {
        "first": state_name(task.status.state),
        "options": [o["option_id"] for o in (q or {}).get("options", [])],
        "code": code,
        "message": message_text,
        "still": state_name(still.status.state),
        "missing": missing,
    }


async def collect(stream, seen):
    """States from a stream, until it ends."""
    last = None
    async for r in stream:
        if r.HasField("task"):
            last = r.task.status
            task_id = r.task.id
        elif r.HasField("status_update"):
            last = r.status_update.status
            task_id = r.status_update.task_id
        else:
            continue
        seen.append(state_name(last.state))
    return task_id, last


def pick(status, action):
    q = question_of(type("T", (), {"status": status})())
    for o in q["options"]:
        if o.get("action") == action:
            return o["option_id"], q
    raise AssertionError(f"no {action} option in {q}")


async def stream_scenario(http):
    """deployer through streams: plan → key (sensitive) → environment → approval → done."""
    _, client = await clients(http, True)
    seen = []
    task_id, last = await collect(
        client.send_message(SendMessageRequest(message=message("1.4.2", skill="deployer"))), seen
    )
    assert state_name(last.state) == "TASK_STATE_INPUT_REQUIRED", seen
    confirm, _ = pick(last, "APPROVE_AND_EXECUTE")
    seen.append("|")
    _, last = await collect(
        client.send_message(SendMessageRequest(message=message(confirm, task_id=task_id))), seen
    )
    # The key is sensitive: auth-required, with a link, and no way to answer through A2A.
    assert state_name(last.state) == "TASK_STATE_AUTH_REQUIRED", seen
    key_q = question_of(type("T", (), {"status": last})())
    link = key_q.get("url")
    key_text = status_text(last)
    refused = None
    try:
        async for _ in client.send_message(
            SendMessageRequest(message=message("s3cret-key-via-a2a", task_id=task_id))
        ):
            pass
    except UnsupportedOperationError as e:
        refused = {"code": (e.data or {}).get("code"), "echoed": "s3cret-key-via-a2a" in str(e)}
    # Answered where sensitive answers go: the inbox, through the one-time link (what the
    # inbox's page does with `#link=`).
    secret_link = link.split("#link=", 1)[1]
    r = await http.post(f"{BASE}/v1/answer-links/open", json={"link": secret_link})
    assert r.status_code == 200, r.text
    opened = r.json()
    r = await http.post(
        f"{BASE}/v1/answer-links/answer",
        json={"link": secret_link, "answer": {"input": "s3cret-key-inbox"}},
    )
    assert r.status_code == 200, r.text
    reused = await http.post(
        f"{BASE}/v1/answer-links/answer",
        json={"link": secret_link, "answer": {"input": "s3cret-key-inbox"}},
    )
    seen.append("|")
    _, last = await collect(client.subscribe(SubscribeToTaskRequest(id=task_id)), seen)
    while state_name(last.state) == "TASK_STATE_WORKING":
        seen.append("|")
        _, last = await collect(client.subscribe(SubscribeToTaskRequest(id=task_id)), seen)
    assert state_name(last.state) == "TASK_STATE_INPUT_REQUIRED", seen
    env_q = question_of(type("T", (), {"status": last})())
    seen.append("|")
    _, last = await collect(
        client.send_message(SendMessageRequest(message=message("Production", task_id=task_id))), seen
    )
    while state_name(last.state) == "TASK_STATE_WORKING":
        seen.append("|")
        _, last = await collect(client.subscribe(SubscribeToTaskRequest(id=task_id)), seen)
    assert state_name(last.state) == "TASK_STATE_INPUT_REQUIRED", seen
    approve, approval_q = pick(last, "APPROVE_AND_EXECUTE")
    seen.append("|")
    _, last = await collect(
        client.send_message(
            SendMessageRequest(message=message(data={"option_id": approve}, task_id=task_id))
        ),
        seen,
    )
    while state_name(last.state) == "TASK_STATE_WORKING":
        seen.append("|")
        _, last = await collect(client.subscribe(SubscribeToTaskRequest(id=task_id)), seen)
    return {
        "task_id": task_id,
        "seen": seen,
        "final": state_name(last.state),
        "final_text": status_text(last),
        "key_prompt": key_q.get("prompt"),
        "key_sensitive": key_q.get("sensitive"),
        "link": link,
        "key_text": key_text,
        "refused": refused,
        "opened_request": opened["request_id"] == key_q["request_id"],
        "link_reused": reused.status_code,
        "env_options": [o["option_id"] for o in env_q["options"]],
        "approval_type": approval_q.get("type"),
    }


async def cancel_scenario(http):
    _, client = await clients(http, False)
    task = await send(client, SendMessageRequest(message=message("to cancel", skill="hello")))
    first = state_name(task.status.state)
    cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
    again = None
    try:
        await client.cancel_task(CancelTaskRequest(id=task.id))
    except TaskNotCancelableError as e:
        again = (e.data or {}).get("code")
    got = await client.get_task(GetTaskRequest(id=task.id))
    return {
        "first": first,
        "cancelled": state_name(cancelled.status.state),
        "again": again,
        "get": state_name(got.status.state),
    }


class Receiver(BaseHTTPRequestHandler):
    received = []
    refused = 0
    failing = False
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with Receiver.lock:
            if Receiver.failing:
                Receiver.refused += 1
                self.send_response(503)
                self.end_headers()
                return
            Receiver.received.append(
                {
                    "auth": self.headers.get("Authorization", ""),
                    "token": self.headers.get("X-A2A-Notification-Token"),
                    "content_type": self.headers.get("Content-Type"),
                    "body": body,
                }
            )
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


async def push_scenario(http):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/a2a-hook?secret=in-the-url"
    _, client = await clients(http, False)
    config = TaskPushNotificationConfig(url=url, token="tok-123")
    req = SendMessageRequest(
        message=message("push me", skill="hello"),
        configuration=SendMessageConfiguration(task_push_notification_config=config),
    )
    task = await send(client, req)
    listed = await client.list_task_push_notification_configs(
        ListTaskPushNotificationConfigsRequest(task_id=task.id)
    )
    shown = [json_format.MessageToDict(c) for c in listed.configs]
    await send(client, SendMessageRequest(message=message("Grace", task_id=task.id)))
    deadline = time.monotonic() + 60
    while True:
        with Receiver.lock:
            got = list(Receiver.received)
        states = []
        for g in got:
            states.append(json.loads(g["body"])["statusUpdate"]["status"]["state"])
        if "TASK_STATE_COMPLETED" in states:
            break
        assert time.monotonic() < deadline, f"no completed notification: {states}"
        await asyncio.sleep(0.2)
    # Every check below depends on what the server sent: the served JWKS must hold the JWT's
    # `kid`, the signature must verify, `aud` must be this receiver's origin, and
    # `request_body_sha256` must be the SHA-256 of the exact bytes received.
    origin = f"http://127.0.0.1:{srv.server_address[1]}"
    served = httpx.get(f"{BASE}/.well-known/jwks.json").json()
    served_kids = [k["kid"] for k in served["keys"]]
    jwks = jwt.PyJWKClient(f"{BASE}/.well-known/jwks.json")
    verified = []
    for g in got:
        assert g["auth"].startswith("Bearer "), g["auth"]
        token = g["auth"][len("Bearer "):]
        header = jwt.get_unverified_header(token)
        key = jwks.get_signing_key_from_jwt(token)
        claims = jwt.decode(token, key.key, algorithms=["EdDSA"], audience=origin)
        wrong_aud_refused = False
        try:
            jwt.decode(token, key.key, algorithms=["EdDSA"], audience="http://elsewhere.example")
        except jwt.InvalidAudienceError:
            wrong_aud_refused = True
        verified.append(
            {
                "kid": header["kid"],
                "kid_is_jwks": header["kid"] in served_kids,
                "iat": isinstance(claims.get("iat"), int),
                "aud": claims.get("aud"),
                "wrong_aud_refused": wrong_aud_refused,
                "body_hash_ok": claims.get("request_body_sha256")
                == hashlib.sha256(g["body"]).hexdigest(),
                "task_id": claims.get("task_id"),
                "token": g["token"],
                "content_type": g["content_type"],
            }
        )
    srv.shutdown()
    return {
        "task_id": task.id,
        "origin": origin,
        "states": states,
        "verified": verified,
        "listed": shown,
    }


def verify(base, origin, got):
    """Each notification's JWT, checked by PyJWT against the JWKS `base` serves."""
    jwks = jwt.PyJWKClient(f"{base}/.well-known/jwks.json")
    out = []
    for g in got:
        token = g["auth"][len("Bearer "):]
        key = jwks.get_signing_key_from_jwt(token)
        claims = jwt.decode(token, key.key, algorithms=["EdDSA"], audience=origin)
        assert claims["request_body_sha256"] == hashlib.sha256(g["body"]).hexdigest(), claims
        out.append(json.loads(g["body"])["statusUpdate"]["status"]["state"])
    return out


async def push_durable_scenario(http):
    """Notifications outlive the gateway that was delivering them: the receiver refuses while
    the test kills that gateway and starts another (its URL comes on stdin), then accepts."""
    Receiver.failing = True
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    _, client = await clients(http, False)
    req = SendMessageRequest(
        message=message("durable", skill="hello"),
        configuration=SendMessageConfiguration(
            task_push_notification_config=TaskPushNotificationConfig(url=url)
        ),
    )
    task = await send(client, req)
    await send(client, SendMessageRequest(message=message("Hopper", task_id=task.id)))
    deadline = time.monotonic() + 60
    while True:
        with Receiver.lock:
            refused = Receiver.refused
        if refused >= 2:
            break
        assert time.monotonic() < deadline, "no attempts"
        await asyncio.sleep(0.1)
    print("failing", flush=True)
    new_base = sys.stdin.readline().strip()
    with Receiver.lock:
        Receiver.failing = False
    deadline = time.monotonic() + 60
    while True:
        with Receiver.lock:
            got = list(Receiver.received)
        states = [json.loads(g["body"])["statusUpdate"]["status"]["state"] for g in got]
        if "TASK_STATE_COMPLETED" in states:
            break
        assert time.monotonic() < deadline, f"no completed notification: {states}"
        await asyncio.sleep(0.2)
    verified = verify(new_base, f"http://127.0.0.1:{srv.server_address[1]}", got)
    srv.shutdown()
    return {"task_id": task.id, "states": states, "verified": verified, "refused": refused}


async def main():
    async with httpx.AsyncClient(timeout=60) as http:
        scenario = {
            "card": card_scenario,
            "hello": hello_scenario,
            "bad_answer": bad_answer_scenario,
            "stream": stream_scenario,
            "cancel": cancel_scenario,
            "push": push_scenario,
            "push_durable": push_durable_scenario,
        }[SCENARIO]
        out = await scenario(http)
    print(json.dumps(out))


asyncio.run(main())
