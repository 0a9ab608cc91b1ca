"""BLEU against wall time for a `vaswani train` run: reads the run's trainer_state.json (evaluations during
training) and the summary line of its log (the averaged model's final score), writes a PNG and a markdown table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("log", help="stdout of `vaswani train` (its last JSON line is the summary)")
    parser.add_argument("--wall-seconds", type=float, required=True, help="wall time of the whole run")
    parser.add_argument("--png", required=True)
    parser.add_argument("--markdown", required=True)
    args = parser.parse_args()

    history = json.loads((Path(args.run_dir) / "trainer_state.json").read_text())["log_history"]
    points = [(h["elapsed_s"] / 60, h["step"], h["eval_bleu"], h["eval_chrf"]) for h in history if "eval_bleu" in h]
    summary_lines = [line for line in Path(args.log).read_text().splitlines() if line.startswith('{"steps"')]
    summary = json.loads(summary_lines[-1])
    minutes = args.wall_seconds / 60

    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot([p[0] for p in points], [p[2] for p in points], "o-", label="checkpoint (beam 4)")
    label = f"average of last {len(summary['averaged'])} checkpoints"
    axis.plot([minutes], [summary["bleu"]], "r*", markersize=14, label=label)
    axis.set(xlabel="wall time (minutes, 2 CPU cores)", ylabel="BLEU (sacreBLEU, test2016)",
             title="vaswani small preset, Multi30k en→de")  # fmt: skip
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(args.png, dpi=100)

    rows = ["| step | minutes | BLEU | chrF |", "|---:|---:|---:|---:|"]
    rows += [f"| {step} | {m:.1f} | {bleu:.2f} | {chrf:.2f} |" for m, step, bleu, chrf in points]
    rows.append(f"| **{summary['steps']} (averaged {', '.join(summary['averaged'])})** | **{minutes:.1f}** | "
                f"**{summary['bleu']:.2f}** | **{summary['chrf']:.2f}** |")  # fmt: skip
    text = "\n".join([
        "# Multi30k en→de, `small` preset, 2 CPU cores",
        "",
        f"Wall time {minutes:.1f} min in all; training {summary['seconds'] / 60:.1f} min incl. checkpoint evaluations, "
        f"{summary['target_tokens_per_s']} target tokens/s, {summary['steps']} steps.",
        f"Final: BLEU **{summary['bleu']}**, chrF {summary['chrf']}, brevity penalty {summary['brevity_penalty']} "
        f"on {summary['samples']} test2016 sentences (beam 4, GNMT alpha 0.6, max length source + 50).",
        f"BLEU signature: `{summary['bleu_signature']}`",
        "",
        *rows,
        "",
    ])  # fmt: skip
    Path(args.markdown).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
