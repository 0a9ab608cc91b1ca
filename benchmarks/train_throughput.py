#!/usr/bin/env python
"""Training throughput of `vaswani train` itself, one row per precision and attention kernel (issue 13).

Each row is a separate `vaswani train` process on the same data, preset, token budget and number of updates, so the
figures include everything a user's run pays (data collation, the optimizer, Trainer's bookkeeping). From its
summary line: updates, seconds, target tokens per second, seconds per update, the peak GPU memory (on CUDA) and the
precision it ran in (with `auto`'s reason). A row that fails (e.g. a flash-attention package that is not installed)
keeps its first error line in the table instead of a number.

The paper's reference point (section 5.2): the base model took 0.4 s per update of ~25,000 source + 25,000 target
tokens on 8 P100 GPUs, about 62,500 target tokens/s for all eight; fairseq reports ~40,000 target tokens/s on one
V100 in fp16 (Ott et al., 2018, scaled to one GPU).

    python benchmarks/train_throughput.py --data ../shared/data/multi30k_en_de --out benchmarks/results/x.md
    python benchmarks/train_throughput.py --rows fp32 bf16 --steps 20 --max-tokens 2500   # a quick CPU check
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROWS = {
    "fp32": ["--precision", "fp32", "--attn_implementation", "sdpa"],
    "fp32+tf32": ["--precision", "fp32", "--attn_implementation", "sdpa", "--tf32", "true"],
    "bf16": ["--precision", "bf16", "--attn_implementation", "sdpa"],
    "auto": ["--precision", "auto"],
    "bf16-eager": ["--precision", "bf16", "--attn_implementation", "eager"],
    "bf16-flash2": ["--precision", "bf16", "--attn_implementation", "flash_attention_2"],
    "bf16-compile": ["--precision", "bf16", "--attn_implementation", "sdpa", "--torch_compile", "true"],
    # R-Drop (regularization.py) beside "bf16": its two passes and KL term, at the alpha the recipe page tries
    "bf16-rdrop": ["--precision", "bf16", "--attn_implementation", "sdpa", "--r_drop_alpha", "5"],
}


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    from vaswani_hf.model.precision import cpu_name

    return f"{cpu_name()} ({platform.machine()}), torch {torch.__version__}, CPU"


def run_row(name: str, args: argparse.Namespace, workdir: Path) -> dict:
    command = [sys.executable, "-m", "vaswani_hf.cli", "train", "--data", args.data, "--src", args.src,
               "--tgt", args.tgt, "--eval_split", args.eval_split, "--max_eval_samples", "100",
               "--preset", args.preset, "--vocab_size", str(args.vocab_size), "--max_tokens", str(args.max_tokens),
               "--max_steps", str(args.steps), "--warmup_steps", "4000", "--save_strategy", "no",
               "--eval_strategy", "no", "--logging_steps", "50", "--disable_tqdm", "true", "--seed", "1",
               "--output_dir", str(workdir / name), "--overwrite_output_dir", *ROWS[name]]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    (workdir / f"{name}.log").write_text(result.stdout + result.stderr)
    summaries = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not summaries:
        errors = [line for line in result.stderr.splitlines() if "Error" in line or "error" in line]
        return {"error": (errors[-1] if errors else f"exit {result.returncode}").strip()[:200]}
    return json.loads(summaries[-1])


def write_table(results: dict, args: argparse.Namespace, path: Path) -> None:
    lines = [
        f"# `vaswani train` throughput: {args.preset} preset, {args.steps} updates of {args.max_tokens:,}-token "
        "batches",
        "",
        f"Machine: {machine()}. Data: `{Path(args.data).name}` ({args.src}->{args.tgt}), "
        f"{args.vocab_size:,} shared BPE. "
        "Produced by `python benchmarks/train_throughput.py`; each row is its own `vaswani train` process, and its "
        "seconds include the first (warm-up) updates.",
        "",
        "| row | precision (as the run reports it) | updates | seconds | s/update | target tokens/s | peak GPU GiB |"
        " final BLEU |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error']} | | | | | | |")
            continue
        lines.append(f"| {name} | {r['precision']} | {r['steps']} | {r['seconds']} | "
                     f"{r['seconds'] / max(r['steps'], 1):.3f} | {r['target_tokens_per_s']:,} | "
                     f"{r.get('peak_gpu_memory_gib', '')} | {r.get('bleu', '')} |")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(Path(__file__).parents[2] / "shared/data/multi30k_en_de"))
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--eval-split", dest="eval_split", default="val")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab-size", dest="vocab_size", type=int, default=8000)
    parser.add_argument("--max-tokens", dest="max_tokens", type=int, default=25000,
                        help="the paper's batch: ~25,000 target tokens per update (section 5.1)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/train_throughput.md"))
    parser.add_argument("--workdir", type=Path, help="keep the runs' folders and logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        results = {}
        for name in args.rows:
            results[name] = run_row(name, args, workdir)
            print(name, json.dumps(results[name]), flush=True)
        write_table(results, args, args.out)


if __name__ == "__main__":
    main()
