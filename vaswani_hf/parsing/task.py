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
from .treebank import gold_pairs, sentence_pairs
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


def builtin_gold(split: str) -> list[Tree]:
    """The built-in treebank's cleaned trees of `split`, row for row with `builtin_pairs`' pairs."""
    from .builtin_treebank import builtin_treebank

    return [gold for *_, gold in gold_pairs(builtin_treebank()[split])]


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


def scored_tree(test: Tree, gold: Tree, parsing: dict) -> Tree:
    """The tree EVALB scores for `test`: a model of the xx form writes every tag XX, so its words take the gold
    tree's tags, as Vinyals et al. (2015) scored such outputs (EVALB deletes punctuation by its tag, on both sides;
    an XX comma would be kept on one side only and make the sentence an error)."""
    if parsing.get("form") != "xx":
        return test
    tags = iter(tag for tag, _ in gold.tagged_words())

    def retag(node: Tree) -> Tree:
        if node.is_preterminal():
            return Tree(next(tags, node.label), list(node.children))
        return Tree(node.label, [retag(child) if isinstance(child, Tree) else child for child in node.children])

    return retag(test) if len(test.words()) == len(gold.words()) else test


class ParseMetrics:
    """`compute_metrics` for a parse model in Seq2SeqTrainer: each output made a tree over its sentence's words and
    scored against the split's cleaned gold tree with EVALB's rules (COLLINS.prm), as `TranslationMetrics` scores
    BLEU. The evaluation set carries its words (`source_text`) and each example's row in the split (`row`), which
    picks its gold tree: never a tree rebuilt from the target, which would carry the target's form (XX tags) and
    the training labels."""

    names = ("evalb_", "repaired")

    def __init__(self, tokenizer: PreTrainedTokenizerBase, parsing: dict, gold: list[Tree]) -> None:
        self.tokenizer = tokenizer
        self.parsing = parsing
        self.gold = gold
        self.sources: list[str] = []
        self.rows: list[int] = []
        self.hypotheses: list[str] = []  # the trees, one line each (written as the split's .hyp)

    def expect(self, dataset) -> None:
        self.sources = dataset["source_text"]
        self.rows = dataset["row"]

    def __call__(self, prediction: EvalPrediction) -> dict:
        predictions = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        outputs = decode(self.tokenizer, predictions[: len(self.sources)])
        gold, test, repaired = [], [], 0
        for output, row, source in zip(outputs, self.rows, self.sources, strict=True):
            tree, repair = output_tree(output, source.split(), self.parsing)
            gold.append(self.gold[row])
            test.append(scored_tree(tree, self.gold[row], self.parsing))
            repaired += bool(repair)
        self.hypotheses = [str(tree) for tree in test]
        return {**score_trees(gold, test, SCORING).as_dict(), "repaired": repaired, "samples": len(test)}
