"""The paper's Table 3 (variations on the Transformer architecture) at laptop scale.

Every row of Table 3, scaled from the base model to the `small` preset (N=3, d_model=256, d_ff=1024, h=4, d_k=64,
P_drop=0.1, eps_ls=0.1), trained on Multi30k en->de with the same update budget and token budget, and measured as the
paper measures it: per-token perplexity and BLEU (beam 4, GNMT alpha 0.6, source + 50, no checkpoint averaging) on the
development set (`val`), and the parameter count. Beyond the paper: pre-norm, the split sinusoid layout, and
N=6 at half the table's peak learning rate (the one row that changes the schedule, not the model).

Budget: 1,200 updates of 2,500-token batches (warmup 400, the paper's d_model^-0.5 schedule at half scale), in fp32
on every machine, so that a row's figures do not depend on which CPU ran it (bf16 weights are no faster at this
size: 0.75-1.05 s/step against 0.78 in fp32 on a 2-core AVX512-BF16 EPYC). A base row took 22.7 minutes on such
a machine (1.1 s/step; the same kind of machine measured 0.78 s/step in an earlier session, so expect 15-23 minutes);
the larger rows take longer: on that EPYC N=6 took 35.7 minutes and d_model=512 47.2 (an Intel Sapphire Rapids ran the
base-sized rows in 11.5-14 minutes and d_ff=2048 in 16.9). The 22 rows took 7.3 hours of training in all, split
between the two kinds.

Each row is its own `vaswani train` run in WORKDIR/ROW. A finished row writes benchmarks/results/table3/ROW.json
(committed); a rerun skips finished rows and resumes unfinished ones from their last checkpoint, so the table can be
completed over several sessions. The table and plot are rewritten from whatever rows are finished:

    python benchmarks/table3.py                      # every row not finished yet, in table order
    python benchmarks/table3.py --rows base A1 D3    # only these
    python benchmarks/table3.py --minutes 60         # stop starting new rows after an hour
    python benchmarks/table3.py --render             # rewrite table3.md and table3.png only
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from compare_marian import machine  # CPU model, its vector flags, threads and versions

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "table3"
STEPS, WARMUP, MAX_TOKENS, LR_SCALE = 1200, 400, 2500, 0.5

# name -> (Table 3 group, config overrides, label smoothing); the small base is N=3, d_model=256, h=4.
ROWS: dict[str, tuple[str, str, float]] = {
    "base": ("base", "", 0.1),
    "A1": ("(A)", "h=1,d_k=256", 0.1),
    "A2": ("(A)", "h=2,d_k=128", 0.1),
    "A3": ("(A)", "h=8,d_k=32", 0.1),
    "A4": ("(A)", "h=16,d_k=16", 0.1),
    "B1": ("(B)", "d_k=16", 0.1),
    "B2": ("(B)", "d_k=32", 0.1),
    "C1": ("(C)", "N=2", 0.1),
    "C2": ("(C)", "N=4", 0.1),
    "C3": ("(C)", "N=6", 0.1),
    "C4": ("(C)", "d_model=128,d_k=32", 0.1),
    "C5": ("(C)", "d_model=512,d_k=128", 0.1),
    "C6": ("(C)", "d_ff=512", 0.1),
    "C7": ("(C)", "d_ff=2048", 0.1),
    "D1": ("(D)", "P_drop=0.0", 0.1),
    "D2": ("(D)", "P_drop=0.2", 0.1),
    "D3": ("(D)", "P_drop=0.3", 0.1),
    "D4": ("(D)", "", 0.0),
    "D5": ("(D)", "", 0.2),
    "E": ("(E)", "position_embedding_type=learned", 0.1),
    "pre-norm": ("beyond", "norm_position=pre", 0.1),
    "split-sin": ("beyond", "position_embedding_type=sinusoidal_split", 0.1),
    "C3-half-lr": ("beyond", "N=6", 0.1),
}
# Rows that change the recipe, not the model. C3 (N=6, post-norm) does not learn at the table's peak lr (1.6e-3 after
# 400 warmup updates); at half of it, 7.8e-4 (the paper's base peak is 7.0e-4), it tells a schedule that is too hot
# for a deep post-norm stack (Xiong et al., 2020) from a model that cannot learn at depth.
LR_SCALES = {"C3-half-lr": LR_SCALE / 2}
COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "train steps", "PPL (dev)", "BLEU (dev)",
           "params x10^6", "train loss")  # fmt: skip


def run_row(name: str, data: Path, workdir: Path) -> dict:
    """Train one row (resuming its checkpoints if any) and return its result, also written to RESULTS/ROW.json."""
    group, overrides, smoothing = ROWS[name]
    out = workdir / name
    lr_scale = LR_SCALES.get(name, LR_SCALE)
    resume = any(out.glob("checkpoint-*"))
    command = [sys.executable, "-m", "vaswani_hf.cli", "train", "--data", str(data), "--src", "en", "--tgt", "de",
               "--eval_split", "val", "--preset", "small", "--vocab_size", "8000", "--no_split_punctuation",
               "--max_tokens", str(MAX_TOKENS),
               "--max_steps", str(STEPS), "--warmup_steps", str(WARMUP), "--lr_scale", str(lr_scale),
               "--label_smoothing", str(smoothing), "--average_last", "0", "--save_strategy", "steps",
               "--save_steps", "300", "--save_total_limit", "1", "--eval_strategy", "no",
               "--per_device_eval_batch_size", "100", "--logging_steps", "100", "--disable_tqdm", "true",
               "--seed", "1", "--precision", "fp32", "--output_dir", str(out)]  # fmt: skip
    if overrides:
        command += ["--config_overrides", overrides]
    command += ["--resume"] if resume else ["--overwrite_output_dir"]
    print(f"[table3] {name} {group} {overrides or '(small base)'} eps_ls={smoothing}"
          f"{' (resuming)' if resume else ''}", flush=True)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with (out / "train.log").open("a") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
    facts = json.loads((out / "training_facts.json").read_text())
    # The last logged training loss (the mean of the last 100 updates, label-smoothed, dropout on) tells a row that
    # learns slower within the budget from one that overfits: the dev figures alone cannot.
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    last_loss = next(entry["loss"] for entry in reversed(history) if "loss" in entry)
    model, training, evaluation = facts["model"], facts["training"], facts["evaluation"]
    d_k = model["d_k"]
    result = {"row": name, "group": group, "overrides": overrides, "N": model["encoder_layers"],
              "d_model": model["d_model"], "d_ff": model["d_ff"], "h": model["heads"], "d_k": d_k, "d_v": d_k,
              "P_drop": model["dropout"], "eps_ls": smoothing, "positions": model["positions"], "norm": model["norm"],
              "lr_scale": lr_scale,
              "train_steps": training["steps"], "train_loss": round(last_loss, 3),
              "ppl": round(math.exp(evaluation["loss"]), 2),
              "bleu": evaluation["bleu"], "chrf": evaluation["chrf"], "params": model["parameters"],
              "train_seconds": training["seconds"], "wall_seconds": round(time.time() - started),
              "precision": training["precision"], "machine": machine(),
              "bleu_signature": evaluation["bleu_signature"], "command": command[3:]}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def finished() -> dict[str, dict]:
    return {name: json.loads((RESULTS / f"{name}.json").read_text()) for name in ROWS
            if (RESULTS / f"{name}.json").is_file()}  # fmt: skip


def _cell(row: dict, column: str, base: dict | None) -> str:
    key = {"train steps": "train_steps", "PPL (dev)": "ppl", "BLEU (dev)": "bleu", "params x10^6": "params",
           "train loss": "train_loss"}.get(column, column)  # fmt: skip
    value = row[key]
    if column == "params x10^6":
        return f"{value / 1e6:.2f}"
    # Like the paper, a variation shows only the values that differ from the base row.
    if base is not None and row is not base and column in COLUMNS[:8] and value == base[key]:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def render() -> None:
    """results/table3.md (the paper's columns) and results/table3.png from the finished rows."""
    rows = finished()
    base = rows.get("base")
    lines = ["# Table 3 at laptop scale: variations on the `small` preset, Multi30k en→de", "",
             f"Each row: {STEPS:,} updates of {MAX_TOKENS:,}-token batches, warmup {WARMUP}, the paper's schedule "
             f"x {LR_SCALE}; dev = `val` (1,014 sentences); BLEU = sacreBLEU, beam 4, alpha 0.6, source + 50, no "
             "checkpoint averaging; PPL per BPE token (8,000 shared); train loss = the mean label-smoothed training "
             "loss of the last 100 updates, which tells a row that learns slower within the budget from one that "
             "overfits. Empty cells equal the base row. Produced by "
             "`python benchmarks/table3.py`; rows not run yet are marked.", "",
             "| | " + " | ".join(COLUMNS) + " | note | minutes | machine |",
             "|---|" + "---:|" * len(COLUMNS) + "---|---:|---|"]  # fmt: skip
    for name, (group, overrides, smoothing) in ROWS.items():
        row = rows.get(name)
        label = f"{group} {name}" if group != name else name
        if row is None:
            planned = overrides or f"eps_ls={smoothing}"
            if name in LR_SCALES:
                planned += f", schedule x {LR_SCALES[name]:g}"
            lines.append(f"| {label} | " + " | ".join([""] * len(COLUMNS)) + f" | {planned}: not run yet | | |")
            continue
        note = {"learned": "learned positions", "sinusoidal_split": "sin half, cos half"}.get(row["positions"], "")
        lr = row.get("lr_scale", LR_SCALE)
        note = ", ".join(filter(None, [note, "pre-norm" if row["norm"] == "pre" else "",
                                       f"schedule x {lr:g}" if lr != LR_SCALE else ""]))  # fmt: skip
        cells = " | ".join(_cell(row, column, base) for column in COLUMNS)
        lines.append(f"| {label} | {cells} | {note} | {row['train_seconds'] / 60:.1f} | "
                     f"{row['machine'].split(', torch')[0]}, {row['precision'].split(' ')[0]} |")  # fmt: skip
    lines += ["", f"BLEU signature: `{next(iter(rows.values()))['bleu_signature']}`" if rows else ""]
    (HERE / "results" / "table3.md").write_text("\n".join(lines) + "\n")
    _plot(rows)


def _plot(rows: dict[str, dict]) -> None:
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ROWS if n in rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 0.35 * len(names) + 1.5), sharey=True)
    y = range(len(names))
    left.barh(y, [rows[n]["bleu"] for n in names], color="tab:blue")
    right.barh(y, [rows[n]["ppl"] for n in names], color="tab:orange")
    left.set(yticks=list(y), yticklabels=[f"{ROWS[n][0]} {n}" if ROWS[n][0] != n else n for n in names],
             xlabel="BLEU (dev, beam 4)")  # fmt: skip
    # log scale: a row that did not learn (N=6 post-norm: PPL ~16,000) would flatten every other bar
    right.set(xlabel="perplexity (dev, per BPE token, log scale)", xscale="log")
    left.invert_yaxis()
    if "base" in rows:
        left.axvline(rows["base"]["bleu"], color="grey", linestyle=":")
        right.axvline(rows["base"]["ppl"], color="grey", linestyle=":")
    figure.suptitle(f"Table 3 variations, small preset, Multi30k en→de, {STEPS:,} updates")
    figure.tight_layout()
    figure.savefig(HERE / "results" / "table3.png", dpi=90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data" / "multi30k_en_de")
    parser.add_argument("--workdir", type=Path, default=HERE / "table3-runs", help="checkpoints of unfinished rows")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), help="default: every row, in table order")
    parser.add_argument("--minutes", type=float, help="start no new row after this many minutes")
    parser.add_argument("--render", action="store_true", help="only rewrite the table and plot")
    args = parser.parse_args()
    if not args.render:
        if not (args.data / "train.en").is_file():
            parser.error(f"no Multi30k at {args.data} (train.en, train.de, val.en, val.de): pass --data.")
        started = time.time()
        for name in [n for n in args.rows or ROWS if n not in finished()]:
            if args.minutes is not None and time.time() - started > args.minutes * 60:
                print(f"[table3] --minutes {args.minutes:g} reached; rerun to continue", flush=True)
                break
            result = run_row(name, args.data, args.workdir)
            print(f"[table3] {name}: BLEU {result['bleu']}, PPL {result['ppl']}, {result['train_seconds'] / 60:.1f} "
                  "min", flush=True)  # fmt: skip
            render()
    render()
    print(HERE / "results" / "table3.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
