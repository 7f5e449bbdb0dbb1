"""Traces: rota exports one span per request and per upstream attempt over OTLP/HTTP to a real
OTLP receiver (the OpenTelemetry protocol's own protobuf messages, from PyPI
`opentelemetry-proto`), honours the agent's `traceparent`, and sends the attempt's to the
upstream (docs/operations.md, "Traces").

The OpenTelemetry Collector's binary is not installable from this machine's registries; the
receiver here decodes each export with the protocol's generated message classes and answers as
a collector does, so a body that is not a well-formed `ExportTraceServiceRequest` fails the test.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from conftest import (
    CONFIG,
    OPENAI_MODEL,
    UPSTREAM_KEYS,
    KeyTap,
    create_agent,
    rota,
    start_llmock,
    start_rota,
    stop,
    stop_rota,
    tail,
)
from test_api import RATE_LIMIT
from test_sdks import PROMPT, SDK_TIMEOUT_S, reply

# The collector's auth header, given as the OTLP exporters' standard variable.
COLLECTOR_TOKEN = "collector-" + secrets.token_hex(8)


class Receiver:
    """An OTLP/HTTP trace receiver: every span of every export, and each export's headers and bytes."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_error(404 if self.path != "/v1/traces" else 415)
                    return
                export = ExportTraceServiceRequest()
                export.ParseFromString(body)
                receiver._take(export, body, {k.lower(): v for k, v in self.headers.items()})
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp", daemon=True)
        self._thread.start()

    def _take(self, export: ExportTraceServiceRequest, body: bytes, headers: dict[str, str]) -> None:
        spans = []
        for rs in export.resource_spans:
            resource = {a.key: value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append({
                        "name": s.name,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "kind": s.kind,
                        "status": s.status.code,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attributes": {a.key: value(a.value) for a in s.attributes},
                        "resource": resource,
                        "scope": ss.scope.name,
                    })
        with self._lock:
            self.spans.extend(spans)
            self.bodies.append(body)
            self.headers.append(headers)

    def of_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def value(v: Any) -> Any:
    """An OTLP AnyValue as Python."""
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@contextlib.contextmanager
def traced_rota(endpoint: str) -> Iterator[dict[str, Any]]:
    """llmock behind the key tap, and `rota serve` exporting its traces to `endpoint`."""
    tmp = tempfile.TemporaryDirectory(prefix="rota-traces-")
    dir = Path(tmp.name)
    llmock = tap = proc = None
    stderr = dir / "rota.stderr"
    try:
        llmock = start_llmock(dir)
        tap = KeyTap(int(llmock.url.rsplit(":", 1)[1]))
        config = CONFIG.format(port=tap.port, openai_model=OPENAI_MODEL)
        (dir / "rota.toml").write_text(config + f'\n[telemetry]\notlp_endpoint = "{endpoint}"\n')
        for pid, key in UPSTREAM_KEYS.items():
            provider, name = pid.split(":")
            rota(dir, "profiles", "add", provider, "--name", name, stdin=key + "\n")
        agent_key = create_agent(dir, "tracer")
        # Batches every 100 ms, not 5 s (the SDK's standard variable).
        proc, addr = start_rota(dir, stderr, OTEL_BSP_SCHEDULE_DELAY="100",
                                OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer {COLLECTOR_TOKEN}")
        llmock.reset()
        tap.clear()
        yield {"addr": addr, "key": agent_key, "llmock": llmock, "tap": tap, "proc": proc, "stderr": stderr}
    finally:
        stop_rota(proc)
        if llmock is not None:
            stop(llmock.proc)
        if tap is not None:
            tap.close()
        print(f"--- rota stderr ---\n{tail(stderr)}")
        tmp.cleanup()


@pytest.fixture
def traced(_bounded_in_time) -> Any:
    """An OTLP receiver and rota exporting to it."""
    receiver = Receiver()
    try:
        with traced_rota(receiver.url) as t:
            yield {**t, "receiver": receiver}
    finally:
        receiver.close()


def wait_spans(receiver: Receiver, trace_id: str, count: int, deadline_s: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + deadline_s
    while True:
        spans = receiver.of_trace(trace_id)
        if len(spans) >= count or time.monotonic() > deadline:
            return spans
        time.sleep(0.05)


def traceparent(header: str) -> tuple[str, str, str]:
    version, trace_id, span_id, flags = header.split("-")
    assert version == "00" and len(trace_id) == 32 and len(span_id) == 16, header
    return trace_id, span_id, flags


def test_one_span_per_request_and_attempt_child_of_the_agents_traceparent(traced: dict[str, Any]) -> None:
    """A chat whose first profile answers 429 and whose second serves it, sent with a
    `traceparent`: the request span is the child of the agent's span in the agent's trace, each
    upstream call is a child span with its provider, model, profile, outcome, reason, status and
    time to first byte, and each upstream call carried its own attempt's span id."""
    t = traced
    t["llmock"].scenario(RATE_LIMIT, reply("Traced answer.", "openai"))
    agent_trace, agent_span = secrets.token_hex(16), secrets.token_hex(8)
    client = openai.OpenAI(base_url=f"http://{t['addr']}/v1", api_key=t["key"], max_retries=0, timeout=SDK_TIMEOUT_S)
    raw = client.chat.completions.with_raw_response.create(
        model=f"openai/{OPENAI_MODEL}", messages=PROMPT,
        extra_headers={"traceparent": f"00-{agent_trace}-{agent_span}-01"},
    )
    assert raw.parse().choices[0].message.content == "Traced answer."
    request_id = raw.headers["x-request-id"]

    spans = wait_spans(t["receiver"], agent_trace, 3)
    requests = [s for s in spans if s["name"] == "request"]
    attempts = sorted((s for s in spans if s["name"] == "attempt"), key=lambda s: s["attributes"]["n"])
    assert len(requests) == 1 and len(attempts) == 2 and len(spans) == 3, spans
    req = requests[0]
    assert req["parent_span_id"] == agent_span, "the request is the child of the agent's span"
    assert req["attributes"] == {"method": "POST", "path": "/v1/chat/completions", "request_id": request_id,
                                 "agent": "tracer", "status": 200}, req
    assert req["resource"]["service.name"] == "rota" and req["scope"] == "rota"
    for a in attempts:
        assert a["parent_span_id"] == req["span_id"], "each attempt is a child of its request"
        assert req["start"] <= a["start"] <= a["end"] <= req["end"], (req, a)
    first, second = (a["attributes"] for a in attempts)
    ttfb = [first.pop("ttfb_ms", None), second.pop("ttfb_ms")]
    assert first == {"provider": "openai", "model": OPENAI_MODEL, "profile": "openai:a", "n": 1,
                     "outcome": "failure", "reason": "rate_limit", "status": 429}, first
    assert second == {"provider": "openai", "model": OPENAI_MODEL, "profile": "openai:b", "n": 2,
                      "outcome": "success", "status": 200}, second
    assert all(isinstance(ms, int) and 0 <= ms < 10_000 for ms in ttfb if ms is not None), ttfb
    assert ttfb[1] is not None, "the served attempt has its time to first byte"
    assert [a["status"] for a in attempts] == [2, 0], "the failed call's span is an error (OTLP STATUS_CODE_ERROR)"

    # What the upstream received: each call the trace's id and its own attempt's span id.
    calls = [s for s in t["tap"].requests() if s.path.endswith("/chat/completions")]
    assert len(calls) == 2, calls
    for call, attempt in zip(calls, attempts):
        trace_id, span_id, flags = traceparent(call.headers["traceparent"])
        assert (trace_id, span_id, flags) == (agent_trace, attempt["span_id"], "01"), call.headers

    # The collector's header went with every export; no upstream key or agent key went anywhere.
    receiver = t["receiver"]
    assert all(h.get("authorization") == f"Bearer {COLLECTOR_TOKEN}" for h in receiver.headers)
    exported = b"".join(receiver.bodies)
    for secret in [*UPSTREAM_KEYS.values(), t["key"]]:
        assert secret.encode() not in exported, "a key in an exported span"
    assert COLLECTOR_TOKEN not in Path(t["stderr"]).read_text(), "the collector's token in the log"


def test_a_stream_without_traceparent_starts_a_trace_and_its_attempt_lasts_until_the_stream_ends(
    traced: dict[str, Any],
) -> None:
    """No `traceparent`: the request span is a root of a new trace that the upstream call
    carries; the streamed attempt's span ends after its last byte, with its outcome. A malformed
    `traceparent` is ignored the same way. The spans still batched go out when rota stops."""
    t = traced
    t["llmock"].scenario(reply("Streamed and traced.", "openai"), reply("Again.", "openai"))
    client = openai.OpenAI(base_url=f"http://{t['addr']}/v1", api_key=t["key"], max_retries=0, timeout=SDK_TIMEOUT_S)
    ids = []
    for extra in ({}, {"traceparent": "00-zz-not-a-trace-01"}):
        with client.chat.completions.with_streaming_response.create(
            model=f"openai/{OPENAI_MODEL}", messages=PROMPT, stream=True, extra_headers=extra,
        ) as response:
            text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
            ids.append(response.headers["x-request-id"])
        assert text in ("Streamed and traced.", "Again.")
    calls = [s for s in t["tap"].requests() if s.path.endswith("/chat/completions")]
    assert len(calls) == 2
    # Stopped at once: the batch still held goes out at shutdown.
    stop_rota(t["proc"])
    t["proc"] = None
    for request_id, call in zip(ids, calls):
        trace_id, span_id, _ = traceparent(call.headers["traceparent"])
        spans = t["receiver"].of_trace(trace_id)
        assert sorted(s["name"] for s in spans) == ["attempt", "request"], spans
        req = next(s for s in spans if s["name"] == "request")
        att = next(s for s in spans if s["name"] == "attempt")
        assert req["attributes"]["request_id"] == request_id
        assert req["parent_span_id"] == "", "a root span"
        assert att["span_id"] == span_id and att["parent_span_id"] == req["span_id"]
        assert att["attributes"]["outcome"] == "success" and isinstance(att["attributes"]["ttfb_ms"], int)
        assert att["end"] >= att["start"] + att["attributes"]["ttfb_ms"] * 1_000_000


def test_traces_are_off_by_default(gateway: Any) -> None:
    """Without `[telemetry]`, no trace context is sent upstream, even when the agent sent one."""
    gateway.llmock.scenario(reply("Untraced.", "openai"))
    client = openai.OpenAI(base_url=f"http://{gateway.addr}/v1", api_key=gateway.agent_key, max_retries=0,
                           timeout=SDK_TIMEOUT_S)
    agents_trace = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    client.chat.completions.create(model=f"openai/{OPENAI_MODEL}", messages=PROMPT,
                                   extra_headers={"traceparent": agents_trace})
    calls = [s for s in gateway.tap.requests() if s.path.endswith("/chat/completions")]
    assert len(calls) == 1 and "traceparent" not in calls[0].headers, calls


def test_a_collector_that_is_down_costs_no_request_and_is_logged(_bounded_in_time: Any) -> None:
    """The collector refuses connections: requests are served as ever, and the failed exports
    are logged (without the collector's token)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}"
    with traced_rota(down) as t:
        t["llmock"].scenario(reply("Served anyway.", "openai"))
        client = openai.OpenAI(base_url=f"http://{t['addr']}/v1", api_key=t["key"], max_retries=0,
                               timeout=SDK_TIMEOUT_S)
        answer = client.chat.completions.create(model=f"openai/{OPENAI_MODEL}", messages=PROMPT)
        assert answer.choices[0].message.content == "Served anyway."
        deadline = time.monotonic() + 10
        while "BatchSpanProcessor.ExportError" not in (log := Path(t["stderr"]).read_text()):
            assert time.monotonic() < deadline, f"no export error logged:\n{log}"
            time.sleep(0.1)
        assert COLLECTOR_TOKEN not in log
