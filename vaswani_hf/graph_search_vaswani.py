# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Section 6.1's searches with static shapes, so that a GPU replays each decoder step as one CUDA graph.

On a GPU a decoding step's arithmetic takes microseconds, while its ~150 kernel launches and the Python around them
take milliseconds. This room runs the same searches as `search_vaswani.py`: greedy's argmax rule, and beam search
through the very same `advance_beams`. It keeps every shape fixed for the whole call, so one decoder step can be
captured once and replayed:
- the self-attention cache is preallocated (`StaticBeamCacheLayer`), and beam search's reordering copies rows in
  place inside the captured step;
- a sentence whose search is over stays in the batch with its results frozen (`Beams.keep_where`), where the
  eager search would drop it;
- no step reads a device value on the host: the search asks whether every sentence is done only once every
  `DONE_CHECK_EVERY` steps.

Same tokens and scores as the eager searches (tests/test_graph_decoding.py). It is used where a CUDA model decodes
with the paper's settings and no translator feature that needs the eager search (`fits`). The switch:
`generate(graph_decoding=False)` or `VASWANI_GRAPH_DECODING=0` keeps the eager search. `graph_decoding=True` on
a CPU model runs this search without a graph, which is how the tests cover its logic.
Shipped as Hub remote code: imports only torch, transformers and the files beside it.
"""

from __future__ import annotations

import os

import torch
from transformers.cache_utils import Cache, StaticLayer

from .decoding_state_vaswani import DecodingState, ModelProducts
from .search_vaswani import Beams, DecodingSettings, advance_beams, apply_processors, log_softmax_in_place

# How often (in steps) the search reads on the host whether every sentence is done: one wait for the GPU per
# this many steps, and at most this many - 1 steps computed past the end.
DONE_CHECK_EVERY = 8


def graph_decoding(asked: bool | None, device: torch.device) -> bool:
    """Whether a generate() call on `device` runs the static-shape search: `generate(graph_decoding=...)` when
    given, else the environment's `VASWANI_GRAPH_DECODING` (0/false/no/off, or 1/true/yes/on), else on for CUDA."""
    if asked is not None:
        return bool(asked)
    setting = os.environ.get("VASWANI_GRAPH_DECODING", "").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    return setting in ("1", "true", "yes", "on") or device.type == "cuda"


def fits(settings: DecodingSettings, model) -> bool:
    """Whether this search can decode `settings` for `model`. A target prefix, constraints, bad words, the caller's
    logits processors and per-step scores all need the eager search, as do attention kernels that take one encoder
    row per beam (flash, flex)."""
    return (
        settings.prefix is None
        and settings.constraints is None
        and settings.bad_words is None
        and not settings.user_processors
        and not settings.per_step_outputs
        and model.config._attn_implementation in ("sdpa", "eager")
    )


