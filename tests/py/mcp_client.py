"""The fleet's MCP server (`/mcp`) driven by the official MCP Python SDK (PyPI `mcp`).

Usage: mcp_client.py <gateway base URL> <alice's token> <bob's token> <submit-only token>

alice (submit, answer) lists the tools, calls `hello` and answers its question through the
SDK's elicitation callback; calls `deployer` round by round (a wrong option first, refused with
the gateway's code; the plan confirmed; the API key through the one-time inbox link, answered
over HTTP as the person's browser would; the environment chosen); runs `hello` as a task; and, as a
client of the 2025-11-25 protocol, is asked within its call.
bob, a second client, reads the question alice answered as a resource. A submit-only token may
list and call tools but not answer. A call retried with its idempotency key (`_meta`, or the
`Idempotency-Key` header) is the first call's run. Prints one JSON report on stdout; any failed
check exits 1.
"""

import asyncio
import json
import sys
import urllib.parse

import httpx2
from mcp import Client
from typing import ClassVar, Literal

from mcp.client.extension import ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ElicitResult, Request, RequestParams, Result
from pydantic import Field, TypeAdapter

BASE, ALICE, BOB, SUBMITTER = sys.argv[1:5]
report = {}


def check(cond, what):
    if not cond:
        print(f"CHECK FAILED: {what}", file=sys.stderr)
        print(json.dumps(report, indent=2, default=str), file=sys.stderr)
        sys.exit(1)


def client(token, **kw):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(f"{BASE}/mcp", http_client=http), **kw)


async def hello():
    asked = []

    async def on_elicit(_ctx, params):
        asked.append({"mode": params.mode, "message": params.message,
                      "schema": params.requested_schema if params.mode == "form" else None})
        return ElicitResult(action="accept", content={"answer": "Ada"})

    async with client(ALICE, elicitation_callback=on_elicit) as c:
        report["protocol_version"] = c.protocol_version
        tools = await c.list_tools()
        report["tools"] = sorted(t.name for t in tools.tools)
        check({"hello", "deployer"} <= set(report["tools"]), "hello and deployer are tools")
        t = next(t for t in tools.tools if t.name == "hello")
        check(t.input_schema["required"] == ["task"], "a tool takes a task")
        result = await c.call_tool("hello", {"task": "greet"})
        report["hello"] = {"asked": asked, "is_error": result.is_error,
                           "text": result.content[0].text,
                           "structured": result.structured_content}
        check(len(asked) == 1 and asked[0]["mode"] == "form", "one form elicitation")
        check("What is your name?" in asked[0]["message"], "the prompt is the message")
        check(not result.is_error and "Ada" in result.content[0].text, "the run completed")


async def never(_ctx, params):
    check(False, f"driven by hand, never through the callback: {params}")


