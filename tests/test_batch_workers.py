"""Batches decoded side by side (`translation/batch_workers.py`): the results in the batches' order whatever order
the workers finish in, an error raised where its batch's result comes and the batches not started dropped, a
bounded read-ahead, one thread per worker (another thread's count untouched), the rule and its switch; the
searches' tokens and scores the same with and without workers over the search space (Hypothesis), and
`translate_nbest`'s translations the same."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vaswani_hf import thread_counts
from vaswani_hf.model.speed import step_threads
from vaswani_hf.translation import batch_workers
from vaswani_hf.translation.batch_workers import (
    AHEAD_PER_WORKER,
    MAX_WORKERS,
    decoding_workers,
    in_order,
    share_of_a_batch,
    workers_for,
)

from .test_search_properties import decode, same_hypotheses, searches

needs_setters = pytest.mark.skipif(
    not thread_counts.thread_counts_settable(), reason="this torch build's thread-local setters are not found"
)


def test_results_come_in_the_jobs_order_whatever_order_the_workers_finish_in():
    delays = [random.Random(seed).uniform(0, 0.02) for seed in range(12)]

    def work(job):
        time.sleep(delays[job])
        return job * 10, threading.current_thread().name

    results = list(in_order(work, range(12), workers=3))
    assert [value for value, _ in results] == [job * 10 for job in range(12)]
    assert {name.startswith("vaswani-decoding") for _, name in results} == {True}
    # one worker: the calling thread, as before
    assert {name for _, name in in_order(work, range(3), workers=1)} == {threading.current_thread().name}


def test_an_error_comes_where_its_result_would_and_the_jobs_not_started_are_dropped():
    started: list[int] = []
    lock = threading.Lock()

    def work(job):
        with lock:
            started.append(job)
        if job == 3:
            raise ValueError("batch 3 failed")
        time.sleep(0.01)
        return job

    seen = []
    with pytest.raises(ValueError, match="batch 3 failed"):
        for value in in_order(work, range(1000), workers=2):
            seen.append(value)
    assert seen == [0, 1, 2]
    # the read-ahead bounds what had been submitted when the error came back; nothing ran after it
    assert max(started) < 3 + AHEAD_PER_WORKER * 2 + 1, started
    for thread in threading.enumerate():  # the workers end on their own once their running batch is done
        if thread.name.startswith("vaswani-decoding"):
            thread.join(5)
            assert not thread.is_alive()


def test_jobs_are_read_ahead_only_a_few_per_worker():
    taken = itertools.count()
    consumed = 0

    def jobs():
        for job in range(100):
            next(taken)
            yield job

    results = in_order(lambda job: job, jobs(), workers=2)
    for value in results:
        consumed += 1
        if value == 10:
            break
    results.close()  # the caller stops reading: the pool ends, the rest is never read
    read = next(taken)
    assert read <= consumed + AHEAD_PER_WORKER * 2 + 1, (read, consumed)


@needs_setters
def test_each_worker_runs_on_its_share_of_the_threads_and_the_callers_keep_theirs(two_threads):
    def work(job):
        torch.ones(4096, 256).sum()  # torch's first parallel operator in this thread: its count must hold after it
        return torch.get_num_threads()

    assert set(in_order(work, range(6), workers=2)) == {1}
    assert torch.get_num_threads() == 2


def test_the_rule_and_its_switch(two_threads, monkeypatch):
    model = torch.nn.Linear(2, 2)  # a PyTorch module on CPU, `device` and `config` as Transformers' models give them
    model.device, model.config = torch.device("cpu"), types.SimpleNamespace(d_model=batch_workers.MIN_D_MODEL)
    monkeypatch.delenv("VASWANI_DECODING_WORKERS", raising=False)
    settable = thread_counts.thread_counts_settable()
    few = batch_workers.TURN_TAKING_ROWS  # rows whose steps are so short that two searches take turns
    # more rows than that get workers, though their steps run on one thread alone too: two searches keep two cores
    assert few < step_threads.ONE_THREAD_ROWS and decoding_workers(model, 5, 4) == (2 if settable else 1)
    assert decoding_workers(model, 1, 32) == 1  # one batch: nothing to share
    assert decoding_workers(model, 5, few + 1) == (min(2, MAX_WORKERS) if settable else 1)
    assert decoding_workers(model, 5, few) == 1
    assert decoding_workers(object(), 5, 32) == 1  # an ONNX runner or an ensemble keeps its threads
    model.device = torch.device("meta")
    assert decoding_workers(model, 5, 32) == 1  # not a CPU model
    model.device = torch.device("cpu")
    for value, workers in (("1", 1), ("0", 1), ("off", 1), (" 3 ", 3), ("", 2)):
        monkeypatch.setenv("VASWANI_DECODING_WORKERS", value)
        assert decoding_workers(model, 5, 32) == (workers if settable else 1), value
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "8")
    assert decoding_workers(model, 3, 32) == (3 if settable else 1)  # never more workers than batches
    model.config.d_model = batch_workers.MIN_D_MODEL - 1  # narrower, or fewer rows: workers only where asked for
    assert decoding_workers(model, 3, 1) == (3 if settable else 1)
    monkeypatch.delenv("VASWANI_DECODING_WORKERS")
    assert decoding_workers(model, 5, 32) == 1
    model.config.d_model = batch_workers.MIN_D_MODEL
    # a server's batch: split where each share's search has more rows than a one-thread step
    assert share_of_a_batch(model, 8, 4) == (4 if settable else 8) and share_of_a_batch(model, 8, 1) == (
        4 if settable else 8)  # fmt: skip
    assert share_of_a_batch(model, 2, 1) == 2 and share_of_a_batch(model, 1, 4) == 1
    assert share_of_a_batch(model, 4, 4) == (2 if settable else 4)  # shares of 8 rows: each on one thread, both cores
    torch.set_num_threads(1)
    assert decoding_workers(model, 5, 32) == 1  # one thread: one batch at a time


def test_the_rule_without_a_model(two_threads, monkeypatch):
    """`workers_for`, the rule for a caller with no model (the light start's): the width alone, None for no CPU
    model; its own bound of rows (the light start's 0: workers at one row too), the switch above it all."""
    monkeypatch.delenv("VASWANI_DECODING_WORKERS", raising=False)
    settable = thread_counts.thread_counts_settable()
    wide, few = batch_workers.MIN_D_MODEL, batch_workers.TURN_TAKING_ROWS
    assert workers_for(5, few, wide) == 1 and workers_for(5, few + 1, wide) == (2 if settable else 1)
    assert workers_for(5, 1, wide, turn_taking_rows=0) == (2 if settable else 1)
    assert workers_for(5, 32, None) == 1 and workers_for(1, 32, wide, turn_taking_rows=0) == 1
    assert workers_for(5, 32, wide - 1, turn_taking_rows=0) == 1
    assert workers_for(5, 32, wide, alignments=True) == workers_for(5, 32, wide, sampling=True) == 1
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "0")
    assert workers_for(5, 32, wide, turn_taking_rows=0) == 1
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "3")
    assert workers_for(5, 1, 8) == (3 if settable else 1) and workers_for(5, 32, None) == 1


