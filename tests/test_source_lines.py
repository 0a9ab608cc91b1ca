"""`vaswani translate` never invents or drops text without saying so: empty lines stay empty and never reach the
model, lines longer than the model reads are cut with a warning, split and rejoined, or stop the run, and a folder
that is not a whole model gets one error naming the missing piece, in every command that loads one. `vaswani
score` never scores a cut sentence: it names every pair too long, or skips each with a flag, in translate's words."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from vaswani_hf.cli import main
from vaswani_hf.translation.inference import load_for_inference, translate_nbest
from vaswani_hf.translation.source_lines import LineReport, pieces_of, rejoined

from .helpers import broken_copy, vaswani


@pytest.fixture(scope="module")
def loaded(translator):
    return load_for_inference(translator)


@pytest.fixture(scope="module")
def short_model(translator, tmp_path_factory) -> Path:
    """The translator with a tokenizer that reads at most 12 tokens, so that "long" lines are short to decode."""
    folder = tmp_path_factory.mktemp("short") / "model"
    shutil.copytree(translator, folder)
    settings = folder / "tokenizer_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "model_max_length": 12}))
    return folder


def test_empty_and_blank_lines_give_empty_lines_and_never_reach_the_model(loaded, monkeypatch):
    model, tokenizer = loaded
    seen = []
    generate = model.generate

    def spy(**kwargs):
        seen.extend(tokenizer.batch_decode(kwargs["input_ids"], skip_special_tokens=True))
        return generate(**kwargs)

    monkeypatch.setattr(model, "generate", spy)
    report = LineReport()
    lines = ["three", "", "  ", "\t", "twenty-one"]
    for nbest, alignments in ((1, False), (3, False), (1, True)):
        seen.clear()
        out = translate_nbest(model, tokenizer, lines, nbest=nbest, alignments=alignments, progress=False,
                              report=report)  # fmt: skip
        assert sorted(text.strip() for text in seen) == ["three", "twenty-one"]
        alone = translate_nbest(model, tokenizer, ["three", "twenty-one"], nbest=nbest, alignments=alignments,
                                progress=False)  # fmt: skip
        assert _texts([out[0], out[4]]) == _texts(alone)  # scores too, up to the fast products' rounding
        assert [c[1] for c in out[0] + out[4]] == pytest.approx([c[1] for c in alone[0] + alone[1]], abs=1e-4)
        empty = ("", None, "") if alignments else ("", None)
        assert out[1] == out[2] == out[3] == [empty]
    assert report.empty == 9 and report.lines == 15


def _texts(results: list[list[tuple]]) -> list[list[tuple]]:
    return [[(c[0], *c[2:]) for c in candidates] for candidates in results]


def test_translate_prints_an_empty_line_for_a_blank_one_in_every_output_form(translator):
    for extra in ([], ["--nbest", "2"], ["--alignments"], ["--models", str(translator), str(translator)]):
        model = [] if "--models" in extra else [str(translator)]
        result = vaswani("translate", *model, *extra, "--num-beams", "2", stdin="three\n\n  \ntwo\n")
        assert result.returncode == 0, result.stderr[-2000:]
        lines = result.stdout.split("\n")[:-1]
        if "--nbest" in extra:  # two candidates for each real line, one empty entry for each blank one
            assert [line.split(" ||| ")[0] for line in lines] == ["0", "0", "1", "2", "3", "3"]
            assert lines[2] == "1 |||  |||" and lines[3] == "2 |||  |||"  # index, empty text, no score
        else:
            empty = " |||" if "--alignments" in extra else ""  # the fields stay, empty, for tools that split them
            assert len(lines) == 4 and lines[1] == lines[2] == empty and lines[0] and lines[3]
        assert "2 empty (left empty)" in result.stderr


def test_evaluate_keeps_each_hypothesis_beside_its_reference(translator, tmp_path):
    (tmp_path / "test.en").write_text("three\n \nfive\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("drei\nzwei\nfünf\n", encoding="utf-8")
    hypotheses = tmp_path / "hyp.de"
    result = vaswani("evaluate", str(translator), "--data", str(tmp_path), "--hypotheses", str(hypotheses))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = hypotheses.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    assert json.loads(result.stdout)["empty_sources"] == 1


def test_a_line_longer_than_the_model_reads_is_cut_with_a_warning_by_default(short_model):
    long = " ".join(["three hundred twenty-one ."] * 6)
    result = vaswani("translate", str(short_model), "--num-beams", "1", stdin=f"five\n{long}\n")
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.split("\n")[:-1]) == 2
    assert re.search(
        r"line 2 has \d+ tokens, more than the 12 the model reads: only its first 12 are translated", result.stderr
    )
    assert "1 cut to the model's length" in result.stderr


def test_the_issue_s_row_a_line_of_three_thousand_words_is_named_with_its_count(translator):
    words = " ".join(["twenty-one"] * 3000)
    result = vaswani("translate", str(translator), "--long-lines", "error", stdin=f"three\n{words}\n")
    assert result.returncode == 2
    assert "error: line 2 has " in result.stderr and "more than the 1024 the model reads" in result.stderr
    assert result.stdout == ""  # the window holding it writes nothing


def test_split_translates_every_sentence_and_rejoins_them(short_model):
    from transformers import AutoTokenizer

    line = "three hundred twenty-one . seven . five hundred ."
    pieces = pieces_of([line], AutoTokenizer.from_pretrained(short_model), 12, "split")[0]
    assert len(pieces) >= 2
    result = vaswani("translate", str(short_model), "--num-beams", "1", "--long-lines", "split", stdin=line + "\n")
    assert result.returncode == 0, result.stderr[-2000:]
    alone = vaswani("translate", str(short_model), "--num-beams", "1", stdin="\n".join(pieces) + "\n")
    assert result.stdout.strip() == " ".join(text for text in alone.stdout.split("\n")[:-1] if text)
    assert f"split into {len(pieces)} pieces at sentence ends" in result.stderr
    assert "1 split at sentence ends" in result.stderr


def test_pieces_and_rejoining(loaded):
    _, tokenizer = loaded
    report = LineReport()
    long = "three hundred . seven . five ."
    limit = len(tokenizer("three hundred .")["input_ids"])
    pieces = pieces_of(["", long, "five"], tokenizer, limit, "split", first_line=10, report=report)
    assert pieces[0] == [] and pieces[2] == ["five"] and len(pieces[1]) >= 2
    assert " ".join(pieces[1]) == long  # every sentence, in order
    assert all(len(tokenizer(piece)["input_ids"]) <= limit for piece in pieces[1])
    assert (report.empty, report.split) == (1, [11])
    with pytest.raises(ValueError, match=r"line 11 has \d+ tokens, more than the \d+ the model reads"):
        pieces_of(["", long], tokenizer, limit, "error", first_line=10)
    with pytest.raises(ValueError, match="choose one of cut, split, error"):
        pieces_of([long], tokenizer, limit, "drop")
    joined = rejoined(["a b", "c"], [[("x y", -1.0, "0-0 1-1"), ("x", -2.0, "0-0")], [("z", -0.5, "0-0")]], 2, True)
    assert joined == [("x y z", -1.5, "0-0 1-1 2-2"), ("x z", -2.5, "0-0 2-1")]


def test_constraints_on_a_line_that_must_be_split_are_refused(short_model, loaded):
    model, tokenizer = load_for_inference(short_model)
    long = "three hundred twenty-one . seven . five hundred ."
    with pytest.raises(ValueError, match="line 2 is split at sentence ends .* and has constraints"):
        translate_nbest(model, tokenizer, ["five", long], constraints=[[], ["sieben"]], long_lines="split",
                        num_beams=2, progress=False)  # fmt: skip


# --- a folder that is not a whole model ---------------------------------------------------------------------------


FOLDERS = {
    "no tokenizer": r"has no tokenizer \(tokenizer.json missing\): save the tokenizer",
    "no weights": r"has config.json but no model.safetensors",
    "no config": r"is not a model directory \(no config.json\)",
    "another model type": r"holds a 'bert' model, not a 'vaswani' one",
    "config not JSON": r"config.json is not valid JSON",
    "truncated weights": r"cannot read model.safetensors .* truncated or corrupt",
}
COMMANDS = {
    "translate": ["translate", "{}"],
    "evaluate": ["evaluate", "{}"],
    "score": ["score", "{}", "--source", "{src}", "--target", "{src}"],
    "average": ["average", "{run}", "--last", "1", "--output", "{out}"],
    "export": ["export", "{}", "{out}"],
    "push": ["push", "{}", "someone/model"],
    "attention": ["attention", "{}", "three", "--output", "{out}"],
}


@pytest.mark.parametrize("how", FOLDERS)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_names_the_missing_piece(command, how, translator, tmp_path, capsys):
    if command == "average" and how == "truncated weights":
        pytest.skip("averaging reads the weights itself: tests/test_bad_inputs.py covers its message")
    run = tmp_path / "run"
    folder = broken_copy(translator, run / "checkpoint-10" if command == "average" else tmp_path / "model", how)
    (tmp_path / "src.txt").write_text("three\n", encoding="utf-8")
    argv = [part.format(folder, run=run, out=tmp_path / "out", src=tmp_path / "src.txt") for part in COMMANDS[command]]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # after "precision: ..." where the command says it
    assert error.startswith("error: ") and re.search(FOLDERS[how], error), error[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["no tokenizer", "no config", "another model type"])
def test_the_onnx_engine_names_the_missing_piece(how, translator, tmp_path, capsys):
    folder = broken_copy(translator, tmp_path / "onnx", how)
    assert main(["translate", str(folder), "--engine", "onnxruntime"]) == 2
    assert re.search(FOLDERS[how], capsys.readouterr().err)


def test_the_onnx_engine_names_a_missing_graph(translator, tmp_path, capsys):
    assert main(["translate", str(translator), "--engine", "onnxruntime"]) == 2
    assert "lacks encoder_model.onnx" in capsys.readouterr().err


def test_a_folder_that_does_not_exist(tmp_path, capsys):
    for argv in (["translate", str(tmp_path / "nowhere")], ["average", str(tmp_path / "nowhere")]):
        assert main(argv) == 2
        assert "no such folder" in capsys.readouterr().err
    assert main(["average", str(tmp_path)]) == 2
    assert "holds no complete checkpoint-N folder" in capsys.readouterr().err


# --- vaswani score: scores of what was written --------------------------------------------------------------------


def _score_files(tmp_path: Path) -> tuple[Path, Path]:
    long = " ".join(["twenty-one"] * 20)  # more than the short model's 12 tokens
    (tmp_path / "src").write_text(f"three\n{long}\nseven\nfive\n", encoding="utf-8")
    (tmp_path / "tgt").write_text(f"drei\nzwei\nsieben\n{long}\n", encoding="utf-8")
    return tmp_path / "src", tmp_path / "tgt"


def test_score_refuses_and_names_every_pair_longer_than_the_model_reads(short_model, tmp_path, capsys):
    source, target = _score_files(tmp_path)
    assert main(["score", str(short_model), "--source", str(source), "--target", str(target)]) == 2
    out, err = capsys.readouterr()
    error = err.strip().splitlines()[-1]
    assert out == "" and "Traceback" not in err
    assert re.search(r"^error: 2 of 4 pairs are longer than the model reads, .*\(line 2: the source has \d+ tokens, "
                     r"more than the 12 the model reads; line 4: the target has \d+ tokens, more than the 12 the model "
                     r"reads\): .*--long-lines skip", error), error  # fmt: skip


def test_score_skips_them_with_a_flag_and_scores_the_others_as_alone(short_model, tmp_path, capsys, caplog):
    source, target = _score_files(tmp_path)
    argv = ["score", str(short_model), "--source", str(source), "--target", str(target), "--long-lines", "skip"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 4 and set(rows[1]) == set(rows[3]) == {"skipped"}  # one output line per input line
    assert rows[1]["skipped"].startswith("the source has") and rows[3]["skipped"].startswith("the target has")
    assert re.search(r"line 2: the source has \d+ tokens, more than the 12 the model reads: skipped", caplog.text)
    (tmp_path / "s").write_text("three\nseven\n", encoding="utf-8")
    (tmp_path / "t").write_text("drei\nsieben\n", encoding="utf-8")
    assert main(["score", str(short_model), "--source", str(tmp_path / "s"), "--target", str(tmp_path / "t")]) == 0
    alone = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [rows[0]["tokens"], rows[2]["tokens"]] == [row["tokens"] for row in alone]
    assert [rows[0]["log_prob"], rows[2]["log_prob"]] == pytest.approx([row["log_prob"] for row in alone], abs=1e-4)


def test_translate_and_score_say_the_same_of_a_long_line(short_model, tmp_path, caplog):
    source, target = _score_files(tmp_path)
    assert main(["translate", str(short_model), "--input", str(source), "--num-beams", "1"]) == 0
    translated = caplog.text
    caplog.clear()
    assert main(["score", str(short_model), "--source", str(source), "--target", str(target), "--long-lines",
                 "skip"]) == 0  # fmt: skip
    scored = caplog.text
    said = re.search(r"has \d+ tokens, more than the 12 the model reads", translated).group()
    assert f"line 2 {said}" in translated and f"line 2: the source {said}" in scored


def test_score_of_two_empty_files_prints_nothing(short_model, tmp_path, capsys):
    for name in ("src", "tgt"):
        (tmp_path / name).write_bytes(b"")
    assert main(["score", str(short_model), "--source", str(tmp_path / "src"), "--target", str(tmp_path / "tgt")]) == 0
    assert capsys.readouterr().out == ""
