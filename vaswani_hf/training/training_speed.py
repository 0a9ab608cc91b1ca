"""Training at GPU speed: the speed-ups `vaswani train` may turn on, chosen by measuring them on the run's own model.

The paper's recipe is the same with or without them (same loss, same optimizer, same batches up to padding);
they change how fast a step runs:
- `compile`: `torch.compile` of the model, one compiled graph per batch shape. The token-budget batches are then
  padded to a few bucket shapes (`length_buckets`, `BucketPadding`), so shapes repeat and nothing recompiles
  after the first batch of each bucket;
- `fused_adam`: torch's fused AdamW kernel (Adam, since weight decay is 0) instead of the multi-tensor one;
- `tf32`: TF32 tensor cores for fp32 products (fp32 runs only; under bf16 autocast the products are bf16);
- `chunked_loss`: the output projection and the label-smoothed loss `LOSS_CHUNK_ROWS` target positions at a time,
  each chunk recomputed in the backward pass, so the (tokens x vocabulary) float32 logits are never held whole
  (`VaswaniForConditionalGeneration.chunked_translation_loss`; 3.6 GB at the paper's batch and 37k vocabulary).

`--speedups auto` (the default) measures on a GPU: a few training steps of the run's model at one bucket's shape,
eager first, then each speed-up alone; a speed-up is kept when its steps are at least `MARGIN` faster. On a CPU
`auto` turns none on (the CPU paths were chosen by measurement elsewhere: `vaswani_hf.model.precision`). `off` turns all
off; a comma list (`compile,fused_adam`) turns on exactly those. The run's summary prints the choice.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)

SWITCHES = ("fused_adam", "tf32", "compile", "chunked_loss")
LOSS_CHUNK_ROWS = 4096  # target positions projected and scored at a time with `chunked_loss`
MARGIN = 0.03  # a speed-up must make steps this much faster to be kept: less is within the noise of a short trial
# below this many planned updates, `auto` keeps eager: compiling costs about a minute, which a short run never gets
# back
MIN_STEPS_TO_MEASURE = 1000


@dataclass(frozen=True)
class Speedups:
    """Which speed-ups a run uses, and why."""

    compile: bool = False
    fused_adam: bool = False
    tf32: bool = False
    chunked_loss: bool = False
    reason: str = field(default="", compare=False)
    # whether every switch is set as given (asked for, or measured); otherwise Trainer's defaults stay (its optimizer
    # is the fused AdamW with torch >= 2.8), and so do the CPU's paths
    decided: bool = field(default=True, compare=False)

    def __str__(self) -> str:
        names = " + ".join(name for name in SWITCHES if getattr(self, name)) or "eager"
        return f"{names} ({self.reason})" if self.reason else names

    @classmethod
    def parse(cls, text: str) -> Speedups | None:
        """`--speedups`: None for "auto", no speed-up for "off", else the comma-separated names."""
        text = text.strip().lower()
        if text == "auto":
            return None
        if text in ("off", "none", ""):
            return cls(reason="--speedups off")
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in SWITCHES]
        if unknown:
            raise ValueError(f"--speedups: unknown {', '.join(unknown)}; use auto, off, or a comma list of "
                             f"{', '.join(SWITCHES)}.")  # fmt: skip
        return cls(**dict.fromkeys(names, True), reason=f"--speedups {text}")


def choose_speedups(measure: Callable[[Speedups], float], precision: str,
                    switches: tuple[str, ...] = SWITCHES) -> tuple[Speedups, dict[str, float]]:  # fmt: skip
    """The speed-ups whose steps `measure` (seconds per step) finds at least `MARGIN` faster than eager, each tried
    alone. TF32 is not tried under bf16 autocast, where it changes nothing. Returns the choice and the timings by
    name."""
    eager = Speedups()
    timings = {"eager": measure(eager)}
    kept = {}
    for name in switches:
        if name == "tf32" and precision != "fp32":
            continue
        timings[name] = measure(replace(eager, **{name: True}))
        if timings[name] < timings["eager"] * (1 - MARGIN):
            kept[name] = True
    measured = ", ".join(f"{name} {seconds * 1000:.1f} ms" for name, seconds in timings.items())
    return Speedups(**kept, reason=f"measured per step: {measured}"), timings


def resolve_speedups(asked: str, device: torch.device, planned_steps: int | None, measure: Callable[[Speedups], float],
                     precision: str, token_batches: bool = True) -> Speedups:  # fmt: skip
    """`--speedups` for a run on `device`: as asked, or for `auto` measured where it can pay off. `compile` needs
    `token_batches` (bucketed token-budget batches, whose shapes repeat): asked for without them it is an error,
    and `auto` does not try it."""
    given = Speedups.parse(asked)
    if given is not None:
        if given.tf32 and device.type != "cuda":
            raise ValueError("--speedups tf32: TF32 is a GPU's tensor-core format; leave it out on a CPU.")
        if given.compile and not token_batches:
            raise ValueError("--speedups compile pads token-budget batches to a few shapes so that nothing "
                             "recompiles; with --max_tokens 0 every batch has a shape of its own. Give "
                             "--max_tokens.")  # fmt: skip
        return given
    if device.type != "cuda":
        return Speedups(reason="auto on a CPU: none", decided=False)
    if planned_steps is not None and planned_steps < MIN_STEPS_TO_MEASURE:
        return Speedups(reason=f"auto: {planned_steps} updates are too few to repay a compilation", decided=False)
    switches = SWITCHES if token_batches else tuple(name for name in SWITCHES if name != "compile")
    return choose_speedups(measure, precision, switches)[0]


def speedups_for_training(asked: str, model: torch.nn.Module, device: torch.device, max_tokens: int,
                          train_lengths: tuple, planned_steps: int | None, precision: str,
                          sharded: bool = False) -> Speedups:  # fmt: skip
    """`resolve_speedups` for a training run: the trial batch is a full batch of the bucket of the median pair.

    `auto` does not try `compile` for fixed-size batches (`max_tokens` 0) or a `sharded` model (FSDP, DeepSpeed),
    whose wrapping it has not been measured with. Under DDP every process measures, and rank 0's choice is taken by
    all, so that every process batches alike."""
    lengths = np.maximum(np.asarray(train_lengths[0]), np.asarray(train_lengths[1]))
    length = bucket_of(int(np.median(lengths)), length_buckets(int(lengths.max())))
    rows = max(max_tokens // length, 1) if max_tokens else 64

    def measure(speedups: Speedups) -> float:
        return step_seconds(model, device, rows, length, precision, speedups)

    given = Speedups.parse(asked)
    if given is not None and given.compile and sharded:
        logger.warning("--speedups compile with FSDP or DeepSpeed: this pairing has not been measured here")
    choice = resolve_speedups(asked, device, planned_steps, measure, precision,
                              token_batches=max_tokens > 0 and (given is not None or not sharded))  # fmt: skip
    if given is None and choice.decided and torch.distributed.is_available() and torch.distributed.is_initialized():
        shared = [choice]
        torch.distributed.broadcast_object_list(shared, src=0)
        choice = shared[0]
    return choice


def length_buckets(longest: int, granularity: int = 8, growth: float = 1.125) -> list[int]:
    """Padded lengths for compiled training: multiples of `granularity` up to 64, then about `growth` times the
    last (a multiple of `granularity` again), up to the first one >= `longest`. A batch pads to at most ~12% more
    tokens than its longest pair needs, and a corpus of pairs up to 256 tokens has about 20 shapes."""
    buckets = [granularity]
    while buckets[-1] < longest:
        last = buckets[-1]
        grown = last + granularity if last < 64 else int(last * growth)
        buckets.append(-(-grown // granularity) * granularity)
    return buckets


def bucket_of(length: int, buckets: list[int]) -> int:
    """The smallest bucket that holds `length` tokens."""
    for bucket in buckets:
        if length <= bucket:
            return bucket
    raise ValueError(f"a sequence of {length} tokens is longer than the longest bucket ({buckets[-1]})")


class BucketPadding:
    """A data collator that pads another's batches to a bucket shape: (max_tokens // L) rows of L tokens, L the
    bucket of the batch's longest source or target (`TokenBudgetBatchSampler(buckets=...)` makes batches that fit).

    Added rows are one-token pairs (a padding token the encoder may attend to, so no attention row is empty) whose
    labels are all -100: they add nothing to the loss or its gradient."""

    def __init__(self, collator: Callable, buckets: list[int], max_tokens: int, pad_token_id: int):
        self.collator = collator
        self.buckets = buckets
        self.max_tokens = max_tokens
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict]) -> dict:
        batch = self.collator(features)
        longest = max(batch["input_ids"].shape[1], batch["labels"].shape[1])
        length = bucket_of(longest, self.buckets)
        rows = max(self.max_tokens // length, batch["input_ids"].shape[0])
        fill = {"input_ids": self.pad_token_id, "decoder_input_ids": self.pad_token_id, "labels": -100,
                "attention_mask": 0, "decoder_attention_mask": 0}  # fmt: skip
        padded = {}
        for name, tensor in batch.items():
            if name not in fill:
                padded[name] = tensor
                continue
            out = tensor.new_full((rows, length), fill[name])
            out[: tensor.shape[0], : tensor.shape[1]] = tensor
            padded[name] = out
        if "attention_mask" in padded:
            padded["attention_mask"][batch["input_ids"].shape[0] :, 0] = 1
        return padded


@contextlib.contextmanager
def tf32_products(enabled: bool) -> Iterator[None]:
    """fp32 matrix products on TF32 tensor cores inside the block (GPU only), as before it after."""
    before = torch.get_float32_matmul_precision()
    if enabled:
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def compile_in_place(model: torch.nn.Module, shapes: int) -> None:
    """`torch.compile` of the model's forward, one graph per batch shape (`dynamic=False`, so each bucket's kernels
    are specialised); dynamo may keep a graph for every bucket. `nn.Module.compile` keeps the module itself (its
    state_dict keys, hooks, save_pretrained)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, shapes + 2)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                           4 * (shapes + 2))  # fmt: skip
    model.compile(dynamic=False)


