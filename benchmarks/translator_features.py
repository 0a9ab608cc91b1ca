"""Issue 33's reports on Multi30k: lexically constrained decoding with terms taken from the references, prefix
decoding, and ensembles of trained models against each alone and against checkpoint averaging.

    python benchmarks/translator_features.py --data ../shared/data/multi30k_en_de --split test2016 \
        --runs RUN_A RUN_B --markdown benchmarks/results/translator_features.md

Each RUN is a `vaswani train` output folder with its checkpoint-* folders; the last --average-last of them are
averaged here and ensembled. Terms: for each sentence, the longest alphabetic reference word (4 letters or more) that
the unconstrained translation lacks (Post & Vilar's setting: a term the system would otherwise miss); sentences
whose translation already has every such word get none. Prefix: the reference's first two words.
"""

from __future__ import annotations

import argparse
import platform
import re
import tempfile
import time
from pathlib import Path

import torch

from vaswani_hf.data.readers import load_split
from vaswani_hf.training.averaging import average_checkpoints, last_checkpoints
from vaswani_hf.translation.ensemble import Ensemble
from vaswani_hf.translation.inference import load_for_inference, score, translate_nbest


def run(model, tokenizer, sources, **kwargs) -> tuple[list[str], float]:
    start = time.perf_counter()
    results = translate_nbest(model, tokenizer, sources, progress=False, batch_size=64, **kwargs)
    return [candidates[0][0] for candidates in results], time.perf_counter() - start


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


def pick_term(reference: str, hypothesis: str) -> str | None:
    missing = [w for w in reference.split() if w.isalpha() and len(w) >= 4 and w not in words(hypothesis)]
    return max(missing, key=len) if missing else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--runs", nargs="+", required=True, type=Path)
    parser.add_argument("--limit", type=int, default=None, help="first N sentences only")
    parser.add_argument("--average-last", type=int, default=2, help="checkpoints averaged or ensembled per run")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    pairs = load_split(args.data, args.split, "en", "de")[: args.limit]
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    lines = [f"# Issue 33 on Multi30k {args.split} ({len(pairs)} sentences)", "",
             f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
             f"{torch.__version__}; beam 4, GNMT alpha 0.6, source + 50; sacrebleu BLEU (13a, cased).", ""]  # fmt: skip

    # ensembles against single models and checkpoint averaging
    scratch = Path(tempfile.mkdtemp(prefix="translator-features-"))
    singles, averages, kept = {}, {}, {}
    for run_dir in args.runs:
        checkpoints = last_checkpoints(run_dir, args.average_last, "--average-last")
        kept[run_dir.name] = [load_for_inference(c, device="cpu")[0] for c in checkpoints]
        singles[f"{run_dir.name}, last checkpoint"] = kept[run_dir.name][-1]
        averaged = average_checkpoints(checkpoints, scratch / run_dir.name)
        averages[f"{run_dir.name}, average of its last {len(checkpoints)} checkpoints"] = load_for_inference(averaged)
    tokenizer = load_for_inference(args.runs[0])[1]
    first = args.runs[0].name
    systems = {**singles, **{name: model for name, (model, _) in averages.items()}}
    systems[f"ensemble of the {len(singles)} runs' last checkpoints"] = Ensemble(list(singles.values()))
    systems[f"ensemble of the {len(averages)} runs' averages"] = Ensemble([m for m, _ in averages.values()])
    systems[f"{first}, ensemble of its last {len(kept[first])} checkpoints"] = Ensemble(kept[first])
    lines += ["## Ensembles", "", f"Each run's last {args.average_last} checkpoints, averaged (`vaswani average`) or "
              "ensembled; the runs differ in their seed.", "",
              "| system | BLEU | chrF | seconds |", "|---|---:|---:|---:|"]  # fmt: skip
    hypotheses = {}
    for name, model in systems.items():
        hypotheses[name], seconds = run(model, tokenizer, sources)
        result = score(hypotheses[name], references)
        lines.append(f"| {name} | {result['bleu']:.2f} | {result['chrf']:.2f} | {seconds:.0f} |")
        print(lines[-1], flush=True)

    # constraints and prefixes, on the first run's averaged model
    name = f"{first}, last checkpoint"
    model, baseline = singles[name], hypotheses[name]
    terms = [pick_term(r, h) for r, h in zip(references, baseline, strict=True)]
    constrained, seconds = run(model, tokenizer, sources, constraints=[[t] if t else [] for t in terms])
    _, plain_seconds = run(model, tokenizer, sources)
    given = [i for i, t in enumerate(terms) if t]
    met = sum(terms[i] in words(constrained[i]) for i in given)
    base_bleu, cons_bleu = score(baseline, references)["bleu"], score(constrained, references)["bleu"]
    subset = lambda texts: [texts[i] for i in given]  # noqa: E731
    lines += ["", f"## Lexically constrained decoding ({name})", "",
              f"Terms given to {len(given)} of {len(pairs)} sentences (one each); met in {met} of {len(given)} "
              f"outputs ({100 * met / max(len(given), 1):.1f}%).", "",
              "| | BLEU, all sentences | BLEU, sentences with a term | seconds |", "|---|---:|---:|---:|",
              f"| unconstrained | {base_bleu:.2f} | {score(subset(baseline), subset(references))['bleu']:.2f} | "
              f"{plain_seconds:.0f} |",
              f"| constrained | {cons_bleu:.2f} | {score(subset(constrained), subset(references))['bleu']:.2f} | "
              f"{seconds:.0f} |"]  # fmt: skip
    print("\n".join(lines[-6:]), flush=True)

    prefixes = [" ".join(r.split()[:2]) for r in references]
    continued, seconds = run(model, tokenizer, sources, prefixes=prefixes)
    kept = sum(c.startswith(p) for c, p in zip(continued, prefixes, strict=True))
    prefix_bleu = score(continued, references)["bleu"]
    lines += ["", f"## Prefix decoding ({name})", "",
              f"The reference's first two words as the prefix: {kept} of {len(pairs)} outputs start with it; BLEU "
              f"{prefix_bleu:.2f} (unconstrained {base_bleu:.2f}), {seconds:.0f} s."]  # fmt: skip
    print(lines[-1], flush=True)
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