@pytest.mark.parametrize("value", ["two", "-1", "2.5", "\uff12"])
def test_a_bad_switch_value_is_named(value, monkeypatch):
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", value)
    with pytest.raises(ValueError, match="VASWANI_DECODING_WORKERS"):
        batch_workers.asked_workers()


@given(case=searches(), workers=st.integers(2, 3), cuts=st.lists(st.integers(1, 3), min_size=1, max_size=4))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_searches_give_the_same_tokens_and_scores_with_and_without_workers(case, workers, cuts, monkeypatch):
    model, sources, kwargs, switches = case
    batches, start = [], 0
    for size in itertools.cycle(cuts):  # the drawn sources cut into batches of the drawn sizes
        if start >= len(sources):
            break
        batches.append(sources[start : start + size])
        start += size
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        alone = [hyp for batch in batches for hyp in decode(model, batch, kwargs, switches, monkeypatch)]
        # every worker's environment as the caller's: `decode` sets the candidate columns' switch before each call
        side_by_side = in_order(lambda batch: decode(model, batch, kwargs, switches, monkeypatch), batches, workers)
        same_hypotheses([hyp for hyps in side_by_side for hyp in hyps], alone)
    finally:
        torch.set_num_threads(before)


def spy_on_searches(model, monkeypatch) -> list[tuple[str, int]]:
    """Each generate() call's thread name and thread count, from now on."""
    seen: list[tuple[str, int]] = []
    generate = model.generate

    def spied(*args, **kwargs):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spied)
    return seen


def same_translations(got: list[list[tuple]], want: list[list[tuple]]) -> None:
    """The same candidates (texts, alignments) with the same scores up to rounding (None for an empty line's)."""
    assert [[(text, *rest) for text, _, *rest in line] for line in got] == [
        [(text, *rest) for text, _, *rest in line] for line in want
    ]
    for line, want_line in zip(got, want, strict=True):
        for (_, score, *_), (_, want_score, *_) in zip(line, want_line, strict=True):
            assert score == (want_score if want_score is None else pytest.approx(want_score, rel=1e-5, abs=1e-4))


