"""Cross-format peer tests: an SDK of one wire format, served by a provider of the other.

    OpenAI SDK    --chat-->     rota --messages--> llmock /anthropic/v1/messages
    Anthropic SDK --messages--> rota --chat-->     llmock /v1/chat/completions

rota translates the request on the way up and the answer (or stream) on the way back
(src/gateway/translate, docs/translation.md). Each test checks three things: the SDK parses what rota
answers and sees exactly what llmock was told to say; the key tap shows the body rota sent
upstream, in the upstream's format and with the upstream's auth header; rota's audit rows.
The SDKs run with `max_retries=0`, as in test_sdks.py.
"""

from __future__ import annotations

import json

import openai
import pytest
from openai import omit
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ParsedChatCompletion

from conftest import ANTHROPIC_MODEL, OPENAI_MODEL, UPSTREAM_KEYS, Gateway
from test_sdks import (
    anthropic_client,
    assert_agent_key_stays_in_rota,
    attempt_rows,
    llmock_log,
    openai_client,
    reply,
    request_row,
    rota_headers,
    upstream_auth,
)

SYSTEM = "You are terse."
QUESTION = "Say something short."
CHAT_PROMPT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
MESSAGES_PROMPT = [{"role": "user", "content": QUESTION}]
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"  # what rota sends when the client (an OpenAI SDK) sent none
DEFAULT_MAX_TOKENS = 4096  # rota's max_tokens for a chat request that set none (Anthropic requires one)

ANTHROPIC_A = ("/anthropic/v1/messages", None, UPSTREAM_KEYS["anthropic:a"])
ANTHROPIC_B = ("/anthropic/v1/messages", None, UPSTREAM_KEYS["anthropic:b"])
OPENAI_A = ("/v1/chat/completions", f"Bearer {UPSTREAM_KEYS['openai:a']}", None)

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_DESCRIPTION = "Current weather in a city."
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": WEATHER_DESCRIPTION,
                                                 "parameters": WEATHER_SCHEMA}}]
MESSAGES_TOOLS = [{"name": "get_weather", "description": WEATHER_DESCRIPTION, "input_schema": WEATHER_SCHEMA}]
WEATHER_QUESTION = "What is the weather in Paris?"
TOOL_RESULT = "sunny, 21 C"


def tool_call(provider: str) -> dict:
    """An llmock behaviour: the next handled request of `provider` calls get_weather(city=Paris)."""
    return {"type": "reply", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}], "times": 1,
            "match": {"provider": provider}}


def stream_chat(client: openai.OpenAI, **params) -> tuple[str, list, ParsedChatCompletion]:
    """A streamed chat request: rota's request id, the chunks, and the completion the SDK's own
    accumulator builds from them (tool calls included)."""
    state = ChatCompletionStreamState(input_tools=params.get("tools", omit))
    events = client.chat.completions.create(**params, stream=True)
    with events:
        request_id = events.response.headers["x-request-id"]
        chunks = []
        for chunk in events:
            chunks.append(chunk)
            state.handle_chunk(chunk)
    return request_id, chunks, state.get_final_completion()


def bodies(gw: Gateway) -> list:
    return [s.body for s in gw.tap.requests()]


def assert_served(gw: Gateway, request_id: str, *, api: str, requested: str, profile: str, stream: bool,
                  tokens: tuple[int, int] | None) -> None:
    """One upstream attempt, a success, audited with the client's API and the serving provider."""
    req, att = gw.audit(request_id)
    assert request_row(req) == {
        "agent": "sdk", "api": api, "requested_model": requested, "served_model": requested,
        "served_profile": profile, "status": 200, "attempts": 1, "stream": int(stream),
    }
    provider, model = requested.split("/", 1)
    assert attempt_rows(att) == [(1, "primary", provider, model, profile, 200, "success", None, None)]
    if tokens is not None:
        assert (req["tokens_in"], req["tokens_out"]) == tokens


# -- 1. OpenAI SDK, Anthropic upstream -------------------------------------------------------------


