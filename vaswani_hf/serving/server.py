"""Serving until stopped: uvicorn, whose first SIGTERM or SIGINT drains (new requests get 503, those in flight finish
within --drain_seconds) before the process exits 0."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time

import uvicorn

from .app import Routers, create_app
from .catalog import Catalog


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


def serve(catalog: Catalog, host: str, port: int, routers: Routers | None = None) -> None:
    """Serve the catalog's models with `routers` (`create_app`'s) on host:port until a signal; then drain, stop the
    models' workers and return."""
    config = uvicorn.Config(create_app(catalog, routers), host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=max(int(catalog.settings.drain_seconds), 1))  # fmt: skip
    DrainingServer(config, catalog).run()
    catalog.stop()


class DrainingServer:
    """uvicorn's server, whose first SIGTERM/SIGINT drains: the app answers new requests 503 while those in flight
    finish (at most --drain_seconds), then uvicorn shuts down. A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, service: Catalog) -> None:
        service_ref = service

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:
                if service_ref.draining:
                    return super().handle_exit(sig, frame)
                service_ref.draining = True
                print("stopping: new requests get 503; waiting for those in flight", file=sys.stderr, flush=True)
                loop = asyncio.get_running_loop()  # the handler runs in the loop's thread, between its callbacks
                loop.call_soon_threadsafe(lambda: loop.create_task(self.drain()))

            async def drain(self) -> None:
                deadline = time.monotonic() + service_ref.settings.drain_seconds
                while service_ref.in_flight and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                self.should_exit = True

        self.server = Server(config)

    def run(self) -> None:
        self.server.run()
