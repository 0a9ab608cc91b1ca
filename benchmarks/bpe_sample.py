"""What learning the shared BPE from a sample costs against learning it from every pair (docs/decisions.md).

    python benchmarks/bpe_sample.py DATA [--samples 0 1000000 2000000] [--vocab_size 32000] [--src en --tgt de]

For each sample size (0: every training pair) the vocabulary is learned as `vaswani prepare` learns it (a child
process, a fixed random sample), timed, with the child's peak resident memory. Each is then scored on the `val`
split and on 20,000 training pairs drawn at random: tokens per sentence, the share of <unk> tokens, and the entries
it shares with the vocabulary learned from every pair. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_marian import machine  # noqa: E402

from vaswani_hf.data.preparation import _fork_context, _learn_bpe, _read_text, _text_table  # noqa: E402
from vaswani_hf.data.prepared_cache import PreparationRequest  # noqa: E402
from vaswani_hf.data.readers import load_split  # noqa: E402


def learn(request: PreparationRequest, text: str, folder: str) -> int:
    """In a child: learn the vocabulary; returns the child's peak resident memory in bytes."""
    _learn_bpe(request, text, folder, quiet=True)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def scores(tokenizer, pairs: list[tuple[str, str]]) -> tuple[float, float]:
    ids = [x for side in zip(*pairs, strict=True) for x in tokenizer(list(side))["input_ids"]]
    tokens = np.concatenate([np.asarray(x) for x in ids])
    return len(tokens) / len(ids), float(np.mean(tokens == tokenizer.unk_token_id))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--samples", type=int, nargs="+", default=[0, 1_000_000, 2_000_000])
    parser.add_argument("--vocab_size", type=int, default=32000)
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        base = PreparationRequest(args.data, args.src, args.tgt, vocab_size=args.vocab_size)
        text = work / "train.arrow"
        pairs = _read_text(base, "train", text, keep_empty=False, quiet=True)["read"]
        table = _text_table(text)
        rows = np.random.default_rng(1).choice(len(table), min(20_000, len(table)), replace=False)
        train_sample = list(zip(*(table.column(c).take(rows).to_pylist() for c in ("source", "target")), strict=True))
        val = load_split(args.data, "val", args.src, args.tgt)
        results = {}
        for sample in args.samples:
            request = PreparationRequest(args.data, args.src, args.tgt, vocab_size=args.vocab_size,
                                         bpe_sample_lines=sample or None)  # fmt: skip
            folder = work / f"bpe-{sample}"
            start = time.perf_counter()
            with ProcessPoolExecutor(1, mp_context=_fork_context()) as child:
                peak = child.submit(learn, request, str(text), str(folder)).result()
            seconds = time.perf_counter() - start
            tokenizer = AutoTokenizer.from_pretrained(folder)
            results[sample] = (seconds, peak, tokenizer, scores(tokenizer, val), scores(tokenizer, train_sample))
        full = set(results[args.samples[0]][2].get_vocab())
        print(f"{machine()}; {pairs:,} training pairs in {args.data}; vocabulary {args.vocab_size:,}\n")
        print(
            "| learned from | seconds | child's peak RSS | tokens/sentence (val) | <unk> (val) | tokens/sentence "
            f"(train) | <unk> (train) | entries shared with {args.samples[0] or 'every pair'} |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for sample, (seconds, peak, tokenizer, (val_len, val_unk), (train_len, train_unk)) in results.items():
            shared = len(full & set(tokenizer.get_vocab())) / len(full)
            print(
                f"| {f'{sample:,} pairs' if sample else 'every pair'} | {seconds:.0f} | {peak / 2**30:.2f} GiB | "
                f"{val_len:.2f} | {val_unk:.4%} | {train_len:.2f} | {train_unk:.4%} | {shared:.1%} |"
            )


if __name__ == "__main__":
    main()