def test_openai_sdk_served_by_an_anthropic_upstream(gateway: Gateway) -> None:
    gw = gateway
    client = openai_client(gw)
    model = f"anthropic/{ANTHROPIC_MODEL}"
    gw.llmock.scenario(
        reply("Plain answer from Claude.", "anthropic"),
        reply("Streamed answer from Claude, in words.", "anthropic"),
    )

    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=CHAT_PROMPT, temperature=0.5, stop="END"
    )
    completion = raw.parse()
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("application/json")
    assert rota_headers(raw.headers) == {
        "x-rota-provider": "anthropic", "x-rota-model": ANTHROPIC_MODEL, "x-rota-profile": "anthropic:a",
        "x-rota-attempts": "1",
    }
    assert completion.object == "chat.completion"
    assert completion.model == ANTHROPIC_MODEL
    assert completion.id.startswith("msg_")  # the Anthropic message id, kept
    assert len(completion.choices) == 1
    choice = completion.choices[0]
    assert (choice.index, choice.message.role, choice.message.content) == (0, "assistant", "Plain answer from Claude.")
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    usage = completion.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    first_id = raw.headers["x-request-id"]

    stream = client.chat.completions.create(
        model=model, messages=CHAT_PROMPT, max_completion_tokens=64, stream=True,
        stream_options={"include_usage": True},
    )
    with stream:
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        assert rota_headers(stream.response.headers) == {
            "x-rota-provider": "anthropic", "x-rota-model": ANTHROPIC_MODEL, "x-rota-profile": "anthropic:a",
            "x-rota-attempts": "1",
        }
        stream_id = stream.response.headers["x-request-id"]
        chunks = list(stream)
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert {c.model for c in chunks} == {ANTHROPIC_MODEL}
    assert len({c.id for c in chunks}) == 1
    roles = [ch.delta.role for c in chunks for ch in c.choices if ch.delta.role]
    deltas = [ch.delta.content for c in chunks for ch in c.choices if ch.delta.content]
    finish = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    usages = [c.usage for c in chunks if c.usage is not None]
    assert roles == ["assistant"]
    assert len(deltas) > 1, deltas
    assert "".join(deltas) == "Streamed answer from Claude, in words."
    assert finish == ["stop"]
    assert len(usages) == 1 and chunks[-1].choices == [] and chunks[-1].usage is usages[0]
    stream_usage = usages[0]
    assert stream_usage.total_tokens == stream_usage.prompt_tokens + stream_usage.completion_tokens

    # Upstream: Anthropic's path and auth (x-api-key, anthropic-version), an Anthropic body.
    tapped = gw.tap.requests()
    assert upstream_auth(tapped) == [ANTHROPIC_A, ANTHROPIC_A]
    assert [s.headers.get("anthropic-version") for s in tapped] == [DEFAULT_ANTHROPIC_VERSION] * 2
    anthropic_messages = [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]
    assert bodies(gw) == [
        {"model": ANTHROPIC_MODEL, "system": SYSTEM, "messages": anthropic_messages, "max_tokens": DEFAULT_MAX_TOKENS,
         "temperature": 0.5, "stop_sequences": ["END"]},
        {"model": ANTHROPIC_MODEL, "system": SYSTEM, "messages": anthropic_messages, "max_tokens": 64, "stream": True},
    ]
    assert_agent_key_stays_in_rota(gw)
    assert llmock_log(gw) == [
        ("/anthropic/v1/messages", ANTHROPIC_MODEL, False, 200, None, None),
        ("/anthropic/v1/messages", ANTHROPIC_MODEL, True, 200, None, None),
    ]

    assert_served(gw, first_id, api="chat", requested=model, profile="anthropic:a", stream=False,
                  tokens=(usage.prompt_tokens, usage.completion_tokens))
    assert_served(gw, stream_id, api="chat", requested=model, profile="anthropic:a", stream=True,
                  tokens=(stream_usage.prompt_tokens, stream_usage.completion_tokens))

    # A stream without `stream_options`: the client asked for no usage chunk, so OpenAI sends
    # none and every chunk carries its one choice. The loop of OpenAI's own streaming example,
    # `chunk.choices[0].delta.content`, relies on it (it works against an OpenAI upstream).
    gw.llmock.scenario(reply("Docs-style loop.", "anthropic"))
    stream = client.chat.completions.create(model=model, messages=CHAT_PROMPT, stream=True)
    with stream:
        chunks = list(stream)
    assert "".join(ch.delta.content or "" for c in chunks for ch in c.choices) == "Docs-style loop."
    assert gw.tap.requests()[-1].body == {
        "model": ANTHROPIC_MODEL, "system": SYSTEM, "messages": anthropic_messages, "max_tokens": DEFAULT_MAX_TOKENS,
        "stream": True,
    }
    unasked = [c.model_dump(exclude_unset=True) for c in chunks if len(c.choices) != 1]
    assert unasked == [], "chunks without exactly one choice, though the client asked for no usage chunk"


