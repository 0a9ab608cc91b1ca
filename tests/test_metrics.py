"""Metrics through 🤗 Evaluate, offline: the packaged BLEU and chrF equal sacreBLEU's, any metric a user names is
reported, a bad one stops before any training or decoding, and `compute_metrics` serves plain Seq2SeqTrainer."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import sacrebleu
from transformers import AutoTokenizer, EvalPrediction

from vaswani_hf.cli import main
from vaswani_hf.translation.metrics import compute_metrics, load_metric, load_metrics, score_with

from .helpers import TINY_RUN, vaswani

HYPOTHESES = ["The cat sat on the mat .", "dreihunderteinundzwanzig", "", "A man rides a red bike ."]
REFERENCES = ["The cat sat on a mat .", "dreihundertzweiundzwanzig", "sieben", "A man is riding a bike ."]

LENGTH_RATIO = """
import datasets
import evaluate


class LengthRatio(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="words of the hypotheses over words of the references", citation="", inputs_description="",
            features=datasets.Features({"predictions": datasets.Value("string"),
                                        "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        words = sum(len(p.split()) for p in predictions)
        return {"length_ratio": words / max(1, sum(len(r.split()) for r in references)), "words": words,
                "per_sentence": [len(p.split()) for p in predictions]}
"""
BROKEN = LENGTH_RATIO.replace("words = sum(", "raise KeyError('no such column')\n        words = sum(")


@pytest.fixture
def modules(tmp_path):
    """A local metric module as a folder (length_ratio/length_ratio.py) and a broken one as a .py file."""
    folder = tmp_path / "length_ratio"
    folder.mkdir()
    (folder / "length_ratio.py").write_text(textwrap.dedent(LENGTH_RATIO))
    (tmp_path / "broken_metric.py").write_text(textwrap.dedent(BROKEN).replace("LengthRatio", "BrokenMetric"))
    return folder, tmp_path / "broken_metric.py"


def test_the_packaged_bleu_and_chrf_equal_sacrebleu_with_their_signatures():
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    for references in (REFERENCES, [[r, r.lower()] for r in REFERENCES]):  # one, and two references each
        streams = [list(s) for s in zip(*references, strict=True)] if isinstance(references[0], list) else [references]
        expected_bleu, expected_chrf = bleu.corpus_score(HYPOTHESES, streams), chrf.corpus_score(HYPOTHESES, streams)
        ours_bleu = load_metric("bleu").compute(predictions=HYPOTHESES, references=references)
        ours_chrf = load_metric("chrf").compute(predictions=HYPOTHESES, references=references)
        assert ours_bleu["bleu"] == expected_bleu.score and ours_bleu["brevity_penalty"] == expected_bleu.bp
        assert ours_bleu["bleu_signature"] == str(bleu.get_signature())
        assert ours_chrf["chrf"] == expected_chrf.score and ours_chrf["chrf_signature"] == str(chrf.get_signature())
    assert str(bleu.get_signature()).startswith("nrefs:2")  # the signature says how many references were read


def test_a_local_module_is_reported_under_its_name_with_scalars_only(modules):
    folder, _ = modules
    for spec in (str(folder), str(folder / "length_ratio.py")):
        results = score_with(load_metrics([spec]), HYPOTHESES, REFERENCES)
        words = sum(len(h.split()) for h in HYPOTHESES)
        assert results["length_ratio"] == pytest.approx(words / sum(len(r.split()) for r in REFERENCES))
        assert results["length_ratio_words"] == words and "length_ratio_per_sentence" not in results
        assert {"bleu", "chrf", "bleu_signature", "brevity_penalty"} <= results.keys()


def test_bad_metrics_give_clear_errors(modules, tmp_path):
    _, broken = modules
    with pytest.raises(ValueError, match=r"--metric sacrebleu: not a packaged metric \(bleu, chrf, tokenized_bleu\) "
                                         r"nor a local path.*"
                                         r"Pass the path of a local metric module instead: a folder holding "
                                         r"sacrebleu.py"):  # fmt: skip
        load_metric("sacrebleu")  # a Hub name: the tests run offline
    with pytest.raises(ValueError, match=rf"--metric {broken}: the metric module fails on a toy pair of sentences "
                                         r"\(KeyError"):  # fmt: skip
        load_metric(str(broken))
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        load_metric(str(tmp_path / "missing.py"))


def test_evaluate_reports_every_metric_asked_for(translator, modules):
    folder, _ = modules
    result = vaswani("evaluate", str(translator), "--metric", str(folder), "--metric", "chrf", "--num-beams", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert {"bleu", "chrf", "length_ratio", "length_ratio_words"} <= summary.keys()


@pytest.mark.parametrize("spec", ["sacrebleu", "broken"])
@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_a_bad_metric_stops_before_any_training_or_decoding(command, spec, modules, translator, tmp_path, capsys):
    spec = str(modules[1]) if spec == "broken" else spec
    out = tmp_path / "run"
    argv = ["train", *TINY_RUN, "--output_dir", str(out)] if command == "train" else ["evaluate", str(translator)]
    assert main([*argv, "--metric", "chrf", "--metric", spec]) == 2
    captured = capsys.readouterr()
    assert f"error: --metric {spec}" in captured.err and "translating" not in captured.err
    assert not out.exists() and captured.out == ""


def test_train_reports_every_metric_asked_for(modules, tmp_path):
    folder, _ = modules
    out = tmp_path / "run"
    result = vaswani("train", *TINY_RUN, "--output_dir", str(out), "--metric", str(folder), "--metric=chrf")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(next(line for line in result.stdout.splitlines() if line.startswith('{"steps"')))
    assert {"bleu", "chrf", "bleu_signature", "brevity_penalty", "length_ratio"} <= summary.keys()


def test_compute_metrics_reads_generated_ids_and_padded_labels(translator):
    tokenizer = AutoTokenizer.from_pretrained(translator)
    references = ["drei", "einundzwanzig , sieben"]
    hypotheses = ["drei", "einundzwanzig"]
    labels = tokenizer(text_target=references, padding=True, return_tensors="np")["input_ids"]
    labels = np.where(labels == tokenizer.pad_token_id, -100, labels)  # how DataCollatorForSeq2Seq pads labels
    generated = tokenizer(hypotheses, padding=True, return_tensors="np")["input_ids"]
    generated = np.concatenate([np.full((2, 1), tokenizer.pad_token_id), generated], axis=1)  # the start token
    results = compute_metrics(tokenizer, ["bleu", "chrf"])(EvalPrediction(predictions=(generated,), label_ids=labels))
    expected = sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references])
    assert results["bleu"] == round(expected.score, 2)
    assert results["chrf"] == round(sacrebleu.metrics.CHRF().corpus_score(hypotheses, [references]).score, 2)
