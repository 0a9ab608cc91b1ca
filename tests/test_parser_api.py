"""A parser from Python (`vaswani_hf.Parser`, `pipeline("constituency-parsing")`): its trees are `vaswani parse`'s
for the same words (best, n-best with scores, both searches), strings are tokenised as the Penn Treebank is, trees
are NLTK's where NLTK is installed and ours where it is not, and the refusals say what to do."""

import subprocess
import sys

import pytest
import torch

from vaswani_hf import cli
from vaswani_hf.parsing.parser import Parser, ParseResult, as_tree_kind, bracketed
from vaswani_hf.parsing.trees import Tree, parse_tree

from .helpers import same_rows_but_scores

SENTENCES = [
    "The dog saw a cat with a hat.",
    ["He", "said", ",", "``", "It", "(", "really", ")", "rained", "''", "."],
    "",
    "x",
    'She can\'t say "no" (again).',
]


def build_model(folder, parser: bool = True):
    """An untrained tiny model saved as `vaswani train` saves one: a parser of the built-in treebank's labels
    (beam 4 instead of 21, for speed), or a translation model. What an untrained parser says does not matter
    here: the constrained search keeps it to trees, and every path must give the same ones."""
    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_hf.data.tokenization import train_shared_bpe
    from vaswani_hf.parsing.builtin_treebank import builtin_treebank
    from vaswani_hf.parsing.task import make_parser
    from vaswani_hf.parsing.treebank import sentence_pairs

    labels = {"phrase_labels": set(), "tags": set()}
    pairs = list(sentence_pairs(builtin_treebank(train_size=300, test_size=6)["train"], "tags", labels))
    symbols = {symbol for _, target in pairs for symbol in target.split()}
    tokenizer = train_shared_bpe((words for words, _ in pairs), 300, split_punctuation=False, whole_words=symbols)
    special = {"pad_token_id": "<pad>", "bos_token_id": "<s>", "eos_token_id": "</s>", "unk_token_id": "<unk>"}
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in special.items()}
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=len(tokenizer), **ids))
    if parser:
        make_parser(model, {"form": "tags", **{name: sorted(values) for name, values in labels.items()}})
    model.generation_config.num_beams = 4
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("parser") / "model")


@pytest.fixture(scope="module")
def parser(model_dir):
    return Parser.from_pretrained(model_dir, device="cpu", precision="fp32")


def treebank_words(sentence) -> list[str]:
    """The words `vaswani parse` is given for a sentence: a string as the Penn Treebank tokenises it."""
    from vaswani_hf.parsing.parser import tokenize

    return tokenize(sentence) if isinstance(sentence, str) else sentence


def vaswani_parse(model_dir, tmp_path, capsys, *options: str) -> tuple[list[str], str]:
    """`vaswani parse` of SENTENCES' words in this process: its output lines and its report."""
    path = tmp_path / "words.txt"
    path.write_text("".join(" ".join(treebank_words(s)) + "\n" for s in SENTENCES), encoding="utf-8")
    capsys.readouterr()
    assert cli.main(["parse", str(model_dir), str(path), "--precision", "fp32", *options]) == 0
    out = capsys.readouterr()
    return out.out.splitlines(), out.err


def test_trees_are_vaswani_parse_s_for_the_same_words(parser, model_dir, tmp_path, capsys):
    pytest.importorskip("nltk")
    lines, _ = vaswani_parse(model_dir, tmp_path, capsys)
    trees = list(parser.parse_sents(SENTENCES))
    assert [bracketed(tree) for tree in trees] == lines
    assert trees[2] is None and lines[2] == ""  # a sentence without words: no tree, as vaswani parse writes it
    assert type(trees[0]).__module__.startswith("nltk")  # NLTK is installed here (the test extra)
    assert trees[1].leaves() == ["He", "said", ",", "``", "It", "-LRB-", "really", "-RRB-", "rained", "''", "."]
    assert trees[4].leaves() == ["She", "ca", "n't", "say", "``", "no", "''", "-LRB-", "again", "-RRB-", "."]
    assert bracketed(parser.parse(SENTENCES[0])) == lines[0]


