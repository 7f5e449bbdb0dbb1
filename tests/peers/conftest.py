"""Peer tests: real client SDKs talk to a real `rota serve`, whose upstream is a real `llmock serve`.

    SDK (openai / anthropic) --> rota serve --> key tap --> llmock serve

The key tap is a transparent HTTP pass-through that records the headers of every request rota
sends upstream. llmock 0.2.2 journals method, path, status, fault and body of each request but
not its headers, so without the tap no test could tell which API key the upstream saw.

test_streams.py swaps llmock and the tap for chunky.py, an upstream that replays recorded
streams the way real servers write them (whole, one event per write, a few bytes per write).

Everything listens on 127.0.0.1 only. Every process and thread a fixture starts is stopped in
its teardown, and every wait has a deadline.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
OPENAI_MODEL = "gpt-4o-mini"  # served by llmock's OpenAI router
ANTHROPIC_MODEL = "claude-haiku-4-5-20251001"  # served by llmock's Anthropic router
# Upstream API keys rota holds: two profiles per provider. They only ever go to the upstream.
UPSTREAM_KEYS = {
    "openai:a": "sk-peer-openai-a",
    "openai:b": "sk-peer-openai-b",
    "anthropic:a": "sk-ant-peer-anthropic-a",
    "anthropic:b": "sk-ant-peer-anthropic-b",
}
# Loopback only: never send a test's request through a proxy from the environment.
for _var in ("NO_PROXY", "no_proxy"):
    os.environ[_var] = ",".join(filter(None, [os.environ.get(_var), "127.0.0.1", "localhost"]))
TEST_DEADLINE_S = 90  # hard bound for one test, setup and teardown included
STOP_GRACE_S = 10


def rota_bin() -> Path:
    path = Path(os.environ.get("ROTA_BIN") or REPO / "target" / "debug" / "rota")
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.exit(f"rota binary not found at {path}: build it (cargo build --locked) or set ROTA_BIN", returncode=2)
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without ROTA_* config, proxies or SDK variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ROTA_", "OPENAI_", "ANTHROPIC_", "LLMOCK_"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
        and k != "DATABASE_URL"
    }
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback only)
        return json.loads(r.read())


def http_post_json(url: str, payload: Any, timeout: float = 5.0) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (loopback only)
        return json.loads(r.read())


def wait_healthy(url: str, proc: subprocess.Popen, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"{url} not healthy after {deadline_s}s: {last}")


def stop(proc: subprocess.Popen | None) -> None:
    """SIGTERM the process we started (rota flushes its writes on it), then SIGKILL if needed."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_GRACE_S)


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(none)"


# -- the key tap ---------------------------------------------------------------------------------

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any


