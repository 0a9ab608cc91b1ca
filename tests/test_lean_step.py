"""The decoder step without module calls (`vaswani_hf/model/speed/lean_step.py`) against the decoder's own forward.

Both step the same `DecodingState` layout with the same linears, so the hidden states must be the same bits, step
after step, through beam search's reorderings and sentences leaving the batch; and a whole search must give the
same tokens and scores. Hypothesis draws the model's space (post- and pre-norm, the three position layouts, learned
positions, layers, heads, activations, bf16), batches with padding, beams, and which rows survive. Where the lean
step cannot hold (hooks, training, eager attention, the switch), the module path must run."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.model import generation_vaswani
from vaswani_hf.model.decoding_state_vaswani import DecodingState, ModelProducts
from vaswani_hf.model.speed import lean_step
from vaswani_hf.model.speed.lean_step import LeanProducts


@st.composite
def models(draw):
    heads = draw(st.sampled_from([1, 2, 4]))
    config = VaswaniConfig.tiny(
        vocab_size=draw(st.integers(8, 40)),
        d_model=8 * heads,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=16,
        decoder_ffn_dim=24,
        encoder_layers=1,
        decoder_layers=draw(st.integers(1, 3)),
        norm_position=draw(st.sampled_from(["post", "pre"])),
        position_embedding_type=draw(
            st.sampled_from(["sinusoidal", "sinusoidal_split", "sinusoidal_fairseq", "learned"])
        ),  # fmt: skip
        activation_function=draw(st.sampled_from(["relu", "gelu"])),
        scale_embedding=draw(st.booleans()),
        output_bias=True,
    )
    torch.manual_seed(draw(st.integers(0, 2**16)))
    model = VaswaniForConditionalGeneration(config).eval()
    if draw(st.booleans()):
        model = model.to(torch.bfloat16)
    return model


@st.composite
def batches(draw, vocab: int):
    count = draw(st.integers(1, 3))
    sources = [draw(st.lists(st.integers(3, vocab - 1), min_size=1, max_size=6)) for _ in range(count)]
    longest = max(map(len, sources))
    ids = torch.tensor([s + [0] * (longest - len(s)) for s in sources])
    mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in sources])
    return ids, mask


def _states(model, ids, mask, beams):
    encoder = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    return [DecodingState(model, encoder, mask.bool(), beams, products) for products in (ModelProducts, LeanProducts)]


@given(model=models(), data=st.data(), beams=st.integers(1, 3), steps=st.integers(1, 5))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_lean_step_gives_the_decoders_own_hidden_states_bit_for_bit(model, data, beams, steps):
    ids, mask = data.draw(batches(model.config.vocab_size))
    with torch.inference_mode():
        plain, lean = _states(model, ids, mask, beams)
        rows = ids.shape[0] * beams
        tokens = torch.full((rows,), model.config.decoder_start_token_id)
        for _ in range(steps):
            expected = plain._decoder_step(tokens)
            got = lean._decoder_step(tokens)
            assert lean._lean_step is not None
            assert torch.equal(got, expected)
            tokens = data.draw(st.lists(st.integers(0, model.config.vocab_size - 1), min_size=rows, max_size=rows))
            tokens = torch.tensor(tokens)
            if beams > 1:  # beam search's survivors: rows of a source reordered among themselves
                order = torch.tensor([s * beams + data.draw(st.integers(0, beams - 1)) for s in range(ids.shape[0])
                                      for _ in range(beams)])  # fmt: skip
                plain.reorder(order)
                lean.reorder(order)
            if ids.shape[0] > 1 and data.draw(st.booleans()):  # a finished sentence leaves the batch
                kept = torch.tensor(sorted(data.draw(st.sets(st.integers(0, ids.shape[0] - 1), min_size=1,
                                                             max_size=ids.shape[0] - 1))))  # fmt: skip
                plain.keep(kept)
                lean.keep(kept)
                ids = ids[kept]
                rows = ids.shape[0] * beams
                tokens = tokens.view(-1, beams)[kept].flatten()


@given(model=models(), data=st.data(), beams=st.sampled_from([1, 2, 4]))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_search_with_the_lean_step_gives_the_same_tokens_and_scores(model, data, beams):
    ids, mask = data.draw(batches(model.config.vocab_size))
    kwargs = dict(num_beams=beams, max_new_tokens=data.draw(st.integers(1, 8)), return_dict_in_generate=True,
                  output_sequence_scores=beams > 1)  # fmt: skip
    results = []
    for products in (ModelProducts, LeanProducts):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(generation_vaswani.SPEEDUPS, "cpu_products", products)
            results.append(model.generate(input_ids=ids, attention_mask=mask, **kwargs))
    assert torch.equal(results[0].sequences, results[1].sequences)
    if beams > 1:
        assert torch.equal(results[0].sequences_scores, results[1].sequences_scores)


def _tiny():
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(VaswaniConfig.tiny()).eval()


def _plan(model) -> lean_step.LeanStep | None:
    """The plan as a search makes it: without gradients (with them, no plan)."""
    with torch.inference_mode():
        return lean_step.LeanStep.plan(model)


def _plan_on_first_step(model) -> lean_step.LeanStep | None:
    ids = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        (state,) = _states(model, ids, torch.ones_like(ids), 1)[1:]
        state._decoder_step(torch.tensor([model.config.decoder_start_token_id]))
    return state._lean_step


def test_the_lean_step_steps_a_plain_model():
    assert isinstance(_plan_on_first_step(_tiny()), lean_step.LeanStep)


def test_a_forward_hook_on_a_decoder_module_keeps_the_module_path():
    """A hook would not fire in the lean step: the decoder's own forward runs, and the hook sees every step."""
    model = _tiny()
    calls = []
    model.get_decoder().layers[0].feed_forward.fc1.register_forward_hook(lambda *args: calls.append(1))
    assert _plan_on_first_step(model) is None
    assert calls == [1]


