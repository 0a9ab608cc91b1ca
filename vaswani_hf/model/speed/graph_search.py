# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Section 6.1's searches with static shapes, so that a GPU replays each search step as one CUDA graph, and keeps
the graph for the next call of the same shape.

On a GPU a decoding step's arithmetic takes microseconds, while its few hundred kernel launches and the Python
around them take milliseconds. This room runs the same searches as `search_vaswani.py`: greedy's argmax rule, and
beam search through the very same `BeamStep`. Every shape is fixed, so that the whole step (cache reordering,
decoder, output projection, log-softmax, the logits processors, top-k and the beam update) is captured once and
replayed:
- the self- and cross-attention caches are preallocated (`StaticBeamCacheLayer`, `StaticLayer`), and beam
  search's reordering copies rows in place inside the captured step;
- a sentence whose search is over stays in the batch with its results frozen (`Beams.keep_where`), where the
  eager search would drop it;
- the step number is a device tensor, and no step reads a device value on the host: the search asks whether
  every sentence is done only once every `DONE_CHECK_EVERY` steps.

A captured search and its buffers (`GraphedSearch`) are kept on the model (`DecodingGraphs`), keyed by shape: a
later call with the same rows, beams, source-length bucket, step bucket, dtype and step settings replays without
capturing. Source lengths and step limits are rounded up to buckets (`bucket`), so that a file's batches repeat
shapes; the padding is masked, and each sentence still ends at its own limit. At most `VASWANI_GRAPH_CACHE`
searches (default 4) are kept, least recently used dropped first, and all of them once the model's weights move.

