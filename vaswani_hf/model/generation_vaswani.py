# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""`generate()` for this model: the paper's decoding (section 6.1) as defaults, run by the search of
`search_vaswani.py`, and every other mode handed to Transformers' `GenerationMixin.generate()` unchanged.

Modes handed over: sampling, Transformers' constraints, streamers, assistants, attention/hidden-state outputs,
static caches and torch.compile, custom stopping criteria, greedy scores, ... Nothing private of `GenerationMixin`
is overridden, so the model works with any Transformers release that has the public API used here. Beam search
returns what Transformers' returns: `sequences_scores`, and with `return_dict_in_generate` the `beam_indices` and
(`output_scores` / `output_logits`) the per-step scores that `compute_transition_scores` reads.
tests/test_generation_contract.py holds every mode and option to Marian's `generate()` on the same weights.

The rooms: `search_vaswani.py` (the decoding core: greedy search and the one beam step), `lexical_vaswani.py`
(prefixes, and constraints as a hook on the beam step), `decoding_state_vaswani.py` (caches and the decoding step),
`alignment_vaswani.py` (alignments). The installed package adds its speed paths through one seam, `SPEEDUPS`
(`vaswani_hf/model/speed/`: the CPU fast products behind the `cpu_fast_paths` switch, the same searches with static
shapes for CUDA graphs behind `graph_decoding`); remote code decodes without them, with the same tokens and scores.
Shipped as Hub remote code beside the modeling file: imports only torch, transformers and the files beside it.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    GenerateBeamEncoderDecoderOutput,
    GenerateEncoderDecoderOutput,
    GenerationConfig,
    GenerationMixin,
    GenerationMode,
    LogitNormalization,
    LogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    SuppressTokensLogitsProcessor,
)
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import logging

from .alignment_vaswani import with_alignments
from .decoding_state_vaswani import DecodingState, ModelProducts
from .lexical_vaswani import LexicalRequests
from .search_vaswani import (
    FORCED_EOS_SCORES,
    LENGTH_PENALTY_TYPES,
    DecodingSettings,
    beam_search,
    force,
    greedy_search,
    limit_reached,
)

logger = logging.get_logger(__name__)


class SourceLengthLimitLogitsProcessor(LogitsProcessor):
    """The source-length limit (`limit_reached`) for Transformers' own loop, where generate() hands a call over:
    EOS is forced on every row (batch x beams) at its own source length + offset, so a batch of short and long
    sources decodes each sentence as it would decode alone."""

    def __init__(self, max_output_lengths: torch.LongTensor, eos_token_id: int):
        self.max_output_lengths = max_output_lengths
        self.eos_token_id = eos_token_id
        self.prompt_length: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
            rows_per_example = input_ids.shape[0] // self.max_output_lengths.shape[0]
            self.max_output_lengths = self.max_output_lengths.to(input_ids.device).repeat_interleave(rows_per_example)
        at_limit = limit_reached(input_ids.shape[1] - self.prompt_length, self.max_output_lengths)
        if bool(at_limit.any()):
            scores = scores.clone()  # Transformers' processors return new scores
            force(scores, True, self.eos_token_id, rows=at_limit)
        return scores


# Transformers 5.24 renamed the outputs' key/value cache from `past_key_values` to `cache`
CACHE_FIELD = "cache" if "cache" in GenerateEncoderDecoderOutput.__dataclass_fields__ else "past_key_values"


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


@dataclass
class DecodingSpeedups:
    """The seam where the installed package plugs in its speed paths (`vaswani_hf.model.speed`, at import):
    `cpu_products`, a `ModelProducts` that computes the same logits faster on CPU; `cpu_exact_products`, one that
    computes the same bits as `ModelProducts` with less around them (the decoder's step without module calls), for
    CPU searches with the fast products off; `graphs`, a module with `graph_decoding(asked, device)` (the switch),
    `fits(settings, model)` and `graphed_search(model, settings, hidden, mask)` (the static-shape search). Empty in
    remote code: the plain products and the eager search."""

    cpu_products: type | None = None
    cpu_exact_products: type | None = None
    graphs: object | None = None


