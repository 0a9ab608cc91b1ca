"""The built-in treebank of the parsing task: deterministic, held-out splits, PTB-like raw trees, and learnable
(one tag per word, one tree per word sequence)."""

from __future__ import annotations

import re
import statistics
from itertools import pairwise

import pytest

from vaswani_hf.parsing import builtin_treebank as grammar
from vaswani_hf.parsing.builtin_treebank import LEXICON, builtin_treebank, generate_trees, write_treebank
from vaswani_hf.parsing.trees import Tree, parse_tree, read_trees


@pytest.fixture(scope="module")
def sample() -> list[Tree]:
    return generate_trees(3000, seed=0)


def _sentence(tree: Tree) -> str:
    return " ".join(tree.words())


def _stripped(node: Tree, word=lambda word: word) -> Tree | None:
    """The tree as parsing sees it: no -NONE- elements (nor the constituents they leave empty), no function tags or
    indices, no empty top bracket; `word` rewrites the words."""
    if node.label == "-NONE-":
        return None
    if node.is_preterminal():
        return Tree(node.label, [word(node.children[0])])
    children = [child for child in (_stripped(child, word) for child in node.children) if child is not None]
    if not children:
        return None
    if not node.label:
        return children[0]
    return Tree(node.label if node.label.startswith("-") else re.split(r"[-=]", node.label)[0], children)


def _labels(node: Tree) -> list[str]:
    return [node.label] + [label for child in node.children if isinstance(child, Tree) for label in _labels(child)]


def test_deterministic_for_a_seed():
    first, again, other = generate_trees(200, seed=7), generate_trees(200, seed=7), generate_trees(200, seed=8)
    assert [str(tree) for tree in first] == [str(tree) for tree in again]
    assert [str(tree) for tree in first] != [str(tree) for tree in other]
    assert len({_sentence(tree) for tree in first}) == 200  # distinct sentences


def test_held_out_sentences_never_in_training():
    splits = builtin_treebank(train_size=2000, test_size=200)
    assert {split: len(trees) for split, trees in splits.items()} == {"train": 2000, "dev": 200, "test": 200}
    train, dev, test = ({_sentence(tree) for tree in splits[split]} for split in ("train", "dev", "test"))
    assert not train & dev and not train & test and not dev & test
    assert len(dev) == len(test) == 200


def test_trees_reparse_and_keep_the_empty_top(sample):
    for tree in sample:
        assert tree.label == "" and len(tree.children) == 1 and tree.children[0].label == "S"
        assert str(parse_tree(str(tree))) == str(tree)


def test_raw_trees_carry_what_the_cleaning_removes(sample):
    labels = {label for tree in sample for label in _labels(tree)}
    nulls = {word for tree in sample for tag, word in tree.tagged_words() if tag == "-NONE-"}
    assert {"0", "*", "*T*-1", "*-1"} <= nulls
    assert {"NP-SBJ", "NP-SBJ-1", "PP-CLR", "PP-TMP", "S-TPC-1", "SBAR-ADV", "ADVP-TMP", "WHNP-1"} <= labels
    assert {"PRN", "PRT", "QP", "ADJP", "ADVP", "SBAR", "PP", "VP", "NP"} <= labels
    tags = {tag for tree in sample for tag, _ in tree.tagged_words()}
    assert {"``", "''", "-LRB-", "-RRB-", ",", ".", ":", "POS", "RP", "WDT", "MD", "TO", "CD", "PRP$"} <= tags


def test_every_word_has_one_tag(sample):
    seen: dict[str, str] = {}
    for tree in sample:
        for tag, word in tree.tagged_words():
            if tag == "-NONE-":
                continue
            assert seen.setdefault(word, tag) == tag, f"{word!r} is both {seen[word]} and {tag}"
            assert LEXICON.get(word[:1].lower() + word[1:], LEXICON.get(word)) == tag  # capitalised first words too


