#!/usr/bin/env python3
"""The audit trail at scale: fill a rota SQLite database with millions of attempts,
then time what reads them: the admin API's attempts and requests listings (each filter, a deep
keyset page), `/api/v1/usage` over 1 day and 30 days, `/api/v1/usage/series` (the console's
charts), the console's first load and every query of docs/audit.md; with `--postgres`, the same on
a PostgreSQL copy. Target: each one at most 100 ms at p95, but for docs/audit.md's whole-history
analyses, which are timed and reported apart.

    scripts/audit_scale.py [--attempts N] [--db PATH] [--workdir DIR] [--keep] [--smoke]
                           [--bin DIR] [--runs 20] [--throughput N] [--seed 16] [--out FILE]
                           [--postgres URL]

- The database is made with rota's CLI (`migrate`, `import openclaw` for 200 profiles of 5
  providers, `agents create` for 20 agents and an admin), then 90 days of `requests` and
  `attempts` ending now are bulk-inserted: daily and weekly cycles, about 3/4 of the requests
  served at the first try, the others rotating past rate limits, overloads, timeouts, server and
  auth errors, falling back or failing; redacted upstream errors; `usage_hourly`,
  `audit_minutely` and `audit_hourly` summed from them as migrations 0010, 0023 and 0025 do. Seeded (`--seed`): the same rows each run, but for the shift to
  end now.
- `--db PATH`: the database to fill, or to reuse if this script filled it (`PATH.json` keeps
  its keys). Default: `audit-N.db` in `--workdir`, which also holds rota's configs and logs and
  defaults to a fresh temporary folder, removed at the end unless `--db` or `--keep` is given or
  the run failed.
- Timing: `rota serve` on the database (`audit.retention = "0s"`), each endpoint `--runs` times
  (at least 3, then within 20 s) on one keep-alive connection after a warm-up; the docs/audit.md
  queries (its ```sql blocks and indented SELECT) likewise with Python's sqlite3 on the same file
  while rota runs, with the EXPLAIN QUERY PLAN of those that miss. `/api/v1/usage/series` over
  1 day per minute (1,440 buckets, the most it gives) and per hour, 30 days per hour, and the
  console's default (the last hour per minute). The docs/audit.md questions that read the whole
  history (ANALYSES: counts over every request or attempt) are in a table of their own, not
  held to the 100 ms target; those that read current state, a roll-up or one day are.
- `--postgres URL` (a PostgreSQL server's maintenance database, `postgres://USER@HOST:PORT/postgres`
  with any `?sslmode=…&sslrootcert=…`): then a fresh database `rota_audit_PID` on that server
  gets a copy of the SQLite file through rota's own `rota migrate --from sqlite://PATH` (timed),
  ANALYZE, and `rota serve` on it is timed the same way, the docs/audit.md queries with one `psql`
  session (connected once; each query timed around its round trip). The report gets a second
  section, and the answers whose row counts differ between the engines. The database is dropped
  at the end unless `--keep`. Needs `psql` on PATH.
- `--smoke`: 20,000 attempts, 3 runs each, at most 400 chats per hey run: seconds, with debug
  binaries too (`--smoke --bin target/debug --throughput 0`).
- `--throughput N` (default 4000, 0: skip): N chats at 32 concurrent with `hey` through rota in
  front of rota-mock, on an empty audit trail and on the filled one, alternately, twice each.
- Exit status 1 when something fails: rota or rota-mock not starting, a CLI command or a query
  failing, an answer other than 200 (hey's included). A failing call or query is reported (its
  row says `error`, the message is under "Errors") and the others are still timed. A missed
  100 ms target is a result, not a failure: the table's `met` column shows it and the exit status
  stays 0.

Needs `rota` and `rota-mock` in `--bin` (default target/release), and `hey` unless
`--throughput 0`. Everything listens on 127.0.0.1. rota logs at `warn`, or as `XLOG` in the
environment says (its `ROTA_LOG`; `warn,sqlx::query=debug` logs each statement's time).
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from itertools import accumulate
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (the benchmark's port, percentile and `hey` helpers)

REPO = Path(__file__).resolve().parent.parent
MIN = 60_000
HOUR = 3_600_000
DAY = 86_400_000
DAYS = 90
TARGET_MS = 100.0

# Providers, their profile counts (200 in all) and models.
PROVIDERS = [
    ("openai", 60, ["gpt-4.1", "gpt-4.1-mini", "o3"]),
    ("anthropic", 60, ["claude-sonnet-4", "claude-opus-4", "claude-3-5-haiku"]),
    ("google", 40, ["gemini-2.5-pro", "gemini-2.5-flash"]),
    ("mistral", 20, ["mistral-large", "codestral"]),
    ("deepseek", 20, ["deepseek-chat", "deepseek-reasoner"]),
]
# The chains agents use (first model, then the fallbacks).
CHAINS = [
    ["openai/gpt-4.1", "anthropic/claude-sonnet-4", "google/gemini-2.5-pro"],
    ["anthropic/claude-sonnet-4", "openai/gpt-4.1", "google/gemini-2.5-pro"],
    ["openai/gpt-4.1-mini", "google/gemini-2.5-flash", "deepseek/deepseek-chat"],
    ["anthropic/claude-opus-4", "openai/o3"],
    ["google/gemini-2.5-pro", "anthropic/claude-sonnet-4"],
    ["mistral/codestral", "openai/gpt-4.1-mini"],
    ["deepseek/deepseek-reasoner", "openai/o3", "anthropic/claude-sonnet-4"],
    ["anthropic/claude-3-5-haiku", "openai/gpt-4.1-mini", "mistral/mistral-large"],
]
AGENTS = [f"agent-{i:02}" for i in range(1, 21)]
ADMIN = "audit-admin"
APIS = (["chat", "messages", "responses", "lease"], [0.55, 0.28, 0.12, 0.05])

# Failure reasons of an attempt in ordinary times: probability at a request's first attempt,
# and the factor for later attempts (a rotation mostly lands on a profile with room left).
REASONS = [
    ("rate_limit", 0.14, 0.4),
    ("overloaded", 0.04, 0.6),
    ("server_error", 0.012, 1.0),
    ("timeout", 0.009, 1.0),
    ("network", 0.004, 1.0),
    ("auth", 0.003, 1.0),
    ("billing", 0.0008, 1.0),
    ("context_overflow", 0.003, 0.5),
    ("format", 0.001, 0.5),
    ("cancelled", 0.004, 1.0),
    ("model_not_found", 0.0004, 0.5),
    ("unknown", 0.0005, 1.0),
    ("auth_permanent", 0.0002, 1.0),
]
STOP = {"context_overflow", "format", "cancelled", "unknown"}
NEXT_MODEL = {"model_not_found"}
RETRYABLE = {"overloaded", "server_error", "timeout", "network"}
COOLDOWN_STEPS = [60_000, 300_000, 1_500_000, 3_600_000]

ERRORS = {
    "rate_limit": [
        '{{"error":{{"message":"Rate limit reached for {model} in organization org-*** on tokens per min (TPM): '
        'Limit {a}000, Used {b}211, Requested {c}87. Please try again in {d}.{c}s. Visit '
        'https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,'
        '"code":"rate_limit_exceeded"}}}}',
        '{{"type":"error","error":{{"type":"rate_limit_error","message":"This request would exceed the rate limit '
        'for your organization (***) of {a}0,000 input tokens per minute. For details, refer to: '
        'https://docs.anthropic.com/en/api/rate-limits."}}}}',
        '{{"error":{{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":'
        '"RESOURCE_EXHAUSTED"}}}}',
    ],
    "overloaded": [
        '{{"type":"error","error":{{"type":"overloaded_error","message":"Overloaded"}}}}',
        '{{"error":{{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}}}',
    ],
    "server_error": [
        '{{"error":{{"message":"The server had an error while processing your request. Sorry about that!",'
        '"type":"server_error","param":null,"code":null}}}}',
        "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center>"
        "<hr><center>cloudflare</center></body></html>",
    ],
    "timeout": ["no answer within {a}s (first byte)", "timed out reading the upstream's answer"],
    "network": ["error sending request for url (https://api.{provider}.com/v1/chat/completions): connection "
                "closed before message completed", "error sending request: dns error: failed to lookup address"],
    "auth": ['{{"error":{{"message":"Incorrect API key provided: sk-***. You can find your API key at '
             'https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,'
             '"code":"invalid_api_key"}}}}'],
    "auth_permanent": ['{{"error":{{"message":"Your organization has been disabled.","type":"invalid_request_error",'
                       '"code":"organization_deactivated"}}}}'],
    "billing": ['{{"error":{{"message":"You exceeded your current quota, please check your plan and billing '
                'details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}}}'],
    "context_overflow": ['{{"error":{{"message":"This model\'s maximum context length is 128000 tokens. However, '
                         'your messages resulted in 13{b}72 tokens. Please reduce the length of the messages.",'
                         '"type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}}}'],
    "format": ['{{"error":{{"message":"Invalid schema for function \'tool_{a}\': \'{b}\' is not valid under any of '
               'the given schemas.","type":"invalid_request_error","param":"tools[0]","code":null}}}}'],
    "model_not_found": ['{{"error":{{"message":"The model `{model}` does not exist or you do not have access to '
                        'it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}}}'],
    "cancelled": ["the client went away"],
    "unknown": ['{{"error":{{"message":"Request failed due to an unexpected condition ({a}{b}).","type":"api_error"}}}}'],
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


# -- setup through the CLI ----------------------------------------------------------------------

ENV = {"ROTA_LOG": os.environ.get("XLOG", "warn"), "ROTA_SECRETS__KEYRING": "off"}


def write_config(work: Path, db: Path, mock_url: str, pg_url: str | None = None) -> Path:
    """rota's config for db, every provider at mock_url; with pg_url, for that PostgreSQL
    database instead, with db's master key file (the copied secrets are sealed with it)."""
    providers = "\n".join(f'[providers.{p}]\napi = "openai"\nbase_url = "{mock_url}/v1"\n' for p, _, _ in PROVIDERS)
    conf = work / f"{db.stem}{'.pg' if pg_url else ''}.toml"
    database = (f'url = "{pg_url}"\n[secrets]\nkey_file = "{db.with_suffix(".key")}"' if pg_url
                else f'url = "sqlite://{db}"')
    conf.write_text(f"""[database]
{database}
[audit]
retention = "0s"
{providers}
[models]
primary = "openai/gpt-4.1"
fallbacks = ["anthropic/claude-sonnet-4", "google/gemini-2.5-pro"]
""")
    return conf