# -- 2. Anthropic SDK, OpenAI upstream -------------------------------------------------------------


def test_anthropic_sdk_served_by_an_openai_upstream(gateway: Gateway) -> None:
    gw = gateway
    client = anthropic_client(gw)
    model = f"openai/{OPENAI_MODEL}"
    gw.llmock.scenario(
        reply("Plain answer from GPT.", "openai"),
        reply("Streamed answer from GPT, in words.", "openai"),
        reply("Raw events from GPT.", "openai"),
    )
    params = dict(model=model, max_tokens=64, system=SYSTEM, messages=MESSAGES_PROMPT)

    # This SDK version has no `temperature` argument: extra_body sends it as a client would.
    raw = client.messages.with_raw_response.create(**params, stop_sequences=["END"], extra_body={"temperature": 0.5})
    message = raw.parse()
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("application/json")
    assert rota_headers(raw.headers) == {
        "x-rota-provider": "openai", "x-rota-model": OPENAI_MODEL, "x-rota-profile": "openai:a", "x-rota-attempts": "1",
    }
    assert (message.type, message.role, message.model) == ("message", "assistant", OPENAI_MODEL)
    assert message.id.startswith("chatcmpl-")  # the OpenAI completion id, kept
    assert [(b.type, b.text) for b in message.content] == [("text", "Plain answer from GPT.")]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    first_id = raw.headers["x-request-id"]

    # The SDK's stream helper: text deltas, then the accumulated final message.
    with client.messages.stream(**params) as stream:
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        assert rota_headers(stream.response.headers)["x-rota-provider"] == "openai"
        stream_id = stream.response.headers["x-request-id"]
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(texts) > 1, texts
    assert "".join(texts) == "Streamed answer from GPT, in words."
    assert (final.type, final.role, final.model) == ("message", "assistant", OPENAI_MODEL)
    assert [(b.type, b.text) for b in final.content] == [("text", "Streamed answer from GPT, in words.")]
    assert final.stop_reason == "end_turn"

    # `stream=True`: the raw event sequence, in Anthropic's order.
    events = client.messages.create(**params, stream=True)
    with events:
        raw_stream_id = events.response.headers["x-request-id"]
        seen = list(events)
    kinds = [e.type for e in seen]
    assert kinds[:2] == ["message_start", "content_block_start"], kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
    assert set(kinds[2:-3]) == {"content_block_delta"}, kinds
    assert seen[1].content_block.type == "text" and seen[1].index == 0
    assert "".join(e.delta.text for e in seen if e.type == "content_block_delta") == "Raw events from GPT."
    assert seen[-2].delta.stop_reason == "end_turn"

    # Upstream: OpenAI's path and Bearer auth, an OpenAI chat body (system as the first message).
    tapped = gw.tap.requests()
    assert upstream_auth(tapped) == [OPENAI_A] * 3
    chat_messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    streamed = {"model": OPENAI_MODEL, "messages": chat_messages, "max_tokens": 64, "stream": True,
                "stream_options": {"include_usage": True}}
    assert bodies(gw) == [
        {"model": OPENAI_MODEL, "messages": chat_messages, "max_tokens": 64, "temperature": 0.5, "stop": ["END"]},
        streamed,
        streamed,
    ]
    assert_agent_key_stays_in_rota(gw)
    assert llmock_log(gw) == [
        ("/v1/chat/completions", OPENAI_MODEL, False, 200, None, None),
        ("/v1/chat/completions", OPENAI_MODEL, True, 200, None, None),
        ("/v1/chat/completions", OPENAI_MODEL, True, 200, None, None),
    ]

    assert_served(gw, first_id, api="messages", requested=model, profile="openai:a", stream=False,
                  tokens=(message.usage.input_tokens, message.usage.output_tokens))
    assert_served(gw, raw_stream_id, api="messages", requested=model, profile="openai:a", stream=True, tokens=None)
    # The streamed message's usage: the upstream reported both counts (its usage chunk), so the
    # Anthropic client must see both (message_start or message_delta may carry input_tokens).
    req, _ = gw.audit(stream_id)
    assert_served(gw, stream_id, api="messages", requested=model, profile="openai:a", stream=True, tokens=None)
    assert req["tokens_in"] > 0 and req["tokens_out"] > 0
    assert (final.usage.input_tokens, final.usage.output_tokens) == (req["tokens_in"], req["tokens_out"])


