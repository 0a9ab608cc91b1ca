#!/usr/bin/env python
"""One GPU, side by side: vaswani-hf against Transformers' Marian on the same weights, training and decoding.

The pair is built as in benchmarks/compare_marian.py (a random Marian with the paper's sizes, converted with
`marian_to_vaswani`, so both compute the same function). Every case times its contenders interleaved (each round
runs each contender once, the order alternating between rounds) after warm-up rounds, synchronising the GPU around
every call; the table gives medians and the ratio to Marian eager measured in the same rounds.

Cases:
  train              a training step (forward, backward, Adam) at `--train-shape` rows x tokens, bf16 autocast:
                     Marian eager; ours eager, ours compiled (torch.compile), ours with the speed-ups `--speedups
                     auto` would choose (vaswani_hf.training.training_speed); with 6*N*D throughput in TFLOP/s
  greedy-b1, beam4-b1, beam4-b64, beam4-b64-bf16, greedy-b256-bf16
                     generate() with `--new-tokens` tokens forced (min = max): Marian eager, Marian with
                     `cache_implementation="static"` alone, as a user passes it (Transformers compiles its greedy
                     step with its default CompileConfig), ours eager
                     (`graph_decoding=False`), ours graphed (the default on CUDA) on a first call (its graphs
                     captured in the call) and on later calls (graphs kept from the call before), ours with
                     `cache_implementation="static"` (handed to Transformers' loop)

Before timing, the graphed search's outputs are checked against the eager search's (tokens equal, beam scores to
1e-4); the report lists the checks.

    python benchmarks/gpu.py --out benchmarks/results/gpu_h200.md     # on the GPU machine, ~3 min on an H200
    python benchmarks/gpu.py --quick --device cpu                     # a smoke run of the script (tests)
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from compare_marian import (  # noqa: E402 (a script beside this one)
    PRESETS,
    Contender,
    adam,
    batch,
    build_marian,
    marian_loss,
    vaswani_loss,
)

from vaswani_hf.interop.convert import marian_to_vaswani  # noqa: E402
from vaswani_hf.model.speed.graph_search import DecodingGraphs  # noqa: E402
from vaswani_hf.training.training_speed import (  # noqa: E402
    adam_for,
    choose_speedups,
    compile_in_place,
    step_seconds,
    tf32_products,
)

# a size for the smoke run (compare_marian's table, which its `build_marian` and `batch` read)
PRESETS.setdefault("tiny", dict(vocab_size=500, d_model=32, layers=2, heads=4, ffn=64))
DECODING = {  # case: (beams, batch, dtype)
    "greedy-b1": (1, 1, torch.float32),
    "beam4-b1": (4, 1, torch.float32),
    "beam4-b64": (4, 64, torch.float32),
    "beam4-b64-bf16": (4, 64, torch.bfloat16),
    "greedy-b256-bf16": (1, 256, torch.bfloat16),
}


def synchronized(run: Callable[[], int], device: torch.device) -> Callable[[], int]:
    def call() -> int:
        result = run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return result

    return call


def time_contenders(contenders: list[Contender], warmup: int, rounds: int) -> None:
    for r in range(warmup + rounds):
        for c in contenders if r % 2 == 0 else contenders[::-1]:
            start = time.perf_counter()
            c.tokens = c.run()
            if r >= warmup:
                c.times.append(time.perf_counter() - start)


def training_contenders(args, marian, ours, device) -> list[Contender]:
    rows, length = args.train_shape
    source = batch(args.preset, rows, length, seed=1).to(device)
    target = batch(args.preset, rows, length, seed=2).to(device)
    mask = torch.ones_like(source)
    autocast = device.type == "cuda"

    def step(model, loss_fn, optimizer) -> Callable[[], int]:
        def run() -> int:
            model.train()
            with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
                loss = loss_fn(model, source, mask, target)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return target.numel()

        return synchronized(run, device)

    contenders = [
        Contender("Marian eager", "marian", step(marian, marian_loss, adam(marian))),
        Contender("ours eager", "vaswani", step(ours, vaswani_loss, adam(ours))),
    ]
    if not args.quick:
        compiled = marian_to_vaswani(marian).to(device)
        compile_in_place(compiled, 1)
        contenders.append(Contender("ours compiled", "vaswani", step(compiled, vaswani_loss, adam(compiled))))
        precision = "bf16" if autocast else "fp32"
        choice, _ = choose_speedups(lambda s: step_seconds(ours, device, rows, length, precision, s), precision)
        chosen = marian_to_vaswani(marian).to(device)
        if choice.compile:
            compile_in_place(chosen, 1)
        run = step(chosen, vaswani_loss, adam_for(chosen.parameters(), choice, lr=1e-4))

        def with_tf32(run=run, tf32=choice.tf32) -> int:
            with tf32_products(tf32):
                return run()

        contenders.append(Contender("ours, --speedups auto", "vaswani", with_tf32, notes=str(choice)))
    return contenders


def decoding_contenders(args, case: str, marian, ours, device) -> list[Contender]:
    beams, size, dtype = DECODING[case]
    source = batch(args.preset, size, 24, seed=3).to(device)
    marian, ours = marian.to(dtype), ours.to(dtype)

    def call(model, first_call: bool = False, **extra) -> Callable[[], int]:
        def run() -> int:
            if first_call:  # drop the graphs a call before kept: this call captures its own
                DecodingGraphs.of(model).clear()
            out = model.generate(input_ids=source, attention_mask=torch.ones_like(source), num_beams=beams,
                                 do_sample=False, min_new_tokens=args.new_tokens, max_new_tokens=args.new_tokens,
                                 length_penalty=1.0, early_stopping=True, **extra)  # fmt: skip
            return source.shape[0] * (out.shape[1] - 1)

        return synchronized(run, device)

    ours_kwargs = {"length_penalty_type": "hf", "max_length_offset": None}
    contenders = [
        Contender("Marian eager", "marian", call(marian)),
        Contender("ours eager", "vaswani", call(ours, graph_decoding=False, **ours_kwargs)),
        Contender("ours graphed, first call", "vaswani", call(ours, True, graph_decoding=True, **ours_kwargs)),
        Contender("ours graphed", "vaswani", call(ours, graph_decoding=True, **ours_kwargs), notes="graphs kept"),
    ]
    if not args.quick:
        # what a user gets from `cache_implementation="static"` alone: on CUDA Transformers compiles the step with
        # its default CompileConfig (the CPU benchmark's `compiled_generation_kwargs` forces compiling on a CPU)
        static = {"cache_implementation": "static"}
        contenders.insert(1, Contender("Marian static", "marian", call(marian, **static)))
        contenders.append(Contender("ours static", "vaswani", call(ours, **ours_kwargs, **static)))
    return contenders


def check_graphed(args, marian, ours, device) -> list[str]:
    """The graphed search against the eager one, greedy and beam, on a batch that ends at many lengths."""
    lines = []
    source = batch(args.preset, 8, 24, seed=4).to(device)
    for beams in (1, 4):
        kwargs = dict(input_ids=source, num_beams=beams, max_new_tokens=args.new_tokens, max_length_offset=None,
                      return_dict_in_generate=True, output_sequence_scores=beams > 1)  # fmt: skip
        eager = ours.generate(graph_decoding=False, **kwargs)
        graphed = ours.generate(graph_decoding=True, **kwargs)
        same = torch.equal(eager.sequences, graphed.sequences)
        gap = (eager.sequences_scores - graphed.sequences_scores).abs().max().item() if beams > 1 else 0.0
        lines.append(f"- {'beam 4' if beams > 1 else 'greedy'}: graphed tokens {'equal' if same else 'DIFFER'}; "
                     f"largest score difference {gap:.2e}")  # fmt: skip
    return lines


def machine(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return (f"{name}; torch {torch.__version__}, CUDA {torch.version.cuda}, Transformers {transformers.__version__}; "
            f"{datetime.date.today().isoformat()}")  # fmt: skip


def report(args, results: dict[str, list[Contender]], checks: list[str], device: torch.device) -> str:
    lines = [f"# vaswani-hf on one GPU, against Transformers' Marian ({args.preset} sizes)", "",
             f"Machine: {machine(device)}. Medians of {args.rounds} interleaved rounds after {args.warmup} warm-up "
             f"rounds; ratio = Marian eager's time / the contender's.", "", "Checks:", *checks, ""]  # fmt: skip
    parameters = sum(p.numel() for p in results["__model__"][0].parameters()) if "__model__" in results else None
    for case, contenders in results.items():
        if case == "__model__":
            continue
        base = statistics.median(contenders[0].times)
        lines += [f"## {case}", "", "| contender | median ms | ratio | notes |", "|---|---:|---:|---|"]
        for c in contenders:
            ms = statistics.median(c.times) * 1000
            notes = c.notes
            if case == "train" and parameters:
                notes = f"{6 * parameters * c.tokens / (ms / 1000) / 1e12:.0f} TFLOP/s (6ND) {notes}".strip()
            lines.append(f"| {c.label} | {ms:.1f} | {base * 1000 / ms:.2f}x | {notes} |")
        lines.append("")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", default="base", choices=sorted(PRESETS))
    parser.add_argument("--cases", nargs="+", default=["train", *DECODING], choices=["train", *DECODING])
    parser.add_argument("--train-shape", nargs=2, type=int, default=[512, 48], metavar=("ROWS", "TOKENS"))
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round, no compilation: a smoke run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.rounds, args.warmup, args.train_shape, args.new_tokens = "tiny", 1, 0, [8, 8], 6
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    device = torch.device(args.device)

    def pair() -> tuple:
        """A fresh Marian and our conversion of it (the same weights every time: `build_marian` seeds)."""
        marian = build_marian(args.preset).to(device)
        return marian, marian_to_vaswani(marian).to(device).eval()

    marian, ours = pair()
    checks = check_graphed(args, marian, ours, device)
    results: dict = {"__model__": [ours]}
    for case in args.cases:
        if case == "train":
            contenders = training_contenders(args, *pair(), device)
        else:
            contenders = decoding_contenders(args, case, *pair(), device)
        time_contenders(contenders, args.warmup, args.rounds)
        results[case] = contenders
        print(f"{case}: " + ", ".join(f"{c.label} {statistics.median(c.times) * 1000:.1f} ms" for c in contenders),
              flush=True)  # fmt: skip
    return publish(report(args, results, checks, device), args.out)


def publish(text: str, out: Path | None) -> str:
    """A report printed, and written to `out` where given."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)
    return text


if __name__ == "__main__":
    main()
