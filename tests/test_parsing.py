"""Section 6.3's data side: treebank reading in every form, the cleaning parsing work applies, the linearisation's
round trip, the repair of any model output into a tree of the sentence, and the vocabulary of tree symbols."""

import gzip
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vaswani_hf.data.tokenization import train_shared_bpe
from vaswani_hf.parsing.linearization import escape_word, linearize, to_tree
from vaswani_hf.parsing.treebank import available_splits, clean, pairs_folder, read_labels, sentence_pairs
from vaswani_hf.parsing.trees import MalformedTree, parse_tree, read_trees

# two trees as the Penn Treebank's .mrg files write them: an empty top, pretty-printed, function tags, traces
MRG = """( (S
    (NP-SBJ-1 (DT The) (NN company) )
    (VP (VBD said)
      (SBAR (-NONE- 0)
        (S
          (NP-SBJ (PRP it) )
          (VP (MD would)
            (VP (VB buy)
              (NP (NNS shares) ))))))
    (. .) ))

( (S-TPC-2
    (`` ``)
    (NP-SBJ (NNP Rates) )
    (VP (VBD fell)
      (PP-LOC (IN in)
        (NP (-LRB- -LRB-) (NNP Tokyo) (-RRB- -RRB-) )))
    (. .) ('' '') ))
"""
CLEAN = [
    "(S (NP (DT The) (NN company)) (VP (VBD said) (SBAR (S (NP (PRP it)) (VP (MD would) (VP (VB buy) (NP (NNS "
    "shares))))))) (. .))",
    "(S (`` ``) (NP (NNP Rates)) (VP (VBD fell) (PP (IN in) (NP (-LRB- -LRB-) (NNP Tokyo) (-RRB- -RRB-)))) (. .) "
    "('' ''))",
]


@pytest.mark.parametrize("name", ["wsj_0001.mrg", "dev.trees", "a.ptb.gz", "oneline.trees"])
def test_reader_takes_every_form_and_cleans_as_parsing_work_does(tmp_path, name):
    text = MRG
    if name == "oneline.trees":  # one tree a line, top labelled TOP
        text = "\n".join(str(parse_tree(t)).replace("( ", "(TOP ", 1) for t in MRG.split("\n\n")) + "\n"
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    assert [str(clean(tree)) for tree in read_trees(path)] == CLEAN


def test_cleaning_rules():
    assert str(clean(parse_tree("(ROOT (S (NP-SBJ=2 (-NONE- *T*-1)) (VP (VBZ is))))"))) == "(S (VP (VBZ is)))"
    assert clean(parse_tree("( (S (NP (-NONE- *)) ))")) is None  # nothing but a null element
    # a top over several constituents keeps a bracket, labelled TOP
    assert str(clean(parse_tree("( (NP (NN a)) (. .))"))) == "(TOP (NP (NN a)) (. .))"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("(S (NP (DT the) (NN dog))", "unbalanced"),
        ("(S (NP (DT the)))) ", "closes nothing"),
        ("(S (NP the dog))", "no tag"),
        ("(S (NN f(x)))", "write round brackets in words as -LRB- and -RRB-"),
        ("S (NN x))", "starts with"),
    ],
)
def test_malformed_tree_names_file_tree_and_line(tmp_path, text, problem):
    path = tmp_path / "train.trees"
    path.write_text("(S (NN fine))\n\n" + text + "\n")
    with pytest.raises(MalformedTree, match=rf"train.trees: tree 2 \(line 3\): .*{problem}"):
        list(read_trees(path))


