#!/usr/bin/env python
"""`vaswani serve` against the same model served by CTranslate2 behind a minimal HTTP loop: 1, 8 and 32 clients.

    python benchmarks/serve_engines.py MODEL_DIR [--lines FILE] [--count 1000] [--clients 1 8 32] [--requests 500]
        [--rounds 3] [--precisions fp32 int8] [--beams 4] [--ct2-batching on|off] [--out FILE]

MODEL_DIR is a folder saved by `vaswani train`; it is exported with `vaswani export` (CTranslate2, float32 and int8).
Each contender is a server process on a loopback port, started alone (the other is stopped), warmed up with the first
requests, then driven by N concurrent clients, one line a request, through one client loop (benchmarks/serve_load.py's
`replay`: httpx, LibreTranslate's POST /translate): `vaswani serve MODEL_DIR` on its defaults (dynamic batching,
--max_batch_tokens 4096, --max_wait_ms 10) but `--precision`, against `benchmarks/ct2_translate.py --serve` (stdlib
ThreadingHTTPServer, a backlog of 128; `--ct2-batching on`, the default: one thread batches the waiting lines as
`vaswani serve` does, 10 ms, 32 lines, 4,096 padded tokens; `off`: one request at a time, as LibreTranslate runs
CTranslate2 through argos-translate). Both decode with the model's beam or `--beams` (GNMT alpha for ours, CTranslate2's
own length normalisation for it) and the source + 50 limit, with `--threads` threads. The lines are the first `--count`
of `--lines` (default: Multi30k's test2016.en); rounds alternate the order of the servers; the table gives medians of
sentences/s and of p99 latency (as the clients saw it, and in the server, from its Server-Timing header), and the share
of answers equal between the two engines.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import serve_load  # noqa: E402
from compare_marian import machine  # noqa: E402
from engines import MULTI30K, export  # noqa: E402
from serve_process import free_port, ready, start  # noqa: E402

HERE = Path(__file__).resolve().parent


def start_ct2(args, folder: Path) -> tuple[subprocess.Popen, str]:
    """The CTranslate2 server, ready: its process and URL."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(HERE / "ct2_translate.py"), str(folder), "--tokenizer",
                                args.model, "--serve", str(port), "--beams", str(args.beams), "--threads",
                                str(args.threads), "--length-penalty", str(args.alpha), "--offset", str(args.offset),
                                "--batching", args.ct2_batching])  # fmt: skip
    return ready(process, f"http://127.0.0.1:{port}", 120, "the CTranslate2 server")


def drive(url: str, lines: list[str], clients: int, requests: int) -> dict:
    latencies, server, answers, seconds = asyncio.run(serve_load.replay(url, lines, clients, requests))
    client_q, server_q = statistics.quantiles(latencies, n=100), statistics.quantiles(server, n=100)
    return {"sentences/s": requests / seconds, "p99 ms": client_q[98] * 1000, "server p99 ms": server_q[98] * 1000,
            "answers": answers}  # fmt: skip


def measure(args, lines: list[str]) -> dict:
    """(precision, engine, clients) -> the rounds' results."""
    results: dict = {}
    engines = ["vaswani serve", "CTranslate2"]
    for r in range(args.rounds):
        for precision in args.precisions:
            for engine in engines if r % 2 == 0 else engines[::-1]:
                if engine == "vaswani serve":
                    process, url = start(args.model, "--precision", precision, "--num-beams", str(args.beams))
                else:
                    quantization = None if precision == "fp32" else precision
                    folder = export(args.model, args.work / f"ct2-{quantization or 'float32'}", "ctranslate2",
                                    quantization)  # fmt: skip
                    process, url = start_ct2(args, folder)
                try:
                    drive(url, lines, max(args.clients), min(args.requests, 4 * max(args.clients)))  # warm-up
                    for clients in args.clients:
                        found = drive(url, lines, clients, args.requests)
                        results.setdefault((precision, engine, clients), []).append(found)
                        print(f"round {r + 1} {precision} {engine} {clients} clients: {found['sentences/s']:.1f} "
                              f"sentences/s, p99 {found['p99 ms']:.0f} ms", flush=True)  # fmt: skip
                finally:
                    process.terminate()
                    process.wait(timeout=60)
    return results


