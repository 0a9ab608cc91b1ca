"""Export to CTranslate2, the inference engine users pick for fast CPU translation (`vaswani export --to ctranslate2`).

CTranslate2's `TransformerSpec` is the paper's architecture, so the export is a weight copy: fused Q/K/V (our
`qkv_proj` is already fused in CTranslate2's order), the cross-attention K/V pair (`kv_proj`), post- or pre-norm,
our position table (interleaved or split sinusoids, or learned) written out as its `position_encodings`, the
sqrt(d_model) embedding scale, the tied output projection (and Marian's output bias), the LayerNorm epsilon and
the special tokens. Decoding starts from `decoder_start_token_id` (<s>), like `generate()`.

What CTranslate2 does differently: its beam search uses its own length normalisation (score / length ** alpha),
not GNMT's ((5 + |Y|) / 6) ** alpha, and it stops at `max_decoding_length` instead of source length + 50;
greedy decoding gives the same tokens as our model (tests/test_export.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..model.modeling_vaswani import VaswaniForConditionalGeneration

ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_new": "GELUTanh", "swish": "SWISH", "silu": "SWISH"}


def _check_exportable(model: VaswaniForConditionalGeneration) -> None:
    config = model.config
    problems = []
    if config.encoder_attention_heads != config.decoder_attention_heads:
        problems.append("different head counts in encoder and decoder")
    if config.d_kv is not None and config.d_kv * config.encoder_attention_heads != config.d_model:
        problems.append("d_kv x heads != d_model")
    if config.activation_function not in ACTIVATIONS:
        problems.append(f"activation {config.activation_function!r} (supported: {', '.join(ACTIVATIONS)})")
    if problems:
        raise ValueError(f"CTranslate2's Transformer cannot represent this model: {'; '.join(problems)}.")


def _numpy(tensor: torch.Tensor):
    return tensor.detach().to(torch.float32).cpu().contiguous().numpy()


def ctranslate2_spec(model: VaswaniForConditionalGeneration, vocabulary: list[str]):
    """A `ctranslate2.specs.TransformerSpec` holding `model`'s weights; `vocabulary[i]` is the token of id i."""
    from ctranslate2.specs import common_spec, transformer_spec

    _check_exportable(model)
    config = model.config
    if len(vocabulary) != config.vocab_size:
        raise ValueError(
            f"The vocabulary has {len(vocabulary)} tokens but the model {config.vocab_size}: export the tokenizer "
            "that was trained with this model."
        )
    spec = transformer_spec.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers),
        config.encoder_attention_heads,
        pre_norm=config.norm_position == "pre",
        activation=getattr(common_spec.Activation, ACTIVATIONS[config.activation_function]),
    )
    core = model.model
    positions_needed = max(config.max_position_embeddings, 1024)
    for stack_spec, stack in ((spec.encoder, core.encoder), (spec.decoder, core.decoder)):
        stack_spec.scale_embeddings = stack.embed_scale
        embeddings = stack_spec.embeddings[0] if isinstance(stack_spec.embeddings, list) else stack_spec.embeddings
        embeddings.weight = _numpy(stack.embed_tokens.weight)
        positions = stack.embed_positions
        table = positions.encodings(0, positions_needed) if hasattr(positions, "encodings") else positions.weight
        stack_spec.position_encodings.encodings = _numpy(table)
        if stack.layer_norm is not None:
            _layer_norm(stack_spec.layer_norm, stack.layer_norm)
        for layer_spec, layer in zip(stack_spec.layer, stack.layers, strict=True):
            _linear(layer_spec.self_attention.linear[0], layer.self_attn.qkv_proj)
            _linear(layer_spec.self_attention.linear[1], layer.self_attn.out_proj)
            _layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
            if hasattr(layer, "encoder_attn"):
                _linear(layer_spec.attention.linear[0], layer.encoder_attn.q_proj)
                _linear(layer_spec.attention.linear[1], layer.encoder_attn.kv_proj)
                _linear(layer_spec.attention.linear[2], layer.encoder_attn.out_proj)
                _layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
            _linear(layer_spec.ffn.linear_0, layer.feed_forward.fc1)
            _linear(layer_spec.ffn.linear_1, layer.feed_forward.fc2)
            _layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
    spec.decoder.projection.weight = _numpy(model.lm_head.weight)
    if model.final_logits_bias is not None:
        spec.decoder.projection.bias = _numpy(model.final_logits_bias)
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    special = {"bos_token": config.bos_token_id, "eos_token": config.eos_token_id, "unk_token": config.unk_token_id,
               "decoder_start_token": config.decoder_start_token_id}  # fmt: skip
    for name, token_id in special.items():
        if token_id is not None:
            setattr(spec.config, name, vocabulary[token_id])
    return spec


def _linear(spec, module: torch.nn.Linear) -> None:
    spec.weight = _numpy(module.weight)
    if module.bias is not None:
        spec.bias = _numpy(module.bias)


def _layer_norm(spec, module: torch.nn.LayerNorm) -> None:
    spec.gamma = _numpy(module.weight)
    spec.beta = _numpy(module.bias)


def export_ctranslate2(
    model: VaswaniForConditionalGeneration,
    vocabulary: list[str],
    output_dir: str | Path,
    quantization: str | None = None,
) -> Path:
    """Write a CTranslate2 model directory (`ctranslate2.Translator(output_dir)` loads it).

    `quantization`: None keeps float32 (same numerics as our model); "int8", "int8_float32", "float16",
    "bfloat16"... are CTranslate2's weight types.
    """
    try:
        import ctranslate2  # noqa: F401
    except ImportError as err:
        raise ImportError("Export to CTranslate2 needs it installed: pip install ctranslate2") from err
    output_dir = Path(output_dir)
    spec = ctranslate2_spec(model, vocabulary)
    spec.validate()
    spec.optimize(quantization=quantization)
    output_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(output_dir))
    (output_dir / "vaswani_export.json").write_text(
        json.dumps(
            {
                "source": "vaswani-hf",
                "quantization": quantization or "float32",
                "decoder_start_token_id": model.config.decoder_start_token_id,
            },
            indent=2,
        )  # fmt: skip
    )
    return output_dir


def tokenizer_vocabulary(tokenizer, size: int) -> list[str]:
    """Token strings by id, as CTranslate2 wants them (ids the tokenizer lacks get placeholder names)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    return [token if token is not None else f"<unused{i}>" for i, token in enumerate(tokens)]
