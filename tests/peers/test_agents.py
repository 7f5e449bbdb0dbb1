"""The agents users run, as acceptance clients: Claude Code, the Codex CLI, the OpenAI Agents SDK
and the official `openai` SDK's Responses API, against a real `rota serve`, whose upstream is the
scripted agent_upstream.py.

    claude -p / codex exec / agents.Runner  -->  rota serve  -->  agent_upstream (3 wire formats)

Each test writes a file holding a word only that file holds, asks the agent to read it, and
checks that the agent ran its own tool (Claude Code's Read, Codex's exec_command, an SDK function
tool) and answered with the word, that rota's audit rows are exactly the expected attempts, and
that none of rota's secrets reached what the agent printed or kept.

The agents come from npm (tests/agents, installed by scripts/test.sh) and the Agents SDK from
PyPI (requirements.txt). Agents run in their own process group, bounded in time, and the group
is killed afterwards: Claude Code retries failed calls for minutes, Codex reconnects 5 times.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from agent_upstream import QUOTE, REPLY, AgentUpstream, Seen
from conftest import REPO, Rota, clean_env, create_agent, rota, rota_bin, start_rota, stop_rota, tail

AGENTS = REPO / "tests" / "agents" / "node_modules"
CLAUDE = AGENTS / "@anthropic-ai" / "claude-code" / "cli-wrapper.cjs"
CODEX = AGENTS / "@openai" / "codex" / "bin" / "codex.js"
AGENT_TIMEOUT_S = 45  # one agent run; an instant upstream answers each turn in milliseconds
KILL_GRACE_S = 5

ANTHROPIC_MODEL = "claude-sonnet-4-5"
OPENAI_MODEL = "gpt-4.1"
# The providers a test may configure: name -> (api, the flavor of upstream its base_url names).
PROVIDERS = {
    "anth": ("anthropic", "anthropic"),
    "oai": ("openai", "openai"),
    "chat": ("openai-chat", "chat"),
    "resp": ("openai-responses", "responses"),
}
MODELS = {"anth": ANTHROPIC_MODEL, "oai": OPENAI_MODEL, "chat": OPENAI_MODEL, "resp": OPENAI_MODEL}
WORD = "PERIWINKLE-7731"  # the file's content: in no prompt, no tool schema, nothing else the agents see
FILE_NAME = "notes.txt"


def upstream_key(profile: str) -> str:
    provider, name = profile.split(":")
    return f"sk-upstream-{provider}-{name}-5f1c0a"


def model_of(provider: str) -> str:
    return f"{provider}/{MODELS[provider]}"


# -- rota in front of the scripted upstream ------------------------------------------------------


@dataclass
class AgentGateway(Rota):
    upstream: AgentUpstream = field(kw_only=True)
    profiles: list[str] = field(kw_only=True)

    def secrets(self) -> list[str]:
        """What must never reach an agent: the upstream keys rota holds and its master key."""
        found = [upstream_key(p) for p in self.profiles]
        key_file = self.dir / "rota.key"
        if key_file.exists():
            found.append(key_file.read_text().strip())
        return found

    def profile_of(self, key: str | None) -> str:
        (profile,) = [p for p in self.profiles if upstream_key(p) == key]
        return profile

    def audit_rows(self, deadline_s: float = 10.0) -> list[tuple[tuple, list[tuple]]]:
        """Every request rota audited, oldest first: (api, requested model, status), with its
        attempts (seq, kind, provider, model, profile, http status, outcome, reason), once the
        audit writer has stored as many attempts as the upstream received calls."""
        calls = len(self.upstream.requests())
        deadline = time.monotonic() + deadline_s
        while True:
            reqs = self.query("SELECT * FROM requests ORDER BY started_at, id")
            atts = self.query("SELECT * FROM attempts ORDER BY started_at, seq")
            whole = sum(r["attempts"] for r in reqs) == len(atts)
            if whole and len([a for a in atts if a["kind"] != "skipped"]) >= calls:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"audit not settled: {calls} upstream calls, requests "
                                     f"{[dict(r) for r in reqs]}, attempts {[dict(a) for a in atts]}")
            time.sleep(0.05)
        out = []
        for r in reqs:
            mine = sorted((a for a in atts if a["request_id"] == r["id"]), key=lambda a: a["seq"])
            out.append(((r["api"], r["requested_model"], r["status"]),
                        [(a["seq"], a["kind"], a["provider"], a["model"], a["profile_id"], a["http_status"],
                          a["outcome"], a["reason"]) for a in mine]))
        return out


def served(seq: int, kind: str, profile: str) -> tuple:
    provider = profile.split(":")[0]
    return (seq, kind, provider, MODELS[provider], profile, 200, "success", None)


def skipped(seq: int, profile: str) -> tuple:
    provider = profile.split(":")[0]
    return (seq, "skipped", provider, MODELS[provider], None, None, "skipped", "rate_limit")


def limited(seq: int, kind: str, profile: str) -> tuple:
    provider = profile.split(":")[0]
    return (seq, kind, provider, MODELS[provider], profile, 429, "failure", "rate_limit")


def config(port: int, providers: list[str], order: dict[str, list[str]], extra: str) -> str:
    out = []
    for name in providers:
        api, flavor = PROVIDERS[name]
        base = f"http://127.0.0.1:{port}/{flavor}" + ("" if api == "anthropic" else "/v1")
        out.append(f'[providers.{name}]\napi = "{api}"\nbase_url = "{base}"\n')
    if order:
        out.append("[auth.order]\n" + "".join(f"{p} = {json.dumps(ids)}\n" for p, ids in order.items()))
    out.append('[timeouts]\nconnect = "2s"\nfirst_byte = "10s"\nidle = "10s"\ntotal = "30s"\n')
    out.append(extra)
    return "\n".join(out)


@pytest.fixture
def agent_gateway(_bounded_in_time) -> Iterator[Callable[..., AgentGateway]]:
    """Starts an upstream and `rota serve` (own temp dir, database, agent `agents`) on demand:
    `agent_gateway(providers, profiles=("a",), ordered=True, mode="whole", extra="")`."""
    rota_bin()
    missing = [str(p) for p in (CLAUDE, CODEX) if not p.is_file()]
    if missing:
        pytest.fail(f"agents not installed ({', '.join(missing)}): run scripts/test.sh, or "
                    "`cd tests/agents && npm ci`", pytrace=False)
    started: list[tuple[tempfile.TemporaryDirectory, AgentUpstream, Any, Path]] = []

    def start(providers: list[str], profiles: tuple[str, ...] = ("a",), ordered: bool = True, mode: str = "whole",
              extra: str = "") -> AgentGateway:
        tmp = tempfile.TemporaryDirectory(prefix="rota-agents-")
        dir = Path(tmp.name)
        upstream = AgentUpstream(mode)
        stderr = dir / "rota.stderr"
        started.append((tmp, upstream, None, stderr))
        ids = [f"{p}:{n}" for p in providers for n in profiles]
        order = {p: [f"{p}:{n}" for n in profiles] for p in providers} if ordered else {}
        (dir / "rota.toml").write_text(config(upstream.port, providers, order, extra))
        for pid in ids:
            provider, name = pid.split(":")
            rota(dir, "profiles", "add", provider, "--name", name, stdin=upstream_key(pid) + "\n")
        agent_key = create_agent(dir, "agents")
        proc, addr = start_rota(dir, stderr)
        started[-1] = (tmp, upstream, proc, stderr)
        return AgentGateway(addr, agent_key, dir, stderr, proc, upstream=upstream, profiles=ids)

    try:
        yield start
    finally:
        dump = os.environ.get("AGENTS_DUMP")  # a folder: what the upstream received, for debugging
        for i, (tmp, upstream, proc, stderr) in enumerate(started):
            stop_rota(proc)
            upstream.close()
            if dump:
                Path(dump).mkdir(parents=True, exist_ok=True)
                seen = [{"path": s.path, "query": s.query, "headers": s.headers, "body": s.body, "status": s.status,
                         "answer": s.answer} for s in upstream.requests()]
                (Path(dump) / f"{os.environ.get('PYTEST_CURRENT_TEST', 'test').split(' ')[0].split('::')[-1]}-{i}.json"
                 ).write_text(json.dumps(seen, indent=1))
            print(f"--- rota stderr (ROTA_LOG=warn) ---\n{tail(stderr)}")
            tmp.cleanup()


# -- running an agent ----------------------------------------------------------------------------


@dataclass
class Run:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    home: Path

    def __str__(self) -> str:
        return (f"{' '.join(self.args[:4])} … exited {self.returncode}\n--- stdout ---\n{self.stdout[-4000:]}\n"
                f"--- stderr ---\n{self.stderr[-4000:]}")


def agent_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith(("CLAUDE", "CODEX", "XDG_"))}
    env.update(HOME=str(home), NO_COLOR="1", TERM="dumb", **extra)
    return env


def run_agent(args: list[str], env: dict[str, str], cwd: Path, home: Path, timeout: float = AGENT_TIMEOUT_S) -> Run:
    """Runs an agent in its own process group; the whole group is killed afterwards, whatever happened."""
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=KILL_GRACE_S)
        raise AssertionError(f"{args[1]} did not finish within {timeout}s\n{Run(args, -9, out, err, home)}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what it left behind (tool subprocesses, helpers)
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=KILL_GRACE_S)
    return Run(args, proc.returncode, out, err, home)


def assert_no_secrets(gw: AgentGateway, run: Run) -> None:
    """None of rota's secrets in what the agent printed or wrote under its HOME (transcripts,
    session files, logs)."""
    texts = {"stdout": run.stdout, "stderr": run.stderr}
    for path in run.home.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            texts[str(path)] = path.read_bytes().decode("utf-8", "replace")
    for secret in gw.secrets():
        leaked = [where for where, text in texts.items() if secret in text]
        assert not leaked, f"a secret of rota's reached the agent: {leaked}"


def assert_no_secret_in(gw: AgentGateway, text: str) -> None:
    assert not [s for s in gw.secrets() if s in text], "a secret of rota's reached the client"


def workdir(base: Path) -> Path:
    """A temp project folder holding the file the prompts ask about."""
    cwd = base / "project"
    cwd.mkdir()
    (cwd / FILE_NAME).write_text(WORD + "\n")
    return cwd


def read_prompt(cwd: Path) -> str:
    return f"Read the file {cwd / FILE_NAME} and tell me what it says."


# -- Claude Code ---------------------------------------------------------------------------------


def claude(gw: AgentGateway, home: Path, cwd: Path, prompt: str, model: str, *extra: str) -> tuple[dict, Run]:
    env = agent_env(
        home, ANTHROPIC_BASE_URL=f"http://{gw.addr}", ANTHROPIC_AUTH_TOKEN=gw.agent_key, ANTHROPIC_MODEL=model,
        ANTHROPIC_SMALL_FAST_MODEL=model, DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
    )
    args = ["node", str(CLAUDE), "-p", prompt, "--output-format", "json", "--allowedTools", "Read", *extra]
    run = run_agent(args, env, cwd, home)
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert lines, f"Claude Code printed nothing\n{run}"
    try:
        result = json.loads(lines[-1])
    except ValueError:
        raise AssertionError(f"Claude Code's last line is not JSON\n{run}") from None
    assert_no_secrets(gw, run)
    return result, run


def assert_claude_answered(result: dict, run: Run) -> None:
    assert result.get("is_error") is False, str(run)
    assert result.get("type") == "result" and result.get("subtype") == "success", str(run)
    assert WORD in result.get("result", ""), str(run)


def upstream_path(provider: str, api: str) -> str:
    flavor = PROVIDERS[provider][1]
    return {"messages": f"/{flavor}/v1/messages", "chat": f"/{flavor}/v1/chat/completions",
            "responses": f"/{flavor}/v1/responses"}[api]


def upstream_api(provider: str, client_api: str) -> str:
    """The format rota speaks to the provider for a client of `client_api`."""
    api = PROVIDERS[provider][0]
    if api == "anthropic":
        return "messages"
    if api == "openai":
        return "responses" if client_api == "responses" else "chat"
    return {"openai-chat": "chat", "openai-responses": "responses"}[api]


def calls_of(gw: AgentGateway) -> list[tuple]:
    return [(s.path, s.key, s.status, s.answer, s.tool) for s in gw.upstream.requests()]


def tool_round_trip(provider: str, client_api: str, tool: str, profile: str = "a") -> list[tuple]:
    """The two upstream calls of a tool round trip served by `provider`'s profile."""
    path, key = upstream_path(provider, upstream_api(provider, client_api)), upstream_key(f"{provider}:{profile}")
    return [(path, key, 200, "tool_call", tool), (path, key, 200, "tool_result_quote", None)]


