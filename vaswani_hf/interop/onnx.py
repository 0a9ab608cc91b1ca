"""ONNX export and onnxruntime decoding (`vaswani export MODEL --format onnx`, `vaswani translate --engine
onnxruntime`), for serving outside Python (onnxruntime in C#, Java, C++; transformers.js).

The folder follows Optimum's seq2seq layout and names, so `ORTModelForSeq2SeqLM` can load it once Optimum supports
Transformers 5:
- `encoder_model.onnx`: input_ids, attention_mask -> last_hidden_state;
- `decoder_model.onnx` (the first step, no cache): input_ids, encoder_attention_mask, encoder_hidden_states ->
  logits, present.{i}.decoder.key/value, present.{i}.encoder.key/value;
- `decoder_with_past_model.onnx` (every later step): input_ids, encoder_attention_mask,
  past_key_values.{i}.decoder.key/value, past_key_values.{i}.encoder.key/value -> logits,
  present.{i}.decoder.key/value (the encoder's keys/values do not change after the first step);
- config.json, generation_config.json (the paper's decoding) and the tokenizer.
Batch and both lengths are dynamic. Graphs are float32, traced with torch.export (`torch.onnx.export(dynamo=True)`)
from the model's own modules with eager attention; `quantize="int8"` then applies onnxruntime's dynamic
quantization (int8 weights with per-channel scales, activations quantized per batch) to every graph.

Decision: a decoder pair, not Optimum's `decoder_model_merged.onnx` (an If node over both): the pair is what
Optimum's loader also accepts, and each graph stays a plain feed-forward graph any runtime executes.

`OnnxSeq2Seq` runs the graphs with onnxruntime inside this package's own greedy and beam search
(search_vaswani.py), so it decodes with the paper's rules (beam 4, GNMT penalty, source + 50) and gives
PyTorch's sequences.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn
from transformers import AutoTokenizer, GenerationConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from ..model.configuration_vaswani import VaswaniConfig
from ..model.generation_vaswani import VaswaniGenerationMixin
from ..model.modeling_vaswani import VaswaniForConditionalGeneration

GRAPHS = ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx")
OPSET = 18


def _cache_tensors(cache: DynamicCache) -> list[torch.Tensor]:
    return [tensor for layer in cache.layers for tensor in (layer.keys, layer.values)]


class OnnxEncoder(nn.Module):
    """The encoder stack as one graph."""

    def __init__(self, model: VaswaniForConditionalGeneration):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class OnnxDecoder(nn.Module):
    """The decoder's first step: from the encoder output, with an empty cache; returns every layer's keys/values."""

    def __init__(self, model: VaswaniForConditionalGeneration):
        super().__init__()
        self.model = model

    def step(self, input_ids, encoder_attention_mask, encoder_hidden_states, cache) -> torch.Tensor:
        """Logits of the decoder over `input_ids`, updating `cache`."""
        hidden = self.model.get_decoder()(
            input_ids=input_ids,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            cache=cache,
            use_cache=True,
        ).last_hidden_state
        return self.model.output_projection(hidden)

    def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states) -> tuple[torch.Tensor, ...]:
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        logits = self.step(input_ids, encoder_attention_mask, encoder_hidden_states, cache)
        presents = []
        for i in range(len(cache.self_attention_cache.layers)):
            for layer in (cache.self_attention_cache.layers[i], cache.cross_attention_cache.layers[i]):
                presents += [layer.keys, layer.values]
        return logits, *presents


class OnnxDecoderWithPast(OnnxDecoder):
    """A later decoder step: the new token of each row, attending to the cached keys/values."""

    def __init__(self, model: VaswaniForConditionalGeneration):
        super().__init__(model)
        self.layers = model.config.decoder_layers

    def forward(self, input_ids, encoder_attention_mask, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self_cache, cross_cache = DynamicCache(), DynamicCache()
        for i in range(self.layers):
            self_cache.update(past[4 * i], past[4 * i + 1], i)
            cross_cache.update(past[4 * i + 2], past[4 * i + 3], i)
        cache = EncoderDecoderCache(self_cache, cross_cache)
        for i in range(self.layers):
            cache.is_updated[i] = True  # the cross-attention keys/values are given: do not project them again
        # the encoder output is only read through the cached keys/values; its shape gives the mask's
        no_encoder_output = past[2].new_zeros(past[2].shape[0], past[2].shape[2], 0)
        logits = self.step(input_ids, encoder_attention_mask, no_encoder_output, cache)
        return logits, *_cache_tensors(cache.self_attention_cache)


def past_names(layers: int, prefix: str, encoder: bool = True) -> list[str]:
    """Optimum's cache names, layer by layer: {prefix}.{i}.decoder.key/value[, {prefix}.{i}.encoder.key/value]."""
    parts = ("decoder", "encoder") if encoder else ("decoder",)
    return [f"{prefix}.{i}.{part}.{kind}" for i in range(layers) for part in parts for kind in ("key", "value")]


