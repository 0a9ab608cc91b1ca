"""Section 6.3 on this machine: train the built-in treebank's parser as `vaswani train --task parse` does by
default, then parse its test split at the paper's beam 21 / alpha 0.3 / input + 300 and score it with EVALB's
rules; given a WSJ folder (train/dev/test .mrg, docs/parsing.md), the paper's recipe on it instead.

    python benchmarks/parsing.py                      # the built-in treebank: F1, training time, sentences/s
    python benchmarks/parsing.py --wsj wsj            # the paper's parser on WSJ 02-21, scored on section 23

Prints one JSON line of figures (the CPU named by its model and flags) and, for the docs, a Markdown row.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu() -> str:
    """The card's name where a GPU trains, else the CPU's model name and the flags that decide its fast paths."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    return f"{name} [{' '.join(flag for flag in FLAGS if flag in flags)}]"


def run(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "vaswani_hf.cli", *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"vaswani {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wsj", help="a folder of train/dev/test .mrg files (the paper's recipe on it)")
    parser.add_argument("--output_dir", default="parsing-benchmark")
    parser.add_argument("--train_args", default="", help="extra `vaswani train` options, e.g. '--max_steps 500'")
    args = parser.parse_args()
    model = Path(args.output_dir) / "model"
    train = ["train", "--task", "parse", "--output_dir", str(model), "--overwrite_output_dir", "--disable_tqdm", "true"]
    if args.wsj:  # section 6.3's parser: the preset, 16K vocabulary, tensor2tensor's warmup, averaged checkpoints
        train += ["--data", args.wsj, "--preset", "parse", "--vocab_size", "16000", "--warmup_steps", "16000",
                  "--save_steps", "1000", "--average_last", "5"]  # fmt: skip
    trained, train_seconds = run(*train, *args.train_args.split())
    summary = json.loads(next(line for line in trained.stdout.splitlines() if line.startswith('{"')))
    # parsing speed at the model's own decoding (beam 21, alpha 0.3, input + 300), over the test split
    evaluate = ["evaluate", str(model), "--split", "test", "--hypotheses", str(Path(args.output_dir) / "test.trees")]
    if args.wsj:
        evaluate += ["--data", args.wsj]
    evaluated, parse_seconds = run(*evaluate)
    figures = json.loads(evaluated.stdout.splitlines()[-1])
    result = {
        "cpu": cpu(),
        "date": time.strftime("%Y-%m-%d"),
        "data": args.wsj or "built-in treebank",
        "train_wall_s": round(train_seconds, 1),
        "steps": summary["steps"],
        "precision": summary["precision"].split(" ")[0],
        "f1_at_training_end": summary.get("evalb_f1"),
        "test_f1": round(figures["evalb_f1"], 2),
        "test_f1_len40": round(figures["evalb_f1_len40"], 2),
        "complete_match": round(figures["evalb_complete_match"], 2),
        "error_sentences": figures["evalb_error_sentences"],
        "repaired": figures["repaired"],
        "sentences": figures["sentences"],
        "parse_wall_s": round(parse_seconds, 1),
        "sentences_per_s_beam21": round(figures["sentences"] / parse_seconds, 2),
    }
    print(json.dumps(result))
    print(f"| {result['cpu']}, {result['date']} | {result['test_f1']:.2f} ({result['error_sentences']} error "
          f"sentences, {result['repaired']} repaired) | {result['train_wall_s'] / 60:.1f} min, {result['steps']} "
          f"updates, {result['precision']} | {result['sentences_per_s_beam21']} |")  # fmt: skip


if __name__ == "__main__":
    main()
