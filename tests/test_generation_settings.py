"""generate() settings one step beside the other tests: each a case where our search once parted from Transformers'
(or from its own docstring), held to Transformers' loop where Transformers has the setting."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.model import search_vaswani

EOS = 2


def tiny_model(**overrides) -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=40, **overrides)).eval()


SOURCE = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, 0, 0]])


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_list_of_forced_eos_ids_forces_every_one_as_transformers(num_beams):
    """Transformers' forced EOS makes each of the ids score 0 at the last step: greedy's tie goes to EOS (the first
    column of the two), where forcing the first id alone ended every row with 7; beam search keeps hypotheses
    ending in either, tied (which of two tied ones is returned first is top-k's choice)."""
    model = tiny_model()
    kwargs = dict(attention_mask=SOURCE.ne(0).long(), num_beams=num_beams, max_new_tokens=4,
                  num_return_sequences=num_beams, forced_eos_token_id=[7, EOS], return_dict_in_generate=True,
                  output_scores=num_beams > 1)  # fmt: skip
    ours = model.generate(input_ids=SOURCE, length_penalty_type="hf", max_length_offset=None, **kwargs)
    theirs = GenerationMixin.generate(model, input_ids=SOURCE, **kwargs)
    if num_beams == 1:
        assert torch.equal(ours.sequences, theirs.sequences) and (ours.sequences[:, -1] == EOS).all()
    else:
        torch.testing.assert_close(ours.sequences_scores, theirs.sequences_scores)
        assert {EOS, 7} <= set(ours.sequences[:, -1].tolist())


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_target_prefix_wins_over_forced_bos_as_a_decoder_prompt_does_in_transformers(num_beams):
    """Transformers forces BOS only where the decoder prompt is the start token alone; a prefix is such a prompt.
    An example without a prefix still gets BOS."""
    model = tiny_model()
    out = model.generate(input_ids=SOURCE, attention_mask=SOURCE.ne(0).long(), num_beams=num_beams,
                         forced_bos_token_id=11, target_prefix=[[5, 7], []], max_length_offset=3,
                         return_dict_in_generate=True, output_sequence_scores=num_beams > 1)  # fmt: skip
    assert out.sequences[0, 1:3].tolist() == [5, 7]
    assert out.sequences[1, 1] == 11
    if num_beams > 1:
        assert torch.isfinite(out.sequences_scores).all() and (out.sequences_scores > -1e8).all()
    prompt = torch.tensor([[model.config.decoder_start_token_id, 5, 7]])
    theirs = GenerationMixin.generate(model, input_ids=SOURCE[:1], decoder_input_ids=prompt, num_beams=num_beams,
                                      forced_bos_token_id=11, max_new_tokens=4, length_penalty=0.0)  # fmt: skip
    ours = model.generate(input_ids=SOURCE[:1], num_beams=num_beams, forced_bos_token_id=11, target_prefix=[[5, 7]],
                          max_new_tokens=6, length_penalty=0.0, length_penalty_type="hf")  # fmt: skip
    assert torch.equal(ours, theirs)


def test_an_integer_negative_length_penalty_in_the_static_shape_search():
    model = tiny_model()
    kwargs = dict(attention_mask=SOURCE.ne(0).long(), num_beams=3, length_penalty=-1, length_penalty_type="hf",
                  max_new_tokens=5, max_length_offset=None, early_stopping=False)  # fmt: skip
    static = model.generate(input_ids=SOURCE, graph_decoding=True, **kwargs)
    assert torch.equal(static, model.generate(input_ids=SOURCE, graph_decoding=False, **kwargs))


@pytest.mark.parametrize("num_beams", [1, 3])
def test_max_length_one_raises_as_transformers(num_beams):
    model = tiny_model()
    with pytest.raises(ValueError, match="`max_length` is set to 1") as ours:
        model.generate(input_ids=SOURCE, num_beams=num_beams, max_length=1)
    with pytest.raises(ValueError) as theirs:
        GenerationMixin.generate(model, input_ids=SOURCE, num_beams=num_beams, max_length=1)
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(input_ids=SOURCE, num_beams=num_beams, max_new_tokens=0)


def test_a_learned_position_table_too_short_for_the_phrases_fails_before_decoding():
    model = tiny_model(position_embedding_type="learned", max_position_embeddings=8)
    calls = []
    model.get_decoder().register_forward_hook(lambda *args: calls.append(1))
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        model.generate(input_ids=SOURCE[:1], num_beams=2, force_words=[[[5, 6, 7, 8, 9, 10, 11, 12, 13]]])
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        model.generate(input_ids=SOURCE[:1], num_beams=2, target_prefix=[[5] * 9])
    assert not calls  # nothing decoded
    out = model.generate(input_ids=SOURCE[:1], num_beams=2, force_words=[[[5, 6, 7]]])  # what fits decodes
    assert out.shape[1] <= 9


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generate_without_input_ids_starts_from_bos_as_transformers(num_beams):
    model = tiny_model()
    kwargs = dict(num_beams=num_beams, max_new_tokens=4)
    ours = model.generate(length_penalty_type="hf", max_length_offset=None, **kwargs)
    theirs = GenerationMixin.generate(model, **kwargs)
    assert torch.equal(ours, theirs)
    model.generate(**kwargs)  # the paper's source + 50, from the one-token source
    model.generation_config.bos_token_id = model.config.bos_token_id = None
    with pytest.raises(ValueError, match="`bos_token_id` has to be defined"):
        model.generate(**kwargs)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_return_dict_in_generate_carries_the_cache_a_caller_continues_from(num_beams):
    """Greedy: Transformers' own cache (every returned token but the last). Beam search: the returned sequences'
    cache; the next step's logits from it are a whole forward pass's."""
    from transformers.cache_utils import EncoderDecoderCache

    from vaswani_hf.model.modeling_vaswani import CACHE_FIELD

    model = tiny_model()
    mask = SOURCE.ne(0).long()
    kwargs = dict(attention_mask=mask, num_beams=num_beams, num_return_sequences=num_beams, max_new_tokens=5,
                  return_dict_in_generate=True)  # fmt: skip
    ours = model.generate(input_ids=SOURCE, length_penalty_type="hf", max_length_offset=None, **kwargs)
    cache = ours[CACHE_FIELD]
    assert isinstance(cache, EncoderDecoderCache)
    assert cache.get_seq_length() == ours.sequences.shape[1] - 1
    if num_beams == 1:
        theirs = GenerationMixin.generate(model, input_ids=SOURCE, **kwargs)
        assert torch.equal(ours.sequences, theirs.sequences)
        for mine, their in zip(cache.self_attention_cache.layers, theirs[CACHE_FIELD].self_attention_cache.layers,
                               strict=True):  # fmt: skip
            torch.testing.assert_close(mine.keys, their.keys)
            torch.testing.assert_close(mine.values, their.values)
    rows = ours.sequences.shape[0] // SOURCE.shape[0]
    source, source_mask = SOURCE.repeat_interleave(rows, 0), mask.repeat_interleave(rows, 0)
    whole = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=ours.sequences).logits[:, -1]
    step = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=ours.sequences[:, -1:],
                 **{CACHE_FIELD: cache}).logits[:, -1]  # fmt: skip
    torch.testing.assert_close(step, whole, atol=1e-4, rtol=1e-4)
    assert CACHE_FIELD not in model.generate(input_ids=SOURCE, output_sequence_scores=True, num_beams=2)  # not asked


