"""Training at GPU speed: the speed-ups `vaswani train` may turn on, chosen by measuring them on the run's own model.

The paper's recipe is the same with or without them (same loss, same optimizer, same batches up to padding);
they change how fast a step runs:
- `compile`: `torch.compile` of the model, one compiled graph per batch shape. The token-budget batches are then
  padded to a few bucket shapes (`compile_buckets`, `BucketPadding`), so shapes repeat and nothing recompiles
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

On a CPU, a narrow model trains on one thread (`training_threads`): see ONE_THREAD_D_MODEL.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from transformers.utils import logging as hf_logging

from ..model.precision import cpu_name, precision_cache_path, read_measurements, write_measurement
from ..thread_counts import thread_counts_settable

logger = hf_logging.get_logger(__name__)

SWITCHES = ("fused_adam", "tf32", "compile", "chunked_loss")
LOSS_CHUNK_ROWS = 4096  # target positions projected and scored at a time with `chunked_loss`
MARGIN = 0.03  # a speed-up must make steps this much faster to be kept: less is within the noise of a short trial
# below this many planned updates, `auto` keeps eager: compiling costs about a minute, which a short run never gets
# back
MIN_STEPS_TO_MEASURE = 1000
# The widest model that trains on one CPU thread: a narrow model's operators take microseconds, and on two threads each
# one is a parallel region whose other thread sleeps between regions (the passive wait `vaswani_hf.openmp` sets, so
# that a run keeps its share beside a busy neighbour) and must be woken, which costs more than the half of the work it
# takes. Measured with `benchmarks/training_threads.py` (the built-in task, 2 cores, 2026-12-07; docs/recipe.md,
# "Threads on a CPU"): at d_model 32 and 64 one thread 1.15-2.0x faster with 32 sentences an update and 1.0-1.2x with
# 128, fp32 and bf16; wider, two threads win as the batches grow (d_model 128 in bf16: one thread 1.29x faster at 32
# sentences, two 1.22x at 128, and 1.05x for the built-in task's own run of 64).
ONE_THREAD_D_MODEL = 64


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


def choose_speedups(measure: Callable[[Speedups], float | tuple[float, float]], precision: str,
                    switches: tuple[str, ...] = SWITCHES) -> tuple[Speedups, dict[str, float]]:  # fmt: skip
    """The speed-ups whose steps `measure` (seconds per step, or that and the first step's) finds at least `MARGIN`
    faster than eager, each tried alone. TF32 is not tried under bf16 autocast, where it changes nothing. Returns
    the choice and the timings by name (and `compile_first`, the compiled trial's first step)."""
    eager = Speedups()
    timings, firsts = {}, {}
    for name in ("eager", *switches):
        if name == "tf32" and precision != "fp32":
            continue
        measured = measure(eager if name == "eager" else replace(eager, **{name: True}))
        timings[name], firsts[name] = measured if isinstance(measured, tuple) else (measured, measured)
    kept = {name: True for name in timings if name != "eager" and timings[name] < timings["eager"] * (1 - MARGIN)}
    measured = ", ".join(f"{name} {seconds * 1000:.1f} ms" for name, seconds in timings.items())
    if "compile" in firsts:  # the first compiled step is the compilation of one shape
        timings["compile_first"] = firsts["compile"]
    return Speedups(**kept, reason=f"measured per step: {measured}"), timings


def resolve_speedups(asked: str, device: torch.device, planned_steps: int | None, measure: Callable,
                     precision: str, token_batches: bool = True, shapes: int = 1) -> Speedups:  # fmt: skip
    """`--speedups` for a run on `device`: as asked, or for `auto` measured where it can pay off. `compile` needs
    `token_batches` (bucketed token-budget batches, whose shapes repeat): asked for without them it is an error,
    and `auto` does not try it; `auto` keeps it only when the `planned_steps` repay compiling all `shapes`."""
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
    choice, timings = choose_speedups(measure, precision, switches)
    if choice.compile and planned_steps is not None:
        # every planned shape compiles once: keep compile only when the updates repay all of them
        cost = max(timings["compile_first"] - timings["compile"], 0.0) * shapes
        gain = (timings["eager"] - timings["compile"]) * planned_steps
        if gain <= cost:
            choice = replace(choice, compile=False, reason=f"{choice.reason}; compile left out: {shapes} shapes to "
                             f"compile take about {cost:.0f} s, {planned_steps} faster updates save "
                             f"{gain:.0f} s")  # fmt: skip
    return choice


def speedups_for_training(asked: str, model: torch.nn.Module, device: torch.device, max_tokens: int,
                          train_lengths: tuple, planned_steps: int | None, precision: str,
                          sharded: bool = False, compile_shapes: int = 8) -> Speedups:  # fmt: skip
    """`resolve_speedups` for a training run: the trial batch is a full batch of the bucket of the median pair, and
    `auto` weighs the compilation of the run's planned shapes (`compile_buckets`) against its planned updates.

    The trial's timings are remembered per card, torch release, precision, model shape and batch (`remember`), so a
    second run of the same setup takes them instead of measuring. `auto` does not try `compile` for fixed-size
    batches (`max_tokens` 0) or a `sharded` model (FSDP, DeepSpeed), whose wrapping it has not been measured with.
    Under DDP every process measures, and rank 0's choice is taken by all, so that every process batches alike."""
    lengths = np.maximum(np.asarray(train_lengths[0]), np.asarray(train_lengths[1]))
    buckets = compile_buckets(lengths, compile_shapes)
    length = bucket_of(int(np.median(lengths)), buckets)
    rows = max(max_tokens // length, 1) if max_tokens else 64
    key = f"{machine_key(model, device, precision)} | trial {rows}x{length}"
    known, fresh = remembered(key) or {}, {}

    def measure(speedups: Speedups) -> tuple[float, float]:
        name = str(replace(speedups, reason=""))
        if name not in known and name not in fresh:
            times = step_times(model, device, rows, length, precision, speedups)
            fresh[name] = [statistics.median(times[3:]), times[0]]
        return tuple(known.get(name) or fresh[name])

    given = Speedups.parse(asked)
    if given is not None and given.compile and sharded:
        logger.warning("--speedups compile with FSDP or DeepSpeed: this pairing has not been measured here")
    choice = resolve_speedups(asked, device, planned_steps, measure, precision,
                              token_batches=max_tokens > 0 and (given is not None or not sharded),
                              shapes=len(buckets))  # fmt: skip
    if fresh:
        remember(key, {**known, **fresh})
    elif known and given is None and choice.decided:
        choice = replace(choice, reason=f"{choice.reason} (the trial of an earlier run, remembered in {_cache_path()})")
    if given is None and choice.decided and torch.distributed.is_available() and torch.distributed.is_initialized():
        shared = [choice]
        torch.distributed.broadcast_object_list(shared, src=0)
        choice = shared[0]
    return choice


def compile_buckets(longest: np.ndarray, shapes: int, granularity: int = 8) -> list[int]:
    """At most `shapes` padded lengths (multiples of `granularity`) for compiled training, chosen for the corpus: the
    ones that pad its pairs least. A batch of bucket L holds `max_tokens // L` pairs, so a pair of bucket L takes L
    token slots whatever its own length, and the total padded size is the sum over pairs of their bucket. Dynamic
    programming over the histogram of `longest` (each pair's longer side; one bincount, nothing per row) finds the
    boundaries that minimise it. Fewer shapes mean fewer compilations and more padding: docs/recipe.md has the
    trade-off measured on a WMT-shaped corpus."""
    if shapes < 1:
        raise ValueError(f"--compile_shapes must be at least 1, got {shapes}.")
    counts = np.bincount(np.asarray(longest, dtype=np.int64), minlength=1)
    top = -(-max(len(counts) - 1, 1) // granularity) * granularity
    candidates = np.arange(granularity, top + 1, granularity)
    # pairs[i]: pairs of length <= candidates[i] (and 0 before the first)
    within = np.concatenate([[0], np.cumsum(np.pad(counts, (0, top + 1 - len(counts))))[candidates]]).astype(float)
    n, pairs = len(candidates), within[1:]
    # cost[j]: least padded size of the pairs up to candidates[j] in the buckets so far, the last one candidates[j];
    # one more bucket: the last bucket candidates[j] takes the pairs in (candidates[i], candidates[j]]
    cost, choices = candidates * pairs, []
    later = np.arange(n)[:, None] < np.arange(n)[None, :]
    spans = np.where(later, candidates[None, :] * (pairs[None, :] - pairs[:, None]), np.inf)
    for _ in range(1, min(shapes, n)):
        total = np.concatenate([cost[:, None] + spans, (candidates * pairs)[None, :]])  # last row: one bucket alone
        choices.append(total.argmin(axis=0))
        cost = total[choices[-1], np.arange(n)]
    buckets, j = [int(candidates[-1])], n - 1
    for choice in reversed(choices):
        j = int(choice[j])
        if j == n:  # the rest is in one bucket
            break
        buckets.append(int(candidates[j]))
    buckets = sorted(buckets)
    # a bucket no pair falls in would be a shape planned and never compiled
    held = np.diff(np.concatenate([[0], within[np.asarray(buckets) // granularity]]))
    return [bucket for bucket, count in zip(buckets, held, strict=True) if count > 0]


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
    model.compile(dynamic=False, backend=COMPILE_BACKEND)


COMPILE_BACKEND = "inductor"  # the tests swap in "eager": dynamo's graphs and guards, without inductor's C++ builds


def _cache_path():
    return precision_cache_path().with_name("speedups.json")


def remembered(key: str) -> dict | None:
    """What `vaswani train` measured before under `key` (a card, torch release, model shape and batch), kept in
    `speedups.json` beside the precision measurements (`precision_cache_path`). Delete the file to measure again."""
    return read_measurements(_cache_path()).get(key)


def remember(key: str, value: dict) -> None:
    write_measurement(_cache_path(), key, value)


def machine_key(model: torch.nn.Module, device: torch.device, precision: str) -> str:
    """The card (or CPU), torch release, precision and model shape a measurement holds for."""
    config = model.config
    where = cpu_name() if device.type == "cpu" else str(device)
    if device.type == "cuda" and torch.cuda.is_available():
        where = torch.cuda.get_device_name(device)
    shape = "x".join(str(getattr(config, name, "")) for name in ("d_model", "encoder_layers", "decoder_layers",
                                                                    "encoder_attention_heads", "encoder_ffn_dim",
                                                                    "vocab_size"))  # fmt: skip
    return f"{where} | torch {torch.__version__} | {precision} | model {shape}"


@dataclass
class CompilePlan:
    """The batch shapes a compiled run will meet, fixed before its first update: one (rows, length) per bucket that
    holds pairs, rows = max_tokens // length (`BucketPadding`). `earlier`: the seconds each compile took in the
    last run of this model on this machine (`remembered`; the first is the slowest, later shapes reuse its
    kernels), None until one ran."""

    shapes: list[tuple[int, int]]
    key: str
    earlier: list[float] | None = None

    @classmethod
    def for_buckets(cls, buckets: list[int], max_tokens: int, key: str) -> CompilePlan:
        shapes = [(max(max_tokens // length, 1), length) for length in buckets]
        known = (remembered(f"{key} | compile") or {}).get("seconds")
        earlier = [float(t) for t in known] if isinstance(known, list) else None  # another format: measured anew
        return cls(shapes, key, earlier)

    def estimate(self) -> float | None:
        """Seconds to compile every shape, from the last run's compile times (the mean of those past its count)."""
        if not self.earlier:
            return None
        times = self.earlier[: len(self.shapes)]
        return sum(times) + (len(self.shapes) - len(times)) * statistics.mean(self.earlier)

    def announcement(self) -> str:
        estimate = self.estimate()
        about = (f"about {estimate:.0f} s (as measured here before)" if estimate is not None
                 else "the first one's time gives an estimate")  # fmt: skip
        shapes = ", ".join(f"{rows}x{length}" for rows, length in self.shapes)
        return f"compiling {len(self.shapes)} shapes (rows x tokens: {shapes}), {about}"


class CompileWatch:
    """Follows a compiled run's batches against its `CompilePlan`: prints a line as each planned shape compiles
    (its first update) and when it is done, and warns, naming dynamo's failed guard, when a graph is compiled that
    the plan did not expect (a shape outside it, or a recompilation of one already compiled). The count is dynamo's
    own (`counters["stats"]["unique_graphs"]`); the guard comes from its `recompiles` log, captured here."""

    def __init__(self, plan: CompilePlan, say: Callable[[str], None]) -> None:
        from torch._dynamo.utils import counters

        self.plan, self.say, self.counters = plan, say, counters
        self.compiled: dict[tuple[int, int], float] = {}
        self.unplanned = 0
        self.current: tuple[int, int] | None = None
        self.reasons = RecompileReasons()

    @property
    def status(self) -> str | None:
        """ "compiling shape 3 of 6" while a planned shape's first update runs, else None."""
        if self.current is None or self.current in self.compiled:
            return None
        return f"compiling shape {len(self.compiled) + 1} of {len(self.plan.shapes)}"

    @contextlib.contextmanager
    def step(self, shape: tuple[int, int]) -> Iterator[None]:
        graphs, self.current, start = self.counters["stats"]["unique_graphs"], shape, time.perf_counter()
        new = shape not in self.compiled
        if new and shape in self.plan.shapes:
            self.say(f"{self.status} ({shape[0]}x{shape[1]})...")
        try:
            yield
        finally:
            self.current = None
        added = self.counters["stats"]["unique_graphs"] - graphs
        if new and shape in self.plan.shapes:
            seconds = time.perf_counter() - start
            self.compiled[shape] = seconds
            self.reasons.take()  # the guards a planned shape failed: expected
            left = len(self.plan.shapes) - len(self.compiled)
            self.say(f"shape {len(self.compiled)} of {len(self.plan.shapes)} compiled in {seconds:.0f} s" +
                     (f"; {left} to go" if left else f"; all in {sum(self.compiled.values()):.0f} s"))  # fmt: skip
            remember(f"{self.plan.key} | compile", {"seconds": [round(t, 1) for t in self.compiled.values()]})
        elif added:
            self.unplanned += added
            why = self.reasons.take() or "run with TORCH_LOGS=recompiles to see the guard that failed"
            logger.warning("an unplanned recompilation (batch shape %dx%d): %s", shape[0], shape[1], why)


class RecompileReasons:
    """Dynamo's recompilation reasons (its `recompiles` log), kept instead of printed, unless the user asked for
    that log (TORCH_LOGS), which then prints as usual."""

    NAME = "torch._dynamo.guards.__recompiles"

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.logger = logging.getLogger(self.NAME)
        self.handler: logging.Handler | None = None  # ours, unless the user asked for the log
        state = torch._logging._internal.log_state
        if state.is_artifact_enabled("recompiles"):
            return  # asked for by the user: leave it to print
        state.enable_artifact("recompiles")
        self.handler = _Keep(self.messages)
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False

    def take(self) -> str | None:
        if self.handler is not None:  # torch sets up its own handler at its first compile
            for handler in [h for h in self.logger.handlers if h is not self.handler]:
                self.logger.removeHandler(handler)
        guards = [line.strip("- ").strip() for message in self.messages for line in message.splitlines()
                  if line.strip().startswith("- ")]  # fmt: skip
        self.messages.clear()
        return "; ".join(guards) or None


class _Keep(logging.Handler):
    def __init__(self, messages: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


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
    return statistics.median(step_times(model, device, rows, length, precision, speedups, rounds, warmup)[warmup:])


def step_times(model: torch.nn.Module, device: torch.device, rows: int, length: int, precision: str,
               speedups: Speedups, rounds: int = 10, warmup: int = 3) -> list[float]:  # fmt: skip
    """The seconds of each of `warmup + rounds` training steps of a copy of `model` (the first compiles, with
    `compile`)."""
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
    return times


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


def training_threads(d_model: int | None, device: torch.device) -> tuple[int, str]:
    """(threads, why): the threads `vaswani train` runs a model `d_model` wide on `device` with, one on a CPU where
    the model is at most `ONE_THREAD_D_MODEL` wide (see there), else torch's count, and the reason. A count the user
    chose with `OMP_NUM_THREADS` or `MKL_NUM_THREADS` (a positive number, or OpenMP's list of them; torchrun sets the
    first where it starts more than one process) is kept: it is also this rule's switch. Where this torch's per-thread
    setters are not found (`thread_counts.thread_counts_settable`), torch's count."""
    threads = torch.get_num_threads()
    if device.type != "cpu":
        return threads, "torch's count; the model runs on the GPU"
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        chosen = os.environ.get(variable, "").strip()
        first = chosen.split(",")[0].strip()  # OpenMP's list: the outermost level's count
        if first.isdecimal() and int(first) > 0:
            return threads, f"{variable}={chosen}"
    if threads == 1 or d_model is None or d_model > ONE_THREAD_D_MODEL:
        return threads, "torch's count"
    if not thread_counts_settable():
        return threads, "torch's count: this torch's per-thread setters are not found"
    return 1, (
        f"d_model {d_model} <= {ONE_THREAD_D_MODEL}: a narrow model's steps run faster on one thread; "
        "OMP_NUM_THREADS=N sets another count"
    )