LINES = ["twenty-one", "three hundred and five", "seven", "ninety-nine", "one thousand and one", "forty-two", "",
         "six hundred and sixty-six", "eleven"]  # fmt: skip


@needs_setters
def test_translations_are_the_same_with_and_without_workers_and_run_on_them(translator, two_threads, monkeypatch):
    from vaswani_hf.translation.inference import load_for_inference, translate_nbest

    model, tokenizer = load_for_inference(translator, precision="fp32")
    lines = LINES
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "1")
    alone = translate_nbest(model, tokenizer, lines, nbest=2, batch_size=2, progress=False)
    seen = spy_on_searches(model, monkeypatch)
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "2")  # the tiny model is under the width workers start at
    side_by_side = translate_nbest(model, tokenizer, lines, nbest=2, batch_size=2, progress=False)
    same_translations(side_by_side, alone)
    assert len(seen) == 4 and all(name.startswith("vaswani-decoding") and threads == 1 for name, threads in seen), seen


@needs_setters
def test_a_server_batch_is_decoded_in_a_share_per_worker(service, two_threads, monkeypatch):
    lines = [line for line in LINES if line]
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "1")
    alone = service.translate_batch(lines, {})
    seen = spy_on_searches(service.model, monkeypatch)
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "2")  # the tiny model is under the width workers start at
    assert share_of_a_batch(service.model, len(lines), 4) == 4 and share_of_a_batch(service.model, 1, 4) == 1
    shared = service.translate_batch(lines, {})
    assert [t.nbest[0][0] for t in shared] == [t.nbest[0][0] for t in alone]
    assert len(seen) == 2 and all(name.startswith("vaswani-decoding") and threads == 1 for name, threads in seen), seen
    seen.clear()
    service.translate_batch(lines[:1], {})  # one line: on the batcher's thread, every thread
    assert seen == [(threading.current_thread().name, 2)]


def test_an_interrupt_comes_back_at_once_while_a_batch_is_still_running():
    release = threading.Event()

    def work(job):
        if job == 1:
            release.wait(30)  # a long search, still running when the caller is interrupted
        return job

    results = in_order(work, range(4), workers=2)
    assert next(results) == 0
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        results.throw(KeyboardInterrupt)
    assert time.monotonic() - start < 5  # not the running batch's 30 s
    release.set()


def test_alignments_and_sampling_decode_one_batch_at_a_time(translator, two_threads, monkeypatch):
    from vaswani_hf.translation.inference import load_for_inference, translate_nbest

    model, tokenizer = load_for_inference(translator, precision="fp32")
    model.device  # noqa: B018  (a PyTorch model on CPU: workers would be allowed)
    assert decoding_workers(model, 5, 32, alignments=True) == 1 and decoding_workers(model, 5, 32, sampling=True) == 1
    lines = [line for line in LINES if line]
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "1")
    alone = translate_nbest(model, tokenizer, lines, batch_size=1, progress=False, alignments=True)
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "2")
    # alignments switch the shared model to eager attention while they read it: two at once had one search find
    # no attention weights, and the model left on eager
    for _ in range(3):
        aligned = translate_nbest(model, tokenizer, lines, batch_size=1, progress=False, alignments=True)
        same_translations(aligned, alone)
    assert model.config._attn_implementation == "sdpa"
    samples = []
    for _ in range(3):  # draws from torch's one generator, in the same order each run
        torch.manual_seed(0)
        samples.append(translate_nbest(model, tokenizer, lines, batch_size=1, progress=False, num_beams=1,
                                       do_sample=True, temperature=1.5))  # fmt: skip
    assert samples[0] == samples[1] == samples[2]


@needs_setters
def test_a_speed_trial_is_timed_by_the_steps_of_its_own_search_alone(two_threads, monkeypatch):
    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_hf.model.speed import fast_products

    # shapes no other test decodes: the trials for them start here
    torch.manual_seed(0)
    config = VaswaniConfig.tiny(vocab_size=77, d_model=40, encoder_attention_heads=5, decoder_attention_heads=5)
    model = VaswaniForConditionalGeneration(config).eval()
    callers: dict[int, set[int]] = {}
    step_begins = fast_products._StepTrial.step_begins

    def spied(trial):
        callers.setdefault(id(trial), set()).add(threading.get_ident())
        return step_begins(trial)

    monkeypatch.setattr(fast_products._StepTrial, "step_begins", spied)
    batches = [torch.randint(3, 77, (4, 6)) for _ in range(12)]

    def search(source):
        return model.generate(input_ids=source, num_beams=2, min_new_tokens=12, max_new_tokens=12,
                              cpu_fast_paths=True)  # fmt: skip

    list(in_order(search, batches, workers=2))
    assert callers and all(len(threads) == 1 for threads in callers.values()), callers


