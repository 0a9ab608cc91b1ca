# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

This file is also shipped as Hub remote code: it imports only `transformers`, `huggingface_hub` (which
Transformers requires) and the standard library. No `from __future__ import annotations`: `@strict` checks each
field against its annotation, which must be a real type, not a string.
"""

import math
import sys

from huggingface_hub.dataclasses import strict
from transformers.activations import ACT2FN
from transformers.configuration_utils import PreTrainedConfig

POSITION_EMBEDDING_TYPES = ("sinusoidal", "sinusoidal_split", "sinusoidal_fairseq", "learned")
NORM_POSITIONS = ("post", "pre")

# Paper symbol -> the config fields it sets (both stacks where the paper has one symbol for both).
PAPER_ALIASES = {
    "N": ("encoder_layers", "decoder_layers"),
    "num_layers": ("encoder_layers", "decoder_layers"),
    "h": ("encoder_attention_heads", "decoder_attention_heads"),
    "num_heads": ("encoder_attention_heads", "decoder_attention_heads"),
    "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim"),
    "d_k": ("d_kv",),
    "d_v": ("d_kv",),
    "P_drop": ("dropout",),
    "p_drop": ("dropout",),
}


def _served_without_remote_code(custom_pipelines: dict | None) -> bool:
    """Whether Transformers' pipeline registry already serves every task of a saved config's `custom_pipelines` with
    the class it names (so after `import vaswani_hf`; never where the model is loaded as remote code alone)."""
    pipelines = sys.modules.get("transformers.pipelines")  # not imported: nothing can have registered the task
    if not custom_pipelines or pipelines is None:
        return False
    for task, declared in custom_pipelines.items():
        served = pipelines.PIPELINE_REGISTRY.supported_tasks.get(task) or {}
        if getattr(served.get("impl"), "__name__", None) != str(declared.get("impl", "")).rsplit(".", 1)[-1]:
            return False
    return True


@strict
class VaswaniConfig(PreTrainedConfig):
    r"""
    Configuration of [`VaswaniModel`] / [`VaswaniForConditionalGeneration`]: the encoder-decoder Transformer of
    Vaswani et al. (2017), section 3. The defaults are the paper's base model (Table 3); `VaswaniConfig.big()`,
    `.small()` and `.tiny()` give the other presets and accept overrides.

    Label smoothing (section 5.4) is a training setting, not a property of the model: `forward(...,
    label_smoothing=0.1)` smooths one loss, and `vaswani train` / `VaswaniTrainer` pass their
    `label_smoothing_factor` during training steps only. (A `label_smoothing` key in an older config.json is kept
    as an attribute and ignored.)

    Paper symbols are accepted as keyword aliases: `N`/`num_layers` (both stacks), `h`/`num_heads` (both stacks),
    `d_ff` (both stacks), `d_k`/`d_v` (= `d_kv`; the paper keeps d_k = d_v), `P_drop` (= `dropout`).

    Args:
        vocab_size: size of the shared source-target vocabulary (paper: ~37,000 BPE tokens for EN-DE).
        d_model: model width (512 base, 1024 big).
        encoder_layers / decoder_layers: N, layers per stack (6).
        encoder_attention_heads / decoder_attention_heads: h, attention heads (8 base, 16 big).
        encoder_ffn_dim / decoder_ffn_dim: d_ff, inner size of the position-wise feed-forward network.
        d_kv: d_k = d_v, the per-head query/key/value size. `None` means d_model / heads (the paper's presets);
            Table 3 rows (B) vary it alone, so it may be set with any head count.
        dropout: P_drop, applied to every sub-layer output before the residual add and to the embedding +
            position sums (0.1 base, 0.3 big).
        attention_dropout: dropout on the attention probabilities. The paper does not use one: 0.0.
        activation_dropout: dropout inside the feed-forward network, after the ReLU. The paper's first
            tensor2tensor config used 0.0, later ones 0.1; we follow the paper: 0.0.
        activation_function: non-linearity of the feed-forward network ("relu" as in the paper; any name of
            `transformers.activations.ACT2FN` works, e.g. "swish" for converted Opus-MT checkpoints).
        position_embedding_type: "sinusoidal" (the paper's interleaved layout, PE[2i] = sin, PE[2i+1] = cos),
            "sinusoidal_split" (all sines then all cosines: the Marian/fairseq layout, for converted
            checkpoints), "sinusoidal_fairseq" (fairseq's and FSMT's table: sines then cosines with the frequency
            exponent k / (d_model/2 - 1), and the first token at row `pad_token_id + 1`, for converted fairseq
            models) or "learned" (Table 3 row E). Sinusoids are computed, never saved, and extend past
            `max_position_embeddings` on demand.
        max_position_embeddings: rows of the learned position table, and of the precomputed sinusoid table.
        scale_embedding: multiply token embeddings by sqrt(d_model) (section 3.4).
        tie_word_embeddings: the paper's three-way sharing of source embedding, target embedding and
            pre-softmax projection (section 3.4). `share_embeddings` is an alias. When False, all three are
            separate matrices.
        norm_position: "post" (the paper: `LayerNorm(x + Dropout(Sublayer(x)))`, no final stack norm) or "pre"
            (`x + Dropout(Sublayer(LayerNorm(x)))` with a final LayerNorm per stack, for ablations).
        layer_norm_eps: LayerNorm epsilon. The paper does not say; we use tensor2tensor's 1e-6 (PyTorch's
            default is 1e-5; converters copy the peer's value).
        init_std: `None` (default) initialises like the reference code bases: Xavier-uniform linear layers and
            N(0, d_model^-0.5) embeddings. A float gives every weight N(0, init_std) as most Transformers
            models do (measured: 0.02 does not learn at small d_model).
        output_bias: add a learned bias to the output logits. The paper has none; converted Marian (Opus-MT)
            checkpoints have one (`final_logits_bias`).
        pad_token_id / bos_token_id / eos_token_id / unk_token_id: special token ids of the shared vocabulary.
        decoder_start_token_id: the token the decoder starts from (`bos_token_id` unless set).
        use_cache: return and reuse key/value caches in decoding.
        alignment_layer / alignment_heads: the decoder layer (0-based; negative counts from the last) and heads
            whose cross-attention, averaged, gives word alignments (`generate(..., return_alignments=True)`).
            `None`: all heads of the penultimate layer of a decoder of 4 or more layers (Garg et al., 2019, found
            it aligns best in 6-layer models trained without alignments), of the last layer of shallower ones
            (measured on a 2-layer model of the built-in task: 95% of the last layer's links are right, 60% of
            the first's).
    """

    model_type = "vaswani"
    # Trainer's evaluation leaves the key/value cache out of the logits: its field is `cache` from Transformers 5.24
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    # Generation sizes its caches from num_hidden_layers / num_attention_heads: point them at the decoder.
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "decoder_attention_heads",
        "num_hidden_layers": "decoder_layers",
        "share_embeddings": "tie_word_embeddings",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    d_kv: int | None = None
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    activation_function: str = "relu"
    position_embedding_type: str = "sinusoidal"
    max_position_embeddings: int = 1024
    scale_embedding: bool = True
    tie_word_embeddings: bool = True
    norm_position: str = "post"
    layer_norm_eps: float | int = 1e-6
    init_std: float | int | None = None
    output_bias: bool = False
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    unk_token_id: int | None = 3
    decoder_start_token_id: int | None = None
    use_cache: bool = True
    is_encoder_decoder: bool = True
    alignment_layer: int | None = None
    alignment_heads: list[int] | None = None

    def __post_init__(self, **kwargs):
        for alias, targets in PAPER_ALIASES.items():
            if alias in kwargs:
                value = kwargs.pop(alias)
                for target in targets:
                    setattr(self, target, value)
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.bos_token_id
        if _served_without_remote_code(kwargs.get("custom_pipelines")):
            # `pipeline(task, model=DIR)` asks for trust_remote_code for any task the config declares: with the
            # package imported, Transformers' registry serves the same class, so the declaration is dropped on load
            # (a model's `save_pretrained` writes it again)
            kwargs.pop("custom_pipelines")
        super().__post_init__(**kwargs)

    def attention_head_size(self, num_heads: int) -> int:
        """d_k = d_v for a stack with `num_heads` heads."""
        return self.d_kv if self.d_kv is not None else self.d_model // num_heads

    # Validation is Transformers' own: `@strict` checks every field's type on construction, on load and on each
    # assignment, then runs these `validate_*` methods (huggingface_hub raises StrictDataclassClassValidationError
    # with our message inside). Each names the field and the fix.
    def validate_sizes(self) -> None:
        positive = ("vocab_size d_model encoder_layers decoder_layers encoder_attention_heads decoder_attention_heads "
                    "encoder_ffn_dim decoder_ffn_dim max_position_embeddings").split()  # fmt: skip
        for name in positive + (["d_kv"] if self.d_kv is not None else []):
            if getattr(self, name) <= 0:
                raise ValueError(f"VaswaniConfig: `{name}` must be a positive integer, got {getattr(self, name)!r}.")
        for name in ("layer_norm_eps", "init_std"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"VaswaniConfig: `{name}` must be a positive number, got {value!r}.")

    def validate_architecture(self) -> None:
        if self.d_kv is None:
            for name in ("encoder_attention_heads", "decoder_attention_heads"):
                heads = getattr(self, name)
                if self.d_model % heads:
                    raise ValueError(
                        f"VaswaniConfig: d_model={self.d_model} is not divisible by {name}={heads}. "
                        f"Choose a head count that divides d_model, or set `d_kv` (d_k = d_v) explicitly."
                    )
        if self.activation_function not in ACT2FN:
            raise ValueError(
                f"VaswaniConfig: unknown `activation_function` {self.activation_function!r}; "
                f"use 'relu' (the paper) or another name from transformers.activations.ACT2FN."
            )
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"VaswaniConfig: unknown `position_embedding_type` {self.position_embedding_type!r}; "
                f"expected one of {POSITION_EMBEDDING_TYPES}."
            )
        if self.position_embedding_type != "learned" and self.d_model % 2:
            raise ValueError(
                f"VaswaniConfig: sinusoidal positions need an even d_model, got {self.d_model}; "
                "use an even d_model or position_embedding_type='learned'."
            )
        if self.position_embedding_type == "sinusoidal_fairseq" and (self.d_model < 4 or self.pad_token_id is None):
            raise ValueError(
                "VaswaniConfig: position_embedding_type='sinusoidal_fairseq' needs d_model >= 4 (its frequencies "
                f"divide by d_model/2 - 1) and a pad_token_id (its first token sits at row pad_token_id + 1); got "
                f"d_model={self.d_model}, pad_token_id={self.pad_token_id}."
            )
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(
                f"VaswaniConfig: unknown `norm_position` {self.norm_position!r}; expected 'post' (the paper) or 'pre'."
            )

    def validate_alignment(self) -> None:
        layer = self.alignment_layer
        if layer is not None and not -self.decoder_layers <= layer < self.decoder_layers:
            raise ValueError(f"VaswaniConfig: `alignment_layer`={layer} is not a decoder layer: give 0 to "
                             f"{self.decoder_layers - 1} (-1: the last), or None for the default layer.")  # fmt: skip
        heads = self.alignment_heads
        if heads is not None and (not heads or any(not 0 <= h < self.decoder_attention_heads for h in heads)):
            raise ValueError(f"VaswaniConfig: `alignment_heads`={heads} must name heads 0 to "
                             f"{self.decoder_attention_heads - 1} (at least one), or be None for all.")  # fmt: skip

    @property
    def alignment_layer_index(self) -> int:
        """The decoder layer whose cross-attention gives word alignments (see `alignment_layer`)."""
        if self.alignment_layer is None:
            return self.decoder_layers - (2 if self.decoder_layers >= 4 else 1)
        return self.alignment_layer % self.decoder_layers

    def validate_dropout(self) -> None:
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"VaswaniConfig: `{name}` must be a number in [0, 1), got {getattr(self, name)!r}.")

    def validate_special_tokens(self) -> None:
        # Transformers' own validate_token_ids only warns (Hub configs with pad_token_id=-1 must still load); an
        # id outside the vocabulary here would fail later inside the embedding, so it is an error.
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"VaswaniConfig: `{name}`={value!r} is outside the vocabulary [0, {self.vocab_size}); "
                    "give an id below vocab_size or None."
                )

    @property
    def embedding_init_std(self) -> float:
        return self.init_std if self.init_std is not None else math.sqrt(1.0 / self.d_model)

    # Presets: the paper's Table 3, plus CPU-sized ones. Every preset takes overrides.
    @classmethod
    def base(cls, **overrides) -> "VaswaniConfig":
        """Table 3 "base": N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1 (65M parameters)."""
        return cls(**overrides)

    @classmethod
    def big(cls, **overrides) -> "VaswaniConfig":
        """Table 3 "big": N=6, d_model=1024, d_ff=4096, h=16, d_k=d_v=64, P_drop=0.3 (213M parameters)."""
        return cls._preset(overrides, d_model=1024, ffn=4096, heads=16, dropout=0.3)

    @classmethod
    def parse(cls, **overrides) -> "VaswaniConfig":
        """Section 6.3's parser: N=4, d_model=1024; the paper gives no more, so the rest is tensor2tensor's
        `transformer_parsing_base`, which its authors ran: d_ff=2048 and h=8 as the base model (d_k=d_v=128),
        P_drop=0.2 on the sub-layers and the attention weights (the paper tuned it on section 22; 0.2 sits between
        base's 0.1 and big's 0.3, for 40K sentences)."""
        return cls._preset(overrides, d_model=1024, layers=4, dropout=0.2, attention_dropout=0.2)

    @classmethod
    def small(cls, **overrides) -> "VaswaniConfig":
        """CPU-sized: d_model=256, 3+3 layers, 4 heads, d_ff=1024, 8,000-token vocabulary."""
        return cls._preset(overrides, vocab_size=8000, d_model=256, layers=3, heads=4, ffn=1024)

    @classmethod
    def tiny(cls, **overrides) -> "VaswaniConfig":
        """Test-sized: d_model=32, 2+2 layers, 4 heads, d_ff=64, 99-token vocabulary."""
        return cls._preset(overrides, vocab_size=99, d_model=32, layers=2, heads=4, ffn=64, max_position_embeddings=64)

    @classmethod
    def _preset(cls, overrides: dict, layers: int = 6, heads: int = 8, ffn: int = 2048, **fields) -> "VaswaniConfig":
        # Presets name real fields, so an override by field name or by paper alias both win over the preset.
        preset = dict(
            encoder_layers=layers,
            decoder_layers=layers,
            encoder_attention_heads=heads,
            decoder_attention_heads=heads,
            encoder_ffn_dim=ffn,
            decoder_ffn_dim=ffn,
            **fields,
        )
        return cls(**{**preset, **overrides})


__all__ = ["VaswaniConfig"]
