"""Recorded streams written the way real servers write them, read by the official SDKs through rota.

    SDK (openai / anthropic) --> rota serve --> chunky (tests/peers/chunky.py)

chunky replays tests/fixtures/streams/{anthropic-text,openai-chat-text}.sse, close-delimited, in
the write mode the upstream key names: `whole` (the whole answer in one write, so rota reads
several events, and the end of the stream, at once), `events` (one write per event) or `bytes`
(3-7 bytes per write). Whatever the writes, every SDK must assemble exactly chunky.TEXT and its
stop reason, with no exception: passed through (OpenAI SDK -> OpenAI upstream, Anthropic SDK ->
Anthropic upstream) and translated (OpenAI SDK -> Anthropic upstream and back).

Each test gets its own chunky and `rota serve` (one per mode, parametrized) and runs N_STREAMS
streams on WORKERS threads: how the reads fall depends on timing, so one stream proves little.
rota holds one profile per provider, `{provider}:{mode}`, so every stream is one attempt of
that profile; the audit rows must say so. The SDKs run with `max_retries=0`.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import openai
import pytest

from chunky import MODES, TEXT, Chunky
from conftest import Rota, create_agent, rota, start_rota, stop_rota, tail
from test_sdks import PROMPT

OPENAI_MODEL = "gpt-4.1-mini"
ANTHROPIC_MODEL = "claude-sonnet-4-5"
N_STREAMS = 50  # per test, i.e. per mode and direction
WORKERS = 4
STREAM_TIMEOUT_S = 10.0  # the SDKs' timeout; rota's own timeouts below are shorter
BATCH_DEADLINE_S = 60.0  # all N_STREAMS streams of a test, under conftest's TEST_DEADLINE_S
MAX_TOKENS = 64

CONFIG = """\
[providers.openai]
api = "openai"
base_url = "http://127.0.0.1:{port}/v1"

[providers.anthropic]
api = "anthropic"
base_url = "http://127.0.0.1:{port}"

[models]
primary = "openai/{openai_model}"

# Short, so a stream rota loses track of ends (and fails the test) well within its deadline.
[timeouts]
connect = "2s"
first_byte = "5s"
idle = "5s"
total = "20s"
"""


@dataclass
class StreamGateway(Rota):
    """rota in front of chunky; its profiles' keys select chunky's write `mode`."""

    chunky: Chunky = field(kw_only=True)
    mode: str = field(kw_only=True)

    def key(self, provider: str) -> str:
        return upstream_key(self.mode, provider)


def upstream_key(mode: str, provider: str) -> str:
    return f"sk-chunky-{mode}-{provider}"


@pytest.fixture(params=MODES)
def streams(request: pytest.FixtureRequest, _bounded_in_time) -> Iterator[StreamGateway]:
    """A fresh chunky and `rota serve` (own temp dir, database and agent) whose upstream keys name one mode."""
    mode: str = request.param
    tmp = tempfile.TemporaryDirectory(prefix="rota-streams-")
    dir = Path(tmp.name)
    chunky: Chunky | None = None
    proc = None
    stderr = dir / "rota.stderr"
    try:
        chunky = Chunky()
        (dir / "rota.toml").write_text(CONFIG.format(port=chunky.port, openai_model=OPENAI_MODEL))
        for provider in ("openai", "anthropic"):
            rota(dir, "profiles", "add", provider, "--name", mode, stdin=upstream_key(mode, provider) + "\n")
        agent_key = create_agent(dir, "streams")
        proc, addr = start_rota(dir, stderr)
        yield StreamGateway(addr, agent_key, dir, stderr, proc, chunky=chunky, mode=mode)
    finally:
        stop_rota(proc)
        if chunky is not None:
            chunky.close()
        # Shown by pytest only when the test failed.
        print(f"--- rota stderr (ROTA_LOG=warn) ---\n{tail(stderr)}")
        tmp.cleanup()


# -- running streams -----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one stream came to, filled in as it goes (so a stream that raises shows how far it got)."""

    request_id: str | None = None  # rota's x-request-id
    text: str = ""  # the text the SDK assembled
    stop: str | None = None  # finish_reason(s) / stop_reason
    error: str | None = None  # what the SDK (or a check inside the stream) raised

    def verdict(self) -> tuple[str, str | None, str | None]:
        return (self.text, self.stop, self.error)


def run_streams(one: Callable[[Outcome], None]) -> list[Outcome]:
    """N_STREAMS calls of `one`, WORKERS at a time; an exception becomes the outcome's `error`."""
    outcomes = [Outcome() for _ in range(N_STREAMS)]

    def run(out: Outcome) -> None:
        try:
            one(out)
        except Exception as e:  # noqa: BLE001 (every failure is a finding, reported with the rest)
            out.error = f"{type(e).__name__}: {e}"

    pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="stream")
    try:
        futures = [pool.submit(run, o) for o in outcomes]
        _, pending = wait_futures(futures, timeout=BATCH_DEADLINE_S)
        for o, f in zip(outcomes, futures):
            if f in pending:
                o.error = o.error or f"not finished within {BATCH_DEADLINE_S}s"
    finally:
        # Streams still running end with their SDK timeout, or when the fixture stops rota.
        pool.shutdown(wait=False, cancel_futures=True)
    return outcomes


