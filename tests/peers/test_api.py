"""The REST API under /api/v1, driven by the clients it is for.

    agent (openai / anthropic SDK) --lease--> rota /api/v1/leases
                                   --call---> key tap --> llmock   (with the leased credential)
                                   --report-> rota /api/v1/leases/{id}/report

A lease is one attempt of the gateway's failover walk: the agent calls the provider itself and
reports what came of it, and rota answers a failure with the walk's next lease. The tests check
what the agent was leased, which key the upstream saw (the key tap), and the audit rows, as
test_sdks.py does for the proxied path. The admin API is checked for agreement with its OpenAPI
document and for never answering a secret. Each test gets its own llmock, key tap and
`rota serve` (see conftest.py); the SDKs run with `max_retries=0`.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

from conftest import ANTHROPIC_MODEL, OPENAI_MODEL, UPSTREAM_KEYS, Gateway, rota
from test_sdks import PROMPT, SDK_TIMEOUT_S, attempt_rows, llmock_log, reply, request_row, upstream_auth

HTTP_TIMEOUT_S = 10.0
ADMIN_KEY_DEADLINE_S = 5.0  # the server reloads agents every 2 s
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")

# Every /api/v1 route, with its methods: what the OpenAPI document must list, no more, no less.
ROUTES: dict[str, set[str]] = {
    "/api/v1/openapi.json": {"GET"},
    "/api/v1/leases": {"POST"},
    "/api/v1/leases/{id}/report": {"POST"},
    "/api/v1/profiles": {"GET", "POST"},
    "/api/v1/profiles/{id}": {"GET", "PATCH", "DELETE"},
    "/api/v1/profiles/{id}/enable": {"POST"},
    "/api/v1/profiles/{id}/disable": {"POST"},
    "/api/v1/profiles/{id}/clear": {"POST"},
    "/api/v1/providers": {"GET"},
    "/api/v1/providers/{provider}/order": {"PUT", "DELETE"},
    "/api/v1/models": {"GET"},
    "/api/v1/models/clear": {"POST"},
    "/api/v1/agents": {"GET", "POST"},
    "/api/v1/agents/{name}": {"DELETE", "PATCH"},
    "/api/v1/agents/{name}/setup": {"GET"},
    "/api/v1/alerts": {"GET"},
    "/api/v1/alerts/{rule}/test": {"POST"},
    "/api/v1/usage": {"GET"},
    "/api/v1/usage/series": {"GET"},
    "/api/v1/attempts": {"GET"},
    "/api/v1/requests": {"GET"},
    "/api/v1/admin-actions": {"GET"},
    "/api/v1/backup": {"POST"},
    "/api/v1/session": {"GET", "POST", "DELETE"},
    "/api/v1/oauth/{provider}/authorize": {"POST"},
    "/api/v1/oauth/{provider}/paste": {"POST"},
    "/api/v1/oauth/{provider}/device": {"POST"},
    "/api/v1/oauth/flows/{id}": {"GET"},
}
# Path parameters that harm no fixture state: no such profile, agent or lease; a known provider.
HARMLESS = {"id": "openai:nope", "name": "nobody", "provider": "openai", "rule": "nobody"}
HARMLESS_REPORT_ID = "not-a-uuid"


# -- HTTP ---------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        assert self.headers.get("content-type", "").startswith("application/json"), (self.status, self.headers, self.text)
        return json.loads(self.body)

    def error(self) -> dict[str, Any]:
        """The `{"error": {"type", "message"}}` body every /api/v1 error has."""
        body = self.json()
        assert isinstance(body, dict) and isinstance(body.get("error"), dict), (self.status, body)
        err = body["error"]
        assert isinstance(err.get("type"), str) and err["type"], (self.status, body)
        assert isinstance(err.get("message"), str) and err["message"], (self.status, body)
        return err


def call(gw: Gateway, method: str, path: str, key: str | None = None, body: Any = None,
         key_header: str = "authorization") -> Answer:
    """One request to rota; `key` goes as `Authorization: Bearer` or `x-api-key`."""
    headers = {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["content-type"] = "application/json"
    if key is not None:
        headers[key_header] = f"Bearer {key}" if key_header == "authorization" else key
    req = urllib.request.Request(f"http://{gw.addr}{path}", data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:  # noqa: S310 (loopback only)
            return Answer(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        with e:
            return Answer(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


def admin_key(gw: Gateway, name: str = "ops") -> str:
    """A new admin agent's key, once the running server knows it."""
    out = rota(gw.dir, "agents", "create", name, "--admin").stdout.strip().splitlines()
    key = out[-1].strip()
    assert key.startswith("rk_"), out
    deadline = time.monotonic() + ADMIN_KEY_DEADLINE_S
    while True:
        got = call(gw, "GET", "/api/v1/providers", key)
        if got.status != 401:
            assert got.status == 200, (got.status, got.text)
            return key
        assert time.monotonic() < deadline, f"rota serve did not pick up agent {name} within {ADMIN_KEY_DEADLINE_S}s"
        time.sleep(0.1)