@pytest.mark.parametrize("provider", ["anth", "chat"])
def test_claude_code_reads_a_file(agent_gateway, tmp_path: Path, provider: str) -> None:
    """Claude Code's Read round trip, served by an Anthropic model and by a chat-only OpenAI one."""
    gw = agent_gateway([provider], mode="bytes")
    cwd = workdir(tmp_path)
    result, run = claude(gw, tmp_path / "home", cwd, read_prompt(cwd), model_of(provider))
    assert_claude_answered(result, run)
    assert calls_of(gw) == tool_round_trip(provider, "messages", "Read")
    assert all(gw.agent_key not in v for s in gw.upstream.requests() for v in s.headers.values())
    assert gw.audit_rows() == [
        (("messages", model_of(provider), 200), [served(1, "primary", f"{provider}:a")]),
        (("messages", model_of(provider), 200), [served(1, "primary", f"{provider}:a")]),
    ]


def chain(first: str, fallback: str) -> str:
    return f'[virtual_models.chain]\ntargets = ["{model_of(first)}", "{model_of(fallback)}"]\n'


@pytest.mark.parametrize(("first", "fallback"), [("anth", "chat"), ("chat", "anth")])
def test_claude_code_falls_back_to_the_other_format_on_a_429(agent_gateway, tmp_path: Path, first: str,
                                                             fallback: str) -> None:
    """A chain whose first model answers 429: the turn goes on in the fallback's format."""
    gw = agent_gateway([first, fallback], extra=chain(first, fallback))
    # Longer than the 2 minutes before its end within which rota probes a cooling primary.
    gw.upstream.rate_limit(upstream_key(f"{first}:a"), retry_after=600)
    cwd = workdir(tmp_path)
    result, run = claude(gw, tmp_path / "home", cwd, read_prompt(cwd), "chain")
    assert_claude_answered(result, run)
    first_path = upstream_path(first, upstream_api(first, "messages"))
    assert calls_of(gw) == [(first_path, upstream_key(f"{first}:a"), 429, "error", None),
                            *tool_round_trip(fallback, "messages", "Read")]
    # The second call of the turn finds the first model cooling (its Retry-After: 600 s).
    assert gw.audit_rows() == [
        (("messages", "chain", 200), [limited(1, "primary", f"{first}:a"), served(2, "fallback", f"{fallback}:a")]),
        (("messages", "chain", 200), [skipped(1, f"{first}:a"), served(2, "fallback", f"{fallback}:a")]),
    ]


