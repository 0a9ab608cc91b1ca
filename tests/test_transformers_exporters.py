"""Transformers' own exporters (`transformers.exporters`: torch.export and ONNX graphs of `generate()`'s prefill and
decode steps, the graphs ExecuTorch and ONNX runtimes run) work on the model: they record `forward()`'s calls
during a real `generate()`, which the own search does not make, so a wrapped `forward()` hands decoding to
Transformers' loop (generation_vaswani.py) with the same tokens; and the type of `forward()`'s `**kwargs` is
readable at run time, as Transformers' checks of `output_attentions` read it."""

import copy
import inspect

import pytest
import torch
from transformers import GenerationConfig

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel

exporters = pytest.importorskip("transformers.exporters.utils")


def tiny_model() -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(VaswaniConfig.tiny()).eval()


def source(model, rows: int = 3, length: int = 7) -> dict:
    torch.manual_seed(1)
    ids = torch.randint(4, model.config.vocab_size, (rows, length))
    ids[:, -1] = model.config.eos_token_id
    mask = torch.ones_like(ids)
    ids[0, -3:], mask[0, -3:] = model.config.pad_token_id, 0  # one padded row
    ids[0, -4] = model.config.eos_token_id
    return {"input_ids": ids, "attention_mask": mask}


def counting(model) -> list:
    """Wrap `model.forward` on the instance, as Transformers' exporters capture its calls."""
    calls = []
    original = model.forward

    def wrapper(*args, **kwargs):
        calls.append(kwargs.get("decoder_input_ids"))
        return original(*args, **kwargs)

    model.forward = wrapper
    return calls


@pytest.mark.parametrize(
    "settings",
    [
        dict(num_beams=1, max_new_tokens=9),
        dict(num_beams=3, length_penalty_type="hf", max_new_tokens=9),
        dict(num_beams=1, max_length_offset=4),
    ],  # fmt: skip
    ids=["greedy", "beam", "source limit"],
)
def test_a_wrapped_forward_sees_every_step_with_the_same_tokens(settings):
    model = tiny_model()
    inputs = source(model)
    own = model.generate(**inputs, **settings)
    calls = counting(model)
    handed = model.generate(**inputs, **settings)
    assert len(calls) >= own.shape[1] - 1, "each decoding step goes through forward()"
    assert torch.equal(handed, own)


def test_an_accelerate_hook_keeps_the_own_search():
    """Accelerate's device hooks wrap `forward` too, but only to move tensors: the paper's search stays."""
    hooks = pytest.importorskip("accelerate.hooks")
    model = tiny_model()
    inputs = source(model)
    own = model.generate(**inputs, max_new_tokens=9)
    hooks.add_hook_to_module(model, hooks.ModelHook())
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(1))
    assert torch.equal(model.generate(**inputs, max_new_tokens=9), own)
    assert seen == [], "the own search steps the decoder, not forward()"


def test_accelerate_s_mixed_precision_keeps_the_own_search():
    """`Accelerator(mixed_precision=...).prepare(model)` (Seq2SeqTrainer's bf16/fp16 evaluation) wraps `forward` on
    the instance in autocast: generate() keeps the paper's search (its GNMT penalty) there, as before."""
    accelerate = pytest.importorskip("accelerate")
    model = tiny_model()
    inputs = source(model)
    own = model.generate(**inputs, max_new_tokens=9)
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # Accelerate's state is one per process, as its tests do
    try:
        prepared = accelerate.Accelerator(cpu=True, mixed_precision="bf16").prepare(model)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert prepared is model and "forward" in vars(model)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(1))
    model.generate(**inputs, max_new_tokens=9)
    assert seen == [], "the own search steps the decoder, not forward()"
    assert torch.equal(model.generate(**inputs, max_new_tokens=9), own)


@pytest.mark.parametrize("generation_config", [None, GenerationConfig(num_beams=1, max_new_tokens=5)],
                         ids=["the paper's defaults", "greedy"])  # fmt: skip
def test_transformers_decomposes_generate_into_prefill_and_decode(generation_config):
    model = tiny_model()
    inputs = source(model)
    components = exporters.decompose_for_generation(model, inputs, generation_config=generation_config)
    assert set(components) == {"prefill", "decode"}
    prefill, decode = components["prefill"][1], components["decode"][1]
    assert prefill["decoder_input_ids"].shape[-1] == 1 and decode["decoder_input_ids"].shape[-1] == 1
    assert decode["cache"].get_seq_length() == 1, "the decode step continues the prefill's cache"
    with torch.no_grad():
        logits = model(**copy.deepcopy(decode)).logits
    assert torch.isfinite(logits).all()


def exported_matches_eager(exporter, export_config) -> None:
    """Export generate()'s prefill and decode graphs, run them on the captured inputs: eager's logits, and the
    greedy tokens of the own search."""
    model = tiny_model()
    inputs = source(model)
    ids = {name: getattr(model.config, name) for name in ("decoder_start_token_id", "eos_token_id", "pad_token_id")}
    greedy = GenerationConfig(num_beams=1, max_new_tokens=2, **ids)
    components = exporters.decompose_for_generation(model, inputs, generation_config=greedy)
    exported = exporter.export_for_generation(model, inputs, config=export_config, generation_config=greedy)
    own = model.generate(**inputs, num_beams=1, max_new_tokens=2, min_new_tokens=2)
    for step, name in enumerate(("prefill", "decode")):
        stage = components[name][1]
        with torch.no_grad():
            eager = model(**copy.deepcopy(stage)).logits
        graph_inputs = {key: value for key, value in copy.deepcopy(stage).items() if not isinstance(value, bool)}
        logits = exported.runners[name](**graph_inputs).logits
        torch.testing.assert_close(logits, eager, atol=1e-4, rtol=1e-4)
        assert torch.equal(logits[:, -1].argmax(-1), own[:, step + 1]), f"the {name} graph's token"


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_export_of_generate(dynamic):
    from transformers.exporters.exporter_dynamo import DynamoConfig, DynamoExporter

    exported_matches_eager(DynamoExporter(), DynamoConfig(dynamic=dynamic))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_onnx_export_of_generate(dynamic):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from transformers.exporters.exporter_onnx import OnnxConfig, OnnxExporter

    exported_matches_eager(OnnxExporter(), OnnxConfig(dynamic=dynamic))


@pytest.mark.parametrize("model_class", [VaswaniModel, VaswaniForConditionalGeneration])
def test_forward_s_kwargs_type_is_readable_at_run_time(model_class):
    """Transformers reads `**kwargs: Unpack[TransformersKwargs]` to know the model returns attentions
    (test_modeling_common's `_can_output_attn`); a string annotation reads as "cannot"."""
    kwargs = inspect.signature(model_class(VaswaniConfig.tiny()).forward).parameters["kwargs"]
    assert "output_attentions" in kwargs.annotation.__args__[0].__annotations__