# -- 3. Tool calls across formats ------------------------------------------------------------------


def test_tool_call_round_trip_across_formats(gateway: Gateway) -> None:
    """OpenAI SDK ⇄ Anthropic upstream, then Anthropic SDK ⇄ OpenAI upstream: a tool call with
    its id, name and JSON arguments, the tool result sent back under the same id, a text answer."""
    gw = gateway

    # OpenAI SDK, Anthropic upstream.
    client = openai_client(gw)
    model = f"anthropic/{ANTHROPIC_MODEL}"
    gw.llmock.scenario(tool_call("anthropic"), reply("It is sunny in Paris.", "anthropic"))
    ask = [{"role": "user", "content": WEATHER_QUESTION}]
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=ask, tools=CHAT_TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    first = raw.parse()
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.id.startswith("toolu_")  # Anthropic's tool_use id, kept
    assert (call.type, call.function.name) == ("function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert_served(gw, raw.headers["x-request-id"], api="chat", requested=model, profile="anthropic:a",
                  stream=False, tokens=None)

    answer_messages = ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": call.function.arguments}},
        ]},
        {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT},
    ]
    second = client.chat.completions.create(model=model, messages=answer_messages, tools=CHAT_TOOLS)
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].finish_reason == "stop"

    anthropic_ask = [{"role": "user", "content": [{"type": "text", "text": WEATHER_QUESTION}]}]
    assert bodies(gw) == [
        {"model": ANTHROPIC_MODEL, "messages": anthropic_ask, "max_tokens": DEFAULT_MAX_TOKENS,
         "tools": MESSAGES_TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}},
        {"model": ANTHROPIC_MODEL, "max_tokens": DEFAULT_MAX_TOKENS, "tools": MESSAGES_TOOLS, "messages": anthropic_ask + [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": call.id, "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": TOOL_RESULT}]},
        ]},
    ]
    assert upstream_auth(gw.tap.requests()) == [ANTHROPIC_A] * 2

    # The same, streamed; the SDK's own accumulator (ChatCompletionStreamState) rebuilds the call.
    gw.tap.clear()
    gw.llmock.reset()
    gw.llmock.scenario(tool_call("anthropic"), reply("Streamed: sunny in Paris.", "anthropic"))
    request_id, chunks, final = stream_chat(client, model=model, messages=ask, tools=CHAT_TOOLS)
    argument_deltas = [
        tc.function.arguments
        for chunk in chunks
        for ch in chunk.choices
        for tc in ch.delta.tool_calls or []
        if tc.function and tc.function.arguments
    ]
    assert len(argument_deltas) > 1, argument_deltas  # llmock streams the arguments in fragments
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    scall = choice.message.tool_calls[0]
    assert scall.id.startswith("toolu_") and scall.id != call.id
    assert (scall.type, scall.function.name) == ("function", "get_weather")
    assert json.loads(scall.function.arguments) == {"city": "Paris"}
    assert_served(gw, request_id, api="chat", requested=model, profile="anthropic:a", stream=True, tokens=None)

    streamed_answer = ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": scall.id, "type": "function", "function": {"name": "get_weather", "arguments": scall.function.arguments}},
        ]},
        {"role": "tool", "tool_call_id": scall.id, "content": TOOL_RESULT},
    ]
    _, _, final = stream_chat(client, model=model, messages=streamed_answer, tools=CHAT_TOOLS)
    assert final.choices[0].message.content == "Streamed: sunny in Paris."
    assert final.choices[0].finish_reason == "stop"
    sent = bodies(gw)
    assert [b["stream"] for b in sent] == [True, True]
    assert sent[1]["messages"][1:] == [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": scall.id, "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": scall.id, "content": TOOL_RESULT}]},
    ]

    # Anthropic SDK, OpenAI upstream.
    gw.tap.clear()
    gw.llmock.reset()
    client = anthropic_client(gw)
    model = f"openai/{OPENAI_MODEL}"
    gw.llmock.scenario(tool_call("openai"), reply("It is sunny in Paris.", "openai"))
    ask = [{"role": "user", "content": WEATHER_QUESTION}]
    raw = client.messages.with_raw_response.create(
        model=model, max_tokens=256, messages=ask, tools=MESSAGES_TOOLS, tool_choice={"type": "any"}
    )
    first = raw.parse()
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["tool_use"]
    use = first.content[0]
    assert use.id.startswith("call_")  # OpenAI's tool call id, kept
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert_served(gw, raw.headers["x-request-id"], api="messages", requested=model, profile="openai:a",
                  stream=False, tokens=None)

    answer_messages = ask + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": TOOL_RESULT}]},
    ]
    second = client.messages.create(model=model, max_tokens=256, messages=answer_messages, tools=MESSAGES_TOOLS)
    assert [(b.type, b.text) for b in second.content] == [("text", "It is sunny in Paris.")]
    assert second.stop_reason == "end_turn"

    sent = bodies(gw)
    assert upstream_auth(gw.tap.requests()) == [OPENAI_A] * 2
    assert sent[0] == {"model": OPENAI_MODEL, "max_tokens": 256, "messages": ask, "tools": CHAT_TOOLS,
                       "tool_choice": "required"}
    assert {k: v for k, v in sent[1].items() if k != "messages"} == {
        "model": OPENAI_MODEL, "max_tokens": 256, "tools": CHAT_TOOLS,
    }
    sent_call = sent[1]["messages"][1]["tool_calls"][0]
    assert json.loads(sent_call["function"]["arguments"]) == {"city": "Paris"}
    assert sent[1]["messages"] == ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": use.id, "type": "function", "function": {"name": "get_weather", "arguments": sent_call["function"]["arguments"]}},
        ]},
        {"role": "tool", "tool_call_id": use.id, "content": TOOL_RESULT},
    ]

    # The same, streamed, through the Anthropic SDK's stream helper (it parses the partial JSON).
    gw.tap.clear()
    gw.llmock.reset()
    gw.llmock.scenario(tool_call("openai"), reply("Streamed: sunny in Paris.", "openai"))
    with client.messages.stream(model=model, max_tokens=256, messages=ask, tools=MESSAGES_TOOLS) as stream:
        request_id = stream.response.headers["x-request-id"]
        events = list(stream)
        final = stream.get_final_message()
    partial = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(partial) > 1, partial
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["tool_use"]
    suse = final.content[0]
    assert suse.id.startswith("call_") and suse.id != use.id
    assert (suse.name, suse.input) == ("get_weather", {"city": "Paris"})
    assert_served(gw, request_id, api="messages", requested=model, profile="openai:a", stream=True, tokens=None)

    streamed_answer = ask + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": suse.id, "name": suse.name, "input": suse.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": suse.id, "content": TOOL_RESULT}]},
    ]
    with client.messages.stream(model=model, max_tokens=256, messages=streamed_answer, tools=MESSAGES_TOOLS) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Streamed: sunny in Paris."
    assert final.stop_reason == "end_turn"
    sent = bodies(gw)
    assert [(b["stream"], b["stream_options"]) for b in sent] == [(True, {"include_usage": True})] * 2
    assert [m["role"] for m in sent[1]["messages"]] == ["user", "assistant", "tool"]
    assert sent[1]["messages"][1]["tool_calls"][0]["id"] == suse.id
    assert json.loads(sent[1]["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert sent[1]["messages"][2] == {"role": "tool", "tool_call_id": suse.id, "content": TOOL_RESULT}
    assert_agent_key_stays_in_rota(gw)


# -- 4. Failover across formats --------------------------------------------------------------------


OVERLOADED_EVERY_ANTHROPIC_TRY = {
    # Three tries (the first and two same-profile retries) on each of the two Anthropic keys.
    "type": "fail", "status": 529, "retry_after": 1, "times": 6, "match": {"provider": "anthropic"},
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_anthropic_529_fails_over_to_openai_for_an_openai_sdk(gateway: Gateway, stream: bool) -> None:
    gw = gateway
    client = openai_client(gw)
    gw.llmock.scenario(OVERLOADED_EVERY_ANTHROPIC_TRY, reply("Served by the fallback.", "openai"))
    fallback = {"x-rota-fallbacks": f"openai/{OPENAI_MODEL}"}
    model = f"anthropic/{ANTHROPIC_MODEL}"

    if stream:
        events = client.chat.completions.create(model=model, messages=CHAT_PROMPT, stream=True, extra_headers=fallback)
        with events:
            headers = events.response.headers
            chunks = list(events)
        text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
        assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["stop"]
        assert {c.model for c in chunks} == {OPENAI_MODEL}
    else:
        raw = client.chat.completions.with_raw_response.create(model=model, messages=CHAT_PROMPT, extra_headers=fallback)
        completion = raw.parse()
        headers = raw.headers
        assert raw.status_code == 200
        assert completion.object == "chat.completion"
        assert completion.model == OPENAI_MODEL
        text = completion.choices[0].message.content
        assert completion.choices[0].finish_reason == "stop"
    assert text == "Served by the fallback."
    assert rota_headers(headers) == {
        "x-rota-provider": "openai", "x-rota-model": OPENAI_MODEL, "x-rota-profile": "openai:a", "x-rota-attempts": "7",
    }

    # Upstream: six translated Anthropic calls (keys a, a, a, b, b, b), then the client's own
    # OpenAI body, untranslated, to the OpenAI fallback.
    tapped = gw.tap.requests()
    assert upstream_auth(tapped) == [ANTHROPIC_A] * 3 + [ANTHROPIC_B] * 3 + [OPENAI_A]
    translated = {"model": ANTHROPIC_MODEL, "system": SYSTEM, "max_tokens": DEFAULT_MAX_TOKENS,
                  "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]}
    original = {"model": OPENAI_MODEL, "messages": CHAT_PROMPT}
    if stream:
        translated["stream"] = original["stream"] = True
    assert bodies(gw) == [translated] * 6 + [original]
    assert_agent_key_stays_in_rota(gw)
    assert llmock_log(gw) == [("/anthropic/v1/messages", ANTHROPIC_MODEL, stream, 529, "scenario:529", 1.0)] * 6 + [
        ("/v1/chat/completions", OPENAI_MODEL, stream, 200, None, None),
    ]
    assert gw.llmock.pending() == []

    req, att = gw.audit(headers["x-request-id"])
    assert request_row(req) == {
        "agent": "sdk", "api": "chat", "requested_model": model, "served_model": f"openai/{OPENAI_MODEL}",
        "served_profile": "openai:a", "status": 200, "attempts": 7, "stream": int(stream),
    }
    m = ANTHROPIC_MODEL
    assert attempt_rows(att) == [
        (1, "primary", "anthropic", m, "anthropic:a", 529, "failure", "overloaded", 1000),
        (2, "retry", "anthropic", m, "anthropic:a", 529, "failure", "overloaded", 1000),
        (3, "retry", "anthropic", m, "anthropic:a", 529, "failure", "overloaded", 1000),
        (4, "rotate", "anthropic", m, "anthropic:b", 529, "failure", "overloaded", 1000),
        (5, "retry", "anthropic", m, "anthropic:b", 529, "failure", "overloaded", 1000),
        (6, "retry", "anthropic", m, "anthropic:b", 529, "failure", "overloaded", 1000),
        (7, "fallback", "openai", OPENAI_MODEL, "openai:a", 200, "success", None, None),
    ]
    assert [r["error"] for r in att] == ["Service overloaded."] * 6 + [None]
    # Each key is cooled by the failure that gives up on it (the third), not by the retries.
    assert [r["cooldown_until"] is None for r in att] == [True, True, False, True, True, False, True]
