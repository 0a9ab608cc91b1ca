# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Transformers model.

Each class names the paper section it implements. The structure follows Transformers' Marian (v5 attention
interface, `EncoderDecoderCache`, masking utilities, output capturing); the numerics follow the paper: post-norm
residual blocks without a final stack norm, interleaved sinusoids, embeddings scaled by sqrt(d_model) and shared
three ways, beam search with GNMT's length penalty and a per-example output limit of source length + 50.

Shipped as Hub remote code: imports only torch, transformers and the other `*_vaswani.py` files. No `from __future__
import annotations`: Transformers reads `**kwargs: Unpack[TransformersKwargs]` at run time to know that `forward()`
returns attentions, and a string annotation reads as "it cannot".
"""

import math
from collections.abc import Callable

import torch
import torch.utils.checkpoint
from torch import nn
from torch.nn import functional as F
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.models.bart.modeling_bart import eager_attention_forward, shift_tokens_right
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vaswani import VaswaniConfig
from .decoding_state_vaswani import fold_beams, unfold_beams
from .generation_vaswani import VaswaniGenerationMixin
from .remote_code_vaswani import VaswaniRemoteCodeMixin
from .search_vaswani import PAPER_GENERATION_DEFAULTS
from .validation_vaswani import check_labels, check_source, check_target

# Transformers 5.24 renamed the key/value cache from `past_key_values` to `cache`, in forward arguments and output
# fields; 5.20-5.23 pass and read only the old name. The model's forwards take either and write the field the
# installed release has (an output built with the other name would warn or fail).
CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


def takes_old_cache_name(forward: Callable) -> Callable:
    """From Transformers 5.24 on, `past_key_values=` warns that it is deprecated and arrives as `cache`, as in
    Transformers' own models; before, it is the name Transformers' loop passes, taken without a warning."""
    if CACHE_FIELD == "cache":
        return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")(forward)
    return forward


class VaswaniFusedLinear(nn.Linear):
    """`blocks` equal-sized projections of one input computed as one matrix product (section 3.2.2's W^Q, W^K, W^V).

    Kept as a type of its own so initialisation treats each block as the separate d_model x (h d_k) matrix
    the paper describes.
    """

    def __init__(self, in_features: int, out_features_per_block: int, blocks: int, bias: bool = True):
        super().__init__(in_features, out_features_per_block * blocks, bias=bias)
        self.blocks = blocks


class VaswaniMultiHeadAttention(nn.Module):
    """Section 3.2: multi-head scaled dot-product attention, softmax(Q K^T / sqrt(d_k)) V over h heads.

    Self-attention projects Q, K and V with one fused matrix; cross-attention projects K and V of the encoder
    output once per sequence and keeps them in the `EncoderDecoderCache`.
    """

    def __init__(
        self,
        config: VaswaniConfig,
        num_heads: int,
        is_cross_attention: bool = False,
        is_causal: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.attention_head_size(num_heads)
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.is_cross_attention = is_cross_attention
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        inner_dim = num_heads * self.head_dim
        if is_cross_attention:
            self.q_proj = nn.Linear(config.d_model, inner_dim)
            self.kv_proj = VaswaniFusedLinear(config.d_model, inner_dim, blocks=2)
        else:
            self.qkv_proj = VaswaniFusedLinear(config.d_model, inner_dim, blocks=3)
        self.out_proj = nn.Linear(inner_dim, config.d_model)

    def _split_heads(self, projected: torch.Tensor, blocks: int) -> tuple[torch.Tensor, ...]:
        # (batch, length, blocks * h * d_k) -> `blocks` tensors of (batch, h, length, d_k)
        batch, length = projected.shape[:2]
        return projected.view(batch, length, blocks, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        if not self.is_cross_attention:
            query, key, value = self._split_heads(self.qkv_proj(hidden_states), 3)
            if cache is not None:
                self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
                key, value = self_cache.update(key, value, self.layer_idx)
        else:
            hidden_states, attention_mask = fold_beams(hidden_states, key_value_states, attention_mask)
            (query,) = self._split_heads(self.q_proj(hidden_states), 1)
            cross_cache = cache if isinstance(cache, EncoderDecoderCache) else None
            if cross_cache is not None and cross_cache.is_updated.get(self.layer_idx):
                layer = cross_cache.cross_attention_cache.layers[self.layer_idx]
                key, value = layer.keys, layer.values
            else:
                key, value = self._split_heads(self.kv_proj(key_value_states), 2)
                if cross_cache is not None:
                    key, value = cross_cache.cross_attention_cache.update(key, value, self.layer_idx)
                    cross_cache.is_updated[self.layer_idx] = True

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        dtype = query.dtype
        if dtype == torch.bfloat16 and query.device.type == "cpu" and torch.is_grad_enabled():
            # torch's bf16 attention backward on CPU is several times slower than fp32 (and less exact)
            query, key, value = query.float(), key.float(), value.float()
        attn_output, attn_weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).to(dtype)
        return self.out_proj(attn_output), unfold_beams(attn_weights, input_shape)


class VaswaniPositionwiseFeedForward(nn.Module):
    """Section 3.3: FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately."""

    def __init__(self, config: VaswaniConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = F.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


class VaswaniSublayerConnection(nn.LayerNorm):
    """Sections 3.1 and 5.4: the residual connection around a sub-layer with its layer normalisation and dropout.

    Post-norm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (ablation): x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, config: VaswaniConfig):
        super().__init__(config.d_model, eps=config.layer_norm_eps)
        self.dropout = config.dropout
        self.pre_norm = config.norm_position == "pre"

    def sublayer_input(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().forward(hidden_states) if self.pre_norm else hidden_states

    def forward(self, residual: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        hidden_states = residual + F.dropout(sublayer_output, p=self.dropout, training=self.training)
        return hidden_states if self.pre_norm else super().forward(hidden_states)


class VaswaniSinusoidalPositionalEncoding(nn.Module):
    """Section 3.5: fixed sinusoids added to the scaled embeddings, then dropout (section 5.4).

    Layout "sinusoidal": PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), as in the paper.
    Layout "sinusoidal_split": all sines, then all cosines, as in Marian.
    Layout "sinusoidal_fairseq": fairseq's (and FSMT's) table: sines then cosines of pos * 10000^(-k/(d/2 - 1)),
    k = 0 .. d/2 - 1, where the first token is row pad_token_id + 1 (fairseq's `make_positions`).
    The table is a non-persistent buffer: recomputed at load, never saved, extended past
    `max_position_embeddings` when a longer sequence arrives. Its row 0 is always the first token's.
    """

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.dim = config.d_model
        self.layout = config.position_embedding_type
        # fairseq numbers positions from padding_idx + 1: the table starts there, so every caller indexes from 0
        self.offset = config.pad_token_id + 1 if self.layout == "sinusoidal_fairseq" else 0
        self.dropout = config.dropout
        self.register_buffer("table", self.compute_table(config.max_position_embeddings), persistent=False)

    def compute_table(self, num_positions: int, device: torch.device | None = None) -> torch.Tensor:
        # float64 so the table is exact to float32 precision even for long positions
        positions = self.offset + torch.arange(num_positions, dtype=torch.float64, device=device)[:, None]
        if self.layout == "sinusoidal_fairseq":
            half = self.dim // 2
            exponents = torch.arange(half, dtype=torch.float64, device=device) / (half - 1)
        else:
            exponents = torch.arange(0, self.dim, 2, dtype=torch.float64, device=device) / self.dim
        angles = positions * 10000.0**-exponents
        if self.layout == "sinusoidal":
            table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)
        else:
            table = torch.cat([angles.sin(), angles.cos()], dim=-1)
        return table.to(torch.float32)

    def cover(self, num_positions: int) -> None:
        """Extend the table to `num_positions` rows ahead of a static cache's steps, whose gather cannot extend it."""
        if num_positions > self.table.shape[0]:
            self.table = self.compute_table(num_positions, self.table.device)

    def encodings(self, start: int | torch.Tensor, length: int) -> torch.Tensor:
        if isinstance(start, torch.Tensor):  # a static cache's length (torch.compile, CUDA graphs): gather, no
            # data-dependent slice, so the table must already reach the cache's end (`cover`)
            return self.table[start + torch.arange(length, device=self.table.device)]
        end = start + length
        if end > self.table.shape[0]:
            return self.compute_table(end, self.table.device)[start:end]
        return self.table[start:end]

    def forward(self, scaled_embeddings: torch.Tensor, start: int | torch.Tensor = 0) -> torch.Tensor:
        positions = self.encodings(start, scaled_embeddings.shape[1]).to(scaled_embeddings.dtype)
        return F.dropout(scaled_embeddings + positions, p=self.dropout, training=self.training)


class VaswaniLearnedPositionalEmbedding(nn.Embedding):
    """Section 3.5 / Table 3 row (E): learned positional embeddings instead of sinusoids, then dropout."""

    def __init__(self, config: VaswaniConfig):
        super().__init__(config.max_position_embeddings, config.d_model)
        self.dropout = config.dropout

    def cover(self, num_positions: int) -> None:
        """Nothing: a learned table cannot grow, and generate() ends a search at the table's end (a static cache
        may be longer than the steps it is used for)."""

    def forward(self, scaled_embeddings: torch.Tensor, start: int | torch.Tensor = 0) -> torch.Tensor:
        length = scaled_embeddings.shape[1]
        if isinstance(start, torch.Tensor):  # a static cache's length (torch.compile): gather, no data-dependent slice
            positions = self.weight[start + torch.arange(length, device=self.weight.device)]
        else:
            if start + length > self.num_embeddings:
                raise ValueError(
                    f"Sequence of {start + length} positions is longer than max_position_embeddings="
                    f"{self.num_embeddings} of this model's learned positions. Truncate the input or use a sinusoidal "
                    "model, which has no limit."
                )
            positions = self.weight[start : start + length]
        return F.dropout(
            scaled_embeddings + positions.to(scaled_embeddings.dtype), p=self.dropout, training=self.training
        )


def positional_encoding(config: VaswaniConfig) -> nn.Module:
    if config.position_embedding_type == "learned":
        return VaswaniLearnedPositionalEmbedding(config)
    return VaswaniSinusoidalPositionalEncoding(config)


class VaswaniEncoderLayer(GradientCheckpointingLayer):
    """Section 3.1, encoder: multi-head self-attention, then the feed-forward network, each in a residual block."""

    def __init__(self, config: VaswaniConfig, layer_idx: int | None = None):
        super().__init__()
        self.self_attn = VaswaniMultiHeadAttention(config, config.encoder_attention_heads, layer_idx=layer_idx)
        self.self_attn_layer_norm = VaswaniSublayerConnection(config)
        self.feed_forward = VaswaniPositionwiseFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = VaswaniSublayerConnection(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attended, _ = self.self_attn(
            self.self_attn_layer_norm.sublayer_input(hidden_states), attention_mask=attention_mask, **kwargs
        )
        hidden_states = self.self_attn_layer_norm(hidden_states, attended)
        transformed = self.feed_forward(self.final_layer_norm.sublayer_input(hidden_states))
        return self.final_layer_norm(hidden_states, transformed)


class VaswaniDecoderLayer(GradientCheckpointingLayer):
    """Section 3.1, decoder: masked self-attention, attention over the encoder output, then the feed-forward
    network, each in a residual block."""

    def __init__(self, config: VaswaniConfig, layer_idx: int | None = None):
        super().__init__()
        heads = config.decoder_attention_heads
        self.self_attn = VaswaniMultiHeadAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = VaswaniSublayerConnection(config)
        self.encoder_attn = VaswaniMultiHeadAttention(config, heads, is_cross_attention=True, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = VaswaniSublayerConnection(config)
        self.feed_forward = VaswaniPositionwiseFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = VaswaniSublayerConnection(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attended, _ = self.self_attn(
            self.self_attn_layer_norm.sublayer_input(hidden_states),
            attention_mask=attention_mask,
            cache=cache,
            **kwargs,
        )
        hidden_states = self.self_attn_layer_norm(hidden_states, attended)
        if encoder_hidden_states is not None:
            attended, _ = self.encoder_attn(
                self.encoder_attn_layer_norm.sublayer_input(hidden_states),
                key_value_states=encoder_hidden_states,
                attention_mask=encoder_attention_mask,
                cache=cache,
                **kwargs,
            )
            hidden_states = self.encoder_attn_layer_norm(hidden_states, attended)
        transformed = self.feed_forward(self.final_layer_norm.sublayer_input(hidden_states))
        return self.final_layer_norm(hidden_states, transformed)


class VaswaniPreTrainedModel(VaswaniRemoteCodeMixin, PreTrainedModel):
    config: VaswaniConfig
    config_class = VaswaniConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VaswaniEncoderLayer", "VaswaniDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The paper does not state an initialisation; `init_std=None` follows the reference code bases
        (Xavier-uniform per projection, N(0, d_model^-0.5) embeddings), a float gives N(0, init_std)."""
        std = self.config.init_std
        if isinstance(module, nn.Embedding):  # token embeddings and learned positions
            init.normal_(module.weight, mean=0.0, std=self.config.embedding_init_std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            if std is None:
                fan_out = module.out_features // getattr(module, "blocks", 1)
                bound = math.sqrt(6.0 / (module.in_features + fan_out))
                init.uniform_(module.weight, -bound, bound)
            else:
                init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, VaswaniSinusoidalPositionalEncoding):
            init.copy_(module.table, module.compute_table(module.table.shape[0]))
        elif isinstance(module, VaswaniForConditionalGeneration) and module.final_logits_bias is not None:
            init.zeros_(module.final_logits_bias)

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Transformers' resize, plus what it does not know of: the untied target embedding and the output bias."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        rows = embeddings.num_embeddings
        model = getattr(self, "model", self)
        if isinstance(model, VaswaniModel) and model.decoder.embed_tokens.num_embeddings != rows:
            model.decoder.embed_tokens = self._get_resized_embeddings(
                model.decoder.embed_tokens, rows, mean_resizing=mean_resizing
            )
        bias = getattr(self, "final_logits_bias", None)
        if bias is not None and bias.shape[0] != rows:
            resized = bias.new_zeros(rows)  # new tokens start without a bias, like Marian's resize
            kept = min(rows, bias.shape[0])
            resized[:kept] = bias.detach()[:kept]
            self.final_logits_bias = nn.Parameter(resized, requires_grad=bias.requires_grad)
        return embeddings


class VaswaniStack(VaswaniPreTrainedModel):
    """Sections 3.1, 3.4, 3.5: what both stacks share: scaled token embeddings plus positions, N layers, and
    (pre-norm only) a final LayerNorm; the paper's post-norm stack has none."""

    def __init__(self, config: VaswaniConfig, layer_class: type[nn.Module], num_layers: int):
        super().__init__(config)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = positional_encoding(config)
        self.layers = nn.ModuleList([layer_class(config, i) for i in range(num_layers)])
        self.layer_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_position == "pre" else None
        )
        self.gradient_checkpointing = False
        self.post_init()


class VaswaniEncoder(VaswaniStack):
    """Section 3.1: the encoder stack of N identical layers over the embedded and position-encoded source."""

    _can_record_outputs = {
        "hidden_states": VaswaniEncoderLayer,
        "attentions": VaswaniMultiHeadAttention,
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config, VaswaniEncoderLayer, config.encoder_layers)

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        check_source(self.config, input_ids, inputs_embeds, attention_mask)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = self.embed_positions(inputs_embeds * self.embed_scale)
        # while training, no look at the mask's contents (whether it masks anything) from the host: that read
        # would wait for the card every step, and token batches hold padding anyway
        attention_mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds,
                                                   attention_mask=attention_mask,
                                                   allow_is_bidirectional_skip=not self.training)  # fmt: skip
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VaswaniDecoder(VaswaniStack):
    """Section 3.1: the decoder stack of N identical layers, attending causally to the target prefix and to the
    encoder output."""

    _can_record_outputs = {
        "hidden_states": VaswaniDecoderLayer,
        "attentions": OutputRecorder(VaswaniMultiHeadAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VaswaniMultiHeadAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config, VaswaniDecoderLayer, config.decoder_layers)

    @merge_with_config_defaults
    @capture_outputs
    @takes_old_cache_name
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        cache = cache if cache is not None else past_key_values  # the name before Transformers 5.24
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        check_target(self.config, input_ids, inputs_embeds, attention_mask, past_length)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        self_attn_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        if isinstance(past_length, torch.Tensor):  # a static cache (Transformers' static loop, the graph search)
            self.embed_positions.cover(self_attn_cache.get_max_length())
        hidden_states = self.embed_positions(inputs_embeds * self.embed_scale, start=past_length)

        # the cache is passed by position: its keyword is `past_key_values` before Transformers 5.24, `cache` after
        causal_mask = create_causal_mask(self.config, inputs_embeds, attention_mask, self_attn_cache)
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
            allow_is_bidirectional_skip=not self.training,  # as in the encoder
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, so gradient checkpointing sees it
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                **kwargs,
            )
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, **{CACHE_FIELD: cache})


class VaswaniModel(VaswaniPreTrainedModel):
    """Section 3: the encoder-decoder, without the output projection. `shared` is the source embedding; with
    `tie_word_embeddings` (the paper, section 3.4) the target embedding is the same matrix."""

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self._tied_weights_keys = {"encoder.embed_tokens.weight": "shared.weight"}
        if config.tie_word_embeddings:
            self._tied_weights_keys["decoder.embed_tokens.weight"] = "shared.weight"
        self.encoder = VaswaniEncoder(config)
        self.decoder = VaswaniDecoder(config)
        if not config.tie_word_embeddings:
            # Transformers ties nothing when `tie_word_embeddings=False`, but the encoder must still read `shared`
            # (what `get_input_embeddings()` returns and resizes): give it the module itself.
            self.encoder.embed_tokens = self.shared
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def get_decoder_input_embeddings(self) -> nn.Embedding:
        """The target embedding: `shared` itself unless `tie_word_embeddings=False`."""
        return self.decoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        self.encoder.embed_tokens = value
        if self.config.tie_word_embeddings:
            self.decoder.embed_tokens = value

    @can_return_tuple
    @takes_old_cache_name
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        r"""
        decoder_input_ids (`torch.LongTensor` of shape `(batch_size, target_sequence_length)`, *optional*):
            The target prefix, starting with `config.decoder_start_token_id`. Built from `labels` by
            [`VaswaniForConditionalGeneration`] when only labels are given.
        decoder_attention_mask (`torch.Tensor` of shape `(batch_size, target_sequence_length)`, *optional*):
            Padding mask of the target prefix; the causal mask is always applied.
        """
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache if cache is not None else past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{CACHE_FIELD: getattr(decoder_outputs, CACHE_FIELD)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class VaswaniForConditionalGeneration(VaswaniPreTrainedModel, VaswaniGenerationMixin, GenerationMixin):
    """Sections 3 and 3.4: the encoder-decoder with the pre-softmax linear projection (shared with the embeddings),
    and the paper's decoding (section 6.1) as its `generate()` defaults.

    Decoding defaults, stored in `generation_config` (`generation_config.json` beside the weights):
    beam 4, GNMT length penalty ((5 + |Y|) / 6) ** 0.6 (`length_penalty_type="gnmt"`; "hf" gives Transformers'
    |Y| ** length_penalty), at most source length + 50 output tokens per example (`max_length_offset=50`; it
    applies unless the call passes `max_length`/`max_new_tokens` or the generation config sets `max_new_tokens`;
    `None` returns to Transformers' `max_length`), and early stopping once no running beam can beat the best finished
    hypothesis (tensor2tensor's rule). The search itself is `search_vaswani.py`.
    """

    _keys_to_ignore_on_load_missing = ["final_logits_bias"]

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.final_logits_bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.output_bias else None
        self._tied_weights_keys = {"model.encoder.embed_tokens.weight": "model.shared.weight"}
        if config.tie_word_embeddings:
            self._tied_weights_keys.update(
                {"lm_head.weight": "model.shared.weight", "model.decoder.embed_tokens.weight": "model.shared.weight"}
            )
        self.post_init()
        for key, value in PAPER_GENERATION_DEFAULTS.items():
            setattr(self.generation_config, key, value)
        # These are our decoding defaults, not values derived from the model config: keep them on reload.
        self.generation_config._from_model_config = False

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    def output_projection(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Section 3.4: the pre-softmax linear transformation (the shared embedding matrix), plus the output bias of
        converted Marian models."""
        if self.final_logits_bias is None or not isinstance(self.lm_head, nn.Linear):
            logits = self.lm_head(hidden_states)
            return logits if self.final_logits_bias is None else logits + self.final_logits_bias
        # one addmm instead of a matmul and a pass over (tokens x vocabulary) to add the bias
        return F.linear(hidden_states, self.lm_head.weight, self.final_logits_bias)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: the target shifted right behind `decoder_start_token_id` (-100 becomes padding)."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @can_return_tuple
    @takes_old_cache_name
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_sequence_length)`, *optional*):
            Target token ids, -100 for positions to ignore. They are not shifted: `logits[:, i]` predicts
            `labels[:, i]`, and `decoder_input_ids` are built from them when not given. The loss is the mean
            cross-entropy over non-ignored tokens; when Trainer passes `num_items_in_batch` (gradient accumulation)
            it is the sum divided by that count instead. A `label_smoothing` keyword (a float in [0, 1)) smooths
            it, as `VaswaniTrainer` does for training steps. A `loss_chunk_rows` keyword computes the loss that many
            target positions at a time without returning logits (`chunked_translation_loss`).
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        label_smoothing = kwargs.pop("label_smoothing", 0.0)
        loss_chunk_rows = kwargs.pop("loss_chunk_rows", None)
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs: Seq2SeqModelOutput = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache if cache is not None else past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        logits = loss = None
        if labels is not None and loss_chunk_rows:
            loss = self.chunked_translation_loss(outputs.last_hidden_state, labels, num_items_in_batch,
                                                 label_smoothing, loss_chunk_rows)  # fmt: skip
        else:
            logits = self.output_projection(outputs.last_hidden_state)
            if labels is not None:
                loss = self.translation_loss(logits, labels, num_items_in_batch, label_smoothing)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def translation_loss(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        num_items_in_batch: int | torch.Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> torch.Tensor:
        """Section 5.4: cross-entropy with label smoothing (uniform over the whole vocabulary, padding included,
        like `torch.nn.functional.cross_entropy` and Trainer's smoother); positions labelled -100 are ignored."""
        labels = labels.to(logits.device)
        check_labels(labels, logits.shape[-1])
        return self._per_item(_summed_cross_entropy(logits, labels, label_smoothing), labels, num_items_in_batch)

    def chunked_translation_loss(
        self,
        hidden_states: torch.Tensor,
        labels: torch.Tensor,
        num_items_in_batch: int | torch.Tensor | None = None,
        label_smoothing: float = 0.0,
        rows: int = 4096,
    ) -> torch.Tensor:
        """`translation_loss(output_projection(hidden_states), ...)` without the (tokens x vocabulary) float32 logits:
        target positions are projected and scored `rows` at a time, and each chunk's logits are recomputed in the
        backward pass (activation checkpointing), so one chunk's exist at a time. The same loss and gradients up to
        float rounding; a training speed-up (`--speedups chunked_loss`), off by default."""
        labels = labels.to(hidden_states.device)
        check_labels(labels, self.get_output_embeddings().weight.shape[0])
        hidden, flat = hidden_states.reshape(-1, hidden_states.shape[-1]), labels.reshape(-1)
        total = sum(
            torch.utils.checkpoint.checkpoint(self._chunk_loss, hidden[start : start + rows],
                                              flat[start : start + rows], label_smoothing, use_reentrant=False)
            for start in range(0, len(flat), rows)
        )  # fmt: skip
        return self._per_item(total, labels, num_items_in_batch)

    def _chunk_loss(self, hidden: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        return _summed_cross_entropy(self.output_projection(hidden), labels, label_smoothing)

    @staticmethod
    def _per_item(total: torch.Tensor, labels: torch.Tensor, num_items_in_batch) -> torch.Tensor:
        if num_items_in_batch is None:
            num_items_in_batch = (labels != -100).sum().clamp(min=1)
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch


def _summed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                           reduction="sum", label_smoothing=label_smoothing)  # fmt: skip


__all__ = ["VaswaniForConditionalGeneration", "VaswaniModel", "VaswaniPreTrainedModel"]
