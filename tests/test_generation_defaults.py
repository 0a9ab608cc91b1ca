"""generate() where the caller leaves settings out, held to Transformers' own loop (`GenerationMixin.generate` on
the same model) and to Marian on the same weights: no `attention_mask` beside padded `input_ids`, no length
anywhere, `min_new_tokens` beside `min_length`, and a caller's logits processor that knows which row is which
example. Every path of ours (the eager search with the CPU fast products on and off, the static-shape search, the
modes handed to Transformers' loop) must give the loop's tokens."""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers import (
    GenerationMixin,
    LogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

from .test_decoding_parity import EOS, PAD, padded_batch, random_pair

# every path of ours: the eager search with and without the CPU fast products, and the static-shape search
PATHS = [dict(cpu_fast_paths=True), dict(cpu_fast_paths=False), dict(graph_decoding=True)]


def transformers_loop(model, *args, **kwargs):
    """Transformers' own generate() on the same model, without our extra settings."""
    return GenerationMixin.generate(model, *args, **kwargs)


def varied_model(seed: int = 0, **overrides) -> VaswaniForConditionalGeneration:
    """A tiny model whose tokens vary with the source (weights far from the tiny initialisation's), EOS now and then."""
    torch.manual_seed(seed)
    config = VaswaniConfig.tiny(vocab_size=40, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                decoder_start_token_id=1, output_bias=True, **overrides)  # fmt: skip
    model = VaswaniForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.4)
    return model


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("path", PATHS, ids=["fast", "plain", "static"])
def test_padded_input_ids_without_a_mask_decode_as_transformers_loop(num_beams, path, caplog):
    """Transformers' loop infers no mask for an encoder-decoder (its `_prepare_attention_mask_for_generation` runs
    for decoder-only models alone): the encoder attends to the padding. Our search once inferred one from the pad
    id, so the model decoded differently from Marian, from the loop, and from itself with a no-op
    `sequence_bias` (which hands the call to the loop). Every path now decodes as the loop, and says why once."""
    marian, model = random_pair(3)
    input_ids, _ = padded_batch(3)
    assert bool((input_ids == PAD).any())
    settings = dict(num_beams=num_beams, max_new_tokens=12, length_penalty_type="hf", max_length_offset=None)
    loop = transformers_loop(model, input_ids, num_beams=num_beams, max_new_tokens=12)
    with caplog.at_level(logging.WARNING):
        ours = model.generate(input_ids, **settings, **path)
    assert torch.equal(ours, loop)
    assert torch.equal(ours, marian.generate(input_ids, num_beams=num_beams, max_new_tokens=12))
    handed_over = model.generate(input_ids, **settings, sequence_bias={(5,): 0.0})
    assert torch.equal(ours, handed_over)


def test_padding_without_a_mask_is_named_once_in_the_log(caplog):
    from transformers.utils import logging as hf_logging

    model = varied_model()
    hf_logging.get_logger("vaswani_hf.model.generation_vaswani").warning_once.cache_clear()
    with caplog.at_level(logging.WARNING):
        model.generate(torch.tensor([[5, 6, 2], [7, 2, 0]]), max_new_tokens=3)
    assert "no `attention_mask` was given" in caplog.text and "attention_mask` with the `input_ids`" in caplog.text


@pytest.mark.parametrize("num_beams", [1, 3])
def test_no_length_anywhere_gives_the_loops_twenty_new_tokens(num_beams):
    """Where neither the call nor the model's config sets a length, Transformers' loop generates `max_length` (20)
    new tokens after the decoder start (the output has 21 positions); ours once stopped after 19."""
    marian, model = random_pair(1)
    marian.generation_config.max_length = model.generation_config.max_length = None
    input_ids, attention_mask = padded_batch(1)
    with torch.no_grad():  # no EOS: every row runs to the limit
        marian.final_logits_bias[0, EOS] = model.final_logits_bias[EOS] = -1e4
    loop = transformers_loop(model, input_ids, attention_mask=attention_mask, num_beams=num_beams)
    assert loop.shape[1] == 21
    for path in PATHS:
        ours = model.generate(input_ids, attention_mask=attention_mask, num_beams=num_beams, **path)
        assert torch.equal(ours, loop)
    assert torch.equal(marian.generate(input_ids, attention_mask=attention_mask, num_beams=num_beams), loop)
    # a length the call sets is the total, the decoder start included, as in the loop
    assert model.generate(input_ids, attention_mask=attention_mask, num_beams=num_beams, max_length=20).shape[1] == 20


