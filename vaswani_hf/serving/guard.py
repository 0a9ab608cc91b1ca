"""What every request passes before a route sees it: pure ASGI middleware (not Starlette's BaseHTTPMiddleware,
behind which a client that leaves is never seen) that refuses work the server must not start, and the error shape.

- While draining, everything but /health and /metrics gets 503 with Retry-After (CORS headers too: the CORS
  middleware sits outside this one).
- A body over --max_body_bytes is refused from its Content-Length, or as soon as a streamed body passes the bound,
  before any of it is parsed; a body within it is read whole, then handed to the route.
- With --api_keys, a key in the query string (where proxies and access logs keep it) is refused with 400 naming
  where to send it: the body (JSON or form) or 'Authorization: Bearer KEY' (on the routes that need no key it is
  ignored). Without keys none is a secret: any key is taken and ignored, as LibreTranslate does (deep-translator
  sends its key in the query string).
- After its body, a request's receive channel says `http.disconnect` the moment its client closes the connection:
  `disconnected(request)` waits for that, and the service drops the request's waiting lines.
- Each answer carries the server's own time (W3C Server-Timing), which a client can tell from the network's."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections import deque
from contextvars import ContextVar
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request

LIBRETRANSLATE_PATHS = ("/translate", "/detect", "/languages", "/frontend/settings", "/spec", "/suggest",
                        "/translate_file", "/download_file")  # fmt: skip


def api_of(path: str) -> str:
    """The metrics' `api` label: one of a few values, whatever path a client sends."""
    if path.startswith("/v1/"):
        return "native"
    if path == "/parse":
        return "parse"
    if path == "/" or path.startswith(LIBRETRANSLATE_PATHS):
        return "libretranslate"
    return "other"


class KeyLimits:
    """Per-key limits, as LibreTranslate's keys have them: requests per minute (a sliding minute; 429 with
    Retry-After past it) and characters per request (`run` checks them). `limits`: key -> (requests per minute,
    characters per request), either None for the server's."""

    def __init__(self, limits: dict[str, tuple[int | None, int | None]]) -> None:
        self.limits = limits
        self.seen: dict[str, deque[float]] = {}

    def admit(self, key: str) -> int | None:
        """Count one request of `key`; its characters per request (None: the server's --max_chars)."""
        per_minute, chars = self.limits.get(key, (None, None))
        if per_minute is not None:
            now, times = time.monotonic(), self.seen.setdefault(key, deque())
            while times and now - times[0] >= 60:
                times.popleft()
            if len(times) >= per_minute:
                wait = max(1, math.ceil(60 - (now - times[0])))
                raise ApiError(429, f"Slowdown: this key may send {per_minute} requests a minute: retry in {wait} s",
                               "key_rate", {"Retry-After": str(wait)})  # fmt: skip
            times.append(now)
        return chars


class ApiError(Exception):
    """A refusal: its status, its message (the body's `error`), its kind (the metrics' label) and headers."""

    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


# the routes that need no key (docs/serving.md, "Keys and CORS"): a key in their query string is no secret sent to
# be checked, and clients that add it to every request (deep-translator) are served
KEYLESS_PATHS = frozenset({"/", "/health", "/languages", "/frontend/settings", "/spec"})
SURROGATE = re.compile("[\ud800-\udfff]")
KEY_IN_QUERY = ("Invalid request: api_key in the query string, where proxies and access logs keep it: send the key "
                "in the body (JSON or form field api_key) or as the header 'Authorization: Bearer KEY'")  # fmt: skip


def shown(value: Any, most: int = 40) -> str:
    """A client's value as an error message may quote it: printable, escaped where it is not (a lone surrogate
    cannot be written in UTF-8), and cut to `most` characters."""
    text = value if isinstance(value, str) else repr(value)
    text = text[:most] + ("..." if len(text) > most else "")
    return text.encode("ascii", "backslashreplace").decode("ascii") if not text.isprintable() else text


def not_text(value: Any) -> bool:
    """Whether a string (or a list or dict holding one, at any depth) is not Unicode text that UTF-8 can write:
    a lone surrogate, as JSON's "\\ud800" gives one."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if SURROGATE.search(item):
                return True
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return False


def too_long(libre: bool, message: str) -> ApiError:
    """A request over a bound: 400 to LibreTranslate's clients (as its server answers), 413 to the others."""
    return ApiError(400 if libre else 413, f"Invalid request: {message}", "too_long")


def check_chars(settings, libre: bool, chars: int, char_limit: int | None) -> None:
    """A request's characters, counted as its client sent them (LibreTranslate counts len(q)), within the key's
    limit or --max_chars: checked before anything reads the text (HTML parsing, language detection, the model)."""
    most, option = (char_limit, "this key's limit") if char_limit is not None else (settings.max_chars, "--max_chars")
    if chars > most:
        raise too_long(libre, f"request ({chars}) exceeds text limit ({most}): send it in parts ({option})")


def check_lines(settings, libre: bool, lines: int, what: str = "lines") -> None:
    """A request's lines (or its model lines: its lines' sentences) within --max_lines."""
    if lines > settings.max_lines:
        raise too_long(libre, f"the text has {lines} {what}; this server takes at most {settings.max_lines} a "
                       "request (--max_lines): send it in parts")  # fmt: skip


def check_queue(settings, libre: bool, model_lines: int, passes: int) -> None:
    """A request that can never fit in the queue (its model lines, `passes` times for a route through a pivot,
    whose second model is sent the first's candidates) is refused for good, not with a Retry-After."""
    if model_lines * passes > settings.max_queue_lines:
        through = f" ({model_lines} x {passes}: its route goes through a pivot)" if passes > 1 else ""
        raise too_long(libre, f"the request makes {model_lines * passes} lines for the model{through}, more than "
                       f"the queue ever holds ({settings.max_queue_lines}, --max_queue_lines), so retrying cannot "
                       "help: send it in parts")  # fmt: skip


