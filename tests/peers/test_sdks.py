"""The official OpenAI and Anthropic Python SDKs, pointed at rota, with llmock as the upstream.

Each test gets its own llmock, key tap and `rota serve` (see conftest.py). rota holds two API
keys per provider, tried in the explicit order a, b. The SDKs run with `max_retries=0`: every
success they see is rota's doing, never an SDK retry.
"""

from __future__ import annotations

import json

import anthropic
import openai

from conftest import ANTHROPIC_MODEL, OPENAI_MODEL, UPSTREAM_KEYS, Gateway

SDK_TIMEOUT_S = 20.0
PROMPT = [{"role": "user", "content": "Say something short."}]


def openai_client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{gw.addr}/v1", api_key=gw.agent_key, max_retries=0, timeout=SDK_TIMEOUT_S)


def anthropic_client(gw: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"http://{gw.addr}", api_key=gw.agent_key, max_retries=0, timeout=SDK_TIMEOUT_S)


def reply(text: str, provider: str) -> dict:
    """An llmock behaviour: the next handled request of `provider` answers exactly `text`."""
    return {"type": "reply", "text": text, "times": 1, "match": {"provider": provider}}


def rota_headers(headers) -> dict[str, str | None]:
    return {k: headers.get(k) for k in ("x-rota-provider", "x-rota-model", "x-rota-profile", "x-rota-attempts")}


def upstream_auth(seen) -> list[tuple[str, str | None, str | None]]:
    """(path, authorization, x-api-key) of each request rota sent upstream."""
    return [(s.path, s.headers.get("authorization"), s.headers.get("x-api-key")) for s in seen]


def assert_agent_key_stays_in_rota(gw: Gateway) -> None:
    for s in gw.tap.requests():
        assert all(gw.agent_key not in v for v in s.headers.values()), f"agent key sent upstream: {s.headers}"


def attempt_rows(attempts) -> list[tuple]:
    cols = ("seq", "kind", "provider", "model", "profile_id", "http_status", "outcome", "reason", "retry_after_ms")
    return [tuple(r[c] for c in cols) for r in attempts]


def request_row(req) -> dict:
    cols = ("agent", "api", "requested_model", "served_model", "served_profile", "status", "attempts", "stream")
    return {c: req[c] for c in cols}


def llmock_log(gw: Gateway) -> list[tuple]:
    """(path, model, stream, status, fault, retry_after) of each request llmock received."""
    return [(r["path"], r["model"], r["stream"], r["status"], r["fault"], r["retry_after"]) for r in gw.llmock.requests()]


def test_openai_sdk_non_streaming_and_streaming(gateway: Gateway) -> None:
    gw = gateway
    client = openai_client(gw)
    gw.llmock.scenario(reply("Plain answer from llmock.", "openai"), reply("Streamed answer from llmock, in words.", "openai"))

    raw = client.chat.completions.with_raw_response.create(model=f"openai/{OPENAI_MODEL}", messages=PROMPT)
    completion = raw.parse()
    assert raw.status_code == 200
    assert completion.choices[0].message.content == "Plain answer from llmock."
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.object == "chat.completion"
    assert rota_headers(raw.headers) == {
        "x-rota-provider": "openai", "x-rota-model": OPENAI_MODEL, "x-rota-profile": "openai:a", "x-rota-attempts": "1",
    }
    first_id = raw.headers["x-request-id"]

    stream = client.chat.completions.create(
        model=f"openai/{OPENAI_MODEL}", messages=PROMPT, stream=True, stream_options={"include_usage": True}
    )
    with stream:
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        assert rota_headers(stream.response.headers) == {
            "x-rota-provider": "openai", "x-rota-model": OPENAI_MODEL, "x-rota-profile": "openai:a", "x-rota-attempts": "1",
        }
        stream_id = stream.response.headers["x-request-id"]
        deltas, finish, usage = [], [], None
        for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    deltas.append(choice.delta.content)
                if choice.finish_reason:
                    finish.append(choice.finish_reason)
            usage = chunk.usage or usage
    assert len(deltas) > 1, deltas
    assert "".join(deltas) == "Streamed answer from llmock, in words."
    assert finish == ["stop"]
    assert usage is not None

    # What the upstream received: the upstream model id and key a, never the agent key.
    assert upstream_auth(gw.tap.requests()) == [
        ("/v1/chat/completions", f"Bearer {UPSTREAM_KEYS['openai:a']}", None),
        ("/v1/chat/completions", f"Bearer {UPSTREAM_KEYS['openai:a']}", None),
    ]
    assert_agent_key_stays_in_rota(gw)
    assert llmock_log(gw) == [
        ("/v1/chat/completions", OPENAI_MODEL, False, 200, None, None),
        ("/v1/chat/completions", OPENAI_MODEL, True, 200, None, None),
    ]

    # What rota recorded.
    req, att = gw.audit(first_id)
    assert request_row(req) == {
        "agent": "sdk", "api": "chat", "requested_model": f"openai/{OPENAI_MODEL}", "served_model": f"openai/{OPENAI_MODEL}",
        "served_profile": "openai:a", "status": 200, "attempts": 1, "stream": 0,
    }
    assert (req["tokens_in"], req["tokens_out"]) == (completion.usage.prompt_tokens, completion.usage.completion_tokens)
    assert attempt_rows(att) == [(1, "primary", "openai", OPENAI_MODEL, "openai:a", 200, "success", None, None)]
    req, att = gw.audit(stream_id)
    assert request_row(req) == {
        "agent": "sdk", "api": "chat", "requested_model": f"openai/{OPENAI_MODEL}", "served_model": f"openai/{OPENAI_MODEL}",
        "served_profile": "openai:a", "status": 200, "attempts": 1, "stream": 1,
    }
    assert (req["tokens_in"], req["tokens_out"]) == (usage.prompt_tokens, usage.completion_tokens)
    assert attempt_rows(att) == [(1, "primary", "openai", OPENAI_MODEL, "openai:a", 200, "success", None, None)]
    assert att[0]["ttfb_ms"] is not None


