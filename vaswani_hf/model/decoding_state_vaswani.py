# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""What a search steps: the decoder's state for the sentences still being decoded (encoder output, caches,
per-row tensors), one decoding step at a time, and the cache layer that follows beam search's surviving beams.

A `DecodingState` computes a step's products through one seam, its `products`: `ModelProducts` (below) calls the
model's own layers, the paper's arithmetic; `speed.fast_products.FastCpuProducts` gives the same logits faster
on CPU. `generate(cpu_fast_paths=False)` (or `VASWANI_CPU_FAST_PATHS=0`) keeps `ModelProducts`.
Shipped as Hub remote code: imports only torch, transformers and the files beside it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask

from .search_vaswani import IMPOSSIBLE


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


class ModelProducts:
    """A decoding step's products as the model defines them, the paper's arithmetic: the output layer's own
    forward, the decoder's own linears. `speed.fast_products.FastCpuProducts` is the same seam, faster on CPU."""

    @staticmethod
    def logits(model, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, d_model) -> float32 logits seen as (vocabulary, rows): the searches read them as `.t()`."""
        return model.output_projection(hidden).float().t()

    @staticmethod
    def greedy_logits(model, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(rows, vocabulary) logits and no floor: every score is exact."""
        return model.output_projection(hidden).float(), None

    @staticmethod
    def searching(model, rows: int) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @staticmethod
    def decoder_step(state: DecodingState, tokens: torch.LongTensor) -> torch.Tensor:
        """The decoder's own forward for the newest token of every row: (rows,) ids -> (rows, d_model)."""
        decoder_output = state.model.get_decoder()(
            input_ids=tokens[:, None],
            encoder_hidden_states=state.encoder_hidden,
            encoder_attention_mask=state.encoder_mask,
            cache=state.cache,
            use_cache=True,
        )
        return decoder_output.last_hidden_state[:, -1]


class DecodingState:
    """What the decoder keeps for the sentences still being decoded: encoder output, caches and per-row tensors.

    A finished sentence leaves the batch (`keep`): every tensor here and both caches drop its rows.
    """

    def __init__(self, model, encoder_hidden: torch.Tensor, source_mask: torch.Tensor | None, rows_per_example: int,
                 products: type[ModelProducts] | None = None):  # fmt: skip
        self.model = model
        self.products = products or ModelProducts
        self.rows_per_example = rows_per_example
        self.fold = model.config._attn_implementation in ("sdpa", "eager")
        if not self.fold:  # flash/flex attention take one encoder row per decoder row
            encoder_hidden = encoder_hidden.repeat_interleave(rows_per_example, dim=0)
            source_mask = source_mask.repeat_interleave(rows_per_example, 0) if source_mask is not None else None
        self.encoder_hidden = encoder_hidden
        self.source_mask = source_mask
        self.encoder_mask = self._encoder_mask()
        self.cache = EncoderDecoderCache(self._self_attention_cache(), self._cross_attention_cache())
        self.example_ids = torch.arange(encoder_hidden.shape[0] // (1 if self.fold else rows_per_example))
        self.shortlist: torch.LongTensor | None = None
        self.within = False

    def _self_attention_cache(self) -> DynamicCache:
        """The decoder self-attention cache: Transformers' own, whose layers follow beam search's survivors in one
        copy a step (`VaswaniBeamSearchCacheLayer`) when there are beams."""
        return self._cache(VaswaniBeamSearchCacheLayer if self.rows_per_example > 1 else DynamicLayer)

    def _cross_attention_cache(self) -> DynamicCache:
        """The cross-attention cache: keys and values of the encoder output, computed at the first step."""
        return self._cache(DynamicLayer)

    def _cache(self, layer_class: type[DynamicLayer]) -> DynamicCache:
        # one layer per decoder layer, given here: `DynamicCache(config=...)` would deep-copy the configuration at
        # every call of generate() to learn the same (about half a millisecond each)
        cache = DynamicCache()
        cache.layers[:] = [layer_class() for _ in range(self.model.config.decoder_layers)]
        return cache

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
        return self.products.decoder_step(self, tokens)

    def greedy_logits(self, tokens: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decoder step for greedy decoding: (rows, vocabulary) scores whose argmax is each row's next token,
        and the floors that tell where that argmax is exact (None: everywhere). Over the whole vocabulary the
        output weight may be read from a bf16 or int8 copy (the fast products' `greedy_logits`); `exact_logits()`
        then gives this step's exact logits."""
        if self.shortlist is not None:
            return self.logits(tokens).t(), None
        self.hidden = self._decoder_step(tokens)
        return self.products.greedy_logits(self.model, self.hidden)

    def exact_logits(self) -> torch.Tensor:
        """The exact (rows, vocabulary) logits of the step `greedy_logits` last ran."""
        return self.products.logits(self.model, self.hidden).t()

    def logits(self, tokens: torch.LongTensor) -> torch.Tensor:
        """One decoder step for the newest token of every row: (rows,) ids -> (vocabulary, rows) float32 logits."""
        hidden = self._decoder_step(tokens)
        if self.shortlist is None:
            return self.products.logits(self.model, hidden)
        scores = self.rows(hidden)
        if self.rows_bias is not None:
            scores += self.rows_bias
        if self.within:
            return scores.float()
        vocabulary = self.model.get_output_embeddings().out_features
        full = scores.new_full((vocabulary, hidden.shape[0]), IMPOSSIBLE, dtype=torch.float32)
        return full.index_copy_(0, self.shortlist, scores.float())

    def searching(self) -> contextlib.AbstractContextManager:
        """What holds while a search steps this state (the fast products bind the decoder's linears for its rows)."""
        rows = self.encoder_hidden.shape[0] * (self.rows_per_example if self.fold else 1)
        return self.products.searching(self.model, rows)

    def reorder(self, row_idx: torch.LongTensor) -> None:
        self.cache.self_attention_cache.reorder_cache(row_idx)

    def keep(self, examples: torch.Tensor) -> None:
        """Only the sentences in `examples` (indices into the current batch, on the host) go on."""
        self.example_ids = self.example_ids[examples]
        examples = examples.to(self.encoder_hidden.device)
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
