"""Lexically constrained decoding as a hook on the one beam step (`lexical_vaswani.PhraseBanks`), over its whole space
(Hypothesis): vocabularies, phrases (none, one token, several, sharing first tokens, repeated), word boundaries,
beams, n-best, batches of several lengths, target prefixes, the paper's length rules, a caller's processors. It is
held to the search it replaced, Post & Vilar's allocation written per sentence in Python one hypothesis at a time
(tests/reference/constrained_search.py): the same hypotheses, in the same order, with the same scores.

The reference sums scores in float32 as the tensor search does, so tokens are compared exactly unless two
hypotheses tie within rounding (`same_hypotheses`)."""

from __future__ import annotations

import math
import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessorList

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.model import generation_vaswani, search_vaswani
from vaswani_hf.model.lexical_vaswani import LexicalConstraints

from .reference.constrained_search import PhraseConstraints, constrained_beam_search
from .test_search_properties import FAST_TIER, PossibleColumns, Tilt, hypothesis, same_hypotheses

EOS, UNK = 2, 3


@st.composite
def constrained_searches(draw):
    vocab = draw(st.integers(16, 64))  # the reference takes 2 x beams candidates a row: no fewer columns
    config = VaswaniConfig.tiny(vocab_size=vocab, d_model=8, encoder_attention_heads=1, decoder_attention_heads=1,
                                encoder_ffn_dim=16, decoder_ffn_dim=16, encoder_layers=1, decoder_layers=1,
                                output_bias=True)  # fmt: skip
    torch.manual_seed(draw(st.integers(0, 2**16)))
    model = VaswaniForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias[EOS] = draw(st.floats(0.0, 3.0))
    beams = draw(st.integers(2, 8))
    batch = draw(st.integers(1, 4))
    sources = [draw(st.lists(st.integers(4, vocab - 1), min_size=1, max_size=7)) for _ in range(batch)]
    token = st.integers(4, vocab - 1)
    phrase = st.lists(token, min_size=1, max_size=3)
    phrases = [draw(st.lists(phrase, max_size=3)) for _ in range(batch)]
    if not any(phrases):
        phrases[0] = [draw(phrase)]
    kwargs = dict(num_beams=beams, num_return_sequences=draw(st.integers(1, beams)),
                  length_penalty=draw(st.sampled_from([0.0, 0.6, 1.0])), length_penalty_type="gnmt",
                  early_stopping=draw(st.sampled_from([True, False, "never"])),
                  min_new_tokens=draw(st.integers(0, 2)), max_length_offset=draw(st.integers(1, 6)),
                  force_words=phrases, return_dict_in_generate=True, output_sequence_scores=True)  # fmt: skip
    if draw(st.booleans()):
        kwargs["word_start_ids"] = draw(st.lists(token, unique=True, max_size=vocab // 2))
    if draw(st.booleans()):
        kwargs["target_prefix"] = [draw(st.lists(token, max_size=2)) for _ in range(batch)]
    processors = []
    if draw(st.booleans()):
        processors.append(PossibleColumns([EOS, *draw(st.lists(token, min_size=1, max_size=vocab // 2))], vocab))
    if draw(st.booleans()):
        processors.append(Tilt(draw(st.floats(0.5, 2.0))))
    if processors:
        kwargs["logits_processor"] = LogitsProcessorList(processors)
    return model, sources, kwargs


def decode(model, sources, kwargs, monkeypatch, reference: bool) -> list[tuple[list[int], float]]:
    def search(decoding, state):
        if decoding.constraints is None:
            return search_vaswani.beam_search(decoding, state)
        result = constrained_beam_search(decoding, state)
        # a sentence with fewer possible hypotheses than it returns: the rest are none, -inf as the tensor search
        # scores them (the reference left them at 0)
        result["scores"] = result["scores"].masked_fill(result["lengths"] == 0, -math.inf)
        return result

    longest = max(map(len, sources))
    ids = torch.tensor([s + [0] * (longest - len(s)) for s in sources])
    mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in sources])
    with monkeypatch.context() as patch:
        if reference:
            patch.setattr(generation_vaswani, "beam_search", search)
        out = model.generate(input_ids=ids, attention_mask=mask, cpu_fast_paths=False, **kwargs)
    scores = out.sequences_scores.tolist()
    return [(hypothesis(row, model.config), score) for row, score in zip(out.sequences.tolist(), scores, strict=True)]


def holds_to_the_reference(case, monkeypatch) -> None:
    model, sources, kwargs = case
    same_hypotheses(decode(model, sources, kwargs, monkeypatch, reference=False),
                    decode(model, sources, kwargs, monkeypatch, reference=True))  # fmt: skip


@given(case=constrained_searches())
@FAST_TIER
def test_the_banks_in_tensors_are_post_and_vilars_allocation(case, monkeypatch):
    holds_to_the_reference(case, monkeypatch)


# The second tier's draws here: each constrained search is decoded twice (ours, the reference's per-sentence Python
# search), 0.2-0.8 s a case on 2 cores; 1,500 cases (the search properties' depth then) took 6 and 19 minutes of CI on
# the Zen 3, past the hour `.ci/run` keeps to. The fast tier draws its own cases at every run besides.
CONSTRAINED_SECOND_TIER = settings(
    max_examples=400, deadline=None, suppress_health_check=FAST_TIER.suppress_health_check
)
OVERLAPPING_SECOND_TIER = settings(
    max_examples=150, deadline=None, suppress_health_check=FAST_TIER.suppress_health_check
)


@given(case=constrained_searches())
@CONSTRAINED_SECOND_TIER
def test_the_banks_in_tensors_are_post_and_vilars_allocation_deeper(case, monkeypatch):
    holds_to_the_reference(case, monkeypatch)


@given(
    phrases=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=3), min_size=1, max_size=3),
    tokens=st.lists(st.integers(0, 7), max_size=12),
    boundaries=st.none() | st.frozensets(st.integers(0, 7)),
)
@settings(max_examples=300, deadline=None)
def test_each_hypothesis_state_follows_the_phrases_as_the_reference_does(phrases, tokens, boundaries):
    """One hypothesis' progress through its phrases, token by token: phrase met, under way, started over."""
    spec = LexicalConstraints((tuple(map(tuple, phrases)),), boundaries)
    banks = spec.banks(1, 8, torch.tensor([EOS]), torch.device("cpu"))
    reference = PhraseConstraints(spec.phrases[0], boundaries=boundaries)
    state = banks.met, banks.phrase, banks.matched
    for token in tokens:
        reference = reference.advance(token)
        state = banks._advance(*state, torch.tensor([[token]]))
        met, phrase, matched = state
        assert met[0, 0].tolist()[: len(phrases)] == list(reference.met)
        progress = None if int(phrase) < 0 else (int(phrase), int(matched))
        assert progress == reference.progress
        assert bool(banks._done(*state)) == reference.done
        assert int(banks._bank(*state)) == reference.tokens_met
        wanted = reference.next_tokens()
        expected = sorted(wanted)
        assert expected == sorted(set(wanted_tokens(banks, state)))


def wanted_tokens(banks, state) -> list[int]:
    banks.met, banks.phrase, banks.matched = state
    values = torch.zeros(1, 1)
    _, token_ids = banks.propose(torch.zeros(1, 8), values, torch.full((1, 1), -5))
    return [t for t, v in zip(token_ids[0, 1:].tolist(), _[0, 1:].tolist(), strict=True) if v > -1e30]


def test_a_phrase_shared_by_every_example_and_a_random_batch_decode_as_each_alone():
    """Sentences leaving the batch take their constraint states with them: a batch gives each sentence's own."""
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=40)).eval()
    rng = random.Random(0)
    sources = [[rng.randrange(4, 40) for _ in range(rng.randint(2, 7))] for _ in range(5)]
    phrases = [[[rng.randrange(4, 40) for _ in range(rng.randint(1, 2))]] for _ in range(5)]
    together = decode_plain(model, sources, phrases)
    alone = [
        hyp for source, phrase in zip(sources, phrases, strict=True) for hyp in decode_plain(model, [source], [phrase])
    ]
    same_hypotheses(together, alone)


def decode_plain(model, sources, phrases):
    longest = max(map(len, sources))
    ids = torch.tensor([s + [0] * (longest - len(s)) for s in sources])
    mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in sources])
    out = model.generate(input_ids=ids, attention_mask=mask, force_words=phrases, num_return_sequences=2,
                         output_sequence_scores=True)  # fmt: skip
    return [
        (hypothesis(row, model.config), s)
        for row, s in zip(out.sequences.tolist(), out.sequences_scores.tolist(), strict=True)
    ]


