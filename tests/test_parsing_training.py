"""Section 6.3 end to end: `vaswani train --task parse` on the built-in treebank and on a treebank folder, the
parse model's saved settings (labels, beam 21 / alpha 0.3 / input + 300) through save, load and remote code,
`vaswani parse` (trees always of the input's words), `vaswani evaluate` of a parser, and the refusals."""

import json
import os
import subprocess
import sys

import pytest

from vaswani_hf.parsing.builtin_treebank import builtin_treebank, write_treebank
from vaswani_hf.parsing.evalb import COLLINS
from vaswani_hf.parsing.treebank import clean
from vaswani_hf.parsing.trees import Tree, parse_tree, tree_texts

from .helpers import trained_once, vaswani

PARSE_RUN = ["--task", "parse", "--preset", "tiny", "--max_steps", "40", "--warmup_steps", "10", "--vocab_size", "200",
             "--per_device_train_batch_size", "16", "--disable_tqdm", "true", "--max_eval_samples", "6",
             "--precision", "fp32", "--generation_num_beams", "2", "--generation_max_length", "64"]  # fmt: skip
SENTENCES = ["The dog saw a cat .", "", "He said , `` It ( really ) rained . ''", "x"]
PUNCTUATION = set(COLLINS.delete_labels) - {"TOP", "-NONE-"}


@pytest.fixture(scope="module")
def parser(tmp_path_factory):
    """A barely trained parser of the built-in treebank (what it says does not matter: every tree must be one)."""
    folder, stdout = trained_once("parser", PARSE_RUN, tmp_path_factory)
    summary = json.loads(next(line for line in stdout.splitlines() if line.startswith('{"')))
    assert summary["eval_split"] == "test" and summary["samples"] == 6
    assert {"evalb_f1", "evalb_recall", "evalb_tagging_accuracy", "evalb_f1_len40", "repaired"} <= set(summary)
    assert "EVALB F1" in stdout
    return folder


def test_a_parse_model_keeps_its_labels_and_the_papers_decoding(parser):
    config = json.loads((parser / "config.json").read_text())
    generation = json.loads((parser / "generation_config.json").read_text())
    assert config["parsing"]["form"] == "tags" and {"NP", "VP", "SBAR"} <= set(config["parsing"]["phrase_labels"])
    assert {"DT", "-LRB-", "``"} <= set(config["parsing"]["tags"])
    assert (generation["num_beams"], generation["length_penalty"], generation["max_length_offset"]) == (21, 0.3, 300)
    hypotheses = (parser / "test.hyp").read_text().splitlines()
    assert len(hypotheses) == 6 and all(parse_tree(tree).label == "TOP" for tree in hypotheses)
    # remote code, where the package is absent, keeps the parsing settings and the tree symbols whole
    code = ("import sys; sys.modules['vaswani_hf'] = None; from transformers import AutoConfig, AutoTokenizer; "
            f"c = AutoConfig.from_pretrained({str(parser)!r}, trust_remote_code=True); t = AutoTokenizer."
            f"from_pretrained({str(parser)!r}, trust_remote_code=True); ids = t('S NP DT /NP /S').input_ids; "
            "assert len(ids) == 6 and t.decode(ids, skip_special_tokens=True) == 'S NP DT /NP /S', ids; "
            "print(c.parsing['form'])")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "tags", result.stderr[-2000:]