class OnlyTokens(LogitsProcessor):
    """Leaves these tokens alone possible in every row (fewer than a beam search's beams)."""

    def __init__(self, tokens: list[int]):
        self.tokens = tokens

    def __call__(self, input_ids, scores):
        kept = torch.full_like(scores, float("-inf"))
        kept[:, self.tokens] = scores[:, self.tokens]
        return kept


def test_a_finished_slot_no_hypothesis_fills_scores_impossible_as_every_impossible_thing_does():
    """One marker of what cannot happen (-inf): with EOS the only possible token, three beams end with one
    hypothesis; the other two returned slots hold none and score -inf (they were -1e9, the marker's other
    spelling), and no empty slot lengthens the output."""
    model = tiny_model()
    out = model.generate(input_ids=SOURCE[:1], num_beams=3, num_return_sequences=3, max_new_tokens=4,
                         logits_processor=LogitsProcessorList([OnlyTokens([EOS])]), return_dict_in_generate=True,
                         output_sequence_scores=True)  # fmt: skip
    assert out.sequences[0].tolist() == [model.config.decoder_start_token_id, EOS]
    assert torch.isfinite(out.sequences_scores[0])
    assert out.sequences_scores[1:].tolist() == [float("-inf")] * 2


@pytest.mark.parametrize("graph_decoding", [False, True])
def test_both_batching_policies_run_the_one_beam_step(graph_decoding, monkeypatch):
    """The eager search and the static-shape search (its CPU stand-in for a CUDA graph) both step `BeamStep`, so a
    change to the step reaches both: a step that records its calls sees each search's steps."""
    calls = []
    advance = search_vaswani.BeamStep.advance
    monkeypatch.setattr(search_vaswani.BeamStep, "advance", lambda self, *a: calls.append(a[0]) or advance(self, *a))
    model = tiny_model()
    model.generate(input_ids=SOURCE, attention_mask=SOURCE.ne(0).long(), num_beams=3, max_new_tokens=4,
                   min_new_tokens=4, graph_decoding=graph_decoding)  # fmt: skip
    assert len(calls) >= 4


