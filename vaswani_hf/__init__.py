"""vaswani-hf: the Transformer of "Attention Is All You Need" as a Hugging Face Transformers model.

Importing the package registers the `vaswani` model type with `AutoConfig`, `AutoModel` and
`AutoModelForSeq2SeqLM`, and marks the classes so `save_pretrained` ships their code for
`trust_remote_code=True` loading where this package is not installed. It also brings back the `translation`
pipeline task, which Transformers 5 removed, served by `VaswaniTranslationPipeline` for any seq2seq model.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, pipelines

from .configuration_vaswani import VaswaniConfig
from .modeling_vaswani import VaswaniForConditionalGeneration, VaswaniModel, VaswaniPreTrainedModel
from .pipeline_vaswani import VaswaniTranslationPipeline
from .search_vaswani import gnmt_length_penalty

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

__all__ = [
    "VaswaniConfig",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTranslationPipeline",
    "gnmt_length_penalty",
    "__version__",
]
