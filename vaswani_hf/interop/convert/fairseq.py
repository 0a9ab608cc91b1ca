"""fairseq's translation Transformers (Ott et al., 2018: `transformer.wmt16.en-de`, `transformer.wmt14.en-fr`) ->
`VaswaniForConditionalGeneration`, read without fairseq.

fairseq's `transformer_vaswani_wmt_en_de_big` is the paper's big model: post-norm, sinusoidal positions, the three
embeddings shared. What differs from our defaults is carried as options: its position table
(`position_embedding_type="sinusoidal_fairseq"`), PyTorch's LayerNorm epsilon, its dictionary (<s>=0, <pad>=1,
</s>=2, <unk>=3; the decoder starts from </s>) and its tokenizer (Moses + subword-nmt, `data/moses_bpe.py`).

A checkpoint is read with `torch.load(weights_only=True)`: tensors, containers and `argparse.Namespace` are built,
and any other class a fairseq file holds (its meters, numpy scalars, omegaconf nodes) becomes an inert record of its
pickled state, never run. Both formats convert: 2018's (`args`, `in_proj_weight`, `layer_norms.N`, torch's legacy
serialization) and today's (`cfg`, `q_proj`/`k_proj`/`v_proj`, named layer norms). What the paper's architecture
(and our config) cannot hold is refused, naming the field and its value; nothing is written until all is read.
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from ...model.configuration_vaswani import VaswaniConfig
from ...model.modeling_vaswani import VaswaniForConditionalGeneration
from ...model.search_vaswani import FAIRSEQ_GENERATION_DEFAULTS
from .folder import check_free, write_folder, write_languages
from .marian import vaswani_state_dict_from_bart_layout

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
# fairseq-generate's defaults (beam 5, score / length, max_len_a 0 / max_len_b 200) with its min_len 1: `</s>` is
# never the first token (fairseq's SequenceGenerator bans it at step 0)
FAIRSEQ_DECODING = {**FAIRSEQ_GENERATION_DEFAULTS, "min_new_tokens": 1}
# Ott et al. (2018)'s newstest2014 figures (29.3 en-de, 43.2 en-fr): `--beam 4 --lenpen 0.6`, fairseq's penalty
# score / length ** 0.6 (Transformers' form, "hf"), the rest fairseq-generate's defaults
OTT_DECODING = {**FAIRSEQ_DECODING, "num_beams": 4, "length_penalty": 0.6}  # fairseq's Dictionary: bos, pad, eos, unk
CODES_NAMES = ("bpecodes", "code", "codes", "bpe.codes")


class FairseqArchiveError(ValueError):
    """A fairseq archive that cannot be converted: the message names the file and the fix."""


class UnreadObject:
    """An object of a class outside tensors, containers and arguments (a meter, a numpy scalar, an omegaconf node):
    its pickled arguments and state are kept as data; no code of its class is looked up or run."""

    def __init__(self, *args, **kwargs) -> None:
        self.args = args

    def __setstate__(self, state) -> None:
        self.state = state


def _unsupported_global(error: Exception) -> str | None:
    match = re.search(r"GLOBAL (\S+) was not an allowed global", str(error))
    return match.group(1) if match else None


def load_fairseq_checkpoint(path: str | Path) -> dict:
    """The dictionary a fairseq `model.pt` holds, loaded with `weights_only=True` (see the module's docstring)."""
    path = Path(path)
    unread: list[tuple[type, str]] = []
    for _ in range(64):  # one more class per round; a fairseq file holds a handful
        try:
            with torch.serialization.safe_globals([argparse.Namespace, *unread]):
                state = torch.load(path, map_location="cpu", weights_only=True)
            break
        except pickle.UnpicklingError as err:
            name = _unsupported_global(err)
            if name is None:
                raise FairseqArchiveError(f"{path}: not a readable fairseq checkpoint ({err}).") from None
            unread.append((UnreadObject, name))
        except (RuntimeError, EOFError, ValueError, OSError) as err:
            raise FairseqArchiveError(
                f"{path}: cannot be read as a PyTorch checkpoint ({err}); the file is probably truncated: download the "
                "archive again and check its size."
            ) from None
    else:
        raise FairseqArchiveError(f"{path}: holds more kinds of objects than a fairseq checkpoint does.")
    if not isinstance(state, dict) or not isinstance(state.get("model"), Mapping):
        raise FairseqArchiveError(f"{path}: no `model` weights inside: give a fairseq translation checkpoint.")
    return state


def _plain(value):
    """Arguments as plain Python: a Namespace's fields, and omegaconf nodes kept unread (their `_content`/`_val`)."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, UnreadObject):
        state = getattr(value, "state", None) or {}
        state = state[0] if isinstance(state, tuple) else state
        value = state.get("_content", state.get("_val")) if isinstance(state, dict) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def fairseq_settings(checkpoint: dict) -> dict:
    """One flat dictionary of a checkpoint's arguments: 2018's `args` namespace, or today's `cfg` sections (model,
    task, tokenizer, bpe) merged, the model's winning."""
    cfg = _plain(checkpoint.get("cfg"))
    if isinstance(cfg, dict) and cfg.get("model") is not None:
        settings = {}
        for section in ("common", "task", "tokenizer", "bpe", "model"):
            if isinstance(cfg.get(section), dict):
                settings.update(cfg[section])
        return settings
    args = _plain(checkpoint.get("args"))
    if isinstance(args, dict):
        return args
    raise FairseqArchiveError("the checkpoint holds neither `args` nor `cfg`: it is not a fairseq training checkpoint.")


