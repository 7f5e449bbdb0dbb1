#!/usr/bin/env python3
"""A fleet's cost to its PostgreSQL primary (docs/scale.md, "Capacity"): 1, 2, 4 and 8 `rota
serve` on one database, with 10, 1,000 and 10,000 profiles, under chat load from `hey` in front
of rota-mock, and what each request costs the database.

    scripts/capacity.py [--bin target/release] [--instances 1,2,4,8] [--profiles 10,1000,10000]
                        [--seconds 10] [--concurrency 32] [--out FILE]

- A throwaway PostgreSQL 15 (scripts/postgres.sh) with `fsync` on, as in production, and
  `pg_stat_statements` loaded. One database per profile count, made with rota's CLI (`migrate`,
  `import openclaw`, `agents create`); every instance count runs on it in turn.
- Load: `hey` for `--seconds`, `--concurrency` connections split over the instances (a load
  balancer without affinity), chats without a session on the `cap` provider's profiles.
- Per request, from the database's own counters over the load: PostgreSQL's CPU time (every
  server process's user and system time, /proc), statements (`pg_stat_statements`), commits,
  WAL bytes (`pg_current_wal_lsn`), rows written (inserted, updated and deleted) and change-feed
  entries (`change_seq`); rota's CPU time, summed over the instances; requests a second and
  latency at p50/p99.
- The change feed's delay, with two instances or more: during the load, an admin reports a
  lease of the `probe` provider's profile as rate-limited on one instance (the window is
  written before the answer), then every other instance is polled every 2 ms until it shows
  the profile cooling; the delay is from that answer to each instance's first such view. Then
  the profile is cleared and the next probe starts on the next instance. p50 and p99 of all
  samples.

Everything listens on 127.0.0.1; needs `hey`, `psql` and rota's release binaries. Exit status
1 when a request fails or a change never reaches an instance within 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import TICKS, Bench, Proc, free_port, hey_many, pct, wait_http  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENV = {"ROTA_LOG": "warn", "ROTA_SECRETS__KEYRING": "off"}
CHAT = {"model": "cap/m", "messages": [{"role": "user", "content": "Say hello."}]}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Postgres:
    """The throwaway server: its admin URL, its data dir, and SQL through psql."""

    def __init__(self, dir: Path):
        self.dir = dir
        env = {**os.environ, "ROTA_PG_OPTIONS": "-c fsync=on -c synchronous_commit=on "
               "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
               "-c shared_buffers=256MB -c max_wal_size=4GB"}
        started = subprocess.run([str(REPO / "scripts" / "postgres.sh"), "start", str(dir)], env=env, text=True,
                                 capture_output=True)
        if started.returncode:
            raise RuntimeError(f"PostgreSQL did not start: {started.stderr}")
        out = started.stdout
        self.admin = next(l.split("=", 1)[1] for l in out.splitlines() if "ROTA_TEST_PG=" in l)

    def url(self, db: str) -> str:
        return self.admin.rsplit("/", 1)[0] + "/" + db

    def sql(self, query: str, db: str = "postgres") -> str:
        return subprocess.run(["psql", self.url(db), "-Atqc", query], text=True, capture_output=True,
                              check=True).stdout.strip()

    def cpu_seconds(self) -> float:
        """User and system time of the postmaster and every process it started (its exited
        children's too, which it waited for)."""
        root = int((self.dir / "data" / "postmaster.pid").read_text().split()[0])
        total = 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                f = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid = int(stat.parent.name)
            if pid == root:
                total += sum(int(x) for x in f[11:15])  # utime, stime, cutime, cstime
            elif int(f[1]) == root:
                total += int(f[11]) + int(f[12])
        return total / TICKS

    def stop(self) -> None:
        subprocess.run([str(REPO / "scripts" / "postgres.sh"), "stop", str(self.dir)], check=False)


def counters(pg: Postgres, db: str) -> dict[str, float]:
    row = pg.sql("SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d "
                 f"ON d.oid = s.dbid WHERE d.datname = '{db}'), xact_commit, tup_inserted + tup_updated + tup_deleted, "
                 "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') FROM pg_stat_database "
                 f"WHERE datname = '{db}'", db)
    feed = pg.sql("SELECT n FROM change_seq", db)
    statements, commits, rows, wal = (float(x) for x in row.split("|"))
    return {"statements": statements, "commits": commits, "rows": rows, "wal": wal, "feed": float(feed),
            "cpu": pg.cpu_seconds()}


def call(url: str, key: str, body: dict | None = None, method: str | None = None, also: int = 0) -> dict:
    """The JSON answer of a 2xx (or of status `also`)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
                                 method=method or ("POST" if body is not None else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        if e.code == also:
            return json.loads(e.read() or b"{}")
        raise RuntimeError(f"{req.method} {url}: {e.code} {e.read()[:300]!r}") from None


def probe_feed(urls: list[str], admin: str, stop: threading.Event, delays: list[float]) -> None:
    """Rate-limits the probe profile on one instance, times its arrival on the others, clears it."""
    pid = "probe:p1"
    i = 0
    while not stop.is_set():
        home, others = urls[i % len(urls)], [u for j, u in enumerate(urls) if j != i % len(urls)]
        i += 1
        lease = call(f"{home}/api/v1/leases", admin, {"model": "probe/m", "profile": pid, "fallbacks": []})
        call(f"{home}/api/v1/leases/{lease['lease_id']}/report", admin,
             {"outcome": "failure", "http_status": 429, "error": "rate limited", "headers": {"retry-after": "600"}},
             also=429)  # the walk ends: the pinned profile was its only candidate
        t0 = time.monotonic()
        waiting = set(others)
        while waiting and time.monotonic() - t0 < 10:
            for u in list(waiting):
                if call(f"{u}/api/v1/profiles/{pid}", admin)["status"]["state"] == "cooling":
                    delays.append((time.monotonic() - t0) * 1000)
                    waiting.discard(u)
            time.sleep(0.002)
        delays.extend(float("inf") for _ in waiting)
        call(f"{home}/api/v1/profiles/{pid}/clear", admin, {})
        while any(call(f"{u}/api/v1/profiles/{pid}", admin)["status"]["state"] != "usable" for u in urls):
            time.sleep(0.01)
        stop.wait(0.2)


def setup(b: Bench, pg: Postgres, mock: str, profiles: int) -> tuple[Path, str, str]:
    db = f"cap_{profiles}"
    pg.sql(f"CREATE DATABASE {db}")
    conf = b.dir / f"{db}.toml"
    conf.write_text(f"""[database]
url = "{pg.url(db)}"
[secrets]
key_file = "{b.dir / 'rota.key'}"
[providers.cap]
api = "openai"
base_url = "{mock}/v1"
[providers.probe]
api = "openai"
base_url = "{mock}/v1"
[models]
primary = "cap/m"
""")
    env = {**os.environ, **ENV}

    def cli(*args: str) -> str:
        return subprocess.run([str(b.bins / "rota"), "--config", str(conf), *args], text=True, capture_output=True,
                              env=env, cwd=b.dir, check=True).stdout

    cli("migrate")
    pg.sql("CREATE EXTENSION pg_stat_statements", db)
    every = {f"cap:k{i:05}": {"type": "api_key", "provider": "cap", "key": f"sk-ok-cap-{i}"} for i in range(profiles)}
    every["probe:p1"] = {"type": "api_key", "provider": "probe", "key": "sk-ok-probe"}
    (b.dir / f"{db}.json").write_text(json.dumps({"version": 1, "profiles": every}))
    cli("import", "openclaw", str(b.dir / f"{db}.json"))
    agent = cli("agents", "create", "load").strip().splitlines()[-1]
    admin = cli("agents", "create", "ops", "--admin").strip().splitlines()[-1]
    return conf, agent, admin


def measure(b: Bench, pg: Postgres, conf: Path, db: str, n: int, agent: str, admin: str, a) -> dict:
    serves: list[Proc] = []
    for i in range(n):
        port = free_port()
        p = b.start(f"{db}-{n}-{i}", [str(b.bins / "rota"), "--config", str(conf), "serve", "--listen",
                                      f"127.0.0.1:{port}"], env=ENV, ready=f"http://127.0.0.1:{port}")
        wait_http(f"{p.url}/healthz")
        serves.append(p)
    try:
        urls = [f"{p.url}/v1/chat/completions" for p in serves]
        headers = {"Authorization": f"Bearer {agent}"}
        hey_many(urls, CHAT, 200 * n, 4 * n, headers, [])
        time.sleep(1)
        pg.sql("SELECT pg_stat_statements_reset()", db)
        before = counters(pg, db)
        stop, delays = threading.Event(), []
        prober = threading.Thread(target=probe_feed, args=([p.url for p in serves], admin, stop, delays), daemon=True)
        if n > 1:
            prober.start()
        run = hey_many(urls, CHAT, 0, max(a.concurrency, n), headers, [p.pid for p in serves],
                       duration=f"{a.seconds}s")
        stop.set()
        if n > 1:
            prober.join(30)
        time.sleep(2)  # the write-behinds' last batches
        after = counters(pg, db)
        top = pg.sql("SELECT round(total_exec_time)::bigint || ' ms, ' || calls || ' calls: ' || "
                     "left(regexp_replace(query, '\\s+', ' ', 'g'), 90) FROM pg_stat_statements s "
                     f"JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '{db}' "
                     "ORDER BY total_exec_time DESC LIMIT 6", db)
        log("  where the database's time went:\n    " + top.replace("\n", "\n    "))
    finally:
        for p in serves:
            p.stop()
            b.procs.remove(p)
    if run.errors or float("inf") in delays:
        raise RuntimeError(f"{run.errors} request(s) failed, {delays.count(float('inf'))} change(s) never arrived")
    per = {k: (after[k] - before[k]) / max(1, run.n) for k in before}
    return {
        "profiles": int(db.split("_")[1]), "instances": n, "rps": run.rps, "p50": run.p50_ms, "p99": run.p99_ms,
        "errors": run.errors, "rota_cpu_ms": run.cpu_ms_per_req, "pg_cpu_ms": per["cpu"] * 1000,
        "statements": per["statements"], "commits": per["commits"], "wal_bytes": per["wal"], "rows": per["rows"],
        "feed": per["feed"], "feed_p50": pct(delays, 50) if delays else None,
        "feed_p99": pct(delays, 99) if delays else None, "probes": len(delays),
    }


def table(results: list[dict]) -> str:
    def ms(v):
        return "—" if v is None else ("lost" if v == float("inf") else f"{v:.1f}")

    lines = ["| profiles | instances | req/s | p50 ms | p99 ms | rota CPU ms/req | PostgreSQL CPU ms/req | statements/req "
             "| commits/req | WAL bytes/req | rows/req | feed entries/req | feed delay p50 / p99 ms (samples) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['profiles']:,} | {r['instances']} | {r['rps']:,.0f} | {r['p50']:.1f} | {r['p99']:.1f} | "
                     f"{r['rota_cpu_ms']:.3f} | {r['pg_cpu_ms']:.3f} | {r['statements']:.2f} | {r['commits']:.2f} | "
                     f"{r['wal_bytes']:,.0f} | {r['rows']:.2f} | {r['feed']:.3f} | "
                     f"{ms(r['feed_p50'])} / {ms(r['feed_p99'])} ({r['probes']}) |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release", help="folder holding rota and rota-mock")
    ap.add_argument("--instances", default="1,2,4,8")
    ap.add_argument("--profiles", default="10,1000,10000")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=32, help="connections in all, split over the instances")
    ap.add_argument("--out", help="also write the table (markdown) to this file")
    a = ap.parse_args()
    for tool in ("hey", "psql"):
        if not shutil.which(tool):
            log(f"{tool} is missing")
            return 1
    work = Path(tempfile.mkdtemp(prefix="rota-capacity-"))
    work.chmod(0o755)  # the server runs as the postgres user when this runs as root
    b = Bench(Path(a.bin).resolve(), work, False)
    pg = Postgres(work / "pg")
    results = []
    try:
        mock = b.start("mock", [str(b.bins / "rota-mock")])
        for profiles in (int(x) for x in a.profiles.split(",")):
            conf, agent, admin = setup(b, pg, mock.url, profiles)
            for n in (int(x) for x in a.instances.split(",")):
                log(f"{profiles} profiles, {n} instance(s)")
                results.append(measure(b, pg, conf, f"cap_{profiles}", n, agent, admin, a))
                log(table(results[-1:]).splitlines()[-1])
    finally:
        b.stop_all()
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    head = (f"{os.cpu_count()} cores ({cpu}), one machine for PostgreSQL, rota, rota-mock and hey; "
            f"{a.seconds} s of load at {a.concurrency} connections per row.\n\n")
    out = head + table(results)
    print(out)
    if a.out:
        Path(a.out).write_text(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
