#!/usr/bin/env python
"""`vaswani train` end to end against its bare training step: how much of the step's pace the whole pipeline keeps.

Two `vaswani train` runs on the same prepared data (a folder written by `vaswani prepare`), `--steps A B` updates
each, no evaluation, no saving; their difference is the steady pace, free of the start (model build, data
loading, the first batches): (B's target tokens - A's) / (B's seconds - A's). Beside it, the bare step
(`training_speed.step_seconds`: forward, backward, Adam on a random batch already on the device) at `--bare-shape`
rows x tokens, the paper's batch by default, with the same precision and speed-ups; its target tokens per second
are rows x tokens / seconds. The ratio is the share of the bare step's pace that `vaswani train` keeps.

Beside them, the host's share of a step: the median time to read and pad one batch of the prepared data at
`--max-tokens`, the way `vaswani train` does by default (`BatchRows` + `PadPairs`) and row by row through
Transformers' `DataCollatorForSeq2Seq` (`--batch_rows false`), interleaved.

    python benchmarks/train_pipeline.py --data PREPARED --out benchmarks/results/train_pipeline_h100.md   # on a GPU
    python benchmarks/train_pipeline.py --data PREPARED --preset tiny --steps 2 4 --max-tokens 512 \\
        --bare-shape 16 32 --precision fp32                                                              # a smoke run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu import publish  # noqa: E402 (a script beside this one)

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.training.training_speed import Speedups, step_seconds


def train(args: argparse.Namespace, steps: int, workdir: Path) -> dict:
    """One `vaswani train` run of `steps` updates: its summary, with its wall time (the start included). A run
    past `--run-timeout` ends the script with the last lines of its log, which logs every 20 updates."""
    command = [sys.executable, "-m", "vaswani_hf.cli", "train", "--data", str(args.data), "--src", args.src,
               "--tgt", args.tgt, "--eval_split", "none", "--preset", args.preset, "--max_tokens", str(args.max_tokens),
               "--max_steps", str(steps), "--save_strategy", "no", "--eval_strategy", "no", "--logging_steps",
               "20", "--disable_tqdm", "true", "--seed", "1", "--precision", args.precision, "--speedups",
               args.speedups, "--output_dir", str(workdir / f"run-{steps}"), "--overwrite_output_dir",
               *args.train_args]  # fmt: skip
    print(f"vaswani train --max_steps {steps} ...", flush=True)
    log = workdir / f"train-{steps}.log"
    start = time.perf_counter()
    with log.open("w") as output:  # on disk as it goes: a run stopped by a time limit still shows how far it got
        try:
            returncode = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, text=True,
                                        timeout=args.run_timeout).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            tail = " | ".join(log.read_text().splitlines()[-3:])
            raise SystemExit(
                f"vaswani train --max_steps {steps} ran past {args.run_timeout} s: {tail} (log: {log})"
            ) from None
    wall = time.perf_counter() - start
    lines = log.read_text().splitlines()
    summaries = [line for line in lines if line.startswith("{")]
    if returncode or not summaries:
        raise SystemExit(f"vaswani train --max_steps {steps} failed: {' | '.join(lines[-3:])} (log: {log})")
    summary = json.loads(summaries[-1])
    summary["tokens"] = summary["target_tokens_per_s"] * summary["seconds"]
    summary["wall_seconds"] = round(wall, 1)
    print(json.dumps(summary), flush=True)
    return summary


RUN_KEYS = ("steps", "seconds", "wall_seconds", "target_tokens_per_s", "speedups")


def vocabulary_size(data: Path) -> int:
    """The prepared folder's tokenizer size, so the bare step's model has the trained model's output layer."""
    from vaswani_hf.data.prepared_cache import load_tokenizer

    tokenizer = next(data.rglob("tokenizer.json"), None)
    return len(load_tokenizer(tokenizer.parent)) if tokenizer else 32000


