"""Serving until stopped: uvicorn, started as an orchestrator expects.

- The port opens first: /health answers 503 "loading" with the preload's progress while the models load, then 200.
- The first SIGTERM, SIGINT or SIGHUP (a closed terminal's) drains: new requests get 503, those in flight (a body
  still uploading included) finish within --drain_seconds (20 s by default), then the connections close (1 s) and
  the models' workers stop (1.5 s, daemons past that), and `vaswani serve` exits at once: the whole stop within
  drain + 3 s, under 25 s by default, whatever the number of models or a load under way (loads run in daemon
  threads). A request cut off by the stop gets a JSON 503 with Retry-After. A second signal exits at once (status
  128 + the signal).
- Bounded connections: at most --max_connections at once (uvicorn's limit_concurrency: 503 past it), a request's
  headers within --header_timeout, at most --max_header_bytes of request line and headers and --max_headers fields
  (431 in JSON and the connection closed as soon as a bound is passed: httptools has no bound of its own, and buffers
  a header field whole before uvicorn sees it), its body within --body_timeout (guard.py), an idle keep-alive
  connection closed after 5 s (uvicorn's)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import uvicorn

from .app import Routers, create_app
from .batching import in_daemon_thread
from .catalog import Catalog, ServedModel

CLOSE_SECONDS, STOP_SECONDS = 1.0, 1.5  # after the drain: connections closing, then the workers stopping
HEAP_LIMIT = 4 * 1024 * 1024  # bytes: larger tensors are mapped, smaller ones reuse the heap (bound_memory)
LINGER_SECONDS = 1.0  # a connection refused for its headers: how long what it still sends is read and dropped


def bound_memory() -> None:
    """Keep a long-lived server's memory flat. Call before the model loads. A translation job meets a few batch
    shapes; a server meets thousands, and two caches grew with them: oneDNN's primitive cache (one entry per shape,
    1,024 by default) and glibc's heap, whose mmap threshold rises to the largest tensor freed, so later large
    tensors come from the heap and leave it fragmented. Measured over 7,500 requests after the first 500 (tiny
    model, 32 clients): RSS +15% with the defaults, +2.5% with these. The heap keeps tensors up to 4 MiB (a batch's
    activations and caches): at 128 KiB every one was mapped and faulted in afresh, and the small model's batches
    of 32 at beam 4 took 1.5x as long (39-44 ms a line against 26-28; 4 MiB: 26.7, RSS +0.3% over 3,000 requests of
    a tiny model, -1.2% over 12,000 of the small model in batches of 26). Settings the user gave
    (ONEDNN_PRIMITIVE_CACHE_CAPACITY, GLIBC_TUNABLES' malloc entries, MALLOC_MMAP_THRESHOLD_) are kept."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")  # read when oneDNN makes its first primitive
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): its allocator is left as it is
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h; a fixed threshold also stops glibc raising it
    libc.mallopt(m_mmap_threshold, HEAP_LIMIT)
    libc.mallopt(m_trim_threshold, 2 * HEAP_LIMIT)  # glibc's own ratio: trimming a freed tensor's worth each time


def serve(catalog: Catalog, host: str, port: int, routers: Routers | None = None,
          preload: list[ServedModel] | None = None, on_ready: Callable[[], None] | None = None) -> None:  # fmt: skip
    """Serve the catalog's models with `routers` (`create_app`'s) on host:port until a signal: the port opens, the
    models' files are checked and `preload` loaded (then `on_ready()`), and on a signal the server drains, stops
    the models' workers and returns (see the module's docstring)."""
    settings = catalog.settings
    config = uvicorn.Config(create_app(catalog, routers), host=host, port=port, log_level="warning",
                            http=bounded_headers_protocol(settings.header_timeout, settings.max_header_bytes,
                                                          settings.max_headers),
                            forwarded_allow_ips=settings.forwarded_allow_ips,
                            limit_concurrency=settings.max_connections,
                            timeout_graceful_shutdown=CLOSE_SECONDS)  # fmt: skip
    DrainingServer(config, catalog, preload or [], on_ready).run()
    catalog.stop(within=STOP_SECONDS)


class HeadersTooLarge(Exception):
    """Raised inside httptools' callbacks to stop its parsing: the request's headers passed a bound."""