def profile_ids() -> dict[str, list[str]]:
    return {p: [f"{p}:key{i:03}" for i in range(1, n + 1)] for p, n, _ in PROVIDERS}


def cli(bin_dir: Path, conf: Path, *args: str) -> str:
    r = subprocess.run([str(bin_dir / "rota"), "--config", str(conf), *args], text=True, capture_output=True,
                       env={**os.environ, **ENV}, cwd=conf.parent)
    if r.returncode:
        raise RuntimeError(f"rota {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def make_base(bin_dir: Path, db: Path, work: Path) -> dict:
    """Schema, the 200 profiles and the 20 agents plus an admin, through rota's own commands."""
    for p in (db, db.with_suffix(".key"), Path(f"{db}-wal"), Path(f"{db}-shm")):
        p.unlink(missing_ok=True)
    conf = write_config(work, db, "http://127.0.0.1:9")
    cli(bin_dir, conf, "migrate")
    # The keys contain `ok`: rota-mock answers them (a key with `limited` would get 429s).
    profiles = {pid: {"type": "api_key", "provider": pid.split(":")[0], "key": f"sk-ok-{pid.replace(':', '-')}"}
                for ids in profile_ids().values() for pid in ids}
    (work / "profiles.json").write_text(json.dumps({"version": 1, "profiles": profiles}))
    cli(bin_dir, conf, "import", "openclaw", str(work / "profiles.json"))
    keys = [cli(bin_dir, conf, "agents", "create", name).strip().splitlines()[-1] for name in AGENTS]
    admin = cli(bin_dir, conf, "agents", "create", ADMIN, "--admin").strip().splitlines()[-1]
    return {"admin_key": admin, "agent_key": keys[0]}


# -- the traffic --------------------------------------------------------------------------------


class Traffic:
    """Requests and their attempts, minute by minute, from a seeded generator."""

    def __init__(self, seed: int, end_ms: int):
        self.rng = rng = random.Random(seed)
        self.start = end_ms - DAYS * DAY
        self.profiles = profile_ids()
        # A few hot profiles per provider (orders, sticky sessions), the rest even.
        self.cum = {}
        for p, ids in self.profiles.items():
            w = [3.0 if rng.random() < 0.1 else 1.0 for _ in ids]
            self.cum[p] = (ids, list(accumulate(w)))
        # Agents: a few busy ones, a long tail; each on a chain.
        self.agent_cum = list(accumulate(1 / (i + 1) ** 0.9 for i in range(len(AGENTS))))
        self.agent_chain = {a: [tuple(m.split("/")) for m in CHAINS[i % len(CHAINS)]] for i, a in enumerate(AGENTS)}
        self.requested = {a: CHAINS[i % len(CHAINS)][0] if i % 5 else "smart" for i, a in enumerate(AGENTS)}
        # Provider incidents: hours of overloads, rate limits, 5xx or timeouts, with skips while
        # every profile of the provider cools.
        self.incidents = []
        for _ in range(30):
            at = self.start + rng.randrange(DAYS * DAY)
            self.incidents.append((at, at + rng.randint(15, 240) * MIN, rng.choice(PROVIDERS)[0],
                                   rng.choice(["overloaded", "overloaded", "rate_limit", "server_error", "timeout"]),
                                   rng.uniform(0.2, 0.7), rng.uniform(0.05, 0.4)))
        # Broken profiles for a while: out of credit for days, a revoked key for hours.
        self.broken = {}
        for reason, hours in [("billing", 72), ("billing", 30), ("auth", 8), ("auth", 3), ("billing", 120)]:
            p = rng.choice(PROVIDERS)[0]
            pid = rng.choice(self.profiles[p])
            at = self.start + rng.randrange(DAYS * DAY)
            self.broken[pid] = (at, at + hours * HOUR, reason)
        reasons = [r for r, _, _ in REASONS]
        self.base = reasons, list(accumulate(p for _, p, _ in REASONS))
        self.later = reasons, list(accumulate(p * f for _, p, f in REASONS))
        self.stats = {pid: [0, 0, None, None, None, {}] for ids in self.profiles.values() for pid in ids}

    def rate(self, t: int) -> float:
        """Relative request rate at time t: a daily cycle (busiest 14:00-17:00 UTC), quieter
        weekends, 30 % growth over the 90 days."""
        hour = (t % DAY) / HOUR
        daily = 0.25 + 0.75 * math.exp(-(((hour - 15.5 + 12) % 24 - 12) / 4.5) ** 2)
        weekday = time.gmtime(t / 1000).tm_wday
        return daily * (0.45 if weekday >= 5 else 1.0) * (0.85 + 0.3 * (t - self.start) / (DAYS * DAY))

    def minutes(self, total_requests: float):
        """(minute start, requests in it) for every minute of the 90 days."""
        weights = [self.rate(self.start + m * MIN) for m in range(DAYS * 24 * 60)]
        scale = total_requests / sum(weights)
        acc, done = 0.0, 0
        for m, w in enumerate(weights):
            acc += w * scale
            n = int(acc) - done
            done += n
            yield self.start + m * MIN, n

    def pick(self, provider: str, tried: set) -> str:
        ids, cum = self.cum[provider]
        while True:
            pid = ids[bisect.bisect(cum, self.rng.random() * cum[-1])]
            if pid not in tried or len(tried) >= len(ids):
                return pid

    def request(self, t0: int, active: dict):
        """One request from t0: its row and its attempts' rows."""
        rng = self.rng
        agent = AGENTS[bisect.bisect(self.agent_cum, rng.random() * self.agent_cum[-1])]
        chain = self.agent_chain[agent]
        rid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        api = rng.choices(*APIS)[0]
        stream = rng.random() < 0.55
        attempts = []
        t = t0 + rng.randint(0, 3)
        seq = 0
        served = None
        last_reason = None
        status = None
        for ci, (provider, model) in enumerate(chain):
            inc = active.get(provider)
            # Every profile of the provider cooling: the candidate is skipped without a call.
            if (inc and rng.random() < inc[5]) or rng.random() < 0.012:
                reason = inc[3] if inc else rng.choice(["rate_limit", "rate_limit", "overloaded", "auth"])
                until = t + rng.choice(COOLDOWN_STEPS)
                seq += 1
                attempts.append((rid, seq, "skipped", agent, provider, model, None, t, 0, None, None, "skipped",
                                 reason, None, until, f"every profile is cooling ({reason}) until {iso(until)}",
                                 None, None))
                last_reason = reason
                continue
            tried = set()
            probe = rng.random() < 0.004
            for j in range(rng.choice((2, 3, 3))):
                pid = self.pick(provider, tried)
                tried.add(pid)
                tries = 0
                while True:
                    if probe and tries == 0 and j == 0:
                        kind = "probe"
                    elif tries > 0:
                        kind = "retry"
                    elif seq == 0:
                        kind = "primary"
                    elif j > 0:
                        kind = "rotate"
                    else:
                        kind = "fallback"
                    seq += 1
                    reason = self.failure(provider, pid, t, seq == 1, inc)
                    row, t = self.attempt(rid, seq, kind, agent, provider, model, pid, t, stream, reason)
                    attempts.append(row)
                    st = self.stats[pid]
                    st[2] = row[7]
                    if reason is None:
                        served = (provider, model, pid, row[16], row[17])
                        st[0] += 1
                        st[3] = row[7]
                        break
                    st[1] += 1
                    st[4] = row[7]
                    st[5][reason] = st[5].get(reason, 0) + 1
                    last_reason = reason
                    if reason in STOP:
                        status = 499 if reason == "cancelled" else 400 if reason != "unknown" else 502
                        break
                    if reason in RETRYABLE and tries == 0 and rng.random() < 0.3:
                        tries += 1
                        t += rng.randint(50, 400)
                        continue
                    break
                if served or status or reason in NEXT_MODEL:
                    break
            if served or status:
                break
        if served:
            status = 200
        elif status is None:
            status = 429 if last_reason == "rate_limit" else 503
        end = t + rng.randint(1, 5)
        req = (rid, agent, api, self.requested[agent], f"{served[0]}/{served[1]}" if served else None,
               served[2] if served else None, status, seq, t0, end - t0, int(stream),
               served[3] if served else None, served[4] if served else None)
        return req, attempts

    def failure(self, provider: str, pid: str, t: int, first: bool, inc) -> str | None:
        rng = self.rng
        broken = self.broken.get(pid)
        if broken and broken[0] <= t < broken[1] and rng.random() < 0.9:
            return broken[2]
        if inc and rng.random() < inc[4]:
            return inc[3]
        reasons, cum = self.base if first else self.later
        u = rng.random()
        if u >= cum[-1]:
            return None
        return reasons[bisect.bisect(cum, u)]

    def attempt(self, rid, seq, kind, agent, provider, model, pid, t, stream, reason):
        rng = self.rng
        tin = tout = retry_after = cooldown = error = None
        if reason is None:
            tin = min(200_000, max(5, int(rng.lognormvariate(7.4, 1.2))))
            tout = min(32_000, max(1, int(rng.lognormvariate(5.8, 1.0))))
            dur = int(rng.lognormvariate(7.3, 0.6) + tout * rng.uniform(4, 20))
            ttfb = int(rng.lognormvariate(6.4, 0.5)) if stream else max(1, dur - rng.randint(0, 20))
            ttfb = min(ttfb, dur)
            status, outcome = 200, "success"
        else:
            outcome = "failure"
            dur = {"timeout": rng.choice([30_000, 60_000]), "server_error": int(rng.lognormvariate(6.5, 1.0)),
                   "overloaded": int(rng.lognormvariate(6.0, 0.8)), "network": int(rng.lognormvariate(5.0, 1.5)),
                   "cancelled": int(rng.lognormvariate(8.0, 1.0))}.get(reason) or int(rng.lognormvariate(5.2, 0.5))
            status = {"rate_limit": 429, "overloaded": 529 if provider == "anthropic" else 503,
                      "server_error": rng.choice([500, 502, 503]), "auth": 401, "auth_permanent": 403,
                      "billing": 402 if provider != "openai" else 429, "context_overflow": 400, "format": 400,
                      "model_not_found": 404, "unknown": 418}.get(reason)
            ttfb = dur if status else None
            if reason == "rate_limit" and rng.random() < 0.6:
                retry_after = rng.choice([1000, 2000, 5000, 20_000, 60_000])
            if reason in ("rate_limit", "overloaded", "server_error", "timeout", "auth", "network"):
                cooldown = t + dur + max(retry_after or 0, rng.choice(COOLDOWN_STEPS))
            elif reason == "billing":
                cooldown = t + dur + 5 * HOUR
            text = rng.choice(ERRORS[reason])
            error = text.format(model=model, provider=provider, a=rng.randint(2, 9), b=rng.randint(100, 999),
                                c=rng.randint(10, 99), d=rng.randint(1, 9))[:500]
        row = (rid, seq, kind, agent, provider, model, pid, t, dur, ttfb, status, outcome, reason, retry_after,
               cooldown, error, tin, tout)
        return row, t + dur + rng.randint(0, 3)


INSERT_ATTEMPT = ("INSERT INTO attempts (request_id, seq, kind, agent, provider, model, profile_id, started_at, "
                  "duration_ms, ttfb_ms, http_status, outcome, reason, retry_after_ms, cooldown_until, error, "
                  "tokens_in, tokens_out) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")
INSERT_REQUEST = ("INSERT INTO requests (id, agent, api, requested_model, served_model, served_profile, status, "
                  "attempts, started_at, duration_ms, stream, tokens_in, tokens_out) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)")


def fill(db: Path, target: int, seed: int, end_ms: int) -> dict:
    """Requests and attempts, in time order as rota writes them, with the indices in place."""
    # Attempts per request of this mix, from a trial run on its own generator.
    trial = Traffic(seed + 1, end_ms)
    n = a = 0
    for m, k in trial.minutes(20_000):
        act = {i[2]: i for i in trial.incidents if i[0] <= m < i[1]}
        for _ in range(k):
            a += len(trial.request(m + trial.rng.randrange(MIN), act)[1])
            n += 1
    per_request = a / max(1, n)
    gen = Traffic(seed, end_ms)
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    con.execute("PRAGMA cache_size = -2000000")
    reqs, atts = [], []
    total_r = total_a = 0
    t_start = time.monotonic()

    def flush():
        nonlocal total_a, total_r, reqs, atts
        con.execute("BEGIN")
        con.executemany(INSERT_ATTEMPT, atts)
        con.executemany(INSERT_REQUEST, reqs)
        con.execute("COMMIT")
        if (total_a + len(atts)) // 500_000 > total_a // 500_000:
            el = time.monotonic() - t_start
            log(f"  {total_a + len(atts):,} attempts, {total_r + len(reqs):,} requests, {el:.0f} s")
        total_a += len(atts)
        total_r += len(reqs)
        atts, reqs = [], []

    for m, k in gen.minutes(target / per_request):
        if not k:
            continue
        act = {i[2]: i for i in gen.incidents if i[0] <= m < i[1]}
        for t0 in sorted(m + gen.rng.randrange(MIN) for _ in range(k)):
            r, rows = gen.request(t0, act)
            reqs.append(r)
            atts.extend(rows)
        if len(atts) >= 100_000:
            flush()
    flush()
    # usage_stats as the traffic leaves them: lifetime counters, last use, failures by reason.
    for pid, (ok, bad, last, last_ok, last_fail, counts) in gen.stats.items():
        con.execute("UPDATE usage_stats SET success_count = ?, failure_total = ?, last_used = ?, last_success_at = ?, "
                    "last_failure_at = ?, failure_counts = ?, error_count = ? WHERE profile_id = ?",
                    (ok, bad, last, last_ok, last_fail, json.dumps({k: min(v, 50) for k, v in sorted(counts.items())}),
                     gen.rng.choice([0, 0, 0, 1, 2]), pid))
    # Windows in force at the end (valid for the next six hours): a few cooling profiles, one out
    # of credit, one revoked, a model the provider does not serve.
    ids = [pid for v in gen.profiles.values() for pid in v]
    for pid in gen.rng.sample(ids, 6):
        until = end_ms + 6 * HOUR
        reason = gen.rng.choice(["rate_limit", "overloaded", "timeout"])
        model = gen.rng.choice([None, "gpt-4.1", "claude-sonnet-4"])
        con.execute("INSERT INTO profile_cooldowns (profile_id, model, cooldown_until, cooldown_reason, step, opened_at) "
                    "VALUES (?, ?, ?, ?, 2, ?)", (pid, model, until, reason, end_ms - MIN))
        con.execute("UPDATE usage_stats SET cooldown_until = ?, cooldown_reason = ?, cooldown_model = ?, "
                    "window_opened_at = ?, error_count = 2 WHERE profile_id = ?", (until, reason, model, end_ms - MIN, pid))
    con.execute("UPDATE usage_stats SET disabled_until = ?, disabled_reason = 'billing', billing_step = 2 "
                "WHERE profile_id = 'deepseek:key007'", (end_ms + DAY,))
    con.execute("UPDATE usage_stats SET disabled_reason = 'auth_permanent' WHERE profile_id = 'mistral:key013'")
    con.execute("INSERT INTO model_cooldowns (provider, model, cooldown_until, error_count, last_failure_at) "
                "VALUES ('openai', 'gpt-4-32k', ?, 3, ?), ('google', 'gemini-1.0-pro', ?, 1, ?)",
                (end_ms + 6 * HOUR, end_ms - HOUR, end_ms - 10 * DAY, end_ms - 10 * DAY - HOUR))
    # The hourly sums and minute counts rota's audit writer keeps beside the rows it inserts,
    # as migrations 0010_usage_hourly.sql, 0023_audit_minutely.sql and 0025_audit_hourly.sql
    # build them from rows already there (usage_profile_daily follows usage_hourly through the
    # triggers of 0026_usage_profile_daily.sql).
    for table, file in [("usage_hourly", "0010_usage_hourly.sql"), ("audit_minutely", "0023_audit_minutely.sql"),
                        ("audit_hourly", "0025_audit_hourly.sql")]:
        migration = (REPO / "migrations" / "sqlite" / file).read_text()
        con.execute(f"DELETE FROM {table}")
        con.executescript(migration[migration.index(f"INSERT INTO {table}"):])
    con.commit()
    con.execute("PRAGMA journal_mode = WAL")
    con.close()
    return {"attempts": total_a, "requests": total_r}


# -- rota ---------------------------------------------------------------------------------------


class Proc:
    """A child process; its stderr (and stdout unless piped) to log_path."""

    def __init__(self, args, log_path=os.devnull, pipe_stdout=False, **kw):
        self.log = open(log_path, "wb")
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE if pipe_stdout else self.log, stderr=self.log,
                                  text=True, **kw)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


