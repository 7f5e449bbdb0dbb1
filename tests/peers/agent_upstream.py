"""agent_upstream: a scripted LLM upstream for the coding agents of test_agents.py.

It speaks the three wire formats rota's providers use, buffered and streamed, with the SSE events
the real APIs write:

    POST /<flavor>/v1/messages           Anthropic messages   (flavor: anthropic)
    POST /<flavor>/v1/chat/completions   OpenAI chat          (flavor: openai, chat)
    POST /<flavor>/v1/responses          OpenAI Responses     (flavor: openai, responses)

The first path segment is the flavor of upstream the provider's `base_url` points at, and says
which formats it takes: `chat` is an OpenAI-compatible server without the Responses API,
`responses` one without chat completions; anything else gets the 404 such a server answers.

Every answer follows one script, the same in each format:

1. the last user turn holds a tool result: text quoting the tool's output,
   "The file says: <its last non-empty line>" (the last line, because Codex's exec_command wraps
   the command's output in a header of its own, and Claude Code's Read numbers the lines);
2. else the request offers a tool that can read a file (Claude Code's `Read`, Codex's
   `exec_command` or `shell`, a function tool named like `read_file`) and the last user turn says
   "read the file PATH": one call of that tool, with the arguments its own schema asks for;
3. else plain text, "Hello from <model>." (REPLY).

Streams go out in one of the write modes of chunky.py, set per upstream (`mode`): `whole` (the
answer in one write) or `bytes` (a few bytes per write, events and chunk heads split anywhere).
Streams are chunked, as the real APIs send them; buffered answers carry a Content-Length; every
answer closes its connection. A key told to `rate_limit(key, retry_after)` gets 429 with
`retry-after` in its format's error shape until `heal(key)`. Every request is recorded
(`requests()`): path, headers (so the API key), parsed body, and what was answered.

Everything listens on 127.0.0.1; the accept loop, connection threads and `close()` are chunky's.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from chunky import BYTE_PAUSE_S, BYTES_PER_WRITE, Chunky

MODES = ("whole", "bytes")
FLAVORS = {
    "anthropic": {"messages"},
    "openai": {"chat", "responses"},
    "chat": {"chat"},
    "responses": {"responses"},
}
REPLY = "Hello from {model}."
QUOTE = "The file says: {line}"
READ_REQUEST = re.compile(r"read the file (\S+)", re.IGNORECASE)
# Tools that read a file, by preference; then any function tool whose name says it reads.
READ_TOOLS = ("Read", "read_file", "exec_command", "shell", "shell_command")
OUTPUT_TOKENS = 11
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests"}


@dataclass
class Seen:
    """One request the upstream received, and what it answered."""

    method: str
    path: str  # without the query
    query: str
    api: str | None  # messages | chat | responses
    headers: dict[str, str]  # lower-case names
    key: str | None  # x-api-key, or the Bearer token
    body: Any
    status: int = 0
    answer: str = ""  # text | tool_call | tool_result_quote | error
    tool: str | None = None  # the tool called, for answer == tool_call
    usage: tuple[int, int] | None = None  # (input, output) tokens reported
    stream: bool = False


@dataclass
class Turn:
    """What the script decided for one request."""

    kind: str  # text | tool_call | tool_result_quote
    text: str = ""
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


class AgentUpstream(Chunky):
    """The scripted upstream. `port` is where it listens on 127.0.0.1."""

    def __init__(self, mode: str = "whole", seed: int = 0) -> None:
        assert mode in MODES, mode
        self.mode = mode
        self._seen: list[Seen] = []
        self._limited: dict[str, int] = {}
        self._ids = itertools.count(1)
        super().__init__(seed=seed)

    # -- the test's handles ----------------------------------------------------------------------

    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()

    def rate_limit(self, key: str, retry_after: int = 30) -> None:
        """Requests with `key` get 429 and `retry-after: <retry_after>` until heal(key)."""
        with self._lock:
            self._limited[key] = retry_after

    def heal(self, key: str) -> None:
        with self._lock:
            self._limited.pop(key, None)

    # -- serving (chunky's accept loop and connection threads call this) -------------------------

    def _answer(self, conn: socket.socket, method: str, target: str, headers: dict[str, str], body: bytes,
                rng: random.Random) -> None:
        path, _, query = target.partition("?")
        key = headers.get("x-api-key")
        if key is None and headers.get("authorization", "").lower().startswith("bearer "):
            key = headers["authorization"][len("bearer "):].strip()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        api = ("messages" if path.endswith("/v1/messages") else "chat" if path.endswith("/chat/completions")
               else "responses" if path.endswith("/responses") else None)
        seen = Seen(method, path, query, api, dict(headers), key, parsed,
                    stream=isinstance(parsed, dict) and parsed.get("stream") is True)
        with self._lock:
            self._seen.append(seen)
            retry_after = self._limited.get(key or "")
            n = next(self._ids)
        flavor = path.strip("/").split("/", 1)[0]
        fmt = "anthropic" if api == "messages" else "openai"

        if method != "POST" or api is None or api not in FLAVORS.get(flavor, ()):
            seen.status, seen.answer = 404, "error"
            conn.sendall(error_response(404, fmt, "not_found_error", f"no route {method} {path} on a {flavor} server"))
            return
        if not key:
            seen.status, seen.answer = 401, "error"
            conn.sendall(error_response(401, fmt, "authentication_error", "no API key"))
            return
        if not isinstance(parsed, dict) or not isinstance(parsed.get("model"), str):
            seen.status, seen.answer = 400, "error"
            conn.sendall(error_response(400, fmt, "invalid_request_error", "a JSON body with a model is required"))
            return
        if retry_after is not None:
            seen.status, seen.answer = 429, "error"
            conn.sendall(error_response(429, fmt, "rate_limit_error", "Rate limit reached for requests.",
                                        {"retry-after": str(retry_after)}))
            return

        turn = decide(api, parsed)
        usage = (input_tokens(body), OUTPUT_TOKENS)
        seen.status, seen.answer, seen.tool, seen.usage = 200, turn.kind, turn.tool, usage
        model = parsed["model"]
        if not seen.stream:
            payload = {"messages": anthropic_message, "chat": chat_completion, "responses": responses_object}[api](
                n, model, turn, usage)
            conn.sendall(json_response(200, payload, request_id_header(api, n)))
            return
        events = {"messages": anthropic_stream, "chat": chat_stream, "responses": responses_stream}[api](
            n, model, turn, usage, parsed)
        head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
                + request_id_header(api, n).encode() + b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
        # One chunk per event, as a server that flushes each event writes them.
        wire = head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
        if self.mode == "whole":
            conn.sendall(wire)
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        at = 0
        while at < len(wire):
            step = rng.randint(*BYTES_PER_WRITE)
            conn.sendall(wire[at:at + step])
            at += step
            time.sleep(BYTE_PAUSE_S)


# -- the script ----------------------------------------------------------------------------------


def decide(api: str, body: dict) -> Turn:
    model = body["model"]
    result = last_tool_result(api, body)
    if result is not None:
        return Turn("tool_result_quote", QUOTE.format(line=last_line(result)))
    path = requested_file(last_user_text(api, body))
    if path is not None:
        tools = offered_tools(api, body)
        for name in [*READ_TOOLS, *(n for n in tools if "read" in n.lower())]:
            if name in tools:
                args = read_arguments(tools[name], path)
                if args is not None:
                    return Turn("tool_call", tool=name, arguments=args)
    return Turn("text", REPLY.format(model=model))


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or a list of parts with `text` (or `output`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text_of(p.get("text", p.get("content", p.get("output", "")))) if isinstance(p, dict)
                         else str(p) for p in content)
    return "" if content is None else str(content)


def last_tool_result(api: str, body: dict) -> str | None:
    """The tool output the last user turn carries, or None."""
    if api == "messages":
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        if not users or not isinstance(users[-1].get("content"), list):
            return None
        results = [b for b in users[-1]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
        return "\n".join(text_of(b.get("content")) for b in results) if results else None
    if api == "chat":
        for m in reversed(body.get("messages", [])):
            if m.get("role") in ("system", "developer"):
                continue
            return text_of(m.get("content")) if m.get("role") == "tool" else None
        return None
    items = body.get("input")
    if not isinstance(items, list):
        return None
    for item in reversed(items):
        if item.get("role") in ("system", "developer"):
            continue
        if item.get("type") in ("function_call_output", "custom_tool_call_output"):
            return text_of(item.get("output"))
        return None
    return None


def last_user_text(api: str, body: dict) -> str:
    if api == "responses":
        items = body.get("input")
        if isinstance(items, str):
            return items
        users = [i for i in items or [] if i.get("role") == "user"]
    else:
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return text_of(users[-1].get("content")) if users else ""


def requested_file(text: str) -> str | None:
    m = READ_REQUEST.search(text)
    return m.group(1).rstrip(".,;:!?'\"`)") if m else None


def last_line(output: str) -> str:
    """The output's last non-empty line, without system reminders or `cat -n` line numbers."""
    output = re.sub(r"<system-reminder>.*?</system-reminder>", "", output, flags=re.DOTALL)
    lines = [re.sub(r"^\s*\d+(?:\t|→|$)", "", line).strip() for line in output.splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else ""


def offered_tools(api: str, body: dict) -> dict[str, dict]:
    """Function tools offered, name -> JSON schema of their arguments."""
    tools: dict[str, dict] = {}
    for t in body.get("tools") or []:
        if not isinstance(t, dict):
            continue
        if api == "messages" and "input_schema" in t:
            tools[t["name"]] = t["input_schema"]
        elif api == "chat" and t.get("type") == "function":
            tools[t["function"]["name"]] = t["function"].get("parameters") or {}
        elif api == "responses" and t.get("type") == "function":
            tools[t["name"]] = t.get("parameters") or {}
    return tools


def read_arguments(schema: dict, path: str) -> dict | None:
    """Arguments that make a tool with this schema read `path`: a path property, or a command."""
    props = schema.get("properties") or {}
    for name in ("file_path", "path", "filename", "file"):
        if name in props:
            return {name: path}
    for name in ("cmd", "command"):
        if name in props:
            kind = props[name].get("type")
            return {name: ["cat", path] if kind == "array" else f"cat {path}"}
    return None


def input_tokens(body: bytes) -> int:
    """Deterministic, and different for different requests: the tests compare it with rota's."""
    return 100 + len(body) // 64


def request_id_header(api: str, n: int) -> str:
    return f"request-id: req_upstream_{n:04d}\r\n" if api == "messages" else f"x-request-id: req_upstream_{n:04d}\r\n"


def json_response(status: int, payload: object, extra_head: str = "") -> bytes:
    body = json.dumps(payload).encode()
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\ncontent-type: application/json\r\n{extra_head}"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def error_response(status: int, fmt: str, kind: str, message: str, headers: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    if fmt == "anthropic":
        payload = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        code = {429: "rate_limit_exceeded", 404: "not_found", 401: "invalid_api_key"}.get(status)
        payload = {"error": {"message": message, "type": "requests" if status == 429 else kind, "param": None,
                             "code": code}}
    return json_response(status, payload, extra)


def pieces(text: str, n: int = 3) -> list[str]:
    """Text cut into about n deltas (never an empty one)."""
    step = max(1, -(-len(text) // n))
    return [text[i:i + step] for i in range(0, len(text), step)] or [""]


def sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def call_id(n: int, prefix: str) -> str:
    return f"{prefix}{uuid.UUID(int=n).hex[-24:]}"


# -- Anthropic messages --------------------------------------------------------------------------


def anthropic_blocks(n: int, turn: Turn) -> list[dict]:
    if turn.kind == "tool_call":
        return [{"type": "text", "text": "I'll read it."},
                {"type": "tool_use", "id": call_id(n, "toolu_"), "name": turn.tool, "input": turn.arguments}]
    return [{"type": "text", "text": turn.text}]


def anthropic_usage(usage: tuple[int, int]) -> dict:
    return {"input_tokens": usage[0], "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens": usage[1], "service_tier": "standard"}


def anthropic_message(n: int, model: str, turn: Turn, usage: tuple[int, int]) -> dict:
    return {"id": call_id(n, "msg_"), "type": "message", "role": "assistant", "model": model,
            "content": anthropic_blocks(n, turn), "stop_reason": "tool_use" if turn.kind == "tool_call" else "end_turn",
            "stop_sequence": None, "usage": anthropic_usage(usage)}


def anthropic_stream(n: int, model: str, turn: Turn, usage: tuple[int, int], _body: dict) -> list[bytes]:
    start_usage = anthropic_usage((usage[0], 1))
    events = [sse("message_start", {"type": "message_start", "message": {
        "id": call_id(n, "msg_"), "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": start_usage}})]
    for index, block in enumerate(anthropic_blocks(n, turn)):
        if block["type"] == "text":
            events.append(sse("content_block_start", {"type": "content_block_start", "index": index,
                                                      "content_block": {"type": "text", "text": ""}}))
            if index == 0:
                events.append(sse("ping", {"type": "ping"}))
            for piece in pieces(block["text"]):
                events.append(sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                          "delta": {"type": "text_delta", "text": piece}}))
        else:
            events.append(sse("content_block_start", {"type": "content_block_start", "index": index,
                                                      "content_block": {**block, "input": {}}}))
            for piece in pieces(json.dumps(block["input"])):
                events.append(sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                          "delta": {"type": "input_json_delta", "partial_json": piece}}))
        events.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(sse("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use" if turn.kind == "tool_call" else "end_turn", "stop_sequence": None},
        "usage": {"input_tokens": usage[0], "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                  "output_tokens": usage[1]}}))
    events.append(sse("message_stop", {"type": "message_stop"}))
    return events


# -- OpenAI chat completions ---------------------------------------------------------------------

CREATED = 1764763200


def chat_usage(usage: tuple[int, int]) -> dict:
    return {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": usage[0] + usage[1],
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}


def chat_completion(n: int, model: str, turn: Turn, usage: tuple[int, int]) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None, "annotations": []}
    if turn.kind == "tool_call":
        message["tool_calls"] = [{"id": call_id(n, "call_"), "type": "function",
                                  "function": {"name": turn.tool, "arguments": json.dumps(turn.arguments)}}]
    else:
        message["content"] = turn.text
    return {"id": call_id(n, "chatcmpl-"), "object": "chat.completion", "created": CREATED, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if turn.kind == "tool_call" else "stop"}],
            "usage": chat_usage(usage), "service_tier": "default", "system_fingerprint": "fp_agent_upstream"}


