"""How many distinct batch shapes a run's updates meet: eager token-budget batches with their lengths as they come,
padded to multiples of 8 (what `vaswani train` does on a GPU), and compiled training's planned buckets.

    python benchmarks/batch_shapes.py PREPARED_DIR [--max_tokens 25000] [--updates 1000] [--compile_shapes 8]

A shape is (rows, source length, target length) of the padded batch. Nothing runs on a model: the batches come from
the run's own sampler over the prepared folder's lengths."""

import argparse
import itertools

import numpy as np

from vaswani_hf.data.batching import TokenBudgetBatchSampler
from vaswani_hf.data.prepared import PreparedData, token_lengths
from vaswani_hf.training.training_speed import compile_buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--max_tokens", type=int, default=25000)
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--compile_shapes", type=int, default=8)
    args = parser.parse_args()
    sources, targets = token_lengths(PreparedData(args.data).tokens("train"))
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=args.max_tokens, seed=0)
    shapes = {1: set(), 8: set()}
    for batch in itertools.islice(sampler, args.updates):
        rows, source, target = len(batch), int(sources[batch].max()), int(targets[batch].max())
        for multiple, seen in shapes.items():
            seen.add((rows, -(-source // multiple) * multiple, -(-target // multiple) * multiple))
    buckets = compile_buckets(np.maximum(sources, targets), args.compile_shapes)
    print(
        f"{len(sources):,} pairs, --max_tokens {args.max_tokens}, {args.updates} updates: distinct shapes "
        f"{len(shapes[1])} as they come, {len(shapes[8])} with lengths padded to multiples of 8; compiled: "
        f"{len(buckets)} planned ({', '.join(str(b) for b in buckets)} tokens)"
    )


if __name__ == "__main__":
    main()