def start_mock(bin_dir: Path) -> tuple[Proc, str]:
    """rota-mock on a port of its choosing; it prints its URL first."""
    m = Proc([str(bin_dir / "rota-mock")], pipe_stdout=True)
    url = m.p.stdout.readline().strip().rsplit(" ", 1)[-1]
    if not url.startswith("http://"):
        m.stop()
        raise RuntimeError("rota-mock did not start")
    return m, url


def serve(bin_dir: Path, db: Path, mock_url: str, work: Path, pg_url: str | None = None) -> tuple[Proc, str, float]:
    """rota serve on db (or on the PostgreSQL database pg_url); returns once /healthz answers,
    with the time that took."""
    conf = write_config(work, db, mock_url, pg_url)
    log_path = work / f"{db.stem}{'.pg' if pg_url else ''}.serve.log"
    addr = f"127.0.0.1:{bench.free_port()}"
    t0 = time.monotonic()
    p = Proc([str(bin_dir / "rota"), "--config", str(conf), "serve", "--listen", addr], log_path,
             env={**os.environ, **ENV}, cwd=work)
    while True:
        try:
            c = http.client.HTTPConnection(addr, timeout=2)
            c.request("GET", "/healthz")
            ok = c.getresponse().status == 200
            c.close()
            if ok:
                return p, addr, (time.monotonic() - t0) * 1000
        except OSError:
            pass
        if p.p.poll() is not None or time.monotonic() - t0 > 120:
            p.stop()
            raise RuntimeError(f"rota serve did not start; see {log_path}")
        time.sleep(0.005)