def test_constrained_results_carry_per_step_scores_that_add_up_to_their_scores():
    """The banks follow the step's indices as the beams do, so `beam_indices` and the per-step scores of a
    constrained search are Transformers' kind: each hypothesis' transition scores add up to its score."""
    from vaswani_hf.model.search_vaswani import gnmt_length_penalty

    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=60)).eval()
    ids = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    out = model.generate(input_ids=ids, attention_mask=ids.ne(0).long(), force_words=[[[11, 12]], [[30]]],
                         num_return_sequences=2, output_scores=True, return_dict_in_generate=True,
                         max_length_offset=8)  # fmt: skip
    assert all(
        contains(row, phrase) for row, phrase in zip(out.sequences.tolist(), [[11, 12]] * 2 + [[30]] * 2, strict=True)
    )
    transitions = model.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    lengths = (out.beam_indices >= 0).sum(-1).float()
    torch.testing.assert_close(transitions.sum(-1) / gnmt_length_penalty(lengths, 0.6), out.sequences_scores)


def contains(sequence: list[int], phrase: list[int]) -> bool:
    return any(sequence[i : i + len(phrase)] == phrase for i in range(len(sequence) - len(phrase) + 1))


@st.composite
def overlapping_searches(draw):
    """Phrases over three tokens (shared first tokens, phrases inside phrases, a phrase overlapping itself), outputs
    that can only use those tokens and EOS, and word starts drawn among them, never EOS."""
    vocab = 16
    config = VaswaniConfig.tiny(vocab_size=vocab, d_model=8, encoder_attention_heads=1, decoder_attention_heads=1,
                                encoder_ffn_dim=16, decoder_ffn_dim=16, encoder_layers=1, decoder_layers=1,
                                output_bias=True)  # fmt: skip
    torch.manual_seed(draw(st.integers(0, 2**16)))
    model = VaswaniForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias[EOS] = draw(st.floats(0.0, 2.0))
    alphabet = [5, 6, 7]
    batch = draw(st.integers(1, 3))
    sources = [draw(st.lists(st.integers(4, vocab - 1), min_size=1, max_size=5)) for _ in range(batch)]
    phrase = st.lists(st.sampled_from(alphabet), min_size=1, max_size=3)
    phrases = [draw(st.lists(phrase, min_size=1, max_size=3)) for _ in range(batch)]
    beams = draw(st.integers(2, 6))
    kwargs = dict(num_beams=beams, num_return_sequences=draw(st.integers(1, beams)),
                  length_penalty=draw(st.sampled_from([0.0, 0.6, 1.0])), length_penalty_type="gnmt",
                  early_stopping=draw(st.sampled_from([True, False, "never"])),
                  max_length_offset=draw(st.integers(2, 6)),
                  force_words=phrases, return_dict_in_generate=True, output_sequence_scores=True,
                  logits_processor=LogitsProcessorList([PossibleColumns([EOS, *alphabet, 8], vocab)]))  # fmt: skip
    if draw(st.booleans()):
        kwargs["word_start_ids"] = draw(st.lists(st.sampled_from([*alphabet, 8]), unique=True, max_size=3))
    if draw(st.booleans()):
        kwargs["target_prefix"] = [draw(st.lists(st.sampled_from(alphabet), max_size=2)) for _ in range(batch)]
    return model, sources, kwargs