def test_a_global_forward_hook_keeps_the_module_path():
    model = _tiny()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda *args: None)
    try:
        assert _plan_on_first_step(model) is None
    finally:
        handle.remove()


def test_eager_attention_and_the_switch_keep_the_module_path(monkeypatch):
    model = _tiny()
    model.config._attn_implementation = "eager"
    assert _plan_on_first_step(model) is None
    monkeypatch.setenv("VASWANI_LEAN_STEP", "0")
    assert _plan_on_first_step(_tiny()) is None


def test_training_mode_and_gradients_keep_the_module_path():
    model = _tiny()
    assert _plan(model) is not None
    assert _plan(model.train()) is None
    model.eval()
    with torch.enable_grad():
        assert lean_step.LeanStep.plan(model) is None


def test_a_replaced_decoder_layer_keeps_the_module_path():
    """A layer of another class (an adapter's wrapper, a user's subclass) computes what the lean step cannot know."""

    class Tweaked(type(_tiny().get_decoder().layers[0])):
        pass

    model = _tiny()
    model.get_decoder().layers[0].__class__ = Tweaked
    assert _plan_on_first_step(model) is None


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("beams", [1, 4])
def test_cpu_searches_step_leanly_with_the_fast_products_on_or_off(beams, fast, monkeypatch):
    """CPU searches take the lean step, with the fast products (chosen by stopwatch) on or off, since it computes
    the same bits: the decoder's forward sees no step, while with the switch off it sees every step."""
    model = _tiny()
    ids = torch.tensor([[5, 6, 7, 8]])
    steps = []
    decoder = model.get_decoder()
    original = type(decoder).forward

    def counted(self, *args, **kwargs):
        steps.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(decoder), "forward", counted)
    kwargs = dict(num_beams=beams, max_new_tokens=5, min_new_tokens=5, cpu_fast_paths=fast)
    model.generate(input_ids=ids, **kwargs)
    assert steps == []
    monkeypatch.setenv("VASWANI_LEAN_STEP", "0")
    model.generate(input_ids=ids, **kwargs)
    assert len(steps) == 5


