"""`vaswani translate`'s light start: its input, of any length, translated on torch alone, so that a line piped to
the command waits for the line, not for Transformers' import (0.8 s for `import transformers`, 3 s with its model
classes and generation, on 2 cores of an AMD EPYC, against 1.6 s for `import torch` itself), and a file of many
lines does not pay it either.

It computes what the model's own modules compute for the paper's decoding (the same weights, the same
`F.linear`, `F.layer_norm`, `F.scaled_dot_product_attention` and masks in the same order, as
`model/speed/lean_step.py` does for the decoder's step; in int8 the linear layers quantized as
`precision.quantize_int8` quantizes the model's) and decodes with the model's own searches
(`search_vaswani.greedy_search` / `beam_search` over a decoding state of its own), its batches side by side as the
model's path decodes them (`batch_workers`, at any rows: at one or two rows too, which the model's path decodes
one batch at a time), the folder's `tokenizer.json` run by the `tokenizers` library, so its
lines are the same strings `vaswani translate` writes through Transformers (tests/test_light_translator.py draws
models, configurations, lines and settings and compares both). The Transformers model's fast products
(`model/speed`) are not here: measured without them, whole processes ran faster than the model's path, its import
included (docs/decoding.md, "The light start").

It translates only where that holds, and hands over otherwise (`LightTranslator.of` gives None, or `takes` says
no to the command's settings), before any line is read: any option but the search's beam and length penalty or
the paper's preset (and a greedy search given a beam's settings, of which Transformers warns); a folder it does not
read as the model would (a configuration, generation setting, weight or tokenizer setting outside the
ones named here, e.g. converted models' position layouts, learned positions, untied embeddings, an output bias,
generation ids that are not the generation config's own single ids, special tokens other than tokenizer.json's
special added tokens) or that the model refuses (`VaswaniConfig`'s checks, weights of other shapes: the model's
path then says what is wrong). Switch: `VASWANI_LIGHT_START=0` always hands over.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

SWITCH = "VASWANI_LIGHT_START"
# what config.json may hold: any other key, or another value of these, hands over
CONFIG_VALUES = {"model_type": ("vaswani",), "norm_position": ("post", "pre"),
                 "position_embedding_type": ("sinusoidal",), "activation_function": ("relu",),
                 "tie_word_embeddings": (True,), "output_bias": (False,), "is_encoder_decoder": (True,),
                 "dtype": ("float32", "bfloat16")}  # fmt: skip
SIZES = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
)  # fmt: skip  (required: VaswaniConfig's
# defaults are the base model's, which a folder without them would not hold)
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id", "decoder_start_token_id")
CONFIG_KEYS = {"activation_dropout", "alignment_heads", "alignment_layer", "architectures", "attention_dropout",
               "auto_map", "custom_pipelines", "d_kv", "dropout", "init_std", "layer_norm_eps",
               "max_position_embeddings", "scale_embedding", "transformers_version", "use_cache", *SIZES, *TOKEN_IDS,
               *CONFIG_VALUES}  # fmt: skip
# what generation_config.json may hold: the paper's decoding and its own ids
GENERATION_KEYS = {"_from_model_config", "bos_token_id", "decoder_start_token_id", "early_stopping", "eos_token_id",
                   "length_penalty", "length_penalty_type", "max_length_offset", "num_beams", "output_attentions",
                   "output_hidden_states", "pad_token_id", "transformers_version", "use_cache"}  # fmt: skip
TOKENIZER_KEYS = {"backend", "bos_token", "eos_token", "is_local", "local_files_only", "model_max_length", "pad_token",
                  "tokenizer_class", "unk_token"}  # fmt: skip
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# the search settings `vaswani translate` may give over the folder's (`cli_decoding._decoding`: --num-beams,
# --length-penalty, the paper's preset)
SETTINGS = {"num_beams", "length_penalty", "length_penalty_type", "max_length_offset", "early_stopping"}
MAX_LENGTH = 10**9  # no limit, as `source_lines.source_limit` counts one


def switched_on(variable: str = SWITCH) -> bool:
    """Whether the environment leaves a switch on: not set to 0, false, no or off (`generation_vaswani.switched_off`'s
    words, read here without importing Transformers)."""
    return os.environ.get(variable, "").strip().lower() not in ("0", "off", "false", "no")


def _json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _unique(pairs: list[tuple]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):  # Transformers reads the last of a repeated key: leave the choice to it
        raise ValueError("a repeated key")
    return dict(pairs)


def _integer(value, low: int = 1, high: float = math.inf) -> bool:
    return type(value) is int and low <= value < high


def _number(value, low: float = 0.0, high: float = math.inf) -> bool:
    return type(value) in (int, float) and low <= value < high


def _plain_config(config: dict) -> bool:
    """Whether config.json is one this translator reads as the model does: its keys and values (`CONFIG_VALUES`),
    and what `VaswaniConfig`'s own checks accept (its types and ranges), so that a folder the model refuses with a
    clear error goes to the model to be refused."""
    if not set(config) <= CONFIG_KEYS or not all(key in config for key in (*SIZES, "model_type")):
        return False
    if not all(config.get(key, options[0]) in options and type(config.get(key, options[0])) is type(options[0])
               for key, options in CONFIG_VALUES.items()):  # fmt: skip
        return False
    if not all(_integer(config[key]) for key in SIZES) or not _integer(config.get("max_position_embeddings", 1024)):
        return False
    d_kv, vocab, d_model = config.get("d_kv"), config["vocab_size"], config["d_model"]
    heads = (config["encoder_attention_heads"], config["decoder_attention_heads"])
    if (d_kv is not None and not _integer(d_kv)) or (d_kv is None and any(d_model % h for h in heads)) or d_model % 2:
        return False
    init_std = config.get("init_std")
    if not _number(config.get("layer_norm_eps", 1e-6), 1e-300) or not (init_std is None or _number(init_std, 1e-300)):
        return False
    if not all(_number(config.get(key, 0.0), 0.0, 1.0) for key in ("dropout", "attention_dropout",
                                                                   "activation_dropout")):  # fmt: skip
        return False
    if not all(config.get(key) is None or _integer(config[key], 0, vocab) for key in TOKEN_IDS):
        return False
    layer, alignment_heads = config.get("alignment_layer"), config.get("alignment_heads")
    layers = config["decoder_layers"]
    if layer is not None and not _integer(layer, -layers, layers):
        return False
    if alignment_heads is not None and not (isinstance(alignment_heads, list) and alignment_heads
                                            and all(_integer(h, 0, heads[1]) for h in alignment_heads)):  # fmt: skip
        return False
    return type(config.get("scale_embedding", True)) is bool and type(config.get("use_cache", True)) is bool


def _plain_generation(generation: dict, vocab: int) -> bool:
    """Whether generation_config.json holds the paper's decoding alone, with the ids the model's generate() reads
    from it (its own: not config.json's) as single token ids."""
    if not set(generation) <= GENERATION_KEYS:
        return False
    settings = (_integer(generation.get("num_beams")) and _integer(generation.get("max_length_offset"), -(2**31))
                and _number(generation.get("length_penalty", 1.0), -math.inf)
                and generation.get("length_penalty_type", "hf") in ("gnmt", "hf")
                and _stopping(generation.get("early_stopping", False)))  # fmt: skip
    ids = (all(_integer(generation.get(key), 0, vocab) for key in ("eos_token_id", "decoder_start_token_id"))
           and all(generation.get(key) is None or _integer(generation[key], 0, vocab)
                   for key in ("pad_token_id", "bos_token_id")))  # fmt: skip
    flags = all(generation.get(key, default) is default for key, default in (
        ("output_attentions", False), ("output_hidden_states", False), ("use_cache", True)))  # fmt: skip
    return bool(settings and ids and flags) and not greedy_with_beam_settings(generation, generation)


def _stopping(value) -> bool:
    return type(value) is bool or value == "never"


def greedy_with_beam_settings(settings: dict, given: dict) -> bool:
    """Whether a greedy search (`settings`' beams: 1) is `given` a beam search's length penalty or stopping rule,
    which Transformers' generation config names in a warning ("generation flags are not valid") that the light
    start does not print: such a run goes to the model, whose warning it is."""
    return settings.get("num_beams") == 1 and any(key in given for key in ("length_penalty", "early_stopping"))


def _plain_tokenizer(tokenizer_config: dict, spec: dict | None) -> bool:
    """Whether tokenizer.json (`spec`) with tokenizer_config.json is a tokenizer the `tokenizers` library runs as
    Transformers does for translation: named special tokens that are exactly tokenizer.json's added tokens, all
    special (what decoding skips), no padding or truncation of its own, a plain length."""
    if spec is None or not set(tokenizer_config) <= TOKENIZER_KEYS:
        return False
    if tokenizer_config.get("tokenizer_class") not in TOKENIZER_CLASSES:
        return False
    named = [tokenizer_config.get(key) for key in SPECIAL_TOKENS if key in tokenizer_config]
    if not all(isinstance(token, str) for token in named) or not isinstance(tokenizer_config.get("pad_token"), str):
        return False
    added = spec.get("added_tokens") or []
    if not all(isinstance(token, dict) and token.get("special") is True for token in added):
        return False
    if {token.get("content") for token in added} != set(named) or len(added) != len(set(named)):
        return False
    length = tokenizer_config.get("model_max_length", MAX_LENGTH)
    return spec.get("padding") is None and spec.get("truncation") is None and _integer(length)


class LightTokenizer:
    """The folder's `tokenizer.json` as its Transformers tokenizer runs it for translation: the ids of a text with
    the post-processor's EOS, cut at `max_length` where asked, and the text of ids without special tokens."""

    def __init__(self, folder: Path, config: dict) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.model_max_length = config.get("model_max_length", MAX_LENGTH)
        self.pad_token_id = self.tokenizer.token_to_id(config["pad_token"])

    def __call__(self, texts: str | list[str], truncation: bool = False, max_length: int | None = None,
                 verbose: bool = True) -> dict:  # fmt: skip
        """`tokenizer(texts, truncation=..., max_length=...)["input_ids"]`, as `source_lines` and the search read it."""
        if isinstance(texts, str):
            return {"input_ids": self(texts=[texts], truncation=truncation, max_length=max_length)["input_ids"][0]}
        limit = max_length if max_length is not None else self.model_max_length
        if truncation and limit < MAX_LENGTH:
            self.tokenizer.enable_truncation(limit)
        else:
            self.tokenizer.no_truncation()
        return {"input_ids": [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]}

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class _Linear:
    """One linear layer's product: `F.linear` over its weight and bias, or, in int8, the layer as the model's
    int8 path quantizes it (`precision.quantize_int8`, torch's dynamic quantization: the same packed weight, the same
    kernel)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias, self.quantized = weight, bias, None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            return self.quantized(hidden)
        return F.linear(hidden, self.weight, self.bias)


def _quantized(linears: list[_Linear]) -> None:
    """Each of `linears` computed in int8 from now on, quantized as the model's int8 path quantizes its
    `nn.Linear` layers (one call over all of them, as over the model)."""
    from ..model.precision import quantize_int8

    layers = torch.nn.ModuleList()
    for linear in linears:
        layer = torch.nn.Linear(linear.weight.shape[1], linear.weight.shape[0], bias=linear.bias is not None)
        layer.weight = torch.nn.Parameter(linear.weight, requires_grad=False)
        if linear.bias is not None:
            layer.bias = torch.nn.Parameter(linear.bias, requires_grad=False)
        layers.append(layer)
    for linear, layer in zip(linears, quantize_int8(layers), strict=True):
        # the packed weight alone from now on, as the model's int8 path drops its float32 model
        linear.quantized, linear.weight, linear.bias = layer, None, None


@dataclass
class _Attention:
    """One multi-head attention's weights (section 3.2): a fused input projection and the output projection."""

    heads: int
    head_dim: int
    projection: _Linear  # self-attention's Q K V, or cross-attention's K V
    query: _Linear | None  # cross-attention's Q
    output: _Linear

    def split(self, projected: torch.Tensor, blocks: int) -> tuple[torch.Tensor, ...]:
        # (batch, length, blocks * h * d_k) -> `blocks` tensors of (batch, h, length, d_k), the model's layout
        batch, length = projected.shape[:2]
        return projected.view(batch, length, blocks, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def out(self, attended: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        return self.output(attended.transpose(1, 2).contiguous().reshape(*shape, -1))


@dataclass
class _Norm:
    """A sub-layer connection (sections 3.1, 5.4): post-norm LayerNorm(x + Sublayer(x)), or pre-norm."""

    weight: torch.Tensor
    bias: torch.Tensor
    eps: float
    pre: bool

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(hidden, self.weight.shape, self.weight, self.bias, self.eps)

    def input(self, hidden: torch.Tensor) -> torch.Tensor:
        return self(hidden) if self.pre else hidden

    def connect(self, residual: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        hidden = residual + output
        return hidden if self.pre else self(hidden)


@dataclass
class _Layer:
    self_attn: _Attention
    self_norm: _Norm
    cross_attn: _Attention | None
    cross_norm: _Norm | None
    fc1: _Linear
    fc2: _Linear
    final_norm: _Norm

    def feed_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(self.final_norm.input(hidden))))


class LightTranslator:
    """A saved model folder's weights and tokenizer, translated as `vaswani translate` translates them."""

    def __init__(self, config: dict, generation: dict, weights: dict, tokenizer: LightTokenizer,
                 dtype: torch.dtype, int8: bool = False) -> None:  # fmt: skip
        self.config, self.generation, self.tokenizer, self.dtype = config, generation, tokenizer, dtype
        d_model = config["d_model"]
        self.embedding = weights["model.shared.weight"]
        self.embed_scale = math.sqrt(d_model) if config.get("scale_embedding", True) else 1.0
        eps = config.get("layer_norm_eps", 1e-6)
        pre = config.get("norm_position", "post") == "pre"

        linears: list[_Linear] = []

        def linear(name: str) -> _Linear:
            linears.append(_Linear(weights[f"{name}.weight"], weights[f"{name}.bias"]))
            return linears[-1]

        def norm(name: str) -> _Norm:
            return _Norm(weights[f"{name}.weight"], weights[f"{name}.bias"], eps, pre)

        def stack(side: str) -> list[_Layer]:
            heads = config[f"{side}_attention_heads"]
            head_dim = config.get("d_kv") or d_model // heads
            layers = []
            for i in range(config[f"{side}_layers"]):
                at = f"model.{side}.layers.{i}"
                self_attn = _Attention(heads, head_dim, linear(f"{at}.self_attn.qkv_proj"), None,
                                       linear(f"{at}.self_attn.out_proj"))  # fmt: skip
                cross = cross_norm = None
                if side == "decoder":
                    cross = _Attention(heads, head_dim, linear(f"{at}.encoder_attn.kv_proj"),
                                       linear(f"{at}.encoder_attn.q_proj"),
                                       linear(f"{at}.encoder_attn.out_proj"))  # fmt: skip
                    cross_norm = norm(f"{at}.encoder_attn_layer_norm")
                layers.append(_Layer(self_attn, norm(f"{at}.self_attn_layer_norm"), cross, cross_norm,
                                     linear(f"{at}.feed_forward.fc1"), linear(f"{at}.feed_forward.fc2"),
                                     norm(f"{at}.final_layer_norm")))  # fmt: skip
            return layers

        self.encoder_layers, self.decoder_layers = stack("encoder"), stack("decoder")
        self.encoder_norm = norm("model.encoder.layer_norm") if pre else None
        self.decoder_norm = norm("model.decoder.layer_norm") if pre else None
        self.table = self.positions(config.get("max_position_embeddings", 1024))
        # the output projection: the shared embedding (tied), no bias; in int8 quantized with the others, as the
        # model's tied output layer is (its input embedding stays float32)
        self.output = _Linear(self.embedding, None)
        if int8:
            _quantized([*linears, self.output])

    @classmethod
    def of(cls, folder: str | Path, precision: str) -> LightTranslator | None:
        """The folder's translator in `precision` (fp32, bf16 or int8), or None where it would not compute what
        the model computes (the module's docstring)."""
        folder = Path(folder)
        if not switched_on() or precision not in ("fp32", "bf16", "int8") or not folder.is_dir():
            return None
        config, generation = _json(folder / "config.json"), _json(folder / "generation_config.json")
        tokenizer_config, spec = _json(folder / "tokenizer_config.json"), _json(folder / "tokenizer.json")
        if config is None or generation is None or tokenizer_config is None or not _plain_config(config):
            return None
        if not _plain_generation(generation, config["vocab_size"]) or not _plain_tokenizer(tokenizer_config, spec):
            return None
        others = {"special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.json", "merges.txt"}
        if any((folder / name).exists() for name in others):
            return None
        weights = cls._weights(folder, config)
        if weights is None:
            return None
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        # the model loads its weights in config.json's dtype (a bf16 one rounds fp32 weights), then takes `precision`
        loaded = torch.bfloat16 if config.get("dtype") == "bfloat16" else torch.float32
        weights = {name: tensor.to(loaded).to(dtype) for name, tensor in weights.items()}
        tokenizer = LightTokenizer(folder, tokenizer_config)
        if tokenizer.pad_token_id is None or tokenizer.tokenizer.get_vocab_size() > config["vocab_size"]:
            return None
        return cls(config, generation, weights, tokenizer, dtype, int8=precision == "int8")

    @staticmethod
    def _weights(folder: Path, config: dict) -> dict | None:
        """model.safetensors' tensors, where they are exactly the model's (no other file of weights)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = folder / "model.safetensors"
        if not path.is_file() or any(folder.glob("pytorch_model*.bin")) or any(folder.glob("model-*.safetensors")):
            return None
        try:
            weights = load_file(path)
        except (SafetensorError, OSError):
            return None
        shapes = {"model.shared.weight": (config["vocab_size"], config["d_model"])}
        d_model = config["d_model"]
        for side in ("encoder", "decoder"):
            inner = config[f"{side}_attention_heads"] * (
                config.get("d_kv") or d_model // config[f"{side}_attention_heads"]
            )
            ffn = config[f"{side}_ffn_dim"]
            linears = {"self_attn.qkv_proj": (3 * inner, d_model), "self_attn.out_proj": (d_model, inner),
                       "feed_forward.fc1": (ffn, d_model), "feed_forward.fc2": (d_model, ffn)}  # fmt: skip
            norms = ["self_attn_layer_norm", "final_layer_norm"]
            if side == "decoder":
                linears |= {"encoder_attn.q_proj": (inner, d_model), "encoder_attn.kv_proj": (2 * inner, d_model),
                            "encoder_attn.out_proj": (d_model, inner)}  # fmt: skip
                norms.append("encoder_attn_layer_norm")
            for i in range(config[f"{side}_layers"]):
                for name, (rows, columns) in linears.items():
                    shapes |= {f"model.{side}.layers.{i}.{name}.weight": (rows, columns),
                               f"model.{side}.layers.{i}.{name}.bias": (rows,)}  # fmt: skip
                for name in norms:
                    shapes |= {f"model.{side}.layers.{i}.{name}.{p}": (d_model,) for p in ("weight", "bias")}
            if config.get("norm_position") == "pre":
                shapes |= {f"model.{side}.layer_norm.{p}": (d_model,) for p in ("weight", "bias")}
        if set(weights) != set(shapes) or any(tuple(weights[n].shape) != shape for n, shape in shapes.items()):
            return None
        if not all(t.dtype in (torch.float32, torch.bfloat16) for t in weights.values()):
            return None
        return weights

    def positions(self, rows: int) -> torch.Tensor:
        """Section 3.5's sinusoids, PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), in float64
        then float32 as the model's table, then this translator's dtype as the model's buffer is cast."""
        d_model = self.config["d_model"]
        positions = torch.arange(rows, dtype=torch.float64)[:, None]
        angles = positions * 10000.0 ** -(torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1).to(torch.float32).to(self.dtype)

    def embed(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Scaled token embeddings plus the positions from `start` (section 3.4, 3.5)."""
        end = start + ids.shape[1]
        table = self.table if end <= self.table.shape[0] else self.positions(end)
        return F.embedding(ids, self.embedding) * self.embed_scale + table[start:end]

    def encode(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The encoder stack (section 3.1) over right-padded `ids` with their 0/1 `mask`."""
        hidden = self.embed(ids)
        length = ids.shape[1]
        attention_mask = None
        if not bool(mask.all()):  # Transformers' mask for sdpa: none where nothing is padded
            attention_mask = mask.bool()[:, None, None, :].expand(-1, 1, length, -1).contiguous()
        for layer in self.encoder_layers:
            attn = layer.self_attn
            query, key, value = attn.split(attn.projection(layer.self_norm.input(hidden)), 3)
            attended = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                      scale=attn.head_dim**-0.5)  # fmt: skip
            hidden = layer.self_norm.connect(hidden, attn.out(attended, hidden.shape[:-1]))
            hidden = layer.final_norm.connect(hidden, layer.feed_forward(hidden))
        return self.encoder_norm(hidden) if self.encoder_norm is not None else hidden

    def takes(self, settings: dict) -> bool:
        """Whether this translator decodes with these search settings (`vaswani translate`'s, over the folder's) as
        the model does, warnings included."""
        return set(settings) <= SETTINGS and not greedy_with_beam_settings({**self.generation, **settings}, settings)

    def translate_lines(self, lines: list[str], batch_size: int = 32, max_tokens: int | None = None,
                        long_lines: str = "cut", report=None, first_line: int = 1,
                        **settings) -> list[str]:  # fmt: skip
        """Each line's translation, as `translate_nbest` gives its best: an empty line stays empty, a long one is
        cut or split (`source_lines`, which also counts them in `report`, and names lines from `first_line`).
        `settings`: the search's settings that `vaswani translate` passes generate() (`cli_decoding._decoding`),
        over the folder's generation config."""
        from .source_lines import pieces_of, rejoined, source_limit

        if not self.takes(settings):
            raise ValueError(f"the light start takes only the search settings {sorted(SETTINGS)} (not a greedy "
                             f"search's length penalty or stopping rule), not {settings}.")  # fmt: skip
        limit = source_limit(None, self.tokenizer)  # sinusoids: the tokenizer's limit
        pieces = pieces_of(list(lines), self.tokenizer, limit, long_lines, first_line, report)
        texts = [piece for line in pieces for piece in line]
        translated = self.translate(texts, batch_size, max_tokens, limit, settings) if texts else []
        results, start = [], 0
        for line in pieces:
            candidates = [[(text, None)] for text in translated[start : start + len(line)]]
            results.append(rejoined(line, candidates, 1, False)[0][0])
            start += len(line)
        return results

    def translate(self, texts: list[str], batch_size: int, max_tokens: int | None, limit: int,
                  settings: dict | None = None) -> list[str]:  # fmt: skip
        """Each text's best translation (non-empty texts, cut at `limit` tokens), batched as `vaswani translate`
        batches them, and decoded side by side by the model's path's decoding workers, by its rule
        (`batch_workers.workers_for`)."""
        from ..model.search_vaswani import DecodingSettings, beam_search, greedy_search
        from .batch_workers import in_order, workers_for
        from .source_lines import batch_indices

        generation = {**self.generation, **(settings or {})}
        beams = generation["num_beams"]
        encoded = self.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]
        # the ids generate() reads: the generation config's own (`_plain_generation`), not config.json's
        eos, pad, start = (
            generation["eos_token_id"],
            generation.get("pad_token_id"),
            generation["decoder_start_token_id"],
        )

        def prepared(index: list[int]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
            """A batch's padded ids and mask (on the calling thread, as the model's path prepares its batches)."""
            longest = max(len(encoded[i]) for i in index)
            ids = torch.full((len(index), longest), self.tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(index), longest), dtype=torch.long)
            for row, i in enumerate(index):
                ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
                mask[row, : len(encoded[i])] = 1
            return index, ids, mask

        def searched(batch: tuple[list[int], torch.Tensor, torch.Tensor]) -> tuple[list[int], dict]:
            index, ids, mask = batch
            limits = mask.sum(-1) + generation["max_length_offset"]
            settings = DecodingSettings(
                num_beams=beams, num_return_sequences=1, max_new_tokens=max(int(limits.max()), 1), limits=limits,
                min_new_tokens=0, eos=torch.tensor([eos]), forced_eos=None, limit_eos=eos, forced_bos=None,
                start=start, fill=(pad if pad is not None else eos) if beams == 1 else (pad or eos),
                length_penalty=float(generation.get("length_penalty", 1.0)),
                gnmt=generation.get("length_penalty_type", "hf") == "gnmt",
                early_stopping=generation.get("early_stopping", False), suppress=None, bad_words=None,
                user_processors=[], renormalize=False, return_dict=True, output_scores=False, output_logits=False,
                sequence_scores=beams > 1,
            )  # fmt: skip
            with torch.inference_mode():
                state = _DecodingState(self, self.encode(ids, mask), mask, beams)
                return index, (beam_search if beams > 1 else greedy_search)(settings, state)

        outputs: list[str] = [""] * len(texts)
        batches = batch_indices([len(ids) for ids in encoded], batch_size, max_tokens)
        rows = max(map(len, batches), default=0) * beams
        # two searches side by side at any rows, each on one thread, beat one search at a time on every thread
        # (OpenMP's passive wait, which the package sets: each parallel operator wakes the other thread), at one row
        # too, where the model's path steps one search on one thread with its fast products: one sentence a batch,
        # the `small` preset on Multi30k, Zen 4, greedy fp32 47-51 sentences/s against 23-25, int8 39-40 against
        # 20-22, int8 beam 4 24 against 12; 32 sentences a batch, greedy int8 437-445 against 217-237
        workers = workers_for(len(batches), rows, self.config["d_model"], turn_taking_rows=0)
        for index, result in in_order(searched, map(prepared, batches), workers):
            # generate()'s sequences: the start token, then every row's tokens up to the longest's end
            sequences = result["sequences"][:, : max(int(result["lengths"].max()), 1)].tolist()
            for row, i in enumerate(index):
                outputs[i] = self.tokenizer.decode([start, *sequences[row]]).strip()
        return outputs


class _DecodingState:
    """What the searches step (`decoding_state_vaswani.DecodingState`'s interface): the encoder output, its mask,
    the caches, one decoder step for the newest token of every row (as `lean_step.LeanStep` computes it)."""

    def __init__(self, translator: LightTranslator, encoder_hidden: torch.Tensor, source_mask: torch.Tensor,
                 rows_per_example: int) -> None:  # fmt: skip
        self.translator, self.rows_per_example = translator, rows_per_example
        self.encoder_hidden, self.source_mask = encoder_hidden, source_mask
        self.encoder_mask = self._encoder_mask()
        self.example_ids = torch.arange(encoder_hidden.shape[0])
        layers = len(translator.decoder_layers)
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * layers
        self.steps = 0

    def _encoder_mask(self) -> torch.Tensor | None:
        if bool(self.source_mask.all()):
            return None
        return self.source_mask.bool()[:, None, None, :]

    def logits(self, tokens: torch.LongTensor) -> torch.Tensor:
        """(rows,) newest tokens -> (vocabulary, rows) float32 logits, as the searches read them."""
        return self.translator.output(self._step(tokens)).float().t()

    def _step(self, tokens: torch.LongTensor) -> torch.Tensor:
        translator = self.translator
        hidden = translator.embed(tokens[:, None], start=self.steps)
        rows = hidden.shape[0]
        sources = self.encoder_hidden.shape[0]
        for index, layer in enumerate(translator.decoder_layers):
            attn = layer.self_attn
            query, key, value = attn.split(attn.projection(layer.self_norm.input(hidden)), 3)
            if self.keys[index] is not None:
                key = torch.cat([self.keys[index], key], dim=-2)
                value = torch.cat([self.values[index], value], dim=-2)
            else:  # the model's caches hold copies (a concatenation), not views of the projection
                key, value = key.contiguous(), value.contiguous()
            self.keys[index], self.values[index] = key, value
            attended = F.scaled_dot_product_attention(query, key, value, scale=attn.head_dim**-0.5)
            hidden = layer.self_norm.connect(hidden, attn.out(attended, (rows, 1)))
            cross = layer.cross_attn
            # beam search's rows of one source attend as one batch row (the model's `fold_beams`)
            (query,) = cross.split(cross.query(layer.cross_norm.input(hidden).reshape(sources, rows // sources, -1)), 1)
            if self.cross[index] is None:
                projected = cross.split(cross.projection(self.encoder_hidden), 2)
                self.cross[index] = (projected[0].contiguous(), projected[1].contiguous())
            key, value = self.cross[index]
            attended = F.scaled_dot_product_attention(query, key, value, attn_mask=self.encoder_mask,
                                                      scale=cross.head_dim**-0.5)  # fmt: skip
            hidden = layer.cross_norm.connect(hidden, cross.out(attended, (rows, 1)))
            hidden = layer.final_norm.connect(hidden, layer.feed_forward(hidden))
        self.steps += 1
        if translator.decoder_norm is not None:
            hidden = translator.decoder_norm(hidden)
        return hidden[:, -1]

    def reorder(self, row_idx: torch.LongTensor) -> None:
        self.keys = [k.index_select(0, row_idx) for k in self.keys]
        self.values = [v.index_select(0, row_idx) for v in self.values]

    def keep(self, examples: torch.Tensor) -> None:
        """Only the sentences in `examples` (indices into the current batch, on the host) go on."""
        self.example_ids = self.example_ids[examples]
        rows = self.rows_per_example
        row_idx = (examples[:, None] * rows + torch.arange(rows)).flatten()
        self.reorder(row_idx)
        self.cross = [None if c is None else (c[0].index_select(0, examples), c[1].index_select(0, examples))
                      for c in self.cross]  # fmt: skip
        self.encoder_hidden = self.encoder_hidden.index_select(0, examples)
        self.source_mask = self.source_mask.index_select(0, examples)
        self.encoder_mask = self._encoder_mask()
