"""The vocabulary shortlist's speed-up (issue 32, item 2b), full vocabulary and shortlist interleaved, medians.

    python benchmarks/shortlist_speed.py                     # speed alone: base preset, random weights, 37k vocab
    python benchmarks/shortlist_speed.py --model RUN --data ../shared/data/multi30k_en_de   # BLEU and time
    python benchmarks/shortlist_speed.py --model RUN --data ../shared/data/multi30k_en_de --precision int8

The first form decodes a fixed 30 tokens per sentence (greedy-b1, beam4-b1, beam4-b16) with 3,000 random allowed
tokens; the second translates test2016 with a model and the shortlist saved beside it (`vaswani shortlist`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from compare_marian import machine

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.data.readers import load_split
from vaswani_hf.translation.inference import load_for_inference, score, translate_nbest
from vaswani_hf.translation.shortlist import Shortlist


def interleaved(jobs: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each job, the jobs run in turn each round, after one warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for round_ in range(rounds + 1):
        for name, job in jobs.items():
            start = time.perf_counter()
            job()
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def speed_alone(rounds: int) -> None:
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.base()).eval()
    allowed = torch.randperm(model.config.vocab_size)[:3000].sort().values
    for name, (beams, batch) in {"greedy-b1": (1, 1), "beam4-b1": (4, 1), "beam4-b16": (4, 16)}.items():
        ids = torch.randint(4, model.config.vocab_size, (batch, 25))
        ids[:, -1] = model.config.eos_token_id
        kwargs = dict(input_ids=ids, num_beams=beams, max_new_tokens=30, min_new_tokens=30)
        medians = interleaved({"full": lambda kwargs=kwargs: model.generate(**kwargs),
                               "shortlist": lambda kwargs=kwargs: model.generate(**kwargs,
                                                                                 vocabulary_shortlist=allowed)},
                              rounds)  # fmt: skip
        print(f"{name}: full {medians['full']:.3f} s, shortlist {medians['shortlist']:.3f} s -> "
              f"{medians['full'] / medians['shortlist']:.2f}x", flush=True)  # fmt: skip


def with_model(model_dir: str, data: str, split: str, rounds: int, precision: str) -> None:
    model, tokenizer = load_for_inference(model_dir, device="cpu", precision=precision)
    shortlist = Shortlist.load(model_dir, tokenizer)
    pairs = load_split(data, split, "en", "de")
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    outputs = {}

    def job(name, **kwargs):
        return lambda: outputs.__setitem__(name, translate_nbest(model, tokenizer, sources, progress=False, **kwargs))

    medians = interleaved({"full": job("full"), "shortlist": job("shortlist", shortlist=shortlist)}, rounds)
    for name, seconds in medians.items():
        bleu = score([candidates[0][0] for candidates in outputs[name]], references)["bleu"]
        print(f"{name}: BLEU {bleu:.2f}, {seconds:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a model folder with shortlist.safetensors (default: speed alone)")
    parser.add_argument("--data")
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"), help="with --model")
    args = parser.parse_args()
    print(machine(), flush=True)
    if args.model:
        with_model(args.model, args.data, args.split, args.rounds, args.precision)
    else:
        speed_alone(args.rounds)


if __name__ == "__main__":
    main()
