"""What each piece of the beam search's speed machinery earns on this machine, each against the search without it,
side by side: the candidate columns (`search_vaswani.candidate_columns`, a parser's top-k among its tree symbols
rather than its whole vocabulary) and the first step's fold (`BeamStep`'s `fold`: the first step computes one row
per sentence, its beams being identical), on a parser at beam 21 and on the base model at beam 4. The kept CUDA
graphs are measured on a card (`benchmarks/gpu.py`, "later call" against "first call").

    python benchmarks/search_machinery.py --parser DIR [--rounds 5]

DIR is a saved parser (`vaswani train --task parse`, or `benchmarks/parsing.py`). The contenders take turns in
every round and must give the same trees and tokens; the median of the rounds is kept. Prints Markdown rows (the
CPU named) for docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parsing import cpu, test_split, versions  # noqa: E402

from vaswani_hf.model import search_vaswani  # noqa: E402


@contextmanager
def candidate_columns(on: bool):
    before = os.environ.get(search_vaswani.CANDIDATE_COLUMNS)
    os.environ[search_vaswani.CANDIDATE_COLUMNS] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[search_vaswani.CANDIDATE_COLUMNS]
        else:
            os.environ[search_vaswani.CANDIDATE_COLUMNS] = before


@contextmanager
def first_step_fold(on: bool):
    """Without the fold, the first step computes every beam's row (the beams share their encoder row all the same)."""
    call = search_vaswani.BeamStep.__call__
    if not on:
        search_vaswani.BeamStep.__call__ = lambda self, *args, fold=False, **kwargs: call(self, *args, **kwargs)
    try:
        yield
    finally:
        search_vaswani.BeamStep.__call__ = call


def timed(contenders: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each contender (a function giving its output), after one warm-up call each; every
    contender's output must equal the first's."""
    outputs = {name: run() for name, run in contenders.items()}
    first = next(iter(outputs.values()))
    for name, output in outputs.items():
        if output != first:
            sys.exit(f"{name} gives other outputs than {next(iter(outputs))}: refusing to time them")
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for turn in range(rounds):
        for name in list(contenders)[:: 1 if turn % 2 == 0 else -1]:
            start = time.perf_counter()
            contenders[name]()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def parser_case(model_dir: Path, rounds: int, count: int) -> list[str]:
    from vaswani_hf.parsing.parser import Parser

    parser = Parser.from_pretrained(model_dir, precision="fp32")
    sentences, _ = test_split(None, parser.parsing.get("form", "tags"))
    words = [sentence.split() for sentence in sentences][:count]

    def parse(columns: bool = True, fold: bool = True):
        def run():
            with candidate_columns(columns), first_step_fold(fold):
                return [str(tree) for tree in parser.parse_sents(words)]

        return run

    medians = timed({"all": parse(), "no columns": parse(columns=False), "no fold": parse(fold=False)}, rounds)
    n = len(words)
    return [
        f"| parser, beam 21, {n} sentences | {n / medians['all']:.1f} sentences/s | "
        f"{n / medians['no columns']:.1f} ({medians['no columns'] / medians['all']:.2f}x the time) | "
        f"{n / medians['no fold']:.1f} ({medians['no fold'] / medians['all']:.2f}x the time) |"
    ]


def translation_case(rounds: int, batch: int, new_tokens: int = 40) -> list[str]:
    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(0)
    config = VaswaniConfig(vocab_size=37000, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                           decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)  # fmt: skip
    model = VaswaniForConditionalGeneration(config).eval()
    source = torch.randint(4, 37000, (batch, 30))

    def translate(fold: bool = True):
        def run():
            with first_step_fold(fold), torch.inference_mode():
                out = model.generate(source, num_beams=4, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
            return out.tolist()

        return run

    medians = timed({"all": translate(), "no fold": translate(fold=False)}, rounds)
    return [
        f"| base, beam 4, batch {batch}, {new_tokens} tokens | {medians['all'] * 1000:.0f} ms | (no candidate columns "
        f"here) | {medians['no fold'] * 1000:.0f} ms ({medians['no fold'] / medians['all']:.2f}x the time) |"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parser", type=Path, required=True, help="a saved parser's folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=150, help="the first N of the built-in test split")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{cpu()}, {args.threads} threads, {versions()}, {time.strftime('%Y-%m-%d')}, medians of {args.rounds}")
    print("| case | the search as shipped | without the candidate columns | without the first step's fold |")
    print("|---|---:|---:|---:|")
    for row in [*parser_case(args.parser, args.rounds, args.sentences), *translation_case(args.rounds, 1),
                *translation_case(args.rounds, 16)]:  # fmt: skip
        print(row, flush=True)


if __name__ == "__main__":
    main()