class Client:
    """One keep-alive connection; every answer must be 200."""

    def __init__(self, addr: str, headers: dict):
        self.headers = headers
        self.c = http.client.HTTPConnection(addr, timeout=120)

    def call(self, path: str, method="GET", body=None) -> tuple[bytes, http.client.HTTPResponse]:
        h = dict(self.headers)
        if body is not None:
            h["content-type"] = "application/json"
        try:
            self.c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
            r = self.c.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):
            self.c.close()  # the next call connects again
            raise
        if r.status != 200:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
        return data, r

    def items(self, path: str) -> int:
        """How many items (listings), profiles (usage) or attempts (usage series) the answer has."""
        j = json.loads(self.call(path)[0])
        if "items" in j:
            return len(j["items"])
        if "buckets" in j:
            return sum(sum(s["counts"]) for s in j["attempts"])
        return len(j.get("profiles", j))


class Psql:
    """One psql session on a PostgreSQL database: a query's round trip is timed without a
    connection's set-up (TLS included) in it, as sqlite3's are on an open connection."""

    END = "__audit_scale_end__"

    def __init__(self, url: str, log_path: Path):
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(["psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=0", url], text=True,
                                  bufsize=1, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)

    def _until(self, mark: str) -> list[str]:
        lines = []
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"psql ended (exit status {self.p.wait()}; see {self.log.name})")
            if line.startswith(mark):
                return lines + [line]
            lines.append(line)

    def lines(self, sql: str) -> list[str]:
        """The rows of sql, one line each (`|` between columns)."""
        self.p.stdin.write(sql.strip().rstrip(";") + f";\n\\echo {self.END} :ERROR\n")
        self.p.stdin.flush()
        *rows, end = self._until(self.END)
        if end.split()[-1] == "true":
            self.p.stdin.write(f"\\echo :LAST_ERROR_MESSAGE\n\\echo {self.END}\n")
            self.p.stdin.flush()
            raise RuntimeError(f"PostgreSQL: {''.join(self._until(self.END)[:-1]).strip()}")
        return rows

    def count(self, sql: str) -> int:
        return len(self.lines(sql))

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