@contextlib.contextmanager
def uncompiled(model: torch.nn.Module) -> Iterator[None]:
    """The model's eager forward inside the block (evaluation batches have shapes of their own, which would each
    compile anew)."""
    compiled = getattr(model, "_compiled_call_impl", None)
    model._compiled_call_impl = None
    try:
        yield
    finally:
        model._compiled_call_impl = compiled


def step_seconds(model: torch.nn.Module, device: torch.device, rows: int, length: int, precision: str,
                 speedups: Speedups, rounds: int = 10, warmup: int = 3) -> float:  # fmt: skip
    """The median seconds of a training step (forward, backward, Adam) of a copy of `model` on `device`, on a
    random (rows x length) batch, with `speedups`: what `choose_speedups` compares."""
    trial = copy.deepcopy(model).to(device).train()
    ids = torch.randint(4, trial.config.vocab_size, (rows, length), device=device)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.roll(1, dims=1)}
    optimizer = adam_for(trial.parameters(), speedups)
    if speedups.compile:
        compile_in_place(trial, 1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    times = []
    with tf32_products(speedups.tf32):
        for _ in range(warmup + rounds):
            synchronize(device)
            start = time.perf_counter()
            with autocast:
                loss = trial(**batch, **loss_keywords(speedups)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            synchronize(device)
            times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:])


def loss_keywords(speedups: Speedups) -> dict:
    """What a training forward passes to the model for `speedups` (the chunked loss, or nothing)."""
    return {"loss_chunk_rows": LOSS_CHUNK_ROWS} if speedups.chunked_loss else {}


def adam_for(parameters, speedups: Speedups, lr: float = 1e-5) -> torch.optim.AdamW:
    """The paper's Adam (0.9, 0.98, 1e-9; no weight decay) with the fused kernel or the multi-tensor one, as
    `speedups` says: what a trial (and benchmarks/gpu.py) steps."""
    kernel = {"fused": True} if speedups.fused_adam else {"foreach": True}
    return torch.optim.AdamW(parameters, lr=lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, **kernel)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