async def deployer():
    # The callback declares elicitation (form and URL); the rounds are driven by hand.
    async with client(ALICE, elicitation_callback=never) as c:
        s = c.session
        r = await s.call_tool("deployer", {"task": "1.4.2"}, allow_input_required=True)
        check(r.result_type == "input_required", "the plan is asked")
        (rid, req), = r.input_requests.items()
        plan = req.params
        check(plan.mode == "form" and plan.requested_schema["properties"]["option"]["enum"]
              == ["confirm", "modify", "cancel"], "the plan's options are an enum")
        report["deployer_run"] = json.loads(r.request_state)["run"]
        report["plan_request"] = rid
        # A wrong option: refused with the gateway's code, and nothing changes.
        try:
            await s.call_tool("deployer", {"task": "1.4.2"}, allow_input_required=True,
                              input_responses={rid: {"action": "accept", "content": {"option": "nope"}}},
                              request_state=r.request_state)
            check(False, "a wrong option is refused")
        except MCPError as e:
            report["refused"] = {"code": e.error.code, "data": e.error.data, "message": e.error.message}
            check(e.error.data["code"] == "invalid_option", "refused as invalid_option")
        r = await s.call_tool("deployer", {"task": "1.4.2"}, allow_input_required=True,
                              input_responses={rid: {"action": "accept", "content": {"option": "confirm"}}},
                              request_state=r.request_state)
        # The API key: sensitive, so a link, never a form.
        (kid, req), = r.input_requests.items()
        check(req.params.mode == "url", "a sensitive question is a URL elicitation")
        url = req.params.url
        report["link"] = url
        check("#link=" in url and "/answer" in url, "the link opens the inbox's answer page")
        # The person opens the link: the page does these two calls (tests/tests/inbox.rs drives it).
        link = urllib.parse.parse_qs(urllib.parse.urlparse(url).fragment)["link"][0]
        async with httpx2.AsyncClient() as h:
            v = (await h.post(f"{BASE}/v1/answer-links/open", json={"link": link})).json()
            check(v["request_id"] == kid and v["responder"] == "alice", f"the link opens its question: {v}")
            bad = await h.post(f"{BASE}/v1/answer-links/answer", json={"link": link, "answer": {"input": "k", "responder": {"id": "mallory"}}})
            report["link_bad"] = bad.status_code
            check(bad.status_code == 400, f"a link says who answers: {bad.text}")
            wrong = await h.post(f"{BASE}/v1/answer-links/answer", json={"link": link, "answer": {"option_id": "nope"}})
            report["link_refused"] = wrong.json()
            check(wrong.status_code == 422, f"the answer path refuses a wrong answer: {wrong.text}")
            a = await h.post(f"{BASE}/v1/answer-links/answer", json={"link": link, "answer": {"input": "sk-live-1234567890"}})
            check(a.status_code == 200, f"a refused answer leaves the link usable: {a.text}")
            again = await h.post(f"{BASE}/v1/answer-links/answer", json={"link": link, "answer": {"input": "x"}})
            report["link_again"] = again.status_code
            check(again.status_code == 404, "a link answers once")
        r = await s.call_tool("deployer", {"task": "1.4.2"}, allow_input_required=True,
                              input_responses={kid: {"action": "accept"}}, request_state=r.request_state)
        while r.result_type == "input_required" and not r.input_requests:
            r = await s.call_tool("deployer", {"task": "1.4.2"}, allow_input_required=True,
                                  request_state=r.request_state)
        (eid, req), = r.input_requests.items()
        check("environment" in req.params.message, "then the environment")
        r = await s.call_tool("deployer", {"task": "1.4.2"}, allow_input_required=True,
                              input_responses={eid: {"action": "accept", "content": {"option": "staging"}}},
                              request_state=r.request_state)
        report["deployer"] = {"is_error": r.is_error, "text": r.content[0].text}
        check(not r.is_error, "the deploy completed")
        check("sk-live" not in json.dumps(report), "the key never came back through MCP")


async def second_client():
    async with client(BOB) as c:
        res = await c.list_resources()
        uris = [r.uri for r in res.resources]
        check(f"delta://runs/{report['deployer_run']}" in uris, "runs are resources")
        r = await c.read_resource(f"delta://interactions/{report['plan_request']}")
        view = json.loads(r.contents[0].text)
        report["seen_by_bob"] = {"state": view["state"], "responder": view["response"]["responder"]}
        check(view["state"] == "ANSWERED", "bob sees the plan answered")
        check(view["response"]["responder"] == {"id": "alice", "via": "mcp"}, "by alice, via mcp")


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")
    input_responses: dict | None = Field(default=None, alias="inputResponses")


class TaskRequest(Request[TaskParams, str]):
    """tasks/get and tasks/update: their Mcp-Name header is the task id."""
    name_param: ClassVar[str] = "taskId"


class TaskCreated(Result):
    """A tools/call answered with a task (the tasks extension, io.modelcontextprotocol/tasks)."""
    result_type: Literal["task"] = "task"
    task_id: str = Field(alias="taskId")
    status: str
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")
    ttl_ms: int | None = Field(default=None, alias="ttlMs")