def report(args, results: dict, loads: tuple[str, str]) -> str:
    from engines import versions

    def median(key, name):
        return statistics.median(found[name] for found in results[key])

    lines = [f"# `vaswani serve` against CTranslate2 behind a minimal HTTP loop: {Path(args.model).name}", "",
             f"Machine: {machine()}.",
             f"Versions: {versions()}. Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC. Load average "
             f"(1, 5, 15 min) before: {loads[0]}, after: {loads[1]}.", "",
             f"{args.requests} requests of one line each per client count, the first {len(lines_of(args))} lines of "
             f"`{args.lines}`; beam {args.beams}, {args.threads} threads each; `vaswani serve` on its defaults, "
             f"CTranslate2 with batching {args.ct2_batching}; medians of {args.rounds} rounds.", "",
             "| precision | clients | vaswani serve, sentences/s | CTranslate2, sentences/s | ratio | p99 ms (server) "
             "vaswani serve | p99 ms (server) CTranslate2 | equal answers |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for precision in args.precisions:
        for clients in args.clients:
            ours, theirs = (precision, "vaswani serve", clients), (precision, "CTranslate2", clients)
            rate_ours, rate_theirs = median(ours, "sentences/s"), median(theirs, "sentences/s")
            a, b = results[ours][-1]["answers"], results[theirs][-1]["answers"]
            equal = 100 * sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
            lines.append(f"| {precision} | {clients} | {rate_ours:,.2f} | {rate_theirs:,.2f} | "
                         f"{rate_ours / rate_theirs:.2f} | {median(ours, 'p99 ms'):,.0f} "
                         f"({median(ours, 'server p99 ms'):,.0f}) | {median(theirs, 'p99 ms'):,.0f} "
                         f"({median(theirs, 'server p99 ms'):,.0f}) | {equal:.1f}% |")  # fmt: skip
    lines += ["", f"Rerun: `python benchmarks/serve_engines.py {' '.join(args.argv)}`", ""]
    return "\n".join(lines)


def lines_of(args) -> list[str]:
    return [line for line in args.lines.read_text(encoding="utf-8").splitlines() if line.strip()][: args.count]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model folder saved by `vaswani train`")
    parser.add_argument("--lines", type=Path, default=MULTI30K, help="one sentence a line (default: %(default)s)")
    parser.add_argument("--count", type=int, default=1000, help="the first COUNT lines of --lines")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=500, help="requests per client count and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "int8"], default=["fp32"])
    parser.add_argument("--beams", type=int, help="default: the model's beam")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ct2-batching", choices=["on", "off"], default="on")
    parser.add_argument("--work", type=Path, help="the exports (default: a temporary folder)")
    parser.add_argument("--out", type=Path, help="the report (default: benchmarks/results/serve_engines_<cpu>.md)")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if not (Path(args.model) / "tokenizer.json").is_file():
        parser.error(f"{args.model}: not a model folder saved by `vaswani train` (no tokenizer.json)")
    if not args.lines.is_file():
        parser.error(f"--lines {args.lines}: no such file; give one sentence a line with --lines FILE")
    generation = json.loads((Path(args.model) / "generation_config.json").read_text())
    args.alpha, args.beams = generation.get("length_penalty", 1.0), args.beams or generation.get("num_beams", 4)
    args.offset = generation.get("max_length_offset") or 50
    args.work = args.work or Path(tempfile.mkdtemp(prefix="vaswani-serve-engines-"))
    from vaswani_hf.serving.service import model_languages

    serve_load.TARGET = model_languages(args.model, None, None)[1]
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the servers' threads (they inherit the environment)
    loads = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results = measure(args, lines_of(args))
    text = report(args, results, (loads, " ".join(f"{x:.2f}" for x in os.getloadavg())))
    from engines import write_report

    write_report(text, args.out, "serve_engines")


if __name__ == "__main__":
    main()