async def send_error(send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    """An error answered from the middleware, in the API's shape: `{"error": message}`."""
    body = json.dumps({"error": message}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def disconnected(request: Request) -> None:
    """Return once the client has closed its connection (the body already read: only `http.disconnect` is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def deadline_of(request: Request, timeout: float) -> float:
    """When the request's time (--request_timeout) ends: counted from its arrival (the guard notes it), so that its
    body, parsing, loads and every batch queue it passes share one bound."""
    return request.scope.get("state", {}).get("arrived", time.monotonic()) + timeout


# the deadline of the request whose work a pool thread runs (`within` sets it; the thread's context is a copy)
_DEADLINE: ContextVar[float | None] = ContextVar("deadline", default=None)


async def within(deadline: float, work, *args):
    """`work(*args)` off the event loop, awaited until `deadline` at most (TimeoutError past it: its result, when
    it comes, is dropped). Work still waiting for a pool thread then never starts (its job is cancelled); work under
    way cannot be stopped, but its steps run through `each` stop at the next step, so the thread is soon free."""
    token = _DEADLINE.set(deadline)
    try:
        return await asyncio.wait_for(asyncio.to_thread(work, *args), max(0.0, deadline - time.monotonic()))
    finally:
        _DEADLINE.reset(token)


def each(step, items) -> list:
    """`[step(item) for item in items]`, but no step started past the deadline of the `within` running it
    (TimeoutError: nobody waits for the rest)."""
    deadline, out = _DEADLINE.get(), []
    for item in items:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("the request's time ran out")
        out.append(step(item))
    return out


def too_slow(timeout: float, noun: str) -> ApiError:
    """The 504 of a request past --request_timeout."""
    return ApiError(504, f"no {noun} within {timeout:g} s (--request_timeout): the server is busy; retry, or send "
                    "less text", "timeout")  # fmt: skip


class RequestGuard:
    """The ASGI middleware above; `service` holds the state (draining, requests in flight) and the settings."""

    def __init__(self, app, service) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})["arrived"] = time.monotonic()  # the request's time starts (deadline_of)
        service, path = self.service, scope["path"]
        metrics = service.metrics
        if service.draining and path not in ("/health", "/metrics"):
            metrics.errors.labels(kind="stopping").inc()
            metrics.requests.labels(api=api_of(path), status="503").inc()
            return await send_error(send, 503, "the server is stopping: send the request to another one",
                                    {"Retry-After": "5"})  # fmt: skip
        if (
            service.settings.api_keys
            and path not in KEYLESS_PATHS
            and any(
                name == "api_key" and value
                for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            )
        ):
            metrics.errors.labels(kind="key_in_query").inc()
            metrics.requests.labels(api=api_of(path), status="400").inc()
            return await send_error(send, 400, KEY_IN_QUERY)
        # in flight from here: a request still uploading its body when the server stops is drained as the others
        service.in_flight += 1
        started = False

        async def timed(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                timing = f"app;dur={(time.monotonic() - start) * 1000:.1f}".encode()
                message = {**message, "headers": [*message.get("headers", []), (b"server-timing", timing)]}
            await send(message)

        start = time.monotonic()
        try:
            body = await self.body(scope, receive, timed)
            if body is None:
                return  # refused, or the client left
            replayed = False

            async def replay() -> dict[str, Any]:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # after the body: http.disconnect, when the client leaves

            await self.app(scope, replay, timed)
        except asyncio.CancelledError:
            # the stop's drain ended before this request did (uvicorn cancels it), its body read or not: a JSON 503
            # a client can retry elsewhere, where it would get a plain-text 500 or a broken pipe
            if not started:
                metrics.requests.labels(api=api_of(path), status="503").inc()
                await send_error(send, 503, "the server stopped before answering: send the request to another one",
                                 {"Retry-After": "5"})  # fmt: skip
            raise
        finally:
            service.in_flight -= 1

    async def body(self, scope: dict, receive, send) -> bytes | None:
        """The request's body, read whole within the bounds (--max_body_bytes, --body_timeout); None where it was
        refused (the refusal sent) or the client left."""
        service, path = self.service, scope["path"]
        metrics = service.metrics
        limit = service.settings.max_body_bytes
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"0")
        body, more = b"", True
        if not declared.isdigit() or int(declared) <= limit:
            chunks, size = [], 0
            pause = service.settings.body_timeout
            body_deadline = time.monotonic() + 6 * pause
            while more:
                # a client trickling its body (slowloris) holds a connection: each chunk within --body_timeout of
                # the last, the whole body within 6 times it (a slow but steady upload passes)
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, min(pause, body_deadline - time.monotonic())))
                except TimeoutError:
                    metrics.errors.labels(kind="slow_body").inc()
                    message = (f"the body paused over {pause:g} s, or took over {6 * pause:g} s in all "
                               "(--body_timeout): send it at once")  # fmt: skip
                    return await send_error(send, 408, message, {"Connection": "close"})
                if message["type"] != "http.request":
                    return None  # the client left before its body was read
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                more = message.get("more_body", False)
                if size > limit:
                    break
            body = b"".join(chunks)
        if len(body) > limit or (declared.isdigit() and int(declared) > limit):
            status = 400 if api_of(path) == "libretranslate" else 413
            metrics.errors.labels(kind="too_large").inc()
            metrics.requests.labels(api=api_of(path), status=str(status)).inc()
            message = (f"Invalid request: the body is over {limit} bytes, this server's limit (--max_body_bytes): "
                       "send less text a request")  # fmt: skip
            return await send_error(send, status, message, {"Connection": "close"})
        return body
