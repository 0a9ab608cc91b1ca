"""Transformers' `MarianMTModel` -> `VaswaniForConditionalGeneration`, same numerics.

Marian is the paper's architecture with different defaults: all-sines-then-all-cosines positions (our
"sinusoidal_split"), PyTorch's LayerNorm epsilon, an output bias (`final_logits_bias`) and, in Opus-MT
checkpoints, swish and `scale_embedding`. Every field is carried over, so the converted model gives Marian's
logits; only Marian features outside the paper (separate encoder/decoder vocabularies, LayerDrop) are refused.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from ...model.configuration_vaswani import VaswaniConfig
from ...model.modeling_vaswani import VaswaniForConditionalGeneration
from .folder import check_free, copy_files, write_folder

TOKENIZER_FILES = (
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def vaswani_config_from_marian(marian_config) -> VaswaniConfig:
    """The `VaswaniConfig` that reproduces a `MarianConfig` exactly."""
    if not marian_config.share_encoder_decoder_embeddings or not marian_config.tie_word_embeddings:
        raise ValueError(
            "This Marian checkpoint has separate source and target vocabularies or an untied output layer; "
            "the paper's model (and this converter) needs one shared vocabulary with tied embeddings."
        )
    if marian_config.encoder_layerdrop or marian_config.decoder_layerdrop:
        raise ValueError("LayerDrop is not part of the paper's model; set encoder/decoder_layerdrop to 0 first.")
    return VaswaniConfig(
        vocab_size=marian_config.vocab_size,
        d_model=marian_config.d_model,
        encoder_layers=marian_config.encoder_layers,
        decoder_layers=marian_config.decoder_layers,
        encoder_attention_heads=marian_config.encoder_attention_heads,
        decoder_attention_heads=marian_config.decoder_attention_heads,
        encoder_ffn_dim=marian_config.encoder_ffn_dim,
        decoder_ffn_dim=marian_config.decoder_ffn_dim,
        dropout=float(marian_config.dropout),
        attention_dropout=float(marian_config.attention_dropout),
        activation_dropout=float(marian_config.activation_dropout),
        activation_function=marian_config.activation_function,
        position_embedding_type="sinusoidal_split",
        max_position_embeddings=marian_config.max_position_embeddings,
        scale_embedding=marian_config.scale_embedding,
        tie_word_embeddings=True,
        layer_norm_eps=1e-5,  # Marian uses nn.LayerNorm's default
        output_bias=True,
        pad_token_id=marian_config.pad_token_id,
        bos_token_id=marian_config.bos_token_id,
        eos_token_id=marian_config.eos_token_id,
        unk_token_id=None,
        decoder_start_token_id=marian_config.decoder_start_token_id,
    )


def vaswani_state_dict_from_bart_layout(marian_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename the layer weights of Marian's layout (BART's, FSMT's, and fairseq's under `model.`) and fuse their
    separate Q/K/V projections into ours; embeddings, positions and the output layer are left to the caller."""
    state = {}
    for name, tensor in marian_state.items():
        if "embed_positions" in name or name in ("lm_head.weight",) or name.endswith("embed_tokens.weight"):
            continue  # positions are computed; embeddings and output layer are `model.shared`
        if name == "final_logits_bias":
            state[name] = tensor.reshape(-1)
            continue
        for sub in ("q_proj", "k_proj", "v_proj"):
            if f".{sub}." in name:
                break
        else:
            state[name.replace(".fc1.", ".feed_forward.fc1.").replace(".fc2.", ".feed_forward.fc2.")] = tensor
    for name, tensor in marian_state.items():
        if ".self_attn.q_proj." in name:
            k, v = (marian_state[name.replace("q_proj", p)] for p in ("k_proj", "v_proj"))
            state[name.replace("q_proj", "qkv_proj")] = torch.cat([tensor, k, v])
        elif ".encoder_attn.q_proj." in name:
            state[name] = tensor
            k, v = (marian_state[name.replace("q_proj", p)] for p in ("k_proj", "v_proj"))
            state[name.replace("q_proj", "kv_proj")] = torch.cat([k, v])
    return state


def decode_as_peer(model: VaswaniForConditionalGeneration, generation_config) -> None:
    """The converted model decodes as the peer did: the peer's generation config, with Transformers' length penalty
    and no source + offset limit, so the same `generate()` call gives the peer's output."""
    model.generation_config = copy.deepcopy(generation_config)
    model.generation_config.length_penalty_type = "hf"
    model.generation_config.max_length_offset = None
    model.generation_config._from_model_config = False  # keep these settings on save and reload


def marian_to_vaswani(marian_model, paper_decoding: bool = False) -> VaswaniForConditionalGeneration:
    """A `VaswaniForConditionalGeneration` with the weights of a `MarianMTModel` (in its dtype, eval mode).

    Its generation config is Marian's (beams, `max_length`, `forced_eos_token_id`, `bad_words_ids`,
    `renormalize_logits`...) with Transformers' length penalty and no source + offset limit, so the same
    `generate()` call decodes exactly as the Marian model. `paper_decoding=True` keeps the paper's decoding
    instead (beam 4, GNMT penalty 0.6, source + 50), Marian's `bad_words_ids` and `forced_eos_token_id` included.
    """
    config = vaswani_config_from_marian(marian_model.config)
    model = VaswaniForConditionalGeneration(config).to(marian_model.dtype)
    state = vaswani_state_dict_from_bart_layout(marian_model.state_dict())
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("embed_tokens.weight", "lm_head.weight"))]
    if missing or unexpected:
        raise ValueError(f"Marian conversion left weights unmatched: missing {missing}, unexpected {unexpected}.")
    marian_generation = marian_model.generation_config
    if paper_decoding:
        for name in ("bad_words_ids", "forced_eos_token_id"):  # Opus-MT forbids its padding (= start) token
            if getattr(marian_generation, name, None) is not None:
                setattr(model.generation_config, name, getattr(marian_generation, name))
    else:
        decode_as_peer(model, marian_generation)
    model.generation_config._from_model_config = False  # keep these settings on save and reload
    return model.eval()


def convert_marian_checkpoint(src_dir: str | Path, dst_dir: str | Path, paper_decoding: bool = False) -> Path:
    """Convert a Marian checkpoint directory into a Vaswani one (weights, configs, tokenizer files); see
    `marian_to_vaswani` for the generation config and `paper_decoding`."""
    from transformers import MarianMTModel

    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    check_free(dst_dir)
    if not (src_dir / "config.json").is_file():
        raise FileNotFoundError(f"{src_dir} has no config.json: give the directory of a saved MarianMTModel.")
    marian = MarianMTModel.from_pretrained(src_dir)
    model = marian_to_vaswani(marian, paper_decoding=paper_decoding)

    def fill(folder: Path) -> None:
        model.save_pretrained(folder)
        copy_files(src_dir, folder, TOKENIZER_FILES)

    return write_folder(dst_dir, fill)
