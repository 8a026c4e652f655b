"""A fake OpenAI-compatible server on 127.0.0.1 for driving the real Hermes host offline.

Answers ``GET /v1/models``, streaming (SSE) and non-streaming
``POST /v1/chat/completions`` with usage computed from the request, records
every request, and lets a test script each answer (text or tool calls).
Used through ``hostkit`` (see its docstring for the host facts).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, List, Optional, Sequence, Union

# ---------------------------------------------------------------------------
# Fake OpenAI-compatible server
# ---------------------------------------------------------------------------

@dataclass
class ToolCall:
    """One tool call the fake model emits."""

    name: str
    arguments: dict = field(default_factory=dict)
    id: Optional[str] = None


@dataclass
class Reply:
    """What the fake model answers to one chat completion request.

    ``text`` and ``tool_calls`` may both be set (text first, like real models).
    ``prompt_tokens`` / ``completion_tokens`` override the computed usage.
    ``status`` != 200 makes the server answer with an OpenAI-style error body.
    """

    text: str = ""
    tool_calls: List[ToolCall] = field(default_factory=list)
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    finish_reason: Optional[str] = None
    status: int = 200
    headers: dict = field(default_factory=dict)  # extra response headers (Retry-After...)


ReplyLike = Union[Reply, str, ToolCall, Sequence[ToolCall], None]
Responder = Callable[[dict], ReplyLike]


def _as_reply(value: ReplyLike) -> Reply:
    if value is None:
        return Reply(text="ok")
    if isinstance(value, Reply):
        return value
    if isinstance(value, str):
        return Reply(text=value)
    if isinstance(value, ToolCall):
        return Reply(tool_calls=[value])
    if isinstance(value, (list, tuple)) and all(isinstance(v, ToolCall) for v in value):
        return Reply(tool_calls=list(value))
    raise TypeError(f"responder returned unsupported value {value!r}")


def _content_text(content: Any) -> str:
    """Flatten an OpenAI message ``content`` (str / list of parts / None)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    out.append(part["text"])
            elif isinstance(part, str):
                out.append(part)
        return "".join(out)
    return str(content)


def request_chars(body: dict) -> int:
    """Characters a request carries: message contents, tool-call arguments, tool schemas."""
    total = 0
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict):
            continue
        total += len(_content_text(msg.get("content")))
        for tc in msg.get("tool_calls") or []:
            fn = (tc or {}).get("function") or {}
            total += len(str(fn.get("name") or "")) + len(str(fn.get("arguments") or ""))
    if body.get("tools"):
        total += len(json.dumps(body["tools"], separators=(",", ":")))
    return total