def bounded_headers_protocol(seconds: float, most_bytes: int, most_fields: int) -> type:
    """uvicorn's HTTP protocol (httptools), whose connections must send each request's headers within `seconds`
    of the connection or of the request's first byte (a client trickling its headers, slowloris, is cut off, where
    uvicorn would wait for ever: its keep-alive timeout covers only idle connections), in at most `most_bytes`
    (request line and headers) and `most_fields` header fields: past either, 431 at once, before more is read."""
    import json

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHeadersProtocol(HttpToolsProtocol):
        header_timer: asyncio.TimerHandle | None = None
        reading_headers = True  # between a request's first byte (or the connection's) and its headers' end
        header_bytes = 0  # bytes received while reading headers (the bound on what httptools may hold)
        header_fields = 0
        refusal: str | None = None  # why a bound was passed inside httptools' callbacks
        refused = False

        def _arm(self) -> None:
            if self.header_timer is None:
                self.header_timer = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _too_slow(self) -> None:
            self.header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.refused:  # the rest of a refused request, read and dropped until the connection closes
                return
            if self.reading_headers:
                self.header_bytes += len(data)
            super().data_received(data)  # a bound passed inside: uvicorn calls send_400_response, which refuses
            # still reading headers after this chunk: the bytes so far are the request line and headers (those of
            # a chunk that ended them may hold a body too, so the bound is checked here, after the parse)
            if self.reading_headers and self.header_bytes > most_bytes and not self.refused:
                self._refuse(f"the request's line and headers pass {most_bytes} bytes (--max_header_bytes)")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            if len(self.url) > most_bytes:
                self.refusal = f"the request's line passes {most_bytes} bytes (--max_header_bytes)"
                raise HeadersTooLarge

        def on_header(self, name: bytes, value: bytes) -> None:
            self.header_fields += 1
            if self.header_fields > most_fields:
                self.refusal = f"the request has more than {most_fields} header fields (--max_headers)"
                raise HeadersTooLarge
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            self.reading_headers, self.header_bytes, self.header_fields = False, 0, 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            # a pipelined request's headers may follow in the same chunk: counted from the next chunk on (the bytes
            # before belong to this request's body), so the bound holds within one read
            self.reading_headers, self.header_bytes = True, 0

        # not disarmed when a response completes: a pipelined request's headers may be under way (an idle
        # keep-alive connection has no timer armed here, and is uvicorn's to close: timeout_keep_alive)

        def send_400_response(self, msg: str) -> None:
            if self.refusal is None:
                super().send_400_response(msg)
            else:
                self._refuse(self.refusal)

        def _refuse(self, message: str) -> None:
            """431 in JSON (as every refusal of this server), then the connection closed: at once on our side of
            it (no more is parsed), and a second later for reading, so that the client, still sending, reads the
            answer (a socket closed with bytes unread sends a reset, which can drop the answer before it is read)."""
            self._disarm()
            self.refused = True
            body = json.dumps({"error": f"Request header fields too large: {message}"}).encode()
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))  # fmt: skip
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)

    return BoundedHeadersProtocol


class DrainingServer:
    """uvicorn's server, started and stopped as the module's docstring says."""

    def __init__(self, config: uvicorn.Config, catalog: Catalog, preload: list[ServedModel],
                 on_ready: Callable[[], None] | None) -> None:  # fmt: skip
        class Server(uvicorn.Server):
            async def startup(self, sockets=None) -> None:
                await super().startup(sockets)
                self.preloading = asyncio.get_running_loop().create_task(self.preload())

            async def preload(self) -> None:
                await in_daemon_thread(catalog.check_files, "vaswani-serve-check")
                await catalog.preload(preload)
                if on_ready is not None:
                    on_ready()

            async def shutdown(self, sockets=None) -> None:
                self.preloading.cancel()  # a load under way ends with the process (its thread is a daemon)
                await super().shutdown(sockets)

            @contextlib.contextmanager
            def capture_signals(self):
                """uvicorn's signals (SIGINT, SIGTERM) and SIGHUP, which a closed terminal sends to a server started
                in it (`vaswani serve &` over SSH): it drains as SIGTERM does, where it would kill the process."""
                hangup = getattr(signal, "SIGHUP", None)  # (not on Windows)
                ignored = hangup is not None and signal.getsignal(hangup) == signal.SIG_IGN  # nohup's: it stays so
                if hangup is None or ignored or threading.current_thread() is not threading.main_thread():
                    with super().capture_signals():
                        yield
                    return
                original = signal.signal(hangup, self.handle_exit)
                try:
                    with super().capture_signals():
                        yield
                finally:
                    signal.signal(hangup, original)

            def handle_exit(self, sig, frame) -> None:
                if catalog.draining:  # a second signal: at once
                    print("stopping now", file=sys.stderr, flush=True)
                    os._exit(128 + (sig if isinstance(sig, int) else signal.SIGTERM))
                catalog.draining = True
                print("stopping: new requests get 503; waiting for those in flight", file=sys.stderr, flush=True)
                loop = asyncio.get_running_loop()  # the handler runs in the loop's thread, between its callbacks
                loop.call_soon_threadsafe(lambda: loop.create_task(self.drain()))

            async def drain(self) -> None:
                deadline = time.monotonic() + catalog.settings.drain_seconds
                while catalog.in_flight and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                self.should_exit = True

        self.server = Server(config)

    def run(self) -> None:
        self.server.run()