def test_ctrl_c_ends_vaswani_translate_at_once_with_one_line(translator, tmp_path):
    # decoding workers inside their searches: the interpreter's exit would wait for them (13 s for a large batch),
    # and a second Ctrl-C meanwhile aborted the process (SIGABRT)
    from vaswani_hf.data.number_words import number_pairs

    source = tmp_path / "many.txt"
    source.write_text("".join(f"{s}\n" for s, _ in number_pairs(20_000, 3)))
    env = {**os.environ, "VASWANI_DECODING_WORKERS": "2"}
    process = subprocess.Popen([sys.executable, "-m", "vaswani_hf.cli", "translate", str(translator), "--input",
                                str(source), "--batch-size", "4", "--window", "64"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert process.stdout.readline()  # translating: the first window is written
        process.send_signal(signal.SIGINT)
        start = time.monotonic()
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130 and time.monotonic() - start < 5, (process.returncode, stderr[-2000:])
    assert stderr.strip().splitlines()[-1] == "interrupted" and "Traceback" not in stderr, stderr[-2000:]


def test_sampling_asked_by_a_generation_config_decodes_one_batch_at_a_time(translator, two_threads, monkeypatch):
    from transformers import GenerationConfig

    from vaswani_hf.translation.inference import load_for_inference, translate_nbest

    model, tokenizer = load_for_inference(translator, precision="fp32")
    config = GenerationConfig.from_dict({**model.generation_config.to_dict(), "do_sample": True, "temperature": 1.5,
                                         "num_beams": 1})  # fmt: skip
    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "2")
    seen = spy_on_searches(model, monkeypatch)
    samples = []
    for _ in range(3):
        torch.manual_seed(0)
        samples.append(translate_nbest(model, tokenizer, LINES, batch_size=1, progress=False, generation_config=config))
    assert samples[0] == samples[1] == samples[2]
    assert seen and {name for name, _ in seen} == {threading.current_thread().name}


@pytest.mark.parametrize(("raised", "code"), [(KeyboardInterrupt, 130), (ValueError, 2)])
def test_a_command_ended_while_workers_search_ends_the_process_at_once(raised, code, monkeypatch, capsys):
    from vaswani_hf import cli

    def command(argv):
        raise raised("a bad line")

    class GonePipe:  # stdout's reader went away (`vaswani translate ... | head`)
        def write(self, text):
            return len(text)

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    def exit_now(status):
        raise SystemExit(("ended at once", status))

    busy = threading.Event()
    worker = threading.Thread(target=busy.wait, args=(30,), name="vaswani-decoding_0")  # a search still running
    worker.start()
    try:
        monkeypatch.setitem(cli.COMMANDS, "translate", command)
        monkeypatch.setattr(cli.os, "_exit", exit_now)
        monkeypatch.setattr(cli.sys, "stdout", GonePipe())
        with pytest.raises(SystemExit) as ended:
            cli.main(["translate", "model"])
        assert ended.value.code == ("ended at once", code)
    finally:
        busy.set()
        worker.join()
    monkeypatch.undo()
    monkeypatch.setitem(cli.COMMANDS, "translate", command)
    assert cli.main(["translate", "model"]) == code  # no worker left: the command returns its code


def test_a_bad_workers_setting_stops_a_served_model_from_loading(service, monkeypatch):
    from vaswani_hf.serving.service import Service

    monkeypatch.setenv("VASWANI_DECODING_WORKERS", "two")
    with pytest.raises(ValueError, match="VASWANI_DECODING_WORKERS='two'"):
        Service(service.model, service.tokenizer, service.settings, service.model_dir, "cpu", "fp32", ("en", "de"))


def test_a_generation_config_given_to_translate_nbest_sets_its_beams(translator):
    from transformers import GenerationConfig

    from vaswani_hf.translation.inference import load_for_inference, search_settings, translate_nbest

    model, tokenizer = load_for_inference(translator, precision="fp32")
    assert model.generation_config.num_beams > 1  # the paper's beam: the call's config must win over it
    greedy = GenerationConfig.from_dict({**model.generation_config.to_dict(), "num_beams": 1})
    assert search_settings(model, 1, {"generation_config": greedy}) == (1, False)
    assert search_settings(model, 3, {"generation_config": greedy}) == (3, False)  # widened to the n-best
    (candidates,) = translate_nbest(model, tokenizer, ["twenty-one"], progress=False, generation_config=greedy)
    assert candidates[0][1] is None  # greedy search: no beam score (the model's beam 4 had scored it)
