"""`vaswani_hf.parsing.evalb` against the reference EVALB's own output (tests/fixtures/evalb/README.md)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from vaswani_hf.parsing.evalb import (
    COLLINS,
    NK,
    EvalbAborted,
    evalb_command,
    format_per_sentence,
    format_summary,
    parameters,
    read_tree_file,
    score_files,
    score_trees,
)
from vaswani_hf.parsing.trees import parse_tree

FIXTURES = Path(__file__).parent / "fixtures" / "evalb"
GOLD, GOLD_PRETTY, TEST = FIXTURES / "gold.txt", FIXTURES / "gold_pretty.txt", FIXTURES / "test.txt"
PRESETS = {"collins": COLLINS, "nk": NK}

# EVALB's summary lines, in the order it prints them, and the figure of ours each one shows
SUMMARY_FIGURES = {
    "Number of sentence": "sentences",
    "Number of Error sentence": "error_sentences",
    "Number of Skip  sentence": "skip_sentences",
    "Number of Valid sentence": "valid_sentences",
    "Bracketing Recall": "recall",
    "Bracketing Precision": "precision",
    "Bracketing FMeasure": "f_measure",
    "Complete match": "complete_match",
    "Average crossing": "average_crossing",
    "No crossing": "no_crossing",
    "2 or less crossing": "two_or_less_crossing",
    "Tagging accuracy": "tagging_accuracy",
}


def expected(name: str) -> str:
    return (FIXTURES / f"{name}.expected").read_text()


def reference_summaries(text: str) -> dict[str, dict[str, float]]:
    """{'All': {'Bracketing Recall': 60.44, ...}, 'len<=40': {...}} from EVALB's output."""
    summary = text[text.index("=== Summary ===") :]
    blocks = {}
    for title, body in re.findall(r"-- (.+?) --\n(.*?)(?=\n-- |\Z)", summary, re.S):
        blocks[title] = {key.strip(): float(value) for key, value in re.findall(r"^(.+?)=\s*(\S+)$", body, re.M)}
    return blocks


@pytest.mark.parametrize("name", ["collins", "nk"])
def test_every_summary_figure_equals_evalbs(name):
    result = score_files(GOLD, TEST, PRESETS[name])
    reference = reference_summaries(expected(name))
    assert set(reference) == {"All", "len<=40"}
    for title, summary in (("All", result.all), ("len<=40", result.cutoff)):
        assert list(reference[title]) == list(SUMMARY_FIGURES)
        for line, attribute in SUMMARY_FIGURES.items():
            assert getattr(summary, attribute) == pytest.approx(reference[title][line], abs=0.005 + 1e-9), (
                title,
                line,
            )
    # the fixture exercises what it claims: errors, skips, and a sentence over 40 words
    assert result.all.error_sentences and result.all.skip_sentences
    assert result.all.sentences == result.cutoff.sentences + 1
    assert result.f1 == result.all.f_measure


@pytest.mark.parametrize("name", ["collins", "nk"])
@pytest.mark.parametrize("gold", [GOLD, GOLD_PRETTY], ids=["one-a-line", "pretty-printed"])
def test_the_table_and_summary_equal_evalbs_byte_for_byte(name, gold):
    result = score_files(gold, TEST, PRESETS[name])
    table, summary = format_per_sentence(result), format_summary(result)
    assert table + summary == expected(name)
    assert summary.startswith("=== Summary ===\n")
    assert table.splitlines()[1] == " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy"


