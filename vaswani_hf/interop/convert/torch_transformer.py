"""`torch.nn.Transformer` (post-norm, `norm_first=False`) -> `VaswaniForConditionalGeneration`.

`nn.Transformer` has no embeddings, positions or output layer, so the shared embedding matrix is passed in.
It also appends a LayerNorm after each stack, which the paper does not have: build it with
`custom_encoder`/`custom_decoder` whose `norm` is None (see tests/test_parity.py).
"""

from __future__ import annotations

import torch
from torch import nn

from ...model.configuration_vaswani import VaswaniConfig
from ...model.modeling_vaswani import VaswaniForConditionalGeneration


def torch_transformer_to_vaswani(
    transformer: nn.Transformer, shared_embedding: torch.Tensor, **config_overrides
) -> VaswaniForConditionalGeneration:
    """A Vaswani model computing what `transformer` computes, with `shared_embedding` (vocab x d_model) as the
    three-way shared embedding. `config_overrides` set the fields nn.Transformer does not have (token ids...)."""
    encoder_layers, decoder_layers = transformer.encoder.layers, transformer.decoder.layers
    if transformer.encoder.norm is not None or transformer.decoder.norm is not None:
        raise ValueError(
            "This nn.Transformer has a final LayerNorm after its stacks, which the paper's post-norm model does "
            "not have. Build it with custom_encoder=nn.TransformerEncoder(layer, N, norm=None) and "
            "custom_decoder=nn.TransformerDecoder(layer, N, norm=None)."
        )
    first = encoder_layers[0]
    if first.norm_first:
        raise ValueError("Only the paper's post-norm layers (norm_first=False) convert; use norm_position='pre'.")
    vocab_size, d_model = shared_embedding.shape
    config = VaswaniConfig(
        **{
            "vocab_size": vocab_size,
            "d_model": d_model,
            "encoder_layers": len(encoder_layers),
            "decoder_layers": len(decoder_layers),
            "encoder_attention_heads": first.self_attn.num_heads,
            "decoder_attention_heads": decoder_layers[0].self_attn.num_heads,
            "encoder_ffn_dim": first.linear1.out_features,
            "decoder_ffn_dim": decoder_layers[0].linear1.out_features,
            "dropout": first.dropout.p,
            "layer_norm_eps": first.norm1.eps,
            **config_overrides,
        }
    )
    state = {"model.shared.weight": shared_embedding}
    for i, layer in enumerate(encoder_layers):
        prefix = f"model.encoder.layers.{i}."
        state.update(_attention(prefix + "self_attn.", layer.self_attn, cross=False))
        state.update(_norm(prefix + "self_attn_layer_norm.", layer.norm1))
        state.update(_feed_forward(prefix + "feed_forward.", layer))
        state.update(_norm(prefix + "final_layer_norm.", layer.norm2))
    for i, layer in enumerate(decoder_layers):
        prefix = f"model.decoder.layers.{i}."
        state.update(_attention(prefix + "self_attn.", layer.self_attn, cross=False))
        state.update(_norm(prefix + "self_attn_layer_norm.", layer.norm1))
        state.update(_attention(prefix + "encoder_attn.", layer.multihead_attn, cross=True))
        state.update(_norm(prefix + "encoder_attn_layer_norm.", layer.norm2))
        state.update(_feed_forward(prefix + "feed_forward.", layer))
        state.update(_norm(prefix + "final_layer_norm.", layer.norm3))
    model = VaswaniForConditionalGeneration(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("embed_tokens.weight", "lm_head.weight"))]
    if missing or unexpected:
        raise ValueError(f"nn.Transformer conversion left weights unmatched: {missing} {unexpected}")
    return model


def _attention(prefix: str, attention: nn.MultiheadAttention, cross: bool) -> dict[str, torch.Tensor]:
    # nn.MultiheadAttention stacks W^Q, W^K, W^V in `in_proj_weight`: exactly our fused layout
    weight, bias = attention.in_proj_weight.detach(), attention.in_proj_bias.detach()
    d_model = attention.embed_dim
    state = {prefix + "out_proj.weight": attention.out_proj.weight, prefix + "out_proj.bias": attention.out_proj.bias}
    if cross:
        state.update(
            {
                prefix + "q_proj.weight": weight[:d_model],
                prefix + "q_proj.bias": bias[:d_model],
                prefix + "kv_proj.weight": weight[d_model:],
                prefix + "kv_proj.bias": bias[d_model:],
            }
        )
    else:
        state.update({prefix + "qkv_proj.weight": weight, prefix + "qkv_proj.bias": bias})
    return state


def _norm(prefix: str, norm: nn.LayerNorm) -> dict[str, torch.Tensor]:
    return {prefix + "weight": norm.weight, prefix + "bias": norm.bias}


def _feed_forward(prefix: str, layer: nn.Module) -> dict[str, torch.Tensor]:
    return {
        prefix + "fc1.weight": layer.linear1.weight,
        prefix + "fc1.bias": layer.linear1.bias,
        prefix + "fc2.weight": layer.linear2.weight,
        prefix + "fc2.bias": layer.linear2.bias,
    }