def time_it(fn, runs: int, budget_s: float = 20.0, min_runs: int = 3):
    """Milliseconds of each of up to `runs` calls after a warm-up (at least min_runs, then
    within budget_s), and what the last call returned."""
    fn()
    times, rows = [], None
    t_end = time.monotonic() + budget_s
    for i in range(runs):
        t0 = time.perf_counter()
        rows = fn()
        times.append((time.perf_counter() - t0) * 1000)
        if i + 1 >= min_runs and time.monotonic() > t_end:
            break
    return times, rows


# -- timing -------------------------------------------------------------------------------------


# In docs/audit.md: a heading, a ```sql block, or an indented SELECT after a blank line.
AUDIT_MD = re.compile(r"^#+ ([^\n]*)|^```sql\n(.*?)\n```$|(?<=\n\n)(    SELECT.*?\n)(?!    )", re.M | re.S)

# docs/audit.md's whole-history analyses, by heading: each counts or lists over every request or
# attempt kept (no bound on time or on an id), so it reads them all (5 million attempts at full
# scale) and no index makes that fast; an operator runs them by hand, on a copy ("Long analyses"
# there). Timed, and reported apart: not held to the 100 ms target. The page's other queries are
# held to it: they read current state (usage_stats, profiles, the cooldowns and their views: 6, 8,
# 11, 13, 14), the daily roll-up (Retention's `usage_daily`) or one day (16: yesterday's cost).
ANALYSES = {
    "1. How many requests did each agent send, by answer status?",
    "2. Which profile served how many requests?",
    "3. What failed, why, and at which provider?",
    "4. Which requests were served by a fallback model?",
    "5. How busy was each profile per day?",
    "7. How many upstream calls does a request cost on average?",
    "9. Tokens used per provider",
    "10. Which profiles needed same-profile retries?",
    "12. The attempts of the requests that failed, step by step",
    "15. Which requests did rota answer with an error of its own, and what did it say?",
    "17. Which account carries the cost?",
}


def audit_md_queries() -> list[tuple[str, str]]:
    """(heading, SQL) of each query of docs/audit.md."""
    out, heading = [], ""
    for m in AUDIT_MD.finditer((REPO / "docs" / "audit.md").read_text()):
        if m[1] is not None:
            heading = m[1]
        else:
            out.append((heading, m[2] if m[2] is not None else re.sub("^    ", "", m[3], flags=re.M).rstrip()))
    return out


def sample_values(con: sqlite3.Connection, end_ms: int) -> dict:
    """Filter values taken from the data: the busiest and the quietest agent, a profile, a
    request id and keyset cursors far back."""
    agents = con.execute("SELECT agent, COUNT(*) n FROM requests WHERE started_at >= ? GROUP BY agent ORDER BY n DESC",
                         (end_ms - DAY,)).fetchall()
    deep_at = end_ms - 60 * DAY
    a = con.execute("SELECT started_at, seq, request_id FROM attempts WHERE started_at >= ? ORDER BY started_at LIMIT 1",
                    (deep_at,)).fetchone()
    r = con.execute("SELECT started_at, id FROM requests WHERE started_at >= ? ORDER BY started_at LIMIT 1",
                    (end_ms - 45 * DAY,)).fetchone()
    mid = con.execute("SELECT started_at, id FROM requests WHERE started_at >= ? ORDER BY started_at LIMIT 1",
                      (deep_at,)).fetchone()
    return {"busy_agent": agents[0][0], "quiet_agent": agents[-1][0], "profile": "anthropic:key017",
            "attempt_cursor": f"{a[0]}.{a[1]}.{a[2]}", "request_cursor": f"{mid[0]}.0.{mid[1]}",
            "request_id": r[1], "window": (end_ms - 45 * DAY, end_ms - 45 * DAY + HOUR)}


