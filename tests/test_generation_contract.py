"""generate() keeps Transformers' whole contract: every GenerationConfig mode, logits processor and output option
gives, on a converted Marian, what Marian's own `generate()` gives (sequences exactly, floats to 1e-5), or both
raise and ours names the option.

Decoding runs with `length_penalty_type="hf", max_length_offset=None`, so Transformers' results are the oracle;
some cases run in our decoder (greedy, beam search and their outputs), the others are handed to Transformers'
loop (generation_vaswani.py), which must then drive our forward pass exactly as it drives Marian's.
"""

import copy

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.model.search_vaswani import gnmt_length_penalty

from .test_decoding_parity import EOS, PAD, padded_batch, random_pair

HF = dict(length_penalty_type="hf", max_length_offset=None)
DICT = dict(return_dict_in_generate=True)


class HalveAndTilt(LogitsProcessor):
    """A user's processor that reads the prefix length, so a wrong `input_ids` shows."""

    def __call__(self, input_ids, scores):
        return scores / 2 + input_ids.shape[1] * 0.01


class StopAtFour(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 4, dtype=torch.bool)


class Collect(BaseStreamer):
    def __init__(self):
        self.items = []

    def put(self, value):
        self.items.append(value.clone())

    def end(self):
        self.items.append(None)


CASES = {
    "greedy": dict(num_beams=1),
    "beam": dict(num_beams=3),
    "beam, num_return_sequences": dict(num_beams=4, num_return_sequences=3),
    "beam, early_stopping never": dict(num_beams=3, early_stopping="never", length_penalty=1.5),
    "sampling, top-k, top-p, temperature": dict(do_sample=True, top_k=50, top_p=0.9, temperature=0.7),
    "sampling, num_return_sequences": dict(do_sample=True, num_return_sequences=3),
    "beam sampling": dict(do_sample=True, num_beams=3),
    "typical_p": dict(do_sample=True, typical_p=0.9),
    "epsilon_cutoff": dict(do_sample=True, epsilon_cutoff=3e-4),
    "eta_cutoff": dict(do_sample=True, eta_cutoff=3e-4),
    "min_p": dict(do_sample=True, min_p=0.05),
    "watermarking": dict(do_sample=True, watermarking_config={"bias": 2.0}),
    "repetition_penalty": dict(num_beams=3, repetition_penalty=1.3),
    "encoder_repetition_penalty": dict(num_beams=1, encoder_repetition_penalty=1.3),
    "no_repeat_ngram_size": dict(num_beams=3, no_repeat_ngram_size=2),
    "encoder_no_repeat_ngram_size": dict(num_beams=3, encoder_no_repeat_ngram_size=2),
    "bad_words_ids": dict(num_beams=3, bad_words_ids=[[5], [7, 8]]),
    "min_length": dict(num_beams=3, min_length=6),
    "min_new_tokens": dict(num_beams=1, min_new_tokens=5),
    "forced_bos_token_id": dict(num_beams=3, forced_bos_token_id=9),
    "forced_eos_token_id": dict(num_beams=3, forced_eos_token_id=EOS),
    "suppress_tokens": dict(num_beams=3, suppress_tokens=[3, 4, 5]),
    "begin_suppress_tokens": dict(num_beams=3, begin_suppress_tokens=[3, 4]),
    "sequence_bias": dict(num_beams=3, sequence_bias={(5,): 3.0, (6, 7): -2.0}),
    "exponential_decay_length_penalty": dict(num_beams=3, exponential_decay_length_penalty=(3, 1.5)),
    "renormalize_logits": dict(num_beams=3, renormalize_logits=True, bad_words_ids=[[5]]),
    "remove_invalid_values": dict(num_beams=3, remove_invalid_values=True),
    "max_time": dict(num_beams=3, max_time=30.0),
    "use_cache False": dict(num_beams=3, use_cache=False),
    "static cache, beam": dict(num_beams=3, cache_implementation="static"),
    "static cache, greedy": dict(num_beams=1, cache_implementation="static"),
    "beam, output_scores": dict(num_beams=3, output_scores=True, **DICT),
    "beam, output_scores and output_logits": dict(num_beams=3, output_scores=True, output_logits=True, **DICT),
    "beam, num_return_sequences, scores": dict(num_beams=4, num_return_sequences=2, output_scores=True, **DICT),
    "greedy, output_scores and output_logits": dict(num_beams=1, output_scores=True, output_logits=True, **DICT),
    "sampling, output_scores and output_logits": dict(do_sample=True, output_scores=True, output_logits=True, **DICT),
    "beam, attentions and hidden states": dict(num_beams=3, output_attentions=True, output_hidden_states=True, **DICT),
    "greedy, attentions and hidden states": dict(num_beams=1, output_attentions=True, output_hidden_states=True,
                                                 **DICT),
    "custom logits processor, beam": dict(num_beams=3, logits_processor=[HalveAndTilt()]),
    "custom logits processor, greedy": dict(num_beams=1, logits_processor=[HalveAndTilt()]),
    "custom stopping criteria": dict(num_beams=3, stopping_criteria=[StopAtFour()]),
    "decoder_input_ids prefix, beam": dict(num_beams=3, decoder_input_ids=[[PAD, 5, 6]] * 3),
    "decoder_input_ids prefix, greedy": dict(num_beams=1, decoder_input_ids=[[PAD, 5, 6]] * 3),
    "encoder_outputs, beam": dict(num_beams=3, encoder_outputs=True),
    "encoder_outputs, greedy": dict(num_beams=1, encoder_outputs=True),
}  # fmt: skip
# Both raise: Transformers moved these out of the library (Hub `custom_generate` repositories) or needs a tokenizer.
# (Its constrained beam search, `force_words_ids`, runs in our own search: tests/test_translation_features.py.)
BOTH_RAISE = {
    "group beam search": (dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5), "Group Beam Search"),
    "DoLa": (dict(num_beams=1, dola_layers="low"), "Dola"),
    "low_memory": (dict(num_beams=3, low_memory=True), "low_memory"),
    "stop_strings without tokenizer": (dict(num_beams=1, stop_strings=["x"]), "tokenizer"),
}


