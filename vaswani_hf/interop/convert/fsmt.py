"""Transformers' FSMT (its port of fairseq's WMT models: `facebook/wmt19-*`, `allenai/wmt16-en-de-*`) ->
`VaswaniForConditionalGeneration`, same numerics.

FSMT's weights are fairseq's under `model.`, so the conversion is fairseq's (`fairseq.vaswani_from_fairseq_layout`),
with FSMT's config read as fairseq's arguments. Its tokenizer (Moses + BPE, `FSMTTokenizer`) is carried over as it is:
`AutoTokenizer` loads it from the converted folder. FSMT models with separate source and target vocabularies (the
`facebook/wmt19-*` ones) are refused: the paper's model has one.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...model.modeling_vaswani import VaswaniForConditionalGeneration
from .fairseq import FairseqArchiveError, set_decoding, vaswani_from_fairseq_layout
from .folder import check_free, copy_files, write_folder, write_languages
from .marian import decode_as_peer

TOKENIZER_FILES = ("vocab-src.json", "vocab-tgt.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")


def fsmt_settings(config) -> dict:
    """An `FSMTConfig` as fairseq's argument names (what `vaswani_config_from_fairseq` reads)."""
    return {
        "encoder_embed_dim": config.d_model,
        "decoder_embed_dim": config.d_model,
        "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.encoder_attention_heads,
        "decoder_attention_heads": config.decoder_attention_heads,
        "encoder_ffn_embed_dim": config.encoder_ffn_dim,
        "decoder_ffn_embed_dim": config.decoder_ffn_dim,
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout,
        "activation_fn": config.activation_function,
        "max_source_positions": config.max_position_embeddings,
        "max_target_positions": config.max_position_embeddings,
        "no_scale_embedding": not config.scale_embedding,
        "encoder_layerdrop": config.encoder_layerdrop,
        "decoder_layerdrop": config.decoder_layerdrop,
        "share_all_embeddings": config.src_vocab_size == config.tgt_vocab_size,
    }


def fsmt_to_vaswani(fsmt_model, paper_decoding: bool = False) -> VaswaniForConditionalGeneration:
    """A `VaswaniForConditionalGeneration` with the weights of an `FSMTForConditionalGeneration` (eval mode).

    Its generation config is FSMT's (its beams and length penalty: 5 and 0.6 or 0.8 for `allenai/wmt16-*`), read as
    fairseq's, whose settings FSMT copied: its `max_length` (200) is fairseq's `max_len_b`, the tokens before the
    forced </s> (Transformers counts the decoder's start in `max_length`, so 2 are added), and </s> is never the first
    token (fairseq's min_len 1). `paper_decoding=True` keeps the paper's decoding instead."""
    config = fsmt_model.config
    for field, token in (("pad_token_id", 1), ("bos_token_id", 0), ("eos_token_id", 2), ("decoder_start_token_id", 2)):
        if getattr(config, field) != token:
            raise FairseqArchiveError(f"FSMT config: `{field}`={getattr(config, field)!r}, where fairseq's dictionary "
                                      f"has {token}; the converter takes fairseq's special tokens.")  # fmt: skip
    if config.src_vocab_size != config.tgt_vocab_size:
        raise FairseqArchiveError(
            f"FSMT config: `src_vocab_size`={config.src_vocab_size} and `tgt_vocab_size`={config.tgt_vocab_size}: "
            "separate source and target vocabularies; the paper's model (and this converter) has one shared vocabulary."
        )
    state = {k.removeprefix("model."): v for k, v in fsmt_model.state_dict().items() if "embed_positions" not in k}
    model = vaswani_from_fairseq_layout(fsmt_settings(config), state, where="FSMT model")
    if paper_decoding:
        set_decoding(model, paper_decoding=True)
    else:
        decode_as_peer(model, fsmt_model.generation_config)
        generation = model.generation_config
        generation.max_length = (generation.max_length or 200) + 2  # the decoder's start, max_len_b tokens, </s>
        generation.min_new_tokens = 1
    return model.to(fsmt_model.dtype).eval()  # FSMT's dtype, as the Marian converter keeps Marian's


def name_the_tokenizer(path: Path) -> None:
    """Transformers' FSMT conversion script writes `tokenizer_config.json` without `tokenizer_class` (the Hub's
    `allenai/wmt16-*` folders): `AutoTokenizer` read the class from FSMT's config.json, which the converted folder's
    Vaswani config replaces, so the class is named here."""
    if path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
        if not config.get("tokenizer_class"):
            config["tokenizer_class"] = "FSMTTokenizer"
            path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_fsmt_checkpoint(src_dir: str | Path, out_dir: str | Path, paper_decoding: bool = False) -> Path:
    """Convert a saved `FSMTForConditionalGeneration` folder into a Vaswani one (weights, configs, FSMT's tokenizer
    files); nothing is written unless the whole conversion succeeds."""
    from transformers import FSMTForConditionalGeneration

    src_dir, out_dir = Path(src_dir), Path(out_dir)
    check_free(out_dir)
    if not (src_dir / "config.json").is_file():
        raise FairseqArchiveError(f"{src_dir} has no config.json: give the folder of a saved FSMT model.")
    fsmt = FSMTForConditionalGeneration.from_pretrained(src_dir)
    model = fsmt_to_vaswani(fsmt, paper_decoding=paper_decoding)

    def fill(folder: Path) -> None:
        model.save_pretrained(folder)
        write_languages(folder, *fsmt.config.langs, {"format": "fsmt", "folder": src_dir.name})
        copy_files(src_dir, folder, TOKENIZER_FILES)
        name_the_tokenizer(folder / "tokenizer_config.json")

    return write_folder(out_dir, fill)
