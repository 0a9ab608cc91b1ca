"""Serving until stopped: uvicorn, started as an orchestrator expects.

- The port opens first: /health answers 503 "loading" with the preload's progress while the models load, then 200.
- The first SIGTERM or SIGINT drains: new requests get 503, those in flight finish within --drain_seconds (20 s by
  default), then the connections close (1 s) and the models' workers stop (1.5 s, daemons past that), and
  `vaswani serve` exits at once: the whole stop within drain + 3 s, under 25 s by default, whatever the number of
  models or a load under way (loads run in daemon threads). A second signal exits at once (status 128 + the signal).
- Bounded connections: at most --max_connections at once (uvicorn's limit_concurrency: 503 past it), a request's
  headers within --header_timeout, its body within --body_timeout (guard.py), an idle keep-alive connection closed
  after 5 s (uvicorn's)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable

import uvicorn

from .app import Routers, create_app
from .batching import in_daemon_thread
from .catalog import Catalog, ServedModel

CLOSE_SECONDS, STOP_SECONDS = 1.0, 1.5  # after the drain: connections closing, then the workers stopping


def bound_memory() -> None:
    """Keep a long-lived server's memory flat. Call before the model loads. A translation job meets a few batch
    shapes; a server meets thousands, and two caches grew with them: oneDNN's primitive cache (one entry per shape,
    1,024 by default) and glibc's heap, whose mmap threshold rises to the largest tensor freed, so later large
    tensors come from the heap and leave it fragmented. Measured over 7,500 requests after the first 500 (tiny
    model, 32 clients): RSS +15% with the defaults, +2.5% with these. Settings the user gave
    (ONEDNN_PRIMITIVE_CACHE_CAPACITY, GLIBC_TUNABLES' malloc entries, MALLOC_MMAP_THRESHOLD_) are kept."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")  # read when oneDNN makes its first primitive
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): its allocator is left as it is
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h; a fixed threshold also stops glibc raising it
    libc.mallopt(m_mmap_threshold, 128 * 1024)
    libc.mallopt(m_trim_threshold, 128 * 1024)


def serve(catalog: Catalog, host: str, port: int, routers: Routers | None = None,
          preload: list[ServedModel] | None = None, on_ready: Callable[[], None] | None = None) -> None:  # fmt: skip
    """Serve the catalog's models with `routers` (`create_app`'s) on host:port until a signal: the port opens, the
    models' files are checked and `preload` loaded (then `on_ready()`), and on a signal the server drains, stops
    the models' workers and returns (see the module's docstring)."""
    settings = catalog.settings
    config = uvicorn.Config(create_app(catalog, routers), host=host, port=port, log_level="warning",
                            http=header_timeout_protocol(settings.header_timeout),
                            forwarded_allow_ips=settings.forwarded_allow_ips,
                            limit_concurrency=settings.max_connections,
                            timeout_graceful_shutdown=CLOSE_SECONDS)  # fmt: skip
    DrainingServer(config, catalog, preload or [], on_ready).run()
    catalog.stop(within=STOP_SECONDS)


def header_timeout_protocol(seconds: float) -> type:
    """uvicorn's HTTP protocol (httptools), whose connections must send each request's headers within `seconds`
    of the connection or of the request's first byte: a client trickling its headers (slowloris) is cut off,
    where uvicorn would wait for ever (its keep-alive timeout covers only idle connections)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        header_timer: asyncio.TimerHandle | None = None

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

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        # not disarmed when a response completes: a pipelined request's headers may be under way (an idle
        # keep-alive connection has no timer armed here, and is uvicorn's to close: timeout_keep_alive)

    return HeaderTimeoutProtocol


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
