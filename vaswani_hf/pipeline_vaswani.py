"""`pipeline("translation")` for vaswani models. Transformers 5 removed its built-in translation task; a model
saved by vaswani-hf declares this one in `config.custom_pipelines` and ships this file beside its weights, so

    pipeline("translation", model=REPO_OR_DIR, trust_remote_code=True)

works anywhere, and with vaswani_hf installed also `pipeline(..., pipeline_class=VaswaniTranslationPipeline)`
without remote code. Like the modeling files, it imports only transformers (it is Hub remote code)."""

from __future__ import annotations

from transformers import Pipeline


class VaswaniTranslationPipeline(Pipeline):
    """Translate text with the model's generation defaults (paper: beam 4, GNMT alpha 0.6, source + 50).

    Returns `[{"translation_text": ...}]` per input, like Transformers 4's translation pipeline."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __call__(self, inputs, **kwargs):
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list):  # one dict per sentence, not a list of one-element lists
            return [item[0] for item in result]
        return result

    def _sanitize_parameters(self, **generate_kwargs):
        return {}, generate_kwargs, {}

    def preprocess(self, text: str):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"translation input must be a non-empty string, got {text!r}.")
        return self.tokenizer([text], return_tensors="pt")

    def _forward(self, model_inputs, **generate_kwargs):
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs):
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=True)
        return [{"translation_text": text.strip()} for text in texts]
