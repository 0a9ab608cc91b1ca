"""Decoding steps by rows on all threads and on one: where `speed/step_threads.py`'s one-thread rule pays.

    python benchmarks/step_threads.py MODEL_DIR [--rows 1 2 4 8 16 32] [--beams 1] [--steps 30] [--rounds 5]

For each number of rows (sentences x beams), `generate()` of that many lines of `--input` with `--steps` new tokens
forced, in one process, rounds alternating three settings of `VASWANI_ONE_THREAD_ROWS` (each first in turn): 0
(every step on the process's threads), the package's default rule, and every step on one thread; ms a step,
medians. The CPU, the threads and OpenMP's wait policy are printed with the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

# isort: off
import vaswani_hf  # noqa: F401  (before torch: the package's OpenMP policy, as every `vaswani` command has it)
import torch

# isort: on

from vaswani_hf.model.precision import cpu_name
from vaswani_hf.model.speed.step_threads import ONE_THREAD_ROWS
from vaswani_hf.translation.inference import load_for_inference

SHARED = Path(__file__).resolve().parents[2] / "shared"
SETTINGS = {"all threads": "0", f"default (rows <= {ONE_THREAD_ROWS})": "", "one thread": "100000"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--input", default=str(SHARED / "data/multi30k_en_de/test2016.en"))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 16, 32])
    parser.add_argument("--beams", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model, tokenizer = load_for_inference(args.model_dir, precision="fp32")
    lines = [line.strip() for line in open(args.input, encoding="utf-8")]
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
          f"beams {args.beams}, {args.steps} steps forced; ms a step, medians of {args.rounds}\n")  # fmt: skip
    print("| rows | " + " | ".join(SETTINGS) + " |\n|---:|" + "---:|" * len(SETTINGS))
    with torch.inference_mode():
        for rows in args.rows:
            batch = tokenizer(lines[: max(1, rows // args.beams)], return_tensors="pt", padding=True)
            times: dict[str, list[float]] = {name: [] for name in SETTINGS}
            for round_ in range(args.rounds + 1):  # the first round warms up every setting
                names = list(SETTINGS)[round_ % len(SETTINGS) :] + list(SETTINGS)[: round_ % len(SETTINGS)]
                for name in names:  # each setting first in a round as often as the others
                    os.environ["VASWANI_ONE_THREAD_ROWS"] = SETTINGS[name]
                    start = time.perf_counter()
                    model.generate(**batch, num_beams=args.beams, min_new_tokens=args.steps,
                                   max_new_tokens=args.steps)  # fmt: skip
                    times[name].append((time.perf_counter() - start) / args.steps * 1e3)
            cells = [f"{statistics.median(t[1:]):.2f}" for t in times.values()]
            print(f"| {rows} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