SPEEDUPS = DecodingSpeedups()


@dataclass
class Source:
    """The source side of a generate() call."""

    input_ids: torch.LongTensor | None
    attention_mask: torch.Tensor | None
    encoder_outputs: BaseModelOutput | tuple | None
    lengths: torch.LongTensor  # on the CPU


def _ids(value) -> tuple[int, ...] | None:
    """A token id or a list of them (a generation config allows both) as a tuple, None for none."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    return tuple(int(token) for token in value) if isinstance(value, (list, tuple)) else (int(value),)


def _replacing_a_setting(config: GenerationConfig, logits_processor: LogitsProcessorList | None) -> str | None:
    """A caller's processor of the very class that a setting of the call makes (`min_length` makes a
    `MinLengthLogitsProcessor`): Transformers' loop runs the caller's in its place and drops the setting's, with a
    warning, where our search would apply both; such a call goes to the loop."""
    eos = config.eos_token_id is not None
    made = {
        MinLengthLogitsProcessor: eos and (config.min_length or 0) > 0,
        MinNewTokensLengthLogitsProcessor: eos and (config.min_new_tokens or 0) > 0,
        NoBadWordsLogitsProcessor: bool(config.bad_words_ids),
        ForcedBOSTokenLogitsProcessor: config.forced_bos_token_id is not None,
        ForcedEOSTokenLogitsProcessor: config.forced_eos_token_id is not None,
        SuppressTokensLogitsProcessor: bool(config.suppress_tokens),
        LogitNormalization: bool(config.renormalize_logits),
    }
    for processor in logits_processor or ():
        if made.get(type(processor)):
            return (
                f"a `logits_processor` of type {type(processor).__name__}, which takes the place of the settings' own"
            )
    return None


def _left_out(name: str, model, generation_config: GenerationConfig | None, kwargs: dict) -> bool:
    """Whether neither the call (a keyword, the generation config it passes) nor the model's generation config sets
    `name`: Transformers' loop then reads its default its own way (`has_default_max_length`)."""
    return (kwargs.get(name) is None and getattr(generation_config, name, None) is None
            and getattr(model.generation_config, name, None) is None)  # fmt: skip


def cpu_fast_paths(asked: bool | None = None) -> bool:
    """Whether decoding on CPU computes its products through the package's fast products (same tokens and scores):
    `generate(cpu_fast_paths=...)` when given, else the environment's `VASWANI_CPU_FAST_PATHS` (0, false, no or
    off turn them off), else on, but under `torch.use_deterministic_algorithms(True)`: the fast products pick
    their way by stopwatch, and two ways round differently, so a run's last bits would depend on its timings."""
    if asked is not None:
        return bool(asked)
    if torch.are_deterministic_algorithms_enabled():
        return False
    return not switched_off("VASWANI_CPU_FAST_PATHS")


def switched_off(variable: str) -> bool:
    """Whether the environment turns a speed path off: `variable` set to 0, false, no or off."""
    return os.environ.get(variable, "").strip().lower() in ("0", "false", "no", "off")


def forward_wrapped(model) -> str | None:
    """Why a caller that wrapped this model's `forward()` gets Transformers' loop, or None. The own search steps
    the decoder directly, without `forward()`; a caller that replaced `forward` on the instance (Transformers'
    exporters record its calls to cut `generate()` into prefill and decode graphs; a tracer, a counting hook)
    needs every step to go through it, as Transformers' loop does. Accelerate wraps `forward` too, and keeps the own
    search: its device hooks (`_hf_hook`) only move tensors, which the submodules' own hooks also do; its mixed
    precision (`_original_forward`, Seq2SeqTrainer's bf16/fp16 evaluation) is autocast around a forward pass."""
    if not isinstance(model, torch.nn.Module) or "forward" not in vars(model):
        return None
    if hasattr(model, "_hf_hook") or "_original_forward" in vars(model):
        return None
    return "a wrapped `forward()` (an exporter or tracer recording its calls)"