def test_anthropic_sdk_non_streaming_and_streaming(gateway: Gateway) -> None:
    gw = gateway
    client = anthropic_client(gw)
    gw.llmock.scenario(
        reply("Plain answer from llmock.", "anthropic"),
        reply("Streamed answer from llmock, in words.", "anthropic"),
        reply("Raw events from llmock.", "anthropic"),
    )

    raw = client.messages.with_raw_response.create(model=f"anthropic/{ANTHROPIC_MODEL}", max_tokens=64, messages=PROMPT)
    message = raw.parse()
    sdk_version_header = raw.http_request.headers["anthropic-version"]
    assert raw.status_code == 200
    assert [(b.type, b.text) for b in message.content] == [("text", "Plain answer from llmock.")]
    assert (message.type, message.role, message.stop_reason) == ("message", "assistant", "end_turn")
    assert rota_headers(raw.headers) == {
        "x-rota-provider": "anthropic", "x-rota-model": ANTHROPIC_MODEL, "x-rota-profile": "anthropic:a", "x-rota-attempts": "1",
    }
    first_id = raw.headers["x-request-id"]

    # The SDK's stream helper: text deltas, then the accumulated final message.
    with client.messages.stream(model=f"anthropic/{ANTHROPIC_MODEL}", max_tokens=64, messages=PROMPT) as stream:
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        assert rota_headers(stream.response.headers)["x-rota-profile"] == "anthropic:a"
        stream_id = stream.response.headers["x-request-id"]
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(texts) > 1, texts
    assert "".join(texts) == "Streamed answer from llmock, in words."
    assert [(b.type, b.text) for b in final.content] == [("text", "Streamed answer from llmock, in words.")]
    assert final.stop_reason == "end_turn"

    # `stream=True`: the raw event sequence goes through unchanged.
    events = client.messages.create(model=f"anthropic/{ANTHROPIC_MODEL}", max_tokens=64, messages=PROMPT, stream=True)
    with events:
        raw_stream_id = events.response.headers["x-request-id"]
        seen = list(events)
    kinds = [e.type for e in seen]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert "".join(e.delta.text for e in seen if e.type == "content_block_delta") == "Raw events from llmock."

    # Upstream: key a as x-api-key (an Anthropic API key), the SDK's anthropic-version, no agent key.
    tapped = gw.tap.requests()
    assert upstream_auth(tapped) == [("/anthropic/v1/messages", None, UPSTREAM_KEYS["anthropic:a"])] * 3
    assert [s.headers.get("anthropic-version") for s in tapped] == [sdk_version_header] * 3
    assert_agent_key_stays_in_rota(gw)
    assert llmock_log(gw) == [
        ("/anthropic/v1/messages", ANTHROPIC_MODEL, False, 200, None, None),
        ("/anthropic/v1/messages", ANTHROPIC_MODEL, True, 200, None, None),
        ("/anthropic/v1/messages", ANTHROPIC_MODEL, True, 200, None, None),
    ]

    for request_id, is_stream in ((first_id, 0), (stream_id, 1), (raw_stream_id, 1)):
        req, att = gw.audit(request_id)
        assert request_row(req) == {
            "agent": "sdk", "api": "messages", "requested_model": f"anthropic/{ANTHROPIC_MODEL}",
            "served_model": f"anthropic/{ANTHROPIC_MODEL}", "served_profile": "anthropic:a", "status": 200,
            "attempts": 1, "stream": is_stream,
        }
        assert attempt_rows(att) == [(1, "primary", "anthropic", ANTHROPIC_MODEL, "anthropic:a", 200, "success", None, None)]
    req, _ = gw.audit(first_id)
    assert (req["tokens_in"], req["tokens_out"]) == (message.usage.input_tokens, message.usage.output_tokens)
    req, _ = gw.audit(stream_id)
    assert (req["tokens_in"], req["tokens_out"]) == (final.usage.input_tokens, final.usage.output_tokens)


