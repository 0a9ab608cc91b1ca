"""A decoding step of few rows on one thread (`speed/step_threads.py`): the rows it takes, the caller's threads set
back (after an error too, and another thread's untouched), its switch, and the searches' tokens and scores the
same with it and without it over the search space (Hypothesis)."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vaswani_hf import thread_counts
from vaswani_hf.model.speed import step_threads
from vaswani_hf.model.speed.fast_products import FastCpuProducts

from .test_search_properties import decode, same_hypotheses, searches


def threads_inside(rows: int) -> int:
    seen = []
    step_threads.by_rows(lambda hidden: seen.append(torch.get_num_threads()), lambda hidden: hidden.shape[0])(
        torch.zeros(rows, 4)
    )
    return seen[0]


def test_few_rows_run_on_one_thread_and_the_callers_threads_come_back(two_threads, monkeypatch):
    monkeypatch.delenv("VASWANI_ONE_THREAD_ROWS", raising=False)
    assert [threads_inside(rows) for rows in (1, step_threads.ONE_THREAD_ROWS, step_threads.ONE_THREAD_ROWS + 1)] == [
        1, 1, 2]  # fmt: skip
    assert torch.get_num_threads() == 2

    def fails(hidden):
        raise RuntimeError("a step that fails")

    with pytest.raises(RuntimeError, match="a step that fails"):
        step_threads.by_rows(fails, lambda hidden: hidden.shape[0])(torch.zeros(1, 4))
    assert torch.get_num_threads() == 2


def test_the_count_is_the_calling_threads_own(two_threads):
    # a server decodes each model in its own thread: one model's step of one row leaves the other's threads alone
    other_started, step_done, seen = threading.Event(), threading.Event(), {}

    def other():
        other_started.set()
        step_done.wait(10)
        seen["other"] = torch.get_num_threads()

    thread = threading.Thread(target=other)
    thread.start()
    other_started.wait(10)

    def step(hidden):
        seen["inside"] = torch.get_num_threads()
        step_done.set()
        thread.join(10)

    step_threads.by_rows(step, lambda hidden: hidden.shape[0])(torch.zeros(1, 4))
    assert seen == {"inside": 1, "other": 2}


@pytest.mark.parametrize(("value", "rows"), [("0", 0), ("off", 0), ("12", 12), (" 3 ", 3), ("", 8)])
def test_the_switch_sets_the_rows_or_turns_it_off(value, rows, two_threads, monkeypatch):
    monkeypatch.setenv("VASWANI_ONE_THREAD_ROWS", value)
    assert step_threads.one_thread_rows() == rows
    assert threads_inside(1) == (1 if rows else 2)


@pytest.mark.parametrize("value", ["four", "-1", "2.5", "1_000", "\uff11\uff12", "on"])
def test_a_bad_switch_value_is_named(value, monkeypatch):
    monkeypatch.setenv("VASWANI_ONE_THREAD_ROWS", value)
    with pytest.raises(ValueError, match="VASWANI_ONE_THREAD_ROWS"):
        step_threads.one_thread_rows()


def test_mkl_gets_its_count_back(two_threads):
    # MKL keeps its own per-thread count: left at one, this thread's larger products would run on one thread and
    # round another way (MKL's float32 products did at 5-11 rows on the Zen 3)
    torch.manual_seed(0)
    weight, rows = torch.randn(1024, 256), torch.randn(7, 256)
    before = torch.nn.functional.linear(rows, weight)
    step_threads.by_rows(lambda hidden: torch.nn.functional.linear(hidden, weight), lambda hidden: hidden.shape[0])(
        rows[:1]
    )
    assert torch.equal(torch.nn.functional.linear(rows, weight), before)
    count = thread_counts.ThreadCount.of_torch()
    if count is not None and count.mkl_set_local is not None:
        previous = count.mkl_set_local(0)  # reads this thread's own MKL setting back (and leaves it as it was)
        count.mkl_set_local(previous)
        assert previous in (0, 2), previous


SOURCE = torch.tensor([[5, 6, 7, 8, 2]] * 4)


def tiny_model(monkeypatch, **config):
    """A tiny model with the rule's bound at its default; the test skipped where this torch build's thread-local
    setters are not found (the rule is off)."""
    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

    if thread_counts.ThreadCount.of_torch() is None:
        pytest.skip("this torch build's thread-local setters are not found: the rule is off")
    monkeypatch.delenv("VASWANI_ONE_THREAD_ROWS", raising=False)
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=50, **config)).eval()


def each_step(model, cases, steps: int = 4) -> None:
    """For each (sentences, beams, threads): every decoder step of `generate()` ran with that many rows on `threads`
    threads (a hook sends the step through the decoder's own forward, still inside the fast products' step)."""
    seen: list[tuple[int, int]] = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["input_ids"].shape[0], torch.get_num_threads())),
        with_kwargs=True,
    )
    for batch, beams, threads in cases:
        seen.clear()
        model.generate(input_ids=SOURCE[:batch], num_beams=beams, max_new_tokens=steps, min_new_tokens=steps,
                       cpu_fast_paths=True)  # fmt: skip
        assert seen and all(rows == batch * beams and count == threads for rows, count in seen), (batch, beams, seen)
        assert torch.get_num_threads() == 2
    hook.remove()


def test_generate_steps_up_to_eight_rows_on_one_thread_and_more_rows_on_the_callers(two_threads, monkeypatch):
    model = tiny_model(monkeypatch)
    # up to 8 rows on one thread: greedy of up to 8 sentences, beam 4 of one or two (measured, `ONE_THREAD_ROWS`)
    each_step(model, ((1, 1, 1), (1, 2, 1), (4, 1, 1), (1, 4, 1), (2, 4, 1), (3, 4, 2), (4, 4, 2)))
    monkeypatch.setenv("VASWANI_ONE_THREAD_ROWS", "0")
    each_step(model, ((1, 1, 2),))


def test_a_search_of_few_rows_runs_its_own_operators_on_one_thread_too(two_threads, monkeypatch):
    # a beam search's log-softmax over rows x vocabulary on two threads woke the other for each step (166 us a call
    # against 24 on one, beam 4 of one sentence)
    from vaswani_hf.model import search_vaswani

    model = tiny_model(monkeypatch)
    seen: list[tuple[int, int]] = []
    own = search_vaswani.log_softmax_in_place
    monkeypatch.setattr(
        search_vaswani,
        "log_softmax_in_place",
        lambda logits: (seen.append((logits.numel() // 50, torch.get_num_threads())), own(logits))[1],
    )
    for batch, threads in ((1, 1), (2, 1), (3, 2)):  # 4, 8 and 12 rows
        seen.clear()
        model.generate(input_ids=SOURCE[:batch], num_beams=4, max_new_tokens=4, min_new_tokens=4, cpu_fast_paths=True)
        assert seen and all(rows == batch * 4 and count == threads for rows, count in seen), (batch, seen)
        assert torch.get_num_threads() == 2
    seen.clear()
    model.generate(input_ids=SOURCE[:1], num_beams=4, max_new_tokens=3, cpu_fast_paths=False)  # the rule's switch
    assert {count for _, count in seen} == {2}


def test_a_wider_model_steps_two_rows_on_one_thread_and_four_on_the_callers(two_threads, monkeypatch):
    # a `base`-wide model's products are 4x a `small` one's: beam 4 of one sentence ran 1.13-1.2x slower on one thread
    wide = step_threads.NARROW_D_MODEL + 64
    each_step(tiny_model(monkeypatch, d_model=wide), ((1, 1, 1), (2, 1, 1), (4, 1, 2), (1, 4, 2)), steps=3)
    assert step_threads.one_thread_rows(wide) == step_threads.WIDE_ONE_THREAD_ROWS == 2
    assert step_threads.one_thread_rows(step_threads.NARROW_D_MODEL) == step_threads.ONE_THREAD_ROWS == 8
    monkeypatch.setenv("VASWANI_ONE_THREAD_ROWS", "4")  # the switch sets the bound for every width
    assert step_threads.one_thread_rows(wide) == 4


def test_the_ways_are_kept_under_the_thread_count_the_steps_run_on(two_threads, monkeypatch):
    # the key read the narrowest layer's input as the width: with heads x d_kv or the FFN narrower than d_model, a
    # wide model's ways were timed on two threads under a one-thread key, and shared it with a one-thread worker's
    from vaswani_hf.model.speed import fast_products

    wide = step_threads.NARROW_D_MODEL + 64
    model = tiny_model(monkeypatch, d_model=wide, d_kv=8, decoder_ffn_dim=32, encoder_ffn_dim=32)
    each_step(model, ((4, 1, 2), (2, 1, 1)), steps=2)
    linears = fast_products._step_linears(model)
    assert [fast_products._linear_key(linears, rows)[-1] for rows in (2, 4)] == [1, 2]


def test_a_long_source_is_projected_on_the_callers_threads_in_a_search_of_few_rows(two_threads, monkeypatch):
    # the first step projects every source token for the cross-attention: eight sentences of 500 tokens ran 1.2x
    # slower with that on one thread
    from vaswani_hf.model.modeling_vaswani import VaswaniMultiHeadAttention

    model = tiny_model(monkeypatch)
    seen: list[tuple[int, int]] = []  # (blocks split: 2 for the sources' keys and values, the thread count)
    split = VaswaniMultiHeadAttention._split_heads

    decoder = {id(m) for m in model.get_decoder().modules() if isinstance(m, VaswaniMultiHeadAttention)}

    def recorded(self, projected, blocks):
        if id(self) in decoder:  # the encoder runs before the search, on the caller's threads
            seen.append((blocks, torch.get_num_threads()))
        return split(self, projected, blocks)

    monkeypatch.setattr(VaswaniMultiHeadAttention, "_split_heads", recorded)
    for length, sources_threads in ((4, 1), (step_threads.ONE_THREAD_ROWS + 1, 2)):
        seen.clear()
        source = torch.tensor([[5] * (length - 1) + [2]])
        model.generate(input_ids=source, max_new_tokens=3, min_new_tokens=3, cpu_fast_paths=True)
        assert {count for blocks, count in seen if blocks == 2} == {sources_threads}, (length, seen)
        assert {count for blocks, count in seen if blocks != 2} == {1}, (length, seen)  # the steps themselves
        assert torch.get_num_threads() == 2


def test_the_fast_products_take_the_rule():
    from vaswani_hf.model.speed import fast_products, lean_step

    wrapped = {
        "decoder_step": lean_step.decoder_step,
        "logits": fast_products.output_logits,
        "greedy_logits": fast_products.greedy_output_logits,
        "searching": fast_products.decoder_linears_for,  # itself a context manager, with a `__wrapped__` of its own
    }
    for seam, product in wrapped.items():
        assert getattr(getattr(FastCpuProducts, seam), "__wrapped__", None) is product, seam


@given(case=searches(), rows=st.integers(1, 40))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_searches_give_the_same_tokens_and_scores_with_and_without_one_thread_steps(case, rows, monkeypatch):
    model, sources, kwargs, switches = case
    switches = {**switches, "cpu_fast_paths": True}
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # where the machine has one core, the rule has nothing to change
    try:
        monkeypatch.setenv("VASWANI_ONE_THREAD_ROWS", "0")
        every_thread = decode(model, sources, kwargs, switches, monkeypatch)
        monkeypatch.setenv("VASWANI_ONE_THREAD_ROWS", str(rows))
        same_hypotheses(decode(model, sources, kwargs, switches, monkeypatch), every_thread)
    finally:
        torch.set_num_threads(before)