def chat_stream(n: int, model: str, turn: Turn, usage: tuple[int, int], body: dict) -> list[bytes]:
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    base = {"id": call_id(n, "chatcmpl-"), "object": "chat.completion.chunk", "created": CREATED, "model": model,
            "service_tier": "default", "system_fingerprint": "fp_agent_upstream"}

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        data = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            data["usage"] = None
        return sse(None, data)

    if turn.kind == "tool_call":
        events = [chunk({"role": "assistant", "content": None, "refusal": None})]
        events.append(chunk({"tool_calls": [{"index": 0, "id": call_id(n, "call_"), "type": "function",
                                             "function": {"name": turn.tool, "arguments": ""}}]}))
        for piece in pieces(json.dumps(turn.arguments)):
            events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
        events.append(chunk({}, "tool_calls"))
    else:
        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        events += [chunk({"content": piece}) for piece in pieces(turn.text)]
        events.append(chunk({}, "stop"))
    if include_usage:
        events.append(sse(None, {**base, "choices": [], "usage": chat_usage(usage)}))
    events.append(b"data: [DONE]\n\n")
    return events


# -- OpenAI Responses ----------------------------------------------------------------------------


def responses_items(n: int, turn: Turn) -> list[dict]:
    if turn.kind == "tool_call":
        return [{"id": call_id(n, "fc_"), "type": "function_call", "status": "completed",
                 "arguments": json.dumps(turn.arguments), "call_id": call_id(n, "call_"), "name": turn.tool}]
    return [{"id": call_id(n, "msg_"), "type": "message", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": turn.text}]}]


def responses_usage(usage: tuple[int, int]) -> dict:
    return {"input_tokens": usage[0], "input_tokens_details": {"cached_tokens": 0}, "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": usage[0] + usage[1]}


def responses_object(n: int, model: str, turn: Turn, usage: tuple[int, int] | None,
                     status: str = "completed", output: list | None = None, body: dict | None = None) -> dict:
    body = body or {}
    return {
        "id": call_id(n, "resp_"), "object": "response", "created_at": CREATED, "status": status,
        "background": False, "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None, "model": model,
        "output": responses_items(n, turn) if output is None else output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True), "previous_response_id": None,
        "prompt_cache_key": body.get("prompt_cache_key"), "reasoning": {"effort": None, "summary": None},
        "safety_identifier": None, "service_tier": "default", "store": body.get("store", True), "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": body.get("tool_choice", "auto"),
        "tools": [], "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled",
        "usage": responses_usage(usage) if usage is not None else None, "user": None, "metadata": {},
    }


def responses_stream(n: int, model: str, turn: Turn, usage: tuple[int, int], body: dict) -> list[bytes]:
    seq = itertools.count()
    events: list[bytes] = []

    def emit(kind: str, **data: Any) -> None:
        events.append(sse(kind, {"type": kind, "sequence_number": next(seq), **data}))

    emit("response.created", response=responses_object(n, model, turn, None, "in_progress", [], body))
    emit("response.in_progress", response=responses_object(n, model, turn, None, "in_progress", [], body))
    item = responses_items(n, turn)[0]
    if item["type"] == "function_call":
        emit("response.output_item.added", output_index=0, item={**item, "status": "in_progress", "arguments": ""})
        for piece in pieces(item["arguments"]):
            emit("response.function_call_arguments.delta", item_id=item["id"], output_index=0, delta=piece)
        emit("response.function_call_arguments.done", item_id=item["id"], output_index=0, arguments=item["arguments"])
    else:
        text = item["content"][0]["text"]
        emit("response.output_item.added", output_index=0,
             item={**item, "status": "in_progress", "content": []})
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        emit("response.content_part.added", item_id=item["id"], output_index=0, content_index=0, part=part)
        for piece in pieces(text):
            emit("response.output_text.delta", item_id=item["id"], output_index=0, content_index=0, delta=piece,
                 logprobs=[])
        emit("response.output_text.done", item_id=item["id"], output_index=0, content_index=0, text=text, logprobs=[])
        emit("response.content_part.done", item_id=item["id"], output_index=0, content_index=0,
             part={**part, "text": text})
    emit("response.output_item.done", output_index=0, item=item)
    emit("response.completed", response=responses_object(n, model, turn, usage, "completed", None, body))
    return events