# -- faults ------------------------------------------------------------------------------------


RATE_LIMIT = {"type": "fail", "status": 429, "retry_after": 2, "times": 1, "match": {"provider": "openai"}}
OVERLOADED = {"type": "fail", "status": 529, "retry_after": 1, "times": 3, "match": {"provider": "anthropic"}}


def assert_rate_limit_rotation(gw: Gateway, request_id: str, stream: bool) -> None:
    """One request: key a got llmock's 429, rota rotated at once to key b, which served it."""
    tapped = gw.tap.requests()
    assert upstream_auth(tapped) == [
        ("/v1/chat/completions", f"Bearer {UPSTREAM_KEYS['openai:a']}", None),
        ("/v1/chat/completions", f"Bearer {UPSTREAM_KEYS['openai:b']}", None),
    ]
    assert tapped[0].body == tapped[1].body, "rota must resend the same request to the next key"
    log = gw.llmock.requests()
    assert [(r["path"], r["model"], r["stream"], r["status"], r["fault"], r["retry_after"]) for r in log] == [
        ("/v1/chat/completions", OPENAI_MODEL, stream, 429, "scenario:429", 2.0),
        ("/v1/chat/completions", OPENAI_MODEL, stream, 200, None, None),
    ]
    assert log[0]["fingerprint"] == log[1]["fingerprint"]
    assert gw.llmock.pending() == []

    req, att = gw.audit(request_id)
    assert request_row(req) == {
        "agent": "sdk", "api": "chat", "requested_model": f"openai/{OPENAI_MODEL}", "served_model": f"openai/{OPENAI_MODEL}",
        "served_profile": "openai:b", "status": 200, "attempts": 2, "stream": int(stream),
    }
    assert attempt_rows(att) == [
        (1, "primary", "openai", OPENAI_MODEL, "openai:a", 429, "failure", "rate_limit", 2000),
        (2, "rotate", "openai", OPENAI_MODEL, "openai:b", 200, "success", None, None),
    ]
    failed = att[0]
    # The provider's Retry-After (2 s) sets the cooldown, counted from when the failure was handled.
    assert failed["error"] == "Rate limit exceeded."
    earliest = failed["started_at"] + failed["duration_ms"] + 2000
    assert earliest <= failed["cooldown_until"] <= earliest + 1000, dict(failed)
    assert att[1]["cooldown_until"] is None
    assert att[1]["started_at"] >= failed["started_at"] + failed["duration_ms"]
    stats = gw.usage_stats("openai:a", lambda r: r["cooldown_reason"] is not None)
    assert (stats["cooldown_reason"], stats["cooldown_model"], stats["cooldown_until"]) == (
        "rate_limit", OPENAI_MODEL, failed["cooldown_until"],
    )
    assert json.loads(stats["failure_counts"]) == {"rate_limit": 1}


def assert_overloaded_rotation(gw: Gateway, request_id: str, stream: bool) -> None:
    """One request: key a got llmock's 529 three times (the first try and two same-profile retries),
    then rota rotated to key b, which served it."""
    a, b = UPSTREAM_KEYS["anthropic:a"], UPSTREAM_KEYS["anthropic:b"]
    tapped = gw.tap.requests()
    assert upstream_auth(tapped) == [("/anthropic/v1/messages", None, k) for k in (a, a, a, b)]
    assert all(s.body == tapped[0].body for s in tapped)
    log = gw.llmock.requests()
    assert [(r["path"], r["model"], r["stream"], r["status"], r["fault"], r["retry_after"]) for r in log] == [
        ("/anthropic/v1/messages", ANTHROPIC_MODEL, stream, 529, "scenario:529", 1.0),
        ("/anthropic/v1/messages", ANTHROPIC_MODEL, stream, 529, "scenario:529", 1.0),
        ("/anthropic/v1/messages", ANTHROPIC_MODEL, stream, 529, "scenario:529", 1.0),
        ("/anthropic/v1/messages", ANTHROPIC_MODEL, stream, 200, None, None),
    ]
    assert len({r["fingerprint"] for r in log}) == 1
    assert gw.llmock.pending() == []

    req, att = gw.audit(request_id)
    assert request_row(req) == {
        "agent": "sdk", "api": "messages", "requested_model": f"anthropic/{ANTHROPIC_MODEL}",
        "served_model": f"anthropic/{ANTHROPIC_MODEL}", "served_profile": "anthropic:b", "status": 200,
        "attempts": 4, "stream": int(stream),
    }
    m = ANTHROPIC_MODEL
    assert attempt_rows(att) == [
        (1, "primary", "anthropic", m, "anthropic:a", 529, "failure", "overloaded", 1000),
        (2, "retry", "anthropic", m, "anthropic:a", 529, "failure", "overloaded", 1000),
        (3, "retry", "anthropic", m, "anthropic:a", 529, "failure", "overloaded", 1000),
        (4, "rotate", "anthropic", m, "anthropic:b", 200, "success", None, None),
    ]
    assert [r["error"] for r in att] == ["Service overloaded."] * 3 + [None]
    # Only the failure that gives up on the profile sets its cooldown (the 1 s hint).
    assert [r["cooldown_until"] is None for r in att] == [True, True, False, True]
    last = att[2]
    earliest = last["started_at"] + last["duration_ms"] + 1000
    assert earliest <= last["cooldown_until"] <= earliest + 1000, dict(last)
    stats = gw.usage_stats("anthropic:a", lambda r: r["cooldown_reason"] is not None)
    assert (stats["cooldown_reason"], stats["cooldown_model"], stats["cooldown_until"]) == (
        "overloaded", ANTHROPIC_MODEL, last["cooldown_until"],
    )


