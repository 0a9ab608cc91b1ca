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

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, pipelines

from .model.configuration_vaswani import VaswaniConfig
from .model.modeling_vaswani import VaswaniForConditionalGeneration, VaswaniModel, VaswaniPreTrainedModel
from .model.pipeline_vaswani import VaswaniTranslationPipeline
from .model.search_vaswani import gnmt_length_penalty

# name -> the module that defines it, imported on first use (PEP 562)
_LAZY = {
    "quantize_int8": "model.precision",
    "resolve_precision": "model.precision",
    "compute_metrics": "translation.metrics",
    "Ensemble": "translation.ensemble",
    "OnnxSeq2Seq": "interop.onnx",
    "marian_to_vaswani": "interop.convert",
    "convert_marian_checkpoint": "interop.convert",
    "torch_transformer_to_vaswani": "interop.convert",
    "Parser": "parsing.parser",
    "ParseResult": "parsing.parser",
    "ConstituencyParsingPipeline": "parsing.parser",
}

__version__ = "0.1.0"

AutoConfig.register(VaswaniConfig.model_type, VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
VaswaniConfig.register_for_auto_class("AutoConfig")
VaswaniModel.register_for_auto_class("AutoModel")
VaswaniForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
# `pipeline("translation", model=<a model object>)` has no config naming our pipeline to go by, and Transformers 5
# refuses the task by name before it looks at `pipeline_class`: lift the refusal and register the task.
getattr(pipelines, "REMOVED_TASKS", {}).pop("translation", None)
pipelines.PIPELINE_REGISTRY.register_pipeline(
    "translation", pipeline_class=VaswaniTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)


class _Deferred(type):
    """The metaclass of a stand-in that becomes the class it names on first use: the registry reads a pipeline
    class's attributes and calls it, and both reach the real class, imported then (`import vaswani_hf` stays
    light: Transformers 5.20 takes no dotted path in the registry, only a class)."""

    def real(cls) -> type:
        return getattr(importlib.import_module(f".{cls.module}", __name__), cls.name)

    def __getattr__(cls, name: str):
        return getattr(cls.real(), name)

    def __call__(cls, *args, **kwargs):
        return cls.real()(*args, **kwargs)


class _ParsingPipeline(metaclass=_Deferred):
    module, name = "parsing.parser", "ConstituencyParsingPipeline"


# `pipeline("constituency-parsing", model=DIR)`: a parse model's trees (parsing/parser.py)
pipelines.PIPELINE_REGISTRY.register_pipeline(
    "constituency-parsing", pipeline_class=_ParsingPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "VaswaniConfig",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTranslationPipeline",
    "gnmt_length_penalty",
    "__version__",
    *_LAZY,
]