@pytest.mark.parametrize("num_beams", [1, 2])
def test_no_length_anywhere_stops_at_a_learned_position_table_as_the_loop(num_beams):
    """With a learned table of 16 positions and no length asked, the loop cuts its default at the table and
    decodes; ours once refused ("ask for at most max_new_tokens=16")."""
    model = varied_model(position_embedding_type="learned", max_position_embeddings=16)
    model.generation_config.max_length_offset = None
    source = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 11, 2, 0]])
    mask = source.ne(0).long()
    with torch.no_grad():
        model.final_logits_bias[2] = -1e4
    loop = transformers_loop(model, source, attention_mask=mask, num_beams=num_beams, length_penalty=1.0)
    assert loop.shape[1] == 16
    for path in PATHS[:2]:
        ours = model.generate(source, attention_mask=mask, num_beams=num_beams, length_penalty=1.0,
                              length_penalty_type="hf", **path)  # fmt: skip
        assert torch.equal(ours, loop)


@pytest.mark.parametrize("min_new_tokens", [0, 1, 3])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_min_new_tokens_wins_over_min_length_with_the_loops_warning(min_new_tokens, num_beams, caplog):
    """The loop lets `min_new_tokens` win over `min_length` and warns; ours once took the larger of the two."""
    marian, model = random_pair(4)
    input_ids, attention_mask = padded_batch(4)
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=12, min_length=8,
                    min_new_tokens=min_new_tokens)  # fmt: skip
    loop = transformers_loop(model, input_ids, **settings)
    assert int(loop.ne(PAD).sum(1).min()) < 8  # a row ends before min_length (the case needs one)
    with caplog.at_level(logging.WARNING):
        for path in PATHS:
            assert torch.equal(model.generate(input_ids, **settings, **path), loop)
    assert "`min_new_tokens` will take precedence" in caplog.text
    assert torch.equal(marian.generate(input_ids, **settings), loop)


def test_force_words_with_a_decoder_prompt_points_at_target_prefix():
    model = varied_model()
    with pytest.raises(ValueError, match="target_prefix=` instead") as refused:
        model.generate(torch.tensor([[5, 6, 2]]), force_words_ids=[[7]], decoder_input_ids=torch.tensor([[1, 9]]),
                       num_beams=2)  # fmt: skip
    assert "a `decoder_input_ids` prompt is" not in str(refused.value)


class RowBias(LogitsProcessor):
    """A caller's processor holding one bias row per search row (batch x beams), as the loop numbers them."""

    def __init__(self, bias: torch.Tensor) -> None:
        self.bias = bias

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores + self.bias


def _prefix_rule(batch_id: int, sent: torch.Tensor) -> list[int]:
    """Example 0 may take tokens 1..749 and EOS, example 1 750..1498 and EOS, the others anything: a rule by example."""
    return {0: [EOS, *range(1, 750)], 1: [EOS, *range(750, PAD)]}.get(batch_id, list(range(PAD + 1)))


# a model seed where the sentences end at different steps under each processor
ROWS_CASES = {("prefix_rule", 1): 3, ("row_bias", 1): 1, ("prefix_rule", 3): 4, ("row_bias", 3): 4}


@pytest.mark.parametrize(("kind", "num_beams"), list(ROWS_CASES))
def test_a_processor_that_knows_rows_sees_the_loops_rows(kind, num_beams):
    """Transformers keeps every row to the end, so a processor may read which row is which example (row // beams);
    ours dropped finished sentences and renumbered the rows, so example 0's rule reached example 1, and a
    (batch x beams, V) bias raised a size mismatch. Such a processor (one the search cannot prove row-local) now
    sees the loop's rows: the sentences end at different steps here, and the tokens are the loop's and Marian's."""
    marian, model = random_pair(ROWS_CASES[kind, num_beams])
    input_ids, attention_mask = padded_batch(ROWS_CASES[kind, num_beams], batch=3)
    if kind == "prefix_rule":
        processor = PrefixConstrainedLogitsProcessor(_prefix_rule, num_beams)
    else:
        processor = RowBias(torch.randn(3 * num_beams, PAD + 1, generator=torch.Generator().manual_seed(0)))
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=10, length_penalty=1.0,
                    logits_processor=LogitsProcessorList([processor]))  # fmt: skip
    loop = transformers_loop(model, input_ids, **settings)
    assert len(set(loop.ne(PAD).sum(1).tolist())) > 1  # sentences end at different steps: the case that renumbered
    assert torch.equal(marian.generate(input_ids, **settings), loop)
    for path in PATHS:
        assert torch.equal(model.generate(input_ids, **settings, **path), loop)


