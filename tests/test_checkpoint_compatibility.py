"""Checkpoints saved before the package changed shape load and compute the same today: through the installed package,
and as remote code where the package is absent. Each fixture is a tiny random model saved by `save_pretrained`, with
the remote-code files of that day, its inputs and its outputs: before the package was arranged in folders
(checkpoint_before_folders.zip), and before the searches became one decoding core, when the CPU fast products and
the CUDA graphs still shipped as remote code (checkpoint_before_one_core.zip, with n-best and constrained outputs)."""

import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

import vaswani_hf

from .helpers import remote_code_outputs

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(params=["checkpoint_before_folders.zip", "checkpoint_before_one_core.zip"])
def saved_before(tmp_path, request) -> Path:
    with zipfile.ZipFile(FIXTURES / request.param) as archive:
        archive.extractall(tmp_path)
    return tmp_path


def same_nbest(outputs: dict, expected: dict) -> None:
    for name in ("nbest", "constrained"):
        if name in expected:
            assert torch.equal(outputs[name], expected[name]), name
            torch.testing.assert_close(outputs[name + "_scores"], expected[name + "_scores"])


def test_a_checkpoint_saved_before_loads_and_translates_the_same_with_the_package(saved_before):
    model = AutoModelForSeq2SeqLM.from_pretrained(saved_before).eval()
    assert isinstance(model, vaswani_hf.VaswaniForConditionalGeneration)
    inputs = torch.load(saved_before / "inputs.pt", weights_only=True)
    expected = torch.load(saved_before / "expected.pt", weights_only=True)
    source = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    with torch.no_grad():
        model_inputs = {name: value for name, value in inputs.items() if name != "force_words"}
        torch.testing.assert_close(model(**model_inputs).logits, expected["logits"])
    assert torch.equal(model.generate(**source), expected["beam"])
    assert torch.equal(model.generate(**source, num_beams=1), expected["greedy"])
    if "force_words" in inputs:
        outputs = {}
        for name, extra in (("nbest", {}), ("constrained", {"force_words": inputs["force_words"]})):
            out = model.generate(**source, num_return_sequences=2, output_sequence_scores=True, **extra)
            outputs[name], outputs[name + "_scores"] = out.sequences, out.sequences_scores
        same_nbest(outputs, expected)


def test_a_checkpoint_saved_before_loads_and_translates_the_same_as_remote_code(saved_before):
    inputs = torch.load(saved_before / "inputs.pt", weights_only=True)
    expected = torch.load(saved_before / "expected.pt", weights_only=True)
    remote = remote_code_outputs(saved_before, inputs)
    torch.testing.assert_close(remote["logits"], expected["logits"])
    assert torch.equal(remote["beam"], expected["beam"]) and torch.equal(remote["greedy"], expected["greedy"])
    same_nbest(remote, expected)