class KeyTap:
    """Forwards every request to the upstream unchanged and records what it carried."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        tap = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self._forward()

            def do_GET(self) -> None:
                self._forward()

            def _forward(self) -> None:
                if "chunked" in self.headers.get("transfer-encoding", "").lower():
                    self.send_error(411, "the key tap expects a Content-Length request body")
                    return
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    parsed = json.loads(body) if body else None
                except ValueError:
                    parsed = body
                with tap._lock:
                    tap.seen.append(
                        Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, parsed)
                    )
                conn = http.client.HTTPConnection("127.0.0.1", tap.upstream(), timeout=30)
                try:
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for k, v in self.headers.items():
                        if k.lower() not in _HOP_BY_HOP:
                            conn.putheader(k, v)
                    conn.endheaders(body)
                    resp = conn.getresponse()
                    self.send_response_only(resp.status, resp.reason)
                    length = resp.getheader("content-length")
                    for k, v in resp.getheaders():
                        if k.lower() not in _HOP_BY_HOP:
                            self.send_header(k, v)
                    if length is None:
                        self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    if length is not None:
                        self.wfile.write(resp.read())
                    else:
                        while chunk := resp.read1(65536):
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (http.client.HTTPException, OSError):
                    # The upstream dropped the connection (e.g. an llmock disconnect fault) or rota
                    # went away: drop the other side too, without a clean end, as the upstream did.
                    self.close_connection = True
                finally:
                    conn.close()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="key-tap", daemon=True)
        self._thread.start()

    def upstream(self) -> int:
        """The port the next request goes to."""
        return self.upstream_port

    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def clear(self) -> None:
        with self._lock:
            self.seen.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=STOP_GRACE_S)


# -- llmock --------------------------------------------------------------------------------------


@dataclass
class LLMock:
    url: str
    proc: subprocess.Popen
    log: Path

    def scenario(self, *behaviors: dict[str, Any]) -> None:
        out = http_post_json(f"{self.url}/_llmock/scenario", {"behaviors": list(behaviors)})
        assert out["queued"] == len(behaviors), out

    def pending(self) -> list[dict[str, Any]]:
        return http_get_json(f"{self.url}/_llmock/scenario")["pending"]

    def requests(self) -> list[dict[str, Any]]:
        """What llmock received, oldest first (it waits up to 2 s for requests still in flight)."""
        return http_get_json(f"{self.url}/_llmock/requests", timeout=10)["requests"]

    def reset(self) -> None:
        http_post_json(f"{self.url}/_llmock/reset", {})


def start_llmock(dir: Path) -> LLMock:
    exe = Path(sys.executable).parent / "llmock"
    last: Exception | None = None
    for attempt in range(3):  # a port picked free can be taken before llmock binds it
        port = free_port()
        log = dir / f"llmock-{attempt}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(exe), "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                 "--response-style", "static", "--tool-mode", "off"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=clean_env(), cwd=dir,
            )
        try:
            wait_healthy(f"http://127.0.0.1:{port}/health", proc, deadline_s=20)
            return LLMock(f"http://127.0.0.1:{port}", proc, log)
        except (RuntimeError, TimeoutError) as e:
            last = e
            stop(proc)
    raise RuntimeError(f"llmock did not start: {last}\n{tail(log)}")


# -- rota ----------------------------------------------------------------------------------------


@dataclass
class Rota:
    """A running `rota serve`: its address, the agent key tests call it with, its dir and database."""

    addr: str  # host:port of rota serve
    agent_key: str
    dir: Path
    stderr: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def db(self) -> Path:
        return self.dir / "rota.db"

    def query(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
        con.row_factory = sqlite3.Row
        try:
            return con.execute(sql, args).fetchall()
        finally:
            con.close()

    def audit(self, request_id: str, deadline_s: float = 10.0) -> tuple[sqlite3.Row, list[sqlite3.Row]]:
        """The request's `requests` row and its `attempts` rows, once the audit writer stored them all."""
        deadline = time.monotonic() + deadline_s
        while True:
            req = self.query("SELECT * FROM requests WHERE id = ?", request_id)
            att = self.query("SELECT * FROM attempts WHERE request_id = ? ORDER BY seq", request_id)
            if req and len(att) == req[0]["attempts"]:
                return req[0], att
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"audit rows of {request_id} not written within {deadline_s}s: "
                    f"requests={[dict(r) for r in req]} attempts={[dict(r) for r in att]}"
                )
            time.sleep(0.05)

    def usage_stats(self, profile_id: str, ready: Any, deadline_s: float = 10.0) -> sqlite3.Row:
        """The profile's `usage_stats` row once `ready(row)` holds (the stats writer runs in the background)."""
        deadline = time.monotonic() + deadline_s
        while True:
            rows = self.query("SELECT * FROM usage_stats WHERE profile_id = ?", profile_id)
            if rows and ready(rows[0]):
                return rows[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"usage_stats of {profile_id} never reached the expected state: "
                                     f"{[dict(r) for r in rows]}")
            time.sleep(0.05)


@dataclass
class Gateway(Rota):
    """rota in front of the key tap and llmock (the `gateway` fixture)."""

    llmock: LLMock = field(kw_only=True)
    tap: KeyTap = field(kw_only=True)


def rota(dir: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [str(rota_bin()), "--config", str(dir / "rota.toml"), *args],
        input=stdin if stdin is not None else "", capture_output=True, text=True, cwd=dir,
        env=clean_env(ROTA_LOG="warn"), timeout=30,
    )
    assert out.returncode == 0, f"rota {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out