Same tokens and scores as the eager searches (tests/test_graph_decoding.py). It is used where a CUDA model decodes
with the paper's settings and no translator feature that needs the eager search (`fits`). A caller's logits
processor runs inside the captured step where it declares `static_shapes` (a parser's tree constraint,
`parsing/constraint.py`): it then keeps its shapes, reads nothing on the host, and is handed a static view (every
row's whole token buffer, the positions not yet written holding the fill token; the fixed example of each row;
each row's tokens left as a device tensor). A kept search decodes a later call with the processors it was captured
with, each `refill`ed with the later call's values. The switch:
`generate(graph_decoding=False)` or `VASWANI_GRAPH_DECODING=0` keeps the eager search. `graph_decoding=True` on
a CPU model runs this search with `ReplayedStep` in place of a CUDA graph, which is how the tests cover it.
Part of the installed package, not of a checkpoint's remote code (`speed/__init__.py` plugs it into generate()).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
from transformers.cache_utils import Cache, StaticLayer

from ..decoding_state_vaswani import DecodingState, ModelProducts
from ..search_vaswani import (
    Beams,
    BeamStep,
    DecodingSettings,
    apply_processors,
    limit_reached,
    write_step,
)

# How often (in steps) the search reads on the host whether every sentence is done: one wait for the GPU per
# this many steps, and at most this many - 1 steps computed past the end.
DONE_CHECK_EVERY = 8
# How many captured searches a model keeps (`VASWANI_GRAPH_CACHE`; 0 keeps none: every call captures anew).
DEFAULT_KEPT = 4


def graph_decoding(asked: bool | None, device: torch.device) -> bool:
    """Whether a generate() call on `device` runs the static-shape search: `generate(graph_decoding=...)` when
    given, else the environment's `VASWANI_GRAPH_DECODING` (0/false/no/off, or 1/true/yes/on), else on for CUDA.

    Off on a CPU, by measurement: there no graph saves the launches, and the static shapes cost work the eager
    search does not do. A parser at beam 21 (input + 300 tokens at most) parsed 40 sentences about 20x slower in
    this search than in the eager one (28 s against 1.3 s, the same trees; 2 Sapphire Rapids cores, AMX): every
    step reorders caches of all 320 positions and computes the finished sentences' rows, where the eager search
    copies what was written and drops finished sentences."""
    if asked is not None:
        return bool(asked)
    setting = os.environ.get("VASWANI_GRAPH_DECODING", "").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    return setting in ("1", "true", "yes", "on") or device.type == "cuda"


def fits(settings: DecodingSettings, model) -> bool:
    """Whether this search can decode `settings` for `model`. A target prefix, constraints, bad words, per-step
    scores and the caller's logits processors, unless each declares `static_shapes` (`static_processors`), all need
    the eager search, as do attention kernels that take one encoder row per beam (flash, flex)."""
    return (
        settings.prefix is None
        and settings.constraints is None
        and settings.bad_words is None
        and static_processors(settings.user_processors)
        and not settings.per_step_outputs
        and model.config._attn_implementation in ("sdpa", "eager")
    )


def static_processors(processors) -> bool:
    """Whether every logits processor declares `static_shapes`: its `__call__` keeps every shape static for a
    static view of the rows and reads no device value on the host, and it has `static_key()` (the constants its
    step reads, part of `GraphKey`) and `refill(other)` (takes another call's processor's values into its own
    tensors, in place). A processor that declares nothing may read anything: the eager search runs it."""
    return all(getattr(processor, "static_shapes", False) for processor in processors)


def bucket(n: int) -> int:
    """`n` rounded up to a multiple of 16 (past 256, of a sixteenth of the power of two above it): at most 15 more,
    or 1/8 more for long inputs, so that batches of nearby lengths share one captured search."""
    multiple = max(16, 1 << max((n - 1).bit_length() - 4, 0))
    return -(-n // multiple) * multiple


class StaticBeamCacheLayer(StaticLayer):
    """A preallocated self-attention cache layer (Transformers' `StaticLayer`) whose beam-search reordering copies
    rows in place: the tensors keep their addresses, which a captured CUDA graph reads and writes."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized:
            self.keys.copy_(self.keys.index_select(0, beam_idx))
            self.values.copy_(self.values.index_select(0, beam_idx))


class StaticDecodingState(DecodingState):
    """The decoder state of a static-shape search, reused call after call: the encoder output padded to a bucket
    of source positions, both attention caches preallocated, and beam search's reordering waiting in `parents`
    until the next step. `load` takes a new call's encoder output into the same tensors."""

    def __init__(self, model, rows: int, source_length: int, rows_per_example: int, steps: int,
                 dtype: torch.dtype, device: torch.device):  # fmt: skip
        self.steps, self.source_length = steps, source_length
        hidden = torch.zeros(rows, source_length, model.config.d_model, dtype=dtype, device=device)
        mask = torch.zeros(rows, source_length, dtype=torch.long, device=device)
        mask[:, 0] = 1  # a padded mask, so that the encoder mask below is a tensor that `load` fills
        super().__init__(model, hidden, mask, rows_per_example, ModelProducts)
        beams = rows * rows_per_example
        self.parents = torch.arange(beams, device=device) if rows_per_example > 1 else None

    def _self_attention_cache(self) -> Cache:
        layers = self.model.config.decoder_layers
        return Cache(layers=[StaticBeamCacheLayer(max_cache_len=self.steps) for _ in range(layers)])

    def _cross_attention_cache(self) -> Cache:
        layers = self.model.config.decoder_layers
        return Cache(layers=[StaticLayer(max_cache_len=self.source_length) for _ in range(layers)])

    @property
    def layers(self) -> list[StaticLayer]:
        return [*self.cache.self_attention_cache.layers, *self.cache.cross_attention_cache.layers]

    def load(self, encoder_hidden: torch.Tensor, source_mask: torch.Tensor | None) -> None:
        """A new call's encoder output and padding mask, padded to this state's source positions; both caches
        start empty (the first step computes cross-attention's keys and values again)."""
        length = encoder_hidden.shape[1]
        self.encoder_hidden[:, :length].copy_(encoder_hidden)
        self.encoder_hidden[:, length:].zero_()
        self.source_mask.zero_()
        self.source_mask[:, :length] = 1 if source_mask is None else source_mask
        self.encoder_mask.copy_(self._encoder_mask())
        for layer in self.layers:
            layer.cumulative_length.zero_()
        self.cache.is_updated = dict.fromkeys(range(len(self.cache.cross_attention_cache.layers)), False)
        if self.parents is not None:
            self.parents.copy_(torch.arange(self.parents.shape[0], device=self.parents.device))

    def reorder(self, row_idx: torch.LongTensor) -> None:
        self.parents.copy_(row_idx)

    def keep(self, examples: torch.Tensor) -> None:
        raise RuntimeError("a static-shape search keeps every sentence in the batch until the call ends")

    def logits(self, tokens: torch.LongTensor) -> torch.Tensor:
        """Follow the surviving beams, one decoder step, the output projection: (vocabulary, rows) logits."""
        if self.parents is not None:
            for layer in self.cache.self_attention_cache.layers:
                layer.reorder_cache(self.parents)
        return self.products.logits(self.model, self._decoder_step(tokens))

    def buffers(self) -> list[torch.Tensor]:
        tensors = [self.encoder_hidden, self.encoder_mask] + ([self.parents] if self.parents is not None else [])
        for layer in self.layers:
            tensors += [layer.cumulative_length, *((layer.keys, layer.values) if layer.is_initialized else ())]
        return tensors


class ReplayedStep:
    """What a CUDA graph does, without capturing: `replay()` runs the captured step again. The CPU's stand-in for
    `torch.cuda.CUDAGraph`, so that the tests run the graphed search's every line. A graph reads and writes
    addresses, so a replay checks that every buffer of the search is still where it was at capture."""

    def __init__(self, step: Callable[[], None], buffers: Callable[[], list[torch.Tensor]]):
        self.step, self.buffers = step, buffers
        self.addresses = [t.data_ptr() for t in buffers()]

    def replay(self) -> None:
        if [t.data_ptr() for t in self.buffers()] != self.addresses:
            raise RuntimeError("a buffer of the captured search step moved: a CUDA graph would read stale memory")
        self.step()


class GraphedSearch:
    """One shape's search: its decoding state, its search buffers and its captured step, kept across calls.

    A call `begin`s (its encoder output and limits into the buffers), then runs steps: the first eagerly (it also
    computes cross-attention's keys and values), the second eagerly on a side stream the first time (CUDA's warm-up
    before a capture), then the step is captured once and replayed from then on, in this call and the next."""

    def __init__(self, settings: DecodingSettings, state: StaticDecodingState, capture: bool):
        device = state.encoder_hidden.device
        # the graph reads these tensors: they are this search's own, on its device
        suppress = settings.suppress.to(device) if settings.suppress is not None else None
        self.settings = replace(settings.on(device), suppress=suppress)
        self.settings.limits = self.settings.limits.clone()
        self.state, self.capture = state, capture
        self.step_index = torch.zeros((), dtype=torch.long, device=device)
        self.done = torch.zeros(state.encoder_hidden.shape[0], dtype=torch.bool, device=device)
        rows = state.encoder_hidden.shape[0] * state.rows_per_example
        self.tokens = torch.full((rows,), settings.start, dtype=torch.long, device=device)
        # what a processor that reads the rows is told: each row's example (fixed: finished sentences stay), and
        # the decoder's start symbol in front of the token buffer of the static view (`input_ids`)
        self.row_examples = torch.arange(state.encoder_hidden.shape[0], device=device).repeat_interleave(
            state.rows_per_example
        )
        self.start_column = torch.full((rows, 1), settings.start, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | ReplayedStep | None = None
        self.warmed = False
        self.captures = 0

    def begin(self, settings: DecodingSettings, encoder_hidden: torch.Tensor, mask: torch.Tensor | None) -> None:
        self.state.load(encoder_hidden, mask)
        self.settings.limits.copy_(settings.limits)
        for kept, given in zip(self.settings.user_processors, settings.user_processors, strict=True):
            if kept is not given:  # the step reads the processors it was captured with
                kept.refill(given)
        self.step_index.zero_()
        self.done.zero_()
        self.tokens.fill_(self.settings.start)

    def advance(self) -> None:
        """One search step, in place in the buffers: the function a CUDA graph captures."""
        raise NotImplementedError

    def result(self) -> dict:
        raise NotImplementedError

    def input_ids(self) -> torch.Tensor:
        """The static view of the decoder input so far, for the caller's processors: (rows, 1 + steps), the start
        symbol, then every position of each row's token buffer (the fill token where nothing is written yet)."""
        raise NotImplementedError

    def buffers(self) -> list[torch.Tensor]:
        return [*self.state.buffers(), self.step_index, self.done, self.tokens, self.settings.limits, self.settings.eos]

    def run(self, steps: int) -> dict:
        for step in range(steps):
            if step == 0:  # it also computes cross-attention's keys and values: never captured
                self.advance()
            elif self.graph is not None:
                self.graph.replay()
            elif not self.warmed:
                self.warm_up()
            else:
                self._capture()
            if (step + 1) % DONE_CHECK_EVERY == 0 and bool(self.done.all()):
                break
        return self.result()

    def warm_up(self) -> None:
        """A real step, on a side stream on CUDA, as CUDA asks before a capture."""
        self.warmed = True
        if not self.capture:
            return self.advance()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.advance()
        torch.cuda.current_stream().wait_stream(stream)

    def _capture(self) -> None:
        """Capture `advance` (nothing runs while a CUDA graph is captured), then replay it for this step."""
        self.captures += 1
        if self.capture:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.advance()
        else:
            self.graph = ReplayedStep(self.advance, self.buffers)
        self.graph.replay()


class GraphedGreedySearch(GraphedSearch):
    """`search_vaswani.greedy_search` with every row kept: a finished row's later tokens are not recorded."""

    def __init__(self, settings: DecodingSettings, state: StaticDecodingState, capture: bool):
        super().__init__(settings, state, capture)
        rows, device = self.tokens.shape[0], self.tokens.device
        self.generated = torch.full((rows, state.steps), settings.fill, dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)

    def begin(self, settings: DecodingSettings, encoder_hidden: torch.Tensor, mask: torch.Tensor | None) -> None:
        super().begin(settings, encoder_hidden, mask)
        self.generated.fill_(self.settings.fill)
        self.lengths.zero_()

    def advance(self) -> None:
        settings, step, done = self.settings, self.step_index, self.done
        scores = apply_processors(settings, self.state.logits(self.tokens).t(), step, settings.limits,
                                  self.input_ids, self.row_examples)  # fmt: skip
        tokens = scores.argmax(-1)
        write_step(self.generated, step, torch.where(done, settings.fill, tokens))
        ends = ~done & (torch.isin(tokens, settings.eos) | limit_reached(step, settings.limits))
        self.lengths.copy_(torch.where(ends, step + 1, self.lengths))
        done.logical_or_(ends)
        self.tokens.copy_(tokens)
        step.add_(1)

    def result(self) -> dict:
        return {"sequences": self.generated.clone(), "lengths": self.lengths.clone()}

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.start_column, self.generated], dim=1)

    def buffers(self) -> list[torch.Tensor]:
        return [*super().buffers(), self.generated, self.lengths]


class GraphedBeamSearch(GraphedSearch):
    """`search_vaswani.beam_search` with every sentence kept: a sentence whose search is over keeps the results
    it had then (`Beams.keep_where`), and its rows go on computing what nobody reads."""

    def __init__(self, settings: DecodingSettings, state: StaticDecodingState, capture: bool):
        super().__init__(settings, state, capture)
        self.beams = Beams.start(self.settings, self.done.shape[0], self.done.device, steps=state.steps)
        self.step_rule = BeamStep(self.settings)

    def begin(self, settings: DecodingSettings, encoder_hidden: torch.Tensor, mask: torch.Tensor | None) -> None:
        super().begin(settings, encoder_hidden, mask)
        self.beams.copy_(Beams.start(self.settings, self.done.shape[0], self.done.device, steps=self.state.steps))

    def advance(self) -> None:
        step, search = self.step_index, self.beams
        # the one beam step, with the static batching policy: sentences already done keep their results
        result = self.step_rule(step, self.state, self.tokens, search, self.input_ids, self.row_examples)
        search.copy_(result.beams.keep_where(self.done, search))
        self.done.logical_or_(result.done)
        self.state.reorder(result.parent_rows.flatten())
        self.tokens.copy_(search.running.index_select(2, step.view(1)).flatten())
        step.add_(1)

    def result(self) -> dict:
        n = self.settings.num_return_sequences
        return {
            "sequences": self.beams.finished[:, :n].flatten(0, 1).clone(),
            "scores": self.beams.finished_scores[:, :n].flatten().clone(),
            "lengths": self.beams.finished_lengths[:, :n].flatten().clone(),
        }

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.start_column, self.beams.running.flatten(0, 1)], dim=1)

    def buffers(self) -> list[torch.Tensor]:
        return [*super().buffers(), *(getattr(self.beams, f.name) for f in fields(self.beams))]