def _same_search_as_the_module_path(model, monkeypatch) -> None:
    """Greedy with per-step scores and beam search's scores: the same with the lean step as with the modules."""
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    mask = (ids != 0).long()
    results = []
    for lean in ("0", "1"):
        monkeypatch.setenv("VASWANI_LEAN_STEP", lean)
        torch.manual_seed(0)  # a module left in training mode draws its dropout alike on both paths
        greedy = model.generate(input_ids=ids, attention_mask=mask, num_beams=1, max_new_tokens=6, output_scores=True,
                                return_dict_in_generate=True, cpu_fast_paths=False)  # fmt: skip
        beams = model.generate(input_ids=ids, attention_mask=mask, num_beams=3, max_new_tokens=6, cpu_fast_paths=False,
                               return_dict_in_generate=True, output_sequence_scores=True)  # fmt: skip
        results.append((greedy.sequences, torch.stack(greedy.scores), beams.sequences, beams.sequences_scores))
    for plain, lean in zip(*results, strict=True):
        assert torch.equal(plain, lean)


def test_a_decoder_module_left_in_training_mode_keeps_the_module_path(monkeypatch):
    """Monte Carlo dropout: the model in eval mode, the decoder (or one attention) in training mode: its dropout
    runs at every step, as the modules do it."""
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(dropout=0.5, attention_dropout=0.3)).eval()
    model.get_decoder().layers[0].encoder_attn.train()
    assert _plan(model) is None
    _same_search_as_the_module_path(model, monkeypatch)


def test_a_forward_replaced_on_an_instance_keeps_the_module_path(monkeypatch):
    """A caller's wrapper set as `module.forward` (a tracer, Accelerate's offloading) runs at every step."""
    model = _tiny()
    layer = model.get_decoder().layers[1]
    calls = []
    original = layer.forward
    layer.forward = lambda *args, **kwargs: (calls.append(1), original(*args, **kwargs))[1]
    assert _plan(model) is None
    _same_search_as_the_module_path(model, monkeypatch)
    assert calls


def test_accelerates_offloaded_decoder_keeps_the_module_path(monkeypatch):
    """Accelerate's `cpu_offload` keeps the weights on the meta device and loads them in a wrapped `forward`: the
    lean step, which reads weights directly, would fail on meta tensors."""
    from accelerate import cpu_offload

    model = _tiny()
    cpu_offload(model.get_decoder(), execution_device=torch.device("cpu"))
    assert _plan(model) is None
    _same_search_as_the_module_path(model, monkeypatch)


def test_a_compiled_decoder_layer_keeps_the_module_path():
    model = _tiny()
    model.get_decoder().layers[0].compile()
    assert _plan(model) is None


def test_a_users_sdpa_function_keeps_the_module_path(monkeypatch):
    """Transformers lets a user register their own function under "sdpa" (`AttentionInterface`): it then runs."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def halved(module, query, key, value, attention_mask, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        output, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        return output * 0.5, weights

    model = _tiny()
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "sdpa", halved)
    assert _plan(model) is None
    _same_search_as_the_module_path(model, monkeypatch)


def test_a_users_forward_on_a_decoder_linear_runs_and_stays_with_the_fast_products_on():
    """A caller's `forward` set on a decoder linear is theirs: the fast products neither re-bind nor remove it."""
    model = _tiny()
    linear = model.get_decoder().layers[0].feed_forward.fc1
    calls = []
    original = linear.forward
    mine = lambda hidden: (calls.append(1), original(hidden))[1]  # noqa: E731
    linear.forward = mine
    model.generate(input_ids=torch.tensor([[5, 6, 7]]), num_beams=2, max_new_tokens=4, min_new_tokens=4)
    assert calls and vars(linear)["forward"] is mine
