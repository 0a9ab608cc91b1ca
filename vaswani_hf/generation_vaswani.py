# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Section 6.1 of the paper, decoding: beam search (beam 4, GNMT length penalty alpha = 0.6, output length at most
source length + 50, early stopping) and greedy decoding, written for this model.

`VaswaniGenerationMixin.generate()` runs plain greedy and beam search here and hands every other mode (sampling,
constraints, streamers, assistants, attention/hidden-state outputs, static caches and torch.compile, custom
stopping criteria, greedy scores, ...) to Transformers' `GenerationMixin.generate()` unchanged. Nothing private of
`GenerationMixin` is overridden, so the model works with any Transformers release that has the public API used here.
Beam search returns what Transformers' returns: `sequences_scores`, and with `return_dict_in_generate` the
`beam_indices` and (`output_scores` / `output_logits`) the per-step scores that `compute_transition_scores` reads.
tests/test_generation_contract.py holds every mode and option to Marian's `generate()` on the same weights.

The beam search is Transformers' algorithm (the same candidates, finished-hypothesis rules and scores, so
`length_penalty_type="hf"` and `max_length_offset=None` give exactly Transformers' sequences and scores) with the
paper's options and less work per step:
- one encoder output row per source: the k beams of a source attend to it together (multi-query cross-attention,
  see `VaswaniMultiHeadAttention`), and its keys/values are projected and cached once per source;
- the log-softmax is computed in place and the top candidates are found in two stages (the best chunks of each
  row, then the best tokens inside them) instead of a sort-like pass over every (beam x vocabulary) score;
- the self-attention cache follows the surviving beams and appends the new token in one copy
  (`VaswaniBeamSearchCacheLayer`);
- a sentence whose search is over leaves the batch at once, so long sentences do not keep short ones computing;
- the first step runs one row per sentence (its beams are still identical);
- the decoder's linear layers multiply the way measured fastest on the machine for the search's number of rows:
  their own `F.linear`, `weight @ hidden^T`, or a weight packed by oneDNN or MKL, timed on the first searches'
  own steps (`decoder_linears_for`, `_StepTrial`);
- greedy search reads a bf16 or int8 copy of the output weight where that measures faster, and recomputes in float32
  the few tokens a proven error bound cannot rule out, so its tokens stay the float32 argmax (`screened_logits`);
- with a vocabulary shortlist the scores have one column per allowed token and the search runs on those columns.

This file is shipped as Hub remote code beside the modeling file: it imports only torch and transformers.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import statistics
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import torch
from torch.utils.weak import WeakIdKeyDictionary
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation import (
    GenerateBeamEncoderDecoderOutput,
    GenerateEncoderDecoderOutput,
    GenerationConfig,
    GenerationMixin,
    GenerationMode,
    LogitsProcessor,
    LogitsProcessorList,
    NoBadWordsLogitsProcessor,
)
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import logging

logger = logging.get_logger(__name__)
T = TypeVar("T")

# The paper's decoding (section 6.1), written into every new model's generation config.
PAPER_GENERATION_DEFAULTS = {
    "num_beams": 4,
    "length_penalty": 0.6,
    "length_penalty_type": "gnmt",
    "max_length_offset": 50,
    "early_stopping": True,
}
LENGTH_PENALTY_TYPES = ("gnmt", "hf")

# Transformers' values for generation settings that neither the call nor the model sets.
GENERATION_DEFAULTS = {
    "max_length": 20, "min_length": 0, "do_sample": False, "use_cache": True, "early_stopping": False, "num_beams": 1,
    "length_penalty": 1.0, "num_return_sequences": 1, "output_scores": False, "return_dict_in_generate": False,
}  # fmt: skip
# generate() arguments that only Transformers' loop implements: their presence hands the call over.
HANDED_OVER_ARGUMENTS = (
    "stopping_criteria", "prefix_allowed_tokens_fn", "assistant_model", "streamer", "negative_prompt_ids",
    "negative_prompt_attention_mask", "custom_generate", "decoder_input_ids", "decoder_inputs_embeds",
    "past_key_values", "cache", "inputs_embeds", "tokenizer", "assistant_tokenizer",
)  # fmt: skip
# Generation-config settings (value that means "off") that only Transformers' loop implements.
HANDED_OVER_SETTINGS = {
    "output_attentions": False, "output_hidden_states": False, "cache_implementation": None,
    "compile_config": None, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "sequence_bias": None, "guidance_scale": None,
    "remove_invalid_values": False, "exponential_decay_length_penalty": None, "begin_suppress_tokens": None,
    "stop_strings": None, "max_time": None, "watermarking_config": None, "low_memory": None, "diversity_penalty": 0.0,
}  # fmt: skip


