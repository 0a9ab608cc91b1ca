"""What every request passes before a route sees it: pure ASGI middleware (not Starlette's BaseHTTPMiddleware,
behind which a client that leaves is never seen) that refuses work the server must not start, and the error shape.

- While draining, everything but /health and /metrics gets 503 with Retry-After (CORS headers too: the CORS
  middleware sits outside this one).
- A body over --max_body_bytes is refused from its Content-Length, or as soon as a streamed body passes the bound,
  before any of it is parsed; a body within it is read whole, then handed to the route.
- After its body, a request's receive channel says `http.disconnect` the moment its client closes the connection:
  `disconnected(request)` waits for that, and the service drops the request's waiting lines.
- Each answer carries the server's own time (W3C Server-Timing), which a client can tell from the network's."""

from __future__ import annotations

import json
import math
import time
from collections import deque
from typing import Any

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


class RequestGuard:
    """The ASGI middleware above; `service` holds the state (draining, requests in flight) and the settings."""

    def __init__(self, app, service) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        service, path = self.service, scope["path"]
        metrics = service.metrics
        if service.draining and path not in ("/health", "/metrics"):
            metrics.errors.labels(kind="stopping").inc()
            metrics.requests.labels(api=api_of(path), status="503").inc()
            return await send_error(send, 503, "the server is stopping: send the request to another one",
                                    {"Retry-After": "5"})  # fmt: skip
        limit = service.settings.max_body_bytes
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"0")
        body, more = b"", True
        if not declared.isdigit() or int(declared) <= limit:
            chunks, size = [], 0
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client left before its body was read
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
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: http.disconnect, when the client leaves

        start = time.monotonic()

        async def timed(message: dict) -> None:
            if message["type"] == "http.response.start":
                timing = f"app;dur={(time.monotonic() - start) * 1000:.1f}".encode()
                message = {**message, "headers": [*message.get("headers", []), (b"server-timing", timing)]}
            await send(message)

        service.in_flight += 1
        try:
            await self.app(scope, replay, timed)
        finally:
            service.in_flight -= 1
