#!/usr/bin/env python3
"""rota's benchmark: the direct call to the mock upstream and the same call through rota, side
by side, in one run, with `hey` driving the load (see docs/performance.md).

    scripts/bench.sh [--smoke] [--peers] [--postgres URL] [--callgrind]

For each scenario: requests/s, p50/p99 latency, the latency rota adds (rota minus direct),
rota's CPU time per request (utime+stime from /proc) and its peak RSS (VmHWM, reset before each
scenario), next to the floor: `rota-floor` (crates/rota-bench/src/floor.rs), a bare pass-through proxy on the
same stack, whose figures are what any proxy in front of the mock costs. `--callgrind` adds
instructions per request, rota's and the floor's, counted by valgrind. `--peers` adds LiteLLM's
proxy and Portkey's gateway in front of the same mock.
A second table gives the latency each path adds to the direct call at p50 and p99, chat at 1, 16
and 64 concurrent (the shape of BerriAI's ai-gateway-bench): the floor, rota and the peers.
`--postgres URL` (a server's maintenance database) adds the shared-state table: the same
scenarios with rota on PostgreSQL, one instance and two, next to SQLite.
Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
CHAT = {"model": "MODEL", "messages": [{"role": "user", "content": "Say hello."}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def reset_peak(pid: int) -> None:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


def wait_http(url: str, deadline_s: float = 20.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except Exception:  # noqa: BLE001 (not up yet)
            time.sleep(0.002)
    raise TimeoutError(url)


@dataclass
class Run:
    rps: float
    p50_ms: float
    p99_ms: float
    ttfb_p50_ms: float
    n: int
    errors: int
    cpu_ms_per_req: float | None = None
    peak_rss_mb: float | None = None


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def hey(url: str, body: dict, n: int, c: int, headers: dict[str, str], pid: int | None = None,
        duration: str | None = None) -> Run:
    """`n` requests (or as many as fit in `duration`) at concurrency `c`; each times out at 20 s."""
    return hey_many([url], body, n, c, headers, [pid] if pid else [], duration)


def hey_many(urls: list[str], body: dict, n: int, c: int, headers: dict[str, str], pids: list[int],
             duration: str | None = None) -> Run:
    """Like `hey`, the requests and the concurrency split evenly over `urls` (one `hey` each, all at
    once, as a load balancer spreads them); CPU time summed and peak RSS the largest over `pids`."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(body, f, separators=(",", ":"))
    amount = ["-z", duration] if duration else ["-n", str(n // len(urls))]
    args = ["hey", *amount, "-c", str(c // len(urls)), "-t", "20", "-m", "POST", "-T", "application/json", "-D", f.name,
            "-o", "csv"]
    for k, v in headers.items():
        args += ["-H", f"{k}: {v}"]
    for pid in pids:
        reset_peak(pid)
    cpu0 = sum(cpu_seconds(pid) for pid in pids)
    t0 = time.monotonic()
    procs = [subprocess.Popen(args + [url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for url in urls]
    outs = [p.communicate()[0] for p in procs]
    wall = time.monotonic() - t0
    os.unlink(f.name)
    if any(p.returncode for p in procs):
        raise RuntimeError(f"hey failed: {[p.returncode for p in procs]}")
    rows = [r for out in outs for r in csv.DictReader(io.StringIO(out))]
    ok = [r for r in rows if r["status-code"] == "200"]
    lat = [float(r["response-time"]) * 1000 for r in ok]
    ttfb = [float(r["Response-delay"]) * 1000 for r in ok]
    # hey's CSV lists answered requests only: one that timed out or broke off is missing, so with
    # a count, the missing ones are errors too (hey sends n rounded down to a multiple of c).
    per, conc = n // len(urls), max(1, c // len(urls))
    sent = len(rows) if duration else max(len(rows), len(urls) * (per // conc) * conc)
    run = Run(len(rows) / wall, pct(lat, 50), pct(lat, 99), pct(ttfb, 50), sent, sent - len(ok))
    if pids:
        run.cpu_ms_per_req = (sum(cpu_seconds(pid) for pid in pids) - cpu0) * 1000 / max(1, len(rows))
        run.peak_rss_mb = max(status_kb(pid, "VmHWM") for pid in pids) / 1024
    return run


@dataclass
class Proc:
    proc: subprocess.Popen
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@dataclass
class Bench:
    bins: Path
    dir: Path
    smoke: bool
    procs: list[Proc] = field(default_factory=list)

    def n(self, full: int) -> int:
        return max(50, full // 40) if self.smoke else full

    @property
    def peer_time(self) -> str:
        """Peers are slow: they get a fixed time per scenario rather than a request count."""
        return "3s" if self.smoke else "20s"

    def start(self, name: str, args: list[str], env: dict | None = None, ready: str | None = None) -> Proc:
        log = self.dir / f"{name}.log"
        # stdout is a pipe only when its first line is read (the URL); otherwise it goes to the log:
        # a pipe nobody reads fills at 64 KiB and then blocks the writer (LiteLLM stalled there,
        # its event loop stuck writing uvicorn's one access-log line per request).
        out = open(log, "wb")
        proc = subprocess.Popen(args, stdout=subprocess.PIPE if ready is None else out, stderr=out, cwd=self.dir,
                                env={**os.environ, **(env or {})}, text=True)
        p = Proc(proc, "", log)
        self.procs.append(p)
        if ready is None:
            line = proc.stdout.readline()
            p.url = line.strip().rsplit(" ", 1)[-1]
        else:
            p.url = ready
        return p

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            p.stop()


def rota_config(mock: str, db: Path) -> str:
    # The mix provider tries its rate-limited profiles first and cools them for 1 ms only, so
    # most requests meet a 429 and rotate: the scenario measures rotation, not skipping.
    return f"""
[database]
url = "sqlite://{db}"
[providers.bench]
api = "openai"
base_url = "{mock}/v1"
[providers.mix]
api = "openai"
base_url = "{mock}/v1"
[providers.many]
api = "openai"
base_url = "{mock}/v1"
[models]
primary = "bench/m"
[auth.order]
mix = ["mix:bad1", "mix:bad2", "mix:ok1", "mix:ok2"]
[cooldown]
base = "1ms"
factor = 1
max = "1ms"
failure_window = "1s"
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release", help="folder holding rota and rota-mock")
    ap.add_argument("--smoke", action="store_true", help="a few seconds: small request counts")
    ap.add_argument("--peers", action="store_true", help="add LiteLLM's proxy and Portkey's gateway")
    ap.add_argument("--out", help="also write the table (markdown) to this file")
    ap.add_argument("--postgres", metavar="URL", help="add rota on PostgreSQL (a server's maintenance database URL)")
    ap.add_argument("--callgrind", action="store_true", help="add instructions per request (valgrind), rota and the floor")
    a = ap.parse_args()
    bins = Path(a.bin).resolve()
    work = Path(tempfile.mkdtemp(prefix="rota-bench-"))
    b = Bench(bins, work, a.smoke)
    try:
        return run(a, b)
    finally:
        b.stop_all()
        shutil.rmtree(work, ignore_errors=True)


def run(a, b: Bench) -> int:
    rota_bin = str(b.bins / "rota")
    mock = b.start("mock", [str(b.bins / "rota-mock")])
    db = b.dir / "bench.db"
    (b.dir / "rota.toml").write_text(rota_config(mock.url, db))
    env = {"ROTA_LOG": "warn", "ROTA_SECRETS__KEYRING": "off"}
    for name, key in [("ok1", "sk-ok-1"), ("ok2", "sk-ok-2")]:
        subprocess.run([rota_bin, "--config", "rota.toml", "profiles", "add", "bench", "--name", name], input=key,
                       text=True, cwd=b.dir, env={**os.environ, **env}, check=True, capture_output=True)
    for name, key in [("ok1", "sk-ok-1"), ("ok2", "sk-ok-2"), ("bad1", "sk-limited-1"), ("bad2", "sk-limited-2")]:
        subprocess.run([rota_bin, "--config", "rota.toml", "profiles", "add", "mix", "--name", name], input=key,
                       text=True, cwd=b.dir, env={**os.environ, **env}, check=True, capture_output=True)
    # A provider with MANY profiles, imported at once (OpenClaw's auth-profiles.json format).
    many = {"version": 1, "profiles": {f"many:k{i:04}": {"type": "api_key", "provider": "many", "key": f"sk-ok-many-{i}"}
                                       for i in range(MANY)}}
    (b.dir / "many.json").write_text(json.dumps(many))
    subprocess.run([rota_bin, "--config", "rota.toml", "import", "openclaw", "many.json"], text=True, cwd=b.dir,
                   env={**os.environ, **env}, check=True, capture_output=True)
    agent = subprocess.run([rota_bin, "--config", "rota.toml", "agents", "create", "bench"], text=True, cwd=b.dir,
                           env={**os.environ, **env}, check=True, capture_output=True).stdout.strip().splitlines()[-1]
    # An agent with limits it never reaches: what admitting under limits costs (docs/config.md).
    limited = subprocess.run([rota_bin, "--config", "rota.toml", "agents", "create", "limited",
                              "--requests-per-minute", "100000000", "--tokens-per-day", "1000000000000"], text=True,
                             cwd=b.dir, env={**os.environ, **env}, check=True,
                             capture_output=True).stdout.strip().splitlines()[-1]
    pg_env = None
    if a.postgres:
        # The same profiles and agent, copied into a database of their own; the same key.
        pg_env = {**env, "DATABASE_URL": create_database(a.postgres, f"rota_bench_{os.getpid()}"),
                  "ROTA_MASTER_KEY": (b.dir / "bench.key").read_text().strip()}
        subprocess.run([rota_bin, "--config", "rota.toml", "migrate", "--from", f"sqlite://{db}"], cwd=b.dir,
                       env={**os.environ, **pg_env}, check=True, capture_output=True)

    def serve(with_env: dict = env) -> tuple[Proc, float]:
        port = free_port()
        t0 = time.monotonic()
        p = b.start("rota", [rota_bin, "--config", "rota.toml", "serve", "--listen", f"127.0.0.1:{port}"],
                    env=with_env, ready=f"http://127.0.0.1:{port}")
        wait_http(f"{p.url}/healthz")
        return p, (time.monotonic() - t0) * 1000

    floor = b.start("floor", [str(b.bins / "rota-floor"), "--upstream", mock.url])
    fl = f"{floor.url}/v1/chat/completions"
    rota, startup_ms = serve()
    time.sleep(0.3)
    idle_mb = status_kb(rota.pid, "VmRSS") / 1024

    direct_h = {"Authorization": "Bearer sk-ok-1"}
    rota_h = {"Authorization": f"Bearer {agent}"}
    limited_h = {"Authorization": f"Bearer {limited}"}
    chat = lambda model, stream=False: {**CHAT, "model": model, **({"stream": True} if stream else {})}  # noqa: E731
    up = f"{mock.url}/v1/chat/completions"
    gw = f"{rota.url}/v1/chat/completions"

    # Warm both paths (connection pools, page cache, SQLite).
    hey(up, chat("m"), 200, 8, direct_h)
    hey(gw, chat("bench/m"), 200, 8, rota_h)
    hey(fl, chat("m"), 200, 8, direct_h)

    scenarios = [
        (chat_name(1), chat("m"), chat("bench/m"), 1, b.n(4000), rota_h),
        (chat_name(16), chat("m"), chat("bench/m"), 16, b.n(40000), rota_h),
        (chat_name(32), chat("m"), chat("bench/m"), 32, b.n(40000), rota_h),
        (chat_name(64), chat("m"), chat("bench/m"), 64, b.n(40000), rota_h),
        (LIMITED, chat("m"), chat("bench/m"), 32, b.n(40000), limited_h),
        ("stream, 32 concurrent", chat("m", True), chat("bench/m", True), 32, b.n(20000), rota_h),
        ("failover mix, 32 concurrent", chat("m"), chat("mix/m"), 32, b.n(40000), rota_h),
        (f"chat, 32 concurrent, {MANY:,} profiles", chat("m"), chat("many/m"), 32, b.n(40000), rota_h),
    ]
    results = []
    floors = {}  # scenario: the floor's run (the direct request, through the bare proxy)
    for name, direct_body, rota_body, c, n, headers in scenarios:
        d = hey(up, direct_body, n, c, direct_h)
        floors[name] = hey(fl, direct_body, n, c, direct_h, pid=floor.pid)
        r = hey(gw, rota_body, n, c, headers, pid=rota.pid)
        results.append((name, d, r))
        progress(name, r)

    # 1,000 concurrent open streams (each 10 events over ~1 s), on a fresh rota process: the
    # kernel may refuse to reset VmHWM, and this scenario's peak is the one with a target.
    n_streams = 200 if b.smoke else 1000
    rota.stop()
    rota, _ = serve()
    gw = f"{rota.url}/v1/chat/completions"
    hey(gw, chat("bench/m"), 200, 8, rota_h)
    d = hey(up, chat("slow", True), n_streams, n_streams, direct_h)
    floors[f"{n_streams} open streams"] = hey(fl, chat("slow", True), n_streams, n_streams, direct_h, pid=floor.pid)
    r = hey(gw, chat("bench/slow", True), n_streams, n_streams, rota_h, pid=rota.pid)
    results.append((f"{n_streams} open streams", d, r))
    progress(f"{n_streams} open streams", r)

    rotated = sqlite_scalar(db, "SELECT round(100.0 * SUM(attempts > 1) / COUNT(*)) || '% of requests rotated past a 429, '"
                                " || round(1.0 * SUM(attempts) / COUNT(*), 2) || ' upstream calls a request'"
                                " FROM requests WHERE requested_model = 'mix/m'")

    shared = []
    if pg_env:
        rota.stop()
        shared = [(name, "SQLite", 1, d, r) for name, d, r in results if name in SHARED_SCENARIOS]
        for instances in (1, 2):
            servers = [serve(pg_env)[0] for _ in range(instances)]
            urls = [f"{p.url}/v1/chat/completions" for p in servers]
            hey_many(urls, chat("bench/m"), 200, 8, rota_h, [])
            for name, direct, _ in (r for r in results if r[0] in SHARED_SCENARIOS):
                body, c, n = SHARED_SCENARIOS[name]
                r = hey_many(urls, chat(body), b.n(n), c, rota_h, [p.pid for p in servers])
                shared.append((name, "PostgreSQL", instances, direct, r))
                progress(f"{name}, PostgreSQL x{instances}", r)
            for p in servers:
                p.stop()

    peers = []
    if a.peers:
        peers = run_peers(b, mock, results, direct_h, chat)

    counted = []
    if a.callgrind:
        rota.stop()
        floor.stop()
        counted = count_instructions(b, rota_bin, mock.url, env, rota_h, direct_h, chat)

    table = (render(results, floors, peers, startup_ms, idle_mb, rotated, b.smoke) + render_added(results, floors, peers)
             + render_shared(shared) + render_counted(counted))
    print(table)
    if a.out:
        Path(a.out).write_text(table)
    bad = ([(n, r.errors) for n, _, r in results if r.errors]
           + [(f"{n} (floor)", r.errors) for n, r in floors.items() if r.errors]
           + [(f"{n} {s} x{i}", r.errors) for n, s, i, _, r in shared if r.errors])
    if bad:
        print(f"errors (non-200 answers): {bad}", file=sys.stderr)
        return 1
    return 0


# Profiles of the `many` provider.
MANY = 2000

# The concurrencies of the added-latency table (render_added), for every path, the peers' too.
ADDED_CONCURRENCY = (1, 16, 64)

# The peers, in the added-latency table's order.
PEERS = ("Portkey", "LiteLLM")


def chat_name(c: int) -> str:
    """The name of the plain chat scenario at concurrency `c`."""
    return f"chat, {c} concurrent"


# The scenario of the agent with limits (requests a minute and tokens a day it never reaches).
LIMITED = "chat, 32 concurrent, agent with limits"

# The scenarios run again with rota on PostgreSQL: (model, concurrency, full request count).
SHARED_SCENARIOS = {
    "chat, 32 concurrent": ("bench/m", 32, 40000),
    "failover mix, 32 concurrent": ("mix/m", 32, 40000),
}


def create_database(admin_url: str, name: str) -> str:
    """Creates database `name` on the server of `admin_url` (with psql); returns its URL."""
    subprocess.run(["psql", admin_url, "-q", "-c", f"CREATE DATABASE {name}"], check=True, capture_output=True)
    base, _, _ = admin_url.rpartition("/")
    return f"{base}/{name}"


def render_shared(shared) -> str:
    if not shared:
        return ""
    out = ["", "", "Shared state: the same scenarios with rota on SQLite (one instance, the rows above) and on "
           "PostgreSQL (one instance, and two behind an even split of the load). Ratio: rota's req/s over the "
           "direct call's in the same run.", "",
           "| scenario | store | instances | req/s | ratio to direct | p50 ms | p99 ms | CPU ms/req (all instances) |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, store, instances, d, r in shared:
        out.append(f"| {name} | {store} | {instances} | {r.rps:,.0f} | {r.rps / d.rps:.2f} | {r.p50_ms:.3f} | "
                   f"{r.p99_ms:.3f} | {r.cpu_ms_per_req:.3f} |")
    return "\n".join(out)


def progress(name: str, r: Run) -> None:
    print(f"  {name}: {r.rps:,.0f} req/s, p50 {r.p50_ms:.2f} ms, {r.errors} errors", file=sys.stderr, flush=True)


def sqlite_scalar(db: Path, sql: str):
    import sqlite3

    time.sleep(0.5)  # the audit writer batches
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def run_peers(b: Bench, mock: Proc, results, direct_h, chat) -> list:
    """LiteLLM's proxy and Portkey's gateway in front of the same mock: chat at each of
    ADDED_CONCURRENCY, for `b.peer_time` each (they are slow)."""
    peers = []
    venv = Path(".venv-bench")
    if not (venv / "bin" / "litellm").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "litellm[proxy]==1.74.9"], check=True)
    port = free_port()
    (b.dir / "litellm.yaml").write_text(
        "model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n"
        f"      api_base: {mock.url}/v1\n      api_key: sk-ok-1\n"
    )
    master = "sk-" + secrets.token_hex(24)
    ll = b.start("litellm", [str((venv / "bin" / "litellm").resolve()), "--config", "litellm.yaml", "--port", str(port),
                             "--host", "127.0.0.1", "--num_workers", "1"],
                 env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": master, "LITELLM_LOG": "ERROR"},
                 ready=f"http://127.0.0.1:{port}")
    wait_http(f"{ll.url}/health/liveliness", 120)
    h = {"Authorization": f"Bearer {master}"}
    hey(f"{ll.url}/v1/chat/completions", chat("m"), 100, 8, h)
    for c in ADDED_CONCURRENCY:
        name = chat_name(c)
        r = hey(f"{ll.url}/v1/chat/completions", chat("m"), 0, c, h, pid=ll.pid, duration=b.peer_time)
        peers.append(("LiteLLM", name, r))
        progress(f"LiteLLM {name}", r)
    ll.stop()

    pk_dir = Path("bench/portkey")
    if not (pk_dir / "node_modules").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--prefix", str(pk_dir)], check=True)
    port = free_port()
    entry = (pk_dir / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js").resolve()
    pk = b.start("portkey", ["node", str(entry), f"--port={port}", "--headless"], ready=f"http://127.0.0.1:{port}")
    time.sleep(2)
    h = {"x-portkey-provider": "openai", "x-portkey-custom-host": f"{mock.url}/v1", "Authorization": "Bearer sk-ok-1"}
    hey(f"{pk.url}/v1/chat/completions", chat("m"), 100, 8, h)
    for c in ADDED_CONCURRENCY:
        name = chat_name(c)
        r = hey(f"{pk.url}/v1/chat/completions", chat("m"), 0, c, h, pid=pk.pid, duration=b.peer_time)
        peers.append(("Portkey", name, r))
        progress(f"Portkey {name}", r)
    pk.stop()
    return peers


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "—"


def count_instructions(b: Bench, rota_bin: str, mock_url: str, env: dict, rota_h: dict, direct_h: dict, chat):
    """Instructions per request under callgrind, rota's and the floor's, per scenario: a process
    that served N requests minus one that served none (start-up and shutdown cancel out), over N.
    Valgrind is Debian's; installed by scripts/bench.sh. Also rota's top functions (self cost)."""
    scenarios = [("chat", chat("bench/m"), chat("m"), 20 if b.smoke else 2000),
                 ("stream", chat("bench/m", True), chat("m", True), 10 if b.smoke else 500),
                 ("failover mix", chat("mix/m"), None, 10 if b.smoke else 500)]

    def counted(who: str, load) -> tuple[int, Path]:
        out = b.dir / f"callgrind.{who}.{len(list(b.dir.glob('callgrind.*')))}"
        valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        if who == "rota":
            port = free_port()
            p = b.start("callgrind-rota", [*valgrind, rota_bin, "--config", "rota.toml", "serve", "--listen",
                                           f"127.0.0.1:{port}"], env=env, ready=f"http://127.0.0.1:{port}")
            wait_http(f"{p.url}/healthz", 120)
        else:
            p = b.start("callgrind-floor", [*valgrind, str(b.bins / "rota-floor"), "--upstream", mock_url])
        if load:
            body, headers, n = load
            r = hey(f"{p.url}/v1/chat/completions", body, n, 4, headers)
            if r.errors:
                raise RuntimeError(f"callgrind {who}: {r.errors} non-200 answers")
        p.proc.send_signal(signal.SIGTERM)
        p.proc.wait(120)
        totals = [ln for ln in out.read_text().splitlines() if ln.startswith(("summary:", "totals:"))]
        return int(totals[-1].split()[1]), out

    rows = []
    base = {who: counted(who, None)[0] for who in ("rota", "floor")}
    top = ""
    for name, rota_body, floor_body, n in scenarios:
        total, out = counted("rota", (rota_body, rota_h, n))
        per_rota = (total - base["rota"]) / n
        per_floor = (counted("floor", (floor_body, direct_h, n))[0] - base["floor"]) / n if floor_body else None
        rows.append((name, n, per_rota, per_floor))
        if name == "chat":
            top = subprocess.run(["callgrind_annotate", "--inclusive=no", str(out)], capture_output=True,
                                 text=True).stdout
        floor_text = f"{per_floor:,.0f}" if per_floor else "—"
        print(f"  callgrind {name}: rota {per_rota:,.0f}, floor {floor_text} instructions/request",
              file=sys.stderr, flush=True)
    return rows, top


def render_counted(counted) -> str:
    if not counted:
        return ""
    rows, top = counted
    out = ["", "", "Instructions per request (callgrind): N requests at 4 concurrent, minus a process that served none.",
           "", "| scenario | requests | rota instructions/req | floor instructions/req | rota ÷ floor |",
           "|---|---:|---:|---:|---:|"]
    for name, n, per_rota, per_floor in rows:
        floor = f"{per_floor:,.0f}" if per_floor else "—"
        out.append(f"| {name} | {n:,} | {per_rota:,.0f} | {floor} | {ratio(per_rota, per_floor)} |")
    # callgrind_annotate's function table: the 15 costliest functions by their own instructions.
    lines = top.splitlines()
    at = next((i for i, ln in enumerate(lines) if "file:function" in ln), None)
    if at is not None:
        out += ["", "rota's 15 costliest functions (own instructions, the chat run, start-up included):", "", "```"]
        out += [ln for ln in lines[at + 1:] if ln.strip() and not ln.startswith("-")][:15] + ["```"]
    return "\n".join(out)


def render_added(results, floors, peers) -> str:
    """Added latency in the shape of BerriAI's ai-gateway-bench: per concurrency, each path's p50 and
    p99 minus the direct call's at the same percentile and concurrency, in the same run (chat, not
    streaming). An empty cell: that peer was not run."""
    runs = {n: (d, r) for n, d, r in results}
    peer_runs = {(p, n): r for p, n, r in peers}
    # hey times each request to 0.1 ms (its CSV too: seconds to 4 decimals), so one decimal.
    ms = lambda x: f"{round(x, 1) + 0.0:.1f}"  # noqa: E731 (+ 0.0: no "-0.0")

    def added(r: Run | None, d: Run) -> list[str]:
        if r is None:
            return ["", ""]
        if r.p50_ms != r.p50_ms:  # NaN: no 200 answer within the run's time
            return ["stalled", "stalled"]
        return [ms(r.p50_ms - d.p50_ms), ms(r.p99_ms - d.p99_ms)]

    paths = ["floor", "rota", *PEERS]
    out = ["", "", "Added latency, ms: each path's p50 and p99 minus the direct call's at the same percentile, "
           "same concurrency, same run (chat, not streaming; the shape of BerriAI's ai-gateway-bench). "
           "Direct: the mock's own latency. hey times to 0.1 ms.", "",
           "| concurrency | direct p50 | direct p99 | " + " | ".join(f"{p} p50 | {p} p99" for p in paths) + " |",
           "|---:|" + "---:|" * (2 + 2 * len(paths))]
    notes = []
    for c in ADDED_CONCURRENCY:
        name = chat_name(c)
        if name not in runs:
            continue
        d, r = runs[name]
        cells = [ms(d.p50_ms), ms(d.p99_ms), *added(floors.get(name), d), *added(r, d)]
        for p in PEERS:
            pr = peer_runs.get((p, name))
            cells += added(pr, d)
            if pr is not None and pr.errors:
                notes.append(f"{p} at {c}: {pr.errors:,} of {pr.n:,} requests not answered 200")
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    if notes:
        out += ["", "Not counted in the percentiles: " + "; ".join(notes) + "."]
    return "\n".join(out)


def render(results, floors, peers, startup_ms, idle_mb, rotated, smoke) -> str:
    out = []
    out.append(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; "
               f"{'SMOKE RUN (small counts)' if smoke else 'full run'}")
    out.append("")
    out.append("| scenario | path | req/s | p50 ms | p99 ms | TTFB p50 ms | added p50 ms | added p99 ms | CPU ms/req | peak RSS MB |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    f = lambda x, d=3: "—" if x is None else f"{x:.{d}f}"  # noqa: E731
    for name, d, r in results:
        out.append(f"| {name} | direct | {d.rps:,.0f} | {f(d.p50_ms)} | {f(d.p99_ms)} | {f(d.ttfb_p50_ms)} | | | | |")
        fl = floors[name]
        out.append(f"| {name} | floor | {fl.rps:,.0f} | {f(fl.p50_ms)} | {f(fl.p99_ms)} | {f(fl.ttfb_p50_ms)} | "
                   f"{f(fl.p50_ms - d.p50_ms)} | {f(fl.p99_ms - d.p99_ms)} | {f(fl.cpu_ms_per_req)} | {f(fl.peak_rss_mb, 1)} |")
        out.append(f"| {name} | rota | {r.rps:,.0f} | {f(r.p50_ms)} | {f(r.p99_ms)} | {f(r.ttfb_p50_ms)} | "
                   f"{f(r.p50_ms - d.p50_ms)} | {f(r.p99_ms - d.p99_ms)} | {f(r.cpu_ms_per_req)} | {f(r.peak_rss_mb, 1)} |")
    for peer, name, r in peers:
        base = next(d for n, d, _ in results if n == name)
        if r.n == 0:
            out.append(f"| {name} | {peer} | 0 | no answer within the run's time: stalled | | | | | | {f(r.peak_rss_mb, 1)} |")
            continue
        out.append(f"| {name} | {peer} | {r.rps:,.0f} | {f(r.p50_ms)} | {f(r.p99_ms)} | {f(r.ttfb_p50_ms)} | "
                   f"{f(r.p50_ms - base.p50_ms)} | {f(r.p99_ms - base.p99_ms)} | {f(r.cpu_ms_per_req)} | {f(r.peak_rss_mb, 1)} |")
    out.append("")
    two = next(r for n, _, r in results if n == "chat, 32 concurrent")
    many = next(r for n, _, r in results if n.endswith(" profiles"))
    limited = next(r for n, _, r in results if n == LIMITED)
    out.append(f"rota start-up to ready: {startup_ms:.0f} ms; idle RSS: {idle_mb:.1f} MB; "
               f"failover mix: {rotated}; "
               f"{MANY:,} profiles on one provider: {many.rps / two.rps:.0%} of the req/s with 2; "
               f"an agent with limits: {limited.rps / two.rps:.0%} of the req/s of one without")
    out.append("")
    out.append("| scenario | rota ÷ floor: CPU ms/req | req/s | added p50 ms (rota, floor) |")
    out.append("|---|---:|---:|---:|")
    for name, d, r in results:
        fl = floors[name]
        out.append(f"| {name} | {ratio(r.cpu_ms_per_req, fl.cpu_ms_per_req)} | {ratio(r.rps, fl.rps)} | "
                   f"{f(r.p50_ms - d.p50_ms)}, {f(fl.p50_ms - d.p50_ms)} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