def listing_cases(v: dict, kind: str) -> list[tuple[str, dict]]:
    since, until = v["window"]
    return [
        ("first page", {}),
        ("first page, limit=1000", {"limit": "1000"}),
        (f"agent (busiest: {v['busy_agent']})", {"agent": v["busy_agent"]}),
        (f"agent (quietest: {v['quiet_agent']})", {"agent": v["quiet_agent"]}),
        (f"profile ({v['profile']})", {"profile": v["profile"]}),
        ("provider (mistral)", {"provider": "mistral"}),
        ("model (openai/gpt-4.1)", {"model": "openai/gpt-4.1"}),
        ("reason=rate_limit", {"reason": "rate_limit"}),
        ("reason=billing (rare)", {"reason": "billing"}),
        ("reason=wire_format (none)", {"reason": "wire_format"}),
        ("outcome=failure", {"outcome": "failure"}),
        ("outcome=skipped", {"outcome": "skipped"}),
        ("since+until (1 h, 45 days ago)", {"since": str(since), "until": str(until)}),
        ("request_id", {"request_id": v["request_id"]}),
        ("provider=anthropic & outcome=failure", {"provider": "anthropic", "outcome": "failure"}),
        ("deep keyset page (cursor 60 days back)", {"cursor": v["attempt_cursor" if kind == "attempts"
                                                                else "request_cursor"]}),
    ]


def console_window() -> tuple[int, int]:
    """The overview's default window and step in seconds (web/console.html's `overview-window`:
    the option selected, else the first)."""
    html = (REPO / "web" / "console.html").read_text()
    select = re.search(r'<select id="overview-window">(.*?)</select>', html, re.S)
    options = re.findall(r'<option value="(\d+):(\d+)"( selected)?', select[1]) if select else []
    if not options:
        log("web/console.html has no overview-window options: taking the last hour per minute")
        return 3600, 60
    span, step, _ = next((o for o in options if o[2]), options[0])
    return int(span), int(step)


