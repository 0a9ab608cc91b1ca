"""CTranslate2 export: the exported model decodes greedily to the same tokens as ours (issue 5)."""

import pytest
import torch

from vaswani_hf.data.number_words import builtin_splits
from vaswani_hf.translation.inference import load_for_inference

from .helpers import vaswani

ctranslate2 = pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, translator):
    """The session's trained translator (conftest.py; the ONNX and docs tests' too: no model of its own to train)."""
    root = tmp_path_factory.mktemp("export")
    result = vaswani("export", str(translator), str(root / "ct2"), "--to", "ctranslate2")
    assert result.returncode == 0, result.stderr[-3000:]
    return translator, root / "ct2"


def test_export_greedy_outputs_equal_ours(exported):
    model_dir, ct2_dir = exported
    model, tokenizer = load_for_inference(model_dir, device="cpu")
    sources = [source for source, _ in builtin_splits()["test"][:64]]
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    ours = model.generate(**batch, num_beams=1, max_new_tokens=40)
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu")
    tokens = [tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist()) for ids, mask in
              zip(batch["input_ids"], batch["attention_mask"], strict=True)]  # fmt: skip
    results = translator.translate_batch(tokens, beam_size=1, max_decoding_length=40)
    theirs = [tokenizer.decode(tokenizer.convert_tokens_to_ids(r.hypotheses[0])) for r in results]
    mine = tokenizer.batch_decode(ours, skip_special_tokens=True)
    assert len(set(mine)) > 10, "the test model should produce varied translations"
    assert theirs == mine


def test_export_refuses_a_mismatched_vocabulary(tmp_path):
    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_hf.interop.export import export_ctranslate2

    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny())
    with pytest.raises(ValueError, match="vocabulary has 5 tokens but the model 99"):
        export_ctranslate2(model, ["a", "b", "c", "d", "e"], tmp_path)


def test_export_of_a_missing_model_is_a_clean_error(tmp_path):
    result = vaswani("export", str(tmp_path / "nope"), str(tmp_path / "out"))
    assert result.returncode == 2
    assert "nope: no such folder" in result.stderr
    assert "Traceback" not in result.stderr


def test_exported_logits_path_matches_on_random_weights(tmp_path):
    from benchmarks.ctranslate2_runner import CTranslate2Runner
    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(0)
    config = VaswaniConfig.tiny(position_embedding_type="sinusoidal_split", output_bias=True, norm_position="pre")
    model = VaswaniForConditionalGeneration(config).eval()
    model.final_logits_bias.data.normal_()
    runner = CTranslate2Runner.from_model(model, tmp_path, threads=1)
    source = torch.randint(4, config.vocab_size, (3, 9))
    ours = model.generate(input_ids=source, num_beams=1, min_new_tokens=12, max_new_tokens=12)
    assert torch.equal(ours[:, 1:], runner.generate_ids(source, 1, 12))
