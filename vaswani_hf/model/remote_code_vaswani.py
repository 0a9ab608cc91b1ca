"""What a saved vaswani model declares for loading where this package is absent (`trust_remote_code=True`): its
three Auto classes and the translation pipeline (`pipeline_vaswani`). Like the modeling files, it imports only
transformers (it is Hub remote code)."""

from __future__ import annotations


class VaswaniRemoteCodeMixin:
    """A base of `VaswaniPreTrainedModel`: `save_pretrained` of a remote-code model writes the module's text."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        if self.is_remote_code():
            # imported here, not with the model: a `transformers.Pipeline` imports Transformers' pipelines, half a
            # second of every start; this import also ships the file beside the weights (Transformers reads
            # every `from .x import` of a remote-code file, indented ones too)
            from .pipeline_vaswani import VaswaniTranslationPipeline as pipeline

            # `register_for_auto_class` records only the saved class and AutoConfig: record all three Auto classes
            # so AutoModel and AutoModelForSeq2SeqLM both load the checkpoint as remote code.
            module = type(self).__module__.rsplit(".", 1)[-1]
            config_module = type(self.config).__module__.rsplit(".", 1)[-1]
            self.config.auto_map = {
                **(getattr(self.config, "auto_map", None) or {}),
                "AutoConfig": f"{config_module}.VaswaniConfig",
                "AutoModel": f"{module}.VaswaniModel",
                "AutoModelForSeq2SeqLM": f"{module}.VaswaniForConditionalGeneration",
            }
            # Transformers 5 has no built-in translation task: declare ours. Transformers ships every file the
            # modeling file imports relatively (`from .x import y`, read as text) beside it, at save time and when
            # it loads it as remote code, so a re-saved remote-code model keeps the pipeline its config declares.
            self.config.custom_pipelines = {
                "translation": {"impl": f"{pipeline.__module__.rsplit('.', 1)[-1]}.{pipeline.__name__}",
                                "pt": ["AutoModelForSeq2SeqLM"], "tf": [], "type": "text"}
            }  # fmt: skip
        return super().save_pretrained(save_directory, *args, **kwargs)