def test_conversion_stops_on_a_malformed_tree_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("VASWANI_PREPARED_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "train.trees").write_text(CLEAN[0] + "\n" + "(S (NP (DT a)\n")
    with pytest.raises(MalformedTree, match="tree 2 .line 2."):
        pairs_folder(tmp_path / "tb", [])
    assert [p.name for p in (tmp_path / "cache" / "treebanks").iterdir() if not p.name.endswith(".lock")] == []
    (tmp_path / "tb" / "train.trees").write_text("")
    with pytest.raises(MalformedTree, match="no tree"):
        pairs_folder(tmp_path / "tb", [])


def test_pairs_folder_converts_once_with_labels(tmp_path, monkeypatch):
    monkeypatch.setenv("VASWANI_PREPARED_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "train.mrg").write_text(MRG)
    (tmp_path / "tb" / "dev.trees.gz").write_bytes(gzip.compress(CLEAN[1].encode()))
    assert available_splits(tmp_path / "tb") == ["dev", "train"]
    folder = pairs_folder(tmp_path / "tb", ["dev"])
    assert pairs_folder(tmp_path / "tb", ["dev"]) == folder  # reused
    assert (folder / "train.words").read_text().splitlines()[0] == "The company said it would buy shares ."
    assert (folder / "dev.tree").read_text().split()[:3] == ["S", "``", "NP"]
    labels = read_labels(folder)
    assert "SBAR" in labels["phrase_labels"] and "-LRB-" in labels["tags"] and labels["pairs"] == {"train": 2, "dev": 1}
    with pytest.raises(FileNotFoundError, match="no tree file for split 'test'.*splits: dev, train"):
        pairs_folder(tmp_path / "tb", ["test"])


def test_linearization_is_tensor2tensors_form_and_round_trips():
    tree = parse_tree(CLEAN[0])
    target = linearize(tree)
    assert target.startswith("S NP DT NN /NP VP VBD SBAR S NP PRP /NP")
    assert target.endswith("/VP /S /SBAR /VP . /S")
    assert linearize(tree, "xx").split()[:4] == ["S", "NP", "XX", "XX"]
    for text in CLEAN:
        tree = parse_tree(text)
        rebuilt, repair = to_tree(linearize(tree), tree.words())
        assert not repair and str(rebuilt) == f"(TOP {text})"


def test_labels_that_double_as_tags_are_refused_in_the_tags_form(tmp_path, monkeypatch):
    # `X X Y ... /Y /X` reads two ways when X is both a tag and a phrase label: the xx form has no such tags
    monkeypatch.setenv("VASWANI_PREPARED_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "train.trees").write_text("(X (X a) (Y (X b) (Z c)))\n")
    with pytest.raises(ValueError, match="X is both a phrase label and a tag.*--linearization xx"):
        pairs_folder(tmp_path / "tb", [])
    assert read_labels(pairs_folder(tmp_path / "tb", [], form="xx"))["tags"] == ["X", "Z"]


LABELS = {"phrase_labels": ["S", "NP", "VP", "PP"], "tags": ["DT", "NN", "VBD", "IN", "."]}


@pytest.mark.parametrize(
    "output, kinds, expected",
    [
        (
            "S NP DT NN /NP VP VBD",
            ["unclosed", "missing_tags"],
            "(TOP (S (NP (DT the) (NN dog)) (VP (VBD ran))) (. .))",
        ),
        ("", ["missing_tags"], "(TOP (XX the) (XX dog) (XX ran) (. .))"),
        ("S NP DT NN NN /NP VP VBD /VP . . /S", ["extra_tags"], None),
        ("S /PP NP DT NN /NP /S /S", ["dropped_closes", "missing_tags"], None),
        ("S NP DT NN /NP VP VBD /VP . /S <unk> banana", ["unknown_tokens"], None),
        ("S NP /NP NP DT NN /NP VP VBD /VP . /S", ["empty_constituents"], None),
    ],
)
def test_repair_makes_a_tree_of_the_sentence(output, kinds, expected):
    words = "the dog ran .".split()
    tree, repair = to_tree(output, words, **LABELS)
    assert repair.kinds() == kinds
    assert tree.words() == words
    assert parse_tree(str(tree)).words() == words
    if expected:
        assert str(tree) == expected


SYMBOLS = ["S", "NP", "VP", "PP", "/S", "/NP", "/VP", "/PP", "DT", "NN", "VBD", "IN", ".", "XX", "<unk>", "(", "/"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(SYMBOLS), max_size=40), st.integers(0, 12), st.booleans())
def test_repair_of_any_output_gives_a_well_formed_tree_with_the_inputs_leaves(tokens, length, with_labels):
    words = [escape_word(w) for w in random.Random(length).choices(["a", "b", "(", ")", "x)y", "."], k=length)]
    labels = LABELS if with_labels else {}
    tree, _ = to_tree(tokens, words, **labels)
    assert tree.words() == words
    if words:
        assert parse_tree(str(tree)).words() == words  # it reads back: well formed


def test_tree_symbols_are_whole_vocabulary_entries():
    pairs = list(sentence_pairs([parse_tree(t) for t in CLEAN]))
    symbols = {s for _, target in pairs for s in target.split()}
    tokenizer = train_shared_bpe((words for words, _ in pairs * 20), 80, split_punctuation=False, whole_words=symbols)
    for _, target in pairs:
        ids = tokenizer(target).input_ids[:-1]
        assert len(ids) == len(target.split())  # one entry a symbol, never split by BPE
        assert tokenizer.decode(ids) == target
    with pytest.raises(ValueError, match="split_punctuation=False"):
        train_shared_bpe(["a b"], 40, whole_words={"/NP"})


def test_the_tree_constraint_allows_only_what_can_still_become_a_tree_of_the_sentence():
    import torch

    from vaswani_hf.parsing.constraint import tree_constraint_factory

    pairs = list(sentence_pairs([parse_tree(t) for t in CLEAN]))
    symbols = {s for _, target in pairs for s in target.split()}
    tokenizer = train_shared_bpe((words for words, _ in pairs * 20), 80, split_punctuation=False, whole_words=symbols)
    parsing = {"form": "tags", "phrase_labels": ["S", "NP", "VP", "PP", "SBAR"], "tags": ["DT", "NN", "VBD", "."]}
    source = tokenizer(["The company said ."], return_tensors="pt").input_ids  # 4 words
    (constraint,) = tree_constraint_factory(tokenizer, parsing)(source)
    vocabulary = tokenizer.get_vocab()

    def allowed(prefix: str) -> set[str]:
        ids = [tokenizer.pad_token_id] + [vocabulary["\u2581" + s] for s in prefix.split()]
        scores = constraint(torch.tensor([ids]), torch.zeros(1, len(tokenizer)))
        names = tokenizer.convert_ids_to_tokens(torch.isfinite(scores[0]).nonzero().flatten().tolist())
        return {name.removeprefix("\u2581") for name in names}

    labels_and_tags = {"S", "NP", "VP", "PP", "SBAR", "DT", "NN", "VBD", "."}
    assert allowed("") == labels_and_tags  # no end, no closing, no word piece
    assert allowed("S NP") == labels_and_tags  # NP holds no word yet: it cannot close
    assert allowed("S NP DT NN") == labels_and_tags | {"/NP"}  # only the innermost label closes
    assert allowed("S NP DT NN /NP VP VBD .") == {"/VP"}  # every word has its tag: close, then end
    assert allowed("S NP DT NN /NP VP VBD . /VP") == {"/S"}
    assert allowed("S NP DT NN /NP VP VBD . /VP /S") == {"</s>"}
    # rows of one batch in different states each get their own mask (the closing symbol is set row by row)
    prefixes = ["S NP DT NN", "S VP VBD NN", "S NP NP DT", "S NP DT /NP"]
    batch = torch.tensor([[tokenizer.pad_token_id] + [vocabulary["\u2581" + s] for s in p.split()] for p in prefixes])
    constraint.search_rows(torch.zeros(4, dtype=int), None)  # four rows of the one sentence
    together = constraint(batch, torch.zeros(len(prefixes), len(tokenizer)))
    alone = [constraint(row[None], torch.zeros(1, len(tokenizer))) for row in batch]
    assert torch.equal(torch.isfinite(together), torch.isfinite(torch.cat(alone)))
    closes = [{n for n in tokenizer.convert_ids_to_tokens(row.nonzero().flatten().tolist()) if "/" in n}
              for row in torch.isfinite(together)]  # fmt: skip
    assert closes == [{"\u2581/NP"}, {"\u2581/VP"}, {"\u2581/NP"}, {"\u2581/S"}]
