"""The Multi30k en->de recipe as one command: train the kept recipe once per seed, score `val` and the four test
splits with the recipe's decoding, then write the seed table (each seed, the mean, the standard deviation and the
range) and the translations of the seed closest to the mean on test2016.

    python benchmarks/multi30k_recipe.py                          # seeds 1 2 3; 35-50 minutes a seed, 2 CPU cores
    python benchmarks/multi30k_recipe.py --results benchmarks/results/multi30k   # refresh the committed table
    python benchmarks/multi30k_recipe.py --name rdrop5 --splits val --change="--r_drop_alpha 5"   # a candidate

A candidate is the recipe plus `--change` (flags of `vaswani train`, given after the recipe's, so they win) and is
scored on `val` only: every choice is made there. The command is resumable: a seed whose model is saved is not
trained again (a seed stopped midway resumes from its last checkpoint), and a split already scored with the same
decoding is not decoded again. Each run's folder keeps `scores.{split}.json` (what `vaswani evaluate` printed, with
the decoding) and `hyp.{split}.de`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "data" / "multi30k_en_de"
SPLITS = ("val", "test2016", "test2017_flickr", "test2017_mscoco", "test2018_flickr")
REPORTED = "test2016"  # the split the seed closest to the mean is chosen by

# The kept recipe (benchmarks/results/multi30k/README.md has how each setting was chosen on `val`).
RECIPE = (
    "--src en --tgt de --eval_split val --preset small --vocab_size 8000 "
    "--dropout 0.3 --label_smoothing 0.1 --weight_decay 0.1 --config_overrides norm_position=pre "
    "--max_tokens 2500 --learning_rate 2e-3 --warmup_steps 800 --max_steps 4016 "
    "--save_strategy steps --save_steps 300 --average_last 5 "
    "--eval_strategy steps --eval_steps 1000 --per_device_eval_batch_size 100 --disable_tqdm true"
)
# Section 6.1's beam 4 and source + 50, with the GNMT alpha tuned on `val` (1.5 beat the paper's 0.6 there)
DECODING = "--num-beams 4 --length-penalty 1.5 --precision fp32"

Runner = Callable[[list[str]], str]


def run_vaswani(args: list[str]) -> str:
    """`vaswani ARGS` in this Python, its output shown as it comes (a seed trains for most of an hour); returns
    what it printed to stdout."""
    print("$ vaswani " + shlex.join(args), flush=True)
    printed = []
    with subprocess.Popen([sys.executable, "-m", "vaswani_hf.cli", *args], stdout=subprocess.PIPE, text=True) as run:
        for line in run.stdout:
            sys.stdout.write(line)
            printed.append(line)
    if run.returncode:
        sys.exit(f"vaswani {args[0]} failed (exit {run.returncode}); the run folder is kept, run again to resume.")
    return "".join(printed)


def train_arguments(change: str) -> list[str]:
    """The recipe's flags with `change`'s after them, so that a changed flag takes the candidate's value; the
    `--config_overrides` of both are merged into one (a second one would replace the recipe's pre-norm)."""
    flags, overrides = [], []
    words = iter([*shlex.split(RECIPE), *shlex.split(change)])
    for word in words:
        if word == "--config_overrides":
            overrides.append(next(words, ""))
        elif word.startswith("--config_overrides="):
            overrides.append(word.partition("=")[2])
        else:
            flags.append(word)
    return [*flags, "--config_overrides", ",".join(overrides)]


def finished(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run that trained to its end. `vaswani train` also saves the model when it is stopped
    early (by a signal, or by --max_train_minutes), so a saved model alone does not say so; its trainer state does."""
    state = run_dir / "trainer_state.json"
    if not ((run_dir / "model.safetensors").is_file() and state.is_file()):
        return False
    saved = json.loads(state.read_text(encoding="utf-8"))
    return saved["global_step"] >= saved["max_steps"]  # the Trainer writes both


def train(run_dir: Path, seed: int, data: Path, change: str, runner: Runner) -> None:
    """The recipe (plus `change`) for one seed into `run_dir`: nothing if it trained to its end, resumed if it was
    stopped."""
    if finished(run_dir):
        return
    resume = ["--resume", "true"] if any(run_dir.glob("checkpoint-*")) else []
    runner(["train", "--data", str(data), *train_arguments(change), "--seed", str(seed),
            "--output_dir", str(run_dir), *resume])  # fmt: skip


def score(run_dir: Path, split: str, data: Path, decoding: str, runner: Runner) -> dict:
    """`vaswani evaluate` of one split, translations beside it; a split scored before with the same decoding is
    read back rather than decoded again."""
    saved = run_dir / f"scores.{split}.json"
    if saved.is_file() and (scored := json.loads(saved.read_text(encoding="utf-8"))).get("decoding") == decoding:
        return scored
    printed = runner(["evaluate", str(run_dir), "--data", str(data), "--split", split, *shlex.split(decoding),
                      "--hypotheses", str(run_dir / f"hyp.{split}.de")])  # fmt: skip
    scored = {**json.loads(printed[printed.index("{") :]), "decoding": decoding}  # the JSON evaluate prints last
    saved.write_text(json.dumps(scored, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return scored


def seed_table(scores: dict[int, dict[str, dict]], splits: Sequence[str]) -> str:
    """Markdown: a row per seed (BLEU, chrF in brackets), then the mean, the sample standard deviation and the
    range of BLEU over seeds."""
    seeds = sorted(scores)
    bleu = {split: [scores[seed][split]["bleu"] for seed in seeds] for split in splits}
    lines = ["| seed | " + " | ".join(splits) + " |", "|---|" + "---:|" * len(splits)]
    for seed in seeds:
        cells = (f"{scores[seed][split]['bleu']:.2f} ({scores[seed][split]['chrf']:.2f})" for split in splits)
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    summaries = {"mean": lambda values: f"**{statistics.mean(values):.2f}**"}
    if len(seeds) > 1:  # one seed has no spread
        summaries["standard deviation"] = lambda values: f"{statistics.stdev(values):.2f}"
        summaries["min-max"] = lambda values: f"{min(values):.2f}-{max(values):.2f}"
    for label, cell in summaries.items():
        lines.append(f"| {label} | " + " | ".join(cell(bleu[split]) for split in splits) + " |")
    return "\n".join(lines) + "\n"


def closest_to_mean(scores: dict[int, dict[str, dict]], split: str) -> int:
    """The seed whose BLEU on `split` is nearest the mean over seeds (the lowest seed on a tie)."""
    mean = statistics.mean(scores[seed][split]["bleu"] for seed in scores)
    return min(sorted(scores), key=lambda seed: abs(scores[seed][split]["bleu"] - mean))


def main(argv: Sequence[str] | None = None, runner: Runner = run_vaswani) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--data", type=Path, default=DATA, help=f"Multi30k's split files (default: {DATA})")
    parser.add_argument("--runs", type=Path, default=Path("multi30k-runs"), help="where the seeds' runs go")
    parser.add_argument("--name", default="recipe", help="run folders are RUNS/NAME-sSEED")
    parser.add_argument("--change", default="", help="flags of `vaswani train` added after the recipe's (a candidate)")
    parser.add_argument("--decoding", default=DECODING, help=f"flags of `vaswani evaluate` (default: {DECODING!r})")
    parser.add_argument("--splits", nargs="+", default=list(SPLITS), help="splits to score (a candidate: val)")
    parser.add_argument("--results", type=Path, help="where the table and the translations go (default: RUNS/NAME)")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        parser.error(f"--data {args.data} is not a folder: pass the folder holding Multi30k's train.en, train.de, ...")
    results = args.results or args.runs / args.name
    scores = {}
    for seed in args.seeds:
        run_dir = args.runs / f"{args.name}-s{seed}"
        train(run_dir, seed, args.data, args.change, runner)
        scores[seed] = {split: score(run_dir, split, args.data, args.decoding, runner) for split in args.splits}
    results.mkdir(parents=True, exist_ok=True)
    table = seed_table(scores, args.splits)
    chosen = closest_to_mean(scores, REPORTED if REPORTED in args.splits else args.splits[0])
    for split in args.splits:
        shutil.copyfile(args.runs / f"{args.name}-s{chosen}" / f"hyp.{split}.de", results / f"hyp.{split}.de")
    scored = next(iter(scores[chosen].values()))
    signatures = "; ".join(
        f"{name} `{scored[name]}`" for name in ("bleu_signature", "chrf_signature") if name in scored
    )
    (results / "seeds.md").write_text(
        f"BLEU (chrF) of `{args.name}`: the recipe{' plus ' + args.change if args.change else ''}, decoded with "
        f"`{args.decoding}`.\n\n{table}\nhyp.{{split}}.de: seed {chosen}'s translations, the seed closest to the "
        f"mean.\n\nSignatures: {signatures}\n",
        encoding="utf-8",
    )
    print(table + f"\nwritten to {results}/seeds.md; translations of seed {chosen}, the seed closest to the mean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