class VaswaniGenerationMixin:
    """`generate()` with the paper's decoding (section 6.1) as defaults; see the module docstring.

    Extra generation settings (arguments of `generate()` or attributes of the generation config):
    `length_penalty_type` ("gnmt": ((5 + |Y|) / 6) ** length_penalty, the paper's; "hf": |Y| ** length_penalty,
    Transformers') and `max_length_offset` (each output at most source length + offset tokens, EOS forced there;
    `None` for Transformers' `max_length`). An explicit `max_length`/`max_new_tokens`, as a keyword or in the call's
    `generation_config`, wins over the offset. `forced_eos_score` ("zero", Transformers': the EOS that
    `forced_eos_token_id` forces at the length cap scores 0; "model", fairseq's: it keeps the model's own
    log-probability, so a hypothesis cut at the cap pays for ending there as fairseq-generate's does; where no
    `forced_eos_token_id` is set, "model" forces the model's `eos_token_id` at the cap, as fairseq does).

    Extra arguments of `generate()`: `vocabulary_shortlist` (target ids to score, `vaswani_hf.translation.shortlist`),
    `output_sequence_scores=True` (beam search's `sequences_scores` alone; Transformers' `output_scores` also keeps
    every step's (rows x vocabulary) scores), `return_alignments`, `force_words`, `target_prefix`, `word_start_ids`,
    `output_cache=False` (no decoder cache in a `return_dict_in_generate` output, which then costs no decoder pass
    to rebuild), `cpu_fast_paths` (False: the model's own products, without the package's fast products; default:
    on unless the environment sets `VASWANI_CPU_FAST_PATHS=0`), `graph_decoding` (the package's static-shape search,
    its step a CUDA graph on CUDA; default: on for CUDA unless `VASWANI_GRAPH_DECODING=0`). Remote code, where the
    package is absent, has neither: both then decode with the plain products and the eager search.
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
        eos_score = kwargs.pop("forced_eos_score", getattr(config, "forced_eos_score", "zero"))
        if penalty_type not in LENGTH_PENALTY_TYPES:
            raise ValueError(f"length_penalty_type must be one of {LENGTH_PENALTY_TYPES}, got {penalty_type!r}.")
        if eos_score not in FORCED_EOS_SCORES:
            raise ValueError(f"forced_eos_score must be one of {FORCED_EOS_SCORES} (Transformers' 0 or the model's own "
                             f"log-probability, as fairseq), got {eos_score!r}.")  # fmt: skip
        eos = kwargs.get("eos_token_id", config.eos_token_id)
        if eos_score == "model" and "forced_eos_token_id" not in kwargs and config.forced_eos_token_id is None:
            # fairseq's score is of the </s> it forces at the cap: the preset (`DECODING_PRESETS["fairseq"]`) passed
            # to generate() on a model that forces none would otherwise run on past it, silently not fairseq's. The
            # call's own EOS (its first, for a list); `forced_eos_token_id=None` passed by name forces none.
            kwargs["forced_eos_token_id"] = eos[0] if isinstance(eos, list | tuple) and eos else eos
        explicit_length = self._length_asked(generation_config, kwargs)
        # read before the model's config and Transformers' defaults fill them in (the loop's `has_default_*_length`)
        left_out = {name: _left_out(name, self, generation_config, kwargs) for name in ("max_length", "min_length")}
        # the cache comes back where the caller asks for a dict (not where only our own options need one)
        cache_asked = bool(kwargs.get("return_dict_in_generate", config.return_dict_in_generate))
        cache_asked = kwargs.pop("output_cache", None) is not False and cache_asked
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
        fast = cpu_fast_paths(kwargs.pop("cpu_fast_paths", None))
        graphs = kwargs.pop("graph_decoding", None)
        if sequence_scores:
            kwargs["return_dict_in_generate"] = True
        model_kwargs = config.update(**kwargs)
        if inputs is not None:
            model_kwargs.setdefault("input_ids", inputs)
        source = self._source(model_kwargs, config)
        self._loop_lengths(config, left_out, model_kwargs.get("decoder_input_ids"))
        lexical = LexicalRequests.check(self.config, config, force_words, force_words_ids, target_prefix,
                                        source.lengths.shape[0], word_start_ids)  # fmt: skip
        use_offset = offset is not None and not explicit_length and config.max_new_tokens is None
        limits = source.lengths + offset if use_offset else None
        limits = self._fit_position_table(config, limits, model_kwargs.get("decoder_input_ids"), lexical)

        if config.guidance_scale is not None and config.guidance_scale != 1:
            raise ValueError(
                f"generate(): guidance_scale={config.guidance_scale} (classifier-free guidance) works with "
                "decoder-only models: Transformers' guidance runs the model again on an unconditional prompt, which an "
                "encoder-decoder model has no input for. Leave guidance_scale unset (or 1)."
            )
        reason = self._handed_over_because(config, model_kwargs, logits_processor)
        asked = " and ".join(filter(None, [lexical.asked, "`vocabulary_shortlist`" if shortlist is not None else None]))
        if reason is not None and asked:
            prompt = reason in ("`decoder_input_ids`", "`decoder_inputs_embeds`")
            advice = ("Give the prefix as `target_prefix=` instead (each example's tokens after the decoder start "
                      "token), which this model's search continues") if prompt else (
                      "Drop that option (`target_prefix=` is this model's way to continue a prefix)")  # fmt: skip
            raise ValueError(
                f"generate(): {asked} runs in this model's greedy and beam search, but {reason} hands the call "
                f"to Transformers' own loop, which has neither. {advice}."
            )
        if reason is None:
            output = self._decode(config, model_kwargs, source, limits, penalty_type, logits_processor, lexical,
                                  shortlist, sequence_scores, fast, graphs, eos_score)  # fmt: skip
            if cache_asked and config.use_cache and isinstance(self, torch.nn.Module):
                output[CACHE_FIELD] = self._cache_of(output.sequences, source)
            return with_alignments(self, output, source) if return_alignments else output
        if penalty_type == "gnmt" and config.num_beams > 1 and config.length_penalty != 0:
            logger.warning_once(
                f"generate(): {reason} runs in Transformers' own loop, whose beam search scores finished hypotheses "
                "with |Y| ** length_penalty, not the GNMT penalty of length_penalty_type='gnmt'. Pass "
                "length_penalty_type='hf' to silence this."
            )
        if eos_score == "model" and config.forced_eos_token_id is not None:
            logger.warning_once(
                f"generate(): {reason} runs in Transformers' own loop, whose forced_eos_token_id scores the EOS it "
                "forces at the length cap 0, not the model's log-probability of forced_eos_score='model' (which "
                "forces the EOS where no forced_eos_token_id is set). Pass forced_eos_score='zero' (and "
                "forced_eos_token_id for a forced EOS) to silence this."
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
        return with_alignments(self, output, source) if return_alignments else output

    def _length_asked(self, generation_config: GenerationConfig | None, kwargs: dict) -> bool:
        """Whether the call asks for a length (`max_length`/`max_new_tokens`), as a keyword or in the generation
        config it passes, which then wins over the source + offset limit as Transformers' own length would. A
        passed config's lengths count where they are not the model's own (a pipeline passes a copy of those)."""
        if any(kwargs.get(name) is not None for name in ("max_length", "max_new_tokens")):
            return True
        if generation_config is None:
            return False
        return any(getattr(generation_config, name, None) is not None
                   and getattr(generation_config, name) != getattr(self.generation_config, name, None)
                   for name in ("max_length", "max_new_tokens"))  # fmt: skip

    def _loop_lengths(self, config: GenerationConfig, left_out: dict[str, bool], prompt: torch.Tensor | None) -> None:
        """The lengths as Transformers' loop reads them (`_prepare_generated_length`), into the call's own config:
        a `max_length` nobody set means `max_length` (20) new tokens after the decoder prompt, all of it cut at
        `max_position_embeddings` positions; `min_new_tokens` wins over `min_length`, with the loop's warning
        where both are set."""
        prompt_length = prompt.shape[-1] if prompt is not None else 1
        if config.max_new_tokens is None and left_out["max_length"]:
            config.max_length += prompt_length
            positions = getattr(self.config, "max_position_embeddings", None)
            config.max_length = min(config.max_length, positions) if positions is not None else config.max_length
        if config.min_new_tokens is not None:
            if not left_out["min_length"]:
                logger.warning(
                    f"Both `min_new_tokens` (={config.min_new_tokens}) and `min_length`(={config.min_length}) seem to "
                    "have been set. `min_new_tokens` will take precedence. Please refer to the documentation for more "
                    "information. (https://huggingface.co/docs/transformers/main/en/main_classes/text_generation)"
                )
            config.min_length = config.min_new_tokens + prompt_length

    def _fit_position_table(
        self,
        config: GenerationConfig,
        limits: torch.Tensor | None,
        prompt: torch.Tensor | None,
        lexical: LexicalRequests | None = None,
    ) -> torch.Tensor | None:
        """A learned position table (Table 3 row E) ends at `max_position_embeddings`: after a decoder prompt of P
        tokens (the start token, or a `decoder_input_ids` prefix), N new tokens feed P + N - 1 decoder positions.
        The source + offset limit is cut there (EOS forced); an explicit longer request, or a target prefix and
        phrases that need more tokens, is an error naming the table, not the input, before any decoding."""
        positions = self._position_table_rows()
        if positions is None:
            return limits
        prompt_length = prompt.shape[-1] if prompt is not None else 1
        room = positions - prompt_length + 1
        if room < 1:
            raise ValueError(
                f"generate(): the decoder prefix has {prompt_length} tokens, but this model's position table "
                f"has max_position_embeddings={positions}: shorten `decoder_input_ids` to at most {positions} tokens."
            )
        if lexical is not None and lexical.needed is not None and int(lexical.needed.max()) > room:
            needed = int(lexical.needed.max())
            raise ValueError(
                f"generate(): {lexical.asked} of example {int(lexical.needed.argmax())} need {needed} new tokens "
                f"(with EOS), but this model's position table has max_position_embeddings={positions}, room "
                f"for {room} after a decoder prompt of {prompt_length}: shorten the prefix or the phrases."
            )
        if limits is not None:
            return limits.clamp(max=room)
        asked = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - prompt_length
        if asked > room:
            raise ValueError(
                f"generate(): {asked} new tokens after a decoder prompt of {prompt_length} need "
                f"{asked + prompt_length - 1} decoder positions, but this model's position table has "
                f"max_position_embeddings={positions}: ask for at most max_new_tokens={room}."
            )
        return limits

    def _position_table_rows(self) -> int | None:
        """Where the decoder's positions end: a learned table's rows; None for sinusoids, computed for any position
        (an exported graph, whose sinusoids are a fixed table, says otherwise: `interop.onnx`)."""
        if getattr(self.config, "position_embedding_type", None) != "learned":
            return None
        return self.config.max_position_embeddings

    def _resolved_config(self, generation_config: GenerationConfig | None) -> GenerationConfig:
        """The call's generation config: its own settings, then the model's, then Transformers' defaults."""
        config = copy.deepcopy(generation_config if generation_config is not None else self.generation_config)
        for source in (self.generation_config.to_dict(), GENERATION_DEFAULTS):
            for name, value in source.items():
                if getattr(config, name, None) is None:
                    setattr(config, name, value)
        return config

    def _handed_over_because(self, config: GenerationConfig, model_kwargs: dict,
                             logits_processor: LogitsProcessorList | None = None) -> str | None:  # fmt: skip
        """Why this call needs Transformers' loop, or None when the decoder here runs it."""
        wrapped = forward_wrapped(self)
        if wrapped is not None:
            return wrapped
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
        return _replacing_a_setting(config, logits_processor)

    def _source(self, model_kwargs: dict, config: GenerationConfig) -> Source:
        """The encoder output (computed here unless given), its padding mask and each source's length. Without any
        source the source is `bos_token_id` alone, as Transformers starts (one example, or as many as a tensor
        argument has rows)."""
        attention_mask = model_kwargs.get("attention_mask")
        input_ids = model_kwargs.get("input_ids")
        encoder_outputs = model_kwargs.get("encoder_outputs")
        if input_ids is None and encoder_outputs is None and model_kwargs.get("inputs_embeds") is None:
            bos = config.bos_token_id if config.bos_token_id is not None else self.config.bos_token_id
            if bos is None:
                raise ValueError("`bos_token_id` has to be defined when no `input_ids` are provided.")
            rows = next((v.shape[0] for v in model_kwargs.values() if isinstance(v, torch.Tensor) and v.dim()), 1)
            input_ids = model_kwargs["input_ids"] = torch.full((rows, 1), int(bos), dtype=torch.long,
                                                               device=self.device)  # fmt: skip
        pad = self.config.pad_token_id
        # no mask inferred from the padding: Transformers' loop infers one for decoder-only models alone, so an
        # encoder-decoder's encoder attends to every position where the caller gives no mask, on every path
        if attention_mask is None and input_ids is not None and pad is not None and bool((input_ids == pad).any()):
            logger.warning_once(
                f"generate(): `input_ids` hold the padding token ({pad}) but no `attention_mask` was given, so the "
                "encoder attends to the padding, as in Transformers' own loop for encoder-decoder models. Pass the "
                "tokenizer's `attention_mask` with the `input_ids` to mask it."
            )
        candidates = (encoder_outputs, input_ids, model_kwargs.get("inputs_embeds"))
        given = next((x for x in candidates if x is not None), None)
        if given is None:
            raise ValueError("generate() needs the source: `input_ids` (with `attention_mask`) or `encoder_outputs`.")
        shape = (given[0] if isinstance(given, (tuple, BaseModelOutput)) else given).shape[:2]
        if shape[0] == 0:  # Transformers' loop refuses it in the encoder, with the same words
            raise ValueError("generate(): input_ids must be a non-empty batch: give at least one source sentence.")
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
        if config.max_new_tokens is not None and config.max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens` must be greater than 0, but is {config.max_new_tokens}.")
        if limits is None and max_new < 1:  # Transformers' own check (the decoder prompt is the start token)
            raise ValueError(
                f"Input length of decoder_input_ids is 1, but `max_length` is set to {config.max_length}. This can "
                "lead to unexpected behavior. You should consider increasing `max_length` or, better yet, setting "
                "`max_new_tokens`."
            )
        if limits is not None:
            max_new = int(limits.max())
        batch_limits = limits if limits is not None else torch.full((batch,), max_new, dtype=torch.long)
        min_new = max(config.min_length - 1, 0) if eos else 0  # `_loop_lengths` put min_new_tokens there
        eos_tensor = torch.tensor(eos, dtype=torch.long)
        return DecodingSettings(
            num_beams=config.num_beams,
            num_return_sequences=config.num_return_sequences if config.num_beams > 1 else 1,
            max_new_tokens=max(max_new, 1),
            limits=batch_limits,
            min_new_tokens=min_new,
            eos=eos_tensor,
            forced_eos=_ids(config.forced_eos_token_id),  # every id, as Transformers' ForcedEOSTokenLogitsProcessor
            limit_eos=eos[0] if limits is not None and eos else None,
            forced_bos=config.forced_bos_token_id,
            start=start,
            # Transformers' fill values: greedy pads finished rows, beam search uses `pad or eos`
            fill=(pad if pad is not None else eos[0]) if config.num_beams == 1 else ((pad or eos[0]) if eos else -1),
            length_penalty=float(config.length_penalty),  # an int ** a negative int tensor raises
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

    def _decoding_state(self, hidden: torch.Tensor, mask: torch.Tensor | None, rows_per_example: int,
                        fast: bool = True):  # fmt: skip
        """What the searches step: this model's decoder (another engine's runner gives its own: interop.onnx),
        its products computed the fastest measured way on CPU where `fast` (the `cpu_fast_paths` switch), else the
        same bits as the model's own layers compute."""
        products = ModelProducts
        if hidden.device.type == "cpu":
            products = (SPEEDUPS.cpu_products if fast else SPEEDUPS.cpu_exact_products) or ModelProducts
        return DecodingState(self, hidden, mask, rows_per_example, products)

    def _decode(self, config, model_kwargs, source, limits, penalty_type, logits_processor, lexical, shortlist=None,
                sequence_scores=False, fast=True, graphs=None, eos_score="zero"):  # fmt: skip
        settings = self._settings(config, limits, penalty_type, logits_processor, batch=source.lengths.shape[0])
        settings.sequence_scores = sequence_scores
        settings.forced_eos_keeps_score = eos_score == "model"
        if lexical.asked is not None:
            settings.prefix = lexical.prefix
            # no phrase anywhere: the paper's search as it is (`force_words=[[]] * n`)
            settings.constraints = lexical.constraints if lexical.constraints and lexical.constraints.tokens() else None
            settings.limits = torch.maximum(settings.limits, lexical.needed)  # room for the prefix and the phrases
            settings.max_new_tokens = max(settings.max_new_tokens, int(settings.limits.max()))
        hidden = self._encode(source)
        mask = source.attention_mask.to(self.device) if source.attention_mask is not None else None
        static = SPEEDUPS.graphs
        if (static is not None and isinstance(self, torch.nn.Module) and shortlist is None
                and static.graph_decoding(graphs, hidden.device) and static.fits(settings, self)):  # fmt: skip
            return self._output(settings, static.graphed_search(self, settings, hidden, mask))
        state = self._decoding_state(hidden, mask, settings.num_beams, fast)
        search = beam_search if settings.num_beams > 1 else greedy_search
        searched = settings
        if shortlist is not None:
            if not hasattr(state, "restrict"):
                raise ValueError(f"generate(vocabulary_shortlist=...) restricts a PyTorch model's output layer: "
                                 f"{type(self).__name__} has none to restrict.")  # fmt: skip
            allowed = settings.vocabulary_with(torch.as_tensor(shortlist, dtype=torch.long))
            within = settings.searches_within(allowed.numel())
            state.restrict(allowed, within)
            searched = settings.within(allowed) if within else settings
        with state.searching() if hasattr(state, "searching") else contextlib.nullcontext():
            result = search(searched, state)
        if searched is not settings:  # columns of the shortlist back to token ids (-1, "no fill", stays)
            columns = result["sequences"]
            result["sequences"] = torch.where(columns >= 0, state.shortlist[columns.clamp(min=0)], columns)
        return self._output(settings, result)

    def _cache_of(self, sequences: torch.LongTensor, source: Source):
        """The decoder's key/value cache of the returned `sequences` but their last token, which a caller continues
        from (`decoder_input_ids=sequences[:, -1:]`), as from Transformers' greedy output. The search dropped its
        own as sentences finished; one decoder pass over the outputs rebuilds it (only where a caller asks for
        `return_dict_in_generate`). Its rows are the returned sequences' (Transformers' beam search returns its
        running beams' cache instead, which no returned sequence continues)."""
        hidden = self._encode(source)
        rows = sequences.shape[0] // hidden.shape[0]
        mask = source.attention_mask
        mask = mask.to(hidden.device).repeat_interleave(rows, dim=0) if mask is not None else None
        cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        self.get_decoder()(input_ids=sequences[:, :-1], encoder_hidden_states=hidden.repeat_interleave(rows, dim=0),
                           encoder_attention_mask=mask, cache=cache, use_cache=True)  # fmt: skip
        return cache

    def _output(self, settings: DecodingSettings, result: dict):
        """A search's result as generate() returns it: the start token, then each row's tokens."""
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