def check_exportable(model: VaswaniForConditionalGeneration) -> None:
    """What the graphs cannot hold, named before anything is traced."""
    if getattr(model.lm_head, "weight", None) is None or not isinstance(model.lm_head, nn.Linear):
        raise ValueError(
            "ONNX export needs a float model: this one is quantized (int8 serving). Export the saved model, then "
            "quantize the graphs with --quantize int8."
        )


@contextlib.contextmanager
def _eager_float32(model: VaswaniForConditionalGeneration):
    """The model in float32 with eager attention while it is traced (a materialised mask, plain MatMul/Softmax),
    back as it was afterwards."""
    dtype, attention = model.dtype, model.config._attn_implementation
    model.float().eval()
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation(attention)
        model.to(dtype)


def export_onnx(
    model: VaswaniForConditionalGeneration, tokenizer, output_dir: str | Path, quantize: str | None = None
) -> Path:
    """Write the three graphs, the configs and the tokenizer to `output_dir` (see the module docstring)."""
    _require_onnx_extra("export", "onnxruntime", "onnxscript")  # onnxscript: torch's exporter needs it
    if quantize not in (None, "int8"):
        raise ValueError(f"--quantize {quantize}: onnxruntime's dynamic quantization gives int8 only.")
    check_exportable(model)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config = model.config
    layers = config.decoder_layers
    batch, source = torch.export.Dim("batch_size"), torch.export.Dim("encoder_sequence_length")
    target, past = torch.export.Dim("decoder_sequence_length"), torch.export.Dim("past_decoder_sequence_length")
    ids = torch.full((2, 5), config.eos_token_id if config.eos_token_id is not None else 0, dtype=torch.long)
    mask = torch.ones(2, 5, dtype=torch.long)
    with _eager_float32(model), torch.no_grad():
        hidden = OnnxEncoder(model)(ids, mask)
        first = OnnxDecoder(model)(ids[:, :3], mask, hidden)
        step_past = list(first[1:])
        graphs = {
            "encoder_model.onnx": (
                OnnxEncoder(model), (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"],
                ({0: batch, 1: source}, {0: batch, 1: source}),
            ),
            "decoder_model.onnx": (
                OnnxDecoder(model), (ids[:, :3], mask, hidden),
                ["input_ids", "encoder_attention_mask", "encoder_hidden_states"],
                ["logits", *past_names(layers, "present")],
                ({0: batch, 1: target}, {0: batch, 1: source}, {0: batch, 1: source}),
            ),
            "decoder_with_past_model.onnx": (
                OnnxDecoderWithPast(model), (ids[:, :1], mask, *step_past),
                ["input_ids", "encoder_attention_mask", *past_names(layers, "past_key_values")],
                ["logits", *past_names(layers, "present", encoder=False)],
                # torch.export groups *past into one tuple
                ({0: batch}, {0: batch, 1: source},
                 tuple({0: batch, 2: past if j % 4 < 2 else source} for j in range(4 * layers))),
            ),
        }  # fmt: skip
        for name, (module, args, inputs, outputs, shapes) in graphs.items():
            path = output_dir / name
            torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                              dynamic_shapes=shapes, opset_version=OPSET, dynamo=True, external_data=False,
                              verbose=False)  # fmt: skip
    if quantize == "int8":
        _quantize_graphs(output_dir)
    config.save_pretrained(output_dir)
    model.generation_config.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    _write_about(output_dir, quantize or "float32")
    return output_dir


def _require_onnx_extra(what: str, *modules: str) -> None:
    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"ONNX {what} needs the onnx extra ({err.name} is missing): pip install 'vaswani-hf[onnx]'"
        ) from None


def _write_about(output_dir: Path, weights: str) -> None:
    about = {"source": "vaswani-hf", "format": "onnx", "opset": OPSET, "weights": weights, "graphs": list(GRAPHS)}
    (output_dir / "vaswani_export.json").write_text(json.dumps(about, indent=2))