@dataclass(frozen=True)
class GraphKey:
    """What a captured search's shapes and step depend on: a call with an equal key replays its graph."""

    rows: int
    beams: int
    source_bucket: int
    step_bucket: int
    dtype: torch.dtype
    device: torch.device
    step_settings: tuple  # every setting the captured step reads as a constant

    @classmethod
    def of(cls, model, settings: DecodingSettings, encoder_hidden: torch.Tensor) -> GraphKey:
        # one more position than the longest source, so that the bucket always holds padding and the encoder mask
        # is a tensor (a source without padding gives none)
        source = bucket(encoder_hidden.shape[1] + 1)
        steps = bucket(settings.max_new_tokens)
        tensors = ("eos", "suppress", "limits", "bad_words", "user_processors", "prefix", "constraints")
        constant = tuple(
            (f.name, getattr(settings, f.name)) for f in fields(settings) if f.name not in tensors and f.name not in
            ("max_new_tokens", "return_dict", "output_scores", "output_logits", "sequence_scores")
        )  # fmt: skip
        # Transformers' "never" with its own penalty reads max_new_tokens as the step's constant
        exact = settings.max_new_tokens if settings.early_stopping == "never" and not settings.gnmt else None
        suppress = tuple(settings.suppress.tolist()) if settings.suppress is not None else None
        processors = tuple(processor.static_key() for processor in settings.user_processors)
        step_settings = (*constant, tuple(settings.eos.tolist()), suppress, exact, processors, model.training,
                         model.config._attn_implementation)  # fmt: skip
        return cls(encoder_hidden.shape[0], settings.num_beams, source, steps, encoder_hidden.dtype,
                   encoder_hidden.device, step_settings)  # fmt: skip