@pytest.fixture(scope="module")
def pair():
    marian, vaswani = random_pair(5)
    input_ids, attention_mask = padded_batch(5, batch=3)
    return marian, vaswani, input_ids, attention_mask


def call(model, kwargs: dict, input_ids, attention_mask, **extra):
    kwargs = dict(kwargs)
    if kwargs.pop("encoder_outputs", None):  # each model's own encoder; Marian's generate() expands it in place
        kwargs["encoder_outputs"] = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    if "decoder_input_ids" in kwargs:
        kwargs["decoder_input_ids"] = torch.tensor(kwargs["decoder_input_ids"])
    for name, wrapper in (("logits_processor", LogitsProcessorList), ("stopping_criteria", StoppingCriteriaList)):
        if name in kwargs:
            kwargs[name] = wrapper(kwargs[name])
    torch.manual_seed(0)  # sampling draws the same numbers when the probabilities are the same
    return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=9, **kwargs, **extra)


def assert_same_output(ours, theirs, path="output"):
    """Every field of two generate() results: integer tensors equal, floats to 1e-5 (-inf where the other's is)."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and ours.shape == theirs.shape, (path, ours, theirs.shape)
        if theirs.dtype.is_floating_point:
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5, msg=path)
        else:
            assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), path
    elif isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs), (path, ours)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same_output(a, b, f"{path}[{i}]")
    elif hasattr(theirs, "keys"):
        fields = (set(theirs.keys()) | set(ours.keys())) - {"cache", "past_key_values"}
        for name in fields:
            assert_same_output(ours.get(name), theirs.get(name), f"{path}.{name}")
    else:
        assert ours == theirs, (path, ours, theirs)


@pytest.mark.parametrize("case", list(CASES))
def test_generate_equals_transformers(pair, case):
    marian, vaswani, input_ids, attention_mask = pair
    theirs = call(marian, CASES[case], input_ids, attention_mask)
    ours = call(vaswani, CASES[case], input_ids, attention_mask, **HF)
    assert_same_output(ours, theirs)


@pytest.mark.parametrize("case", list(BOTH_RAISE))
def test_options_transformers_refuses_are_refused_naming_them(pair, case):
    marian, vaswani, input_ids, attention_mask = pair
    kwargs, named = BOTH_RAISE[case]
    with pytest.raises(ValueError, match=named):
        call(marian, kwargs, input_ids, attention_mask)
    with pytest.raises(ValueError, match=named):
        call(vaswani, kwargs, input_ids, attention_mask, **HF)


def test_guidance_scale_is_refused_naming_it(pair):
    # Transformers' classifier-free guidance reruns the model without its encoder inputs: Marian fails deep inside
    _, vaswani, input_ids, attention_mask = pair
    with pytest.raises(ValueError, match="guidance_scale=1.5 .* decoder-only"):
        call(vaswani, dict(guidance_scale=1.5), input_ids, attention_mask)


def test_streamer_receives_what_transformers_streams(pair):
    marian, vaswani, input_ids, attention_mask = pair
    theirs, ours = Collect(), Collect()
    call(marian, dict(num_beams=1, streamer=theirs), input_ids[:1], attention_mask[:1])
    call(vaswani, dict(num_beams=1, streamer=ours), input_ids[:1], attention_mask[:1], **HF)
    assert len(ours.items) == len(theirs.items) > 2
    for a, b in zip(ours.items, theirs.items, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("seed", range(8))
def test_transition_scores_equal_transformers(seed):
    # `compute_transition_scores` reads the per-step scores through `beam_indices`; sentences leave our batch early
    marian, vaswani = random_pair(seed)
    input_ids, attention_mask = padded_batch(seed, batch=4)
    num_beams = 2 + seed % 4
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=5 + seed % 9,
                  num_beams=num_beams, num_return_sequences=1 + seed % num_beams, output_scores=True,
                  early_stopping=[True, False, "never"][seed % 3], length_penalty=[1.0, 0.6, -0.5][seed % 3],
                  return_dict_in_generate=True)  # fmt: skip
    theirs = marian.generate(**kwargs)
    ours = vaswani.generate(**kwargs, **HF)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert torch.equal(ours.beam_indices, theirs.beam_indices)
    expected = marian.compute_transition_scores(theirs.sequences, theirs.scores, theirs.beam_indices)
    got = vaswani.compute_transition_scores(ours.sequences, ours.scores, ours.beam_indices)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_transition_scores_add_up_to_the_paper_beam_score():
    # the paper's decoding (GNMT penalty, source + 50), which Transformers cannot run: a hypothesis's score is its
    # log-probability, the sum of its transition scores, over ((5 + |Y|) / 6) ** alpha
    _, vaswani = random_pair(3, paper_decoding=True)
    input_ids, attention_mask = padded_batch(7, batch=5)
    out = vaswani.generate(input_ids=input_ids, attention_mask=attention_mask, output_scores=True,
                           return_dict_in_generate=True, num_return_sequences=2)  # fmt: skip
    transitions = vaswani.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    lengths = (out.beam_indices >= 0).sum(-1)
    alpha = vaswani.generation_config.length_penalty
    expected = transitions.sum(-1) / gnmt_length_penalty(lengths.float(), alpha)
    torch.testing.assert_close(out.sequences_scores, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs", [{}, {"num_beams": 1}, {"do_sample": True, "num_beams": 1}])
def test_learned_positions_cut_the_limit_after_a_decoder_prefix(kwargs):
    # a prefix of P tokens uses P positions of the table before the first new token: the source + 50 limit is cut
    # at the table minus the prefix, in our decoder and in Transformers' loop alike
    torch.manual_seed(0)
    config = VaswaniConfig.tiny(position_embedding_type="learned", max_position_embeddings=20)
    model = VaswaniForConditionalGeneration(config).eval()
    source = torch.randint(4, 99, (2, 15))
    prefix = torch.tensor([[config.decoder_start_token_id, 5, 6, 7]] * 2)
    out = model.generate(source, decoder_input_ids=prefix, suppress_tokens=[config.eos_token_id], **kwargs)
    assert out.shape[1] == 1 + 20 and torch.equal(out[:, :4], prefix)
    with pytest.raises(ValueError, match="decoder prompt of 4 need 22 decoder positions.*max_new_tokens=17"):
        model.generate(source, decoder_input_ids=prefix, max_new_tokens=19, **kwargs)
    with pytest.raises(ValueError, match="decoder prefix has 21 tokens"):
        model.generate(source, decoder_input_ids=torch.ones(2, 21, dtype=torch.long), **kwargs)


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize("length", [{"max_length": 9}, {"max_new_tokens": 6}])
def test_a_generation_configs_length_wins_over_source_plus_50_as_the_keyword_does(num_beams, length):
    """`generate(generation_config=GenerationConfig(max_length=...))` is Transformers' way to ask for a length, as
    the keyword is: both end at it. The paper's source + 50 applies where neither asks (or the config passed is the
    model's own, as a pipeline passes a copy of it)."""
    from transformers import GenerationConfig

    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=100, eos_token_id=99)).eval()  # no EOS
    source = torch.randint(4, 90, (2, 12))
    asked = model.generate(source, num_beams=num_beams, **length)
    configured = model.generate(source, generation_config=GenerationConfig(num_beams=num_beams, **length))
    assert torch.equal(configured, asked)
    assert asked.shape[1] == length.get("max_length", 1 + length.get("max_new_tokens", 0))
    paper = model.generate(source, generation_config=copy.deepcopy(model.generation_config), num_beams=num_beams)
    assert paper.shape[1] == 1 + 12 + 50  # the model's own config: source + 50, as with no config at all
