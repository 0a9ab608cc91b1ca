"""Section 6.3 on the translation recipe: what makes a model a parser (its labels and decoding, kept in its config
and generation config), the built-in treebank as sentence pairs, and EVALB's figures during and after training.

A parse model's `config.parsing` holds the linearisation form and the training treebank's phrase labels and tags;
`vaswani parse`, `vaswani evaluate` and the server read it to turn outputs back into trees.
"""

from __future__ import annotations

from dataclasses import replace

from transformers import EvalPrediction, PreTrainedModel, PreTrainedTokenizerBase

from ..translation.metrics import decode
from .evalb import COLLINS, score_trees
from .linearization import Repair, to_tree
from .treebank import sentence_pairs
from .trees import Tree

# EVALB's COLLINS.prm, without its stop after 10 error sentences: a model's evaluation counts them instead
SCORING = replace(COLLINS, max_errors=None)
# The paper's parsing decoding (section 6.3): beam 21, alpha 0.3, at most input length + 300.
PARSE_GENERATION = {"num_beams": 21, "length_penalty": 0.3, "max_length_offset": 300}


def builtin_pairs(form: str = "tags") -> tuple[dict[str, list[tuple[str, str]]], dict]:
    """The built-in treebank's splits as (words, linearised tree) pairs, and its training labels."""
    from .builtin_treebank import builtin_treebank

    labels = {"phrase_labels": set(), "tags": set()}
    splits = {split: list(sentence_pairs(trees, form, labels if split == "train" else None))
              for split, trees in builtin_treebank().items()}  # fmt: skip
    return splits, {"form": form, **{name: sorted(values) for name, values in labels.items()}}


def make_parser(model: PreTrainedModel, treebank: dict) -> None:
    """Mark `model` a parser of `treebank`'s labels, decoding as the paper parses (saved with the model)."""
    model.config.parsing = {"form": treebank["form"], "phrase_labels": list(treebank["phrase_labels"]),
                            "tags": list(treebank["tags"])}  # fmt: skip
    for name, value in PARSE_GENERATION.items():
        setattr(model.generation_config, name, value)


def parsing_of(config) -> dict | None:
    """A parse model's labels and form (None for a translation model)."""
    return getattr(config, "parsing", None) or None


def output_tree(output: str, words: list[str], parsing: dict) -> tuple[Tree, Repair]:
    """A model's output as a tree over `words` (repaired when it must be: `linearization.to_tree`)."""
    return to_tree(output, words, parsing.get("phrase_labels"), parsing.get("tags"))


class ParseMetrics:
    """`compute_metrics` for a parse model in Seq2SeqTrainer: each output made a tree over its sentence's words and
    scored against the gold tree with EVALB's rules (COLLINS.prm), as `TranslationMetrics` scores BLEU; the
    evaluation set carries its words (`source_text`) and gold targets (`target_text`)."""

    names = ("evalb_", "repaired")

    def __init__(self, tokenizer: PreTrainedTokenizerBase, parsing: dict) -> None:
        self.tokenizer = tokenizer
        self.parsing = parsing
        self.sources: list[str] = []
        self.references: list[str] = []
        self.hypotheses: list[str] = []  # the trees, one line each (written as the split's .hyp)

    def expect(self, dataset) -> None:
        self.sources = dataset["source_text"]
        self.references = dataset["target_text"]

    def __call__(self, prediction: EvalPrediction) -> dict:
        predictions = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        outputs = decode(self.tokenizer, predictions[: len(self.sources)])
        gold, test, repaired = [], [], 0
        for output, reference, source in zip(outputs, self.references, self.sources, strict=True):
            words = source.split()
            gold.append(output_tree(reference, words, self.parsing)[0])
            tree, repair = output_tree(output, words, self.parsing)
            test.append(tree)
            repaired += bool(repair)
        self.hypotheses = [str(tree) for tree in test]
        return {**score_trees(gold, test, SCORING).as_dict(), "repaired": repaired, "samples": len(test)}
