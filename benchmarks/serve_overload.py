"""`vaswani serve` past its capacity and with clients that leave, against a server this script starts.

1. Load: N concurrent clients (httpx, async, each one request at a time), LibreTranslate's /translate with one
   line a request, for a fixed time; first 32 clients, then 256, against `--max_queue_lines`. Reports, per level:
   answers, refusals (429 with Retry-After), requests that got neither, the slowest refusal as the client saw it
   (past each client's first request, which also waits for its connection) and as the server timed it, and the
   server's RSS at the end of each level. The 256 clients run in several load processes.
2. Disconnects: one request of 40 lines holds the worker (batching off), then 100 clients each send a request of
   20 lines over a raw socket and close it 0.3 s later; reports how many batches ran (the held request's 40 are
   expected, none of the 2,000 abandoned lines), the lines dropped, and how long the next request took.

    python benchmarks/serve_overload.py MODEL_DIR [--seconds 20] [--max_queue_lines 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from compare_marian import machine  # noqa: E402
from serve_load import metric, publish, rss_mib, start  # noqa: E402


async def load(url: str, lines: list[str], clients: int, seconds: float) -> dict:
    answered = refused = other = 0
    refusals: list[tuple[float, float]] = []  # (as the client saw it, in the server: its Server-Timing), seconds
    retry_after_missing = 0
    stop = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient, k: int) -> None:
        nonlocal answered, refused, other, retry_after_missing
        i, first = k, True
        while time.monotonic() < stop:
            began = time.monotonic()
            try:
                answer = await http.post(f"{url}/translate", json={"q": lines[i % len(lines)], "source": "en",
                                                                   "target": "de"}, timeout=120)  # fmt: skip
            except httpx.HTTPError:
                other += 1
                continue
            i += clients
            if answer.status_code == 200:
                answered += 1
            elif answer.status_code == 429:
                refused += 1
                server = float(answer.headers.get("server-timing", "app;dur=nan").removeprefix("app;dur=")) / 1000
                if not first:  # a client's first request also waited for its connection
                    refusals.append((time.monotonic() - began, server))
                retry_after_missing += "retry-after" not in answer.headers
                await asyncio.sleep(0.05)  # a client that honours nothing but does not spin
            else:
                other += 1
            first = False

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits) as http:
        await asyncio.gather(*(client(http, k) for k in range(clients)))
    return {"answered": answered, "refused (429)": refused, "neither": other, "refusals": refusals,
            "refusals without Retry-After": retry_after_missing}  # fmt: skip


def level(url: str, lines: list[str], clients: int, seconds: float, processes: int) -> dict:
    """`clients` spread over `processes` load processes: one Python event loop cannot drive 256 httpx clients
    on 2 shared cores (its own clients then wait seconds for it, which a probe process saw the server did not)."""
    with ProcessPoolExecutor(processes) as pool:
        parts = list(pool.map(_load, [(url, lines[k::processes], clients // processes, seconds)
                                      for k in range(processes)]))  # fmt: skip
    refusals = [r for part in parts for r in part["refusals"]]
    total = {key: sum(part[key] for part in parts) for key in parts[0] if key != "refusals"}
    return {"clients": clients, "load processes": processes, **total,
            "slowest refusal ms, client": max((c for c, _ in refusals), default=0.0) * 1000,
            "slowest refusal ms, in the server": max((s for _, s in refusals), default=0.0) * 1000,
            "refusals within 1 s (client)": f"{sum(c <= 1 for c, _ in refusals)} of {len(refusals)}"}  # fmt: skip


def _load(arguments: tuple) -> dict:
    return asyncio.run(load(*arguments))


def disconnects(url: str, port: int, lines: list[str]) -> dict:
    batches = metric(url, "vaswani_batch_lines_count")
    held: dict = {}

    def hold() -> None:
        held["answer"] = httpx.post(f"{url}/translate", json={"q": "\n".join(lines[:40]), "source": "en",
                                                              "target": "de"}, timeout=600)  # fmt: skip

    thread = threading.Thread(target=hold)
    thread.start()
    while metric(url, "vaswani_queue_lines") == 0 and "answer" not in held:
        time.sleep(0.005)
    body = json.dumps({"q": "\n".join(lines[:20]), "source": "en", "target": "de"}).encode()
    sockets = []
    for _ in range(100):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)  # fmt: skip
        sockets.append(s)
    time.sleep(0.3)
    for s in sockets:
        s.close()
    thread.join()
    time.sleep(0.5)
    began = time.monotonic()
    status = httpx.post(f"{url}/translate", json={"q": lines[0], "source": "en", "target": "de"}).status_code
    next_ms = (time.monotonic() - began) * 1000
    return {"batches run": metric(url, "vaswani_batch_lines_count") - batches - 1, "held request's lines": 40,
            "lines dropped unbatched": metric(url, "vaswani_dropped_lines_total"), "abandoned lines": 2000,
            "next request ms": next_ms, "next request status": status}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max_queue_lines", type=int, default=256)
    parser.add_argument("--processes", type=int, default=8, help="load processes for the 256 clients")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from vaswani_hf.data.number_words import builtin_splits

    lines = [source for source, _ in builtin_splits()["test"]]
    report = [f"# `vaswani serve` past its capacity: {args.model}", "", machine(), ""]
    process, url = start(args.model, "--max_queue_lines", str(args.max_queue_lines))
    try:
        levels = []
        for clients, processes in ((32, 1), (256, args.processes)):
            result = level(url, lines, clients, args.seconds, processes)
            result["RSS MiB at the end"] = rss_mib(process.pid)
            result["server up"] = httpx.get(f"{url}/health").status_code == 200
            levels.append(result)
        shed = metric(url, "vaswani_shed_requests_total")
    finally:
        process.terminate()
        process.wait(timeout=60)
    report += [f"Load: {args.seconds:g} s a level, one line a request, --max_queue_lines {args.max_queue_lines}, "
               f"--max_batch_tokens 4096 (server's count of shed requests: {shed:,.0f})", "",
               "| figure | 32 clients | 256 clients |", "|---|---:|---:|"]  # fmt: skip
    for key in levels[0]:
        report.append(f"| {key} | " + " | ".join(f"{level[key]:,.1f}" if isinstance(level[key], float)
                                                   else f"{level[key]}" for level in levels) + " |")  # fmt: skip
    growth = levels[1]["RSS MiB at the end"] / levels[0]["RSS MiB at the end"] - 1
    report += ["", f"RSS at 256 clients against 32: {growth:+.1%}", ""]
    process, url = start(args.model, "--max_batch_tokens", "1", "--max_lines", "100")
    try:
        result = disconnects(url, int(url.rsplit(":", 1)[1]), lines)
    finally:
        process.terminate()
        process.wait(timeout=60)
    report += ["Disconnects: 100 clients send 20 lines each and close their sockets 0.3 s later, behind a held "
               "request of 40 lines (batching off)", "", "| figure | value |", "|---|---:|"]  # fmt: skip
    report += [f"| {k} | {v:,.1f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in result.items()]
    publish(report, args.out)


if __name__ == "__main__":
    main()
