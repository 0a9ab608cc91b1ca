"""`pipeline("translation")` for vaswani models. Transformers 5 removed its built-in translation task; a model
saved by vaswani-hf declares this one in `config.custom_pipelines` and ships this file beside its weights, so

    pipeline("translation", model=REPO_OR_DIR, trust_remote_code=True)

works anywhere. With vaswani_hf installed, `import vaswani_hf` registers it as the `translation` task, so
`pipeline("translation", model=model_object, tokenizer=tokenizer)` works too, for Vaswani models; another model
gets what Transformers gives it (its refusal of the removed task), never this pipeline, which knows nothing of T5's
prefixes or NLLB's language tokens.
Like the modeling files, it imports only transformers (it is Hub remote code)."""

from __future__ import annotations

from transformers import Pipeline


class VaswaniTranslationPipeline(Pipeline):
    """Translate text with the model's generation defaults (paper: beam 4, GNMT alpha 0.6, source + 50).

    Like Transformers 4's translation pipeline: one `{"translation_text": ...}` per input, or per input a list of
    `num_return_sequences` of them when more than one is asked for; `truncation=True` cuts inputs longer than the
    tokenizer's `model_max_length` instead of failing; other keyword arguments go to `generate()`."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __call__(self, inputs, **kwargs):
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(candidates) == 1 for candidates in result):
            return [candidates[0] for candidates in result]  # one dict per sentence, not one-element lists
        return result

    def _sanitize_parameters(self, truncation=None, clean_up_tokenization_spaces=None, **generate_kwargs):
        preprocess = {} if truncation is None else {"truncation": truncation}
        postprocess = {}
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess, generate_kwargs, postprocess

    def preprocess(self, text: str, truncation: bool | str = False):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"translation input must be a non-empty string, got {text!r}.")
        return self.tokenizer([text], return_tensors="pt", truncation=truncation)

    def _forward(self, model_inputs, **generate_kwargs):
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs, clean_up_tokenization_spaces: bool | None = None):
        texts = self.tokenizer.batch_decode(
            model_outputs["output_ids"],
            skip_special_tokens=True,
            clean_up_tokenization_spaces=clean_up_tokenization_spaces,
        )
        return [{"translation_text": text.strip()} for text in texts]
