"""chunky: an upstream that replays recorded SSE streams the way real servers write them.

A mock that writes one event per TCP segment hides the bugs of a reader that assumes one event
per read (real servers send a short answer in one write, split events, dribble bytes). chunky
answers a streaming request with a recorded stream from tests/fixtures/streams, close-delimited
(no Content-Length, no chunked encoding, `connection: close`), written in one of three modes
chosen by the API key the request carries (`x-api-key` or `Authorization: Bearer`):

- whole:  status line, headers and the whole body in one `sendall`: a reader gets several
          events (often all of them, and the EOF) in one read;
- events: the head in one write, then one write per SSE event, TCP_NODELAY and a short pause
          between writes so each reaches the reader as its own segment;
- bytes:  the whole answer a few bytes (3-7) per write, TCP_NODELAY, events split everywhere.

    POST …/v1/messages        -> anthropic-text.sse
    POST …/chat/completions   -> openai-chat-text.sse

Both streams say TEXT. A key that names no mode gets a 401, an unknown path a 404. A request
without `"stream": true` gets the same text as one JSON answer of its wire format. Every
request is recorded (`hits()`) for assertions. One request per connection; chunky listens on
127.0.0.1 only, and `close()` stops the listener and every connection thread within a deadline.

Run alone (`python tests/peers/chunky.py`) it serves until interrupted and prints its port.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "streams"
MODES = ("whole", "events", "bytes")
TEXT = "Hello, world! rota streams whole."  # what both recorded streams say
ANTHROPIC_STREAM = "anthropic-text.sse"
OPENAI_STREAM = "openai-chat-text.sse"

EVENT_PAUSE_S = 0.001  # events mode: long enough for each write to leave as its own segment
BYTES_PER_WRITE = (3, 7)  # bytes mode: inclusive range of one write's size
BYTE_PAUSE_S = 0.0001  # bytes mode: a yield between writes; a 2.4 KB stream stays well under 1 s
MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024
IO_TIMEOUT_S = 10.0  # a silent client or a stuck send never holds a thread longer than this
ACCEPT_POLL_S = 0.05  # how often the accept loop looks at the stop flag
STOP_GRACE_S = 10.0

STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\n"
    b"connection: close\r\n"
    b"\r\n"
)


@dataclass(frozen=True)
class Hit:
    """One request chunky received."""

    method: str
    path: str
    key: str | None  # the x-api-key or Bearer token it carried
    mode: str | None  # the write mode the key selected
    stream: bool


def sse_events(body: bytes) -> list[bytes]:
    """The stream cut after each event's blank line; joined, the pieces are the body again."""
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    if b"".join(events) != body:
        raise ValueError("a recorded stream must be LF-separated events, each ending in a blank line")
    return events


def mode_of(key: str | None) -> str | None:
    return next((m for m in MODES if key and m in key), None)


