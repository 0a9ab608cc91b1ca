# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Fast CPU products for decoding steps: the same logits as the model's own layers, computed the way that measures
fastest on the machine the model runs on. Nothing here changes what the search computes, only how fast.

- The decoder's linear layers multiply by the way measured fastest for the search's number of rows: their own
  `F.linear`, `weight @ hidden^T`, a weight packed by oneDNN or MKL, or a `bmm` over its two halves, timed on the
  first searches' own steps (`decoder_linears_for`, `_StepTrial`).
- The output projection picks among ways of its own, alike but for the halves (`output_logits`).
- Greedy search reads a bf16 or int8 copy of the output weight where that measures faster, and recomputes in float32
  the few tokens a proven error bound cannot rule out, so its tokens stay the float32 argmax (`screened_logits`).

The searches reach this file through one seam, `FastCpuProducts`, which `decoding_state_vaswani.DecodingState`
takes as its `products`; `generate(cpu_fast_paths=False)` or `VASWANI_CPU_FAST_PATHS=0` turns it off, and
tests/test_decoding_parity.py shows both give the same tokens and scores.

Why the decoder's linears are re-bound (`module.forward = ...` for the length of a search) rather than called
through an explicit hook in the decoder layer: `nn.Module.__call__` still runs, so forward hooks and pre-hooks
fire; only plain float32 `nn.Linear` layers are re-bound (`_step_linears`: an int8 or other quantized layer keeps
its own forward, a PEFT adapter's own linears are re-bound, its sum kept); a step with gradients enabled runs
`F.linear`; the modeling file stays the paper's, free of per-CPU branches. Each layer gets its own `forward` back
when the last search ends.
Part of the installed package, not of a checkpoint's remote code (`speed/__init__.py` plugs it into generate()).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import statistics
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import lean_step, step_threads

T = TypeVar("T")


def _product_by_rows(model, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    return model.output_projection(hidden).float().t()  # (rows, vocabulary) contiguous, seen as columns


def _product_by_columns(model, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    columns = weight @ hidden.t()
    bias = getattr(model, "final_logits_bias", None)
    if bias is not None:
        columns += bias[:, None]
    return columns.float()


def _product_by_doubled_row(model, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    return _product_by_columns(model, weight, hidden.repeat(2, 1))[:, :1]


def _product_by_packed_weight(model, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    bias = getattr(model, "final_logits_bias", None)
    bias = None if bias is None else bias.reshape(-1)
    return torch.ops.mkldnn._linear_pointwise(hidden, packed_weight(weight), bias, "none", [], "").float().t()


def _product_by_mkl_packed_weight(model, weight: torch.Tensor, hidden: torch.Tensor, rows: int) -> torch.Tensor:
    bias = getattr(model, "final_logits_bias", None)
    bias = None if bias is None else bias.reshape(-1)
    return torch.ops.mkl._mkl_linear(hidden, mkl_packed_weight(weight, rows), weight, bias, rows).float().t()


# weight -> ((data pointer, version, dtype), the weight in oneDNN's blocked layout), for `_product_by_packed_weight`
_PACKED_WEIGHTS = WeakIdKeyDictionary()  # by identity: a tensor's == is elementwise


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` reordered once into oneDNN's blocked layout for its linear kernel, which `F.linear` would otherwise
    re-read from the plain layout at every call; reordered again when the weight changes (an optimizer step bumps
    its version, a cast or a move its pointer), so a model evaluated between training steps decodes with its
    current weights. The layout is tuned for a batch of 64 rows (measured as fast as or faster than the other hints
    for 1-64 rows, where a hint of 1 row ran 2x slower at 4 rows) and serves any number of rows."""
    return _derived(_PACKED_WEIGHTS, weight, lambda plain: torch.ops.mkldnn._reorder_linear_weight(plain, 64))


def _derived(cache: WeakIdKeyDictionary, weight: torch.Tensor, build: Callable[[torch.Tensor], T]) -> T:
    """`build(weight)`, kept in `cache` until the weight changes: an optimizer step bumps its version, a cast or a
    move its pointer. A weight made under inference_mode has no version counter to tell an in-place change: built
    again at every call (so such a copy is never measured fastest)."""
    if weight.is_inference():
        return build(weight)
    stamp = (weight.data_ptr(), weight._version, weight.dtype)
    entry = cache.get(weight)
    if entry is None or entry[0] != stamp:
        entry = cache[weight] = (stamp, build(weight.detach()))
    return entry[1]


# ((weight shape, dtype), rows bucket, threads) -> the way measured fastest on this machine, chosen once per process
_FASTEST_PRODUCT: dict[tuple, Callable] = {}


def _fastest(
    ways: tuple[Callable, ...], model, weight: torch.Tensor, hidden: torch.Tensor, rounds: int = 3
) -> Callable:
    """The output projection's way that took the shortest time, each call timed together with the rest of a
    decoding step's weight traffic (`_rest_of_a_step`), after one warm-up call each. The rounds call every way in
    turn, so that a slow spell of the machine slows them all.

    Timed alone, one way after the other, the ways mispredicted the loop: on the AVX2-capped Sapphire Rapids the
    plain product (4.9-5.2 ms alone against 4.5 packed, at 4 rows) won one run in three, and beam4-b1 ran at 1.02x
    Marian instead of 1.17x; with the decoder's weights read between calls the packed weight won every run
    (12.6 against 13.3 ms with them)."""
    rest = _rest_of_a_step(model, weight)

    def step(way: Callable) -> Callable[[], None]:
        return lambda: (way(model, weight, hidden), rest())

    best = _best_times([step(way) for way in ways], rounds)
    return ways[best.index(min(best))]


def _best_times(calls: list[Callable[[], object]], rounds: int = 3) -> list[float]:
    """Each call's shortest time over `rounds` rounds that run every call in turn, after one warm-up call each."""
    for call in calls:
        call()
    best = [math.inf] * len(calls)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def _rest_of_a_step(model, *timed: torch.Tensor) -> Callable[[], None]:
    """What the rest of a decoding step does to the caches and the memory bus: each of the decoder's weight
    matrices and the output weight, but the `timed` ones, read once, by a product with a zero row."""
    output = getattr(model.get_output_embeddings(), "weight", None)
    candidates = [p for p in model.get_decoder().parameters() if p.dim() == 2]
    candidates += [output] if type(output) is torch.nn.Parameter else []
    matrices = list({id(p): p for p in candidates if all(p is not t for t in timed)}.values())
    rows = {(p.shape[1], p.dtype): torch.zeros(1, p.shape[1], dtype=p.dtype, device=p.device) for p in matrices}

    def rest() -> None:
        for matrix in matrices:
            torch.nn.functional.linear(rows[matrix.shape[1], matrix.dtype], matrix)

    return rest


# rows -> weight -> ((data pointer, version, dtype), the weight packed by MKL for products of exactly `rows` rows),
# for the `MKL_PACKED_ROW_COUNTS` numbers of rows used last
_MKL_PACKED: OrderedDict[int, WeakIdKeyDictionary] = OrderedDict()
MKL_PACKED_ROW_COUNTS = 2


def mkl_packed_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` packed by MKL (`cblas_sgemm_pack`) for products with exactly `rows` rows of input;
    `torch.ops.mkl._mkl_linear` multiplies any other number of rows by the plain weight. Packs are kept for the two
    numbers of rows used last (a beam search's first step and the others, or two batch sizes in turn; each pack
    is as large as its weight), so a third number of rows packs again (0.02-0.12 s for the base preset's decoder)."""
    packs = _MKL_PACKED.pop(rows, None)
    _MKL_PACKED[rows] = packs = WeakIdKeyDictionary() if packs is None else packs
    while len(_MKL_PACKED) > MKL_PACKED_ROW_COUNTS:
        _MKL_PACKED.popitem(last=False)
    return _derived(packs, weight, lambda plain: torch.ops.mkl._mkl_reorder_linear_weight(plain, rows))


def _plain_linear(module: torch.nn.Linear, rows: int) -> None:
    """The layer's own `F.linear` (MKL's or oneDNN's product, re-reading the plain weight at every call)."""
    return None


def _linear_by_mkl_pack(module: torch.nn.Linear, rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """MKL's product through the weight packed for exactly `rows` rows (`mkl_packed_weight`)."""
    pack = mkl_packed_weight(module.weight, rows)
    return _inference_only(
        module, lambda hidden: torch.ops.mkl._mkl_linear(hidden, pack, module.weight, module.bias, rows)
    )


def _linear_by_onednn_pack(module: torch.nn.Linear, rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """oneDNN's product through the weight in its blocked layout (`packed_weight`, any number of rows)."""
    pack, bias = packed_weight(module.weight), module.bias
    return _inference_only(
        module, lambda hidden: torch.ops.mkldnn._linear_pointwise(hidden, pack, bias, "none", [], "")
    )


def _linear_by_columns(module: torch.nn.Linear, rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """`weight @ hidden^T`, one column per row, as the output projection's `_product_by_columns`: the BLAS streams
    the plain weight once instead of packing it (the transposed result is copied back only for several rows)."""
    weight, bias = module.weight, module.bias
    column_bias = None if bias is None else bias[:, None]

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1]).t()
        columns = weight @ flat if column_bias is None else torch.addmm(column_bias, weight, flat)
        return columns.t().contiguous().view(*hidden.shape[:-1], weight.shape[0])

    return _inference_only(module, forward)


def _linear_by_halves(module: torch.nn.Linear, rows: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """One `bmm` over the weight's two halves of output rows (an odd number of them: the layer's own product): at
    one row on one thread it read a `small` decoder's linears in 0.85 ms against 1.45-1.53 for the plain and MKL-
    packed products (benchmarks/one_row_products.py, Zen 4)."""
    weight, bias = module.weight, module.bias
    if weight.shape[0] % 2:
        return None
    halves = weight.view(2, weight.shape[0] // 2, weight.shape[1])
    half_bias = None if bias is None else bias.view(2, -1, 1)

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        columns = hidden.reshape(-1, hidden.shape[-1]).t().expand(2, -1, -1)
        out = torch.bmm(halves, columns) if half_bias is None else torch.baddbmm(half_bias, halves, columns)
        return out.view(weight.shape[0], -1).t().contiguous().view(*hidden.shape[:-1], weight.shape[0])

    return _inference_only(module, forward)


def _inference_only(
    module: torch.nn.Linear, forward: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """`forward` where no gradient is recorded (the packed products have no backward), the layer's own elsewhere:
    a training step inside a search's lifetime still trains the weights."""

    def guarded(hidden: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return torch.nn.functional.linear(hidden, module.weight, module.bias)
        return forward(hidden)

    guarded.fast_product = True  # the lean step (`lean_step.py`) knows this re-binding from a caller's own
    return guarded


def _step_linears(model) -> list[torch.nn.Linear]:
    """The decoder's float32 CPU linear layers that every decoding step multiplies (not the cross-attention's
    keys/values: those are projected once per sentence, over its source tokens). Empty where a layer computes
    anything but `F.linear` (int8); a PEFT adapter is not an `nn.Linear`, its base layer, A and B are."""
    linears = [
        module
        for name, module in model.get_decoder().named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] != "kv_proj"
    ]
    plain = all(
        type(m).forward is torch.nn.Linear.forward
        # a caller's own `forward` on the instance runs as theirs (the fast products' re-bindings are marked)
        and ("forward" not in vars(m) or getattr(m.forward, "fast_product", False))
        and type(m.weight) is torch.nn.Parameter
        and m.weight.dtype == torch.float32
        and m.weight.device.type == "cpu"
        for m in linears
    )
    return linears if plain else []


def has_ops(*names: str) -> bool:
    """Whether this torch has every private op named (`"mkldnn._linear_pointwise"`): a build may have the backend
    (`torch.backends.mkldnn.is_available()`) without one of them, or a later release drop it; a way that needs a
    missing op is never offered, and the plain product is."""
    for name in names:
        namespace, op = name.split(".")
        try:
            getattr(getattr(torch.ops, namespace), op)
        except (AttributeError, RuntimeError):
            return False
    return True


ONEDNN_OPS = ("mkldnn._reorder_linear_weight", "mkldnn._linear_pointwise")
MKL_OPS = ("mkl._mkl_reorder_linear_weight", "mkl._mkl_linear")


def _onednn_bf16() -> bool:
    return (torch.backends.mkldnn.is_available() and has_ops(*ONEDNN_OPS, "mkldnn._is_mkldnn_bf16_supported")
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())  # fmt: skip


def _linear_ways(rows: int = 1) -> tuple[Callable, ...]:
    """The ways this build of torch offers to multiply a decoder linear on CPU at `rows` rows, the layer's own first.
    MKL's pack serves exactly one number of rows, so it is offered only at 1-3 rows, where a way's key (`_linear_key`)
    holds at most the two numbers of rows whose packs are kept (`MKL_PACKED_ROW_COUNTS`): kept for a wider bucket,
    it repacked every weight for each search of another size (12 of 12 weights at every search of a beam-4 mix of
    5-7 sentences; 0.08 s a search for a base-sized decoder). The halves' `bmm` is offered at 1-3 rows: measured
    fastest at one row, not at 4 or 32 on one thread."""
    ways: tuple[Callable, ...] = (_plain_linear, _linear_by_columns)
    if torch.backends.mkldnn.is_available() and has_ops(*ONEDNN_OPS):
        ways += (_linear_by_onednn_pack,)
    if torch.backends.mkl.is_available() and has_ops(*MKL_OPS) and rows.bit_length() <= 2:  # 1-3 rows
        ways += (_linear_by_mkl_pack,)
    return ways + ((_linear_by_halves,) if rows.bit_length() <= 2 else ())


# ((the linears' shapes), rows bucket, threads) -> the way decoding steps measured fastest on this machine
_FASTEST_LINEAR: dict[tuple, Callable] = {}
# the same keys -> each way's step times so far, while `_FASTEST_LINEAR` has no way for the key yet
_LINEAR_TRIALS: dict[tuple, list[list[float]]] = {}
LINEAR_TRIAL_STEPS = 12  # timed steps per way before the fastest is kept (linears and output projection)
# output projection keys whose way was timed on decoding steps (`_OutputWays`), not only by `_fastest`
_OUTPUT_TIMED_ON_STEPS: set[tuple] = set()
_OUTPUT_TRIALS: dict[tuple, list[list[float]]] = {}
# model -> the `_OutputWays` whose way `output_logits` takes while a search's trial times it
_OUTPUT_UNDER_TRIAL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _linear_key(linears: list[torch.nn.Linear], rows: int) -> tuple:
    """Searches whose rows fall in the same power-of-two bucket share a way, as the output projection's do: keyed
    by the exact number of rows, a server's batches (beam 4 over 1-32 sentences: 32 numbers of rows) kept every
    search in a trial, running the slower ways in turn and packing every weight for each new number of rows (a
    mix of 40 batches of 1-32 sentences: all of its 1,052 steps under trial)."""
    width = linears[0].in_features  # the first layer's query-key-value projection: d_model (`_step_linears`' order)
    return tuple(tuple(m.weight.shape) for m in linears), rows.bit_length(), step_threads.threads_for(rows, width)


def _fastest_linear_way(linears: list[torch.nn.Linear], rows: int) -> Callable | None:
    """The way real decoding steps measured fastest for the decoder's linears at `rows` rows on this machine, or
    None while a `_StepTrial` is still timing them."""
    return _FASTEST_LINEAR.get(_linear_key(linears, rows))


def _keep_packs_of(way: Callable, linears: list[torch.nn.Linear], rows: int) -> None:
    """Drop the linears' packed copies that neither `way` nor another chosen way reads (each is as large as its
    weight)."""
    for m in linears:
        if way is not _linear_by_mkl_pack:
            _MKL_PACKED.get(rows, {}).pop(m.weight, None)
        if _linear_by_onednn_pack not in _FASTEST_LINEAR.values():
            _PACKED_WEIGHTS.pop(m.weight, None)


def _bind(linears: list[torch.nn.Linear], forwards: list[Callable | None]) -> None:
    for m, forward in zip(linears, forwards, strict=True):
        if forward is None:
            m.__dict__.pop("forward", None)
        else:
            m.forward = forward


class _LinearWays:
    """The decoder linears' ways at a search's rows, as one phase of a `_StepTrial`."""

    def __init__(self, trial: _StepTrial, linears: list[torch.nn.Linear], rows: int) -> None:
        self.trial, self.linears, self.rows = trial, linears, rows
        self.key, self.ways = _linear_key(linears, rows), _linear_ways(rows)
        self.times = _LINEAR_TRIALS.setdefault(self.key, [[] for _ in self.ways])
        self.forwards = [[way(m, rows) for m in linears] for way in self.ways]  # every pack built before any timing

    def decided(self) -> bool:
        return self.key in _FASTEST_LINEAR

    def used(self) -> bool:
        return True

    def take(self, way: int) -> None:
        self.trial.bind_linears(self.forwards[way])

    def decide(self) -> None:
        way = self.ways[_shortest_median(self.times, prefer_first_within=0.02)]
        _FASTEST_LINEAR[self.key] = way
        _LINEAR_TRIALS.pop(self.key, None)
        self.forwards = []
        _keep_packs_of(way, self.linears, self.rows)

    def settle(self) -> None:
        self.trial.bind_linears([_FASTEST_LINEAR[self.key](m, self.rows) for m in self.linears])


class _OutputWays:
    """The output projection's ways at a search's rows (`output_logits`), as one phase of a `_StepTrial`: only
    where the search's steps go through `output_logits` (beam search over the whole vocabulary; greedy screens its
    logits, and a shortlist multiplies its own rows)."""

    def __init__(self, model, weight: torch.Tensor, rows: int) -> None:
        self.model, self.weight, self.rows = model, weight, rows
        self.key, self.ways = _output_key(weight, rows), _output_ways(weight, rows)
        self.times = _OUTPUT_TRIALS.setdefault(self.key, [[] for _ in self.ways])
        self.way, self.hit = self.ways[0], False
        self.thread = threading.get_ident()  # the search timing it; another thread's products keep their way

    def decided(self) -> bool:
        return self.key in _OUTPUT_TIMED_ON_STEPS

    def used(self) -> bool:
        return self.hit

    def product(self, model, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        self.hit = True
        return self.way(model, weight, hidden)

    def take(self, way: int) -> None:
        self.way, self.hit = self.ways[way], False
        _OUTPUT_UNDER_TRIAL[self.model] = self

    def decide(self) -> None:
        _FASTEST_PRODUCT[self.key] = self.ways[_shortest_median(self.times)]
        _OUTPUT_TIMED_ON_STEPS.add(self.key)
        _OUTPUT_TRIALS.pop(self.key, None)
        _keep_output_copies(self.key, self.weight, self.rows)

    def settle(self) -> None:
        if _OUTPUT_UNDER_TRIAL.get(self.model) is self:
            del _OUTPUT_UNDER_TRIAL[self.model]


def _output_weight_to_time(model, rows: int) -> torch.Tensor | None:
    """The output weight whose way a search of `rows` rows still has to time on its steps, or None."""
    weight = getattr(model.get_output_embeddings(), "weight", None)
    if type(weight) is not torch.nn.Parameter or weight.device.type != "cpu" or rows > 256 or not _timed(weight):
        return None  # `output_logits` multiplies such a weight one way only
    return None if _output_key(weight, rows) in _OUTPUT_TIMED_ON_STEPS else weight


def _output_phase(model, rows: int) -> _OutputWays | None:
    """The output projection's phase of a search's `_StepTrial`, where its way is still to be timed on steps."""
    weight = _output_weight_to_time(model, rows)
    return None if weight is None else _OutputWays(model, weight, rows)


def decoding_ways_settled(model, rows: int) -> bool:
    """Whether beam searches of `rows` rows on `model` have done timing their ways on their own steps (`_StepTrial`):
    until then their steps run each way in turn, slower ones included, so whatever times the model's decoding as a
    measure of its speed (`precision.measure_bf16_speedup`) warms up until this holds. Greedy searches never time
    the output projection's ways (they screen it), so for them this stays False on a float32 CPU model."""
    linears = _step_linears(model)
    if not linears:
        return True  # no trial runs (bf16, int8 or adapter layers, or not on CPU)
    return _fastest_linear_way(linears, rows) is not None and _output_weight_to_time(model, rows) is None


def _shortest_median(times: list[list[float]], prefer_first_within: float = 0.0) -> int:
    """The way whose steps had the shortest median; the first way where the shortest is not that fraction shorter."""
    medians = [statistics.median(t) for t in times]
    best = medians.index(min(medians))
    return best if medians[best] < (1 - prefer_first_within) * medians[0] else 0


_TRIALS_STARTED = itertools.count()


class _StepTrial:
    """Timing ways on a search's own decoding steps: each undecided phase in turn (the decoder's linears, then the
    output projection) binds each of its ways for one step in turn until every way has `LINEAR_TRIAL_STEPS` step
    times; the shortest median is kept for the process (for the linears, a way other than their own only where it
    saves 2%: the packed copies are as large as the weights) and bound for the rest of the search. A step is the
    time between two calls of the decoder's first linear layer, so it holds everything a step does: attention, the
    output projection, the search. A search's first step is not counted (it runs fewer rows in beam search, and may
    build caches); a phase whose way the step did not use ends for this search. Times accumulate across searches
    with the same key, so short sentences decide too. The phases run one after the other: timed together, a way of
    one would be paired with the same way of the other at every step.

    Timed outside the loop (the linears alone, or with a read of the other weights between them), the ways
    mispredicted: on an AVX2-only AMD EPYC (Zen 3) at one row the pick among F.linear, `weight @ h^T`, oneDNN's
    pack and MKL's pack changed from run to run, while whole greedy generate() calls with a shortlist took 616 /
    620 / 523 / 545 ms (medians of 6, interleaved): the oneDNN pack was 1.18x the layers' own product. Timed here,
    with 12 steps per way, a packed way was kept in 6 processes of 6 there; with 5 steps, one kept `weight @ h^T`.
    The output projection's harness (`_fastest`) chose `weight @ h^T` at 64 rows in one process of two there, where
    beam4-b16 generate() calls took 2,634 ms against 2,319 with the oneDNN pack."""

    def __init__(
        self, linears: list[torch.nn.Linear], rows: int, time_linears: bool, output: _OutputWays | None
    ) -> None:
        self.linears = linears
        self.own = type(linears[0]).forward.__get__(linears[0])
        self.first: Callable = vars(linears[0]).get("forward", self.own)  # the linears may be bound already
        self.phases: list = [_LinearWays(self, linears, rows)] if time_linears else []
        self.phases += [output] if output is not None else []
        self.steps, self.way, self.started, self.timing = 0, 0, 0.0, False
        # where this search's cycles start; the cycle timing; whether one was whole
        self.first_way, self.cycle, self.cycled = next(_TRIALS_STARTED), [], False

        # the search that started the trial times it: another search stepping the same model meanwhile (a decoding
        # worker beside it, translation/batch_workers.py) runs the ways bound for it and drives no clock
        owner = threading.get_ident()

        def first_of_a_step(hidden: torch.Tensor) -> torch.Tensor:
            if threading.get_ident() == owner and not torch.is_grad_enabled():
                self.step_begins()
            return self.first(hidden)

        first_of_a_step.fast_product = True  # a re-binding the lean step knows (`_inference_only`)
        linears[0].forward = first_of_a_step

    def bind_linears(self, forwards: list[Callable | None]) -> None:
        self.first = forwards[0] or self.own
        _bind(self.linears[1:], forwards[1:])

    def step_begins(self) -> None:
        now = time.perf_counter()
        self.steps += 1
        while self.phases:
            phase = self.phases[0]
            counted = self.timing and self.steps > 2  # the step that just ended, not a search's first
            if counted and not phase.decided() and phase.used():
                self.cycle.append((self.way, now - self.started))
                if len(self.cycle) == len(phase.times):  # every way timed once on this search: they count together
                    for way, seconds in self.cycle:
                        phase.times[way].append(seconds)
                    self.cycle, self.cycled = [], True
            if not phase.decided() and min(len(t) for t in phase.times) >= LINEAR_TRIAL_STEPS:
                phase.decide()
            if phase.decided() or (counted and not phase.used()):  # decided (here or by another search), or unused
                phase.settle()
                self.phases.pop(0)
                self.timing, self.cycle, self.cycled = False, [], False
                continue
            # each search times the ways in cycles, each way once a cycle, and its steps count only by whole cycles:
            # searches of a bucket differ in size, and a way given more of one search's steps than another would be
            # timed on other sizes (taken by fewest steps so far, a fake-clock run of 6-step searches of 4 and 7 rows
            # in turn kept the plain way over one 15% faster); each search's cycles start one way further on
            self.way = (self.first_way + len(self.cycle)) % len(phase.times)
            phase.take(self.way)
            self.timing, self.started = True, time.perf_counter()
            return
        _bind(self.linears[:1], [None if self.first is self.own else self.first])  # the clock stops

    def end(self) -> None:
        if self.phases and self.cycle and not self.cycled and not self.phases[0].decided():
            # a search too short for a whole cycle still counts (else short sentences would never decide), the
            # next one's starting at another way; a longer search's last, partial cycle does not
            for way, seconds in self.cycle:
                self.phases[0].times[way].append(seconds)
        for phase in self.phases:
            if isinstance(phase, _OutputWays):
                phase.settle()


# model -> how many of its searches are running with its decoder's linears bound to a measured way
_BOUND_SEARCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BINDING = threading.Lock()


@contextlib.contextmanager
def decoder_linears_for(model, rows: int):
    """While one search runs with `rows` rows, the decoder's linear layers multiply the way measured fastest for
    rows of that power-of-two bucket on this machine (`_linear_key`): their own `F.linear`, `weight @ hidden^T`, a
    weight packed by oneDNN or by MKL, or (1-3 rows) a `bmm` over its halves. `F.linear` re-reads the weight in its
    plain layout at every call, which at a few rows costs more than the arithmetic, by how much depends on the CPU
    and the BLAS (from nothing to 2.4x).
    Until the first searches have measured the ways (`_StepTrial`, which then times the output projection's ways
    too), steps run each way in turn. A step with fewer rows (sentences that finished) keeps the way; MKL's pack
    then multiplies by the plain weight. The layers get their own `forward` back when the last search running on the
    model ends; a search that starts while another runs keeps the first one's way."""
    linears = _step_linears(model)
    trial = None
    with _BINDING:
        running = _BOUND_SEARCHES.get(model, 0)
        if running == 0 and linears:
            way = _fastest_linear_way(linears, rows)
            if way is not None:
                _bind(linears, [way(m, rows) for m in linears])
            output = _output_phase(model, rows)
            if way is None or output is not None:
                trial = _StepTrial(linears, rows, way is None, output)
        _BOUND_SEARCHES[model] = running + 1
    try:
        yield
    finally:
        with _BINDING:
            if trial is not None:
                trial.end()
            _BOUND_SEARCHES[model] -= 1
            if _BOUND_SEARCHES[model] == 0:
                _bind(linears, [None] * len(linears))


def output_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The output projection of a decoding step: (rows, d_model) -> float32 logits seen as (vocabulary, rows), one
    column per row; the searches read them as `.t()`, and the memory is contiguous in one of the two layouts.

    On CPU the fastest way to multiply the (vocabulary x d_model) weight by a few rows depends on the BLAS and the
    CPU, so it is measured on the first call for each size of rows (bucketed by powers of two) and kept for the
    process. Measured on the base preset's 37,000 x 512 matrix, 2 threads: on an AMD EPYC (AVX-512, no AMX)
    weight @ hidden^T is 2.5-5x faster than `F.linear` for 1-64 rows (which packs the whole weight matrix for every
    call there), and one row fastest doubled (2.0 against 7.3 ms); on an Intel Sapphire Rapids `F.linear` wins at
    1-4 rows (1.6 against 4.2 ms doubled at one row) and weight @ hidden^T from 16 rows (3.5 against 5.8 ms).
    A fourth way keeps a copy of the weight in oneDNN's blocked layout (`packed_weight`): on an Intel Sapphire
    Rapids it took 1.7 against 2.9 ms (`F.linear`) at 4 rows and 8.5 against 10.2 ms at 64, and beam4-b1 decoding
    ran 1.22x faster with it (1.18x with the CPU capped to AVX2), while one row stays faster unpacked.
    Every way computes the same products: the logits are equal up to float rounding. The (vocabulary, rows) result
    is kept as written: a transposing copy cost as much as the product. A weight that is not float32 (bf16) is
    multiplied by the model's own product, never timed (`_timed`).
    """
    weight = getattr(model.get_output_embeddings(), "weight", None)
    rows = hidden.shape[0]
    # int8 models (`precision.py`) hold a packed or subclassed weight: their own module computes the product
    if hidden.device.type != "cpu" or rows > 256 or type(weight) is not torch.nn.Parameter or not _timed(weight):
        return _product_by_rows(model, weight, hidden)
    key = _output_key(weight, rows)
    trial = _OUTPUT_UNDER_TRIAL.get(model)
    if trial is not None and trial.key == key and trial.thread == threading.get_ident():
        return trial.product(model, weight, hidden)
    way = _FASTEST_PRODUCT.get(key)
    if way is None:
        way = _FASTEST_PRODUCT[key] = _fastest(_output_ways(weight, rows), model, weight, hidden)
        _keep_output_copies(key, weight, rows)
    return way(model, weight, hidden)


def _timed(weight: torch.Tensor) -> bool:
    """Whether the output projection's way is chosen by stopwatch for this weight: float32 only. The ways round
    differently, and a bf16 logit keeps 8 bits, so two ways' bf16 logits tie or swap near-equal tokens: a choice
    by stopwatch (which one process's timings, a busy neighbour's included, decide) made the same greedy call give
    other tokens in another process. A bf16 weight is multiplied by the model's own product, as with the fast
    paths off and in Transformers' loop: the same tokens in every process. Float32 ways differ in the last bits
    of a score only (greedy's tokens are exact: `screened_logits`)."""
    return weight.dtype == torch.float32


def _output_key(weight: torch.Tensor, rows: int) -> tuple:
    return (tuple(weight.shape), weight.dtype), rows.bit_length(), step_threads.threads_for(rows, weight.shape[1])


def _output_ways(weight: torch.Tensor, rows: int) -> tuple[Callable, ...]:
    """The ways to multiply the output weight by `rows` rows on this CPU, the layer's own first."""
    ways = (_product_by_rows, _product_by_columns) + ((_product_by_doubled_row,) if rows == 1 else ())
    if torch.backends.mkldnn.is_available() and has_ops(*ONEDNN_OPS) and weight.dtype == torch.float32:
        ways += (_product_by_packed_weight,)
    if torch.backends.mkl.is_available() and has_ops(*MKL_OPS) and weight.dtype == torch.float32:
        ways += (functools.partial(_product_by_mkl_packed_weight, rows=rows),)
    return ways


def _keep_output_copies(key: tuple, weight: torch.Tensor, rows: int) -> None:
    """Drop the output weight's packed copies that the way chosen for `key` (and other rows buckets) do not read."""
    _keep_copy_where_chosen(_FASTEST_PRODUCT, key, _product_by_packed_weight, _PACKED_WEIGHTS, weight)
    if not isinstance(_FASTEST_PRODUCT[key], functools.partial):  # this bucket's only number of rows packed by MKL
        _MKL_PACKED.get(rows, {}).pop(weight, None)


def _keep_copy_where_chosen(fastest: dict, key: tuple, way: Callable, copies: WeakIdKeyDictionary, weight) -> None:
    """Drop the copy of `weight` that `way` reads (as large as the weight, or a half or a quarter of it) unless some
    rows bucket of this weight's shape (`key[0]`) measured `way` fastest."""
    if not any(k[0] == key[0] and chosen is way for k, chosen in fastest.items()):
        copies.pop(weight, None)


# bf16 keeps 8 significant bits: rounding changes a number by at most 2^-9 of it; 2^-8 doubles that as a safety factor
BF16_ROUNDING = 2.0**-8


@dataclass(frozen=True)
class WeightScreen:
    """A low-precision copy of the output weight for greedy decoding's screen (`screened_logits`), and what its
    product can get wrong: its kernel takes bf16 rows and accumulates in float32, and gives bf16 logits."""

    product: Callable[[torch.Tensor], torch.Tensor]  # (rows, d_model) bf16 -> (rows, vocabulary) bf16
    norm: float  # the largest norm of a row of the copy
    residual: float  # the largest norm of what the copy removed from a row
    rounding: float  # how much the kernel may round each weight of the copy, relative (0: used as stored)


def bf16_screen(plain: torch.Tensor) -> WeightScreen:
    """The weight rounded to bfloat16 in oneDNN's blocked layout (AMX, AVX-512 bf16; oneDNN accumulates in float32)."""
    rounded = plain.bfloat16()
    packed = torch.ops.mkldnn._reorder_linear_weight(rounded, 64)
    return WeightScreen(
        product=lambda hidden: torch.ops.mkldnn._linear_pointwise(hidden, packed, None, "none", [], ""),
        norm=float(torch.linalg.vector_norm(rounded.float(), dim=1).max()),
        residual=float(torch.linalg.vector_norm(plain - rounded.float(), dim=1).max()),
        rounding=0.0,
    )


def int8_screen(plain: torch.Tensor) -> WeightScreen:
    """The weight as int8 rows with a bf16 scale each, multiplied by torch's weight-only int8 kernel, which
    accumulates in float32 on every CPU (AVX2 included) but may round the rescaled weights to bf16 (its oneDNN path
    does); a quarter of the float32 weight's bytes."""
    scale = (plain.abs().amax(dim=1) / 127).bfloat16()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    quantized = torch.round(plain / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    rescaled = quantized.float() * scale.float()[:, None]  # exact: 7-bit integers times 8-bit significands
    return WeightScreen(
        product=lambda hidden: torch.ops.aten._weight_int8pack_mm(hidden, quantized, scale),
        norm=float(torch.linalg.vector_norm(rescaled, dim=1).max()),
        residual=float(torch.linalg.vector_norm(plain - rescaled, dim=1).max()),
        rounding=BF16_ROUNDING,
    )


# copy -> (weight -> ((data pointer, version, dtype), its `WeightScreen`)), for `screened_logits`
_SCREENS = {bf16_screen: WeakIdKeyDictionary(), int8_screen: WeakIdKeyDictionary()}
# output bias -> ((data pointer, version, dtype), its largest magnitude): not a pass over the vocabulary per step
_BIAS_BOUNDS = WeakIdKeyDictionary()


def screened_logits(
    model, weight: torch.Tensor, hidden: torch.Tensor, copy: Callable[[torch.Tensor], WeightScreen]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding's output projection reading a low-precision copy of the weight (`bf16_screen`: half the
    bytes of float32, `int8_screen`: a quarter; at one row a step reads the whole 37,000 x 512 weight for one
    product), with the same argmax as the float32 logits.

    The copy's product p' gives every logit to within a margin: for a row x rounded to bf16 x' and a weight row w
    whose copy is w', x.w = x'.w' + x.(w - w') + (x - x').w', so |x.w - x'.w'| <= |x| |w - w'| + |x - x'| |w'|
    (Cauchy-Schwarz, with the largest row norms kept beside the copy); the kernel adds its rounding of the weights
    (`WeightScreen.rounding` |x'| |w'|), its float32 accumulation (at most 2 d_model 2^-24 |x'| |w'|) and the
    rounding of its bf16 result (|p'| `BF16_ROUNDING`). The best estimate minus its margin is a floor under the
    row's best logit; only tokens whose estimate plus margin reaches the floor can be the argmax, and their float32
    logits are computed exactly (one dot product each, usually one to a few per row). Returns (rows, vocabulary)
    scores, exact for those candidates and below the floor elsewhere, and the (rows, 1) floors: a token scoring
    below its row's floor after the logits processors (which removed every candidate) is not known to be the argmax.
    """
    screen = _derived(_SCREENS[copy], weight, copy)
    rounded = hidden.bfloat16()
    scores = screen.product(rounded).float()
    rounded = rounded.float()
    size = torch.linalg.vector_norm(hidden, dim=1, keepdim=True)
    error = torch.linalg.vector_norm(hidden - rounded, dim=1, keepdim=True)
    kernel = screen.rounding + 2 * hidden.shape[1] * 2.0**-24
    error += kernel * torch.linalg.vector_norm(rounded, dim=1, keepdim=True)
    spread = size * screen.residual + error * screen.norm  # (rows, 1); an estimate a is within |a| 2^-8 + spread
    bias = getattr(model, "final_logits_bias", None)
    if bias is not None:  # the rounding applies to the product before the bias: |product| <= |a| + |bias|
        scores += bias.reshape(-1)
        spread += _derived(_BIAS_BOUNDS, bias, lambda plain: float(plain.abs().max())) * BF16_ROUNDING
    best = scores.amax(dim=1, keepdim=True)  # a - |a| 2^-8 grows with a: the best estimate has the best floor
    floor = best - best.abs() * BF16_ROUNDING - spread
    # a + |a| 2^-8 + spread >= floor, solved for a
    level = floor - spread
    threshold = torch.where(level >= 0, level / (1 + BF16_ROUNDING), level / (1 - BF16_ROUNDING))
    rows, tokens = (scores >= threshold).nonzero(as_tuple=True)
    exact = torch.linalg.vecdot(hidden[rows], weight[tokens])
    if bias is not None:
        exact += bias.reshape(-1)[tokens]
    scores[rows, tokens] = exact
    return scores, floor


def _product_by_fastest_way(model, weight: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, None]:
    return output_logits(model, hidden).t(), None


def _screened_in_bf16(model, weight: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return screened_logits(model, weight, hidden, bf16_screen)


def _screened_in_int8(model, weight: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return screened_logits(model, weight, hidden, int8_screen)


# ((weight shape, dtype), rows bucket, threads) -> greedy's output projection measured fastest on this machine
_FASTEST_GREEDY: dict[tuple, Callable] = {}


def greedy_output_logits(model, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Greedy decoding's output projection: (rows, d_model) -> (rows, vocabulary) scores whose argmax is each
    row's greedy token, and (rows, 1) floors: after the logits processors, a row's argmax is known to be the
    float32 logits' where it scores at least its floor (None: every score is exact).

    The fastest of the exact product (`output_logits`) and `screened_logits` with each copy, measured for this
    many rows (bucketed as in `output_logits`); the copies no bucket uses are dropped. Measured on an Intel
    Sapphire Rapids, 37,000 x 512, 2 threads, the product took 0.64 ms (int8), 0.83 ms (bf16) and 1.4 ms (float32)
    at one row, 4.2, 0.90 and 3.7 ms at 16 rows; capped to AVX2 (no bf16 kernels in oneDNN, no bf16 copy) the int8
    product took 0.79 against 1.4 ms at one row. Float32 weights only: a bf16 model's weights already are bf16;
    the int8 kernel needs d_model to be a multiple of 16.
    """
    weight = getattr(model.get_output_embeddings(), "weight", None)
    rows = hidden.shape[0]
    if (
        hidden.device.type != "cpu"
        or rows > 256
        or type(weight) is not torch.nn.Parameter
        or weight.dtype != torch.float32
    ):
        return output_logits(model, hidden).t(), None
    key = ((tuple(weight.shape), weight.dtype), rows.bit_length(), step_threads.threads_for(rows, weight.shape[1]))
    way = _FASTEST_GREEDY.get(key)
    if way is None:
        ways: tuple[Callable, ...] = (_product_by_fastest_way,)
        if _onednn_bf16():
            ways += (_screened_in_bf16,)
        # the kernel reads 16 (AVX-512) or 8 (AVX2) aligned values at a time
        if weight.shape[1] % 16 == 0 and has_ops("aten._weight_int8pack_mm"):
            ways += (_screened_in_int8,)
        output_logits(model, hidden)  # the exact product measures its own ways first
        way = _FASTEST_GREEDY[key] = _fastest(ways, model, weight, hidden)
        for screened, copy in ((_screened_in_bf16, bf16_screen), (_screened_in_int8, int8_screen)):
            _keep_copy_where_chosen(_FASTEST_GREEDY, key, screened, _SCREENS[copy], weight)
    return way(model, weight, hidden)


class FastCpuProducts:
    """The seam `DecodingState` calls (`decoding_state_vaswani.ModelProducts` is the plain one): the output
    projection (`output_logits`), greedy's screened projection (`greedy_output_logits`), and the decoder's linears
    bound to their fastest way for the length of a search (`decoder_linears_for`), and the decoder's step without
    its module calls (`lean_step.decoder_step`); a step of few rows on one thread (`step_threads`)."""

    logits = staticmethod(step_threads.by_hidden_rows(output_logits))
    greedy_logits = staticmethod(step_threads.by_hidden_rows(greedy_output_logits))
    searching = staticmethod(step_threads.search_by_rows(decoder_linears_for))
    decoder_step = staticmethod(step_threads.by_token_rows(lean_step.decoder_step))