def test_which_processors_let_finished_sentences_leave():
    from transformers import MinLengthLogitsProcessor, NoRepeatNGramLogitsProcessor

    from vaswani_hf.model.search_vaswani import DecodingSettings

    class Declared(LogitsProcessor):
        row_independent = True

        def __call__(self, input_ids, scores):
            return scores

    class Subclassed(MinLengthLogitsProcessor):
        pass

    def keeps(*processors) -> bool:
        settings = DecodingSettings.__new__(DecodingSettings)
        settings.user_processors = LogitsProcessorList(processors)
        return settings.keeps_every_row

    assert not keeps()  # no processor: the batch drops finished sentences
    assert not keeps(Declared(), NoRepeatNGramLogitsProcessor(2), MinLengthLogitsProcessor(3, 2))
    assert keeps(RowBias(torch.zeros(1, 40)))
    assert keeps(Subclassed(3, 2))  # a subclass may read more than its base
    assert keeps(Declared(), PrefixConstrainedLogitsProcessor(_prefix_rule, 1))


@pytest.mark.parametrize("way", ["_product_by_columns", "_product_by_rows"])
def test_bf16_gives_one_answer_whichever_way_a_process_timed_fastest(way, monkeypatch):
    """The CPU fast paths chose the output projection's way by stopwatch, per process, and the ways round bf16
    logits differently: the same greedy call gave other tokens in another process. Here each process's choice is
    stood in for by offering one way alone (the stopwatch can only pick it); a bf16 model now decodes with its own
    product whatever a process timed, so every process gives the loop's tokens, fast paths on or off."""
    from vaswani_hf.model.speed import fast_products as fp

    from .helpers import forget_measured_ways

    forget_measured_ways(monkeypatch)
    monkeypatch.setattr(fp, "_FASTEST_GREEDY", {})
    monkeypatch.setattr(fp, "_output_ways", lambda weight, rows: (getattr(fp, way),))
    _, model = random_pair(2)  # a seed where `weight @ hidden^T` changed greedy's and beam search's tokens
    model = model.to(torch.bfloat16)
    input_ids, attention_mask = padded_batch(2)
    for num_beams in (1, 3):
        settings = dict(attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=10)
        loop = transformers_loop(model, input_ids, **settings)
        assert torch.equal(model.generate(input_ids, **settings, cpu_fast_paths=True), loop)
        assert torch.equal(model.generate(input_ids, **settings, cpu_fast_paths=False), loop)


# Every optional argument is drawn absent as well as set; `None` below means "not passed".
ABSENT = st.none()
PROCESSORS = [None, "prefix_rule", "row_bias", "min_length", "no_repeat_ngram", "repetition_penalty"]


@st.composite
def calls(draw):
    """A generate() call as a Transformers user writes it: a model seed and dtype, a padded batch with or without
    its mask, and each setting left out or given, with a processor of Transformers' own classes or one that knows
    its rows, on one of our paths."""
    num_beams = draw(ABSENT | st.integers(1, 4))
    beams = num_beams or 1
    kwargs = {
        "num_beams": num_beams,
        "max_new_tokens": draw(ABSENT | st.integers(1, 12)),
        "max_length": draw(ABSENT | st.integers(2, 14)),
        "min_length": draw(ABSENT | st.integers(0, 8)),
        "min_new_tokens": draw(ABSENT | st.integers(0, 5)),
        "length_penalty": draw(ABSENT | st.sampled_from([-1.0, 0.0, 0.6, 1.0, 2.0])),
        "early_stopping": draw(ABSENT | st.sampled_from([True, False, "never"])),
        "num_return_sequences": draw(ABSENT | st.integers(1, beams)),
    }
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    # the static-shape search pads the source and fixes the caches: in bf16 it may round a near-tie the other way
    # (docs/decoding.md), so it is held to the loop in float32
    paths = PATHS if dtype == torch.float32 else PATHS[:2]
    return dict(
        seed=draw(st.integers(0, 23)),
        batch=draw(st.integers(1, 4)),
        masked=draw(st.booleans()),
        dtype=dtype,
        processor=draw(st.sampled_from(PROCESSORS)),
        path=draw(st.sampled_from(paths)),
        kwargs={name: value for name, value in kwargs.items() if value is not None},
    )


