"""Load on `vaswani serve`: N concurrent clients (httpx, async) replay the lines of a test set, one line a request,
against a server this script starts, with dynamic batching and then with batching off (`--max_batch_tokens 1`: one
line a batch), the baseline. Every answer is compared with `vaswani translate` on the same lines, byte for byte;
where another batch composition flipped a near tie, the pair is counted and its margin given (the two candidates'
length-penalised log-probabilities under the model, by forced decoding).

    python benchmarks/serve_load.py MODEL_DIR [--lines FILE] [--clients 32] [--requests 2000] [--out FILE]

Reports sentences/s, target tokens/s, p50/p95/p99 latency as the clients saw it and p50/p99 as the server did (its
Server-Timing header: without this process's own time on a shared machine), lines per batch, the slowest batch, and
the server's RSS after a warm-up and at the end. The built-in test split's English lines are the default input.

`--many` runs benchmarks/serve_many.py instead: one server of several models (mixed load, a composed pair,
--max_loaded 1 against 2), against one holding a model alone."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from compare_marian import machine  # noqa: E402
from serve_process import start  # noqa: E402 (serve_overload takes start from here too)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def replay(url: str, lines: list[str], clients: int, requests: int) -> tuple[list[float], list[float],
                                                                                 list[str], float]:  # fmt: skip
    """`requests` requests (line i % len(lines)) from `clients` concurrent clients: latencies as the clients saw
    them and as the server did (its Server-Timing header), answers by request, wall seconds."""
    latencies, answers, next_request = [0.0] * requests, [None] * requests, iter(range(requests))
    server_latencies = [0.0] * requests

    async def client(http: httpx.AsyncClient) -> None:
        for i in next_request:
            start = time.perf_counter()
            answer = await http.post(f"{url}/translate", json={"q": lines[i % len(lines)], "source": "auto",
                                                                "target": TARGET})  # fmt: skip
            latencies[i] = time.perf_counter() - start
            answer.raise_for_status()
            server_latencies[i] = float(answer.headers["server-timing"].removeprefix("app;dur=")) / 1000
            answers[i] = answer.json()["translatedText"]

    # each client its own connection, as separate apps have: one shared pool of 32 costs httpx about 2.4x the client
    # time per request (measured), which made answered clients send their next lines late. All are made before the
    # clock starts: making one costs 46 ms (its TLS context), so made in turn they held the first requests back
    # 1.5 s, which the clients counted and the server did not
    async with contextlib.AsyncExitStack() as stack:
        https = [await stack.enter_async_context(httpx.AsyncClient(timeout=600)) for _ in range(clients)]
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for http in https))
        seconds = time.perf_counter() - start
    return latencies, server_latencies, answers, seconds


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[-1])
    return float("nan")


def run(args: argparse.Namespace, lines: list[str], options: list[str], reference: dict[str, str],
        requests: int) -> dict:  # fmt: skip
    process, url = start(args.model, "--max_wait_ms", str(args.max_wait_ms), *options)
    try:
        # warm-up: every distinct line once (batch shapes, the allocator's pools), at most the run's own length
        asyncio.run(replay(url, lines, args.clients, min(requests, max(4 * args.clients, len(set(lines))))))
        before = rss_mib(process.pid)
        batches_before = metric(url, "vaswani_batch_lines_count")
        latencies, server_latencies, answers, seconds = asyncio.run(replay(url, lines, args.clients, requests))
        after = rss_mib(process.pid)
        slowest = metric(url, "vaswani_slowest_batch_seconds")
        batches = metric(url, "vaswani_batch_lines_count") - batches_before
    finally:
        process.terminate()
        process.wait(timeout=60)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokens = sum(len(ids) for ids in tokenizer([a or "" for a in answers])["input_ids"])
    flipped = [(lines[i % len(lines)], answer) for i, answer in enumerate(answers)
               if answer != reference[lines[i % len(lines)]]]  # fmt: skip
    quantiles, server = statistics.quantiles(latencies, n=100), statistics.quantiles(server_latencies, n=100)
    return {"requests": requests, "sentences/s": requests / seconds, "target tokens/s": tokens / seconds,
            "p50 ms": quantiles[49] * 1000, "p95 ms": quantiles[94] * 1000, "p99 ms": quantiles[98] * 1000,
            "server p50 ms": server[49] * 1000, "server p99 ms": server[98] * 1000,
            "lines per batch": requests / batches, "slowest batch ms": slowest * 1000,
            "RSS MiB after warm-up": before, "RSS MiB at the end": after,
            "answers": sum(a is not None for a in answers), "lost": sum(a is None for a in answers),
            "differ from vaswani translate": len(flipped), "flipped": flipped}  # fmt: skip


def margins(model_dir: str, flipped: list[tuple[str, str]], reference: dict[str, str]) -> list[float]:
    """For each answer that differs, how far apart the two candidates are (length-penalised log-probabilities)."""
    if not flipped:
        return []
    from vaswani_hf.translation.inference import load_for_inference, score_translations

    model, tokenizer = load_for_inference(model_dir, device="cpu", precision="fp32")
    alpha = model.generation_config.length_penalty or 0.0
    sources = [source for source, _ in flipped]
    theirs = score_translations(model, tokenizer, sources, [answer for _, answer in flipped], progress=False)
    ours = score_translations(model, tokenizer, sources, [reference[s] for s in sources], progress=False)
    return [abs(a["log_prob"] / ((5 + a["tokens"]) / 6) ** alpha - b["log_prob"] / ((5 + b["tokens"]) / 6) ** alpha)
            for a, b in zip(theirs, ours, strict=True)]  # fmt: skip


TARGET = "de"


def marian_base(model_dir: str, out: Path) -> str:
    """A base-size model (Table 3: 512 wide, 6 + 6 layers, 8 heads, 2048 inner) built as Transformers' Marian with
    random weights and converted (`marian_to_vaswani`, the paper's decoding), with `model_dir`'s tokenizer and
    training facts: a worst case for the server, whose translations run to the source + 50 limit."""
    import shutil

    from transformers import AutoConfig, AutoTokenizer, MarianConfig, MarianMTModel

    from vaswani_hf.interop.convert import marian_to_vaswani

    tokenizer, ours = AutoTokenizer.from_pretrained(model_dir), AutoConfig.from_pretrained(model_dir)
    size = ours.vocab_size
    config = MarianConfig(vocab_size=size, decoder_vocab_size=size, d_model=512, encoder_layers=6, decoder_layers=6,
                          encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                          decoder_ffn_dim=2048, activation_function="relu", scale_embedding=True,
                          share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
                          max_position_embeddings=512, pad_token_id=ours.pad_token_id, eos_token_id=ours.eos_token_id,
                          bos_token_id=ours.bos_token_id, decoder_start_token_id=ours.decoder_start_token_id,
                          forced_eos_token_id=None)  # fmt: skip
    marian_to_vaswani(MarianMTModel(config).eval(), paper_decoding=True).save_pretrained(out)
    tokenizer.save_pretrained(out)
    shutil.copy(Path(model_dir) / "training_facts.json", out)
    return str(out)


def main() -> None:
    global TARGET
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--lines", type=Path, help="one sentence a line (default: the built-in test split)")
    parser.add_argument("--target", default=None, help="the target language code (default: the model's)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--baseline_requests", type=int, default=500, help="requests with batching off (slower)")
    parser.add_argument("--max_wait_ms", type=float, default=10.0)
    parser.add_argument("--max_batch_tokens", type=int, default=4096)
    parser.add_argument(
        "--marian-base",
        action="store_true",
        help="serve a base-size model converted from Marian (random weights) with MODEL's tokenizer",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.marian_base:
        import tempfile

        args.model = marian_base(args.model, Path(tempfile.mkdtemp()) / "marian-base")
    from vaswani_hf.serving.service import model_languages

    TARGET = args.target or model_languages(args.model, None, None)[1]
    if args.lines:
        lines = [line for line in args.lines.read_text(encoding="utf-8").split("\n") if line.strip()]
    else:
        from vaswani_hf.data.number_words import builtin_splits

        lines = [source for source, _ in builtin_splits()["test"]]
    unique = list(dict.fromkeys(lines))
    translated = subprocess.run([sys.executable, "-m", "vaswani_hf.cli", "translate", args.model],
                                input="\n".join(unique) + "\n", capture_output=True, text=True, check=True)  # fmt: skip
    reference = dict(zip(unique, translated.stdout.split("\n")[: len(unique)], strict=True))
    results = {"batched": run(args, lines, ["--max_batch_tokens", str(args.max_batch_tokens)], reference,
                              args.requests),
               "batching off": run(args, lines, ["--max_batch_tokens", "1"], reference,
                                   args.baseline_requests)}  # fmt: skip
    report = [f"# `vaswani serve` under load: {args.model}", "", machine(), "",
              f"{args.clients} concurrent clients, requests of one line each ({len(unique)} distinct "
              f"lines), --max_wait_ms {args.max_wait_ms:g}; batched: --max_batch_tokens {args.max_batch_tokens}", "",
              "| figure | batched | batching off |", "|---|---:|---:|"]  # fmt: skip
    for key in results["batched"]:
        if key == "flipped":
            continue
        values = [results[name][key] for name in results]
        report.append(f"| {key} | " + " | ".join(f"{v:,.1f}" if isinstance(v, float) else f"{v:,}" for v in values)
                      + " |")  # fmt: skip
    speedup = results["batched"]["sentences/s"] / results["batching off"]["sentences/s"]
    # the line's own wait, and the wait after the batch before it for the clients that batch answered (ten at most)
    bound = 11 * args.max_wait_ms + results["batched"]["slowest batch ms"]
    growth = results["batched"]["RSS MiB at the end"] / results["batched"]["RSS MiB after warm-up"] - 1
    p99, server_p99 = results["batched"]["p99 ms"], results["batched"]["server p99 ms"]
    report += ["", f"throughput batched / off: {speedup:.2f}x; p99 {p99:.0f} ms as the clients saw it, "
               f"{server_p99:.0f} ms in the server, against 11 x max_wait + the slowest batch = {bound:.0f} ms; RSS "
               f"growth after warm-up {growth:+.1%}"]  # fmt: skip
    for name, result in results.items():
        if result["flipped"]:
            found = margins(args.model, result["flipped"], reference)
            report.append(f"{name}: {len(found)} answers differ from `vaswani translate`; margins (length-penalised "
                          f"log-probability): median {statistics.median(found):.4f}, max {max(found):.4f}")  # fmt: skip
    publish(report, args.out)


def publish(report: list[str], out: Path | None) -> None:
    """Print the report's lines, and write them to `out` when given."""
    text = "\n".join(report) + "\n"
    print(text)
    if out:
        out.write_text(text)


if __name__ == "__main__":
    if "--many" in sys.argv:  # two models under mixed load, a composed pair, --max_loaded: serve_many.py
        sys.argv.remove("--many")
        from serve_many import main as many

        many()
    else:
        main()