def test_sdks_see_success_while_llmock_injects_429_and_529(gateway: Gateway) -> None:
    gw = gateway

    # OpenAI: a 429 with Retry-After on key a.
    gw.llmock.scenario(RATE_LIMIT, reply("Answer after a rate limit.", "openai"))
    raw = openai_client(gw).chat.completions.with_raw_response.create(model=f"openai/{OPENAI_MODEL}", messages=PROMPT)
    completion = raw.parse()
    assert raw.status_code == 200
    assert completion.choices[0].message.content == "Answer after a rate limit."
    assert rota_headers(raw.headers) == {
        "x-rota-provider": "openai", "x-rota-model": OPENAI_MODEL, "x-rota-profile": "openai:b", "x-rota-attempts": "2",
    }
    assert_rate_limit_rotation(gw, raw.headers["x-request-id"], stream=False)
    assert_agent_key_stays_in_rota(gw)

    # Anthropic: 529 overloaded, three times in a row, on key a.
    gw.llmock.reset()
    gw.tap.clear()
    gw.llmock.scenario(OVERLOADED, reply("Answer after overload.", "anthropic"))
    raw = anthropic_client(gw).messages.with_raw_response.create(
        model=f"anthropic/{ANTHROPIC_MODEL}", max_tokens=64, messages=PROMPT
    )
    message = raw.parse()
    assert raw.status_code == 200
    assert [(b.type, b.text) for b in message.content] == [("text", "Answer after overload.")]
    assert rota_headers(raw.headers) == {
        "x-rota-provider": "anthropic", "x-rota-model": ANTHROPIC_MODEL, "x-rota-profile": "anthropic:b",
        "x-rota-attempts": "4",
    }
    assert_overloaded_rotation(gw, raw.headers["x-request-id"], stream=False)
    assert_agent_key_stays_in_rota(gw)


def test_sdk_streams_see_success_while_llmock_injects_429_and_529(gateway: Gateway) -> None:
    """The same faults before the first event of a stream: rota has not committed yet, so it rotates."""
    gw = gateway

    gw.llmock.scenario(RATE_LIMIT, reply("Streamed after a rate limit.", "openai"))
    stream = openai_client(gw).chat.completions.create(model=f"openai/{OPENAI_MODEL}", messages=PROMPT, stream=True)
    with stream:
        assert rota_headers(stream.response.headers) == {
            "x-rota-provider": "openai", "x-rota-model": OPENAI_MODEL, "x-rota-profile": "openai:b", "x-rota-attempts": "2",
        }
        request_id = stream.response.headers["x-request-id"]
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Streamed after a rate limit."
    assert_rate_limit_rotation(gw, request_id, stream=True)

    gw.llmock.reset()
    gw.tap.clear()
    gw.llmock.scenario(OVERLOADED, reply("Streamed after overload.", "anthropic"))
    with anthropic_client(gw).messages.stream(
        model=f"anthropic/{ANTHROPIC_MODEL}", max_tokens=64, messages=PROMPT
    ) as stream:
        assert rota_headers(stream.response.headers) == {
            "x-rota-provider": "anthropic", "x-rota-model": ANTHROPIC_MODEL, "x-rota-profile": "anthropic:b",
            "x-rota-attempts": "4",
        }
        request_id = stream.response.headers["x-request-id"]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Streamed after overload."
    assert final.stop_reason == "end_turn"
    assert_overloaded_rotation(gw, request_id, stream=True)
    assert_agent_key_stays_in_rota(gw)