@given(case=overlapping_searches())
@settings(max_examples=8, deadline=None, suppress_health_check=FAST_TIER.suppress_health_check)
def test_overlapping_phrases_and_word_ends_follow_the_reference(case, monkeypatch):
    holds_to_the_reference(case, monkeypatch)


@given(case=overlapping_searches())
@OVERLAPPING_SECOND_TIER
def test_overlapping_phrases_and_word_ends_follow_the_reference_deeper(case, monkeypatch):
    holds_to_the_reference(case, monkeypatch)


def states_after(phrases, tokens, boundaries=None):
    spec = LexicalConstraints((tuple(map(tuple, phrases)),), boundaries)
    banks = spec.banks(1, 16, torch.tensor([EOS]), torch.device("cpu"))
    state = banks.met, banks.phrase, banks.matched
    for token in tokens:
        state = banks._advance(*state, torch.tensor([[token]]))
    return banks, state


def test_phrases_sharing_a_first_token_are_each_followed():
    """`5 7` meets [5, 7] though [5, 6] also begins with 5; then `5 6` meets the other."""
    banks, (met, _, _) = states_after([[5, 6], [5, 7]], [5, 7])
    assert met[0, 0].tolist() == [False, True]
    banks, (met, _, _) = states_after([[5, 6], [5, 7]], [5, 7, 5, 6])
    assert met[0, 0].tolist() == [True, True]
    banks, (met, _, _) = states_after([[5, 6], [6, 7]], [5, 6, 7])  # a phrase that begins where one ends
    assert met[0, 0].tolist() == [True, True]