def test_parse_writes_a_tree_of_each_lines_words(parser, tmp_path):
    result = vaswani("parse", str(parser), "--num-beams", "3", stdin="\n".join(SENTENCES) + "\n")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == len(SENTENCES) and lines[1] == ""
    for sentence, line in zip(SENTENCES, lines, strict=True):
        if sentence:
            words = [w.replace("(", "-LRB-").replace(")", "-RRB-") for w in sentence.split()]
            assert parse_tree(line).words() == words
    # the constrained search (the default) gives trees of the sentence as they are: nothing to repair
    assert "4 sentences parsed; 0 best outputs needed repair" in result.stderr
    plain = vaswani("parse", str(parser), "--num-beams", "3", "--tree_search", "plain", stdin="\n".join(SENTENCES))
    assert plain.returncode == 0, plain.stderr[-3000:]
    for sentence, line in zip(SENTENCES, plain.stdout.splitlines(), strict=True):
        assert parse_tree(line).words() == [w.replace("(", "-LRB-").replace(")", "-RRB-") for w in sentence.split()] \
            if sentence else line == ""  # fmt: skip
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    result = vaswani("parse", str(parser), str(tmp_path / "in.txt"), "--nbest", "2", "--num-beams", "3",
                     "--output", str(tmp_path / "out.txt"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split(" ||| ") for line in (tmp_path / "out.txt").read_text().splitlines()]
    assert [int(row[0]) for row in rows if row[1]] == [0, 0, 2, 2, 3, 3]
    assert all(parse_tree(row[1]).words() for row in rows if row[1])


def without_punctuation(tree: Tree) -> Tree:
    """`tree` without the words EVALB deletes by their tag (COLLINS.prm's punctuation), and the brackets left empty."""
    children = [without_punctuation(child) if isinstance(child, Tree) and not child.is_preterminal() else child
                for child in tree.children if not (isinstance(child, Tree) and child.label in PUNCTUATION)]  # fmt: skip
    return Tree(tree.label, [child for child in children if not isinstance(child, Tree) or child.children])


def test_evaluate_a_parser_on_a_treebank_folder_prints_evalbs_summary(parser, tmp_path):
    # without punctuation: EVALB deletes a word by each tree's own tag, and a barely trained parser that tags the
    # final "." NN would make every sentence an error sentence, leaving no figure to compare
    splits = {"test": [without_punctuation(tree) for tree in builtin_treebank(train_size=10, test_size=5)["test"]]}
    write_treebank(tmp_path / "tb", {"test": splits["test"]})
    result = vaswani("evaluate", str(parser), "--data", str(tmp_path / "tb"), "--split", "test", "--num-beams", "2",
                     "--hypotheses", str(tmp_path / "hyp.trees"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "-- len<=40 --" in result.stdout and "Bracketing FMeasure" in result.stdout
    figures = json.loads(result.stdout.splitlines()[-1])
    assert figures["evalb_sentences"] == 5 and figures["sentences"] == 5
    # the trees written score the same through vaswani evalb against the raw gold file
    # (the gold cleaned under a TOP bracket: EVALB counts the raw files' empty top as a bracket of its own)
    (tmp_path / "gold.trees").write_text("".join(f"(TOP {clean(tree)})\n" for tree in splits["test"]))
    scored = vaswani("evalb", str(tmp_path / "gold.trees"), str(tmp_path / "hyp.trees"), "-e", "0")
    assert scored.returncode == 0, scored.stderr
    assert figures["evalb_valid_sentences"] > 0 and figures["evalb_f1"] > 0  # a real figure, not -nan
    lines = scored.stdout.split("-- len<=40 --")[0].splitlines()
    printed = {name.strip(): float(value) for name, value in (ln.split("=") for ln in lines if ln.count("=") == 1)}
    names = {"Bracketing FMeasure": "f1", "Bracketing Recall": "recall", "Bracketing Precision": "precision",
             "Tagging accuracy": "tagging_accuracy", "Number of Valid sentence": "valid_sentences"}  # fmt: skip
    for name, figure in names.items():
        assert printed[name] == pytest.approx(figures[f"evalb_{figure}"], abs=0.005), name


def test_train_and_prepare_on_a_treebank_folder(tmp_path):
    splits = builtin_treebank(train_size=300, test_size=10)
    write_treebank(tmp_path / "tb", {"train": splits["train"], "dev": splits["dev"]})
    env = {**os.environ, "VASWANI_PREPARED_CACHE": str(tmp_path / "cache")}
    prepared = vaswani("prepare", "--task", "parse", "--data", str(tmp_path / "tb"), "--vocab_size", "200",
                       "--output_dir", str(tmp_path / "prepared"), env=env)  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    assert "--task parse" in prepared.stdout and (tmp_path / "prepared" / "labels.json").is_file()
    run = [*PARSE_RUN, "--max_steps", "4", "--output_dir", str(tmp_path / "model")]
    result = vaswani("train", *run, "--data", str(tmp_path / "prepared"), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(next(line for line in result.stdout.splitlines() if line.startswith('{"')))["eval_split"] == "dev"
    # from the raw folder: converted into the cache once, then prepared there
    result = vaswani("train", *run, "--data", str(tmp_path / "tb"), "--overwrite_output_dir", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list((tmp_path / "cache" / "treebanks").glob("*/labels.json"))) == 1


def few_symbol_treebank(size: int, seed: int) -> list[Tree]:
    """Trees of a grammar with 3 phrase labels and 4 tags: 7 tree symbols and the end, fewer than the 42 candidates
    a row takes at the parser's beam of 21 (a treebank of another grammar than the built-in one's)."""
    import random

    rng = random.Random(seed)
    nouns, verbs = "dog cat man bird".split(), "saw liked chased".split()

    def np() -> str:
        return f"(NP (DT {rng.choice(['the', 'a'])}) (NN {rng.choice(nouns)}))"

    trees = [f"(TOP (S {np()} (VP (VBD {rng.choice(verbs)}){' ' + np() if rng.random() < 0.6 else ''})))"
             for _ in range(size)]  # fmt: skip
    return [parse_tree(tree) for tree in trees]


def test_a_treebank_with_fewer_symbols_than_candidates_trains_and_parses_at_the_default_beam(tmp_path):
    """Its final evaluation, `vaswani parse`, `Parser` and `vaswani serve` run at beam 21 (the defaults), where the
    search's candidates outnumber the tree symbols: they raised 'selected index k out of range'."""
    from vaswani_hf.parsing.parser import Parser, bracketed

    from .test_serve import Server

    write_treebank(tmp_path / "tb", {"train": few_symbol_treebank(200, 1), "dev": few_symbol_treebank(8, 2)})
    run = ["--task", "parse", "--data", str(tmp_path / "tb"), "--preset", "tiny", "--max_steps", "30",
           "--warmup_steps", "10", "--vocab_size", "60", "--disable_tqdm", "true", "--precision", "fp32",
           "--output_dir", str(tmp_path / "model")]  # fmt: skip
    result = vaswani("train", *run)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(next(line for line in result.stdout.splitlines() if line.startswith('{"')))
    assert summary["eval_split"] == "dev" and "evalb_f1" in summary
    assert json.loads((tmp_path / "model" / "generation_config.json").read_text())["num_beams"] == 21
    sentences = ["the dog saw a cat", "a bird liked the man", "the cat chased"]
    parsed = vaswani("parse", str(tmp_path / "model"), "--precision", "fp32", stdin="\n".join(sentences) + "\n")
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    trees = parsed.stdout.splitlines()
    assert [parse_tree(tree).words() for tree in trees] == [s.split() for s in sentences]
    parser = Parser.from_pretrained(tmp_path / "model", device="cpu", precision="fp32")
    assert [bracketed(tree) for tree in parser.parse_sents([s.split() for s in sentences])] == trees
    served = Server(tmp_path / "model")  # its warm-up decodes at the model's beam
    try:
        answer = served.post("/parse", json={"sentences": [s.split() for s in sentences]})
        assert answer.status_code == 200, answer.text
        assert [parse["tree"] for parse in answer.json()["parses"]] == trees
    finally:
        assert served.stop()[0] == 0


def test_bad_parsing_input_gets_a_clear_error(parser, tmp_path):
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "train.trees").write_text("(S (NP (DT a) (NN b)))\n(S (NP (DT a) (NN b))\n")
    result = vaswani("prepare", "--task", "parse", "--data", str(tmp_path / "tb"))
    assert result.returncode == 2 and "train.trees: tree 2 (line 2): unbalanced brackets" in result.stderr
    result = vaswani("parse", str(parser), "--long-lines", "split", stdin="a b\n")
    assert result.returncode == 2 and "--long-lines split" in result.stderr
    (tmp_path / "gold").write_text("(S (NN a))\n(S (NN b))\n")
    (tmp_path / "test").write_text("(S (NN a))\n")
    result = vaswani("evalb", str(tmp_path / "gold"), str(tmp_path / "test"))
    assert result.returncode == 2 and "gold holds 2 trees but" in result.stderr and "test holds 1" in result.stderr
    # a sentence longer than the model reads: an error naming the line, or its tree still holds every word
    long_line = " ".join(["dog"] * 1100) + "\n"  # past the tokenizer's 1,024 tokens
    result = vaswani("parse", str(parser), "--long-lines", "error", "--num-beams", "1", stdin="a dog\n" + long_line)
    assert result.returncode == 2 and "line 2" in result.stderr
    result = vaswani("parse", str(parser), "--num-beams", "1", stdin=long_line)
    assert result.returncode == 0 and len(parse_tree(result.stdout).words()) == 1100
    assert "1 best outputs needed repair" in result.stderr  # the words past the cut, attached at the top


def test_parse_refuses_a_translation_model(tmp_path):
    model = tmp_path / "translator"
    result = vaswani("train", "--preset", "tiny", "--max_steps", "2", "--vocab_size", "120", "--eval_split", "none",
                     "--disable_tqdm", "true", "--output_dir", str(model))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    result = vaswani("parse", str(model), stdin="a b\n")
    assert result.returncode == 2 and "not a parser" in result.stderr


def test_tree_texts_of_a_written_treebank_read_back(tmp_path):
    splits = builtin_treebank(train_size=20, test_size=3)
    (path,) = write_treebank(tmp_path, {"test": splits["test"]})
    assert [str(parse_tree(text)) for _, text in tree_texts(path.read_text().splitlines(True))] == [
        str(tree) for tree in splits["test"]
    ]