def test_the_rules_that_decide_the_fixture_rows():
    collins, nk = score_files(GOLD, TEST, COLLINS).rows, score_files(GOLD, TEST, NK).rows
    # deletion follows each tree's own tags: the test's (NN .) is a word the gold lacks, so an error sentence
    assert (collins[4].status, collins[4].message) == (1, "Length unmatch (2|3)")
    assert (collins[5].status, collins[5].message) == (1, "Words unmatch (ran|run)")
    assert collins[6].status == 2 and collins[6].length == 3  # the empty test line; punctuation counts for length
    assert collins[19].status == 2  # a test tree of punctuation only is a skip too
    # nk puts back the possessive ' that the test tagged '' (a tagging error, not an error sentence)
    assert collins[8].status == 1 and (nk[8].status, nk[8].words, nk[8].correct_tags) == (0, 5, 4)
    # ? and ! attached inside a phrase: brackets differ under COLLINS.prm, not once nk drops them
    assert [collins[9].matched, collins[10].matched] == [2, 2] and [nk[9].matched, nk[10].matched] == [3, 3]
    assert (collins[16].gold_brackets, nk[16].gold_brackets) == (4, 3)  # S1 counts unless deleted
    assert collins[11].matched == collins[11].gold_brackets == 4  # PRT = ADVP
    assert collins[12].matched == collins[12].gold_brackets == 6  # trace's NP dropped, NP-SBJ-1 is NP, TOP dropped
    assert collins[15].gold_brackets == 4  # `( (S ...) )`: the unlabelled top bracket counts
    assert (collins[14].gold_brackets, collins[14].test_brackets, collins[14].matched) == (4, 4, 3)  # unary chains
    assert collins[3].crossing == 3 and collins[13].length == 47


def test_f_measure_of_nothing_matched_prints_as_evalb_does():
    # EVALB's 2*p*r/(p+r) is 0/0 here and glibc prints "  -nan"; the figure itself reads 0
    result = score_trees([parse_tree("(TOP (S (NN a)))")], [parse_tree("(TOP (X (NN a)))")])
    assert "Bracketing FMeasure       =   -nan\n" in format_summary(result)
    assert result.f1 == 0.0 and result.as_dict()["evalb_f1_len40"] == 0.0
    assert format_per_sentence(result).endswith(
        "   1    1    0    0.00   0.00     0      1    1      0      1     1   100.00\n"
        + "=" * 76
        + "\n                  0.00   0.00      0     1     1      0      1     1   100.00\n"
    )


def test_evalb_gives_up_after_max_error_plus_one_error_sentences():
    # `evalb -e 1` on four length mismatches prints two rows and exits 1 at the third, with no summary
    gold = [parse_tree("(TOP (S (NN a) (NN b)))")] * 4
    test = [parse_tree("(TOP (S (NN a)))")] * 4
    with pytest.raises(EvalbAborted, match=r"sentence 3: Length unmatch \(2\|1\).*MAX_ERROR 1"):
        score_trees(gold, test, dataclasses.replace(COLLINS, max_errors=1))
    assert score_trees(gold[:3], test[:3], dataclasses.replace(COLLINS, max_errors=2)).all.error_sentences == 3
    assert score_trees(gold, test, dataclasses.replace(COLLINS, max_errors=None)).all.error_sentences == 4


def test_as_dict_names_every_figure_for_both_summaries():
    figures = score_files(GOLD, TEST).as_dict()
    assert figures["evalb_f1"] == pytest.approx(69.62, abs=0.005)
    assert figures["evalb_f1_len40"] == pytest.approx(79.67, abs=0.005)
    for key in ("recall", "precision", "complete_match", "tagging_accuracy", "error_sentences", "skip_sentences"):
        assert f"evalb_{key}" in figures and f"evalb_{key}_len40" in figures