def series_cases(end_ms: int) -> list[tuple[str, dict]]:
    """/api/v1/usage/series: a day per minute (1,440 buckets, the most it gives) and per hour, 30
    days per hour, and the console's default window; each ending at the data's end."""
    span, step = console_window()
    cases = [("1 day, step=60", DAY, 60), ("1 day, step=900 (the console's last day)", DAY, 900),
             ("1 day, step=3600", DAY, 3600), ("30 days, step=3600", 30 * DAY, 3600),
             (f"the console's default: the last {span // 60} minutes, step={step}", span * 1000, step)]
    out = []
    for what, length, step in cases:
        ms = step * 1000
        # rota rounds since down and until up to the step.
        buckets = (-(-end_ms // ms) * ms - (end_ms - length) // ms * ms) // ms
        out.append((f"{what} ({buckets:,} buckets)", {"since": end_ms - length, "until": end_ms, "step": step}))
    return out


# The console's assets (src/web.rs), as a browser fetches them on the first load.
CONSOLE_ASSETS = ["/ui/vendor/uPlot.min.css", "/ui/style.css", "/ui/vendor/uPlot.iife.min.js", "/ui/app.js",
                  *(f"/ui/js/{f.name}" for f in sorted((REPO / "web" / "js").glob("*.js")))]


def run_timings(addr: str, admin_key: str, v: dict, end_ms: int, runs: int, query) -> list:
    """(what, times in ms, rows, SQL of a docs/audit.md query else None, whether an analysis,
    the error else None) of everything timed; query(sql) runs a docs/audit.md query and returns
    its number of rows."""
    results = []

    def record(what, fn, sql=None, analysis=False):
        try:
            times, rows = time_it(fn, runs)
        except (RuntimeError, OSError, ValueError, KeyError, http.client.HTTPException, sqlite3.Error) as e:
            results.append((what, [], None, sql, analysis, f"{type(e).__name__}: {e}"))
            log(f"  {what}: FAILED: {e}")
            return
        results.append((what, times, rows, sql, analysis, None))
        log(f"  {what}: p95 {bench.pct(times, 95):.1f} ms")

    api = Client(addr, {"authorization": f"Bearer {admin_key}"})
    for kind in ("attempts", "requests"):
        for what, q in listing_cases(v, kind):
            path = f"/api/v1/{kind}" + (f"?{urlencode(q)}" if q else "")
            record(f"GET /api/v1/{kind}: {what}", lambda: api.items(path))
    for what, since in [("1 day", end_ms - DAY), ("30 days", end_ms - 30 * DAY)]:
        path = f"/api/v1/usage?since={since}&until={end_ms + HOUR}"
        record(f"GET /api/v1/usage: {what}", lambda: api.items(path))
    for what, q in series_cases(end_ms):
        path = f"/api/v1/usage/series?{urlencode(q)}"
        record(f"GET /api/v1/usage/series: {what}", lambda: api.items(path))
    # The console's first load: the page, its styles and scripts, the session, then the overview
    # (its charts' series over the default window, the providers and the profiles).
    web = Client(addr, {})
    web.headers["cookie"] = web.call("/api/v1/session", "POST", {"key": admin_key})[1].getheader("set-cookie").split(";")[0]
    span, step = console_window()
    overview = f"/api/v1/usage/series?{urlencode({'since': end_ms - span * 1000, 'until': end_ms, 'step': step})}"
    pages = ["/ui/", *CONSOLE_ASSETS, "/api/v1/session", overview, "/api/v1/providers", "/api/v1/profiles"]
    record(f"console first load (/ui/, {len(CONSOLE_ASSETS)} styles and scripts, session, the overview: usage/series, "
           "providers, profiles; one after the other)",
           lambda: f"{sum(len(web.call(p)[0]) for p in pages) // 1024} KB")

    def requests_tab():
        web.call("/api/v1/agents")  # its filters' choices
        return web.items("/api/v1/requests?limit=50")

    record("console requests tab (GET /api/v1/agents, then /api/v1/requests?limit=50)", requests_tab)
    # docs/audit.md, on the database rota serves.
    for heading, sql in audit_md_queries():
        record(f"docs/audit.md {heading}", lambda: query(sql), sql, heading in ANALYSES)
    return results


def cell(times, p) -> str:
    return f"{bench.pct(times, p):.1f}" if times else "error"


def render(results) -> str:
    """The table of what is held to the target, then the analyses'."""
    out = ["| what | runs | p50 ms | p95 ms | rows | met (p95 ≤ 100 ms) |", "|---|---:|---:|---:|---:|---|"]
    for what, times, rows, _, analysis, error in results:
        if not analysis:
            met = "**error**" if error else "yes" if bench.pct(times, 95) <= TARGET_MS else "**no**"
            out.append(f"| {what} | {len(times)} | {cell(times, 50)} | {cell(times, 95)} | {'' if error else rows} | "
                       f"{met} |")
    analyses = [r for r in results if r[4]]
    if analyses:
        out += ["", "Analyses (whole history; timed, not held to 100 ms):", "",
                "| what | runs | p50 ms | p95 ms | rows |", "|---|---:|---:|---:|---:|"]
        for what, times, rows, _, _, error in analyses:
            out.append(f"| {what} | {len(times)} | {cell(times, 50)} | {cell(times, 95)} | "
                       f"{'**error**' if error else rows} |")
    return "\n".join(out)


def missed_queries(results):
    """(what, p95, SQL) of the docs/audit.md queries held to the target that missed it."""
    return [(what, bench.pct(times, 95), sql) for what, times, _, sql, analysis, error in results
            if sql is not None and not analysis and not error and bench.pct(times, 95) > TARGET_MS]


def plans(results, db: Path) -> list[str]:
    """EXPLAIN QUERY PLAN of the docs/audit.md queries held to the target that missed it, as a tree."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    out = []
    for what, p95, sql in missed_queries(results):
        depth, lines = {0: -1}, []
        for node, parent, _, detail in con.execute("EXPLAIN QUERY PLAN " + sql):
            depth[node] = depth[parent] + 1
            lines.append("  " * depth[node] + detail)
        out.append(f"{what} (p95 {p95:.0f} ms):\n```\n" + "\n".join(lines) + "\n```")
    con.close()
    return out


def pg_plans(results, psql: Psql) -> list[str]:
    """EXPLAIN of the docs/audit.md queries held to the target that missed it on PostgreSQL."""
    return [f"{what} (p95 {p95:.0f} ms):\n```\n" + "".join(psql.lines("EXPLAIN " + sql)).rstrip() + "\n```"
            for what, p95, sql in missed_queries(results)]


def errors_of(results) -> list[str]:
    return [f"- {what}: {error}" for what, _, _, _, _, error in results if error]


def differences(sqlite_results, pg_results) -> list[str]:
    """The answers whose row counts differ between the engines."""
    pg = {r[0]: r[2] for r in pg_results if not r[5]}
    return [f"- {what}: SQLite {rows}, PostgreSQL {pg[what]}" for what, _, rows, _, _, error in sqlite_results
            if not error and what in pg and pg[what] != rows]


# -- PostgreSQL ---------------------------------------------------------------------------------


def database_url(server_url: str, name: str) -> str:
    """server_url with database `name` instead of its own (its query, e.g. sslrootcert, kept)."""
    u = urlsplit(server_url)
    return urlunsplit(u._replace(path=f"/{name}"))


def psql_admin(server_url: str, sql: str) -> None:
    r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql, server_url], text=True,
                       capture_output=True)
    if r.returncode:
        raise RuntimeError(f"psql {sql!r}: {r.stderr.strip()}")


def on_postgres(a: argparse.Namespace, bin_dir: Path, db: Path, meta: dict, values: dict, mock_url: str,
                work: Path) -> dict:
    """A fresh database on the server of --postgres, the SQLite file copied into it with rota's
    `migrate --from`, ANALYZE, then the same timings with rota serving it."""
    name = f"rota_audit_{os.getpid()}"
    url = database_url(a.postgres, name)
    psql_admin(a.postgres, f"CREATE DATABASE {name}")
    log(f"PostgreSQL: database {name}; copying {db.name} into it (rota migrate --from)")
    try:
        t0 = time.monotonic()
        copied = cli(bin_dir, write_config(work, db, "http://127.0.0.1:9", url), "migrate", "--from", f"sqlite://{db}")
        copy_s = time.monotonic() - t0
        log(f"  copied in {copy_s:.1f} s")
        psql = Psql(url, work / f"{db.stem}.psql.log")
        try:
            t0 = time.monotonic()
            psql.lines("ANALYZE")
            analyze_s = time.monotonic() - t0
            version = psql.lines("SHOW server_version")[0].strip()
            size = int(psql.lines("SELECT pg_database_size(current_database())")[0])
            rota, addr, ready_ms = serve(bin_dir, db, mock_url, work, url)
            try:
                results = run_timings(addr, meta["admin_key"], values, meta["end_ms"], a.runs, psql.count)
            finally:
                rota.stop()
            missed = pg_plans(results, psql)
        finally:
            psql.close()
    finally:
        if a.keep:
            log(f"PostgreSQL database kept: {url}")
        else:
            psql_admin(a.postgres, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    copied_line = next((line for line in copied.splitlines() if line.startswith("copied from")), copied.strip())
    sslmode = parse_qs(urlsplit(url).query).get("sslmode",
                                                 ["not given (rota: `prefer` on this machine, else `require`)"])[0]
    return {"results": results, "copy_s": copy_s, "analyze_s": analyze_s, "version": version, "size": size,
            "ready_ms": ready_ms, "copied": copied_line, "plans": missed, "sslmode": sslmode}


# -- throughput ---------------------------------------------------------------------------------


def throughput(bin_dir: Path, big: Path, meta: dict, n: int, work: Path) -> tuple[str, int]:
    """The throughput table and the number of answers that were not 200."""
    small = work / "audit-empty.db"
    small_meta = make_base(bin_dir, small, work)
    body = {**bench.CHAT, "model": "openai/gpt-4.1"}
    mock, mock_url = start_mock(bin_dir)
    rows = []
    try:
        for rnd in range(2):
            for label, db, key in [("empty audit trail", small, small_meta["agent_key"]),
                                   (f"{meta['attempts']:,} attempts", big, meta["agent_key"])]:
                p, addr, ready = serve(bin_dir, db, mock_url, work)
                try:
                    url = f"http://{addr}/v1/chat/completions"
                    auth = {"Authorization": f"Bearer {key}"}
                    bench.hey(url, body, 500, 8, auth)  # warm-up
                    r = bench.hey(url, body, n, 32, auth)
                    rows.append((label, rnd + 1, ready, r.rps, r.p50_ms, r.p99_ms, r.errors))
                    log(f"  throughput {label} #{rnd + 1}: {r.rps:,.0f} req/s, p50 {r.p50_ms:.2f} ms, {r.errors} errors")
                finally:
                    p.stop()
    finally:
        mock.stop()
    out = [f"Chat throughput through rota (openai/gpt-4.1 via rota-mock, {n:,} requests at 32 concurrent after 500 "
           "warm-up; 2 cores shared with the load generator):", "",
           "| database | round | start-up to ready ms | req/s | p50 ms | p99 ms | errors |", "|---|---:|---:|---:|---:|---:|---:|"]
    for label, rnd, ready, rps, p50, p99, errors in rows:
        out.append(f"| {label} | {rnd} | {ready:.0f} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {errors} |")
    return "\n".join(out), sum(r[-1] for r in rows)


# -- main ---------------------------------------------------------------------------------------


def run(a: argparse.Namespace, work: Path) -> int:
    bin_dir = a.bin.resolve()
    db = (a.db or work / f"audit-{a.attempts}.db").resolve()
    db.parent.mkdir(parents=True, exist_ok=True)
    meta_path = Path(f"{db}.json")
    if meta_path.exists() and db.exists():
        meta = json.loads(meta_path.read_text())
        log(f"reusing {db} ({meta['attempts']:,} attempts, made in {meta['generation_s']:.0f} s)")
    elif db.exists():
        raise RuntimeError(f"{db} exists but this script did not fill it (no {meta_path}); remove it or pick another")
    else:
        t0 = time.monotonic()
        end_ms = int(time.time() * 1000) // MIN * MIN
        log(f"making {db}: schema, 200 profiles, 20 agents (rota CLI)")
        meta = make_base(bin_dir, db, work)
        setup_s = time.monotonic() - t0
        log(f"filling {a.attempts:,} attempts over {DAYS} days")
        meta.update(fill(db, a.attempts, a.seed, end_ms))
        meta.update({"end_ms": end_ms, "seed": a.seed, "setup_s": setup_s, "generation_s": time.monotonic() - t0})
        meta_path.write_text(json.dumps(meta, indent=1))
        log(f"made in {meta['generation_s']:.1f} s")

    ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    pg = None
    try:
        values = sample_values(ro, meta["end_ms"])
        mock, mock_url = start_mock(bin_dir)
        try:
            rota, addr, ready_ms = serve(bin_dir, db, mock_url, work)
            try:
                results = run_timings(addr, meta["admin_key"], values, meta["end_ms"], a.runs,
                                      lambda sql: len(ro.execute(sql).fetchall()))
            finally:
                rota.stop()
            if a.postgres:
                pg = on_postgres(a, bin_dir, db, meta, values, mock_url, work)
        finally:
            mock.stop()
    finally:
        ro.close()
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        stats = con.execute("SELECT (SELECT COUNT(*) FROM attempts), (SELECT COUNT(*) FROM requests), "
                            "(SELECT round(100.0 * SUM(attempts = 1 AND status = 200) / COUNT(*), 1) FROM requests), "
                            "(SELECT round(100.0 * SUM(status >= 400) / COUNT(*), 1) FROM requests), "
                            "(SELECT round(100.0 * SUM(served_model IS NOT NULL AND served_model <> requested_model "
                            " AND requested_model <> 'smart') / COUNT(*), 1) FROM requests)").fetchone()
    size = db.stat().st_size  # the WAL is empty after the checkpoint
    n_att, n_req, first_try, failed, other_model = stats
    report = [
        f"# rota audit at scale: {n_att:,} attempts, {n_req:,} requests over {DAYS} days",
        "",
        f"200 profiles (5 providers), 20 agents; seed {meta['seed']}; {n_att / n_req:.2f} attempts per request; "
        f"{first_try}% of requests served at the first try, {failed}% failed, {other_model}% served by another model "
        f"than the one asked for.",
        f"Generation: {meta['generation_s']:.1f} s (CLI setup {meta['setup_s']:.1f} s). Database: {size / 1e6:,.0f} MB, "
        f"{size / n_att:,.0f} MB per million attempts ({size / n_req:,.0f} MB per million requests). "
        f"rota serve start-up to ready on it: {ready_ms:.0f} ms.",
        f"Filter values: {json.dumps({k: v for k, v in values.items() if k != 'window'})}",
        "Rows: a listing's items, `/usage`'s profiles, the attempts `/usage/series` counts, a query's rows.",
        "",
        "## SQLite",
        "",
        render(results),
    ]
    stale = sorted(ANALYSES - {heading for heading, _ in audit_md_queries()})
    if stale:
        report += ["", f"Not in docs/audit.md any more (ANALYSES in {Path(__file__).name} is stale): "
                   + "; ".join(stale)]
    missed = plans(results, db)
    if missed:
        report += ["", f"Query plans of the docs/audit.md queries held to 100 ms that missed (SQLite "
                   f"{sqlite3.sqlite_version} here; rota bundles its own):", "", "\n\n".join(missed)]
    failures = errors_of(results)
    if failures:
        report += ["", "Errors:", "", *failures]
    if pg:
        report += [
            "", f"## PostgreSQL {pg['version']}", "",
            f"Copied from the SQLite file by `rota migrate --from` in {pg['copy_s']:.1f} s ({pg['copied']}); "
            f"ANALYZE {pg['analyze_s']:.1f} s. Database: {pg['size'] / 1e6:,.0f} MB, "
            f"{pg['size'] / n_att:,.0f} MB per million attempts. rota serve start-up to ready on it: "
            f"{pg['ready_ms']:.0f} ms. sslmode: {pg['sslmode']}. The docs/audit.md queries through one psql "
            "session.",
            "", render(pg["results"])]
        if pg["plans"]:
            report += ["", "EXPLAIN of the docs/audit.md queries held to 100 ms that missed:", "",
                       "\n\n".join(pg["plans"])]
        failures += errors_of(pg["results"])
        if errors_of(pg["results"]):
            report += ["", "Errors:", "", *errors_of(pg["results"])]
        diff = differences(results, pg["results"])
        report += ["", "Answers whose rows differ between SQLite and PostgreSQL: " + ("none" if not diff else ""),
                   *diff]
    bad_chats = 0
    if a.throughput:
        table, bad_chats = throughput(bin_dir, db, meta, a.throughput, work)
        report += ["", table]
    text = "\n".join(report)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    if bad_chats:
        log(f"{bad_chats} chats were not answered 200")
    if failures:
        log(f"{len(failures)} calls or queries failed:\n" + "\n".join(failures))
    return 1 if bad_chats or failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=5_000_000)
    ap.add_argument("--db", type=Path, help="database to fill, or to reuse when this script filled it")
    ap.add_argument("--workdir", type=Path, help="configs, logs, the database without --db (default: a fresh "
                    "temporary folder, removed at the end unless --db or --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work folder (and the PostgreSQL database)")
    ap.add_argument("--bin", type=Path, default=REPO / "target" / "release", help="where rota and rota-mock are")
    ap.add_argument("--smoke", action="store_true", help="20,000 attempts, 3 runs each: seconds")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--throughput", type=int, default=4000, help="chats per hey run (0: skip)")
    ap.add_argument("--out", type=Path, help="also write the report (markdown) here")
    ap.add_argument("--postgres", metavar="URL", help="also copy the database into a fresh one on this PostgreSQL "
                    "server (URL of its maintenance database) and time the same there")
    a = ap.parse_args()
    if a.smoke:
        a.attempts, a.runs, a.throughput = 20_000, min(a.runs, 3), min(a.throughput, 400)
    missing = [str(a.bin / b) for b in ("rota", "rota-mock") if not (a.bin / b).is_file()]
    if missing:
        log(f"not found: {', '.join(missing)} (see --bin)")
        return 1
    if a.postgres and not shutil.which("psql"):
        log("psql is not on PATH: --postgres needs it")
        return 1
    if a.throughput and not shutil.which("hey"):
        log("hey is not on PATH: install it or pass --throughput 0")
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop rota and rota-mock on the way out
    temporary = a.workdir is None
    work = Path(tempfile.mkdtemp(prefix="audit-scale-")) if temporary else a.workdir
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        status = run(a, work)
    except (RuntimeError, OSError, sqlite3.Error, http.client.HTTPException, subprocess.CalledProcessError) as e:
        log(f"failed: {e}\n(work folder kept: {work})")
        return 1
    if temporary and not a.db and not a.keep and status == 0:
        shutil.rmtree(work)
    else:
        log(f"work folder kept: {work}")
    return status


if __name__ == "__main__":
    sys.exit(main())