def _word_classes() -> dict[str, str]:
    """Each word's class as the grammar sees it: an open-class word stands for the list it comes from (a verb for its
    frame and preposition, a noun for persons, things or mass nouns, ...); determiners, pronouns, numbers, modals,
    adjectives and degree adverbs for their tag; the other function words for themselves."""
    classes = {word: tag if tag in ("DT", "PRP", "PRP$", "CD", "MD", "JJ") else word for word, tag in LEXICON.items()}
    groups = {"NN-person": grammar.HUMANS, "NN-thing": grammar.THINGS, "NN-mass": grammar.MASS,
              "NNS-person": [grammar.PLURALS[noun] for noun in grammar.HUMANS], "NNP-person": grammar.PERSONS,
              "NNS-thing": [grammar.PLURALS[noun] for noun in grammar.THINGS], "NNP-place": grammar.PLACES,
              "JJ-of": grammar.OF_ADJECTIVES, "RB-manner": grammar.MANNER, "RB-time": grammar.TIME,
              "RB-degree": grammar.DEGREE, "RB-about": grammar.APPROXIMATE, "CD-year": grammar.YEARS}  # fmt: skip
    classes.update({word: name for name, words in groups.items() for word in words})
    for frame, entries in grammar.VERBS.items():
        for base, past, present, *preposition in entries:
            for tag, word in (("VB", base), ("VBD", past), ("VBZ", present)):
                classes[word] = f"{tag}-{frame}-{preposition}"
    return classes


def _shape(node: Tree, classes: dict[str, str]) -> Tree | None:
    """The stripped tree over word classes, without the adjectives before nouns (which never change a structure):
    sentences of one shape are the same sentence to a model that has learnt the word classes."""
    if node.is_preterminal():
        return _stripped(node, lambda word: classes.get(word[:1].lower() + word[1:], classes.get(word, word)))
    kept = [c for c in node.children if not (node.label.startswith("NP") and c.label in ("JJ", "ADJP"))]
    return _stripped(Tree(node.label, [_shape(child, classes) or Tree("-NONE-", ["*"]) for child in kept]))


def test_a_word_sequence_has_one_tree():
    """Same words, same tree; and, stronger, the same sequence of word classes gives the same tree: no structure
    depends on more than the words' classes, which the model can learn. (200,000 trees checked so: no clash.)"""
    classes = _word_classes()
    trees: dict[str, str] = {}
    shapes: dict[str, str] = {}
    shared = 0
    for seed in range(3):
        for tree in generate_trees(3000, seed=seed):
            sentence, stripped = _sentence(tree), str(_stripped(tree))
            assert trees.setdefault(sentence, stripped) == stripped, sentence
            shape = _shape(tree, classes)
            sequence = " ".join(shape.words())
            shared += sequence in shapes
            assert shapes.setdefault(sequence, str(shape)) == str(shape), sentence
    assert shared > 1000  # the shapes recur enough for this to test something


def _nodes(node: Tree):
    yield node
    for child in node.children:
        if isinstance(child, Tree):
            yield from _nodes(child)


def test_the_verb_decides_a_pp_after_its_object(sample):
    """A PP after a verb's object is the verb's only for a verb whose class takes it ("placed the book on", "gave
    the book to"), or for a time PP ("after the party"), whose prepositions never modify a noun."""
    frames = {word: (frame, entry[3:]) for frame, entries in grammar.VERBS.items() for entry in entries
              for word in entry[:3]}  # fmt: skip
    for tree in sample:
        for node in _nodes(tree):
            if node.is_preterminal():
                continue
            phrases = [child for child in node.children if not child.is_preterminal() or child.label[:2] == "VB"]
            if node.label.startswith("NP"):
                heads = [child.children[0].children[0] for child in phrases if child.label == "PP"]
                assert not set(heads) & set(grammar.TIME_PREPS), str(node)
            if node.label != "VP" or phrases[0].label[:2] != "VB":
                continue
            frame, preposition = frames.get(phrases[0].children[0].lower(), (None, []))
            for before, pp in pairwise(phrases):
                if before.label.startswith("NP") and pp.label.startswith("PP"):
                    head = pp.children[0].children[0]
                    assert (
                        (pp.label == "PP-TMP" and head in grammar.TIME_PREPS)
                        or (frame == "put" and [head] == preposition)
                        or (frame == "ditrans" and head == "to")
                    ), str(node)


def test_lengths(sample):
    lengths = [len(tree.words()) for tree in sample]
    assert 10 <= statistics.median(lengths) <= 13
    assert sum(4 <= n <= 30 for n in lengths) / len(lengths) > 0.95
    assert 0 < sum(n > 40 for n in lengths) / len(lengths) < 0.01  # the len <= 40 cutoff matters, a little
    assert max(lengths) <= 46


def test_write_treebank_reads_back(tmp_path, sample):
    paths = write_treebank(tmp_path / "treebank", {"train": sample[:50], "dev": sample[50:60]})
    assert [path.name for path in paths] == ["train.trees", "dev.trees"]
    assert len(paths[0].read_text().splitlines()) == 50
    assert [str(tree) for tree in read_trees(paths[1])] == [str(tree) for tree in sample[50:60]]