class Scores(LogitsProcessor):
    """Gives one token a score of the caller's choosing (+inf to force it, NaN by a bug)."""

    def __init__(self, token: int, value: float):
        self.token, self.value = token, value

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.token] = self.value
        return scores


def test_a_processor_s_inf_forces_its_token_and_its_nan_is_impossible_never_an_empty_translation():
    """+inf meets the idle beams' -inf (NaN): the beam search returned an empty translation scored -inf where
    Transformers and greedy take the token. Now NaN scores no candidate: +inf takes its token, as Transformers does;
    a processor's NaN makes its token impossible (Transformers returns the NaN token and a NaN score)."""
    model = tiny_model()
    for paper in (True, False):
        kwargs = {} if paper else dict(length_penalty_type="hf", max_length_offset=None, max_new_tokens=4)
        forced = model.generate(input_ids=SOURCE[:1], num_beams=3, output_sequence_scores=True,
                                logits_processor=LogitsProcessorList([Scores(7, float("inf"))]), **kwargs)  # fmt: skip
        assert forced.sequences[0, 1] == 7 and forced.sequences_scores[0] == float("inf")
        nan = model.generate(input_ids=SOURCE[:1], num_beams=3, output_sequence_scores=True,
                             logits_processor=LogitsProcessorList([Scores(7, float("nan"))]), **kwargs)  # fmt: skip
        assert 7 not in nan.sequences[0].tolist() and torch.isfinite(nan.sequences_scores).all()
        assert nan.sequences.shape[1] > 1


def test_an_empty_batch_is_refused_as_transformers_refuses_it():
    with pytest.raises(ValueError, match="non-empty batch"):
        tiny_model().generate(input_ids=torch.zeros((0, 3), dtype=torch.long), num_beams=3)


def teacher_forced_log_probs(model, source: torch.Tensor, sequences: torch.Tensor) -> torch.Tensor:
    """Each returned token's log-probability given the ones before it (rows x tokens; 0 after a row's EOS)."""
    rows = sequences.shape[0] // source.shape[0]
    source = source.repeat_interleave(rows, dim=0)
    with torch.no_grad():
        logits = model(input_ids=source, attention_mask=source.ne(0).long(), decoder_input_ids=sequences[:, :-1]).logits
    tokens = sequences[:, 1:]
    taken = logits.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
    after_eos = (tokens == EOS).long().cumsum(-1) - (tokens == EOS).long() > 0
    return taken.masked_fill(after_eos, 0.0)


@pytest.mark.parametrize("graph_decoding", [False, True])
def test_forced_eos_score_model_pays_the_capped_eos_log_probability_as_fairseq(graph_decoding):
    """At the length cap fairseq's SequenceGenerator leaves `</s>` alone possible with the model's own log-probability
    of it, where Transformers' `forced_eos_token_id` scores it 0: with `forced_eos_score="model"` a hypothesis cut at
    the cap scores its tokens' log-probabilities, the forced EOS's included, over its length (fairseq's score), so
    a looping hypothesis cannot outrank an ended one for free; the default stays Transformers'. Random weights run
    every row to the cap of 4 tokens."""
    model = tiny_model()
    kwargs = dict(input_ids=SOURCE, attention_mask=SOURCE.ne(0).long(), num_beams=3, num_return_sequences=3,
                  max_new_tokens=4, forced_eos_token_id=EOS, length_penalty=1.0, length_penalty_type="hf",
                  max_length_offset=None, output_sequence_scores=True, graph_decoding=graph_decoding)  # fmt: skip
    fairseq, transformers = model.generate(**kwargs, forced_eos_score="model"), model.generate(**kwargs)
    for out, counts_eos in ((fairseq, True), (transformers, False)):
        assert out.sequences.shape[1] == 5 and (out.sequences[:, -1] == EOS).all()  # every row cut at the cap
        taken = teacher_forced_log_probs(model, SOURCE, out.sequences)
        total = taken.sum(-1) if counts_eos else taken[:, :-1].sum(-1)
        torch.testing.assert_close(out.sequences_scores, total / 4)
    theirs = GenerationMixin.generate(model, **{k: v for k, v in kwargs.items() if k not in (
        "length_penalty_type", "max_length_offset", "output_sequence_scores", "graph_decoding")},
        return_dict_in_generate=True, output_scores=True)  # fmt: skip
    torch.testing.assert_close(transformers.sequences_scores, theirs.sequences_scores)
    with pytest.raises(ValueError, match="forced_eos_score must be one of"):
        model.generate(**kwargs, forced_eos_score="fairseq")