class Chunky:
    """The upstream; `port` is where it listens on 127.0.0.1."""

    def __init__(self, streams: Path = STREAMS, seed: int = 0) -> None:
        self.bodies = {
            "anthropic": (streams / ANTHROPIC_STREAM).read_bytes(),
            "openai": (streams / OPENAI_STREAM).read_bytes(),
        }
        self.events = {api: sse_events(body) for api, body in self.bodies.items()}
        self._rng = random.Random(seed)  # the bytes mode's cut points, reproducible per run
        self._hits: list[Hit] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(ACCEPT_POLL_S)
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, name="chunky-accept", daemon=True)
        self._acceptor.start()

    def hits(self) -> list[Hit]:
        with self._lock:
            return list(self._hits)

    def close(self) -> None:
        """Stops accepting, cuts the connections still open, joins every thread (bounded)."""
        self._stop.set()
        self._acceptor.join(timeout=STOP_GRACE_S)
        self._listener.close()
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"chunky threads still running after {STOP_GRACE_S}s: {alive}")

    # -- serving ---------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                seed = self._rng.getrandbits(32)
                t = threading.Thread(target=self._serve, args=(conn, random.Random(seed)),
                                     name=f"chunky-{len(self._hits)}", daemon=True)
                self._conns.add(conn)
                self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _serve(self, conn: socket.socket, rng: random.Random) -> None:
        try:
            conn.settimeout(IO_TIMEOUT_S)
            request = read_request(conn)
            if request is None:
                return
            method, path, headers, body = request
            self._answer(conn, method, path, headers, body, rng)
            # A clean end of a close-delimited body: FIN after the last byte. The whole request
            # was read, so closing sends no RST that could eat the answer's tail.
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the client went away, or close() cut the connection
        finally:
            conn.close()
            with self._lock:
                self._conns.discard(conn)

    def _answer(
        self, conn: socket.socket, method: str, path: str, headers: dict[str, str], body: bytes, rng: random.Random
    ) -> None:
        key = headers.get("x-api-key")
        if key is None and headers.get("authorization", "").lower().startswith("bearer "):
            key = headers["authorization"][len("bearer "):].strip()
        try:
            parsed = json.loads(body) if body else {}
        except ValueError:
            parsed = {}
        stream = isinstance(parsed, dict) and parsed.get("stream") is True
        mode = mode_of(key)
        with self._lock:
            self._hits.append(Hit(method, path, key, mode, stream))

        api = "anthropic" if path.endswith("/v1/messages") else "openai" if path.endswith("/chat/completions") else None
        if method != "POST" or api is None:
            conn.sendall(json_response(404, {"error": {"type": "not_found", "message": f"no route {method} {path}"}}))
        elif mode is None:
            conn.sendall(json_response(401, {"error": {"type": "authentication_error",
                                                       "message": f"the key names no mode of {MODES}"}}))
        elif not stream:
            model = parsed.get("model", "unknown") if isinstance(parsed, dict) else "unknown"
            conn.sendall(json_response(200, plain_answer(api, model)))
        elif mode == "whole":
            conn.sendall(STREAM_HEAD + self.bodies[api])
        elif mode == "events":
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(STREAM_HEAD)
            for event in self.events[api]:
                time.sleep(EVENT_PAUSE_S)
                conn.sendall(event)
        else:  # bytes: the head too, so the reader also meets a split status line and headers
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = STREAM_HEAD + self.bodies[api]
            at = 0
            while at < len(data):
                n = rng.randint(*BYTES_PER_WRITE)
                conn.sendall(data[at:at + n])
                at += n
                time.sleep(BYTE_PAUSE_S)


def read_request(conn: socket.socket) -> tuple[str, str, dict[str, str], bytes] | None:
    """One HTTP/1.1 request with a Content-Length body: method, path, lower-case headers, body.

    None when the client closed first; a request chunky cannot read gets its 4xx here.
    """
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD:
            conn.sendall(json_response(431, {"error": {"message": "request head too large"}}))
            return None
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        conn.sendall(json_response(411, {"error": {"message": "chunky expects a Content-Length body"}}))
        return None
    length = int(headers.get("content-length") or 0)
    if length > MAX_BODY:
        conn.sendall(json_response(413, {"error": {"message": "request body too large"}}))
        return None
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return method, path, headers, rest[:length]


def json_response(status: int, payload: object) -> bytes:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 411: "Length Required",
              413: "Payload Too Large", 431: "Request Header Fields Too Large"}[status]
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def plain_answer(api: str, model: str) -> dict:
    """TEXT as a non-streamed answer of the wire format `api`."""
    if api == "anthropic":
        return {
            "id": "msg_chunky", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": TEXT}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 25, "output_tokens": 12},
        }
    return {
        "id": "chatcmpl-chunky", "object": "chat.completion", "created": 1741569952, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29},
    }


if __name__ == "__main__":
    server = Chunky()
    print(f"chunky listening on http://127.0.0.1:{server.port} (keys name a mode: {', '.join(MODES)})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