QUANTIZED_OPS = {"MatMulInteger", "DynamicQuantizeLinear", "ConvInteger", "QLinearMatMul"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def _exported_weights(folder: Path) -> str:
    """The weights of an exported folder's graphs ("float32" or "int8"), once its config and all three graphs are
    there: its record says, or, without one, the encoder graph's operators (an export may have lost its record)."""
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not an exported model (no config.json); export one with `vaswani "
                                "export MODEL --format onnx --output_dir OUT`.")  # fmt: skip
    missing = [name for name in GRAPHS if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: export the model again with `vaswani export "
                                "MODEL --format onnx`.")  # fmt: skip
    about = folder / "vaswani_export.json"
    if not about.is_file():
        import onnx

        graph = onnx.load(str(folder / GRAPHS[0]), load_external_data=False).graph
        return "int8" if any(node.op_type in QUANTIZED_OPS for node in graph.node) else "float32"
    try:
        record = json.loads(about.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{about} is not an export's record ({err}): export the model again.") from None
    weights = record.get("weights") if isinstance(record, dict) and record.get("format") == "onnx" else None
    if weights not in ("float32", "int8"):
        raise ValueError(f"{about} is not an ONNX export's record (its format and weights): export the model again "
                         "into a folder of its own.")  # fmt: skip
    return weights


def is_onnx_folder(folder: str | Path) -> bool:
    """An exported ONNX folder rather than a model folder: graphs without the model's weights (a model folder that
    also holds graphs is a model folder)."""
    folder = Path(folder)
    return any((folder / name).is_file() for name in GRAPHS) and not any((folder / n).is_file() for n in WEIGHT_FILES)


def quantize_onnx_folder(folder: str | Path, output_dir: str | Path) -> Path:
    """The float32 graphs of an exported folder quantized to int8 (as `export_onnx(..., quantize="int8")`) into
    `output_dir`, new or empty, with the folder's configs and tokenizer (its files; not its subfolders): tracing
    again took most of an export's time (35-45 s of a tiny model's on 2 AMD EPYC cores), quantizing seconds
    (`vaswani export ONNX_FOLDER --format onnx --quantize int8 --output_dir OUT`). The graphs are quantized in a
    folder beside `output_dir` and moved there whole: an interrupted run leaves no half-quantized export."""
    _require_onnx_extra("quantization", "onnxruntime", "onnx")
    folder, output_dir = Path(folder), Path(output_dir)
    weights = _exported_weights(folder)
    if weights != "float32":
        raise ValueError(f"{folder} holds {weights} graphs already: quantize the float32 export.")
    source, target = folder.resolve(), output_dir.resolve()
    if target == source or source in target.parents:
        raise ValueError(f"{output_dir} is {'the export itself' if target == source else 'inside the export'}: "
                         "give a folder outside it for the int8 graphs.")  # fmt: skip
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise FileExistsError(f"{output_dir} already holds something: give a new or empty folder for the int8 "
                              "graphs.")  # fmt: skip
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        for path in folder.iterdir():
            if path.is_file():
                shutil.copyfile(path, partial / path.name)
        _quantize_graphs(partial)
        _write_about(partial, "int8")
        if target.exists():
            target.rmdir()  # empty, checked above
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return output_dir


def _quantize_graphs(folder: Path) -> None:
    """Dynamic int8 quantization of the folder's graphs, in place, with 7-bit weights (`reduce_range`): without
    VNNI (AVX2, AVX-512 before Cascade Lake) onnxruntime's u8 x s8 kernels add pairs of products in 16 bits and
    saturate with full-range weights; the graphs may run on such a CPU whatever CPU exported them."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    for name in GRAPHS:
        path = folder / name
        quantized = path.with_suffix(".int8.onnx")
        quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)
        os.replace(quantized, path)


class OnnxDecodingState:
    """The decoding state of search_vaswani.py's searches, stepped by the exported graphs: one encoder row per
    decoder row (the graphs have no multi-query cross-attention), the caches as onnxruntime outputs."""

    def __init__(self, runner: OnnxSeq2Seq, hidden: torch.Tensor, mask: torch.Tensor | None, rows_per_example: int):
        self.runner = runner
        self.rows_per_example = rows_per_example
        if mask is None:
            mask = torch.ones(hidden.shape[:2], dtype=torch.long)
        self.encoder_hidden = hidden.repeat_interleave(rows_per_example, dim=0)
        self.encoder_mask = mask.long().repeat_interleave(rows_per_example, dim=0)
        self.past: list | None = None
        self.example_ids = torch.arange(hidden.shape[0])

    def logits(self, tokens: torch.LongTensor) -> torch.Tensor:
        feed = {"input_ids": tokens[:, None].numpy(), "encoder_attention_mask": self.encoder_mask.numpy()}
        if self.past is None:
            feed["encoder_hidden_states"] = self.encoder_hidden.numpy()
            logits, *self.past = self.runner.sessions["decoder_model.onnx"].run(None, feed)
        else:
            feed.update(zip(self.runner.past_inputs, self.past, strict=True))
            logits, *decoder_past = self.runner.sessions["decoder_with_past_model.onnx"].run(None, feed)
            self.past[0::4], self.past[1::4] = decoder_past[0::2], decoder_past[1::2]
        return torch.from_numpy(logits[:, -1]).t()  # (vocabulary, rows), as output_logits gives them

    def reorder(self, row_idx: torch.LongTensor) -> None:
        # beams only trade places within their sentence: the encoder rows stay as they are
        rows = row_idx.numpy()
        for i in range(0, len(self.past), 4):
            self.past[i], self.past[i + 1] = self.past[i][rows], self.past[i + 1][rows]

    def keep(self, examples: torch.Tensor) -> None:
        rows = (examples[:, None] * self.rows_per_example + torch.arange(self.rows_per_example)).flatten()
        self.encoder_hidden = self.encoder_hidden[rows]
        self.encoder_mask = self.encoder_mask[rows]
        if self.past is not None:
            self.past = [tensor[rows.numpy()] for tensor in self.past]
        self.example_ids = self.example_ids[examples]


class OnnxSeq2Seq(VaswaniGenerationMixin):
    """An exported folder run with onnxruntime: `generate()` as the PyTorch model's, for greedy and beam search
    (sequences, `sequences_scores`, n-best); other modes need the PyTorch model and are refused by name.

    `OnnxSeq2Seq("OUT").generate(**tokenizer(["..."], return_tensors="pt"))`; `vaswani translate OUT --engine
    onnxruntime` and `vaswani evaluate` use it through the same translate functions as the PyTorch model.
    """

    device = torch.device("cpu")

    def __init__(self, folder: str | Path, threads: int | None = None):
        import onnxruntime

        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder; export one with `vaswani export MODEL --format onnx "
                                    "--output_dir OUT`.")  # fmt: skip
        self.weights = _exported_weights(folder)
        self.config = VaswaniConfig.from_pretrained(folder)
        self.generation_config = GenerationConfig.from_pretrained(folder)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        self.sessions = {
            name: onnxruntime.InferenceSession(str(folder / name), options, providers=["CPUExecutionProvider"])
            for name in GRAPHS
        }
        self.past_inputs = past_names(self.config.decoder_layers, "past_key_values")

    @classmethod
    def with_tokenizer(cls, folder: str | Path, threads: int | None = None):
        from ..translation.inference import check_model_folder

        if Path(folder).is_dir():  # config and tokenizer first, then the graphs (`cls`)
            check_model_folder(folder, weights=False)
        return cls(folder, threads), AutoTokenizer.from_pretrained(folder)

    def eval(self) -> OnnxSeq2Seq:
        return self

    def _handed_over_because(self, config, model_kwargs, logits_processor=None) -> str | None:
        reason = super()._handed_over_because(config, model_kwargs, logits_processor)
        if reason is not None:
            raise ValueError(f"The onnxruntime engine decodes greedy and beam search only: {reason} needs the PyTorch "
                             "model (drop --engine onnxruntime).")  # fmt: skip
        return None

    def _position_table_rows(self) -> int:
        """The graphs hold the positions exported, `max_position_embeddings` of them whatever their kind: the
        sinusoids the PyTorch model computes for any position are a fixed table in a graph, so a longer output is
        cut there (the source + offset limit) or refused (an explicit longer request), as a learned table's is."""
        return self.config.max_position_embeddings

    def _encode(self, source) -> torch.Tensor:
        if source.input_ids is None:
            raise ValueError("The onnxruntime engine encodes `input_ids` (with `attention_mask`) itself.")
        mask = source.attention_mask if source.attention_mask is not None else torch.ones_like(source.input_ids)
        feed = {"input_ids": source.input_ids.long().numpy(), "attention_mask": mask.long().numpy()}
        return torch.from_numpy(self.sessions["encoder_model.onnx"].run(None, feed)[0])

    def _decoding_state(self, hidden: torch.Tensor, mask: torch.Tensor | None, rows_per_example: int,
                        fast: bool = True):  # fmt: skip
        """onnxruntime computes the products: `fast` (the CPU fast products' switch) has nothing to turn off."""
        return OnnxDecodingState(self, hidden, mask, rows_per_example)
