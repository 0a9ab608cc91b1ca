"""`pipeline("constituency-parsing", model=DIR)`: `Parser`'s decoding (`parser.py`) behind Transformers' pipeline
API. A module of its own: a `transformers.Pipeline` imports Transformers' pipelines (half a second on 2 CPU
cores), which `vaswani parse` and `Parser` do not need."""

from __future__ import annotations

from transformers import Pipeline

from .parser import Sentence, _name_of, as_tree_kind, check_choices, parse_words, require_parser, resolve_nltk, words_of


class ConstituencyParsingPipeline(Pipeline):
    """`pipeline("constituency-parsing", model=DIR)`: `Parser`'s decoding behind Transformers' pipeline API.

    `pipe(sentence)` gives `{"tree", "score", "repaired"}`; `pipe([s1, s2, ...])` a list of them, parsed in
    batches together (`batch_size`, default 32). A sentence is a string (tokenised as the Penn Treebank is) or a
    list of words, so one sentence given as words is `pipe([["The", "dog", "barked", "."]])`. With `nbest=N`, each
    sentence gives a list of its N best. Options: nbest, tree_search, as_nltk, long_lines, max_tokens, and
    `generate()`'s num_beams and length_penalty."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.parsing = require_parser(self.model, _name_of(self.model))

    def __call__(self, inputs, **kwargs):
        # one batched search over all the sentences (Pipeline's own __call__ would run them one at a time)
        single = isinstance(inputs, str)
        sentences = [inputs] if single else list(inputs)
        batch_size = kwargs.pop("batch_size", None)
        preprocess, forward, postprocess = self._sanitize_parameters(**kwargs)
        # the options given when the pipeline was made, under this call's (as Pipeline.__call__ merges them)
        forward, postprocess = {**self._forward_params, **forward}, {**self._postprocess_params, **postprocess}
        words = [words for sentence in sentences for words in self.preprocess(sentence, **preprocess)["words"]]
        results = self.postprocess(self._forward({"words": words}, batch_size=batch_size, **forward), **postprocess)
        return results[0] if single else results

    def _sanitize_parameters(self, nbest=None, tree_search=None, as_nltk=None, long_lines=None, max_tokens=None,
                             **generate_kwargs):  # fmt: skip
        forward = {k: v for k, v in (("nbest", nbest), ("tree_search", tree_search), ("long_lines", long_lines),
                                     ("max_tokens", max_tokens)) if v is not None}  # fmt: skip
        check_choices(forward.get("tree_search", "constrained"), forward.get("long_lines", "cut"))
        postprocess = {k: v for k, v in (("nbest", nbest), ("as_nltk", as_nltk)) if v is not None}
        return {}, {**forward, **generate_kwargs}, postprocess

    def preprocess(self, sentence: Sentence) -> dict:
        return {"words": [words_of(sentence)]}

    def _forward(self, model_inputs: dict, nbest: int | None = None, tree_search: str = "constrained",
                 batch_size: int | None = None, max_tokens: int | None = 4096, long_lines: str = "cut",
                 **generate_kwargs) -> dict:  # fmt: skip
        parses = parse_words(self.model, self.tokenizer, self.parsing, model_inputs["words"], nbest or 1, tree_search,
                             batch_size=batch_size or 32, max_tokens=max_tokens, long_lines=long_lines,
                             **generate_kwargs)  # fmt: skip
        return {"parses": list(parses)}

    def postprocess(self, model_outputs: dict, nbest: int | None = None, as_nltk: bool | None = None) -> list:
        kind = resolve_nltk(as_nltk)
        results = []
        for parses in model_outputs["parses"]:
            found = [{"tree": as_tree_kind(p.tree, kind), "score": p.score, "repaired": p.repaired} for p in parses]
            results.append(found if nbest and nbest > 1 else found[0])
        return results