def fold_beams(
    queries: torch.Tensor, encoder_output: torch.Tensor | None, attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cross-attention's queries and padding mask, with the beams of a source side by side.

    Beam search keeps one encoder output per source (`DecodingState`), so `queries` has k rows per encoder row:
    the k beams of a source attend to the same keys as one batch row. (batch * k, q, d) is (batch, k * q, d) in
    memory, and a padding mask is the same for every query.
    """
    if encoder_output is None or encoder_output.shape[0] == queries.shape[0]:
        return queries, attention_mask
    if queries.shape[0] % encoder_output.shape[0]:
        raise ValueError(
            f"The decoder has {queries.shape[0]} rows but the encoder output has {encoder_output.shape[0]}:"
            " give one encoder output per decoder row, or the same number of decoder rows for every source "
            "(beam search's layout, rows of one source next to each other)."
        )
    rows_per_source = queries.shape[0] // encoder_output.shape[0]
    queries = queries.reshape(-1, rows_per_source * queries.shape[1], queries.shape[-1])
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :1]
    return queries, attention_mask


def unfold_beams(attention_weights: torch.Tensor | None, query_shape: torch.Size) -> torch.Tensor | None:
    """Attention weights computed on `fold_beams`' layout, back to one row per beam: (batch * k, h, q, keys)."""
    if attention_weights is None or attention_weights.shape[0] == query_shape[0]:
        return attention_weights
    batch, heads, _, keys = attention_weights.shape
    attention_weights = attention_weights.view(batch, heads, -1, *query_shape[1:], keys).transpose(1, 2)
    return attention_weights.reshape(*query_shape[:1], heads, *query_shape[1:], keys)


def gnmt_length_penalty(length: int | float | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """GNMT's length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016), used by the paper (section 6.1)."""
    return ((5 + length) / 6) ** alpha


class SourceLengthLimitLogitsProcessor(LogitsProcessor):
    """Section 6.1: "maximum output length = input length + 50", per example, for Transformers' own loop.

    Forces EOS on every row (batch x beams) whose output reached its own source length + offset, so a batch of
    short and long sources decodes each sentence as it would decode alone. (The decoder in this file does the same
    itself.)
    """

    def __init__(self, max_output_lengths: torch.LongTensor, eos_token_id: int):
        self.max_output_lengths = max_output_lengths
        self.eos_token_id = eos_token_id
        self.prompt_length: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
            rows_per_example = input_ids.shape[0] // self.max_output_lengths.shape[0]
            self.max_output_lengths = self.max_output_lengths.to(input_ids.device).repeat_interleave(rows_per_example)
        # the token chosen now is output token number (generated so far + 1)
        at_limit = input_ids.shape[1] - self.prompt_length + 1 >= self.max_output_lengths
        if not at_limit.any():
            return scores
        eos_only = torch.full_like(scores[:1], -math.inf)
        eos_only[:, self.eos_token_id] = 0
        return torch.where(at_limit[:, None], eos_only, scores)


class VaswaniBeamSearchCacheLayer(DynamicLayer):
    """A decoder self-attention cache layer that follows the surviving beams and appends the new token in one copy.

    Transformers' `DynamicLayer` copies the whole cache twice per beam-search step: `torch.cat` to append, then
    `index_select` to follow the surviving beams. Here `reorder_cache` only records the row indices; the next
    `update` selects and appends into one new tensor. `keys` and `values` apply a pending reordering when read, so
    the layer behaves like a `DynamicLayer` to everyone else.
    """

    def __init__(self, **kwargs):
        self._row_idx: torch.LongTensor | None = None
        super().__init__(**kwargs)

    @property
    def keys(self) -> torch.Tensor | None:
        self._apply_pending_reorder()
        return self._keys

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._keys = tensor

    @property
    def values(self) -> torch.Tensor | None:
        self._apply_pending_reorder()
        return self._values

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._values = tensor

    def _apply_pending_reorder(self) -> None:
        if self._row_idx is not None:
            row_idx, self._row_idx = self._row_idx, None
            self._keys = self._keys.index_select(0, row_idx)
            self._values = self._values.index_select(0, row_idx)

    def get_seq_length(self) -> int:
        if not self.is_initialized or self._keys.numel() == 0:
            return 0
        return self._keys.shape[-2]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            beam_idx = beam_idx.to(self._keys.device)
            # two reorderings in a row compose: row i takes old row pending[beam_idx[i]]
            self._row_idx = beam_idx if self._row_idx is None else self._row_idx.index_select(0, beam_idx)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self._row_idx is None or self.get_seq_length() == 0:
            return super().update(key_states, value_states, *args, **kwargs)
        row_idx, self._row_idx = self._row_idx, None
        self._keys = self._select_and_append(self._keys, row_idx, key_states)
        self._values = self._select_and_append(self._values, row_idx, value_states)
        return self._keys, self._values

    @staticmethod
    def _select_and_append(cache: torch.Tensor, row_idx: torch.LongTensor, new: torch.Tensor) -> torch.Tensor:
        length = cache.shape[-2]
        merged = cache.new_empty((row_idx.shape[0], *cache.shape[1:-2], length + new.shape[-2], cache.shape[-1]))
        torch.index_select(cache, 0, row_idx, out=merged[..., :length, :])
        merged[..., length:, :] = new
        return merged


def top_k_per_row(scores: torch.Tensor, k: int, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(scores, k)` over the last dimension of (rows, vocabulary) scores, in two cheap passes: the best k
    chunks of each row by their maximum, then the best k entries inside those chunks (the k best entries of a row
    always lie in its k best chunks). ~5x faster than `torch.topk` on CPU for 64 x 37,000 scores.

    Works in either layout `output_logits` writes (`scores` or `scores.t()` contiguous) without copying it.
    """
    vocab = scores.shape[-1]
    full = vocab - vocab % chunk
    if scores.is_contiguous():
        x, d = scores, 1  # the vocabulary dimension of x
    elif scores.t().is_contiguous():
        x, d = scores.t(), 0
    else:
        return scores.topk(k, dim=-1)
    if full // chunk < k:
        return scores.topk(k, dim=-1)
    chunk_max = x.narrow(d, 0, full).unflatten(d, (-1, chunk)).amax(d + 1)
    if full < vocab:  # the ragged tail is one more chunk
        chunk_max = torch.cat([chunk_max, x.narrow(d, full, vocab - full).amax(d, keepdim=True)], dim=d)
    best_chunks = chunk_max.topk(k, dim=d).indices
    offsets = torch.arange(chunk, device=scores.device).view([chunk if i == d + 1 else 1 for i in range(3)])
    index = (best_chunks.unsqueeze(d + 1) * chunk + offsets).flatten(d, d + 1)
    outside = index >= vocab
    candidates = x.gather(d, index.clamp(max=vocab - 1)).masked_fill_(outside, -math.inf)
    values, position = candidates.topk(k, dim=d)
    index = index.gather(d, position)
    return (values, index) if d == 1 else (values.t(), index.t())


@dataclass
class Source:
    """The source side of a generate() call."""

    input_ids: torch.LongTensor | None
    attention_mask: torch.Tensor | None
    encoder_outputs: BaseModelOutput | tuple | None
    lengths: torch.LongTensor  # on the CPU


@dataclass
class DecodingSettings:
    """One generate() call's decoding settings, resolved from the generation config and the call's arguments."""

    num_beams: int
    num_return_sequences: int
    max_new_tokens: int  # the most tokens any row generates (EOS included)
    limits: torch.LongTensor  # per example: the most tokens it generates (source + offset, or max_new_tokens)
    min_new_tokens: int  # EOS is impossible before this many tokens
    eos: torch.LongTensor
    forced_eos: int | None  # forced at the max_length limit (Transformers' forced_eos_token_id)
    limit_eos: int | None  # forced at a per-example limit (the paper's source + offset)
    forced_bos: int | None
    start: int
    fill: int
    length_penalty: float
    gnmt: bool
    early_stopping: bool | str
    suppress: torch.LongTensor | None
    bad_words: NoBadWordsLogitsProcessor | None
    user_processors: LogitsProcessorList
    renormalize: bool  # log-softmax again after the processors (Opus-MT's generation configs ask for it)
    return_dict: bool
    output_scores: bool
    output_logits: bool
    prefix: torch.LongTensor | None = None  # (examples, P) target prefix tokens, -1 after an example's own prefix
    constraints: list[PhraseConstraints] | None = None  # one per example (`constrained_beam_search`)
    sequence_scores: bool = False  # beam search's `sequences_scores` without the per-step scores

    @property
    def candidates(self) -> int:
        """How many continuations beam search takes from each row (Transformers': enough that `num_beams` of
        them do not end, whatever the EOS tokens)."""
        return max(2, 1 + self.eos.numel()) * self.num_beams if self.num_beams > 1 else 1

    @property
    def per_step_outputs(self) -> bool:
        """Whether the result returns every step's (rows x vocabulary) scores or logits (and `beam_indices`)."""
        return self.return_dict and (self.output_scores or self.output_logits)

    def searches_within(self, allowed: int) -> bool:
        """Whether the search can score one column per token of an `allowed`-token shortlist: not when a logits
        processor reads the whole vocabulary's ids (bad words, the caller's), per-step scores over the vocabulary
        are returned, or the shortlist is narrower than the candidates a row gives."""
        return (self.bad_words is None and not self.user_processors and not self.per_step_outputs
                and allowed >= self.candidates)  # fmt: skip

    def vocabulary_with(self, shortlist: torch.LongTensor) -> torch.LongTensor:
        """A vocabulary shortlist plus every token these settings may force: EOS, start, fill, forced BOS/EOS,
        prefix and constraint tokens (a shortlist never makes a forced token impossible)."""
        forced = [*self.eos.tolist(), self.start, self.fill, self.forced_bos, self.forced_eos, self.limit_eos]
        if self.prefix is not None:
            forced += self.prefix[self.prefix >= 0].tolist()
        for constraints in self.constraints or []:
            forced += [token for phrase in constraints.phrases for token in phrase]
        extra = torch.tensor([t for t in forced if t is not None and t >= 0], dtype=torch.long)
        return torch.unique(torch.cat([shortlist.flatten().cpu(), extra]))

    def within(self, vocabulary: torch.LongTensor) -> DecodingSettings:
        """These settings for a search whose score columns are the sorted `vocabulary` (a shortlist from
        `vocabulary_with`, so it holds every token named here): each token id becomes its column."""

        def column(token: int | None) -> int | None:
            return token if token is None or token < 0 else int(torch.searchsorted(vocabulary, token))

        prefix, suppress = self.prefix, self.suppress
        if prefix is not None:
            prefix = torch.where(prefix >= 0, torch.searchsorted(vocabulary, prefix.clamp(min=0)), prefix)
        if suppress is not None:  # a suppressed token outside the shortlist is impossible anyway
            suppress = torch.searchsorted(vocabulary, suppress[torch.isin(suppress, vocabulary)])
            suppress = suppress if suppress.numel() else None
        return replace(self, eos=torch.searchsorted(vocabulary, self.eos), forced_eos=column(self.forced_eos),
                       limit_eos=column(self.limit_eos), forced_bos=column(self.forced_bos), start=column(self.start),
                       fill=column(self.fill), prefix=prefix, suppress=suppress)  # fmt: skip

    def penalty(self, length: int | torch.Tensor) -> float | torch.Tensor:
        if self.gnmt:
            return gnmt_length_penalty(length, self.length_penalty)
        return length**self.length_penalty


class DecodingState:
    """What the decoder keeps for the sentences still being decoded: encoder output, caches and per-row tensors.

    A finished sentence leaves the batch (`keep`): every tensor here and both caches drop its rows.
    """

    def __init__(self, model, encoder_hidden: torch.Tensor, source_mask: torch.Tensor | None, rows_per_example: int):
        self.model = model
        self.rows_per_example = rows_per_example
        self.fold = model.config._attn_implementation in ("sdpa", "eager")
        if not self.fold:  # flash/flex attention take one encoder row per decoder row
            encoder_hidden = encoder_hidden.repeat_interleave(rows_per_example, dim=0)
            source_mask = source_mask.repeat_interleave(rows_per_example, 0) if source_mask is not None else None
        self.encoder_hidden = encoder_hidden
        self.source_mask = source_mask
        self.encoder_mask = self._encoder_mask()
        self_cache = DynamicCache(config=model.config)
        if rows_per_example > 1:
            self_cache.layers[:] = [VaswaniBeamSearchCacheLayer() for _ in self_cache.layers]
        self.cache = EncoderDecoderCache(self_cache, DynamicCache(config=model.config))
        self.example_ids = torch.arange(encoder_hidden.shape[0] // (1 if self.fold else rows_per_example))
        self.shortlist: torch.LongTensor | None = None
        self.within = False

    def restrict(self, allowed: torch.LongTensor, within: bool = False) -> None:
        """Score only the `allowed` target ids (sorted; a vocabulary shortlist): the output projection multiplies
        their rows alone. `within`: the scores have one column per allowed id and the search's tokens are
        columns (`DecodingSettings.within`), so log-softmax and top-k run over the shortlist alone; otherwise the
        scores cover the vocabulary, every other token at -inf (for settings that read token ids)."""
        self.shortlist = allowed.to(self.encoder_hidden.device)
        self.within = within
        self.rows = shortlist_rows(self.model.get_output_embeddings(), self.shortlist)
        bias = getattr(self.model, "final_logits_bias", None)
        self.rows_bias = bias.reshape(-1).index_select(0, self.shortlist)[:, None] if bias is not None else None

    def _encoder_mask(self) -> torch.Tensor | None:
        # built once (and again when sentences leave), not at every step
        if self.source_mask is None or bool(self.source_mask.all()):
            return None
        return create_bidirectional_mask(
            config=self.model.config,
            inputs_embeds=self.encoder_hidden[:, :1],
            attention_mask=self.source_mask,
            encoder_hidden_states=self.encoder_hidden,
        )

    def _decoder_step(self, tokens: torch.LongTensor) -> torch.Tensor:
        """One decoder step for the newest token of every row: (rows,) ids -> (rows, d_model) final hidden states."""
        if self.within:
            tokens = self.shortlist[tokens]
        decoder_output = self.model.get_decoder()(
            input_ids=tokens[:, None],
            encoder_hidden_states=self.encoder_hidden,
            encoder_attention_mask=self.encoder_mask,
            cache=self.cache,
            use_cache=True,
        )
        return decoder_output.last_hidden_state[:, -1]

    def greedy_logits(self, tokens: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decoder step for greedy decoding: (rows, vocabulary) scores whose argmax is each row's next token,
        and the floors that tell where that argmax is exact (None: everywhere). Over the whole vocabulary the
        output weight may be read from a bf16 or int8 copy (`greedy_output_logits`); `exact_logits()` then gives
        this step's exact logits."""
        if self.shortlist is not None:
            return self.logits(tokens).t(), None
        self.hidden = self._decoder_step(tokens)
        return greedy_output_logits(self.model, self.hidden)

    def exact_logits(self) -> torch.Tensor:
        """The exact (rows, vocabulary) logits of the step `greedy_logits` last ran."""
        return output_logits(self.model, self.hidden).t()

    def logits(self, tokens: torch.LongTensor) -> torch.Tensor:
        """One decoder step for the newest token of every row: (rows,) ids -> (vocabulary, rows) float32 logits."""
        hidden = self._decoder_step(tokens)
        if self.shortlist is None:
            return output_logits(self.model, hidden)
        scores = self.rows(hidden)
        if self.rows_bias is not None:
            scores += self.rows_bias
        if self.within:
            return scores.float()
        vocabulary = self.model.get_output_embeddings().out_features
        full = scores.new_full((vocabulary, hidden.shape[0]), -math.inf, dtype=torch.float32)
        return full.index_copy_(0, self.shortlist, scores.float())

    def searching(self) -> contextlib.AbstractContextManager:
        """What holds while a search steps this state: the decoder's linears packed for its rows, on CPU."""
        if self.encoder_hidden.device.type != "cpu":
            return contextlib.nullcontext()
        rows = self.encoder_hidden.shape[0] * (self.rows_per_example if self.fold else 1)
        return decoder_linears_for(self.model, rows)

    def reorder(self, row_idx: torch.LongTensor) -> None:
        self.cache.self_attention_cache.reorder_cache(row_idx)

    def keep(self, examples: torch.Tensor) -> None:
        """Only the sentences in `examples` (indices into the current batch) go on."""
        rows = self.rows_per_example
        row_idx = (examples[:, None] * rows + torch.arange(rows, device=examples.device)).flatten()
        source_idx = examples if self.fold else row_idx
        self.cache.self_attention_cache.reorder_cache(row_idx)
        if self.cache.get_seq_length() > 0:
            self.cache.cross_attention_cache.reorder_cache(source_idx)
        self.encoder_hidden = self.encoder_hidden.index_select(0, source_idx)
        if self.source_mask is not None:
            self.source_mask = self.source_mask.index_select(0, source_idx)
            self.encoder_mask = self._encoder_mask()
        self.example_ids = self.example_ids[examples.cpu()]


# an int8 output projection's (weight, bias), the weight as int8 rows (a serving model's weights do not change),
# for `shortlist_rows`
_UNPACKED_INT8: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shortlist_rows(output: torch.nn.Module, allowed: torch.LongTensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The output projection restricted to the `allowed` rows: (rows, d_model) hidden -> (allowed, rows) logits.

    An int8 model's projection (torch's dynamic quantization) keeps its int8 rows and scale, so the shortlist's
    logits equal the int8 model's own for those tokens."""
    weight = getattr(output, "weight", None)
    if type(weight) is torch.nn.Parameter:
        rows = weight.index_select(0, allowed)
        bias = getattr(output, "bias", None)
        if bias is None:
            return lambda hidden: rows @ hidden.t()
        bias = bias.index_select(0, allowed)[:, None]
        return lambda hidden: torch.addmm(bias, rows, hidden.t())
    quantized = torch.ao.nn.quantized.dynamic.Linear
    if type(output) is quantized:
        unpacked = _UNPACKED_INT8.get(output)
        if unpacked is None:  # unpacking 37,000 x 512 int8 weights took 65-136 ms: once per model, not per call
            # (`output.bias()` unpacks the weight too: the pair comes from one unpacking)
            unpacked = _UNPACKED_INT8[output] = output._packed_params._weight_bias()
        weight, bias = unpacked
        selected = quantized(weight.shape[1], 1, dtype=weight.dtype)  # packs a 1-row placeholder, not 3 ms of zeros
        selected.out_features = allowed.numel()
        selected.set_weight_bias(weight.index_select(0, allowed), None if bias is None else bias[allowed])
        return lambda hidden: selected(hidden).t()
    raise ValueError(
        f"vocabulary_shortlist selects rows of the output projection, and {type(output).__name__} has "
        "none to select: use an nn.Linear output layer (fp32, bf16) or torch's int8 quantization."
    )


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


def _inference_only(
    module: torch.nn.Linear, forward: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """`forward` where no gradient is recorded (the packed products have no backward), the layer's own elsewhere:
    a training step inside a search's lifetime still trains the weights."""

    def guarded(hidden: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return torch.nn.functional.linear(hidden, module.weight, module.bias)
        return forward(hidden)

    return guarded


def _step_linears(model) -> list[torch.nn.Linear]:
    """The decoder's float32 CPU linear layers that every decoding step multiplies (not the cross-attention's
    keys/values: those are projected once per sentence, over its source tokens). Empty where a layer computes
    anything but `F.linear` (int8, adapters)."""
    linears = [
        module
        for name, module in model.get_decoder().named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] != "kv_proj"
    ]
    plain = all(
        type(m).forward is torch.nn.Linear.forward
        and type(m.weight) is torch.nn.Parameter
        and m.weight.dtype == torch.float32
        and m.weight.device.type == "cpu"
        for m in linears
    )
    return linears if plain else []


def _linear_ways() -> tuple[Callable, ...]:
    """The ways this build of torch offers to multiply a decoder linear on CPU, the layer's own first."""
    ways: tuple[Callable, ...] = (_plain_linear, _linear_by_columns)
    if torch.backends.mkldnn.is_available():
        ways += (_linear_by_onednn_pack,)
    if torch.backends.mkl.is_available():
        ways += (_linear_by_mkl_pack,)
    return ways


# ((the linears' shapes), rows, threads) -> the way decoding steps measured fastest on this machine
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
    return tuple(tuple(m.weight.shape) for m in linears), rows, torch.get_num_threads()


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
        self.key, self.ways = _linear_key(linears, rows), _linear_ways()
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
    if type(weight) is not torch.nn.Parameter or weight.device.type != "cpu" or rows > 256:
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

        def first_of_a_step(hidden: torch.Tensor) -> torch.Tensor:
            if not torch.is_grad_enabled():
                self.step_begins()
            return self.first(hidden)

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
                phase.times[self.way].append(now - self.started)
            if not phase.decided() and min(len(t) for t in phase.times) >= LINEAR_TRIAL_STEPS:
                phase.decide()
            if phase.decided() or (counted and not phase.used()):  # decided (here or by another search), or unused
                phase.settle()
                self.phases.pop(0)
                self.timing = False
                continue
            counts = [len(t) for t in phase.times]
            self.way = counts.index(min(counts))
            phase.take(self.way)
            self.timing, self.started = True, time.perf_counter()
            return
        _bind(self.linears[:1], [None if self.first is self.own else self.first])  # the clock stops

    def end(self) -> None:
        for phase in self.phases:
            if isinstance(phase, _OutputWays):
                phase.settle()


# model -> how many of its searches are running with its decoder's linears bound to a measured way
_BOUND_SEARCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BINDING = threading.Lock()


@contextlib.contextmanager
def decoder_linears_for(model, rows: int):
    """While one search runs with `rows` rows, the decoder's linear layers multiply the way measured fastest for
    that many rows on this machine: their own `F.linear`, `weight @ hidden^T`, or a weight packed by oneDNN or by
    MKL. `F.linear` re-reads the weight in its plain layout at every call, which at a few rows costs more than the
    arithmetic, by how much depends on the CPU and the BLAS (from nothing to 2.4x). Until the first searches have
    measured the ways (`_StepTrial`, which then times the output projection's ways too), steps run each way in
    turn. A step with fewer rows (sentences that finished) keeps the way; MKL's pack then multiplies by the plain
    weight. The layers get their own `forward` back when the last search running on the model ends; a search that
    starts while another runs keeps the first one's way."""
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
    is kept as written: a transposing copy cost as much as the product.
    """
    weight = getattr(model.get_output_embeddings(), "weight", None)
    rows = hidden.shape[0]
    # int8 models (`vaswani_hf.precision`) hold a packed or subclassed weight: their own module computes the product
    if hidden.device.type != "cpu" or rows > 256 or type(weight) is not torch.nn.Parameter:
        return _product_by_rows(model, weight, hidden)
    key = _output_key(weight, rows)
    trial = _OUTPUT_UNDER_TRIAL.get(model)
    if trial is not None and trial.key == key:
        return trial.product(model, weight, hidden)
    way = _FASTEST_PRODUCT.get(key)
    if way is None:
        way = _FASTEST_PRODUCT[key] = _fastest(_output_ways(weight, rows), model, weight, hidden)
        _keep_output_copies(key, weight, rows)
    return way(model, weight, hidden)


def _output_key(weight: torch.Tensor, rows: int) -> tuple:
    return (tuple(weight.shape), weight.dtype), rows.bit_length(), torch.get_num_threads()


def _output_ways(weight: torch.Tensor, rows: int) -> tuple[Callable, ...]:
    """The ways to multiply the output weight by `rows` rows on this CPU, the layer's own first."""
    ways = (_product_by_rows, _product_by_columns) + ((_product_by_doubled_row,) if rows == 1 else ())
    if torch.backends.mkldnn.is_available() and (
        weight.dtype == torch.float32
        or (weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    ):  # oneDNN refuses to reorder bf16 weights where it has no bf16 kernels (AVX2, or capped to it)
        ways += (_product_by_packed_weight,)
    if torch.backends.mkl.is_available() and weight.dtype == torch.float32:
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
    key = ((tuple(weight.shape), weight.dtype), rows.bit_length(), torch.get_num_threads())
    way = _FASTEST_GREEDY.get(key)
    if way is None:
        ways: tuple[Callable, ...] = (_product_by_fastest_way,)
        if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
            ways += (_screened_in_bf16,)
        if weight.shape[1] % 16 == 0:  # the kernel reads 16 (AVX-512) or 8 (AVX2) aligned values at a time
            ways += (_screened_in_int8,)
        output_logits(model, hidden)  # the exact product measures its own ways first
        way = _FASTEST_GREEDY[key] = _fastest(ways, model, weight, hidden)
        for screened, copy in ((_screened_in_bf16, bf16_screen), (_screened_in_int8, int8_screen)):
            _keep_copy_where_chosen(_FASTEST_GREEDY, key, screened, _SCREENS[copy], weight)
    return way(model, weight, hidden)


def apply_processors(settings: DecodingSettings, scores: torch.Tensor, step: int, limits: torch.Tensor,
                     input_ids, row_examples: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """The logits processors of Transformers' loop for the supported settings, in its order, in place where it can,
    then a target prefix's tokens.

    `scores` are (rows, vocabulary); `step` tokens were generated before this one; `limits` are each row's most
    generated tokens; `input_ids()` builds the decoder input so far, only for the processors that read it;
    `row_examples` is the example each row decodes (on the CPU; needed with a target prefix).
    """
    if settings.bad_words is not None:
        scores = settings.bad_words(input_ids(), scores)
    if step < settings.min_new_tokens:
        scores[:, settings.eos] = -math.inf
    if settings.forced_bos is not None and step == 0:
        force(scores, None, settings.forced_bos)
    if settings.forced_eos is not None and step == settings.max_new_tokens - 1:
        force(scores, None, settings.forced_eos)
    if settings.suppress is not None:
        scores[:, settings.suppress] = -math.inf
    if settings.limit_eos is not None:
        at_limit = step + 1 >= limits
        if bool(at_limit.any()):
            force(scores, at_limit, settings.limit_eos)
    if settings.user_processors:
        scores = settings.user_processors(input_ids(), scores)
    if settings.renormalize:
        scores = scores.log_softmax(dim=-1)
    if settings.prefix is not None and step < settings.prefix.shape[1]:
        scores = force_prefix(scores, settings.prefix[row_examples, step].to(scores.device))
    return scores


def force_prefix(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Rows whose `tokens` entry is a token (not -1) can only continue with it, at its own score: a prefix's
    log-probability counts in the hypothesis' score, as in fairseq's and CTranslate2's prefix decoding."""
    rows = tokens >= 0
    if not bool(rows.any()):
        return scores
    index = tokens.clamp(min=0)[:, None]
    forced = torch.full_like(scores, -math.inf).scatter_(1, index, scores.gather(1, index))
    return torch.where(rows[:, None], forced, scores)


def force(scores: torch.Tensor, rows: torch.Tensor | None, token: int) -> None:
    """Transformers' forced-token rule: the token scores 0, everything else -inf (in the chosen rows)."""
    if rows is None:
        scores.fill_(-math.inf)
        scores[:, token] = 0
    else:
        forced = torch.full_like(scores[:1], -math.inf)
        forced[:, token] = 0
        scores.copy_(torch.where(rows[:, None], forced, scores))


def greedy_search(settings: DecodingSettings, state: DecodingState) -> dict:
    """Greedy decoding: the most probable token at each step, from the raw logits (no softmax needed)."""
    batch = int(state.example_ids.shape[0])
    device = state.encoder_hidden.device
    output = torch.full((batch, settings.max_new_tokens), settings.fill, dtype=torch.long, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    tokens = torch.full((batch,), settings.start, dtype=torch.long, device=device)
    generated = torch.full((batch, settings.max_new_tokens), settings.fill, dtype=torch.long, device=device)
    limits = settings.limits.to(device)
    eos = settings.eos.to(device)
    # the screened projection's upper bounds stay upper bounds under the built-in processors (they mask or force
    # tokens); a caller's processor may do anything with them
    screened = not settings.user_processors and hasattr(state, "greedy_logits")
    for step in range(settings.max_new_tokens):
        scores, floor = state.greedy_logits(tokens) if screened else (state.logits(tokens).t(), None)

        def input_ids(step=step, generated=generated):
            start = torch.full_like(generated[:, :1], settings.start)
            return torch.cat([start, generated[:, :step]], dim=1)

        scores = apply_processors(settings, scores, step, limits, input_ids, state.example_ids)
        tokens = scores.argmax(-1)
        if floor is not None and not bool((scores.gather(1, tokens[:, None]) >= floor).all()):
            # a processor removed every candidate of a row (a suppressed token, EOS before min_new_tokens): the best
            # token left is known only approximately, so this step is decided on the exact logits
            scores = apply_processors(settings, state.exact_logits(), step, limits, input_ids, state.example_ids)
            tokens = scores.argmax(-1)
        generated[:, step] = tokens
        finished = torch.isin(tokens, eos) | (step + 1 >= limits)
        if bool(finished.any()):
            done = finished.nonzero().flatten()
            ids = state.example_ids[done.cpu()].to(device)
            output[ids] = generated[done]
            lengths[ids] = step + 1
            keep = (~finished).nonzero().flatten()
            if keep.numel() == 0:
                break
            state.keep(keep)
            tokens, generated, limits = tokens[keep], generated[keep], limits[keep]
    return {"sequences": output, "lengths": lengths}


def beam_search(settings: DecodingSettings, state: DecodingState) -> dict:
    """Beam search (section 6.1) with Transformers' candidate and finished-hypothesis rules.

    At each step every beam proposes its best `candidates` continuations; the best `candidates` of all a
    sentence's beams are kept; those ending in EOS among the first `num_beams` become finished hypotheses (scored
    with the length penalty), the best `num_beams` others go on. A sentence is done when its search can no longer
    change its result (`sentence_done`); it then leaves the batch.
    """
    beams, eos = settings.num_beams, settings.eos
    device = state.encoder_hidden.device
    eos = eos.to(device)
    batch = int(state.example_ids.shape[0])
    candidates = settings.candidates
    steps = settings.max_new_tokens
    limits = settings.limits.to(device)

    running = torch.full((batch, beams, steps), settings.fill, dtype=torch.long, device=device)
    running_scores = torch.zeros(batch, beams, device=device)
    running_scores[:, 1:] = -1e9  # the beams start identical: let only the first one propose at step 0
    finished = running.clone()
    finished_scores = torch.full((batch, beams), -1e9, device=device)
    finished_lengths = torch.zeros(batch, beams, dtype=torch.long, device=device)
    is_finished = torch.zeros(batch, beams, dtype=torch.bool, device=device)
    improvable = torch.ones(batch, dtype=torch.bool, device=device)
    first_beams = torch.arange(candidates, device=device) < beams

    n_return = settings.num_return_sequences
    out_sequences = torch.full((state.example_ids.shape[0] * n_return, steps), settings.fill, dtype=torch.long,
                               device=device)  # fmt: skip
    out_scores = torch.zeros(out_sequences.shape[0], device=device)
    out_lengths = torch.zeros(out_sequences.shape[0], dtype=torch.long, device=device)
    tokens = torch.full((batch * beams,), settings.start, dtype=torch.long, device=device)
    # Transformers returns beam_indices with the scores they index (its docs: "returned when output_scores=True");
    # without them, translation with return_dict_in_generate (n-best scores) pays nothing for the bookkeeping
    history = BeamHistory(settings, batch, steps, device) if settings.per_step_outputs else None

    for step in range(steps):
        batch = running.shape[0]
        if step == 0 and getattr(state, "fold", False):
            # the beams of a sentence are identical before the first step: run one row per sentence, and let the
            # self-attention cache's next copy give each beam its own (reorderings are applied lazily)
            columns = state.logits(tokens[::beams]).repeat_interleave(beams, dim=1)  # (vocabulary, rows)
            state.reorder(torch.arange(batch, device=device).repeat_interleave(beams))
        else:
            columns = state.logits(tokens)  # (vocabulary, rows)
        if history is not None and settings.output_logits:
            history.record(history.logits, columns.t(), state.example_ids)
        log_probs = columns.t()
        if columns.is_contiguous():
            torch.log_softmax(columns, dim=0, out=columns)  # in place: the logits are ours alone
        elif log_probs.is_contiguous():
            torch.log_softmax(log_probs, dim=-1, out=log_probs)
        else:
            log_probs = torch.log_softmax(log_probs, dim=-1)

        def input_ids(step=step, running=running):
            start = torch.full((running.shape[0] * beams, 1), settings.start, dtype=torch.long, device=device)
            return torch.cat([start, running[..., :step].flatten(0, 1)], dim=1)

        row_limits = limits.repeat_interleave(beams)
        # only a target prefix reads which example a row decodes
        row_examples = state.example_ids.repeat_interleave(beams) if settings.prefix is not None else None
        log_probs = apply_processors(settings, log_probs, step, row_limits, input_ids, row_examples)
        if history is not None and settings.output_scores:
            history.record(history.scores, log_probs, state.example_ids)
        values, token_ids = top_k_per_row(log_probs, candidates)
        totals = (values + running_scores.view(-1, 1)).reshape(batch, beams * candidates)
        top_scores, top_index = totals.topk(candidates, dim=-1)
        top_beams = top_index // candidates
        top_tokens = token_ids.reshape(batch, beams * candidates).gather(1, top_index)
        top_sequences = running.gather(1, top_beams[..., None].expand(-1, -1, steps))  # a new tensor
        top_sequences[:, :, step] = top_tokens
        ends = torch.isin(top_tokens, eos) | (step + 2 > steps)

        if history is not None:
            top_origins = history.top_origins(top_beams, state.example_ids, step)

        # the best beams that go on
        next_scores, next_index = (top_scores + ends.float() * -1e9).topk(beams, dim=-1)
        running = top_sequences.gather(1, next_index[..., None].expand(-1, -1, steps))
        if history is not None:
            history.running = top_origins.gather(1, next_index[..., None].expand(-1, -1, steps))
        running_scores = next_scores
        parent_rows = top_beams.gather(1, next_index) + torch.arange(batch, device=device)[:, None] * beams

        # the hypotheses that end here, if among the first `beams` candidates and good enough
        just_finished = ends & first_beams
        scored = top_scores / settings.penalty(step + 1) + (~just_finished).float() * -1e9
        merged_scores, merged_index = torch.cat([finished_scores, scored], dim=1).topk(beams, dim=-1)
        merged = torch.cat([finished, top_sequences], dim=1)
        finished = merged.gather(1, merged_index[..., None].expand(-1, -1, steps))
        if history is not None:
            merged = torch.cat([history.finished, top_origins], dim=1)
            history.finished = merged.gather(1, merged_index[..., None].expand(-1, -1, steps))
        finished_scores = merged_scores
        finished_lengths = torch.cat([finished_lengths, torch.full_like(top_scores, step + 1, dtype=torch.long)],
                                     dim=1).gather(1, merged_index)  # fmt: skip
        is_finished = torch.cat([is_finished, just_finished], dim=1).gather(1, merged_index)

        done, improvable = sentence_done(settings, step, running_scores, finished_scores, is_finished, improvable,
                                         limits)  # fmt: skip
        done |= ends.all(dim=1) | (step + 1 >= limits)
        if bool(done.any()):
            leaving = done.nonzero().flatten()
            ids = state.example_ids[leaving.cpu()].to(device)
            rows = (ids[:, None] * n_return + torch.arange(n_return, device=device)).flatten()
            out_sequences[rows] = finished[leaving, :n_return].flatten(0, 1)
            out_scores[rows] = finished_scores[leaving, :n_return].flatten()
            out_lengths[rows] = finished_lengths[leaving, :n_return].flatten()
            if history is not None:
                history.out[rows] = history.finished[leaving, :n_return].flatten(0, 1)
            stay = (~done).nonzero().flatten()
            if stay.numel() == 0:
                break
            row_stay = (stay[:, None] * beams + torch.arange(beams, device=device)).flatten()
            # rows of the sentences that go on, renumbered after the others leave
            position = torch.full((done.shape[0] * beams,), -1, dtype=torch.long, device=device)
            position[row_stay] = torch.arange(row_stay.numel(), device=device)
            state.keep(stay)
            parent_rows = position[parent_rows[stay]]
            running, running_scores, finished = running[stay], running_scores[stay], finished[stay]
            finished_scores, finished_lengths = finished_scores[stay], finished_lengths[stay]
            is_finished, improvable, limits = is_finished[stay], improvable[stay], limits[stay]
            if history is not None:
                history.running, history.finished = history.running[stay], history.finished[stay]
        state.reorder(parent_rows.flatten())
        tokens = running[:, :, step].flatten()
    result = {"sequences": out_sequences, "scores": out_scores, "lengths": out_lengths}
    if history is not None:
        result.update(history.outputs())
    return result


class BeamHistory:
    """What `return_dict_in_generate` adds to a beam search's result, as Transformers' beam search returns it:
    `beam_indices` (for each returned hypothesis and step, the row of batch x beams its token came from, -1 after
    its end), and with `output_scores` / `output_logits` the per-step processed log-probabilities / raw logits of
    every row, (batch * beams, vocabulary) each, which `compute_transition_scores` reads through `beam_indices`.

    A sentence leaves the batch once its search is over (`beam_search`); Transformers' loop goes on computing its
    rows, which no hypothesis reads. Here those rows of later steps hold -inf (nothing was computed there).
    """

    def __init__(self, settings: DecodingSettings, batch: int, steps: int, device: torch.device):
        self.beams = settings.num_beams
        self.total_rows = batch * self.beams
        self.running = torch.full((batch, self.beams, steps), -1, dtype=torch.int32, device=device)
        self.finished = self.running.clone()
        self.out = torch.full((batch * settings.num_return_sequences, steps), -1, dtype=torch.int32, device=device)
        self.scores: list[torch.Tensor] = []
        self.logits: list[torch.Tensor] = []

    def rows(self, example_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        beams = torch.arange(self.beams, device=device)
        return (example_ids.to(device)[:, None] * self.beams + beams).flatten()

    def record(self, steps: list[torch.Tensor], values: torch.Tensor, example_ids: torch.Tensor) -> None:
        """One step's (rows, vocabulary) values of the sentences still in the batch, in the full batch's rows."""
        full = values.new_full((self.total_rows, values.shape[-1]), -math.inf, dtype=torch.float32)
        full[self.rows(example_ids, values.device)] = values
        steps.append(full)

    def top_origins(self, top_beams: torch.Tensor, example_ids: torch.Tensor, step: int) -> torch.Tensor:
        """The beam indices of the step's top candidates: their parents' history, then the parent's row."""
        origins = self.running.gather(1, top_beams[..., None].expand(-1, -1, self.running.shape[-1]))
        parent_rows = example_ids.to(top_beams.device)[:, None] * self.beams + top_beams
        origins[:, :, step] = parent_rows.to(origins.dtype)
        return origins

    def outputs(self) -> dict:
        return {
            "beam_indices": self.out,
            "step_scores": tuple(self.scores) or None,
            "step_logits": tuple(self.logits) or None,
        }


def sentence_done(settings: DecodingSettings, step: int, running_scores: torch.Tensor, finished_scores: torch.Tensor,
                  is_finished: torch.Tensor, improvable: torch.Tensor, limits: torch.Tensor):  # fmt: skip
    """Which sentences' searches are over after `step + 1` generated tokens (and the updated `improvable`).

    GNMT (the paper, as tensor2tensor's beam search): over when the best score a running beam can still reach,
    its log-probability (which only falls) over the largest length penalty it can still get, is below the
    `n`-th best finished score: n = num_return_sequences with `early_stopping=True` (the best results are final),
    n = num_beams otherwise (every finished slot is final).
    "hf": Transformers' rules: `early_stopping=True` once `num_beams` hypotheses are finished; otherwise its
    heuristic with the current length (False) or the longest possible one ("never", for a positive penalty).
    """
    if settings.gnmt:
        n = settings.num_return_sequences if settings.early_stopping is True else settings.num_beams
        largest_penalty = torch.maximum(
            torch.as_tensor(settings.penalty(limits.float())), torch.tensor(float(settings.penalty(step + 2)))
        )
        reachable = running_scores[:, 0] / largest_penalty
        return finished_scores[:, n - 1] > reachable, improvable
    alpha = settings.length_penalty
    if settings.early_stopping == "never" and alpha > 0.0:
        length = settings.max_new_tokens
    else:
        length = step + 1
    best_running = running_scores[:, :1] / length**alpha
    worst_finished = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values, -1.0e9)
    improvable = improvable & (best_running > worst_finished).any(dim=1)
    return (is_finished.all(dim=1) & (settings.early_stopping is True)) | ~improvable, improvable


class PhraseConstraints:
    """Lexical constraints of one sentence (Hokamp & Liu, 2017; Post & Vilar, 2018): token phrases that must all
    appear in its output. Immutable: `advance` gives the state after one more output token.

    A phrase counts wherever it appears, whether forced or chosen by the model; a phrase under way that the next
    token breaks starts over (its matched tokens count again only when matched again). With `boundaries` (the ids
    of the tokens that begin a word), a phrase counts only where a word ends after it: "sieben" is not met by the
    first piece of "siebenundzwanzig".
    """

    __slots__ = ("boundaries", "met", "phrases", "progress")

    def __init__(self, phrases: tuple[tuple[int, ...], ...], met: tuple[bool, ...] | None = None,
                 progress: tuple[int, int] | None = None, boundaries: frozenset[int] | None = None):  # fmt: skip
        self.phrases = phrases
        self.met = met if met is not None else (False,) * len(phrases)
        self.progress = progress  # (phrase, tokens of it matched) of the phrase under way
        self.boundaries = boundaries

    @property
    def done(self) -> bool:
        """Every phrase is in place (one may still wait for its word to end: EOS ends it)."""
        unmet = self.met.count(False)
        return unmet == 0 or (unmet == 1 and self._complete())

    def _complete(self) -> bool:
        return self.progress is not None and self.progress[1] == len(self.phrases[self.progress[0]])

    @property
    def tokens_met(self) -> int:
        """The bank of Post & Vilar's dynamic beam allocation: constraint tokens in place so far."""
        matched = sum(len(phrase) for phrase, met in zip(self.phrases, self.met, strict=True) if met)
        return matched + (self.progress[1] if self.progress is not None else 0)

    def next_tokens(self) -> set[int]:
        """The tokens that would make progress: the next of the phrase under way, else the first of each unmet
        (none while a complete phrase waits for its word to end: the model's choice decides)."""
        if self.progress is not None:
            phrase, matched = self.progress
            return set() if self._complete() else {self.phrases[phrase][matched]}
        return {phrase[0] for phrase, met in zip(self.phrases, self.met, strict=True) if not met}

    def advance(self, token: int) -> PhraseConstraints:
        met = self.met
        if self.progress is not None:
            phrase, matched = self.progress
            if self._complete():  # a new word begins: the phrase is met; the word goes on: it was not the phrase
                if token in self.boundaries:
                    met = met[:phrase] + (True,) + met[phrase + 1 :]
            elif self.phrases[phrase][matched] == token:
                return self._state(met, (phrase, matched + 1))
        for phrase, (tokens, done) in enumerate(zip(self.phrases, met, strict=True)):
            if not done and tokens[0] == token:
                return self._state(met, (phrase, 1))
        return PhraseConstraints(self.phrases, met, None, self.boundaries)

    def _state(self, met: tuple[bool, ...], progress: tuple[int, int]) -> PhraseConstraints:
        phrase, matched = progress
        if matched == len(self.phrases[phrase]) and self.boundaries is None:  # token phrases are met at once
            return PhraseConstraints(self.phrases, met[:phrase] + (True,) + met[phrase + 1 :])
        return PhraseConstraints(self.phrases, met, progress, self.boundaries)


@dataclass
class Hypothesis:
    """A partial output of the constrained beam search."""

    tokens: tuple[int, ...]
    score: float  # log-probability so far
    constraints: PhraseConstraints
    parent: int = 0  # the beam it extends
    ends: bool = False  # its last token is EOS


def constrained_beam_search(settings: DecodingSettings, state: DecodingState) -> dict:
    """Beam search whose outputs contain every phrase of their sentence's constraints: Post & Vilar's (2018) dynamic
    beam allocation. Each beam proposes its best `num_beams` tokens and every token that advances its constraints;
    the candidates are grouped in banks by how many constraint tokens they have in place, and the beam is filled
    from the banks in turn, most advanced first, best score first inside a bank, so hypotheses that spent a step on
    a constraint are not pushed out by freer ones. EOS is allowed once all of a hypothesis' phrases are in place;
    at the length limit it is forced, and a hypothesis that met its constraints ranks before any that did not.

    Model steps are batched as in `beam_search`; the choice of candidates runs per sentence, on the CPU.
    """
    beams, device = settings.num_beams, state.encoder_hidden.device
    eos = set(settings.eos.tolist())
    eos_ids = settings.eos.to(device)
    candidates = settings.candidates
    limits = settings.limits.tolist()
    n_return = settings.num_return_sequences
    batch = len(limits)
    out_sequences = torch.full((batch * n_return, settings.max_new_tokens), settings.fill, dtype=torch.long)
    out_scores = torch.zeros(batch * n_return)
    out_lengths = torch.zeros(batch * n_return, dtype=torch.long)
    first = [Hypothesis((), 0.0, constraints) for constraints in settings.constraints]
    running = [[hyp] + [Hypothesis((), -math.inf, hyp.constraints)] * (beams - 1) for hyp in first]
    finished: list[list[tuple[bool, float, tuple[int, ...]]]] = [[] for _ in range(batch)]
    tokens = torch.full((batch * beams,), settings.start, dtype=torch.long, device=device)

    for step in range(settings.max_new_tokens):
        log_probs = torch.log_softmax(state.logits(tokens).t(), dim=-1)
        blocked = [not hyp.constraints.done for beam in running for hyp in beam]
        if eos_ids.numel() and any(blocked):  # EOS must wait for the constraints (the limit below overrides this)
            rows = torch.tensor(blocked, device=device).nonzero().flatten()
            log_probs[rows[:, None], eos_ids] = -math.inf
        example_ids = state.example_ids.tolist()
        row_limits = torch.tensor([limits[i] for i in example_ids for _ in range(beams)], device=device)

        def input_ids(running=running):
            rows = [(settings.start, *hyp.tokens) for beam in running for hyp in beam]
            return torch.tensor(rows, dtype=torch.long, device=device)

        row_examples = state.example_ids.repeat_interleave(beams)
        log_probs = apply_processors(settings, log_probs, step, row_limits, input_ids, row_examples)
        values, best = (x.tolist() for x in top_k_per_row(log_probs, candidates))
        wanted = [(row, token) for row, hyp in enumerate(h for beam in running for h in beam)
                  for token in sorted(hyp.constraints.next_tokens())]  # fmt: skip
        wanted_scores = log_probs[[r for r, _ in wanted], [t for _, t in wanted]].tolist() if wanted else []
        proposals: list[dict[tuple[int, int], float]] = [{} for _ in running]
        for row in range(len(values)):
            for value, token in zip(values[row], best[row], strict=True):
                proposals[row // beams][(row % beams, token)] = value
        for (row, token), value in zip(wanted, wanted_scores, strict=True):
            proposals[row // beams][(row % beams, token)] = value

        next_running, leaving = [], []
        for position, example in enumerate(example_ids):
            beam = running[position]
            banks: dict[int, list[Hypothesis]] = {}
            for (parent, token), value in proposals[position].items():
                score = beam[parent].score + value
                if score != -math.inf:
                    hyp = Hypothesis((*beam[parent].tokens, token), score, beam[parent].constraints.advance(token),
                                     parent, ends=token in eos)  # fmt: skip
                    banks.setdefault(hyp.constraints.tokens_met, []).append(hyp)
            # Transformers' rule, per bank: an ending is final if it is among the beam's best; the rest go on
            for hyp in allocate(banks, beams):
                if hyp.ends:
                    finished[example].append((hyp.constraints.done, hyp.score / settings.penalty(step + 1), hyp.tokens))
            chosen = allocate({bank: [h for h in hyps if not h.ends] for bank, hyps in banks.items()}, beams)
            if step + 1 >= limits[example] or not chosen or finished_for_good(settings, finished[example], chosen,
                                                                                step, limits[example]):  # fmt: skip
                leaving.append(position)
                results = sorted(finished[example], key=lambda f: (f[0], f[1]), reverse=True)
                # fewer results than asked for: the best unfinished hypotheses (no EOS) make up the number
                results += [(h.constraints.done, h.score / settings.penalty(step + 1), h.tokens) for h in chosen]
                for rank, (_, score, hyp_tokens) in enumerate(results[:n_return]):
                    row = example * n_return + rank
                    out_sequences[row, : len(hyp_tokens)] = torch.tensor(hyp_tokens, dtype=torch.long)
                    out_scores[row], out_lengths[row] = score, len(hyp_tokens)
            else:
                filler = Hypothesis(chosen[0].tokens, -math.inf, chosen[0].constraints, chosen[0].parent)
                next_running.append(chosen + [filler] * (beams - len(chosen)))
        if leaving:
            stay = [p for p in range(len(running)) if p not in set(leaving)]
            if not stay:
                break
            state.keep(torch.tensor(stay, device=device))
        state.reorder(torch.tensor([p * beams + hyp.parent for p, beam in enumerate(next_running) for hyp in beam],
                                   device=device))  # fmt: skip
        running = next_running
        tokens = torch.tensor([hyp.tokens[-1] for beam in running for hyp in beam], dtype=torch.long, device=device)
    return {"sequences": out_sequences.to(device), "scores": out_scores.to(device), "lengths": out_lengths.to(device)}


def allocate(banks: dict[int, list[Hypothesis]], beams: int) -> list[Hypothesis]:
    """Post & Vilar's beam allocation: the banks take turns, most constraint tokens first, each giving its best
    remaining hypothesis, until the beam is full or the banks are empty."""
    queues = [sorted(banks[bank], key=lambda h: -h.score) for bank in sorted(banks, reverse=True)]
    chosen: list[Hypothesis] = []
    while len(chosen) < beams and any(queues):
        for queue in queues:
            if queue and len(chosen) < beams:
                chosen.append(queue.pop(0))
    return chosen


def finished_for_good(settings: DecodingSettings, finished: list, running: list[Hypothesis], step: int,
                      limit: int) -> bool:  # fmt: skip
    """No running hypothesis can beat the results: enough of them met every constraint (num_return_sequences with
    early stopping, else num_beams) and the best log-probability still running, which only falls, over the best
    length penalty it can still get, is below the worst of those."""
    n = settings.num_return_sequences if settings.early_stopping is True else settings.num_beams
    met = sorted((score for done, score, _ in finished if done), reverse=True)
    if len(met) < n:
        return False
    best_running = max(hyp.score for hyp in running)
    reachable = best_running / max(settings.penalty(limit), settings.penalty(step + 2))
    return met[n - 1] > reachable


@dataclass
class LexicalRequests:
    """A generate() call's target prefixes (`target_prefix`) and lexical constraints (`force_words`), checked.

    `target_prefix`: one list of token ids per example (empty for none), or a 2-D tensor; the output starts with it,
    and its log-probability counts in the score (CTranslate2's `target_prefix`, fairseq's `prefix_tokens`).
    `force_words`: one list of phrases per example, each phrase a list of token ids; every phrase appears in the
    output. `force_words_ids` is Transformers' (4.x) name for phrases shared by every example. `word_start_ids`:
    the ids of the tokens that begin a word; with them a phrase counts only where a word ends after it
    (`PhraseConstraints`; `vaswani_hf.inference.word_start_ids` reads them from a tokenizer).
    The length limit of an example grows to fit its prefix and phrases (tokens of both, plus EOS).
    """

    constraints: list[PhraseConstraints] | None = None
    prefix: torch.LongTensor | None = None  # (examples, P), -1 after an example's own prefix
    needed: torch.LongTensor | None = None  # per example: the fewest tokens its output needs

    @property
    def asked(self) -> str | None:
        names = [f"`{name}`" for name, value in (("force_words", self.constraints), ("target_prefix", self.prefix))
                 if value is not None]  # fmt: skip
        return " and ".join(names) or None

    @classmethod
    def check(cls, model_config, config: GenerationConfig, force_words, force_words_ids, target_prefix,
              batch: int, word_start_ids=None) -> LexicalRequests:  # fmt: skip
        eos = config.eos_token_id
        forbidden = {token: "the end-of-sequence token" for token in ([eos] if isinstance(eos, int) else eos or [])}
        if model_config.unk_token_id is not None:
            forbidden[model_config.unk_token_id] = "the unknown token (text the vocabulary cannot spell)"
        vocab = model_config.vocab_size
        if force_words is not None and force_words_ids is not None:
            raise ValueError("generate(): give `force_words` (a list of phrases per example) or `force_words_ids` "
                             "(Transformers' name: the same phrases for every example), not both.")  # fmt: skip
        if force_words_ids is not None:
            if not _is_list(force_words_ids) or not all(_is_list(phrase) for phrase in force_words_ids):
                raise ValueError("generate(): `force_words_ids` is a list of phrases, each a list of token ids.")
            if any(_is_list(token) for phrase in force_words_ids for token in phrase):
                raise ValueError("generate(): `force_words_ids` with alternatives (lists of phrases) are Transformers' "
                                 "disjunctive constraints, which this beam search does not have: give one phrase per "
                                 "entry.")  # fmt: skip
            force_words = [force_words_ids] * batch
        requests = cls()
        needed = torch.ones(batch, dtype=torch.long)
        if force_words is not None:
            if config.num_beams < 2:
                raise ValueError("generate(): `force_words` needs beam search: set num_beams to 2 or more (the "
                                 "paper's 4).")  # fmt: skip
            examples = _per_example("force_words", force_words, batch)
            boundaries = None if word_start_ids is None else frozenset(_token_ids("word_start_ids", word_start_ids,
                                                                                  vocab, {}))  # fmt: skip
            requests.constraints = []
            for i, phrases in enumerate(examples):
                if not _is_list(phrases):
                    raise ValueError(f"generate(): force_words[{i}] must be a list of phrases (lists of token ids).")
                checked = tuple(_token_ids(f"force_words[{i}][{j}]", phrase, vocab, forbidden, empty=False)
                                for j, phrase in enumerate(phrases))  # fmt: skip
                requests.constraints.append(PhraseConstraints(checked, boundaries=boundaries))
                needed[i] += sum(len(phrase) for phrase in checked)
        if target_prefix is not None:
            examples = _per_example("target_prefix", target_prefix, batch)
            prefixes = [_token_ids(f"target_prefix[{i}]", p, vocab, forbidden) for i, p in enumerate(examples)]
            requests.prefix = torch.full((batch, max(map(len, prefixes), default=0)), -1, dtype=torch.long)
            for i, prefix in enumerate(prefixes):
                requests.prefix[i, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
                needed[i] += len(prefix)
        requests.needed = needed
        return requests

    def apply(self, settings: DecodingSettings) -> None:
        if self.asked is None:
            return
        settings.prefix, settings.constraints = self.prefix, self.constraints
        settings.limits = torch.maximum(settings.limits, self.needed)
        settings.max_new_tokens = max(settings.max_new_tokens, int(settings.limits.max()))


def _is_list(value) -> bool:
    return isinstance(value, (list, tuple)) or (isinstance(value, torch.Tensor) and value.dim() > 0)


def _per_example(name: str, value, batch: int) -> list:
    if not _is_list(value) or len(value) != batch:
        given = f"{len(value)} entries" if _is_list(value) else type(value).__name__
        raise ValueError(f"generate(): `{name}` needs one entry per example ({batch} here), got {given}.")
    return list(value)


def _token_ids(name: str, ids, vocab: int, forbidden: dict[int, str], empty: bool = True) -> tuple[int, ...]:
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
    if not _is_list(ids) or not all(isinstance(token, int) and not isinstance(token, bool) for token in ids):
        raise ValueError(f"generate(): {name} must be a list of token ids (whole numbers), got {ids!r}.")
    if not ids and not empty:
        raise ValueError(f"generate(): {name} is empty: a phrase needs at least one token.")
    for token in ids:
        if not 0 <= token < vocab:
            raise ValueError(f"generate(): {name} holds token id {token}, outside the vocabulary [0, {vocab}).")
        if token in forbidden:
            raise ValueError(f"generate(): {name} holds token id {token}, {forbidden[token]}: leave it out.")
    return tuple(ids)


def forced_attentions(model, **inputs):
    """The model's forward on given inputs with every attention weight returned (eager attention for the call:
    sdpa and flash kernels do not return the weights)."""
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        return model(**inputs, output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation(implementation)


class VaswaniGenerationMixin:
    """`generate()` with the paper's decoding (section 6.1) as defaults; see the module docstring.

    Extra generation settings (arguments of `generate()` or attributes of the generation config):
    `length_penalty_type` ("gnmt": ((5 + |Y|) / 6) ** length_penalty, the paper's; "hf": |Y| ** length_penalty,
    Transformers') and `max_length_offset` (each output at most source length + offset tokens, EOS forced there;
    `None` for Transformers' `max_length`). An explicit `max_length`/`max_new_tokens` wins over the offset.

    Extra arguments of `generate()`: `vocabulary_shortlist` (target ids to score, `vaswani_hf.shortlist`),
    `output_sequence_scores=True` (beam search's `sequences_scores` alone; Transformers' `output_scores` also keeps
    every step's (rows x vocabulary) scores), `return_alignments`, `force_words`, `target_prefix`, `word_start_ids`.
    """

    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        **kwargs,
    ):
        config = self._resolved_config(generation_config)
        penalty_type = kwargs.pop("length_penalty_type", getattr(config, "length_penalty_type", "hf"))
        offset = kwargs.pop("max_length_offset", getattr(config, "max_length_offset", None))
        if penalty_type not in LENGTH_PENALTY_TYPES:
            raise ValueError(f"length_penalty_type must be one of {LENGTH_PENALTY_TYPES}, got {penalty_type!r}.")
        explicit_length = any(kwargs.get(k) is not None for k in ("max_length", "max_new_tokens"))
        return_alignments = kwargs.pop("return_alignments", False)
        if return_alignments:
            if not isinstance(self, torch.nn.Module):
                raise ValueError(f"generate(return_alignments=True) reads a PyTorch model's cross-attention weights, "
                                 f"which {type(self).__name__} does not give: use a single PyTorch model.")  # fmt: skip
            kwargs["return_dict_in_generate"] = True
        force_words, force_words_ids = kwargs.pop("force_words", None), kwargs.pop("force_words_ids", None)
        force_words_ids, config.force_words_ids = force_words_ids or config.force_words_ids, None
        target_prefix, word_start_ids = kwargs.pop("target_prefix", None), kwargs.pop("word_start_ids", None)
        shortlist = kwargs.pop("vocabulary_shortlist", None)
        sequence_scores = kwargs.pop("output_sequence_scores", False)
        if sequence_scores:
            kwargs["return_dict_in_generate"] = True
        model_kwargs = config.update(**kwargs)
        if inputs is not None:
            model_kwargs.setdefault("input_ids", inputs)
        source = self._source(model_kwargs)
        lexical = LexicalRequests.check(self.config, config, force_words, force_words_ids, target_prefix,
                                        source.lengths.shape[0], word_start_ids)  # fmt: skip
        use_offset = offset is not None and not explicit_length and config.max_new_tokens is None
        limits = source.lengths + offset if use_offset else None
        limits = self._fit_position_table(config, limits, model_kwargs.get("decoder_input_ids"))

        if config.guidance_scale is not None and config.guidance_scale != 1:
            raise ValueError(
                f"generate(): guidance_scale={config.guidance_scale} (classifier-free guidance) works with "
                "decoder-only models: Transformers' guidance runs the model again on an unconditional prompt, which an "
                "encoder-decoder model has no input for. Leave guidance_scale unset (or 1)."
            )
        reason = self._handed_over_because(config, model_kwargs)
        asked = " and ".join(filter(None, [lexical.asked, "`vocabulary_shortlist`" if shortlist is not None else None]))
        if reason is not None and asked:
            raise ValueError(
                f"generate(): {asked} runs in this model's greedy and beam search, but {reason} hands the call "
                "to Transformers' own loop, which has neither. Drop that option (a `decoder_input_ids` prompt is "
                "Transformers' way to continue a prefix there)."
            )
        if reason is None:
            output = self._decode(config, model_kwargs, source, limits, penalty_type, logits_processor, lexical,
                                  shortlist, sequence_scores)  # fmt: skip
            return self._with_alignments(output, source) if return_alignments else output
        if penalty_type == "gnmt" and config.num_beams > 1 and config.length_penalty != 0:
            logger.warning_once(
                f"generate(): {reason} runs in Transformers' own loop, whose beam search scores finished hypotheses "
                "with |Y| ** length_penalty, not the GNMT penalty of length_penalty_type='gnmt'. Pass "
                "length_penalty_type='hf' to silence this."
            )
        if sequence_scores:  # Transformers' loop returns `sequences_scores` with the per-step scores only
            kwargs["output_scores"] = True
        if limits is not None:
            kwargs["max_new_tokens"] = int(limits.max())
            eos = kwargs.get("eos_token_id", config.eos_token_id)
            eos = eos[0] if isinstance(eos, (list, tuple)) else eos
            if eos is not None:
                logits_processor = LogitsProcessorList(logits_processor or [])
                logits_processor.append(SourceLengthLimitLogitsProcessor(limits, eos))
        output = GenerationMixin.generate(self, inputs, generation_config, logits_processor, **kwargs)
        return self._with_alignments(output, source) if return_alignments else output

    def _fit_position_table(
        self, config: GenerationConfig, limits: torch.Tensor | None, prompt: torch.Tensor | None
    ) -> torch.Tensor | None:
        """A learned position table (Table 3 row E) ends at `max_position_embeddings`: after a decoder prompt of P
        tokens (the start token, or a `decoder_input_ids` prefix), N new tokens feed P + N - 1 decoder positions.
        The source + offset limit is cut there (EOS forced); an explicit longer request is an error naming the
        table, not the input."""
        if getattr(self.config, "position_embedding_type", None) != "learned":
            return limits
        positions = self.config.max_position_embeddings
        prompt_length = prompt.shape[-1] if prompt is not None else 1
        room = positions - prompt_length + 1
        if room < 1:
            raise ValueError(
                f"generate(): the decoder prefix has {prompt_length} tokens, but this model's learned position table "
                f"has max_position_embeddings={positions}: shorten `decoder_input_ids` to at most {positions} tokens."
            )
        if limits is not None:
            return limits.clamp(max=room)
        asked = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - prompt_length
        if asked > room:
            raise ValueError(
                f"generate(): {asked} new tokens after a decoder prompt of {prompt_length} need "
                f"{asked + prompt_length - 1} decoder positions, but this model's learned position table has "
                f"max_position_embeddings={positions}: ask for at most max_new_tokens={room}."
            )
        return limits

    def _with_alignments(self, output, source: Source):
        """`output` with `alignments`: for each returned sequence, a (pairs, 2) LongTensor of (source token, output
        token) positions, one pair per output token: the source token its cross-attention weighs most, in the
        config's `alignment_layer`, averaged over `alignment_heads` (fairseq's hard alignment). Positions count the
        real tokens: the source without padding, the output from its first generated token. EOS and padding on
        either side are left out. `vaswani_hf.inference` merges subword pieces into Moses `i-j` word pairs."""
        sequences = output.sequences
        rows_per_example = sequences.shape[0] // source.lengths.shape[0]
        repeat = lambda x: x.repeat_interleave(rows_per_example, dim=0) if x is not None else None  # noqa: E731
        encoder_outputs = None
        if source.input_ids is None:
            encoder_outputs = BaseModelOutput(last_hidden_state=repeat(source.encoder_outputs[0]))
        input_ids = repeat(source.input_ids)
        mask = repeat(source.attention_mask)
        if mask is None:
            shape = (input_ids if input_ids is not None else encoder_outputs.last_hidden_state).shape[:2]
            mask = torch.ones(shape, dtype=torch.long, device=self.device)
        attentions = forced_attentions(self, input_ids=input_ids, attention_mask=mask, encoder_outputs=encoder_outputs,
                                       decoder_input_ids=sequences[:, :-1]).cross_attentions  # fmt: skip
        if not attentions or attentions[0] is None:
            raise ValueError("generate(return_alignments=True): the model returned no cross-attention weights, which "
                             "the alignments are read from.")  # fmt: skip
        weights = attentions[self.config.alignment_layer_index].float()
        if self.config.alignment_heads is not None:
            weights = weights[:, self.config.alignment_heads]
        weights = weights.mean(dim=1)  # (rows, output tokens, source tokens)
        eos = self.generation_config.eos_token_id
        eos = torch.tensor([eos] if isinstance(eos, int) else list(eos or []), device=sequences.device)
        specials = torch.cat([eos, torch.tensor([self.config.pad_token_id], device=sequences.device)])
        outputs = sequences[:, 1:]
        output_ok = ~torch.isin(outputs, specials) & (torch.isin(outputs, eos).cumsum(dim=1) == 0)
        source_ok = mask.bool()
        if input_ids is not None:
            source_ok &= ~torch.isin(input_ids, specials)
        best = weights.masked_fill(~source_ok[:, None, :], -1.0).argmax(dim=-1)
        source_position = mask.long().cumsum(dim=1) - 1
        alignments = []
        for row in range(sequences.shape[0]):
            targets = output_ok[row].nonzero().flatten() if bool(source_ok[row].any()) else outputs.new_zeros(0)
            alignments.append(torch.stack([source_position[row, best[row, targets]], targets], dim=1).cpu())
        output["alignments"] = alignments
        return output

    def _resolved_config(self, generation_config: GenerationConfig | None) -> GenerationConfig:
        """The call's generation config: its own settings, then the model's, then Transformers' defaults."""
        config = copy.deepcopy(generation_config if generation_config is not None else self.generation_config)
        for source in (self.generation_config.to_dict(), GENERATION_DEFAULTS):
            for name, value in source.items():
                if getattr(config, name, None) is None:
                    setattr(config, name, value)
        return config

    def _handed_over_because(self, config: GenerationConfig, model_kwargs: dict) -> str | None:
        """Why this call needs Transformers' loop, or None when the decoder here runs it."""
        mode = config.get_generation_mode(model_kwargs.get("assistant_model"))
        if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.BEAM_SEARCH):
            return f"the {mode.value} mode"
        for name in HANDED_OVER_ARGUMENTS:
            if model_kwargs.get(name) is not None:
                return f"`{name}`"
        if model_kwargs.get("synced_gpus"):
            return "`synced_gpus` (FSDP/DeepSpeed ZeRO-3)"
        for name, off in HANDED_OVER_SETTINGS.items():
            if getattr(config, name, off) not in (off, None):
                return f"`{name}={getattr(config, name)!r}`"
        if config.use_cache is False:
            return "`use_cache=False`"
        if mode == GenerationMode.GREEDY_SEARCH and (config.output_scores or config.output_logits):
            return "greedy `output_scores`/`output_logits`"
        if config.num_return_sequences > config.num_beams:
            return "`num_return_sequences` > `num_beams`"
        if config.decoder_start_token_id is None and self.config.decoder_start_token_id is None:
            return "no `decoder_start_token_id`"
        return None

    def _source(self, model_kwargs: dict) -> Source:
        """The encoder output (computed here unless given), its padding mask and each source's length."""
        attention_mask = model_kwargs.get("attention_mask")
        input_ids = model_kwargs.get("input_ids")
        encoder_outputs = model_kwargs.get("encoder_outputs")
        pad = self.config.pad_token_id
        if attention_mask is None and input_ids is not None and pad is not None and pad != self.config.eos_token_id:
            if bool((input_ids == pad).any()):  # Transformers infers the mask the same way
                attention_mask = input_ids.ne(pad).long()
        candidates = (encoder_outputs, input_ids, model_kwargs.get("inputs_embeds"))
        given = next((x for x in candidates if x is not None), None)
        if given is None:
            raise ValueError("generate() needs the source: `input_ids` (with `attention_mask`) or `encoder_outputs`.")
        shape = (given[0] if isinstance(given, (tuple, BaseModelOutput)) else given).shape[:2]
        if attention_mask is not None:
            lengths = attention_mask.sum(-1).long().cpu()
        else:
            lengths = torch.full((shape[0],), shape[1], dtype=torch.long)
        return Source(input_ids, attention_mask, encoder_outputs, lengths)

    def _encode(self, source: Source) -> torch.Tensor:
        if source.encoder_outputs is None:
            return self.get_encoder()(input_ids=source.input_ids, attention_mask=source.attention_mask)[0]
        return source.encoder_outputs[0]

    def _settings(self, config: GenerationConfig, limits, penalty_type: str, logits_processor,
                  batch: int) -> DecodingSettings:  # fmt: skip
        eos = config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        pad = config.pad_token_id
        start = config.decoder_start_token_id
        start = self.config.decoder_start_token_id if start is None else start
        start = start[0] if isinstance(start, (list, tuple)) else start
        max_new = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - 1
        if limits is not None:
            max_new = int(limits.max())
        batch_limits = limits if limits is not None else torch.full((batch,), max_new, dtype=torch.long)
        min_new = max((config.min_length or 0) - 1, config.min_new_tokens or 0) if eos else 0
        eos_tensor = torch.tensor(eos, dtype=torch.long)
        return DecodingSettings(
            num_beams=config.num_beams,
            num_return_sequences=config.num_return_sequences if config.num_beams > 1 else 1,
            max_new_tokens=max(max_new, 1),
            limits=batch_limits,
            min_new_tokens=min_new,
            eos=eos_tensor,
            forced_eos=config.forced_eos_token_id
            if not isinstance(config.forced_eos_token_id, list)
            else config.forced_eos_token_id[0],
            limit_eos=eos[0] if limits is not None and eos else None,
            forced_bos=config.forced_bos_token_id,
            start=start,
            # Transformers' fill values: greedy pads finished rows, beam search uses `pad or eos`
            fill=(pad if pad is not None else eos[0]) if config.num_beams == 1 else ((pad or eos[0]) if eos else -1),
            length_penalty=config.length_penalty,
            gnmt=penalty_type == "gnmt",
            early_stopping=config.early_stopping,
            suppress=torch.tensor(config.suppress_tokens, dtype=torch.long) if config.suppress_tokens else None,
            bad_words=NoBadWordsLogitsProcessor(config.bad_words_ids, eos_tensor) if config.bad_words_ids else None,
            user_processors=LogitsProcessorList(logits_processor or []),
            renormalize=bool(config.renormalize_logits) and config.num_beams > 1,  # greedy's argmax is the same
            return_dict=bool(config.return_dict_in_generate),
            output_scores=bool(config.output_scores),
            output_logits=bool(config.output_logits),
        )

    def _decoding_state(self, hidden: torch.Tensor, mask: torch.Tensor | None, rows_per_example: int):
        """What the searches step: this model's decoder (another engine's runner gives its own, vaswani_hf.onnx)."""
        return DecodingState(self, hidden, mask, rows_per_example)

    def _decode(self, config, model_kwargs, source, limits, penalty_type, logits_processor, lexical, shortlist=None,
                sequence_scores=False):  # fmt: skip
        settings = self._settings(config, limits, penalty_type, logits_processor, batch=source.lengths.shape[0])
        settings.sequence_scores = sequence_scores
        lexical.apply(settings)
        hidden = self._encode(source)
        mask = source.attention_mask.to(self.device) if source.attention_mask is not None else None
        state = self._decoding_state(hidden, mask, settings.num_beams)
        if settings.constraints is not None:
            search = constrained_beam_search
        else:
            search = beam_search if settings.num_beams > 1 else greedy_search
        searched = settings
        if shortlist is not None:
            if not hasattr(state, "restrict"):
                raise ValueError(f"generate(vocabulary_shortlist=...) restricts a PyTorch model's output layer: "
                                 f"{type(self).__name__} has none to restrict.")  # fmt: skip
            allowed = settings.vocabulary_with(torch.as_tensor(shortlist, dtype=torch.long))
            within = search is not constrained_beam_search and settings.searches_within(allowed.numel())
            state.restrict(allowed, within)
            searched = settings.within(allowed) if within else settings
        with state.searching() if hasattr(state, "searching") else contextlib.nullcontext():
            result = search(searched, state)
        if searched is not settings:  # columns of the shortlist back to token ids (-1, "no fill", stays)
            columns = result["sequences"]
            result["sequences"] = torch.where(columns >= 0, state.shortlist[columns.clamp(min=0)], columns)
        length = max(int(result["lengths"].max()), 1)
        start = torch.full((result["sequences"].shape[0], 1), settings.start, dtype=torch.long, device=self.device)
        sequences = torch.cat([start, result["sequences"][:, :length]], dim=1)
        if not settings.return_dict:
            return sequences
        if settings.num_beams == 1:
            return GenerateEncoderDecoderOutput(sequences=sequences)
        return GenerateBeamEncoderDecoderOutput(
            sequences=sequences,
            sequences_scores=result["scores"] if settings.output_scores or settings.sequence_scores else None,
            scores=result.get("step_scores"),
            logits=result.get("step_logits"),
            beam_indices=result["beam_indices"][:, :length] if "beam_indices" in result else None,
        )
