"""Serving until stopped: uvicorn, whose first SIGTERM or SIGINT drains (new requests get 503, those in flight finish
within --drain_seconds) before the process exits 0."""

from __future__ import annotations

import asyncio
import sys
import time

import uvicorn

from .app import create_app
from .service import Service


def serve(service: Service, host: str, port: int) -> None:
    """Serve `service` on host:port until a signal; then drain, stop the model worker and return."""
    config = uvicorn.Config(create_app(service), host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=max(int(service.settings.drain_seconds), 1))  # fmt: skip
    DrainingServer(config, service).run()
    service.batcher.stop()


class DrainingServer:
    """uvicorn's server, whose first SIGTERM/SIGINT drains: the app answers new requests 503 while those in flight
    finish (at most --drain_seconds), then uvicorn shuts down. A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
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
