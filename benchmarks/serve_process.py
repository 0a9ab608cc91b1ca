"""A `vaswani serve` process for the serving benchmarks: started on a free loopback port, ready when /health says so."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str | list[str], *options: str) -> tuple[subprocess.Popen, str]:
    """`vaswani serve` of one model folder (or several), ready: its process and URL."""
    port = free_port()
    models = [model] if isinstance(model, str) else list(model)
    process = subprocess.Popen([sys.executable, "-m", "vaswani_hf.cli", "serve", *models, "--port", str(port),
                                "--max_chars", "100000", "--request_timeout", "3600", *options],
                               stderr=subprocess.DEVNULL)  # fmt: skip
    # the timeout is long: with batching off, 32 clients queue behind one-line batches (a base-size model's
    # run to the source + 50 limit took longer than the default 60 s)
    return ready(process, f"http://127.0.0.1:{port}", 300, "the server")


def ready(process: subprocess.Popen, url: str, seconds: float, what: str) -> tuple[subprocess.Popen, str]:
    """`process` once its /health answers 200 (killed, and the benchmark stopped, after `seconds`)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"{what} did not get ready in {seconds:g} s")
