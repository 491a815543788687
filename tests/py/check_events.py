"""Decodes the fleet's NATS events with the CloudEvents SDK for Python and checks each against
its JSON Schema in docs/events/ (tests/tests/events.rs runs it).

    check_events.py <events.jsonl> <docs/events>

Each input line is {"subject": <NATS subject>, "payload": <the message's text>}. Prints one JSON
object: {"events": [{"type", "id", "source", "subject", "deltarun", "deltarequest", "time",
"nats_subject", "data"}...]} in input order, and exits non-zero, naming the event and the fault,
on the first one the SDK refuses or that does not match its schema or its subject.
"""

import json
import pathlib
import sys

import jsonschema
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

# Which NATS subject family carries which event types.
FAMILIES = {
    "interactions.requested": {"dev.delta.interaction.requested"},
    "interactions.resolved": {
        "dev.delta.interaction.answered",
        "dev.delta.interaction.expired",
        "dev.delta.interaction.cancelled",
    },
    "interactions.updated": {"dev.delta.interaction.updated"},
    "interactions.escalated": {"dev.delta.interaction.escalated"},
    "runs.completed": {"dev.delta.run.completed"},
    "runs.failed": {"dev.delta.run.failed"},
    "runs.cancelled": {"dev.delta.run.cancelled"},
}


def fail(n, why):
    print(f"event {n}: {why}", file=sys.stderr)
    sys.exit(1)


def main():
    lines = pathlib.Path(sys.argv[1]).read_text().splitlines()
    schemas_dir = pathlib.Path(sys.argv[2])
    fmt = JSONFormat()
    validators = {}
    out = []
    for n, line in enumerate(lines, 1):
        msg = json.loads(line)
        try:
            event = fmt.read(None, msg["payload"].encode())
        except Exception as e:  # the SDK refusing it is the finding
            fail(n, f"the CloudEvents SDK refuses it: {e!r}")
        if not isinstance(event, CloudEvent):
            fail(n, f"not a CloudEvents 1.0 event: {type(event)}")
        if event.get_specversion() != "1.0":
            fail(n, f"specversion {event.get_specversion()}")
        ty = event.get_type()
        schema_file = schemas_dir / f"{ty}.schema.json"
        if not schema_file.exists():
            fail(n, f"type {ty} has no schema in {schemas_dir}")
        if ty not in validators:
            schema = json.loads(schema_file.read_text())
            jsonschema.Draft202012Validator.check_schema(schema)
            validators[ty] = jsonschema.Draft202012Validator(
                schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
            )
        raw = json.loads(msg["payload"])
        errors = sorted(validators[ty].iter_errors(raw), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            fail(n, f"{ty} does not match its schema at {list(e.path)}: {e.message}")
        parts = msg["subject"].split(".")
        family = ".".join(parts[1:3])
        if ty not in FAMILIES.get(family, set()):
            fail(n, f"{ty} published on {msg['subject']}")
        agent, run = parts[3], parts[4]
        if event.get_extension("deltaagent") != agent or event.get_extension("deltarun") != run:
            fail(n, f"agent/run of {msg['subject']} differ from the event's")
        if event.get_datacontenttype() != "application/json":
            fail(n, f"datacontenttype {event.get_datacontenttype()}")
        data = event.get_data()
        if not isinstance(data, dict) or data.get("run_id") != run:
            fail(n, "data is not the run's")
        out.append(
            {
                "type": ty,
                "id": event.get_id(),
                "source": event.get_source(),
                "subject": event.get_subject(),
                "deltarun": event.get_extension("deltarun"),
                "deltarequest": event.get_extension("deltarequest"),
                "time": event.get_time().isoformat(),
                "nats_subject": msg["subject"],
                "data": data,
            }
        )
    print(json.dumps({"events": out}))


main()