def read_first_line(proc: subprocess.Popen, deadline_s: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(deadline_s)
    if not box:
        raise TimeoutError(f"rota serve printed nothing on stdout within {deadline_s}s")
    return box[0]


def create_agent(dir: Path, name: str) -> str:
    """A new agent through the CLI; its key (rk_…) is the last line rota prints."""
    created = rota(dir, "agents", "create", name).stdout.strip().splitlines()
    agent_key = created[-1].strip()
    assert agent_key.startswith("rk_"), created
    return agent_key


def start_rota(dir: Path, stderr: Path, **env: str) -> tuple[subprocess.Popen, str]:
    """`rota serve` on 127.0.0.1:0 with dir's config (and `env`), once healthy: the process and its host:port.

    A rota that does not come up is stopped here, since the caller never gets hold of it.
    """
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [str(rota_bin()), "--config", str(dir / "rota.toml"), "serve", "--listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True, cwd=dir,
            env=clean_env(ROTA_LOG="warn", **env),
        )
    try:
        line = read_first_line(proc, deadline_s=20).strip()
        prefix = "rota listening on http://"
        assert line.startswith(prefix), f"unexpected first stdout line {line!r}\n{tail(stderr)}"
        addr = line[len(prefix):]
        wait_healthy(f"http://{addr}/healthz", proc, deadline_s=10)
        return proc, addr
    except BaseException:
        stop_rota(proc)
        raise


def stop_rota(proc: subprocess.Popen | None) -> None:
    """stop() the rota of start_rota and close the stdout pipe it was started with."""
    stop(proc)
    if proc is not None and proc.stdout is not None:
        proc.stdout.close()


CONFIG = """\
[providers.openai]
api = "openai"
base_url = "http://127.0.0.1:{port}/v1"

[providers.anthropic]
api = "anthropic"
base_url = "http://127.0.0.1:{port}/anthropic"

[models]
primary = "openai/{openai_model}"

# An explicit order, so every test knows which profile is tried first (a, then b).
[auth.order]
openai = ["openai:a", "openai:b"]
anthropic = ["anthropic:a", "anthropic:b"]

[timeouts]
connect = "2s"
first_byte = "10s"
idle = "10s"
total = "30s"

# The agents' lease reports may cool every profile (two a provider here), so that a lease walk
# goes where the gateway's would (docs/api.md, "A claim moves a bounded share").
[leases]
claim_share = 1.0
"""


@pytest.fixture(autouse=True)
def _bounded_in_time():
    """Fails a test (fixtures included) that runs longer than TEST_DEADLINE_S; teardowns still run."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"test exceeded {TEST_DEADLINE_S}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_DEADLINE_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def gateway(_bounded_in_time) -> Any:
    """A fresh llmock, key tap and `rota serve` (own temp dir, database and agent) per test."""
    rota_bin()  # fail fast when the binary is missing
    tmp = tempfile.TemporaryDirectory(prefix="rota-peers-")
    dir = Path(tmp.name)
    llmock: LLMock | None = None
    tap: KeyTap | None = None
    proc: subprocess.Popen | None = None
    stderr = dir / "rota.stderr"
    try:
        llmock = start_llmock(dir)
        tap = KeyTap(int(llmock.url.rsplit(":", 1)[1]))
        (dir / "rota.toml").write_text(CONFIG.format(port=tap.port, openai_model=OPENAI_MODEL))
        for pid, key in UPSTREAM_KEYS.items():
            provider, name = pid.split(":")
            rota(dir, "profiles", "add", provider, "--name", name, stdin=key + "\n")
        agent_key = create_agent(dir, "sdk")
        proc, addr = start_rota(dir, stderr)
        # The checks above went to rota only; start each test with empty upstream logs.
        llmock.reset()
        tap.clear()
        yield Gateway(addr, agent_key, dir, stderr, proc, llmock=llmock, tap=tap)
    finally:
        stop_rota(proc)
        if llmock is not None:
            stop(llmock.proc)
        if tap is not None:
            tap.close()
        # Shown by pytest only when the test failed.
        print(f"--- rota stderr (ROTA_LOG=warn) ---\n{tail(stderr)}")
        if llmock is not None:
            print(f"--- llmock log ---\n{tail(llmock.log)}")
        tmp.cleanup()