class Tasks(ClientExtension):
    """The tasks extension, on the SDK's own extension interface: a task result is followed with
    tasks/get, its questions answered with tasks/update, until it ends."""
    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self, answer):
        self.answer = answer
        self.seen = []

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=self.follow)]

    async def follow(self, created, ctx):
        report["task_created"] = created.model_dump(by_alias=True)
        s = ctx.session
        for _ in range(300):
            t = await s.send_request(TaskRequest(method="tasks/get", params=TaskParams(taskId=created.task_id)), TypeAdapter(dict))
            self.seen.append(t["status"])
            if t["status"] == "input_required":
                (rid, req), = t["inputRequests"].items()
                check(req["params"]["mode"] == "form", "the task's question is a form")
                await s.send_request(TaskRequest(method="tasks/update", params=TaskParams(
                    taskId=created.task_id, inputResponses={rid: self.answer})), TypeAdapter(dict))
            if t["status"] in ("completed", "failed", "cancelled"):
                report["task_final"] = t
                if t["status"] != "completed":
                    raise RuntimeError(f"the task ended {t['status']}")
                return CallToolResult.model_validate(t["result"])
            await asyncio.sleep(0.1)
        check(False, "the task ends")


async def as_task():
    tasks = Tasks({"action": "accept", "content": {"answer": "Grace"}})
    async with client(ALICE, extensions=[tasks], elicitation_callback=never) as c:
        result = await c.call_tool("hello", {"task": "tasked"})
        report["task"] = {"statuses": sorted(set(tasks.seen)), "text": result.content[0].text}
        check(report["task_created"]["status"] == "working", "a task is made, working")
        check(report["task_created"]["pollIntervalMs"] >= 1, "with a poll interval")
        check("input_required" in tasks.seen, "it was input_required on the way")
        check(not result.is_error and "Grace" in result.content[0].text, "the task completes")


async def failing():
    """A run that fails: an error result for a call, a `failed` task for a tasks client."""
    async with client(ALICE) as c:
        result = await c.call_tool("failer", {"task": "brew"})
        report["failed_call"] = {"is_error": result.is_error, "text": result.content[0].text}
        check(result.is_error and "out of coffee" in result.content[0].text, "a failed run is an error result")
    tasks = Tasks({"action": "cancel"})
    async with client(ALICE, extensions=[tasks], elicitation_callback=never) as c:
        try:
            await c.call_tool("failer", {"task": "brew"})
        except Exception:  # the SDK has no shape for a failed task: the resolver's own check says
            pass
        report["failed_task"] = report.get("task_final")
        check(report["task_final"]["status"] == "failed", "a failed run is a failed task")
        check("out of coffee" in report["task_final"]["error"]["message"], "with the run's reason")


async def legacy():
    """A client of the 2025-11-25 protocol: asked within its call (`elicitation/create`)."""
    asked = []

    async def on_elicit(_ctx, params):
        asked.append(params.mode)
        return ElicitResult(action="accept", content={"answer": "Lin"})

    async with client(ALICE, mode="legacy", elicitation_callback=on_elicit) as c:
        check(c.protocol_version == "2025-11-25", f"a legacy session: {c.protocol_version}")
        result = await c.call_tool("hello", {"task": "legacy"})
        report["legacy"] = {"asked": asked, "text": result.content[0].text}
        check(asked == ["form"] and "Lin" in result.content[0].text, "asked within the call, then completed")
    # A question dismissed (cancel) ends the call; the run waits for anyone's answer.
    async def dismiss(_ctx, _params):
        return ElicitResult(action="cancel")

    async def decline(_ctx, _params):
        return ElicitResult(action="decline")

    for how, mode in ((dismiss, "auto"), (decline, "auto"), (dismiss, "legacy")):
        async with client(ALICE, elicitation_callback=how, mode=mode) as c:
            result = await c.call_tool("hello", {"task": "dismissed"})
            report.setdefault("dismissed", []).append(result.structured_content)
            check(result.structured_content["status"] == "WAITING_FOR_INPUT",
                  f"a dismissed question ends the call ({how.__name__}, {mode})")
    # Without elicitation, the call says where the run stands and the question stays pending.
    async with client(ALICE, mode="legacy") as c:
        result = await c.call_tool("hello", {"task": "no elicitation"})
        report["legacy_paused"] = result.structured_content
        check(result.structured_content["status"] == "WAITING_FOR_INPUT", "the call says it waits")
        check(result.structured_content["request_id"], "and for which question")