def estimate_prompt_tokens(body: dict) -> int:
    """Default usage.prompt_tokens: request_chars // 4 (at least 1)."""
    return max(1, request_chars(body) // 4)


def is_main_request(body: dict) -> bool:
    """True for the agent's own (streaming) model calls, False for auxiliary calls."""
    return bool(body.get("stream"))


def scripted(*replies: ReplyLike, then: ReplyLike = "ok", main_only: bool = True) -> Responder:
    """Responder answering successive (main, i.e. streaming) requests with *replies*.

    After the script is used up every request gets *then*. Auxiliary
    (non-streaming) requests get *then* without consuming the script unless
    ``main_only`` is False.
    """
    queue = list(replies)
    lock = threading.Lock()

    def responder(body: dict) -> ReplyLike:
        if main_only and not is_main_request(body):
            return then
        with lock:
            if queue:
                return queue.pop(0)
        return then

    return responder


def tool_then_text(name: str, arguments: dict, text: str = "done") -> Responder:
    """Responder: first main request calls tool *name*, the next one answers *text*.

    Stateless: it looks at the request itself (a trailing ``tool`` message
    means the tool result is back), so it works turn after turn.
    """

    def responder(body: dict) -> ReplyLike:
        msgs = body.get("messages") or []
        if msgs and msgs[-1].get("role") == "tool":
            return text
        if not is_main_request(body):
            return "summary: " + text
        return ToolCall(name, dict(arguments))

    return responder


EMBEDDING_DIM = 64


def fake_embedding(text: str, model: str = "") -> List[float]:
    """A stable vector of a text: each lower-cased word adds to one hashed dimension.
    ``model`` salts the hash: another model, the same dimension, unrelated vectors."""
    import hashlib
    vector = [0.0] * EMBEDDING_DIM
    for word in text.lower().split():
        word = word.strip(".,!?:;'\"")
        if word:
            digest = hashlib.md5((model + word).encode()).hexdigest()
            vector[int(digest, 16) % EMBEDDING_DIM] += 1.0
    return vector


class FakeOpenAIServer:
    """Threaded OpenAI-compatible HTTP server on 127.0.0.1:<ephemeral>.

    Endpoints: ``GET /v1/models`` (and ``/models``), ``POST /v1/chat/completions``
    (SSE when ``stream`` is true, JSON otherwise), ``POST /v1/embeddings``
    (``fake_embedding`` vectors). Anything else: 404.
    Every request is recorded in :attr:`requests` as
    ``{"method", "path", "body", "time"}`` (``body`` parsed JSON or None).
    """

    def __init__(
        self,
        responder: Optional[Responder] = None,
        *,
        model: str = "fake-model",
        context_length: Optional[int] = None,
        prompt_tokens_fn: Callable[[dict], int] = estimate_prompt_tokens,
        chunk_size: int = 40,
    ) -> None:
        self.responder: Responder = responder or (lambda body: "ok")
        self.model = model
        self.context_length = context_length
        self.prompt_tokens_fn = prompt_tokens_fn
        self.chunk_size = max(1, int(chunk_size))
        # ``POST /v1/embeddings`` refusals as self-hosted servers answer them: more inputs
        # than ``embedding_max_inputs`` in one request, or an input containing one of
        # ``embedding_rejects``, get a 413 / 400 error body
        self.embedding_max_inputs: Optional[int] = None
        self.embedding_rejects: tuple = ()
        # the model actually serving ``POST /v1/embeddings`` whatever name is asked for:
        # a test swaps it to play a server that replaced its model under the same name
        self.embedding_model_served: str = ""
        self._lock = threading.Lock()
        self._requests: List[dict] = []
        self._ids = itertools.count(1)
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # -- recorded traffic --------------------------------------------------
    @property
    def requests(self) -> List[dict]:
        with self._lock:
            return list(self._requests)

    @property
    def chat_bodies(self) -> List[dict]:
        """Parsed bodies of every POST /chat/completions, in arrival order."""
        return [r["body"] for r in self.requests if r["path"].rstrip("/").endswith("/chat/completions") and isinstance(r["body"], dict)]

    @property
    def main_bodies(self) -> List[dict]:
        """Chat bodies of the agent's own streaming calls (no auxiliary calls)."""
        return [b for b in self.chat_bodies if is_main_request(b)]

    @property
    def aux_bodies(self) -> List[dict]:
        """Chat bodies of non-streaming (auxiliary: summaries, titles...) calls."""
        return [b for b in self.chat_bodies if not is_main_request(b)]

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()

    def _record(self, method: str, path: str, body: Any) -> None:
        with self._lock:
            self._requests.append({"method": method, "path": path, "body": body, "time": time.time()})

    # -- lifecycle -----------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeOpenAIServer":
        if self._httpd is not None:
            return self
        server = self

        class Handler(_Handler):
            fake = server

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
            name="fake-openai-server", daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- response building ---------------------------------------------------
    def _reply_for(self, body: dict) -> Reply:
        return _as_reply(self.responder(body))

    def _usage(self, body: dict, reply: Reply) -> dict:
        prompt = reply.prompt_tokens if reply.prompt_tokens is not None else int(self.prompt_tokens_fn(body))
        if reply.completion_tokens is not None:
            completion = reply.completion_tokens
        else:
            chars = len(reply.text) + sum(len(tc.name) + len(json.dumps(tc.arguments)) for tc in reply.tool_calls)
            completion = max(1, chars // 4)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _tool_call_dicts(self, reply: Reply) -> List[dict]:
        out = []
        for tc in reply.tool_calls:
            out.append({
                "id": tc.id or f"call_{next(self._ids)}_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)},
            })
        return out


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAIServer  # set on the per-server subclass
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr
        return

    def setup(self) -> None:
        super().setup()
        with contextlib.suppress(OSError):  # no Nagle/delayed-ACK stalls on small replies
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # -- helpers -----------------------------------------------------------
    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        if not raw:
            return None
        try:
            return json.loads(raw.decode("utf-8"))
        except ValueError:
            return {"_raw": raw.decode("utf-8", "replace")}

    def _send_json(self, status: int, payload: Any, headers: Optional[dict] = None) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, str(value))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self) -> None:
        self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found", "code": 404}})

    # -- verbs -------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/")
        self.fake._record("GET", path, None)
        if path in ("/v1/models", "/models"):
            entry: dict = {"id": self.fake.model, "object": "model", "created": 0, "owned_by": "hostkit"}
            if self.fake.context_length:
                entry["context_length"] = self.fake.context_length
            self._send_json(200, {"object": "list", "data": [entry]})
            return
        self._not_found()

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/")
        body = self._read_body()
        self.fake._record("POST", path, body)
        if path in ("/v1/embeddings", "/embeddings") and isinstance(body, dict):
            self._embeddings(body)
            return
        if path not in ("/v1/chat/completions", "/chat/completions") or not isinstance(body, dict):
            self._not_found()
            return
        try:
            reply = self.fake._reply_for(body)
        except Exception as exc:  # a broken responder must not hang the host
            self._send_json(500, {"error": {"message": f"responder raised: {exc!r}", "type": "server_error"}})
            return
        if reply.status != 200:
            self._send_json(reply.status, {"error": {"message": reply.text or "error", "type": "server_error", "code": reply.status}},
                            headers=reply.headers)
            return
        if body.get("stream"):
            self._stream(body, reply)
        else:
            self._complete(body, reply)

    def _embeddings(self, body: dict) -> None:
        """``POST /v1/embeddings``: deterministic bag-of-words vectors (texts sharing words
        point the same way), ``EMBEDDING_DIM`` wide, in the order of ``input``."""
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list):
            self._send_json(400, {"error": {"message": "input must be a string or a list"}})
            return
        limit = self.fake.embedding_max_inputs
        if limit is not None and len(texts) > limit:
            self._send_json(413, {"error": {"message": f"batch size {len(texts)} > {limit}"}})
            return
        if any(bad in str(t) for t in texts for bad in self.fake.embedding_rejects):
            self._send_json(400, {"error": {"message": "input rejected"}})
            return
        served = self.fake.embedding_model_served
        data = [{"object": "embedding", "index": i, "embedding": fake_embedding(str(t), served)}
                for i, t in enumerate(texts)]
        self._send_json(200, {"object": "list", "data": data, "model": body.get("model", ""),
                              "usage": {"prompt_tokens": 0, "total_tokens": 0}})

    def _complete(self, body: dict, reply: Reply) -> None:
        fake = self.fake
        tool_calls = fake._tool_call_dicts(reply)
        message: dict = {"role": "assistant", "content": reply.text or (None if tool_calls else "")}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = reply.finish_reason or ("tool_calls" if tool_calls else "stop")
        self._send_json(200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or fake.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": fake._usage(body, reply),
        })

    def _stream(self, body: dict, reply: Reply) -> None:
        fake = self.fake
        cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        created = int(time.time())
        model = body.get("model") or fake.model

        def chunk(delta: dict, finish: Optional[str] = None) -> dict:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        events: List[dict] = [chunk({"role": "assistant", "content": ""})]
        text = reply.text or ""
        for i in range(0, len(text), fake.chunk_size):
            events.append(chunk({"content": text[i:i + fake.chunk_size]}))
        tool_calls = fake._tool_call_dicts(reply)
        for idx, tc in enumerate(tool_calls):
            args = tc["function"]["arguments"]
            events.append(chunk({"tool_calls": [{"index": idx, "id": tc["id"], "type": "function",
                                                 "function": {"name": tc["function"]["name"], "arguments": ""}}]}))
            events.append(chunk({"tool_calls": [{"index": idx, "function": {"arguments": args}}]}))
        events.append(chunk({}, reply.finish_reason or ("tool_calls" if tool_calls else "stop")))
        events.append({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [], "usage": fake._usage(body, reply)})

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for ev in events:
                self.wfile.write(b"data: " + json.dumps(ev).encode("utf-8") + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


