#!/usr/bin/env python
"""`vaswani train` of narrow and wide models on one thread and on the machine's: where the training thread rule
(`vaswani_hf.training.training_speed.ONE_THREAD_D_MODEL`) pays.

    python benchmarks/training_threads.py [--widths 32 64 128 256] [--steps 200] [--rounds 2] [--sentences 32]
        [--precision auto] [--threads N] [--out FILE]

Each cell is a whole `vaswani train` process on the built-in task (the `tiny` preset's depth with `d_model` set by
`--config_overrides`, d_ff twice it, `--sentences` an update, no evaluation), its thread count set by
`OMP_NUM_THREADS` (1, or `--threads`, by default torch's count: the rule's own switch); rounds alternate which goes
first. The figure is the run's own training seconds (its summary's `seconds`: the updates, not the start-up),
medians; the ratio is the many-thread time over the one-thread time (above 1: one thread is faster). A width whose
runs trained in different precisions (`auto` is measured per thread count) stops with an error: set --precision.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from compare_marian import ISA_LIMITS, machine  # noqa: E402


def train_seconds(width: int, threads: int, args: argparse.Namespace, folder: Path) -> tuple[float, str]:
    """(training seconds, precision) of one `vaswani train` process."""
    command = [sys.executable, "-m", "vaswani_hf.cli", "train", "--preset", "tiny", "--config_overrides",
               f"d_model={width},d_ff={2 * width}", "--max_steps", str(args.steps), "--warmup_steps", "50",
               "--vocab_size", "120", "--per_device_train_batch_size", str(args.sentences), "--eval_split", "none",
               "--save_strategy", "no", "--disable_tqdm", "true", "--precision", args.precision,
               "--output_dir", str(folder)]  # fmt: skip
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    summaries = [line for line in result.stdout.splitlines() if line.startswith('{"')]
    if result.returncode != 0 or not summaries:
        raise SystemExit(f"vaswani train failed (d_model {width}, {threads} threads):\n{result.stderr[-2000:]}")
    summary = json.loads(summaries[-1])
    return summary["seconds"], summary["precision"].split(" ")[0]


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=32, help="sentences an update")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto")
    parser.add_argument("--threads", type=int, default=torch_threads(), help="the many-thread count (default: torch's)")
    parser.add_argument("--out", type=Path, help="the report (default: print it)")
    args = parser.parse_args()
    times: dict[tuple[int, int], list[float]] = {}
    precisions = {}
    with tempfile.TemporaryDirectory() as work:
        for round_ in range(args.rounds):
            for width in args.widths:
                order = (1, args.threads) if round_ % 2 == 0 else (args.threads, 1)
                for threads in order:
                    folder = Path(work) / f"{width}-{threads}"
                    seconds, precision = train_seconds(width, threads, args, folder)
                    times.setdefault((width, threads), []).append(seconds)
                    if precisions.setdefault(width, precision) != precision:  # `auto` measured per thread count
                        raise SystemExit(
                            f"d_model {width}: {precision} on {threads} threads, {precisions[width]} on "
                            "the other count; set --precision to compare like with like"
                        )
                    print(f"d_model {width}, {threads} threads: {seconds} s", file=sys.stderr, flush=True)
    lines = [
        f"# `vaswani train` on one thread and on {args.threads}: {args.steps} updates of {args.sentences} sentences",
        "",
        f"Machine: {machine()}. Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC. Medians of "
        f"{args.rounds} rounds of the runs' own training seconds.",
        "",
        f"| d_model | precision | 1 thread, s | {args.threads} threads, s | {args.threads} threads / 1 thread |",
        "|---:|---|---:|---:|---:|",
    ]
    for width in args.widths:
        one, many = (statistics.median(times[(width, t)]) for t in (1, args.threads))
        lines.append(f"| {width} | {precisions[width]} | {one:.1f} | {many:.1f} | {many / one:.2f} |")
    limits = [f"{name}={os.environ[name]}" for name in ISA_LIMITS if os.environ.get(name)]
    lines += ["", "Rerun: `" + " ".join([*limits, "python", "benchmarks/training_threads.py", *sys.argv[1:]]) + "`"]
    report = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
