"""Sessions across a fleet: two `rota serve` on one database behind a round-robin proxy keep a
conversation on one profile while it can serve, and move it once, for both, when it cools
(docs/scale.md, "Sessions"). The agent is the OpenAI SDK; the upstream is llmock behind the key
tap, which records which key served each call.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from conftest import (
    OPENAI_MODEL,
    KeyTap,
    Rota,
    create_agent,
    rota,
    start_llmock,
    start_rota,
    stop,
    stop_rota,
    tail,
)
from test_sdks import PROMPT, SDK_TIMEOUT_S

# No explicit order: requests without a session rotate over the three profiles (least recently
# used first), so only the session's binding keeps a conversation on one of them.
CONFIG = """\
[providers.openai]
api = "openai"
base_url = "http://127.0.0.1:{port}/v1"

[models]
primary = "openai/{model}"

[timeouts]
connect = "2s"
first_byte = "10s"
idle = "10s"
total = "30s"
"""
KEYS = {"a": "sk-session-a", "b": "sk-session-b", "c": "sk-session-c"}
COOLS = {"type": "fail", "status": 429, "retry_after": 600, "times": 1, "match": {"provider": "openai"}}


class RoundRobin(KeyTap):
    """A load balancer without affinity: each request to the next instance in turn."""

    def __init__(self, ports: list[int]) -> None:
        self._next = itertools.cycle(ports)
        super().__init__(ports[0])

    def upstream(self) -> int:
        with self._lock:
            return next(self._next)


def test_a_session_keeps_its_profile_on_both_instances_and_moves_once_when_it_cools(_bounded_in_time: Any) -> None:
    tmp = tempfile.TemporaryDirectory(prefix="rota-sessions-")
    dir = Path(tmp.name)
    llmock = tap = balancer = None
    procs: list[Any] = []
    try:
        llmock = start_llmock(dir)
        tap = KeyTap(int(llmock.url.rsplit(":", 1)[1]))
        (dir / "rota.toml").write_text(CONFIG.format(port=tap.port, model=OPENAI_MODEL))
        for name, key in KEYS.items():
            rota(dir, "profiles", "add", "openai", "--name", name, stdin=key + "\n")
        agent_key = create_agent(dir, "agent")
        addrs = []
        for i in range(2):
            proc, addr = start_rota(dir, dir / f"rota-{i}.stderr")
            procs.append(proc)
            addrs.append(addr)
        balancer = RoundRobin([int(a.rsplit(":", 1)[1]) for a in addrs])
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{balancer.port}/v1", api_key=agent_key,
                               max_retries=0, timeout=SDK_TIMEOUT_S)

        def turn(session: str | None) -> str:
            headers = {"x-rota-session": session} if session else {}
            raw = client.chat.completions.with_raw_response.create(
                model=f"openai/{OPENAI_MODEL}", messages=PROMPT, extra_headers=headers)
            raw.parse()
            return raw.headers["x-rota-profile"]

        def turns(n: int) -> list[str]:
            served = []
            for _ in range(n):
                served.append(turn("conversation-7"))
                # Two requests without a session between turns: they rotate, so a profile that
                # stays is the binding's doing, and turns alternate between the two instances.
                turn(None)
                turn(None)
            return served

        first = turns(10)
        assert len(set(first)) == 1, f"10 turns, one profile while it serves: {first}"
        bound = first[0]

        # The bound profile's next call answers 429 (600 s): the turn moves to another profile.
        tap.clear()
        llmock.scenario(COOLS)
        moved = turn("conversation-7")
        assert moved != bound, "the turn after the 429 is served by another profile"
        keys = [s.headers["authorization"] for s in tap.requests()]
        assert keys == [f"Bearer {KEYS[bound.split(':')[1]]}", f"Bearer {KEYS[moved.split(':')[1]]}"], keys

        # What one server learned is in force on the others within a second (the change feed):
        # an agent's next turn comes later than that (its tools run, its user reads).
        time.sleep(1)
        after = turns(10)
        assert after == [moved] * 10, f"the session moved once and stays, on both instances: {after}"
        db = Rota(addrs[0], agent_key, dir, dir / "rota-0.stderr")
        rows = [dict(r) for r in db.query("SELECT provider, profile_id FROM session_bindings")]
        assert rows == [{"provider": "openai", "profile_id": moved}], rows
    finally:
        for proc in procs:
            stop_rota(proc)
        for server in (balancer, tap):
            if server is not None:
                server.close()
        if llmock is not None:
            stop(llmock.proc)
        for i in range(len(procs)):
            print(f"--- rota {i} stderr ---\n{tail(dir / f'rota-{i}.stderr')}")
        tmp.cleanup()