def upgrade_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """2018's weight names -> today's, as fairseq's own `upgrade_state_dict_named` does: `in_proj_weight`/`bias`
    split into q, k, v thirds; the encoder's `layer_norms.0/1` and the decoder's `layer_norms.0/1/2` named."""
    norms = {
        "encoder": ("self_attn_layer_norm", "final_layer_norm"),
        "decoder": ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"),
    }
    upgraded = {}
    for name, tensor in state.items():
        if match := re.fullmatch(r"(.*)\.in_proj_(weight|bias)", name):
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3), strict=True):
                upgraded[f"{match.group(1)}.{part}.{match.group(2)}"] = chunk
        elif match := re.fullmatch(r"(encoder|decoder)(\.layers\.\d+)\.layer_norms\.(\d)\.(weight|bias)", name):
            stack, layer, index, kind = match.groups()
            upgraded[f"{stack}{layer}.{norms[stack][int(index)]}.{kind}"] = tensor
        else:
            upgraded[name] = tensor
    return upgraded


def read_dictionary(path: Path) -> list[str]:
    """fairseq's `Dictionary.load`: the four specials, then each line's first field (`#fairseq:overwrite` lines too)."""
    symbols = list(FAIRSEQ_SPECIALS)
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            fields = line.rstrip("\n").rsplit(" ", 2 if line.rstrip().endswith("#fairseq:overwrite") else 1)
            if len(fields) < 2 or not fields[1].lstrip("-").isdigit():
                raise FairseqArchiveError(f"{path}, line {number}: {line.strip()!r} is not `TOKEN COUNT`; is this a "
                                          "fairseq dictionary?")  # fmt: skip
            symbols.append(fields[0])
    return symbols


def _refuse(where: str, field: str, value, why: str) -> FairseqArchiveError:
    return FairseqArchiveError(f"{where}: `{field}`={value!r}: {why}")