async def submitter():
    asked = []

    async def on_elicit(_ctx, params):
        asked.append(params.message)
        return ElicitResult(action="accept", content={"answer": "Eve"})

    # A submit-only token is never asked: its call says where the run stands.
    async with client(SUBMITTER, elicitation_callback=on_elicit) as c:
        result = await c.call_tool("hello", {"task": "no answers"})
        report["submitter"] = result.structured_content
        check(not asked, "a submit-only caller is not asked")
        check(result.structured_content["status"] == "WAITING_FOR_INPUT", "its call says the run waits")
        # Answering anyway (a crafted retry) is refused with the gateway's code.
        state = json.dumps({"run": result.structured_content["run_id"]})
        rid = result.structured_content["request_id"]
        try:
            await c.session.call_tool("hello", {"task": "no answers"}, allow_input_required=True,
                                      input_responses={rid: {"action": "accept", "content": {"answer": "Eve"}}},
                                      request_state=state)
            check(False, "a submit-only token cannot answer")
        except MCPError as e:
            report["submitter_refused"] = e.error.data
            check(e.error.data["code"] == "forbidden", "refused: forbidden")


async def idempotent():
    """A call retried with its idempotency key (`_meta`, or the `Idempotency-Key` header) gets
    the run the first one started; without one, a new run; the same key for another task is
    refused; another caller's same key is their own."""
    key = {"dev.delta/idempotency-key": "call-1"}

    def run_of(r):
        return json.loads(r.request_state)["run"]

    async with client(ALICE, elicitation_callback=never) as c:
        s = c.session
        first = await s.call_tool("hello", {"task": "once"}, allow_input_required=True, meta=key)
        again = await s.call_tool("hello", {"task": "once"}, allow_input_required=True, meta=key)
        fresh = await s.call_tool("hello", {"task": "once"}, allow_input_required=True)
        report["idempotent"] = {"first": run_of(first), "again": run_of(again), "fresh": run_of(fresh)}
        check(run_of(first) == run_of(again), "the same key, the same run")
        check(run_of(fresh) != run_of(first), "no key, a new run")
        try:
            await s.call_tool("hello", {"task": "another"}, allow_input_required=True, meta=key)
            check(False, "the same key for another task is refused")
        except MCPError as e:
            report["idempotent_conflict"] = e.error.data
            check(e.error.data["code"] == "invalid_args", "refused as invalid_args")
        try:
            await s.call_tool("hello", {"task": "once"}, allow_input_required=True,
                              meta={"dev.delta/idempotency-key": 7})
            check(False, "a key that is not a string is refused")
        except MCPError as e:
            check(e.error.data["code"] == "bad_request", f"refused: {e.error.data}")
    # The header, as an HTTP client's retry would send it: the same run as `_meta`'s key.
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {ALICE}",
                                           "Idempotency-Key": "call-1"})
    async with Client(streamable_http_client(f"{BASE}/mcp", http_client=http),
                      elicitation_callback=never) as c:
        by_header = await c.session.call_tool("hello", {"task": "once"}, allow_input_required=True)
        check(run_of(by_header) == report["idempotent"]["first"], "the header is the same key")
    # A submit-only caller is never asked: its call says where its run stands.
    async with client(SUBMITTER, elicitation_callback=never) as c:
        theirs = await c.session.call_tool("hello", {"task": "once"}, meta=key)
        other = theirs.structured_content["run_id"]
        report["idempotent"]["other_caller"] = other
        check(other != report["idempotent"]["first"], "another caller's key is their own")


async def main():
    await idempotent()
    await hello()
    await deployer()
    await second_client()
    await as_task()
    await failing()
    await legacy()
    await submitter()
    print(json.dumps(report, default=str))


asyncio.run(main())