def test_files_with_different_numbers_of_trees_name_both_counts(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("\n".join(TEST.read_text().splitlines()[:-2]) + "\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(GOLD))} holds 20 trees but .*short.txt holds 18"):
        score_files(GOLD, short)
    with pytest.raises(ValueError, match="2 gold trees but 1 test trees"):
        score_trees([None, None], [None])


def test_a_malformed_tree_names_file_tree_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("(TOP (S (NN a)))\n\n(TOP (S (NN a) b))\n")
    with pytest.raises(ValueError, match=r"bad.txt: tree 3 \(line 3\): the word 'b' has no tag"):
        read_tree_file(bad)
    pretty = tmp_path / "pretty.txt"
    pretty.write_text("(TOP\n  (S (NN a)))\n\n(TOP\n  (S (NN a))\n")  # blank lines separate: tree 2, line 4
    with pytest.raises(ValueError, match=r"pretty.txt: tree 2 \(line 4\): unbalanced"):
        read_tree_file(pretty)


def test_parameters_by_name():
    assert parameters("collins") is COLLINS and parameters("NK") is NK
    assert NK.max_errors == 10000 and {"S1", "?", "!"} <= set(NK.delete_labels) - set(COLLINS.delete_labels)
    with pytest.raises(ValueError, match="collins, nk"):
        parameters("new")


def test_the_command_prints_the_summary_and_on_request_the_table(capsys):
    assert evalb_command([str(GOLD), str(TEST)]) == 0
    out = capsys.readouterr().out
    assert out == expected("collins")[expected("collins").index("=== Summary ===") :]
    assert evalb_command([str(GOLD_PRETTY), str(TEST), "--params", "nk", "--per_sentence"]) == 0
    assert capsys.readouterr().out == expected("nk")
    with pytest.raises(SystemExit) as exit_:
        evalb_command([str(GOLD), str(TEST), "--params", "new"])
    assert exit_.value.code == 2
    with pytest.raises(OSError):
        evalb_command([str(GOLD), str(FIXTURES / "missing.txt")])


def test_the_evaluate_module_loads_offline_and_gives_evalbs_figures(monkeypatch):
    evaluate = pytest.importorskip("evaluate")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = Path(__file__).parents[1] / "vaswani_hf" / "parsing" / "metric_modules" / "evalb"
    metric = evaluate.load(str(folder))
    gold, test = GOLD.read_text().splitlines(), TEST.read_text().splitlines()
    assert test[6] == ""  # the empty prediction goes in as ''
    figures = metric.compute(predictions=test, references=gold)
    assert figures == score_files(GOLD, TEST).as_dict()
    assert f"{figures['evalb_f1']:6.2f}" == " 69.62"
    assert metric.compute(predictions=test, references=gold, params="nk")["evalb_f1"] == pytest.approx(73.17, abs=0.005)


# A parser's output file for a failed sentence holds `()`, `(())`, `(TOP)` or an empty line: EVALB reads each as a
# tree of no words, a skip sentence. `( )` (a space inside) it reads as one empty word (an error sentence here:
# Length unmatch (2|1)), `(TOP )` as an empty word tagged TOP, which the parameters delete (a skip), and `(NP)` inside a
# tree as a bracket over no word (dropped). The reference is the real EVALB's output on these files (evalb.c of
# nikitakit/self-attentive-parser's EVALB, built with cc, run with COLLINS.prm; nk.prm prints the same).
FAILED_GOLD = """\
(TOP (S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .)))
(TOP (S (NP (PRP He)) (VP (VBD saw) (NP (DT a) (NN cat))) (. .)))
(TOP (S (NP (NNS Cats)) (VP (VBP sleep))))
(TOP (S (NP (DT A) (NN bird)) (VP (VBD sang) (PP (IN in) (NP (DT the) (NN tree)))) (. .)))
(TOP (S (NP (PRP It)) (VP (VBD rained))))
(TOP (S (NP (PRP We)) (VP (VBD left) (ADVP (RB early)))))
(TOP (S (NP (PRP They)) (VP (VBD won))))
(TOP (S (NP (NNP Ann)) (VP (VBD ran) (ADVP (RB home))) (. .)))
(TOP (S (NP (PRP She)) (VP (VBD smiled))))
"""
FAILED_TEST = """\
(TOP (S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .)))
()
(())

(TOP)
(TOP (S (NP) (NP (PRP We)) (VP (VBD left) (ADVP (RB early)))))
( )
(TOP (S (NP (NNP Ann)) (VP (VBD ran)) (ADVP (RB home)) (. .)))
(TOP )
"""
FAILED_REFERENCE = """\
  Sent.                        Matched  Bracket   Cross        Correct Tag
 ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy
============================================================================
   1    4    0  100.00 100.00     3      3    3      0      3     3   100.00
   2    5    2    0.00   0.00     0      0    0      0      0     0     0.00
   3    2    2    0.00   0.00     0      0    0      0      0     0     0.00
   4    7    2    0.00   0.00     0      0    0      0      0     0     0.00
   5    2    2    0.00   0.00     0      0    0      0      0     0     0.00
   6    3    0  100.00 100.00     4      4    4      0      3     3   100.00
   7    2    1    0.00   0.00     0      0    0      0      0     0     0.00
   8    4    0   75.00  75.00     3      4    4      0      3     3   100.00
   9    2    2    0.00   0.00     0      0    0      0      0     0     0.00
============================================================================
                 90.91  90.91     10    11    11      0      9     9   100.00
=== Summary ===

-- All --
Number of sentence        =      9
Number of Error sentence  =      1
Number of Skip  sentence  =      5
Number of Valid sentence  =      3
Bracketing Recall         =  90.91
Bracketing Precision      =  90.91
Bracketing FMeasure       =  90.91
Complete match            =  66.67
Average crossing          =   0.00
No crossing               = 100.00
2 or less crossing        = 100.00
Tagging accuracy          = 100.00

-- len<=40 --
Number of sentence        =      9
Number of Error sentence  =      1
Number of Skip  sentence  =      5
Number of Valid sentence  =      3
Bracketing Recall         =  90.91
Bracketing Precision      =  90.91
Bracketing FMeasure       =  90.91
Complete match            =  66.67
Average crossing          =   0.00
No crossing               = 100.00
2 or less crossing        = 100.00
Tagging accuracy          = 100.00
"""


def test_failed_parses_written_as_empty_brackets_are_skip_sentences_as_in_evalb(tmp_path, capsys):
    (tmp_path / "gold.txt").write_text(FAILED_GOLD)
    (tmp_path / "test.txt").write_text(FAILED_TEST)
    for params in (COLLINS, NK):
        result = score_files(tmp_path / "gold.txt", tmp_path / "test.txt", params)
        assert format_per_sentence(result) + format_summary(result) == FAILED_REFERENCE
        assert (result.all.sentences, result.all.error_sentences, result.all.skip_sentences) == (9, 1, 5)
        assert result.rows[6].message == "Length unmatch (2|1)"
    trees = read_tree_file(tmp_path / "test.txt")
    assert trees[1] is None and trees[2] is None and trees[3] is None and trees[4] is None
    assert evalb_command([str(tmp_path / "gold.txt"), str(tmp_path / "test.txt")]) == 0
    assert capsys.readouterr().out == FAILED_REFERENCE[FAILED_REFERENCE.index("=== Summary ===") :]
    # a malformed tree is still an error naming it, not a skip
    (tmp_path / "bad.txt").write_text("(TOP (S (NN a) b))\n")
    with pytest.raises(ValueError, match=r"bad.txt: tree 1 \(line 1\): the word 'b' has no tag"):
        read_tree_file(tmp_path / "bad.txt")


def test_the_evaluate_module_reads_failed_parses_as_evalb_does(tmp_path, monkeypatch):
    """`()` and the other empty brackets a parser writes for a failed sentence are skip sentences in the 🤗 Evaluate
    module too (it read predictions with parse_tree, which refused them): its figures are `vaswani evalb`'s on the
    same files, the real EVALB's."""
    evaluate = pytest.importorskip("evaluate")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = Path(__file__).parents[1] / "vaswani_hf" / "parsing" / "metric_modules" / "evalb"
    metric = evaluate.load(str(folder))
    (tmp_path / "gold.txt").write_text(FAILED_GOLD)
    (tmp_path / "test.txt").write_text(FAILED_TEST)
    figures = metric.compute(predictions=FAILED_TEST.splitlines(), references=FAILED_GOLD.splitlines())
    assert figures == score_files(tmp_path / "gold.txt", tmp_path / "test.txt").as_dict()
    assert (figures["evalb_error_sentences"], figures["evalb_skip_sentences"]) == (1, 5)
    assert f"{figures['evalb_f1']:.2f}" == "90.91"
    with pytest.raises(ValueError, match=r"prediction 1: .*the word 'b' has no tag"):  # still an error, named
        metric.compute(predictions=["(TOP (S (NN a) b))"], references=[FAILED_GOLD.splitlines()[0]])
