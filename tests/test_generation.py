"""generate(): the paper's decoding defaults (section 6.1) and Transformers' own modes."""

import pytest
import torch
from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration, gnmt_length_penalty

EOS, TOKEN = 2, 5


def tiny_model(**overrides) -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(VaswaniConfig.tiny(**overrides)).eval()


def test_paper_decoding_defaults():
    config = tiny_model().generation_config
    assert (config.num_beams, config.length_penalty, config.early_stopping) == (4, 0.6, True)
    assert (config.length_penalty_type, config.max_length_offset) == ("gnmt", 50)


def test_gnmt_formula():
    assert gnmt_length_penalty(1, 0.6) == 1.0
    assert gnmt_length_penalty(7, 0.6) == pytest.approx((12 / 6) ** 0.6)


class ScriptedScores(LogitsProcessor):
    """Step 0: EOS costs 1.0 nats, TOKEN 1.5; step 1: only TOKEN; step 2: only EOS. Everything else ~impossible.

    Finished hypotheses: Y1 = [EOS] (|Y| = 1, log p = -1.0) and Y3 = [TOKEN, TOKEN, EOS] (|Y| = 3, log p = -1.5).
    """

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - 1
        out = torch.full_like(scores, -1e4)
        if step == 0:
            out[:, EOS], out[:, TOKEN] = -1.0, -1.5
        elif step == 1:
            out[:, TOKEN] = 0.0
        else:
            out[:, EOS] = 0.0
        return out


@pytest.mark.parametrize(
    "penalty_type, expected_first, expected_scores",
    [
        # GNMT: Y1 = -1.0 / 1, Y3 = -1.5 / (8/6)^0.6 = -1.262: the short hypothesis wins
        ("gnmt", [EOS], [-1.0, -1.5 / (8 / 6) ** 0.6]),
        # Transformers: Y3 = -1.5 / 3^0.6 = -0.776 beats Y1 = -1.0: the long one wins
        ("hf", [TOKEN, TOKEN, EOS], [-1.5 / 3**0.6, -1.0]),
    ],
)
def test_length_penalty_ranks_hypotheses_as_the_formula_says(penalty_type, expected_first, expected_scores):
    model = tiny_model()
    out = model.generate(
        input_ids=torch.tensor([[7, 8, 9, EOS]]),
        logits_processor=LogitsProcessorList([ScriptedScores()]),
        num_beams=2,
        num_return_sequences=2,
        early_stopping=False,  # let the long hypothesis finish before the beam is declared done
        max_new_tokens=6,
        length_penalty=0.6,
        length_penalty_type=penalty_type,
        output_scores=True,
        return_dict_in_generate=True,
    )
    first = out.sequences[0, 1:].tolist()
    assert first[: len(expected_first)] == expected_first
    torch.testing.assert_close(out.sequences_scores, torch.tensor(expected_scores), atol=1e-4, rtol=0)


def test_max_output_length_is_source_length_plus_offset_per_example():
    model = tiny_model()
    src = torch.tensor([[5, 6, 0, 0, 0], [5, 6, 7, 8, 9]])
    mask = src.ne(0).long()
    for num_beams in (1, 3):
        out = model.generate(
            input_ids=src, attention_mask=mask, max_length_offset=3, num_beams=num_beams,
            suppress_tokens=[EOS],  # never stop on its own, so only the limit ends each row
        )  # fmt: skip
        generated = out[:, 1:]
        first_eos = [row.tolist().index(EOS) + 1 for row in generated]
        assert first_eos == [2 + 3, 5 + 3]  # output length (EOS included) = source length + offset
    # an explicit max_new_tokens wins over the offset
    assert model.generate(input_ids=src, attention_mask=mask, max_new_tokens=2, num_beams=1).shape[1] == 3


def test_default_generate_uses_paper_limit():
    model = tiny_model()
    src = torch.randint(4, 99, (2, 6))
    out = model.generate(input_ids=src, suppress_tokens=[EOS], num_beams=1)
    assert out.shape[1] == 1 + 6 + 50


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_beams": 1, "do_sample": False},
        {"num_beams": 1, "do_sample": True, "top_k": 5},
        {"num_beams": 4, "length_penalty_type": "hf", "length_penalty": 1.0},
        {"num_beams": 4, "num_return_sequences": 2},
    ],
)
def test_transformers_decoding_modes_keep_working(kwargs):
    model = tiny_model()
    src = torch.randint(4, 99, (3, 5))
    torch.manual_seed(0)
    out = model.generate(input_ids=src, max_new_tokens=7, **kwargs)
    assert out.shape[0] == 3 * kwargs.get("num_return_sequences", 1) and out.shape[1] <= 8
    assert (out[:, 0] == model.config.decoder_start_token_id).all()