def lease(gw: Gateway, key: str, **request: Any) -> dict[str, Any]:
    got = call(gw, "POST", "/api/v1/leases", key, request)
    assert got.status == 201, (got.status, got.text)
    return got.json()


def report(gw: Gateway, key: str, lease_id: str, **body: Any) -> Answer:
    return call(gw, "POST", f"/api/v1/leases/{lease_id}/report", key, body)


def concrete(path: str) -> str:
    """A documented path with harmless values for its parameters."""
    if path == "/api/v1/leases/{id}/report":
        return path.replace("{id}", HARMLESS_REPORT_ID)
    return re.sub(r"\{(\w+)\}", lambda m: HARMLESS[m.group(1)], path)


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The one key a request carried, in either header."""
    keys = [k for k in (authorization.removeprefix("Bearer ") if authorization else None, x_api_key) if k]
    assert len(keys) <= 1, (authorization, x_api_key)
    return keys[0] if keys else None


def assert_lease_shape(got: dict[str, Any], gw: Gateway) -> None:
    assert set(got) == {"lease_id", "expires_at", "request_id", "attempt", "kind", "retry_in_ms", "profile_id",
                        "provider", "api", "base_url", "model", "credential"}, got
    assert set(got["credential"]) == {"type", "secret", "header", "expires_at"}, got
    assert got["credential"]["type"] == "api_key", got
    # The header the SDK of the lease's format sends an API key in.
    assert got["credential"]["header"] == {"anthropic": "x-api-key"}.get(got["api"], "authorization"), got
    assert got["base_url"].startswith(f"http://127.0.0.1:{gw.tap.port}/"), got


# -- 1. the OpenAPI document and the router ----------------------------------------------------


def test_openapi_document_validates_and_lists_every_route(gateway: Gateway) -> None:
    gw = gateway
    got = call(gw, "GET", "/api/v1/openapi.json")  # no key: the document is public
    assert got.status == 200, (got.status, got.text)
    doc = got.json()
    validate(doc, cls=OpenAPIV31SpecValidator)
    assert re.fullmatch(r"3\.1\.\d+", doc["openapi"]), doc["openapi"]
    documented = {path: {m.upper() for m in ops} for path, ops in doc["paths"].items()}
    assert documented == ROUTES
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer"}
    assert schemes["x-api-key"] == {"type": "apiKey", "in": "header", "name": "x-api-key"}

    key = admin_key(gw)
    for path, ops in doc["paths"].items():
        url = concrete(path)
        for method in METHODS:
            body = {} if method in ("POST", "PUT", "PATCH") else None
            op = ops.get(method.lower())
            got = call(gw, method, url, key, body)
            where = f"{method} {url} -> {got.status} {got.text[:300]!r}"
            if op is None:
                assert got.status == 405, f"undocumented method answered: {where}"
                continue
            assert got.status != 405, f"documented method refused: {where}"
            assert not (got.status == 404 and not got.body), f"documented route not served: {where}"
            assert str(got.status) in op["responses"], f"status not in the document ({sorted(op['responses'])}): {where}"
            if got.status >= 400:
                got.error()
            elif got.status != 204:
                got.json()
            # The document's security: the public operation answers without a key, every other
            # one refuses a request without a key with 401.
            anonymous = call(gw, method, url, None, body)
            if op.get("security", doc["security"]) == [{}]:
                assert anonymous.status == got.status, f"{method} {url} without a key -> {anonymous.status}"
            else:
                assert anonymous.status == 401, f"{method} {url} without a key -> {anonymous.status} {anonymous.text!r}"
                assert anonymous.error()["type"] == "unauthorized"

    # A path outside the document is the router's 404, so the checks above could tell them apart.
    assert call(gw, "GET", "/api/v1/nothing-here", key).status == 404
    # The harmless calls left the fixture's profiles and agents as they were.
    profiles = call(gw, "GET", "/api/v1/profiles", key).json()
    assert sorted(p["id"] for p in profiles) == sorted(UPSTREAM_KEYS)
    assert all(p["enabled"] for p in profiles), profiles
    agents = call(gw, "GET", "/api/v1/agents", key).json()
    assert sorted((a["name"], a["admin"], a["revoked_at"]) for a in agents) == [("ops", True, None), ("sdk", False, None)]


# -- 2. an OpenAI SDK agent over leases ----------------------------------------------------------


RATE_LIMIT = {"type": "fail", "status": 429, "retry_after": 2, "times": 1, "match": {"provider": "openai"}}


def test_openai_sdk_agent_loop_over_leases(gateway: Gateway) -> None:
    """The agent calls llmock itself with each leased key: a 429 on key a, then key b serves it."""
    gw = gateway
    key = gw.agent_key
    gw.llmock.scenario(RATE_LIMIT, reply("Leased answer.", "openai"))

    current: dict[str, Any] | None = lease(gw, key, model=f"openai/{OPENAI_MODEL}")
    request_id = current["request_id"]
    leases: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    completion = None
    while current is not None:
        assert_lease_shape(current, gw)
        assert current["request_id"] == request_id
        assert len(leases) < 5, f"the walk does not end: {leases}"
        leases.append(current)
        assert (current["api"], current["provider"], current["model"]) == ("openai", "openai", OPENAI_MODEL)
        time.sleep(current["retry_in_ms"] / 1000)
        client = openai.OpenAI(base_url=current["base_url"], api_key=current["credential"]["secret"], max_retries=0,
                               timeout=SDK_TIMEOUT_S)
        try:
            raw = client.chat.completions.with_raw_response.create(model=current["model"], messages=PROMPT)
        except openai.APIStatusError as e:
            got = report(gw, key, current["lease_id"], outcome="failure", http_status=e.status_code,
                         error=e.response.text, headers=dict(e.response.headers))
            assert got.status == 200, (got.status, got.text)
            answer = got.json()
            reports.append(answer)
            current = answer["next"]
            continue
        completion = raw.parse()
        got = report(gw, key, current["lease_id"], outcome="success", http_status=raw.status_code,
                     usage={"input_tokens": completion.usage.prompt_tokens,
                            "output_tokens": completion.usage.completion_tokens})
        assert got.status == 200, (got.status, got.text)
        reports.append(got.json())
        current = None

    assert completion is not None
    assert completion.choices[0].message.content == "Leased answer."
    assert [(le["attempt"], le["kind"], le["profile_id"], le["retry_in_ms"]) for le in leases] == [
        (1, "primary", "openai:a", 0),
        (2, "rotate", "openai:b", 0),
    ]
    assert [le["credential"]["secret"] for le in leases] == [UPSTREAM_KEYS["openai:a"], UPSTREAM_KEYS["openai:b"]]
    assert [(r["request_id"], r["recorded"]) for r in reports] == [
        (request_id, {"outcome": "failure", "reason": "rate_limit"}),
        (request_id, {"outcome": "success", "reason": None}),
    ]
    assert reports[-1]["next"] is None

    # The upstream saw key a, then key b, both straight from the agent.
    assert upstream_auth(gw.tap.requests()) == [
        ("/v1/chat/completions", f"Bearer {UPSTREAM_KEYS['openai:a']}", None),
        ("/v1/chat/completions", f"Bearer {UPSTREAM_KEYS['openai:b']}", None),
    ]
    assert llmock_log(gw) == [
        ("/v1/chat/completions", OPENAI_MODEL, False, 429, "scenario:429", 2.0),
        ("/v1/chat/completions", OPENAI_MODEL, False, 200, None, None),
    ]
    assert gw.llmock.pending() == []

    # A lease is reported once.
    again = report(gw, key, leases[0]["lease_id"], outcome="success")
    assert again.status == 409, (again.status, again.text)
    assert again.error()["type"] == "lease_reported"
    again = report(gw, key, leases[1]["lease_id"], outcome="success")
    assert again.status == 409, (again.status, again.text)
    assert again.error()["type"] == "lease_reported"

    # The audit rows: the gateway's, for the same faults.
    req, att = gw.audit(request_id)
    assert request_row(req) == {
        "agent": "sdk", "api": "lease", "requested_model": f"openai/{OPENAI_MODEL}",
        "served_model": f"openai/{OPENAI_MODEL}", "served_profile": "openai:b", "status": 200, "attempts": 2,
        "stream": 0,
    }
    assert (req["tokens_in"], req["tokens_out"]) == (completion.usage.prompt_tokens, completion.usage.completion_tokens)
    assert attempt_rows(att) == [
        (1, "primary", "openai", OPENAI_MODEL, "openai:a", 429, "failure", "rate_limit", 2000),
        (2, "rotate", "openai", OPENAI_MODEL, "openai:b", 200, "success", None, None),
    ]
    failed, served = att
    assert failed["error"] == "Rate limit exceeded.", dict(failed)
    earliest = failed["started_at"] + failed["duration_ms"] + 2000
    assert earliest <= failed["cooldown_until"] <= earliest + 1000, dict(failed)
    assert served["cooldown_until"] is None
    assert (served["tokens_in"], served["tokens_out"]) == (
        completion.usage.prompt_tokens, completion.usage.completion_tokens,
    )
    stats = gw.usage_stats("openai:a", lambda r: r["cooldown_reason"] is not None)
    assert (stats["cooldown_reason"], stats["cooldown_model"], stats["cooldown_until"]) == (
        "rate_limit", OPENAI_MODEL, failed["cooldown_until"],
    )
    assert json.loads(stats["failure_counts"]) == {"rate_limit": 1}


# -- 3. an Anthropic SDK agent that ends on OpenAI ----------------------------------------------


OVERLOADED_BOTH = {"type": "fail", "status": 529, "retry_after": 1, "times": 6, "match": {"provider": "anthropic"}}
WALK_DEADLINE_S = 20.0


def test_anthropic_sdk_agent_loop_over_leases_falls_back(gateway: Gateway) -> None:
    """Both Anthropic keys answer 529 (each tried three times); the fallback model is OpenAI's,
    so the agent switches to the OpenAI SDK for the last lease."""
    gw = gateway
    key = gw.agent_key
    gw.llmock.scenario(OVERLOADED_BOTH, reply("Served by the fallback.", "openai"))
    started = time.monotonic()

    current: dict[str, Any] | None = lease(
        gw, key, model=f"anthropic/{ANTHROPIC_MODEL}", fallbacks=[f"openai/{OPENAI_MODEL}"]
    )
    request_id = current["request_id"]
    leases: list[dict[str, Any]] = []
    recorded: list[dict[str, Any]] = []
    text = None
    while current is not None:
        assert_lease_shape(current, gw)
        assert current["request_id"] == request_id
        assert len(leases) < 10, f"the walk does not end: {leases}"
        assert time.monotonic() - started < WALK_DEADLINE_S, f"the walk takes too long: {leases}"
        leases.append(current)
        time.sleep(current["retry_in_ms"] / 1000)
        secret = current["credential"]["secret"]
        try:
            if current["api"] == "anthropic":
                client = anthropic.Anthropic(base_url=current["base_url"], api_key=secret, max_retries=0,
                                             timeout=SDK_TIMEOUT_S)
                message = client.messages.create(model=current["model"], max_tokens=64, messages=PROMPT)
                text = "".join(b.text for b in message.content if b.type == "text")
                usage = {"input_tokens": message.usage.input_tokens, "output_tokens": message.usage.output_tokens}
            else:
                assert current["api"] == "openai", current
                client = openai.OpenAI(base_url=current["base_url"], api_key=secret, max_retries=0,
                                       timeout=SDK_TIMEOUT_S)
                completion = client.chat.completions.create(model=current["model"], messages=PROMPT)
                text = completion.choices[0].message.content
                usage = {"input_tokens": completion.usage.prompt_tokens,
                         "output_tokens": completion.usage.completion_tokens}
        except (anthropic.APIStatusError, openai.APIStatusError) as e:
            got = report(gw, key, current["lease_id"], outcome="failure", http_status=e.status_code,
                         error=e.response.text, headers=dict(e.response.headers))
            assert got.status == 200, (got.status, got.text)
            answer = got.json()
            recorded.append(answer["recorded"])
            current = answer["next"]
            continue
        got = report(gw, key, current["lease_id"], outcome="success", usage=usage)
        assert got.status == 200, (got.status, got.text)
        answer = got.json()
        recorded.append(answer["recorded"])
        assert answer["next"] is None
        current = None

    assert text == "Served by the fallback."
    a, b, oa = "anthropic:a", "anthropic:b", "openai:a"
    walk = [(le["attempt"], le["kind"], le["profile_id"]) for le in leases]
    assert walk == [
        (1, "primary", a), (2, "retry", a), (3, "retry", a),
        (4, "rotate", b), (5, "retry", b), (6, "retry", b),
        (7, "fallback", oa),
    ]
    assert [(le["api"], le["provider"], le["model"]) for le in leases] == (
        [("anthropic", "anthropic", ANTHROPIC_MODEL)] * 6 + [("openai", "openai", OPENAI_MODEL)]
    )
    # A retry waits a little (100 ms per try so far, plus jitter); a move to another profile does not.
    for le in leases:
        if le["kind"] == "retry":
            assert 0 < le["retry_in_ms"] < 1000, le
        else:
            assert le["retry_in_ms"] == 0, le
    assert recorded == [{"outcome": "failure", "reason": "overloaded"}] * 6 + [{"outcome": "success", "reason": None}]

    # The key each upstream call carried (anthropic 2.x sends `api_key` as `Authorization: Bearer`).
    ka, kb = UPSTREAM_KEYS["anthropic:a"], UPSTREAM_KEYS["anthropic:b"]
    assert [(path, presented_key(auth, x_api_key)) for path, auth, x_api_key in upstream_auth(gw.tap.requests())] == (
        [("/anthropic/v1/messages", ka)] * 3 + [("/anthropic/v1/messages", kb)] * 3
        + [("/v1/chat/completions", UPSTREAM_KEYS["openai:a"])]
    )
    assert llmock_log(gw) == (
        [("/anthropic/v1/messages", ANTHROPIC_MODEL, False, 529, "scenario:529", 1.0)] * 6
        + [("/v1/chat/completions", OPENAI_MODEL, False, 200, None, None)]
    )
    assert gw.llmock.pending() == []

    req, att = gw.audit(request_id)
    assert request_row(req) == {
        "agent": "sdk", "api": "lease", "requested_model": f"anthropic/{ANTHROPIC_MODEL}",
        "served_model": f"openai/{OPENAI_MODEL}", "served_profile": "openai:a", "status": 200, "attempts": 7,
        "stream": 0,
    }
    # The attempts rows are the leases, in order.
    assert [(r["seq"], r["kind"], r["profile_id"]) for r in att] == walk
    m = ANTHROPIC_MODEL
    assert attempt_rows(att) == [
        (1, "primary", "anthropic", m, a, 529, "failure", "overloaded", 1000),
        (2, "retry", "anthropic", m, a, 529, "failure", "overloaded", 1000),
        (3, "retry", "anthropic", m, a, 529, "failure", "overloaded", 1000),
        (4, "rotate", "anthropic", m, b, 529, "failure", "overloaded", 1000),
        (5, "retry", "anthropic", m, b, 529, "failure", "overloaded", 1000),
        (6, "retry", "anthropic", m, b, 529, "failure", "overloaded", 1000),
        (7, "fallback", "openai", OPENAI_MODEL, oa, 200, "success", None, None),
    ]
    assert [r["error"] for r in att] == ["Service overloaded."] * 6 + [None]
    # Only the failure that gives up on a profile cools it.
    assert [r["cooldown_until"] is None for r in att] == [True, True, False, True, True, False, True]
    for pid, row in ((a, att[2]), (b, att[5])):
        stats = gw.usage_stats(pid, lambda r: r["cooldown_reason"] is not None)
        assert (stats["cooldown_reason"], stats["cooldown_model"], stats["cooldown_until"]) == (
            "overloaded", ANTHROPIC_MODEL, row["cooldown_until"],
        )
    assert time.monotonic() - started < WALK_DEADLINE_S


# -- 4. the admin API answers no secret --------------------------------------------------------


NEW_SECRET = "sk-peer-admin-secret-123"


def admin_calls() -> list[tuple[str, str, Any]]:
    """(method, path, body) of every admin operation, with bodies that would change something."""
    return [
        ("GET", "/api/v1/profiles", None),
        ("POST", "/api/v1/profiles", {"provider": "openai", "name": "intruder", "secret": "sk-peer-intruder"}),
        ("GET", "/api/v1/profiles/openai:a", None),
        ("DELETE", "/api/v1/profiles/openai:a", None),
        ("POST", "/api/v1/profiles/openai:a/enable", {}),
        ("POST", "/api/v1/profiles/openai:a/disable", {}),
        ("POST", "/api/v1/profiles/openai:a/clear", {}),
        ("GET", "/api/v1/providers", None),
        ("PUT", "/api/v1/providers/openai/order", {"profiles": ["openai:b", "openai:a"]}),
        ("DELETE", "/api/v1/providers/openai/order", None),
        ("GET", "/api/v1/models", None),
        ("GET", "/api/v1/agents", None),
        ("POST", "/api/v1/agents", {"name": "intruder", "admin": True}),
        ("DELETE", "/api/v1/agents/sdk", None),
        ("GET", "/api/v1/usage", None),
        ("GET", "/api/v1/usage/series", None),
        ("GET", "/api/v1/attempts", None),
        ("GET", "/api/v1/requests", None),
    ]


def test_admin_api_never_returns_a_secret(gateway: Gateway) -> None:
    gw = gateway
    admin = admin_key(gw)
    answers: list[tuple[str, Answer]] = []  # every admin answer, checked for secrets at the end

    def admin_call(method: str, path: str, body: Any = None, key_header: str = "authorization") -> Answer:
        got = call(gw, method, path, admin, body, key_header)
        answers.append((f"{method} {path}", got))
        return got

    # Add a profile; its secret is write-only.
    got = admin_call("POST", "/api/v1/profiles", {"provider": "openai", "name": "api", "secret": NEW_SECRET})
    assert got.status == 201, (got.status, got.text)
    added = got.json()
    assert {k: added[k] for k in ("id", "provider", "name", "type", "source", "enabled", "expires_at")} == {
        "id": "openai:api", "provider": "openai", "name": "api", "type": "api_key", "source": "stored",
        "enabled": True, "expires_at": None,
    }
    assert added["status"] == {"state": "usable"}
    got = admin_call("POST", "/api/v1/profiles", {"provider": "openai", "name": "api", "secret": NEW_SECRET})
    assert got.status == 409, (got.status, got.text)
    assert got.error()["type"] == "conflict"

    # Put it first; a lease (the one place a secret is handed out, to the agent that calls) shows
    # the stored secret is the one sent. Its failure report quotes the key back, as some
    # providers' error bodies do: the audit log must not keep it.
    got = admin_call("PUT", "/api/v1/providers/openai/order", {"profiles": ["openai:api", "openai:a", "openai:b"]},
                     key_header="x-api-key")
    assert got.status == 200, (got.status, got.text)
    assert (got.json()["order_source"], got.json()["order"]) == ("stored", ["openai:api", "openai:a", "openai:b"])
    first = lease(gw, gw.agent_key, model=f"openai/{OPENAI_MODEL}")
    assert (first["profile_id"], first["credential"]["secret"]) == ("openai:api", NEW_SECRET)
    quoted = json.dumps({"error": {"message": f"Rate limit reached for key {NEW_SECRET}.", "type": "requests"}})
    got = report(gw, gw.agent_key, first["lease_id"], outcome="failure", http_status=429, error=quoted,
                 headers={"retry-after": "30"})
    assert got.status == 200, (got.status, got.text)
    assert NEW_SECRET not in got.text
    nxt = got.json()["next"]
    assert (nxt["kind"], nxt["profile_id"]) == ("rotate", "openai:a")
    got = report(gw, gw.agent_key, nxt["lease_id"], outcome="success", usage={"input_tokens": 3, "output_tokens": 5})
    assert got.status == 200, (got.status, got.text)
    gw.audit(first["request_id"])

    # Every GET endpoint, the new profile's state changes, then its removal.
    got = admin_call("GET", "/api/v1/profiles")
    assert got.status == 200
    assert sorted(p["id"] for p in got.json()) == sorted([*UPSTREAM_KEYS, "openai:api"])
    got = admin_call("GET", "/api/v1/profiles?provider=openai", key_header="x-api-key")
    assert [p["id"] for p in got.json()] == ["openai:a", "openai:api", "openai:b"]
    got = admin_call("GET", "/api/v1/profiles/openai:api")
    assert got.status == 200
    assert got.json()["status"]["state"] == "cooling", got.json()
    for path in ("/api/v1/providers", "/api/v1/models", "/api/v1/agents", "/api/v1/usage"):
        got = admin_call("GET", path)
        assert got.status == 200, (path, got.status, got.text)
    got = admin_call("GET", f"/api/v1/attempts?request_id={first['request_id']}")
    assert got.status == 200
    items = got.json()["items"]
    assert [(i["profile_id"], i["outcome"], i["reason"]) for i in items] == [
        ("openai:a", "success", None), ("openai:api", "failure", "rate_limit"),
    ], items
    # The provider's message is kept, the key it quoted is not.
    assert items[1]["error"] == "Rate limit reached for key [REDACTED].", items[1]
    got = admin_call("GET", f"/api/v1/requests?request_id={first['request_id']}")
    assert got.status == 200
    assert [(i["id"], i["api"], i["served_profile"]) for i in got.json()["items"]] == [
        (first["request_id"], "lease", "openai:a"),
    ]
    usage = {u["profile_id"]: u for u in admin_call("GET", "/api/v1/usage").json()["profiles"]}
    assert (usage["openai:api"]["attempts"], usage["openai:api"]["failures"]) == (1, 1)

    got = admin_call("POST", "/api/v1/profiles/openai:api/disable")
    assert got.status == 200, (got.status, got.text)
    assert (got.json()["enabled"], got.json()["status"]["state"]) == (False, "unusable")
    got = admin_call("POST", "/api/v1/profiles/openai:api/enable")
    assert got.status == 200, (got.status, got.text)
    assert got.json()["enabled"] is True
    got = admin_call("POST", "/api/v1/profiles/openai:api/clear")
    assert got.status == 200, (got.status, got.text)
    assert got.json()["status"] == {"state": "usable"}

    # A new agent's key is shown once, in the answer that creates it.
    got = admin_call("POST", "/api/v1/agents", {"name": "helper"})
    assert got.status == 201, (got.status, got.text)
    helper_key = got.json()["key"]
    assert helper_key.startswith("rk_")
    assert got.json()["agent"]["name"] == "helper" and got.json()["agent"]["admin"] is False
    got = admin_call("GET", "/api/v1/agents")
    assert sorted(a["name"] for a in got.json()) == ["helper", "ops", "sdk"]
    got = admin_call("DELETE", "/api/v1/agents/helper")
    assert got.status == 204, (got.status, got.text)

    got = admin_call("DELETE", "/api/v1/profiles/openai:api")
    assert got.status == 204, (got.status, got.text)
    got = admin_call("GET", "/api/v1/profiles/openai:api")
    assert got.status == 404
    assert got.error()["type"] == "not_found"
    got = admin_call("GET", "/api/v1/providers")
    openai_provider = next(p for p in got.json() if p["name"] == "openai")
    assert (openai_provider["profiles"], openai_provider["order_source"], openai_provider["order"]) == (
        ["openai:a", "openai:b"], "stored", ["openai:a", "openai:b"],
    )
    got = admin_call("DELETE", "/api/v1/providers/openai/order")
    assert got.status == 200, (got.status, got.text)
    assert (got.json()["order_source"], got.json()["order"]) == ("config", ["openai:a", "openai:b"])

    # No answer carried an upstream secret, the new one, or an agent key (but the one shown once).
    secrets = {**UPSTREAM_KEYS, "new profile": NEW_SECRET, "admin key": admin, "agent key": gw.agent_key,
               "helper key": helper_key}
    for what, got in answers:
        for name, secret in secrets.items():
            if name == "helper key" and what == "POST /api/v1/agents":
                continue
            assert secret not in got.text, f"{what} answered the {name}: {got.text[:500]}"
    # The new secret is not in the attempts log either (redacted from the quoted error body).
    assert not [dict(r) for r in gw.query("SELECT * FROM attempts") if NEW_SECRET in json.dumps(dict(r))]

    # A non-admin agent is refused (and nothing happens); no key, or an unknown one, is 401.
    for method, path, body in admin_calls():
        got = call(gw, method, path, gw.agent_key, body)
        assert got.status == 403, (method, path, got.status, got.text)
        assert got.error()["type"] == "forbidden", (method, path)
        got = call(gw, method, path, gw.agent_key, body, key_header="x-api-key")
        assert got.status == 403, (method, path, got.status, got.text)
        got = call(gw, method, path, None, body)
        assert got.status == 401, (method, path, got.status, got.text)
        assert got.error()["type"] == "unauthorized", (method, path)
        got = call(gw, method, path, "rk_not_a_key", body)
        assert got.status == 401, (method, path, got.status, got.text)
        assert got.error()["type"] == "unauthorized", (method, path)
    profiles = call(gw, "GET", "/api/v1/profiles", admin).json()
    assert sorted(p["id"] for p in profiles) == sorted(UPSTREAM_KEYS)
    assert [(p["enabled"], p["status"]) for p in profiles] == [(True, {"state": "usable"})] * 4, profiles
    agents = call(gw, "GET", "/api/v1/agents", admin).json()
    assert sorted(a["name"] for a in agents if a["revoked_at"] is None) == ["ops", "sdk"]
    providers = {p["name"]: p for p in call(gw, "GET", "/api/v1/providers", admin).json()}
    assert (providers["openai"]["order_source"], providers["openai"]["order"]) == ("config", ["openai:a", "openai:b"])
    # The non-admin agent's key still works for what it is for.
    assert call(gw, "POST", "/api/v1/leases", gw.agent_key, {"model": f"openai/{OPENAI_MODEL}"}).status == 201