class StaticBeamCacheLayer(StaticLayer):
    """A preallocated self-attention cache layer (Transformers' `StaticLayer`) whose beam-search reordering copies
    rows in place: the tensors keep their addresses, which a captured CUDA graph reads and writes."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized:
            self.keys.copy_(self.keys.index_select(0, beam_idx))
            self.values.copy_(self.values.index_select(0, beam_idx))


class StaticDecodingState(DecodingState):
    """The decoder state of a static-shape search: every row stays for the whole call, the self-attention cache
    holds `steps` positions, and beam search's reordering waits in `parents` until the next step.

    On CUDA the second step is captured as a CUDA graph (`torch.cuda.CUDAGraph`) and later steps replay it: the
    graph reads `tokens` and `parents`, reorders the cache, runs the decoder and the output projection, and writes
    `output`. The first step runs eagerly because it also computes cross-attention's keys and values, which later
    steps read from the cache."""

    def __init__(self, model, encoder_hidden: torch.Tensor, source_mask: torch.Tensor | None, rows_per_example: int,
                 steps: int, capture: bool | None = None):  # fmt: skip
        self.steps = steps
        super().__init__(model, encoder_hidden, source_mask, rows_per_example, ModelProducts)
        self.capture = encoder_hidden.device.type == "cuda" if capture is None else capture
        self.parents: torch.LongTensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.steps_run = 0

    def _self_attention_cache(self) -> Cache:
        layers = self.model.config.decoder_layers
        return Cache(layers=[StaticBeamCacheLayer(max_cache_len=self.steps) for _ in range(layers)])

    @property
    def layers(self) -> list[StaticBeamCacheLayer]:
        return self.cache.self_attention_cache.layers

    def reorder(self, row_idx: torch.LongTensor) -> None:
        if self.parents is None:
            self.parents = row_idx.clone()
        else:
            self.parents.copy_(row_idx)

    def keep(self, examples: torch.Tensor) -> None:
        raise RuntimeError("a static-shape search keeps every sentence in the batch until the call ends")

    def step(self, tokens: torch.LongTensor) -> torch.Tensor:
        """The step a graph captures: follow the surviving beams, one decoder step, the output projection."""
        if self.parents is not None:
            for layer in self.layers:
                layer.reorder_cache(self.parents)
        return self.products.logits(self.model, self._decoder_step(tokens))

    def logits(self, tokens: torch.LongTensor) -> torch.Tensor:
        """(rows,) ids -> (vocabulary, rows) float32 logits; from a graph's replay after the first step on CUDA."""
        self.steps_run += 1
        if self.graph is not None:
            self.tokens.copy_(tokens)
            self.graph.replay()
            return self.output
        if self.capture and self.steps_run == 2:
            return self._capture(tokens)
        return self.step(tokens)

    def _capture(self, tokens: torch.LongTensor) -> torch.Tensor:
        """Capture `step` as a CUDA graph and replay it once for this step.

        CUDA asks for one eager run on a side stream before a capture; that run must leave the state as it found
        it, so it reorders by the identity and its cache position is wound back (the row it writes is overwritten
        by the replay)."""
        self.tokens = tokens.clone()
        lengths = [layer.cumulative_length.clone() for layer in self.layers]
        parents = self.parents.clone() if self.parents is not None else None
        if parents is not None:
            self.parents.copy_(torch.arange(parents.shape[0], device=parents.device))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.step(self.tokens)
        torch.cuda.current_stream().wait_stream(stream)
        for layer, length in zip(self.layers, lengths, strict=True):
            layer.cumulative_length.copy_(length)
        if parents is not None:
            self.parents.copy_(parents)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = self.step(self.tokens)
        self.graph.replay()
        return self.output


def all_done(step: int, done: torch.BoolTensor) -> bool:
    """Every `DONE_CHECK_EVERY` steps, whether every sentence's search is over (the one wait for the device)."""
    return (step + 1) % DONE_CHECK_EVERY == 0 and bool(done.all())


def static_greedy_search(settings: DecodingSettings, state: StaticDecodingState) -> dict:
    """`search_vaswani.greedy_search` with every row kept: a finished row's later tokens are not recorded."""
    rows = state.encoder_hidden.shape[0]
    device = state.encoder_hidden.device
    settings = settings.on(device)
    generated = torch.full((rows, settings.max_new_tokens), settings.fill, dtype=torch.long, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    tokens = torch.full((rows,), settings.start, dtype=torch.long, device=device)
    for step in range(settings.max_new_tokens):
        scores = apply_processors(settings, state.logits(tokens).t(), step, settings.limits, None, None,
                                  sync_free=True)  # fmt: skip
        tokens = scores.argmax(-1)
        generated[:, step] = torch.where(done, settings.fill, tokens)
        ends = ~done & (torch.isin(tokens, settings.eos) | (step + 1 >= settings.limits))
        lengths = torch.where(ends, step + 1, lengths)
        done = done | ends
        if all_done(step, done):
            break
    return {"sequences": generated, "lengths": lengths}


def static_beam_search(settings: DecodingSettings, state: StaticDecodingState) -> dict:
    """`search_vaswani.beam_search` with every sentence kept: a sentence whose search is over keeps the results
    it had then (`Beams.keep_where`), and its rows go on computing what nobody reads."""
    device = state.encoder_hidden.device
    settings = settings.on(device)
    batch, k = state.encoder_hidden.shape[0], settings.num_beams
    search = Beams.start(settings, batch, device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    row_limits = settings.limits.repeat_interleave(k)
    tokens = torch.full((batch * k,), settings.start, dtype=torch.long, device=device)
    for step in range(settings.max_new_tokens):
        log_probs = log_softmax_in_place(state.logits(tokens))
        log_probs = apply_processors(settings, log_probs, step, row_limits, None, None, sync_free=True)
        advanced = advance_beams(settings, step, log_probs, search)
        search = advanced.beams.keep_where(done, search)
        done = done | advanced.done
        state.reorder(advanced.parent_rows.flatten())
        tokens = search.running[:, :, step].flatten()
        if all_done(step, done):
            break
    n = settings.num_return_sequences
    return {
        "sequences": search.finished[:, :n].flatten(0, 1),
        "scores": search.finished_scores[:, :n].flatten(),
        "lengths": search.finished_lengths[:, :n].flatten(),
    }