@pytest.mark.parametrize("graph_decoding", [False, True])
@pytest.mark.parametrize("cap", [1, 2])
def test_forced_eos_score_model_wins_over_a_minimum_length_at_the_cap(graph_decoding, cap):
    """A minimum length that reaches the cap (`--decoding fairseq` asks for one token at least, so
    `max_new_tokens=1` does) forbids EOS there; the cap's EOS still ends every row, with the model's score of it
    (fairseq asserts min_len <= max_len and scores that EOS), not the forbidding rule's -inf, which had made every
    token impossible and returned EOS first with -inf scores."""
    model = tiny_model()
    kwargs = dict(input_ids=SOURCE, attention_mask=SOURCE.ne(0).long(), num_beams=3, max_new_tokens=cap,
                  min_new_tokens=cap, forced_eos_token_id=EOS, length_penalty=1.0, length_penalty_type="hf",
                  max_length_offset=None, output_sequence_scores=True, graph_decoding=graph_decoding)  # fmt: skip
    fairseq, transformers = model.generate(**kwargs, forced_eos_score="model"), model.generate(**kwargs)
    torch.testing.assert_close(fairseq.sequences, transformers.sequences)
    assert fairseq.sequences.shape[1] == cap + 1 and (fairseq.sequences[:, -1] == EOS).all()
    taken = teacher_forced_log_probs(model, SOURCE, fairseq.sequences)
    torch.testing.assert_close(fairseq.sequences_scores, taken.sum(-1) / cap)


def test_the_fairseq_preset_passed_to_generate_forces_eos_at_the_cap_as_fairseq():
    """`DECODING_PRESETS["fairseq"]` in a user's generate() call, on a model whose generation config forces no EOS:
    fairseq's search ends every hypothesis with </s> at the cap and scores it, so `forced_eos_score="model"` forces
    the model's EOS there (the same as naming `forced_eos_token_id`), not a row run on without it."""
    from vaswani_hf.model.search_vaswani import DECODING_PRESETS

    model = tiny_model()
    assert model.generation_config.forced_eos_token_id is None
    kwargs = dict(input_ids=SOURCE, attention_mask=SOURCE.ne(0).long(), output_sequence_scores=True)
    preset = {**DECODING_PRESETS["fairseq"], "max_length": 5}
    out = model.generate(**kwargs, **preset)
    named = model.generate(**kwargs, **preset, forced_eos_token_id=EOS)
    assert out.sequences.shape[1] == 5 and (out.sequences[:, -1] == EOS).all()
    torch.testing.assert_close(out.sequences_scores, named.sequences_scores)


def test_forced_eos_score_model_forces_the_calls_own_eos_or_none_when_asked():
    """The EOS forced at the cap under `forced_eos_score="model"` is the call's own `eos_token_id` (not the model's
    when the call names another), and `forced_eos_token_id=None` passed by name forces none."""
    model = tiny_model()
    kwargs = dict(input_ids=SOURCE, attention_mask=SOURCE.ne(0).long(), num_beams=1, max_new_tokens=4,
                  max_length_offset=None, forced_eos_score="model")  # fmt: skip
    assert (model.generate(**kwargs, eos_token_id=9)[:, -1] == 9).all()
    plain = model.generate(**{**kwargs, "forced_eos_score": "zero"})
    assert torch.equal(model.generate(**kwargs, forced_eos_token_id=None), plain)