# -- Codex CLI -----------------------------------------------------------------------------------

CODEX_KEY_VAR = "ROTA_AGENT_KEY"


def codex_home(gw: AgentGateway, home: Path, model: str) -> None:
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / ".codex" / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "rota"\n'
        "check_for_update_on_startup = false\n"
        "[analytics]\nenabled = false\n"
        # Off: the plugin marketplace (`git ls-remote` of a GitHub repository) and the apps
        # connectors (chatgpt.com): the tests reach nothing but loopback.
        "[features]\nplugins = false\nremote_plugin = false\napps = false\n"
        "[model_providers.rota]\n"
        'name = "rota"\n'
        f'base_url = "http://{gw.addr}/v1"\n'
        f'env_key = "{CODEX_KEY_VAR}"\n'
        'wire_api = "responses"\n'
    )


def codex(gw: AgentGateway, home: Path, cwd: Path, prompt: str, *, resume: bool = False,
          ok: bool = True) -> tuple[str, list[dict], Run]:
    """`codex exec` (or `codex exec resume --last`): the last message it printed, its JSON events."""
    last = home / f"last-{time.monotonic_ns()}.txt"
    env = agent_env(home, **{CODEX_KEY_VAR: gw.agent_key})
    args = ["node", str(CODEX), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--json", "-o", str(last)]
    args += ["resume", "--last", prompt] if resume else [prompt]
    run = run_agent(args, env, cwd, home)
    events = []
    for line in run.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    assert_no_secrets(gw, run)
    assert (run.returncode == 0) is ok, str(run)
    return (last.read_text() if last.exists() else ""), events, run


@pytest.mark.parametrize("provider", ["oai", "resp", "chat", "anth"])
def test_codex_runs_a_command(agent_gateway, tmp_path: Path, provider: str) -> None:
    """Codex's exec_command round trip, served by Responses upstreams (OpenAI's own and one with
    only the Responses API), a chat-only one and an Anthropic one."""
    gw = agent_gateway([provider], mode="bytes")
    cwd = workdir(tmp_path)
    home = tmp_path / "home"
    codex_home(gw, home, model_of(provider))
    text, events, run = codex(gw, home, cwd, read_prompt(cwd))
    assert text.strip() == QUOTE.format(line=WORD), str(run)
    commands = [e["item"] for e in events if e.get("type") == "item.completed"
                and e["item"].get("type") == "command_execution"]
    assert [(c["command"], c["exit_code"], c["aggregated_output"].strip()) for c in commands] == [
        (commands[0]["command"], 0, WORD)], str(run)
    assert f"cat {cwd / FILE_NAME}" in commands[0]["command"]
    assert calls_of(gw) == tool_round_trip(provider, "responses", "exec_command")
    assert gw.audit_rows() == [
        (("responses", model_of(provider), 200), [served(1, "primary", f"{provider}:a")]),
        (("responses", model_of(provider), 200), [served(1, "primary", f"{provider}:a")]),
    ]


# -- The OpenAI Agents SDK and the openai SDK's Responses API ------------------------------------

SDK_TIMEOUT_S = 20.0
SDK_PROMPT = f"Read the file {FILE_NAME} and tell me what it says."
READ_FILE_TOOL = {
    "type": "function", "name": "read_file", "description": "Read a file of the project and return its text.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                   "additionalProperties": False},
    "strict": True,
}


def served_twice(provider: str) -> list:
    return [(("responses", model_of(provider), 200), [served(1, "primary", f"{provider}:a")])] * 2


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("provider", ["anth", "chat"])
def test_openai_agents_sdk_calls_its_function_tool(agent_gateway, provider: str, stream: bool) -> None:
    import asyncio

    import openai
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # no export to OpenAI's tracing endpoint
    gw = agent_gateway([provider], mode="bytes" if stream else "whole")
    asked: list[str] = []

    @function_tool
    def read_file(path: str) -> str:
        """Read a file of the project and return its text."""
        asked.append(path)
        return f"{WORD}\n"

    async def main() -> str:
        client = openai.AsyncOpenAI(base_url=f"http://{gw.addr}/v1", api_key=gw.agent_key, max_retries=0,
                                    timeout=SDK_TIMEOUT_S)
        agent = Agent(name="reader", instructions="Answer from the files you read.", tools=[read_file],
                      model=OpenAIResponsesModel(model=model_of(provider), openai_client=client))
        try:
            if not stream:
                return (await Runner.run(agent, SDK_PROMPT, max_turns=4)).final_output
            run = Runner.run_streamed(agent, SDK_PROMPT, max_turns=4)
            async for _ in run.stream_events():
                pass
            return run.final_output
        finally:
            await client.close()

    output = asyncio.run(main())
    assert_no_secret_in(gw, output)
    assert asked == [FILE_NAME]
    assert output == QUOTE.format(line=WORD)
    assert calls_of(gw) == tool_round_trip(provider, "responses", "read_file")
    assert all(s.stream is stream for s in gw.upstream.requests())
    assert gw.audit_rows() == served_twice(provider)


def usage_of(seen: Seen) -> tuple[int, int]:
    assert seen.usage is not None
    return seen.usage


def responses_call(gw: AgentGateway, client, stream: bool, **params) -> tuple[Any, list[Any]]:
    """responses.create, buffered or streamed: the final response and the stream's events (which
    hold none of rota's secrets)."""
    if not stream:
        response = client.responses.create(**params)
        assert_no_secret_in(gw, response.model_dump_json())
        return response, []
    events = list(client.responses.create(**params, stream=True))
    assert_no_secret_in(gw, "".join(e.model_dump_json() for e in events))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    assert [e.sequence_number for e in events] == list(range(len(events))), types
    return events[-1].response, events


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("provider", ["oai", "anth", "chat"])
def test_openai_sdk_responses(agent_gateway, provider: str, stream: bool) -> None:
    """client.responses.create: text, usage, a function call and its output, through each format."""
    import openai

    gw = agent_gateway([provider], mode="bytes" if stream else "whole")
    client = openai.OpenAI(base_url=f"http://{gw.addr}/v1", api_key=gw.agent_key, max_retries=0,
                           timeout=SDK_TIMEOUT_S)
    model = model_of(provider)

    # Text.
    response, events = responses_call(gw, client, stream, model=model, input="Say hello.",
                                      instructions="You are terse.")
    assert response.status == "completed"
    assert response.output_text == REPLY.format(model=MODELS[provider])
    if stream:
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert len(deltas) > 1 and "".join(deltas) == response.output_text
    up_in, up_out = usage_of(gw.upstream.requests()[-1])
    assert (response.usage.input_tokens, response.usage.output_tokens) == (up_in, up_out)
    assert response.usage.total_tokens == up_in + up_out

    # A function call, then its output.
    user = {"role": "user", "content": SDK_PROMPT}
    first, events = responses_call(gw, client, stream, model=model, input=[user], tools=[READ_FILE_TOOL])
    calls = [o for o in first.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("read_file", {"path": FILE_NAME})]
    if stream:
        args = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        assert "".join(args) == calls[0].arguments
    call = calls[0]
    second, _ = responses_call(gw, client, stream, model=model, tools=[READ_FILE_TOOL], input=[
        user,
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": f"{WORD}\n"},
    ])
    assert second.output_text == QUOTE.format(line=WORD)
    assert calls_of(gw)[1:] == tool_round_trip(provider, "responses", "read_file")
    assert all(s.stream is stream for s in gw.upstream.requests())
    for seen in gw.upstream.requests():
        assert all(gw.agent_key not in v for v in seen.headers.values())
    assert [row for row, _ in gw.audit_rows()] == [("responses", model, 200)] * 3
    assert {tuple(a) for _, atts in gw.audit_rows() for a in atts} == {served(1, "primary", f"{provider}:a")}


# -- Sessions: an agent's turns stay on one profile, and move together when it cools ------------


def nudge(gw: AgentGateway, provider: str, sticky: str) -> list[str]:
    """Two requests without a session, as another client of the provider sends them between an
    agent's turns. Round robin (least recently used first) gives them the other profile, then
    `sticky`, so that without stickiness the session's next request would go to the other one.
    Returns the profiles that served them."""
    import anthropic
    import openai

    served_by = []
    for _ in range(2):
        if PROVIDERS[provider][0] == "anthropic":
            client = anthropic.Anthropic(base_url=f"http://{gw.addr}", api_key=gw.agent_key, max_retries=0,
                                         timeout=SDK_TIMEOUT_S)
            raw = client.messages.with_raw_response.create(
                model=model_of(provider), max_tokens=64, messages=[{"role": "user", "content": "Say hello."}])
        else:
            client = openai.OpenAI(base_url=f"http://{gw.addr}/v1", api_key=gw.agent_key, max_retries=0,
                                   timeout=SDK_TIMEOUT_S)
            raw = client.chat.completions.with_raw_response.create(
                model=model_of(provider), messages=[{"role": "user", "content": "Say hello."}])
        assert raw.status_code == 200
        served_by.append(raw.headers["x-rota-profile"])
    return served_by


def other(gw: AgentGateway, profile: str) -> str:
    provider = profile.split(":")[0]
    (rest,) = [p for p in gw.profiles if p.startswith(f"{provider}:") and p != profile]
    return rest


def session_rows(gw: AgentGateway, api: str, model: str, sticky: str, moved: str, nudged_api: str) -> list:
    """The audit of: a turn with a tool round trip on `sticky`, two nudges (other profile, then
    sticky), a plain turn on `sticky`; `sticky` cools: a turn with a tool round trip whose first
    call rotates to `moved` after the 429, whose second goes to `moved` straight away, and a plain
    turn on `moved`."""
    ok = lambda p: ((api, model, 200), [served(1, "primary", p)])  # noqa: E731
    return [
        ok(sticky), ok(sticky),
        ((nudged_api, model, 200), [served(1, "primary", moved)]), ((nudged_api, model, 200), [served(1, "primary", sticky)]),
        ok(sticky),
        ((api, model, 200), [limited(1, "primary", sticky), served(2, "rotate", moved)]), ok(moved),
        ok(moved),
    ]


def test_claude_code_session_sticks_to_a_profile_and_moves_when_it_cools(agent_gateway, tmp_path: Path) -> None:
    gw = agent_gateway(["anth"], profiles=("a", "b"), ordered=False)
    cwd, home, model = workdir(tmp_path), tmp_path / "home", model_of("anth")

    first, run = claude(gw, home, cwd, read_prompt(cwd), model)
    assert_claude_answered(first, run)
    sticky = gw.profile_of(gw.upstream.requests()[0].key)
    moved = other(gw, sticky)
    assert nudge(gw, "anth", sticky) == [moved, sticky]
    second, run = claude(gw, home, cwd, "Say hello.", model, "--continue")
    assert second["is_error"] is False and second["result"] == REPLY.format(model=ANTHROPIC_MODEL), str(run)
    assert second["session_id"] == first["session_id"], "--continue went on in another session"

    gw.upstream.rate_limit(upstream_key(sticky), retry_after=600)
    third, run = claude(gw, home, cwd, read_prompt(cwd), model, "--continue")
    assert_claude_answered(third, run)
    fourth, run = claude(gw, home, cwd, "Say hello.", model, "--continue")
    assert fourth["is_error"] is False and fourth["result"] == REPLY.format(model=ANTHROPIC_MODEL), str(run)
    assert third["session_id"] == fourth["session_id"] == first["session_id"]

    assert gw.audit_rows() == session_rows(gw, "messages", model, sticky, moved, "messages")


def test_codex_session_sticks_to_a_profile_and_moves_when_it_cools(agent_gateway, tmp_path: Path) -> None:
    gw = agent_gateway(["oai"], profiles=("a", "b"), ordered=False)
    cwd, home, model = workdir(tmp_path), tmp_path / "home", model_of("oai")
    codex_home(gw, home, model)

    text, _, run = codex(gw, home, cwd, read_prompt(cwd))
    assert text.strip() == QUOTE.format(line=WORD), str(run)
    sticky = gw.profile_of(gw.upstream.requests()[0].key)
    moved = other(gw, sticky)
    assert nudge(gw, "oai", sticky) == [moved, sticky]
    text, _, run = codex(gw, home, cwd, "Say hello.", resume=True)
    assert text.strip() == REPLY.format(model=OPENAI_MODEL), str(run)

    gw.upstream.rate_limit(upstream_key(sticky), retry_after=600)
    text, _, run = codex(gw, home, cwd, read_prompt(cwd), resume=True)
    assert text.strip() == QUOTE.format(line=WORD), str(run)
    text, _, run = codex(gw, home, cwd, "Say hello.", resume=True)
    assert text.strip() == REPLY.format(model=OPENAI_MODEL), str(run)

    sessions = {s.body.get("prompt_cache_key") for s in gw.upstream.requests() if s.api == "responses"}
    assert len(sessions) == 1 and None not in sessions, f"the resumed turns are another conversation: {sessions}"
    assert gw.audit_rows() == session_rows(gw, "responses", model, sticky, moved, "chat")


# -- When rota has nothing to serve with -----------------------------------------------------------


def test_agents_see_rotas_429_when_every_profile_is_limited(agent_gateway, tmp_path: Path) -> None:
    """The only profile answers 429: each agent gets rota's 429 in its own format, retries as it
    does (Claude Code not at all with a 10-minute Retry-After, Codex 5 times, waiting the 1 s the
    upstream asked for), gives up, and shows nothing of rota's secrets."""
    gw = agent_gateway(["anth", "oai"])
    gw.upstream.rate_limit(upstream_key("anth:a"), retry_after=600)
    gw.upstream.rate_limit(upstream_key("oai:a"), retry_after=1)
    cwd = workdir(tmp_path)

    result, run = claude(gw, tmp_path / "claude-home", cwd, "Say hello.", model_of("anth"))
    assert run.returncode == 1 and result["is_error"] is True, str(run)
    assert (result["api_error_status"], result["api_error_type"]) == (429, "rate_limit_error"), str(run)
    assert "Rate limit reached for requests." in result["result"], str(run)
    assert calls_of(gw) == [("/anthropic/v1/messages", upstream_key("anth:a"), 429, "error", None)]

    home = tmp_path / "codex-home"
    codex_home(gw, home, model_of("oai"))
    _, events, run = codex(gw, home, cwd, "Say hello.", ok=False)
    failed = [e for e in events if e.get("type") == "turn.failed"]
    assert len(failed) == 1 and "429 Too Many Requests" in failed[0]["error"]["message"], str(run)
    assert calls_of(gw)[1:] == [("/openai/v1/responses", upstream_key("oai:a"), 429, "error", None)] * 6

    limited_row = lambda api, p: ((api, model_of(p.split(":")[0]), 429), [limited(1, "primary", p)])  # noqa: E731
    assert gw.audit_rows() == [limited_row("messages", "anth:a")] + [limited_row("responses", "oai:a")] * 6