def vaswani_config_from_fairseq(settings: dict, vocab_size: int, tied: bool, where: str = "the checkpoint"):
    """The `VaswaniConfig` of a fairseq (or FSMT) translation Transformer, or an error naming what does not fit."""
    get = settings.get
    for field, why in (
        ("encoder_normalize_before", "a pre-norm encoder; the paper's model is post-norm"),
        ("decoder_normalize_before", "a pre-norm decoder; the paper's model is post-norm"),
        ("encoder_learned_pos", "learned source positions; the converter takes fairseq's sinusoids"),
        ("decoder_learned_pos", "learned target positions; the converter takes fairseq's sinusoids"),
        ("no_token_positional_embeddings", "a model without positions"),
        ("layernorm_embedding", "a LayerNorm on the embeddings, which the paper's model does not have"),
        ("adaptive_input", "adaptive input embeddings"),
        ("adaptive_softmax_cutoff", "an adaptive softmax"),
        ("cross_self_attention", "cross+self attention"),
        ("encoder_layers_to_keep", "layers pruned at load (LayerDrop's pruning), which the converter does not do"),
        ("decoder_layers_to_keep", "layers pruned at load (LayerDrop's pruning), which the converter does not do"),
    ):
        if get(field):
            raise _refuse(where, field, get(field), why)
    width = get("encoder_embed_dim", 512)
    for field in ("decoder_embed_dim", "decoder_output_dim", "decoder_input_dim"):
        if get(field, width) != width:
            raise _refuse(where, field, get(field), f"differs from encoder_embed_dim={width}; the paper's model has "
                          "one d_model")  # fmt: skip
    activation = get("activation_fn", "relu")
    try:
        return VaswaniConfig(
            vocab_size=vocab_size,
            d_model=width,
            encoder_layers=get("encoder_layers", 6),
            decoder_layers=get("decoder_layers", 6),
            encoder_attention_heads=get("encoder_attention_heads", 8),
            decoder_attention_heads=get("decoder_attention_heads", 8),
            encoder_ffn_dim=get("encoder_ffn_embed_dim", 2048),
            decoder_ffn_dim=get("decoder_ffn_embed_dim", 2048),
            dropout=float(get("dropout", 0.1)),
            attention_dropout=float(get("attention_dropout", 0.0)),
            activation_dropout=float(get("activation_dropout", get("relu_dropout", 0.0)) or 0.0),
            activation_function=activation,
            position_embedding_type="sinusoidal_fairseq",
            max_position_embeddings=max(get("max_source_positions", 1024), get("max_target_positions", 1024)),
            max_target_positions=get("max_target_positions", 1024),  # fairseq's output cap (`fairseq_length`)
            scale_embedding=not get("no_scale_embedding", False),
            tie_word_embeddings=tied,
            layer_norm_eps=1e-5,  # fairseq's LayerNorm is PyTorch's
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            unk_token_id=3,
            decoder_start_token_id=2,  # fairseq's decoder starts from </s>
        )
    except Exception as err:  # @strict wraps our message
        raise FairseqArchiveError(f"{where}: {getattr(err, '__cause__', None) or err}") from None


def vaswani_from_fairseq_layout(
    settings: dict, state: Mapping[str, torch.Tensor], where: str = "the checkpoint"
) -> VaswaniForConditionalGeneration:
    """A Vaswani model from weights named as today's fairseq names them (`encoder.layers.0.self_attn.q_proj.weight`,
    ..., `decoder.output_projection.weight`); the embeddings decide the sharing: all three equal -> tied, all three
    separate -> `tie_word_embeddings=False`, anything between is refused. The model is float32: cast it for
    serving (`--precision`)."""
    source = state["encoder.embed_tokens.weight"]
    target = state.get("decoder.embed_tokens.weight", source)
    output = state.get("decoder.output_projection.weight", state.get("decoder.embed_out", target))
    if source.shape != target.shape or target.shape != output.shape:
        raise _refuse(where, "share_all_embeddings", settings.get("share_all_embeddings", False),
                      f"source vocabulary {source.shape[0]} and target {target.shape[0]} differ; the paper's model has "
                      "one vocabulary for both")  # fmt: skip
    tied = torch.equal(source, target) and torch.equal(target, output)
    if not tied and (torch.equal(source, target) or torch.equal(target, output)):
        raise _refuse(where, "share_decoder_input_output_embed", settings.get("share_decoder_input_output_embed"),
                      "two of the three embeddings are shared and one is not; the config shares all three "
                      "(tie_word_embeddings=True) or none")  # fmt: skip
    config = vaswani_config_from_fairseq(settings, source.shape[0], tied, where)
    layers = {k: v for k, v in state.items() if ".layers." in k}
    if any(re.match(r"(encoder|decoder)\.layer_norm\.", k) for k in state):
        raise _refuse(where, "normalize_before", True, "a final stack LayerNorm (a pre-norm model)")
    renamed = vaswani_state_dict_from_bart_layout({f"model.{k}": v for k, v in layers.items()})
    renamed["model.shared.weight"] = source
    if not tied:
        renamed["model.decoder.embed_tokens.weight"] = target
        renamed["lm_head.weight"] = output
    model = VaswaniForConditionalGeneration(config)  # float32, whatever the checkpoint's (fairseq's are often fp16)
    missing, unexpected = model.load_state_dict(renamed, strict=False)
    missing = [k for k in missing if not k.endswith(("embed_tokens.weight", "lm_head.weight"))]
    if missing or unexpected:
        raise FairseqArchiveError(f"{where}: weights left unmatched: missing {missing[:6]}, unexpected "
                                  f"{unexpected[:6]}; is it a translation Transformer?")  # fmt: skip
    return model.eval()