class DecodingGraphs:
    """The captured searches of one model, kept on it (so freed with it): at most `kept` of them, the least
    recently used dropped first, and all of them once a parameter or buffer of the model moves (a graph reads
    the addresses it was captured with). A search in use is taken out, so two threads never share one."""

    def __init__(self, kept: int):
        self.kept = kept
        self.searches: OrderedDict[GraphKey, GraphedSearch] = OrderedDict()
        self.weights: tuple = ()
        self.captures = 0  # every capture of every search it has held (the tests count them)

    def __reduce__(self):  # a copied or pickled model keeps no graphs (they hold the original's addresses)
        return DecodingGraphs, (self.kept,)

    @staticmethod
    def of(model) -> DecodingGraphs:
        graphs = model.__dict__.get("_decoding_graphs")
        if graphs is None:
            kept = int(os.environ.get("VASWANI_GRAPH_CACHE", DEFAULT_KEPT))
            graphs = model.__dict__["_decoding_graphs"] = DecodingGraphs(kept)
        return graphs

    def take(self, key: GraphKey, model) -> GraphedSearch | None:
        weights = tuple(t.data_ptr() for t in (*model.parameters(), *model.buffers()))
        if weights != self.weights:
            self.searches.clear()
            self.weights = weights
        return self.searches.pop(key, None)

    def give_back(self, key: GraphKey, search: GraphedSearch) -> None:
        self.captures += search.captures
        search.captures = 0
        if self.kept <= 0:
            return
        self.searches[key] = search
        while len(self.searches) > self.kept:
            self.searches.popitem(last=False)

    def clear(self) -> None:
        self.searches.clear()


def graphed_search(model, settings: DecodingSettings, encoder_hidden: torch.Tensor, mask: torch.Tensor | None) -> dict:
    """Decode with the captured search of this call's shape, captured now if the model keeps none (`fits` said
    this search can run `settings`): a CUDA graph on CUDA, else `ReplayedStep`."""
    graphs = DecodingGraphs.of(model)
    key = GraphKey.of(model, settings, encoder_hidden)
    # a graph cannot grow the sinusoid table: grow it first (a new table moves a buffer, and `take` then drops the
    # graphs that read the old one)
    model.get_decoder().embed_positions.cover(key.step_bucket)
    search = graphs.take(key, model)
    if search is None:
        state = StaticDecodingState(model, key.rows, key.source_bucket, settings.num_beams, key.step_bucket,
                                    encoder_hidden.dtype, encoder_hidden.device)  # fmt: skip
        kind = GraphedBeamSearch if settings.num_beams > 1 else GraphedGreedySearch
        search = kind(settings, state, capture=encoder_hidden.device.type == "cuda")
    search.begin(settings, encoder_hidden, mask)
    result = search.run(settings.max_new_tokens)
    graphs.give_back(key, search)
    return result