def test_batched_greedy_equals_one_by_one():
    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 2, 0, 0], [8, 9, 10, 11, 12, 2]])
    mask = src.ne(0).long()
    batched = model.generate(input_ids=src, attention_mask=mask, num_beams=1, max_new_tokens=10)
    for i in range(2):
        alone = model.generate(input_ids=src[i : i + 1, : int(mask[i].sum())], num_beams=1, max_new_tokens=10)
        assert batched[i, : alone.shape[1]].tolist() == alone[0].tolist()


def test_bad_length_penalty_type_is_a_clear_error():
    with pytest.raises(ValueError, match="length_penalty_type must be one of"):
        tiny_model().generate(input_ids=torch.tensor([[5, 2]]), length_penalty_type="wu")


def test_no_private_generation_hook_is_overridden():
    # a Transformers release may rename or change any private GenerationMixin method: we override none
    private = {name for name in dir(GenerationMixin) if name.startswith("_") and not name.startswith("__")}
    for cls in VaswaniForConditionalGeneration.__mro__:
        if cls is not GenerationMixin and cls.__module__.startswith("vaswani_hf"):
            assert not private & set(vars(cls)), f"{cls.__name__} overrides {private & set(vars(cls))}"


# --- the searches of search_vaswani.py against Transformers' own loop (which runs the handed-over modes) ---


def test_beam_search_equals_transformers_uncached_beam_search():
    # use_cache=False is handed over: Transformers' loop recomputing every prefix, our decoder with its caches
    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 2, 0, 0], [8, 9, 10, 11, 12, 2], [13, 14, 2, 0, 0, 0]])
    mask = src.ne(0).long()
    kwargs = dict(attention_mask=mask, num_beams=4, num_return_sequences=4, max_new_tokens=9, output_scores=True,
                  return_dict_in_generate=True, length_penalty_type="hf")  # fmt: skip
    cached = model.generate(input_ids=src, use_cache=True, **kwargs)
    uncached = model.generate(input_ids=src, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_min_length_bad_words_and_forced_eos_as_transformers(num_beams):
    model = tiny_model()
    src = torch.randint(4, 99, (3, 5), generator=torch.Generator().manual_seed(3))
    kwargs = dict(num_beams=num_beams, min_new_tokens=4, max_new_tokens=8, bad_words_ids=[[7], [9, 10]],
                  forced_eos_token_id=EOS)  # fmt: skip
    ours = model.generate(input_ids=src, length_penalty_type="hf", max_length_offset=None, **kwargs)
    theirs = GenerationMixin.generate(model, input_ids=src, **kwargs)
    assert torch.equal(ours, theirs)
    assert (ours[:, 1:5] != EOS).all() and not (ours == 7).any()


def test_handing_over_a_beam_mode_warns_about_the_gnmt_penalty(caplog):
    from transformers.utils import logging as hf_logging

    model = tiny_model()
    hf_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            model.generate(input_ids=torch.tensor([[5, 6, 2]]), num_beams=2, do_sample=True, max_new_tokens=3)
    finally:
        hf_logging.disable_propagation()
    assert "length_penalty_type='gnmt'" in caplog.text and "beam_sample" in caplog.text


def test_beam_search_keeps_one_encoder_row_per_source():
    from vaswani_hf.model.decoding_state_vaswani import DecodingState, VaswaniBeamSearchCacheLayer

    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 2, 0, 0], [8, 9, 10, 11, 12, 2], [13, 14, 2, 0, 0, 0]])
    mask = src.ne(0).long()
    hidden = model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state
    state = DecodingState(model, hidden, mask, rows_per_example=4)
    logits = state.logits(torch.full((12,), model.config.decoder_start_token_id))
    assert logits.shape == (model.config.vocab_size, 12)  # one column per decoder row
    assert state.cache.cross_attention_cache.layers[0].keys.shape[0] == 3  # once per source, not per beam
    assert isinstance(state.cache.self_attention_cache.layers[0], VaswaniBeamSearchCacheLayer)
    state.keep(torch.tensor([0, 2]))  # sentence 1 is done: its rows leave the batch
    assert state.cache.cross_attention_cache.layers[0].keys.shape[0] == 2
    assert state.cache.self_attention_cache.layers[0].keys.shape[0] == 8
    assert state.example_ids.tolist() == [0, 2]