def fairseq_length(config, settings: dict) -> dict:
    """A fairseq decoding preset for one model: fairseq's SequenceGenerator stops at min(max_len_b,
    max_target_positions - 1) tokens and then forces </s>, so a model with fewer target positions than 201 gets the
    smaller `max_length` (the decoder's start, the tokens, </s>); `max_target_positions` is the converted config's.
    The </s> forced there is the model's `eos_token_id` (as `forced_eos_token_id`), scored with the
    model's own log-probability of it as fairseq scores it (the preset's `forced_eos_score="model"`)."""
    eos = getattr(config, "eos_token_id", None)
    if settings.get("forced_eos_score") == "model" and "forced_eos_token_id" not in settings and eos is not None:
        settings = {**settings, "forced_eos_token_id": eos}
    positions = getattr(config, "max_target_positions", None)
    if not isinstance(positions, int) or settings.get("max_length") is None:
        return settings
    return {**settings, "max_length": min(settings["max_length"], positions + 1)}


def set_decoding(model: VaswaniForConditionalGeneration, paper_decoding: bool) -> None:
    """fairseq's decoding (beam 5, score / length, 200 tokens or max_target_positions - 1) unless `paper_decoding`
    keeps the paper's (beam 4, GNMT penalty 0.6, source + 50); either way as fairseq's search: `<pad>` never chosen,
    `</s>` never first (min_len 1) and forced at the limit."""
    generation = model.generation_config
    generation.suppress_tokens = [model.config.pad_token_id]
    generation.forced_eos_token_id = model.config.eos_token_id
    generation.min_new_tokens = 1
    if not paper_decoding:
        for name, value in fairseq_length(model.config, FAIRSEQ_DECODING).items():
            setattr(generation, name, value)
    generation._from_model_config = False  # keep these settings on save and reload


def _one(src_dir: Path, names: tuple[str, ...] | list[str], what: str, flag: str) -> Path:
    found = [src_dir / n for n in names if (src_dir / n).is_file()]
    if not found:
        raise FairseqArchiveError(f"{src_dir}: no {what} ({' or '.join(names)}); give one with {flag}.")
    return found[0]


def find_checkpoint(src_dir: Path, checkpoint: str | None) -> Path:
    if checkpoint:
        path = src_dir / checkpoint if not Path(checkpoint).is_absolute() else Path(checkpoint)
        if not path.is_file():
            raise FairseqArchiveError(f"{path}: no such checkpoint file; `--checkpoint` names one of the archive's .pt "
                                      "files.")  # fmt: skip
        return path
    candidates = sorted(src_dir.glob("*.pt"))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise FairseqArchiveError(f"{src_dir}: no checkpoint (*.pt); give the extracted fairseq archive's folder.")
    if (src_dir / "model.pt").is_file():
        return src_dir / "model.pt"
    names = ", ".join(p.name for p in candidates)
    raise FairseqArchiveError(f"{src_dir}: several checkpoints ({names}); choose one with --checkpoint NAME.")