def make_processor(kind: str | None, rows: int, num_beams: int) -> LogitsProcessorList | None:
    if kind is None:
        return None
    if kind == "row_bias":
        bias = torch.randn(rows, PAD + 1, generator=torch.Generator().manual_seed(rows))
    made = {
        "prefix_rule": lambda: PrefixConstrainedLogitsProcessor(_prefix_rule, num_beams),
        "row_bias": lambda: RowBias(bias),
        "min_length": lambda: MinLengthLogitsProcessor(4, EOS),
        "no_repeat_ngram": lambda: NoRepeatNGramLogitsProcessor(2),
        "repetition_penalty": lambda: RepetitionPenaltyLogitsProcessor(1.5),
    }[kind]()
    return LogitsProcessorList([made])


def holds_to_the_loop(case: dict) -> None:
    """Our call gives the loop's sequences; in beam search, where they differ, only by hypotheses that tie (bf16
    logits keep 8 bits, so two tokens often score exactly the same, and which of them top-k returns first is its
    own choice): the n-best scores are then the loop's, place for place."""
    _, model = random_pair(case["seed"])
    model = model.to(case["dtype"])
    input_ids, attention_mask = padded_batch(case["seed"], batch=case["batch"])
    kwargs = dict(case["kwargs"])
    if case["masked"]:
        kwargs["attention_mask"] = attention_mask
    num_beams = kwargs.get("num_beams", 1)
    rows = case["batch"] * num_beams

    def both(**extra):
        loop = transformers_loop(model, input_ids, logits_processor=make_processor(case["processor"], rows, num_beams),
                                 **kwargs, **extra)  # fmt: skip
        ours = model.generate(input_ids, logits_processor=make_processor(case["processor"], rows, num_beams), **kwargs,
                              **case["path"], **extra)  # fmt: skip
        return ours, loop

    ours, loop = both()
    if num_beams > 1 and not torch.equal(ours, loop):
        ours, loop = both(return_dict_in_generate=True, output_scores=True)
        torch.testing.assert_close(ours.sequences_scores, loop.sequences_scores, atol=1e-5, rtol=1e-5,
                                   msg=lambda text: f"{case}: not a tie\n{text}")  # fmt: skip
        return
    assert torch.equal(ours, loop), f"{case}\nours {ours.tolist()}\nloop {loop.tolist()}"


# padding with no mask, no length, min_new_tokens beside min_length, on the static-shape search; and a bias per row
PADDED_UNMASKED = dict(seed=3, batch=4, masked=False, dtype=torch.float32, processor=None,
                       path=dict(graph_decoding=True),
                       kwargs=dict(num_beams=3, min_length=8, min_new_tokens=1))  # fmt: skip
ROWS_IN_BF16 = dict(seed=4, batch=3, masked=True, dtype=torch.bfloat16, processor="row_bias",
                    path=dict(cpu_fast_paths=True), kwargs=dict(num_beams=3, max_new_tokens=10))  # fmt: skip


@given(case=calls())
@example(case=PADDED_UNMASKED)
@example(case=ROWS_IN_BF16)
@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
def test_a_call_with_settings_left_out_decodes_as_transformers_loop(case):
    holds_to_the_loop(case)


@given(case=calls())
@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
def test_a_call_with_settings_left_out_decodes_as_transformers_loop_deeper(case):
    holds_to_the_loop(case)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_processor_of_the_class_a_setting_makes_takes_its_place_as_in_the_loop(num_beams, caplog):
    """Found by the differential test below: the loop runs a caller's `MinLengthLogitsProcessor` in place of the one
    `min_length` makes (and warns); our search applied both, so the longer rule won. Such a call goes to the loop."""
    marian, model = random_pair(4)
    input_ids, attention_mask = padded_batch(4)
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=10, min_length=8,
                    logits_processor=LogitsProcessorList([MinLengthLogitsProcessor(2, EOS)]))  # fmt: skip
    loop = transformers_loop(model, input_ids, **settings)
    assert int(loop.ne(PAD).sum(1).min()) < 8  # a row ends before min_length: the caller's rule took its place
    for path in PATHS[:2]:
        assert torch.equal(model.generate(input_ids, **settings, **path), loop)