def test_a_phrase_overlapping_itself_is_found():
    banks, (met, _, _) = states_after([[5, 5, 6]], [5, 5, 5, 6])
    assert met[0, 0].tolist() == [True]
    banks, (met, _, _) = states_after([[5, 6, 5, 7]], [5, 6, 5, 6, 5, 7])
    assert met[0, 0].tolist() == [True]


def test_a_met_phrase_is_not_forced_again():
    """With [5, 7] already in the prefix, the search forces [5, 6] alone: `5 7` appears once."""
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=40)).eval()
    out = model.generate(input_ids=torch.tensor([[9, 10, 11, EOS]]), force_words=[[[5, 6], [5, 7]]],
                         target_prefix=[[5, 7]], num_beams=4, max_length_offset=6)  # fmt: skip
    tokens = out[0].tolist()
    assert contains(tokens, [5, 6]) and sum(tokens[i : i + 2] == [5, 7] for i in range(len(tokens))) == 1


def test_eos_ends_the_word_of_a_phrase_when_the_word_starts_omit_it():
    """A direct generate() call whose `word_start_ids` leave out EOS: `5 </s>` meets [5] (the output ends, so does
    its last word), and, far the likeliest, is the best hypothesis, before `5 9 </s>` (9 begins a word)."""
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=40, output_bias=True)).eval()
    with torch.no_grad():
        model.final_logits_bias[EOS], model.final_logits_bias[9] = 12.0, 9.0
    out = model.generate(input_ids=torch.tensor([[9, 10, 11, EOS]]), force_words=[[[5]]], target_prefix=[[5]],
                         word_start_ids=[9, 12], num_beams=3, num_return_sequences=3, max_length_offset=4,
                         return_dict_in_generate=True, output_sequence_scores=True)  # fmt: skip
    assert out.sequences[0, 1:3].tolist() == [5, EOS]
    assert out.sequences_scores[0] == out.sequences_scores.max()
    banks, state = states_after([[5]], [5], boundaries=frozenset({9}))
    assert bool(banks._done(*banks._advance(*state, torch.tensor([[EOS]]), torch.tensor([[True]]))))
