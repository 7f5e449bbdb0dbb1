"""The README's agent lines, tried as written against `rota demo` (README.md, "Agents against the demo").

Each shell block of that section runs with bash, unchanged but for the demo's port (8080 in the
README, a free one here). `claude`, `codex` and `python3` are found on PATH as a user would have
them: small wrappers around the pinned npm packages in tests/agents/node_modules and the peers'
venv. Every process runs in its own process group, bounded in time, and is killed with it.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, clean_env, free_port, rota_bin, stop

AGENTS = REPO / "tests" / "agents" / "node_modules"
RUN_S = 120


def readme_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("### Agents against the demo", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def run(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=RUN_S)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def demo():
    if not (AGENTS / "@anthropic-ai" / "claude-code").is_dir() or not (AGENTS / "@openai" / "codex").is_dir():
        pytest.fail(f"the agents are not installed in {AGENTS}: scripts/test.sh installs them (npm ci in tests/agents)")
    with tempfile.TemporaryDirectory(prefix="rota-readme-") as tmp:
        dir = Path(tmp)
        port = free_port()
        log = open(dir / "demo.log", "w")
        proc = subprocess.Popen(
            [str(rota_bin()), "demo", "--listen", f"127.0.0.1:{port}"],
            cwd=dir,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        try:
            key = None
            for line in proc.stdout:
                if line.startswith("admin key: "):
                    key = line.split(": ", 1)[1].strip()
                if line.startswith("  rota --config"):
                    break
            assert key and key.startswith("rk_"), (dir / "demo.log").read_text()
            yield dir, port, key
        finally:
            stop(proc)
            log.close()


def environment(dir: Path, key: str) -> dict[str, str]:
    """What the README assumes a user has: the agents and python3 on PATH, a home of its own."""
    bin = dir / "bin"
    bin.mkdir()
    wrappers = {
        "claude": f'exec node "{AGENTS}/@anthropic-ai/claude-code/cli-wrapper.cjs" "$@"',
        "codex": f'exec node "{AGENTS}/@openai/codex/bin/codex.js" "$@"',
        "python3": f'exec "{sys.executable}" "$@"',
    }
    for name, line in wrappers.items():
        (bin / name).write_text(f"#!/bin/sh\n{line}\n")
        (bin / name).chmod(0o755)
    home = dir / "home"
    home.mkdir()
    return clean_env(
        PATH=f"{bin}:{os.environ['PATH']}",
        HOME=str(home),
        ROTA_DEMO_KEY=key,
        DISABLE_TELEMETRY="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        NO_PROXY="127.0.0.1,localhost",
    )


def test_the_readme_agent_lines_work_as_written_against_the_demo(demo):
    dir, port, key = demo
    blocks = readme_blocks()
    assert len(blocks) == 3, blocks
    env = environment(dir, key)
    results = []
    for block in blocks:
        script = block.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        got = run(script, env, REPO)
        assert got.returncode == 0, f"{block}\nstdout: {got.stdout}\nstderr: {got.stderr[-2000:]}"
        assert key not in got.stdout + got.stderr
        results.append(got.stdout)
    claude, codex, sdk = results
    # Claude Code on the chat-only model: it read the README with its Read tool, and the
    # simulated model quoted the last line it read.
    last = [l for l in (REPO / "README.md").read_text().splitlines() if l.strip()][-1].strip()
    assert claude.strip().startswith("The tool said:") and last in claude, claude
    # Codex (Responses) and the SDK on the Anthropic model, through chat.
    assert "Hello from the simulated sim-sonnet." in codex, codex
    assert sdk.strip() == "Hello from the simulated sim-sonnet.", sdk
    with sqlite3.connect(dir / "rota-demo.db") as db:
        rows = db.execute(
            "SELECT r.api, a.provider, a.outcome FROM attempts a JOIN requests r ON r.id = a.request_id"
            " WHERE a.outcome = 'success' ORDER BY a.started_at"
        ).fetchall()
    apis = {(api, provider) for api, provider, _ in rows}
    assert ("messages", "beta") in apis and ("responses", "claude") in apis, rows
    assert sum(1 for api, provider, _ in rows if (api, provider) == ("messages", "beta")) == 2, "a tool round trip"


def test_an_agents_setup_lines_work_as_printed(demo):
    """`rota agents setup` and the console's Setup (GET /api/v1/agents/{name}/setup) give the
    same lines; each block, run as printed with the agent's key in $ROTA_AGENT_KEY, reaches the
    agent's model through rota as that agent: Claude Code, Codex, the OpenAI and Anthropic SDKs."""
    import json
    import urllib.request

    dir, port, admin = demo
    base = f"http://127.0.0.1:{port}"
    config = next(dir.glob("rota-demo*.toml"))
    created = subprocess.run(
        [str(rota_bin()), "--config", str(config), "agents", "create", "coder", "--models", "claude/sim-sonnet"],
        cwd=dir, env=clean_env(), capture_output=True, text=True, check=True,
    )
    key = created.stdout.strip().splitlines()[-1]
    printed = subprocess.run(
        [str(rota_bin()), "--config", str(config), "agents", "setup", "coder", "--base", base],
        cwd=dir, env=clean_env(), capture_output=True, text=True, check=True,
    ).stdout
    request = urllib.request.Request(f"{base}/api/v1/agents/coder/setup?base={base}", headers={"authorization": f"Bearer {admin}"})
    setup = json.load(urllib.request.urlopen(request))
    assert setup["model"] == "claude/sim-sonnet" and setup["base"] == base, setup
    blocks = {c["client"]: c["text"] for c in setup["clients"]}
    assert sorted(blocks) == ["anthropic-sdk", "claude-code", "codex", "openai-sdk"], blocks
    for text in blocks.values():
        assert text in printed, (text, printed)
    assert key not in printed + json.dumps(setup), "the key is never printed again"
    env = environment(dir, admin)
    env["ROTA_AGENT_KEY"] = key
    codex_home = dir / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(blocks["codex"] + "\n")
    scripts = {
        "claude-code": blocks["claude-code"] + ' -p "Say hi"',
        "codex": f'CODEX_HOME="{codex_home}" codex exec --skip-git-repo-check "Say hi"',
        "openai-sdk": blocks["openai-sdk"],
        "anthropic-sdk": blocks["anthropic-sdk"],
    }
    for client, script in scripts.items():
        got = run(script, env, REPO)
        assert got.returncode == 0, f"{client}: {script}\nstdout: {got.stdout}\nstderr: {got.stderr[-2000:]}"
        assert "Hello from the simulated sim-sonnet." in got.stdout, (client, got.stdout)
    with sqlite3.connect(dir / "rota-demo.db") as db:
        served = db.execute(
            "SELECT DISTINCT r.api FROM requests r WHERE r.agent = 'coder' AND r.status = 200 AND r.served_model = 'claude/sim-sonnet'"
        ).fetchall()
    assert {api for (api,) in served} >= {"messages", "responses"}, served
