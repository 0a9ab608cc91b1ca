"""What `import vaswani_hf` tells Transformers: the `vaswani` model type for `AutoConfig`, `AutoModel` and
`AutoModelForSeq2SeqLM`, the classes marked so `save_pretrained` ships their code for `trust_remote_code=True`,
the converted fairseq models' tokenizer for `AutoTokenizer`, and the `translation` and `constituency-parsing`
pipeline tasks. Imported by the package's `__init__`, except in `vaswani translate`'s light start
(`translation/light_translator.py`), which runs on torch alone and imports this when it hands over
(`vaswani_hf.finish_import`).
"""

import importlib
import importlib.abc
import importlib.util
import sys

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer, PretrainedConfig

from .model.configuration_vaswani import VaswaniConfig
from .model.modeling_vaswani import VaswaniForConditionalGeneration, VaswaniModel

AutoConfig.register(VaswaniConfig.model_type, VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
VaswaniConfig.register_for_auto_class("AutoConfig")
VaswaniModel.register_for_auto_class("AutoModel")
VaswaniForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


class _Deferred(type):
    """The metaclass of a stand-in that becomes the class it names on first use: a registry (Transformers'
    pipelines, AutoTokenizer) reads the class's attributes and calls it, and both reach the real class, imported
    then (`import vaswani_hf` stays light: Transformers 5.20 takes no dotted path in the registry, only a class).
    It bears the real class's name, which a loading config compares with the pipeline it declares
    (`configuration_vaswani`) and AutoTokenizer looks a tokenizer class up by."""

    def __init__(cls, *args) -> None:
        super().__init__(*args)
        cls.__name__ = cls.name

    def real(cls) -> type:
        return getattr(importlib.import_module(f".{cls.module}", __package__), cls.name)

    def __getattr__(cls, name: str):
        return getattr(cls.real(), name)

    def __call__(cls, *args, **kwargs):
        return cls.real()(*args, **kwargs)


class _DeferredPipeline(_Deferred):
    def __call__(cls, *args, **kwargs):
        # the task is registered for every model: claim Vaswani models only, and leave the others as Transformers
        # leaves them (its own refusal, where it has no pipeline for the task)
        model = kwargs.get("model", args[0] if args else None)
        if getattr(getattr(model, "config", None), "model_type", None) != VaswaniConfig.model_type:
            raise cls.refusal(type(model).__name__)
        return super().__call__(*args, **kwargs)


class _MosesBPETokenizer(metaclass=_Deferred):
    module, name = "data.moses_bpe", "MosesBPETokenizer"


class _MosesBPETokenizerConfig(PretrainedConfig):
    """A marker: Transformers finds a tokenizer class named in `tokenizer_config.json` only among those registered
    for some config. The converted fairseq models' tokenizer is registered under this one, not `VaswaniConfig`, so a
    Vaswani folder that names no tokenizer class keeps Transformers' own choice."""

    model_type = "vaswani-moses-bpe"


AutoTokenizer.register(_MosesBPETokenizerConfig, slow_tokenizer_class=_MosesBPETokenizer, exist_ok=True)


class _TranslationPipeline(metaclass=_DeferredPipeline):
    # a stand-in here too: the tasks are registered while Transformers' pipelines module is being imported, which
    # the real class's own module may be what imports
    module, name = "model.pipeline_vaswani", "VaswaniTranslationPipeline"
    removed = "Use the `text-generation` pipeline with a chat model instead."  # Transformers' reason, kept on lift

    @classmethod
    def refusal(cls, model: str) -> Exception:
        return KeyError(
            f"The task translation has been removed from transformers. {cls.removed} (vaswani_hf serves the task "
            f"for Vaswani models only; this model is a {model}.)"
        )


class _ParsingPipeline(metaclass=_DeferredPipeline):
    module, name = "parsing.pipeline", "ConstituencyParsingPipeline"

    @classmethod
    def refusal(cls, model: str) -> Exception:
        return ValueError(
            f"pipeline('constituency-parsing') parses with a Vaswani parse model (`vaswani train --task parse`); "
            f"this model is a {model}."
        )


def _register_pipelines(pipelines) -> None:
    """The pipeline tasks, into Transformers' registry. `pipeline("translation", model=<a model object>)` has no
    config naming our pipeline to go by, and Transformers 5 refuses the task by name before it looks at
    `pipeline_class`: lift the refusal and register the task. `pipeline("constituency-parsing", model=DIR)`: a
    parse model's trees (parsing/pipeline.py)."""
    removed = getattr(pipelines, "REMOVED_TASKS", {}).pop("translation", None)
    _TranslationPipeline.removed = removed or _TranslationPipeline.removed
    pipelines.PIPELINE_REGISTRY.register_pipeline(
        "translation", pipeline_class=_TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
    pipelines.PIPELINE_REGISTRY.register_pipeline(
        "constituency-parsing", pipeline_class=_ParsingPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` right after the module `name` is executed, the first time anything imports it.
    Transformers' pipelines module imports its image and audio processing (half a second of every `vaswani` command
    and `import vaswani_hf` on 2 CPU cores), and only `pipeline()` reads the registry: the tasks are registered
    when `transformers.pipelines` is imported, before any `pipeline()` call can run, not before."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; the finders after this one find the module
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module, run=run):
                run(module)
                self.then(module)

            spec.loader.exec_module = exec_module
        return spec


if "transformers.pipelines" in sys.modules:
    _register_pipelines(sys.modules["transformers.pipelines"])
else:
    sys.meta_path.insert(0, _AfterImport("transformers.pipelines", _register_pipelines))
