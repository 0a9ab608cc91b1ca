# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""One decoding step of section 3.1's decoder, the same operators as the model's layers without the module calls
around them: for the CPU searches, where one new token per row makes each operator microseconds of arithmetic and
the Python around it (module calls, Transformers' mask builders and output capture, configuration reads) as long.

What it computes is the decoder's own forward for one token per row: the same weights, the same linears (each
layer's own `forward`, so the fast products' binding of the decoder's linears applies), the same
`F.scaled_dot_product_attention`, `F.layer_norm` and activation, in the same order, over the same caches
(`cache.update` appends to the decoder's self-attention cache; the cross-attention's keys and values are projected
at the first step into the cross-attention cache, as the layer does), so the hidden states are the same bits
(tests/test_lean_step.py draws models, batches, beams and padding, and compares them with the module path and the
searches' tokens and scores).

It steps only where that holds, and the decoder's own forward runs otherwise (`LeanStep.plan` is None): every
decoder module in eval mode, no gradient recorded; Transformers' own sdpa attention (eager attention builds a mask
at every step; flash and flex take one encoder row per decoder row; a user may register another function as
"sdpa"); no decoder module whose call does more than its class's `forward` (`_wrapped`: hooks, a `forward` replaced
on the instance as Accelerate's offloading does, a compiled call); the decoder's layers, sub-layer connections and
attention of this package's own classes.
It is exact, not chosen by stopwatch, so the CPU searches take it with the fast products on (`FastCpuProducts`) or
off (`LeanProducts`). Switch: `VASWANI_LEAN_STEP=0`.
Part of the installed package, not of a checkpoint's remote code (`speed/__init__.py` plugs it into generate()).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.modules import module as torch_module
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..decoding_state_vaswani import DecodingState, ModelProducts
from ..generation_vaswani import switched_off
from ..modeling_vaswani import (
    VaswaniDecoderLayer,
    VaswaniMultiHeadAttention,
    VaswaniPositionwiseFeedForward,
    VaswaniSublayerConnection,
)
from . import step_threads


@dataclass(frozen=True)
class _Norm:
    """A sub-layer connection's layer normalisation, read once per search: (normalized shape, weight, bias, eps)."""

    shape: tuple[int, ...]
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float
    pre: bool

    @classmethod
    def of(cls, connection: VaswaniSublayerConnection) -> _Norm:
        return cls(tuple(connection.normalized_shape), connection.weight, connection.bias, connection.eps,
                   connection.pre_norm)  # fmt: skip

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(hidden, self.shape, self.weight, self.bias, self.eps)

    def sublayer_input(self, hidden: torch.Tensor) -> torch.Tensor:
        return self(hidden) if self.pre else hidden

    def connect(self, residual: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        hidden = residual + sublayer_output  # dropout is the identity in eval mode
        return hidden if self.pre else self(hidden)


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's modules and constants, read once per search."""

    self_attn: VaswaniMultiHeadAttention
    self_norm: _Norm
    cross_attn: VaswaniMultiHeadAttention
    cross_norm: _Norm
    feed_forward: VaswaniPositionwiseFeedForward
    final_norm: _Norm


def _wrapped(modules: list[torch.nn.Module]) -> bool:
    """Whether a module's call does anything but its class's `forward`, which the lean step would skip: a forward
    hook or pre-hook (its own or a global one), a `forward` replaced on the instance (Accelerate's offloading
    `_hf_hook`, a tracer, a user's wrapper; the fast products' re-binding of a linear computes the same and is
    kept), a compiled call (`module.compile()`), or a module in training mode (its dropout)."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(
        m.training
        or m._forward_hooks
        or m._forward_pre_hooks
        or getattr(m, "_compiled_call_impl", None) is not None
        or hasattr(m, "_hf_hook")
        or ("forward" in vars(m) and not getattr(m.forward, "fast_product", False))
        for m in modules
    )


class LeanStep:
    """The decoder's step for one search's `DecodingState`, or None (`plan`) where the module path must run."""

    def __init__(self, model, layers: list[_Layer], final_norm: torch.nn.LayerNorm | None) -> None:
        decoder = model.get_decoder()
        self.embed_tokens = decoder.embed_tokens
        self.embed_scale = decoder.embed_scale
        self.embed_positions = decoder.embed_positions
        self.layers = layers
        self.final_norm = final_norm

    @classmethod
    def plan(cls, model) -> LeanStep | None:
        # a module in training mode (its dropout) is found among the decoder's by `_wrapped`
        if switched_off("VASWANI_LEAN_STEP") or torch.is_grad_enabled():
            return None
        sdpa = ALL_ATTENTION_FUNCTIONS.get("sdpa")
        if model.config._attn_implementation != "sdpa" or sdpa is not sdpa_attention_forward:
            return None  # another attention, or a user's function registered as "sdpa"
        decoder = model.get_decoder()
        if _wrapped(list(decoder.modules())):
            return None
        layers = []
        for index, layer in enumerate(decoder.layers):
            if not (
                type(layer) is VaswaniDecoderLayer
                and type(layer.self_attn) is VaswaniMultiHeadAttention
                and type(layer.encoder_attn) is VaswaniMultiHeadAttention
                and type(layer.feed_forward) is VaswaniPositionwiseFeedForward
                and all(
                    type(norm) is VaswaniSublayerConnection
                    for norm in (layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm)
                )
                and layer.self_attn.layer_idx == index == layer.encoder_attn.layer_idx
            ):
                return None
            layers.append(_Layer(layer.self_attn, _Norm.of(layer.self_attn_layer_norm), layer.encoder_attn,
                                 _Norm.of(layer.encoder_attn_layer_norm), layer.feed_forward,
                                 _Norm.of(layer.final_layer_norm)))  # fmt: skip
        final_norm = decoder.layer_norm
        if final_norm is not None and type(final_norm) is not torch.nn.LayerNorm:
            return None
        return cls(model, layers, final_norm)

    def __call__(self, state: DecodingState, tokens: torch.LongTensor) -> torch.Tensor:
        """(rows,) newest token ids -> (rows, d_model) final hidden states, the decoder's forward for one token."""
        cache = state.cache
        self_cache = cache.self_attention_cache
        start = self_cache.get_seq_length()
        embedded = self.embed_tokens.forward(tokens[:, None]) * self.embed_scale
        hidden = self.embed_positions.forward(embedded, start=start)
        for layer in self.layers:
            attended = self._self_attention(layer.self_attn, layer.self_norm.sublayer_input(hidden), self_cache)
            hidden = layer.self_norm.connect(hidden, attended)
            attended = self._cross_attention(layer.cross_attn, layer.cross_norm.sublayer_input(hidden), state)
            hidden = layer.cross_norm.connect(hidden, attended)
            ffn = layer.feed_forward
            transformed = ffn.fc2.forward(ffn.activation_fn(ffn.fc1.forward(layer.final_norm.sublayer_input(hidden))))
            hidden = layer.final_norm.connect(hidden, transformed)
        if self.final_norm is not None:
            hidden = self.final_norm.forward(hidden)
        return hidden[:, -1]

    @staticmethod
    def _self_attention(attn: VaswaniMultiHeadAttention, hidden: torch.Tensor, self_cache) -> torch.Tensor:
        rows = hidden.shape[0]
        query, key, value = attn._split_heads(attn.qkv_proj.forward(hidden), 3)
        key, value = self_cache.update(key, value, attn.layer_idx)
        # one query per row attends to every cached position: no mask (sdpa_attention_forward's is_causal is
        # False for one query)
        output = F.scaled_dot_product_attention(query, key, value, scale=attn.scaling)
        return attn.out_proj.forward(output.transpose(1, 2).reshape(rows, 1, -1))

    @staticmethod
    def _cross_attention(attn: VaswaniMultiHeadAttention, hidden: torch.Tensor, state: DecodingState) -> torch.Tensor:
        rows = hidden.shape[0]
        # the state's padding mask is (sources, 1, 1, source length): one query row, shared by every query
        encoder_hidden, mask = state.encoder_hidden, state.encoder_mask
        sources = encoder_hidden.shape[0]
        per_source = rows // sources  # beam search's rows of one source attend as one batch row (`fold_beams`)
        (query,) = attn._split_heads(attn.q_proj.forward(hidden.reshape(sources, per_source, -1)), 1)
        cache = state.cache
        if cache.is_updated.get(attn.layer_idx):
            layer = cache.cross_attention_cache.layers[attn.layer_idx]
            key, value = layer.keys, layer.values
        else:  # every source token projected: on the caller's threads where a search of few rows put it on one
            sources = encoder_hidden.shape[0] * encoder_hidden.shape[1]
            with step_threads.callers_threads_for(sources, encoder_hidden.shape[2]):
                key, value = attn._split_heads(attn.kv_proj.forward(encoder_hidden), 2)
            key, value = cache.cross_attention_cache.update(key, value, attn.layer_idx)
            cache.is_updated[attn.layer_idx] = True
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=attn.scaling)
        return attn.out_proj.forward(output.transpose(1, 2).reshape(rows, 1, -1))


def decoder_step(state: DecodingState, tokens: torch.LongTensor) -> torch.Tensor:
    """The CPU searches' decoder step (`FastCpuProducts`, `LeanProducts`): `LeanStep` where it holds for this
    search, the model's own otherwise."""
    lean = state.__dict__.get("_lean_step", False)
    if lean is False:  # planned at a search's first step
        lean = state._lean_step = LeanStep.plan(state.model)
    if lean is None:
        return ModelProducts.decoder_step(state, tokens)
    return lean(state, tokens)


class LeanProducts(ModelProducts):
    """The model's own products with the lean decoder step: the products of CPU searches whose fast products are
    off (`generate(cpu_fast_paths=False)`, a one-batch `vaswani translate`), the same bits as `ModelProducts`."""

    decoder_step = staticmethod(decoder_step)