def host_batch_ms(data: Path, max_tokens: int, batches: int = 40) -> dict[str, float]:
    """Median milliseconds to read and pad one token batch of the prepared training set, both ways, interleaved."""
    from transformers import DataCollatorForSeq2Seq

    from vaswani_hf.data.batching import BatchRows, PadPairs, TokenBudgetBatchSampler
    from vaswani_hf.data.prepared import PreparedData, token_lengths

    prepared = PreparedData(data)
    tokens, tokenizer = prepared.tokens(prepared.train_split), prepared.tokenizer()
    config = VaswaniConfig.tiny(vocab_size=len(tokenizer))
    model = VaswaniForConditionalGeneration(config)  # the collator takes its teacher-forcing shift from a model
    pad = PadPairs(config.pad_token_id, config.decoder_start_token_id)
    ways = {"BatchRows + PadPairs (default)": (BatchRows(tokens).__getitems__, pad),
            "DataCollatorForSeq2Seq (--batch_rows false)": (tokens.__getitems__, DataCollatorForSeq2Seq(
                tokenizer, model=model))}  # fmt: skip
    seconds = {name: [] for name in ways}
    for indices in islice(TokenBudgetBatchSampler(*token_lengths(tokens), max_tokens=max_tokens, seed=1), batches):
        for name, (read, pad) in ways.items():
            start = time.perf_counter()
            pad(read(indices))
            seconds[name].append(time.perf_counter() - start)
    return {name: 1000 * float(np.median(times)) for name, times in seconds.items()}


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a folder written by `vaswani prepare`")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--max-tokens", type=int, default=24576, help="vaswani train's --max_tokens")
    parser.add_argument("--steps", type=int, nargs=2, default=[40, 160], metavar=("A", "B"))
    parser.add_argument("--bare-shape", type=int, nargs=2, default=[512, 48], metavar=("ROWS", "TOKENS"))
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--speedups", default="off", help="vaswani train's --speedups, and the bare step's")
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[], help="more `vaswani train` args")
    parser.add_argument("--run-timeout", type=float, default=None, help="seconds one `vaswani train` run may take")
    parser.add_argument("--logs", type=Path, help="a folder for the runs' logs (default: a temporary one)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    host = host_batch_ms(args.data, args.max_tokens)
    print(json.dumps({"host_batch_ms": host}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        short, long = (train(args, steps, logs) for steps in args.steps)
    steady = (long["tokens"] - short["tokens"]) / max(long["seconds"] - short["seconds"], 1e-9)
    config = getattr(VaswaniConfig, args.preset)(vocab_size=vocabulary_size(args.data))
    speedups = Speedups.parse(args.speedups) or Speedups()
    rows, length = args.bare_shape
    bare = rows * length / step_seconds(VaswaniForConditionalGeneration(config), device, rows, length,
                                        args.precision, speedups)  # fmt: skip
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    text = "\n".join([
        f"# `vaswani train` against its bare step ({args.preset}, {args.precision}, --speedups {args.speedups})", "",
        f"{name}; torch {torch.__version__}; data {args.data.name}, --max_tokens {args.max_tokens}; runs of "
        f"{args.steps[0]} and {args.steps[1]} updates; bare step at {rows} x {length} target tokens.", "",
        "| what | target tokens/s | share of the bare step |", "|---|---:|---:|",
        f"| bare step (random batch on the device) | {bare:,.0f} | 1.00 |",
        f"| `vaswani train`, steady ({args.steps[0]} -> {args.steps[1]} updates) | {steady:,.0f} | "
        f"{steady / bare:.2f} |",
        f"| `vaswani train` {args.steps[1]} updates, start included | {long['target_tokens_per_s']:,.0f} | "
        f"{long['target_tokens_per_s'] / bare:.2f} |", "",
        f"Runs: {json.dumps({k: short[k] for k in RUN_KEYS})}; {json.dumps({k: long[k] for k in RUN_KEYS})}", "",
        f"The host's part of a step: reading and padding one batch of {args.max_tokens:,} tokens a side "
        f"(median of 40, interleaved) against the bare step's {1000 * rows * length / bare:.1f} ms:", "",
        "| reader | ms a batch |", "|---|---:|", *(f"| {name} | {ms:.1f} |" for name, ms in host.items()),
    ])  # fmt: skip
    return publish(text, args.out)


if __name__ == "__main__":
    main()