@pytest.mark.parametrize("words", [
    ["``", "I", "'m", "tired", ",", "''", "she", "said", "."],
    ["He", "did", "n't", "go", "-LRB-", "it", "rained", "-RRB-", "''", "."],
    ["`", "Yes", "'", ",", "he", "said", "--", "``", "fine", "''", "..."],
    ["The", "U.S.", "'s", "$", "5", "bill", "''", "."],
])  # fmt: skip
def test_a_string_already_tokenised_keeps_its_tokens(parser, words, caplog):
    pytest.importorskip("nltk")
    with caplog.at_level("WARNING", logger="vaswani_hf.parsing.parser"):
        tree = parser.parse(" ".join(words))
    assert tree.leaves() == words and not caplog.records  # nothing changed, nothing to report


def test_raw_text_is_tokenised_and_changed_quotes_are_reported(parser, caplog):
    pytest.importorskip("nltk")
    with caplog.at_level("WARNING", logger="vaswani_hf.parsing.parser"):
        tree = parser.parse('He said "I don\'t know."')
    assert tree.leaves() == ["He", "said", "``", "I", "do", "n't", "know", ".", "''"]
    assert len(caplog.records) == 1 and "changed characters of" in caplog.text and "``" in caplog.text


def test_nbest_gives_vaswani_parse_s_trees_and_scores_best_first(parser, model_dir, tmp_path, capsys):
    lines, _ = vaswani_parse(model_dir, tmp_path, capsys, "--nbest", "3")
    rows = [line.split(" ||| ") for line in lines]
    got = []
    for index, results in enumerate(parser.parse_sents(SENTENCES, nbest=3)):
        assert all(isinstance(result, ParseResult) for result in results)
        if index == 2:  # no words: one empty result, as vaswani parse writes one empty line
            assert results == [ParseResult(None, None, False)]
        else:
            scores = [result.score for result in results]
            assert len(results) == 3 and scores == sorted(scores, reverse=True)
        got += [[str(index), bracketed(tree), "" if score is None else f"{score:.6f}"] for tree, score, _ in results]
    same_rows_but_scores(got, rows)  # the command batches other sentences beside each: scores to within rounding
    best = parser.parse(SENTENCES[3], nbest=1)
    assert len(best) == 1 and bracketed(best[0].tree) == rows[7][1] and best[0].repaired is False


def test_the_plain_search_repairs_as_vaswani_parse_does_and_says_so(parser, model_dir, tmp_path, capsys):
    lines, report = vaswani_parse(model_dir, tmp_path, capsys, "--tree_search", "plain")
    results = [parses[0] for parses in parser.parse_sents(SENTENCES, nbest=1, tree_search="plain")]
    assert [bracketed(result.tree) for result in results] == lines
    repaired = sum(result.repaired for result in results)
    assert f"{len(SENTENCES)} sentences parsed; {repaired} best outputs needed repair" in report
    assert repaired > 0  # an untrained model's plain search emits no trees as they stand
    for result, sentence in zip(results, SENTENCES, strict=True):  # repaired or not, a tree of the sentence's words
        if sentence:
            assert parse_tree(bracketed(result.tree)).words() == [w.replace("(", "-LRB-").replace(")", "-RRB-")
                                                                   for w in treebank_words(sentence)]  # fmt: skip


def test_the_pipeline_gives_the_parser_s_trees(parser, model_dir):
    from transformers import pipeline

    pipe = pipeline("constituency-parsing", model=str(model_dir), device="cpu")
    expected = list(parser.parse_sents(SENTENCES, nbest=2))
    one = pipe(SENTENCES[0])
    assert bracketed(one["tree"]) == bracketed(expected[0][0].tree) and one["score"] == pytest.approx(
        expected[0][0].score, abs=1e-4
    )
    assert one["repaired"] is False
    many = pipe(SENTENCES, nbest=2, batch_size=2)
    assert [[bracketed(p["tree"]) for p in found] for found in many] == [
        [bracketed(r.tree) for r in results] for results in expected
    ]
    ours = pipe([SENTENCES[1]], as_nltk=False)[0]["tree"]
    assert isinstance(ours, Tree) and str(ours) == bracketed(expected[1][0].tree)