def check_codes_match(codes: Path, dictionary: Path, symbols: list[str], separator: str = "@@") -> None:
    """Every subword of a fairseq dictionary built on BPE'd text is a merge of the codes (a word-final one of a merge
    ending in `</w>`, an inner one `@@`-marked); codes from another model leave most of them unexplained. Codes
    without a `#version` header are subword-nmt's v0.1, where `</w>` is a symbol of its own: a word-final piece comes
    out bare where no `X </w>` merge exists, so any merge may end a word there."""
    merged = set()
    version_01 = True
    with open(codes, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if number == 1 and line.startswith("#version"):
                version_01 = False
                continue
            pair = line.split()
            if len(pair) < 2:
                raise FairseqArchiveError(f"{codes}, line {number}: {line.strip()!r} is not a BPE merge `A B`; is "
                                          "this subword-nmt's codes file?")  # fmt: skip
            joined = pair[0] + pair[1]
            merged.add(joined[: -len("</w>")] if joined.endswith("</w>") else joined + separator)
            if version_01 and not joined.endswith("</w>"):
                merged.add(joined)
    subwords = [s for s in symbols[len(FAIRSEQ_SPECIALS) :] if not re.fullmatch(r"madeupword\d+", s)]
    longer = [s for s in subwords if len(s.removesuffix(separator)) > 1]
    unexplained = [s for s in longer if s not in merged]
    if longer and len(unexplained) > max(3, 0.01 * len(longer)):
        raise FairseqArchiveError(
            f"{codes} does not match {dictionary}: {len(unexplained)} of its {len(longer)} subwords (e.g. "
            f"{', '.join(unexplained[:5])}) are no merge of these codes. Give the codes the model was trained with "
            "(--bpe-codes FILE)."
        )


def fairseq_vocabulary(src_dir: Path, settings: dict, rows: int, source_lang: str, target_lang: str) -> list[str]:
    """The joined dictionary (`dict.{src}.txt` = `dict.{tgt}.txt`), padded with `madeupwordNNNN` to the embedding's
    rows as fairseq's `finalize(padding_factor=8)` padded it."""
    paths = [src_dir / f"dict.{lang}.txt" for lang in (source_lang, target_lang)]
    for path in paths:
        if not path.is_file():
            expected = f"dict.{source_lang}.txt and dict.{target_lang}.txt"
            raise FairseqArchiveError(f"{path}: missing; the archive's dictionaries are {expected} (other languages: "
                                      "--source-lang/--target-lang).")  # fmt: skip
    source, target = (read_dictionary(p) for p in paths)
    if source != target:
        raise _refuse(str(paths[1]), "share_all_embeddings", settings.get("share_all_embeddings", False),
                      f"differs from {paths[0].name}; the paper's model (and this converter) takes one joined "
                      "dictionary")  # fmt: skip
    if rows < len(source):
        raise FairseqArchiveError(f"{paths[0]}: {len(source)} symbols, but the model's embedding has {rows} rows: "
                                  "the dictionary is not this model's.")  # fmt: skip
    padding = rows - len(source)
    if padding >= 8:
        raise FairseqArchiveError(f"{paths[0]}: {len(source)} symbols, but the model's embedding has {rows} rows "
                                  "(fairseq pads to a multiple of 8): the dictionary is not this model's.")  # fmt: skip
    return source + [f"madeupword{i:04d}" for i in range(padding)]


ESCAPED = ("&quot;", "&apos;", "&amp;", "&lt;", "&gt;", "&#124;", "&#91;", "&#93;")


def moses_evidence(symbols: list[str], separator: str = "@@") -> dict[str, tuple[bool | None, str]]:
    """What a dictionary tells of the Moses options its text was tokenized with: `@-@` is a token only under `-a`
    (which splits `well-known` into `well @-@ known`), and without it a hyphen inside a word (`-@@`, `well-`) is
    common; a bare `"` or `'` is a token only without XML escaping (which turns every one into `&quot;` / `&apos;`),
    and entities only with it. Each option maps to (True, False or None where the dictionary does not tell, the
    evidence in words)."""
    symbols = symbols[len(FAIRSEQ_SPECIALS) :]
    # `@-@` whole, or cut by BPE where it is rare (`@-@@ @`, `@@@ -@`)
    dash = any(re.fullmatch(r"@-@?|-@", s.removesuffix(separator)) for s in symbols)
    # a hyphen beside a letter or digit inside a piece; or a lone `-@@` where no piece holds an `@` of the text:
    # -a text whose `@-@` BPE cut into characters gives `@@@ -@@ @`, a lone `-@@` beside `@` pieces
    at_signs = any("@" in s.removesuffix(separator) for s in symbols if s != separator)
    inner = [s for s in symbols if re.search(r"\w-|-\w", s.removesuffix(separator))
             or (s == f"-{separator}" and not at_signs)]  # fmt: skip
    escaped = [s for s in symbols if any(entity in s for entity in ESCAPED)]
    bare = [s for s in symbols if '"' in s or "'" in s]
    if dash:
        aggressive = (True, "the dictionary holds `@-@`")
    elif inner:
        aggressive = (False, f"no `@-@` in the dictionary, and hyphens inside words ({', '.join(inner[:3])})")
    else:
        aggressive = (None, "the dictionary does not tell (no hyphens)")
    if bare:
        escape = (False, f"the dictionary holds bare quotes ({', '.join(bare[:3])})")
    elif escaped:
        escape = (True, f"the dictionary holds XML entities ({', '.join(escaped[:3])}) and no bare quotes")
    else:
        escape = (None, "the dictionary does not tell (no quotes)")
    return {"aggressive_dash_splits": aggressive, "escape": escape}


def moses_options(settings: dict, symbols: list[str], given: dict[str, bool | None],
                  report: Callable[[str], None]) -> dict[str, dict]:  # fmt: skip
    """Each Moses option and where it came from: the flag where given (warning where the checkpoint or the
    dictionary says otherwise), else the checkpoint's `moses_no_*` field, else the dictionary's evidence, else
    fairseq's default (on). The evidence is reported either way."""
    evidence = moses_evidence(symbols)
    chosen = {}
    for option, field in (("aggressive_dash_splits", "moses_no_dash_splits"), ("escape", "moses_no_escape")):
        inferred, words = evidence[option]
        checkpoint = None if settings.get(field) is None else not settings[field]
        flag = "--" + option.replace("_", "-")
        if given.get(option) is not None:
            value, source = given[option], f"{flag} {'yes' if given[option] else 'no'}"
            for other, what in ((checkpoint, f"the checkpoint's `{field}`"), (inferred, "the dictionary")):
                if other is not None and other != value:
                    warnings.warn(f"{flag} {'yes' if value else 'no'} is used, but {what} says "
                                  f"{'yes' if other else 'no'} ({words}): the model may meet subwords its dictionary "
                                  "lacks (<unk>).", stacklevel=3)  # fmt: skip
        elif checkpoint is not None:
            value, source = checkpoint, f"the checkpoint's `{field}`"
        elif inferred is not None:
            value, source = inferred, "the dictionary"
        else:
            value, source = True, "fairseq's default"
        chosen[option] = {"value": value, "from": source, "evidence": words}
        report(f"Moses {option}: {'yes' if value else 'no'} ({source}; {words})")
    return chosen


def segmenter_of(checkpoint: dict) -> str | None:
    """The subword segmenter a checkpoint names (`cfg.bpe._name`, 2018's `args.bpe`), None where it names none."""
    cfg = _plain(checkpoint.get("cfg"))
    if isinstance(cfg, dict) and isinstance(cfg.get("bpe"), dict):
        return cfg["bpe"].get("_name")
    args = _plain(checkpoint.get("args"))
    return args.get("bpe") if isinstance(args, dict) else None


def check_segmenter(checkpoint: dict, path: Path) -> None:
    """The tokenizer written is Moses + subword-nmt: an archive segmented otherwise is refused before any codes are
    looked for (a stray `bpecodes` beside a SentencePiece model would segment every line wrong, silently)."""
    name = segmenter_of(checkpoint)
    if name in (None, "subword_nmt"):
        return
    model = " (its `sentencepiece.bpe.model`)" if name == "sentencepiece" else ""
    raise _refuse(
        str(path),
        "bpe",
        name,
        f"the archive segments its text with {name}{model}, and the converter "
        "writes a Moses + subword-nmt tokenizer only: convert archives trained with `--bpe subword_nmt`",
    )


def layerdrop_note(settings: dict) -> str | None:
    """LayerDrop (Fan et al., 2019) skips layers at random in training only: at inference fairseq runs every layer,
    as the converted model does, so an archive trained with it converts, with a note."""
    rates = {f: settings.get(f) for f in ("encoder_layerdrop", "decoder_layerdrop") if settings.get(f)}
    if not rates:
        return None
    given = ", ".join(f"{field}={value}" for field, value in rates.items())
    return (
        f"note: the archive was trained with LayerDrop ({given}); LayerDrop acts in training only, and the "
        "converted model, like fairseq at inference, runs every layer."
    )


def _languages(src_dir: Path, settings: dict, source_lang: str | None, target_lang: str | None) -> tuple[str, str]:
    source_lang = source_lang or settings.get("source_lang")
    target_lang = target_lang or settings.get("target_lang")
    if not (source_lang and target_lang):
        langs = sorted(p.name[len("dict.") : -len(".txt")] for p in src_dir.glob("dict.*.txt"))
        if len(langs) != 2:
            found = ", ".join(langs) or "none"
            raise FairseqArchiveError(f"{src_dir}: the languages are not in the checkpoint and the dictionaries "
                                      f"({found}) do not tell: give --source-lang and --target-lang.")  # fmt: skip
        raise FairseqArchiveError(f"{src_dir}: the checkpoint does not say which of {langs} is the source: give "
                                  "--source-lang and --target-lang.")  # fmt: skip
    return source_lang, target_lang


def convert_fairseq_checkpoint(
    src_dir: str | Path,
    out_dir: str | Path,
    checkpoint: str | None = None,
    paper_decoding: bool = False,
    source_lang: str | None = None,
    target_lang: str | None = None,
    bpe_codes: str | Path | None = None,
    aggressive_dash_splits: bool | None = None,
    escape: bool | None = None,
    normalize_punctuation: bool = False,
    report: Callable[[str], None] | None = None,
) -> Path:
    """Convert an extracted fairseq archive (`model.pt`, `dict.{src}.txt`, `dict.{tgt}.txt`, `bpecodes` or `code`)
    into a Vaswani model folder: weights, configs, and the Moses + BPE tokenizer `AutoTokenizer` loads.

    Moses' options come from the arguments where given (with a warning where the checkpoint or the dictionary says
    otherwise), else from the checkpoint where it holds them (`moses_no_dash_splits`, `moses_no_escape`), else from
    the dictionary (`moses_evidence`), else fairseq's defaults (aggressive dash splits and escaping on); each choice
    and its evidence go to `report` and into `training_facts.json`. Punctuation normalisation is off unless asked
    for. `paper_decoding` keeps the paper's decoding instead of fairseq's (`set_decoding`).
    """
    from ...data.moses_bpe import MosesBPETokenizer

    src_dir, out_dir = Path(src_dir), Path(out_dir)
    check_free(out_dir)
    if not src_dir.is_dir():
        raise FairseqArchiveError(f"{src_dir}: no such folder; give the extracted fairseq archive's folder.")
    path = find_checkpoint(src_dir, checkpoint)
    state = load_fairseq_checkpoint(path)
    check_segmenter(state, path)
    codes = Path(bpe_codes) if bpe_codes else _one(src_dir, CODES_NAMES, "BPE codes", "--bpe-codes FILE")
    if not codes.is_file():
        raise FairseqArchiveError(f"{codes}: no such BPE codes file.")
    settings = fairseq_settings(state)
    if settings.get("task", "translation") not in ("translation", None) or "encoder.embed_tokens.weight" not in \
            state["model"]:  # fmt: skip
        raise _refuse(str(path), "task", settings.get("task"), "not a translation Transformer")
    source_lang, target_lang = _languages(src_dir, settings, source_lang, target_lang)
    weights = upgrade_state_dict(state["model"])
    rows = weights["encoder.embed_tokens.weight"].shape[0]
    symbols = fairseq_vocabulary(src_dir, settings, rows, source_lang, target_lang)
    check_codes_match(codes, src_dir / f"dict.{source_lang}.txt", symbols)
    model = vaswani_from_fairseq_layout(settings, weights, where=str(path))
    set_decoding(model, paper_decoding)
    given = {"aggressive_dash_splits": aggressive_dash_splits, "escape": escape}
    report = report or (lambda line: None)
    moses = moses_options(settings, symbols, given, report)
    if note := layerdrop_note(settings):
        report(note)

    def fill(folder: Path) -> None:
        model.save_pretrained(folder)
        (folder / "vocab.json").write_text(json.dumps({s: i for i, s in enumerate(symbols)}, ensure_ascii=False))
        tokenizer = MosesBPETokenizer(
            vocab_file=str(folder / "vocab.json"),
            codes_file=str(codes),
            source_lang=source_lang,
            target_lang=target_lang,
            aggressive_dash_splits=moses["aggressive_dash_splits"]["value"],
            escape=moses["escape"]["value"],
            normalize_punctuation=normalize_punctuation,
            model_max_length=settings.get("max_source_positions", 1024),
        )
        tokenizer.save_pretrained(folder)
        origin = {"format": "fairseq", "checkpoint": path.name, "arch": settings.get("arch") or settings.get("_name"),
                  "moses": moses}  # fmt: skip
        write_languages(folder, source_lang, target_lang, origin)

    return write_folder(out_dir, fill)


__all__ = [
    "FairseqArchiveError",
    "convert_fairseq_checkpoint",
    "load_fairseq_checkpoint",
    "upgrade_state_dict",
    "vaswani_from_fairseq_layout",
]