@pytest.mark.parametrize("positions", ["sinusoidal", "sinusoidal_fairseq", "learned"])
def test_static_cache_decoding_equals_dynamic(positions):
    # the static cache is what torch.compile'd decoding uses: positions from a tensor length, 4D masks
    model = tiny_model(position_embedding_type=positions)
    src = torch.tensor([[5, 6, 7, 2, 0, 0], [8, 9, 10, 11, 12, 2]])
    mask = src.ne(0).long()
    dynamic = model.generate(input_ids=src, attention_mask=mask, num_beams=1, max_new_tokens=10)
    static = model.generate(
        input_ids=src, attention_mask=mask, num_beams=1, max_new_tokens=10, cache_implementation="static"
    )
    assert torch.equal(dynamic, static)


def test_beam_cache_layer_reorders_and_appends_like_transformers_layer():
    from transformers.cache_utils import DynamicLayer

    from vaswani_hf.model.decoding_state_vaswani import VaswaniBeamSearchCacheLayer

    torch.manual_seed(0)
    ours, reference = VaswaniBeamSearchCacheLayer(), DynamicLayer()
    for step in range(6):
        new_keys, new_values = torch.randn(8, 2, 1 if step else 3, 4), torch.randn(8, 2, 1 if step else 3, 4)
        got, expected = ours.update(new_keys, new_values), reference.update(new_keys, new_values)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        for _ in range(1 + step % 2):  # twice in a row on odd steps: pending reorderings must compose
            beam_idx = torch.randint(0, 8, (8,))
            ours.reorder_cache(beam_idx)
            reference.reorder_cache(beam_idx)
        assert ours.get_seq_length() == reference.get_seq_length()
    # reading applies a pending reordering, so the layer looks like a DynamicLayer from outside
    assert torch.equal(ours.keys, reference.keys) and torch.equal(ours.values, reference.values)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_cross_attention_over_shared_encoder_rows_equals_repeated_rows(implementation):
    model = tiny_model()
    model.set_attn_implementation(implementation)
    src = torch.tensor([[5, 6, 7, 2, 0, 0], [8, 9, 10, 11, 12, 2]])
    mask = src.ne(0).long()
    encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
    target = torch.randint(4, 99, (2 * 3, 4))  # 3 decoder rows per source, 4 target positions each
    shared = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=target,
                   output_attentions=implementation == "eager")  # fmt: skip
    repeated = model(
        encoder_outputs=(encoder_outputs.last_hidden_state.repeat_interleave(3, dim=0),),
        attention_mask=mask.repeat_interleave(3, dim=0),
        decoder_input_ids=target,
        output_attentions=implementation == "eager",
    )
    torch.testing.assert_close(shared.logits, repeated.logits)
    if implementation == "eager":
        for got, expected in zip(shared.cross_attentions, repeated.cross_attentions, strict=True):
            torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="one encoder output per decoder row"):
        model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=target[:5])


@pytest.mark.slow
def test_compiled_greedy_decoding_equals_eager_also_without_guard_checks():
    # the README's "greedy decoding at its fastest" snippet
    from transformers import CompileConfig

    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 2, 0, 0], [8, 9, 10, 11, 12, 2]])
    mask = src.ne(0).long()
    compile_config = CompileConfig(fullgraph=True)
    compile_config._compile_all_devices = True
    fast = dict(num_beams=1, cache_implementation="static", compile_config=compile_config, max_new_tokens=10)
    eager = model.generate(input_ids=src, attention_mask=mask, num_beams=1, max_new_tokens=10)
    assert torch.equal(model.generate(input_ids=src, attention_mask=mask, **fast), eager)
    assert hasattr(model, "_compiled_call"), "Transformers decoded without compiling"
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        assert torch.equal(model.generate(input_ids=src, attention_mask=mask, **fast), eager)
