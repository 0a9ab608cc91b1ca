"""Lexically constrained decoding's speed beside the plain beam search: a trained model translates the built-in
test split (or --source/--target files) at the paper's beam 4, once plainly and once with one term per sentence
(the reference's longest word, as its tokens), each --repeats times in turn; the median sentences/s of each, their
ratio, and how often the term appears in the output. Prints one JSON line (the CPU named by its model and flags).

    python benchmarks/constrained_decoding.py --model vaswani-model
    cd /tmp/base && python -m benchmarks.constrained_decoding --model ...   # another checkout's code, side by side
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from vaswani_hf.data.number_words import builtin_splits
from vaswani_hf.translation.inference import load_for_inference


def cpu() -> str:
    flags = set()
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    shown = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if flag in flags]
    return f"{name or platform.processor()} ({' '.join(shown)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model, tokenizer = load_for_inference(args.model, device="cpu")
    pairs = builtin_splits()["test"][: args.sentences]
    sources = [source for source, _ in pairs]
    terms = [max(target.split(), key=len) for _, target in pairs]
    phrases = [[tokenizer(term, add_special_tokens=False)["input_ids"]] for term in terms]

    def translate(constrained: bool) -> list[str]:
        outputs = []
        for start in range(0, len(sources), args.batch):
            batch = tokenizer(sources[start : start + args.batch], return_tensors="pt", padding=True)
            extra = {"force_words": phrases[start : start + args.batch]} if constrained else {}
            outputs += tokenizer.batch_decode(model.generate(**batch, **extra), skip_special_tokens=True)
        return outputs

    times = {False: [], True: []}
    for _ in range(args.repeats):
        for constrained in (False, True):
            begin = time.perf_counter()
            outputs = translate(constrained)
            times[constrained].append(time.perf_counter() - begin)
    with_term = sum(term in output.split() for term, output in zip(terms, outputs, strict=True))
    plain, constrained = (len(sources) / statistics.median(times[c]) for c in (False, True))
    print(json.dumps({"cpu": cpu(), "sentences": len(sources), "beam": model.generation_config.num_beams,
                      "plain_sentences_per_s": round(plain, 1), "constrained_sentences_per_s": round(constrained, 1),
                      "constrained_over_plain": round(constrained / plain, 3),
                      "outputs_with_their_term": f"{with_term}/{len(sources)}"}))  # fmt: skip


if __name__ == "__main__":
    main()
