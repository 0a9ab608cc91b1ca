"""vaswani-hf: the Transformer of "Attention Is All You Need" as a Hugging Face Transformers model.

Importing the package registers the `vaswani` model type with `AutoConfig`, `AutoModel` and
`AutoModelForSeq2SeqLM`, and marks the classes so `save_pretrained` ships their code for
`trust_remote_code=True` loading where this package is not installed. It also brings back the `translation`
pipeline task, which Transformers 5 removed, served by `VaswaniTranslationPipeline` for any seq2seq model, and
registers `constituency-parsing` for parse models (`Parser`'s decoding; docs/parsing.md).

The package's parts are its folders: `model/` (what ships as remote code), `data/`, `training/`, `translation/`,
`interop/`, and the `vaswani` command on top (`cli.py`). The names the documentation shows are importable from here;
those outside the model load their part on first use, so `import vaswani_hf` stays light.
"""

import importlib
import sys

from .openmp import wait_passively

wait_passively()  # before anything imports torch: libgomp reads its wait policy once, when torch loads it

# name -> the module that defines it, imported on first use (PEP 562)
_LAZY = {
    "VaswaniConfig": "model.configuration_vaswani",
    "VaswaniForConditionalGeneration": "model.modeling_vaswani",
    "VaswaniModel": "model.modeling_vaswani",
    "VaswaniPreTrainedModel": "model.modeling_vaswani",
    "gnmt_length_penalty": "model.search_vaswani",
    "quantize_int8": "model.precision",
    "resolve_precision": "model.precision",
    "compute_metrics": "translation.metrics",
    "Ensemble": "translation.ensemble",
    "OnnxSeq2Seq": "interop.onnx",
    "marian_to_vaswani": "interop.convert",
    "convert_marian_checkpoint": "interop.convert",
    "convert_fairseq_checkpoint": "interop.convert",
    "convert_fsmt_checkpoint": "interop.convert",
    "fsmt_to_vaswani": "interop.convert",
    "torch_transformer_to_vaswani": "interop.convert",
    "VaswaniTranslationPipeline": "model.pipeline_vaswani",
    "Parser": "parsing.parser",
    "ParseResult": "parsing.parser",
    "ConstituencyParsingPipeline": "parsing.pipeline",
    "MosesBPETokenizer": "data.moses_bpe",
}


__version__ = "0.1.0"


def light_start() -> bool:
    """Whether this process is `vaswani translate`'s light start: the `vaswani` command's entry point
    (`vaswani_command.py`, outside the package so that it runs first) asked this import to leave Transformers alone
    (a line piped to it waits for the line, not for Transformers' import: 0.8 s for `import transformers`, 3 s for
    its model classes, on a 2-core EPYC). Nothing else asks it."""
    return bool(getattr(sys.modules.get("vaswani_command"), "light_start", False))


def finish_import() -> None:
    """What `import vaswani_hf` does beside its names, done now where the light start left it: Transformers'
    registry (`registration.py`) and the decoding speed paths plugged into generate() (`model/speed`). Idempotent."""
    importlib.import_module(".registration", __name__)
    importlib.import_module(".model.speed", __name__)


if not light_start():
    finish_import()


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    *_LAZY,
    "__version__",
]