@pytest.mark.parametrize("first", ["vaswani_hf", "transformers.pipelines"])
def test_import_vaswani_hf_registers_the_tasks_without_loading_the_parser(first):
    """Whichever is imported first, `pipeline()` knows both tasks; `import vaswani_hf` loads no parser, and neither
    it nor the `vaswani` command loads Transformers' pipelines (half a second of every start) or `evaluate` (which
    imports them)."""
    light = "assert not {'transformers.pipelines', 'evaluate'} & set(sys.modules)"
    code = (f"import sys, {first}; import vaswani_hf; "
            + ("" if first == "transformers.pipelines" else f"{light}; assert 'vaswani_hf.parsing.parser' not in "
               f"sys.modules; import vaswani_hf.cli; {light}; ")
            + "from transformers import pipeline; from transformers.pipelines import PIPELINE_REGISTRY; "
            "assert {'translation', 'constituency-parsing'} <= set(PIPELINE_REGISTRY.get_supported_tasks()); "
            "assert vaswani_hf.Parser.__module__ == 'vaswani_hf.parsing.parser'")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_without_nltk_trees_are_ours_and_strings_say_what_to_install(parser, monkeypatch):
    expected = bracketed(parser.parse(SENTENCES[1]))
    monkeypatch.setitem(sys.modules, "nltk", None)  # import nltk now raises ImportError
    monkeypatch.setitem(sys.modules, "nltk.tokenize", None)
    plain = Parser(parser.model, parser.tokenizer)
    tree = plain.parse(SENTENCES[1])
    assert isinstance(tree, Tree) and str(tree) == expected
    with pytest.raises(ImportError, match=r'pip install "vaswani-hf\[parse\]"'):
        plain.parse("The dog barked .")
    with pytest.raises(ImportError, match=r'as_nltk=True .*pip install "vaswani-hf\[parse\]"'):
        Parser(parser.model, parser.tokenizer, as_nltk=True)


def test_a_translation_model_is_refused_with_vaswani_parse_s_message(tmp_path, capsys):
    translator = build_model(tmp_path / "translator", parser=False)
    capsys.readouterr()
    assert cli.main(["parse", str(translator), "--precision", "fp32"]) == 2
    message = capsys.readouterr().err.splitlines()[-1].removeprefix("error: ")
    assert "is a translation model, not a parser" in message
    with pytest.raises(ValueError) as refused:
        Parser.from_pretrained(translator, device="cpu", precision="fp32")
    assert str(refused.value) == message
    from transformers import pipeline

    with pytest.raises(ValueError, match="is a translation model, not a parser"):
        pipeline("constituency-parsing", model=str(translator), device="cpu")


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda p: p.parse(["two words", "b"]), ValueError, r"word 1 \('two words'\) is empty or holds white space"),
        (lambda p: p.parse(["a", ""]), ValueError, "word 2"),
        (lambda p: p.parse(7), TypeError, "a sentence is a string or a list of words"),
        (lambda p: p.parse("a", tree_search="greedy"), ValueError, "tree_search 'greedy': choose constrained or plain"),
        (lambda p: p.parse("a", nbest=0), ValueError, "nbest must be a whole number of at least 1"),
        (lambda p: p.parse("a", beams=3), TypeError, "unknown option"),
        (lambda p: Parser(p.model, p.tokenizer, long_lines="split"), ValueError, "one tree of the whole sentence"),
    ],
)
def test_bad_calls_are_refused_by_name(parser, call, error, message):
    with pytest.raises(error, match=message):
        call(parser)


def test_a_deep_tree_becomes_an_nltk_tree_without_recursion():
    pytest.importorskip("nltk")
    tree = Tree("NN", ["w"])
    for _ in range(5000):  # past Python's recursion limit
        tree = Tree("NP", [tree])
    node, depth = as_tree_kind(tree, True), 0
    while not isinstance(node, str):  # walked, not recursed: NLTK's own height() would recurse
        assert type(node).__module__.startswith("nltk") and len(node) == 1
        node, depth = node[0], depth + 1
    assert (node, depth) == ("w", 5001)
