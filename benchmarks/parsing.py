"""Section 6.3 on this machine: train the built-in treebank's parser as `vaswani train --task parse` does by
default, then parse its test split at the paper's beam 21 / alpha 0.3 / input + 300 and score it with EVALB's
rules; given a WSJ folder (train/dev/test .mrg, docs/parsing.md), the paper's recipe on it instead.

    python benchmarks/parsing.py                      # the built-in treebank: F1, training time, sentences/s
    python benchmarks/parsing.py --wsj wsj            # the paper's parser on WSJ 02-21, scored on section 23
    python benchmarks/parsing.py --model DIR --beams 1,4,8,21 [--repeats 3] [--avx2]

Prints one JSON line of figures (the CPU named by its model and flags) and, for the docs, a Markdown row.

With --beams, no training: a saved parser (--model, or the one trained here before) parses the built-in test
split's words (or --wsj's section 23) as a whole `vaswani parse` command at each beam size (loading and all,
its own length penalty and limit), scored with EVALB's rules against the split's cleaned trees: one Markdown row
a beam (sentences/s, F1), so users can choose a beam. Each command runs --repeats times, the beams taking turns,
and the median is kept (timings on a shared machine are noisy). --avx2 runs the commands as on a CPU without
AVX-512 or AMX (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
# what --avx2 sets: torch's kernels, oneDNN and MKL as on a CPU with AVX2 alone
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


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


def run(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "vaswani_hf.cli", *args], capture_output=True, text=True,
                            env=None if env is None else {**os.environ, **env})  # fmt: skip
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"vaswani {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result, seconds


def test_split(wsj: str | None, form: str) -> tuple[list[str], list]:
    """The test split's sentences (words split at spaces) and their cleaned gold trees, as `vaswani evaluate`
    scores them."""
    from vaswani_hf.parsing.builtin_treebank import builtin_treebank
    from vaswani_hf.parsing.treebank import gold_pairs, split_file
    from vaswani_hf.parsing.trees import read_trees

    trees = read_trees(split_file(Path(wsj), "test")) if wsj else builtin_treebank()["test"]
    examples = list(gold_pairs(trees, form))
    return [words for words, *_ in examples], [gold for *_, gold in examples]


def versions() -> str:
    import torch
    import transformers

    return f"torch {torch.__version__}, Transformers {transformers.__version__}"


def beam_table(args, model: Path) -> None:
    """Sentences/s of a whole `vaswani parse` command and the F1 of its trees, at each of `args.beams`."""
    from vaswani_hf.parsing.evalb import read_tree, score_trees
    from vaswani_hf.parsing.task import SCORING, scored_tree

    parsing = json.loads((model / "config.json").read_text())["parsing"]
    sentences, gold = test_split(args.wsj, parsing.get("form", "tags"))
    folder = Path(args.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    words = folder / "test.words"
    words.write_text("".join(f"{line}\n" for line in sentences), encoding="utf-8")
    beams = [int(b) for b in args.beams.split(",")]
    env = AVX2 if args.avx2 else None
    seconds: dict[int, list[float]] = {beam: [] for beam in beams}
    for turn in range(args.repeats):
        for beam in beams if turn % 2 == 0 else beams[::-1]:  # the beams take turns: a busy spell hits them all
            hypotheses = folder / f"test.beam{beam}.trees"
            _, took = run("parse", str(model), str(words), "--num-beams", str(beam), "--output", str(hypotheses),
                          *args.parse_args.split(), env=env)  # fmt: skip
            seconds[beam].append(took)
    kind = cpu() + (" with AVX2 emulation (" + " ".join(f"{k}={v}" for k, v in AVX2.items()) + ")" if args.avx2 else "")
    for beam in beams:
        lines = (folder / f"test.beam{beam}.trees").read_text(encoding="utf-8").splitlines()
        tests = [None if tree is None else scored_tree(tree, g, parsing) for tree, g in
                 zip(map(read_tree, lines), gold, strict=True)]  # fmt: skip
        figures = score_trees(gold, tests, SCORING).as_dict()
        median = statistics.median(seconds[beam])
        result = {"cpu": kind, "versions": versions(), "date": time.strftime("%Y-%m-%d"), "model": str(model),
                  "beam": beam, "sentences": len(sentences), "command_s": [round(t, 2) for t in seconds[beam]],
                  "sentences_per_s": round(len(sentences) / median, 2), "test_f1": round(figures["evalb_f1"], 2),
                  "error_sentences": figures["evalb_error_sentences"]}  # fmt: skip
        print(json.dumps(result))
        print(f"| {beam} | {result['sentences_per_s']} ({median:.1f} s, median of {len(seconds[beam])}) | "
              f"{result['test_f1']:.2f} ({result['error_sentences']} error sentences) |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wsj", help="a folder of train/dev/test .mrg files (the paper's recipe on it)")
    parser.add_argument("--output_dir", default="parsing-benchmark")
    parser.add_argument("--train_args", default="", help="extra `vaswani train` options, e.g. '--max_steps 500'")
    parser.add_argument("--beams", help="no training: sentences/s and F1 of `vaswani parse` at these beam sizes")
    parser.add_argument("--model", help="with --beams: the parser (default: OUTPUT_DIR/model)")
    parser.add_argument("--repeats", type=int, default=1, help="with --beams: runs of each command (median kept)")
    parser.add_argument("--avx2", action="store_true", help="with --beams: as on a CPU with AVX2 alone")
    parser.add_argument("--parse_args", default="", help="with --beams: extra `vaswani parse` options")
    args = parser.parse_args()
    model = Path(args.model or Path(args.output_dir) / "model")
    if args.beams:
        return beam_table(args, model)
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
