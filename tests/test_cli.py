"""The `vaswani` command end to end on tiny settings, and its error messages."""

import json

import pytest

from vaswani_hf.recipe import noam_learning_rate
from vaswani_hf.tasks import english, german

from .helpers import TINY_RUN, vaswani


def test_number_words_need_reordering():
    assert (english(21), german(21)) == ("twenty-one", "einundzwanzig")
    assert (english(101), german(101)) == ("one hundred one", "einhunderteins")
    assert (english(310), german(310)) == ("three hundred ten", "dreihundertzehn")


def test_noam_schedule_values():
    d_model, warmup = 512, 4000
    assert noam_learning_rate(1, d_model, warmup) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_learning_rate(warmup, d_model, warmup) == pytest.approx(512**-0.5 * 4000**-0.5)  # peak, 6.99e-4
    assert noam_learning_rate(4 * warmup, d_model, warmup) == pytest.approx(512**-0.5 * 16000**-0.5)


def test_train_builtin_task_summary(trained):
    out, stdout = trained
    summary = json.loads([line for line in stdout.splitlines() if line.startswith('{"')][-1])
    assert summary["steps"] == 4 and summary["model_dir"] == str(out)
    assert summary["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }


def test_translate_from_stdin_keeps_line_count_and_order(trained):
    out, _ = trained
    result = vaswani("translate", str(out), "--num-beams", "1", stdin="seven\ntwenty-one , five\nninety\n")
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.splitlines()) == 3


def test_train_on_a_data_folder_and_evaluate(tmp_path, trained):
    data = tmp_path / "data"
    data.mkdir()
    for split, numbers in (("train", range(1, 200)), ("val", range(200, 220))):
        (data / f"{split}.en").write_text("\n".join(english(n) for n in numbers) + "\n", encoding="utf-8")
        (data / f"{split}.de").write_text("\n".join(german(n) for n in numbers) + "\n", encoding="utf-8")
    result = vaswani("train", "--data", str(data), *TINY_RUN, "--output_dir", str(tmp_path / "m"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BLEU" in result.stdout
    result = vaswani("evaluate", str(trained[0]), "--data", str(data), "--split", "val", "--batch-size", "64")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["sentences"] == 20


def test_mismatched_line_counts_are_a_clear_error(tmp_path):
    (tmp_path / "train.en").write_text("a\nb\nc\n")
    (tmp_path / "train.de").write_text("x\ny\n")
    (tmp_path / "val.en").write_text("a\n")
    (tmp_path / "val.de").write_text("x\n")
    result = vaswani("train", "--data", str(tmp_path), *TINY_RUN, "--output_dir", str(tmp_path / "m"))
    assert result.returncode == 2
    assert "train.en has 3 lines but" in result.stderr and "train.de has 2" in result.stderr
    assert "Traceback" not in result.stderr


def test_non_utf8_input_names_file_and_line(tmp_path):
    (tmp_path / "train.en").write_bytes(b"ok\nbad \xff byte\n")
    (tmp_path / "train.de").write_text("x\ny\n")
    result = vaswani("train", "--data", str(tmp_path), *TINY_RUN)
    assert result.returncode == 2 and "train.en: line 2 is not valid UTF-8" in result.stderr


def test_missing_model_directory_is_a_clear_error(tmp_path):
    result = vaswani("translate", str(tmp_path / "nope"), stdin="seven\n")
    assert result.returncode == 2 and "is not a model directory" in result.stderr