def chat_stream(client: openai.OpenAI, model: str) -> Callable[[Outcome], None]:
    """One streamed chat completion: the joined `delta.content` and every finish_reason seen."""

    def one(out: Outcome) -> None:
        stream = client.chat.completions.create(model=model, messages=PROMPT, stream=True)
        with stream:
            out.request_id = stream.response.headers.get("x-request-id")
            finishes: list[str] = []
            for chunk in stream:
                for choice in chunk.choices:
                    out.text += choice.delta.content or ""
                    if choice.finish_reason:
                        finishes.append(choice.finish_reason)
                        out.stop = "+".join(finishes)  # two finish chunks must not pass as one

    return one


def messages_stream(client: anthropic.Anthropic, model: str) -> Callable[[Outcome], None]:
    """One `messages.stream()`: the text deltas joined, which must equal get_final_text(), and the
    stop_reason; the last event must be message_stop (a stream cut short may still hold the text)."""

    def one(out: Outcome) -> None:
        with client.messages.stream(model=model, max_tokens=MAX_TOKENS, messages=PROMPT) as stream:
            out.request_id = stream.response.headers.get("x-request-id")
            last = None
            for event in stream:
                if event.type == "text":
                    out.text += event.text
                last = event.type
            final = stream.get_final_message()
            out.stop = final.stop_reason
            if last != "message_stop":
                raise AssertionError(f"the stream ended with {last!r}, not message_stop")
            final_text = stream.get_final_text()
            if final_text != out.text:
                raise AssertionError(f"get_final_text() {final_text!r} != the text deltas {out.text!r}")

    return one


def openai_client(gw: StreamGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{gw.addr}/v1", api_key=gw.agent_key, max_retries=0,
                         timeout=STREAM_TIMEOUT_S)


def anthropic_client(gw: StreamGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"http://{gw.addr}", api_key=gw.agent_key, max_retries=0,
                               timeout=STREAM_TIMEOUT_S)


# -- checks --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """Where a test's streams go: the client API rota serves and the upstream that answers."""

    api: str  # requests.api: chat | messages
    provider: str  # openai | anthropic
    model: str  # the upstream model id

    @property
    def requested(self) -> str:
        return f"{self.provider}/{self.model}"

    @property
    def upstream_path(self) -> str:
        return "/v1/messages" if self.provider == "anthropic" else "/v1/chat/completions"


def assert_every_stream_whole(gw: StreamGateway, outcomes: list[Outcome], stop: str) -> None:
    expected = (TEXT, stop, None)
    verdicts = Counter(o.verdict() for o in outcomes)
    wrong = N_STREAMS - verdicts[expected]
    assert wrong == 0, (
        f"mode {gw.mode}: {wrong} of {N_STREAMS} streams are not (text, stop, error) = {expected!r}:\n"
        + "\n".join(f"  {n}x text={t!r} stop={s!r} error={e!r}" for (t, s, e), n in verdicts.most_common(10)
                    if (t, s, e) != expected)
    )


def assert_upstream_and_audit(gw: StreamGateway, outcomes: list[Outcome], route: Route) -> None:
    """chunky saw N_STREAMS streamed requests with the mode's key; rota recorded one successful attempt each."""
    key = gw.key(route.provider)
    assert [(h.method, h.path, h.key, h.stream) for h in gw.chunky.hits()] == [
        ("POST", route.upstream_path, key, True)
    ] * N_STREAMS
    profile = f"{route.provider}:{gw.mode}"
    for o in outcomes:
        assert o.request_id, o
        req, att = gw.audit(o.request_id)
        assert {c: req[c] for c in ("api", "requested_model", "served_model", "served_profile", "status",
                                    "attempts", "stream")} == {
            "api": route.api, "requested_model": route.requested, "served_model": route.requested,
            "served_profile": profile, "status": 200, "attempts": 1, "stream": 1,
        }
        assert [(a["seq"], a["kind"], a["provider"], a["model"], a["profile_id"], a["http_status"], a["outcome"],
                 a["reason"]) for a in att] == [(1, "primary", route.provider, route.model, profile, 200, "success", None)]


# -- the tests -----------------------------------------------------------------------------------


def test_openai_sdk_streams_openai_upstream(streams: StreamGateway) -> None:
    route = Route("chat", "openai", OPENAI_MODEL)
    outcomes = run_streams(chat_stream(openai_client(streams), route.requested))
    assert_every_stream_whole(streams, outcomes, stop="stop")
    assert_upstream_and_audit(streams, outcomes, route)


def test_anthropic_sdk_streams_anthropic_upstream(streams: StreamGateway) -> None:
    route = Route("messages", "anthropic", ANTHROPIC_MODEL)
    outcomes = run_streams(messages_stream(anthropic_client(streams), route.requested))
    assert_every_stream_whole(streams, outcomes, stop="end_turn")
    assert_upstream_and_audit(streams, outcomes, route)


def test_openai_sdk_streams_anthropic_upstream(streams: StreamGateway) -> None:
    """Translated: rota turns the Anthropic events into chat chunks (end_turn -> stop)."""
    route = Route("chat", "anthropic", ANTHROPIC_MODEL)
    outcomes = run_streams(chat_stream(openai_client(streams), route.requested))
    assert_every_stream_whole(streams, outcomes, stop="stop")
    assert_upstream_and_audit(streams, outcomes, route)


def test_anthropic_sdk_streams_openai_upstream(streams: StreamGateway) -> None:
    """Translated: rota turns the chat chunks into Anthropic events (stop -> end_turn)."""
    route = Route("messages", "openai", OPENAI_MODEL)
    outcomes = run_streams(messages_stream(anthropic_client(streams), route.requested))
    assert_every_stream_whole(streams, outcomes, stop="end_turn")
    assert_upstream_and_audit(streams, outcomes, route)
