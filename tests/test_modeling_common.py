"""Transformers' own common model and config tests (from the pinned release's sdist) run on our classes."""

import os
import unittest

import pytest
import torch

from tests.upstream import UpstreamUnavailable, ensure_upstream_tests

try:
    ensure_upstream_tests()
except UpstreamUnavailable as err:
    if os.environ.get("CI"):  # CI reaches the package index: there a failed fetch is a failure, not a skip
        raise
    pytest.skip(f"Transformers' common tests are fetched at test time: {err}", allow_module_level=True)

from transformers import MarianConfig, MarianModel, MarianMTModel  # noqa: E402
from transformers.models.auto import modeling_auto  # noqa: E402

from tests._upstream.test_configuration_common import ConfigTester  # noqa: E402
from tests._upstream.test_modeling_common import ModelTesterMixin, ids_tensor  # noqa: E402
from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel  # noqa: E402

# The common tests pick behaviour from these static name tables, which Auto*.register does not touch.
modeling_auto.MODEL_MAPPING_NAMES.setdefault("vaswani", "VaswaniModel")
modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.setdefault("vaswani", "VaswaniForConditionalGeneration")


class VaswaniModelTester:
    def __init__(self, parent, batch_size=13, seq_length=7, vocab_size=99, hidden_size=16, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=4, is_training=True):  # fmt: skip
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.encoder_seq_length = seq_length
        self.decoder_seq_length = seq_length
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.is_training = is_training
        self.pad_token_id = 1
        self.eos_token_id = 2
        self.bos_token_id = 0

    config_class = VaswaniConfig  # Marian's control takes the same fields

    def get_config(self):
        return self.config_class(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size,
            dropout=0.1,
            attention_dropout=0.1,
            max_position_embeddings=20,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.bos_token_id,
            decoder_start_token_id=self.pad_token_id,
        )

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = self.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        inputs = {
            "input_ids": input_ids,
            "decoder_input_ids": decoder_input_ids,
            "attention_mask": input_ids.ne(self.pad_token_id),
            "decoder_attention_mask": decoder_input_ids.ne(self.pad_token_id),
        }
        return self.get_config(), inputs


class VaswaniCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (VaswaniModel, VaswaniForConditionalGeneration)
    # Upstream's GenerationTesterMixin lives in tests/generation/, which the sdist does not ship; our generate()
    # (paper defaults, GNMT penalty, source + 50 limit) is tested in tests/test_generation.py instead.
    all_generative_model_classes = ()
    is_encoder_decoder = True
    test_missing_keys = True
    test_resize_embeddings = True
    model_tester_class = VaswaniModelTester

    def setUp(self):
        self.model_tester = self.model_tester_class(self)
        self.config_tester = ConfigTester(self, config_class=VaswaniConfig, d_model=32)

    def test_config(self):
        self.config_tester.run_common_tests()

    def _callTestMethod(self, method):
        """A test that fails for the model is run at once on Marian's control: its failure says whether Marian
        fails it too (the harness's or the release's) or the model alone."""
        try:
            method()
        except unittest.SkipTest:
            raise
        except Exception as err:
            if type(self) is VaswaniCommonTest:
                err.add_note(marian_control(self._testMethodName))
            raise


class MarianModelTester(VaswaniModelTester):
    """The same shapes and inputs for Transformers' Marian, the control: a test that fails for both is the
    harness's (or the release's), not the model's."""

    config_class = MarianConfig


class MarianControlTest(VaswaniCommonTest):
    """Transformers' Marian through the same mixin: each test the model fails, run on Marian (marian_control); the
    whole class with VASWANI_MARIAN_CONTROL=1 (in the second tier: tests/extended_tier.txt), as on a new release."""

    __test__ = os.environ.get("VASWANI_MARIAN_CONTROL") == "1"
    all_model_classes = (MarianModel, MarianMTModel)
    model_tester_class = MarianModelTester
    test_config = None  # the configuration tested is ours alone


def marian_control(name: str) -> str:
    """What Marian's control makes of the test `name` the model failed."""
    result = unittest.TestResult()
    MarianControlTest(name).run(result)
    if result.failures or result.errors:
        return f"Marian's control fails {name} too: the harness's or the release's failure, not the model's"
    if result.skipped:
        return f"Marian's control skips {name}: {result.skipped[0][1]}"
    return f"Marian's control passes {name}: the model's failure"


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_tester_inputs_run(attn):
    """Sanity check of the tester itself, so a silent tester bug cannot make the common tests vacuous."""
    config, inputs = VaswaniModelTester(None).prepare_config_and_inputs_for_common()
    # the tester makes its inputs on Transformers' `torch_device` (CUDA where it is visible): the model goes there
    model = VaswaniForConditionalGeneration(config).to(inputs["input_ids"].device).eval()
    model.set_attn_implementation(attn)
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape == (13, 7, 99)


@pytest.mark.parametrize("marian_fails", [False, True])
def test_a_test_the_model_fails_says_what_marian_s_control_makes_of_it(monkeypatch, marian_fails):
    def probe(self):  # fails for the model; for Marian too, or not
        assert self.all_model_classes[0] is not VaswaniModel and not marian_fails

    monkeypatch.setattr(VaswaniCommonTest, "test_probe", probe, raising=False)
    result = unittest.TestResult()
    VaswaniCommonTest("test_probe").run(result)
    ((_, trace),) = result.failures
    verdict = "fails test_probe too" if marian_fails else "passes test_probe: the model's failure"
    assert f"Marian's control {verdict}" in trace, trace
