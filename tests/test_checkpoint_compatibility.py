"""A checkpoint saved before the package was arranged in folders (tests/fixtures/checkpoint_before_folders.zip: a
tiny random model saved by `save_pretrained`, with the remote-code files of that day, its inputs and its outputs)
loads and computes the same today: through the installed package, and as remote code where the package is absent."""

import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

import vaswani_hf

from .helpers import remote_code_outputs

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_before_folders.zip"


@pytest.fixture
def saved_before(tmp_path) -> Path:
    with zipfile.ZipFile(FIXTURE) as archive:
        archive.extractall(tmp_path)
    return tmp_path


def test_a_checkpoint_saved_before_loads_and_translates_the_same_with_the_package(saved_before):
    model = AutoModelForSeq2SeqLM.from_pretrained(saved_before).eval()
    assert isinstance(model, vaswani_hf.VaswaniForConditionalGeneration)
    inputs = torch.load(saved_before / "inputs.pt", weights_only=True)
    expected = torch.load(saved_before / "expected.pt", weights_only=True)
    source = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, expected["logits"])
    assert torch.equal(model.generate(**source), expected["beam"])
    assert torch.equal(model.generate(**source, num_beams=1), expected["greedy"])


def test_a_checkpoint_saved_before_loads_and_translates_the_same_as_remote_code(saved_before):
    inputs = torch.load(saved_before / "inputs.pt", weights_only=True)
    expected = torch.load(saved_before / "expected.pt", weights_only=True)
    remote = remote_code_outputs(saved_before, inputs)
    torch.testing.assert_close(remote["logits"], expected["logits"])
    assert torch.equal(remote["beam"], expected["beam"]) and torch.equal(remote["greedy"], expected["greedy"])
