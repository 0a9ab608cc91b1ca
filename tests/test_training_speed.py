"""The training speed-ups of training_speed.py: bucketed batch shapes (compiled training), the choice by measurement
(timings injected), and what a run does with the choice. The measurements themselves are GPU work
(benchmarks/gpu.py); here the logic around them is checked on CPU."""

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import DataCollatorForSeq2Seq

from vaswani_hf.data.batching import TokenBudgetBatchSampler
from vaswani_hf.training.training_speed import (
    MARGIN,
    MIN_STEPS_TO_MEASURE,
    ONE_THREAD_D_MODEL,
    BucketPadding,
    Speedups,
    choose_speedups,
    compile_buckets,
    resolve_speedups,
    speedups_for_training,
    step_seconds,
    training_threads,
)

from .test_recipe import make_trainer, tokenizer  # noqa: F401 (a fixture)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_bucketed_batches_cover_every_pair_once_within_the_budget_and_one_bucket():
    rng = np.random.default_rng(0)
    sources, targets = rng.integers(1, 90, 500), rng.integers(1, 90, 500)
    buckets = compile_buckets(np.maximum(sources, targets), 8)
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=400, seed=1, buckets=buckets)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for batch in batches for i in batch) == list(range(500))
        for batch in batches:
            longest = np.maximum(sources[batch], targets[batch])
            bucket = min(b for b in buckets if b >= longest.max())
            assert longest.min() > max([b for b in buckets if b < bucket], default=0)  # one bucket per batch
            assert len(batch) <= 400 // bucket


def test_a_pair_longer_than_the_buckets_is_a_clear_error():
    with pytest.raises(ValueError, match="longer than the longest bucket|more than the longest bucket"):
        TokenBudgetBatchSampler([5, 70], [5, 9], max_tokens=400, buckets=[8, 16, 64])


def test_bucket_padding_gives_a_few_shapes_and_changes_neither_loss_nor_gradients(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, max_tokens=160)
    model = trainer.model.eval()  # no dropout: the two batches must give the same numbers
    buckets = compile_buckets(np.maximum(*trainer.train_lengths), 8)
    plain = DataCollatorForSeq2Seq(tokenizer, model=model)
    padding = BucketPadding(plain, buckets, 160, model.config.pad_token_id)
    dataset = trainer.train_dataset
    shapes = set()
    for batch_ids in list(TokenBudgetBatchSampler(*trainer.train_lengths, max_tokens=160, buckets=buckets))[:6]:
        features = [dataset[i] for i in batch_ids]
        padded = padding(features)
        shapes.add(tuple(padded["input_ids"].shape))
        assert padded["input_ids"].shape == padded["labels"].shape == (160 // padded["input_ids"].shape[1],
                                                                       padded["input_ids"].shape[1])  # fmt: skip
        losses, grads = [], []
        for batch in (plain(features), padded):
            model.zero_grad()
            loss = model(**batch).loss
            loss.backward()
            losses.append(loss.detach())
            grads.append(model.lm_head.weight.grad.clone())
        torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)
    assert len(shapes) <= len(buckets)


def timings(**seconds):
    """A measurement that returns the given seconds per step for each speed-up alone (eager: 1.0)."""
    asked = []

    def measure(speedups: Speedups) -> float:
        on = [name for name in ("compile", "fused_adam", "tf32") if getattr(speedups, name)]
        asked.append(tuple(on))
        return seconds.get(on[0], 1.0) if on else 1.0

    return measure, asked


def test_the_choice_keeps_what_measured_faster_by_the_margin():
    measure, asked = timings(compile=0.6, fused_adam=1 - 2 * MARGIN, tf32=1 - MARGIN / 2)
    choice, measured = choose_speedups(measure, "fp32")
    assert (choice.compile, choice.fused_adam, choice.tf32) == (True, True, False)
    assert set(asked) == {(), ("compile",), ("fused_adam",), ("tf32",)}
    assert "compile 600.0 ms" in str(choice) and measured["eager"] == 1.0


def test_tf32_is_not_tried_under_bf16_autocast_and_slower_speedups_are_dropped():
    measure, asked = timings(compile=1.5, fused_adam=0.5, tf32=0.1)
    choice, _ = choose_speedups(measure, "bf16")
    assert ("tf32",) not in asked
    assert (choice.compile, choice.fused_adam, choice.tf32) == (False, True, False)


def test_auto_measures_only_on_a_gpu_and_for_runs_long_enough(monkeypatch):
    measure, asked = timings(compile=0.5)
    cpu = resolve_speedups("auto", CPU, 100_000, measure, "fp32")
    short = resolve_speedups("auto", CUDA, MIN_STEPS_TO_MEASURE - 1, measure, "fp32")
    assert asked == [] and not cpu.decided and not short.decided and "too few" in str(short)
    assert resolve_speedups("auto", CUDA, None, measure, "fp32").compile
    asked.clear()
    resolve_speedups("auto", CUDA, None, measure, "fp32", token_batches=False)
    assert ("compile",) not in asked  # fixed-size batches have shapes of their own


@pytest.mark.parametrize(
    ("asked", "device", "message"),
    [
        ("compile,warp_drive", CPU, "unknown warp_drive"),
        ("tf32", CPU, "TF32 is a GPU"),
    ],
)
def test_bad_speedups_are_refused_by_name(asked, device, message):
    with pytest.raises(ValueError, match=message):
        resolve_speedups(asked, device, None, timings()[0], "fp32")


def test_compile_without_token_batches_is_refused():
    with pytest.raises(ValueError, match="--max_tokens"):
        resolve_speedups("compile", CPU, None, timings()[0], "fp32", token_batches=False)


def test_asked_speedups_are_taken_as_they_are_and_off_decides_eager():
    asked = resolve_speedups("fused_adam, compile", CPU, None, timings()[0], "fp32")
    assert (asked.compile, asked.fused_adam, asked.tf32, asked.decided) == (True, True, False, True)
    off = resolve_speedups("off", CUDA, None, timings()[0], "fp32")
    assert str(off).startswith("eager") and off.decided


def test_a_measured_step_leaves_the_model_as_it_was(tokenizer, tmp_path):  # noqa: F811
    model = make_trainer(tokenizer, tmp_path).model
    before = {name: p.clone() for name, p in model.state_dict().items()}
    seconds = step_seconds(model, CPU, rows=4, length=8, precision="fp32", speedups=Speedups(fused_adam=True),
                           rounds=2, warmup=1)  # fmt: skip
    assert seconds > 0
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    lengths = ([3, 5, 7], [4, 6, 9])
    choice = speedups_for_training("auto", model, CPU, 160, lengths, None, "fp32")
    assert not choice.decided  # a CPU: nothing measured, Trainer's defaults stay


@pytest.mark.parametrize("sharded", [False, True])
def test_auto_leaves_compile_out_for_a_sharded_model(sharded, monkeypatch, tokenizer, tmp_path):  # noqa: F811
    from vaswani_hf.training import training_speed

    measure, asked = timings(compile=0.5, fused_adam=0.9)
    monkeypatch.setattr(
        training_speed, "step_times", lambda model, device, rows, length, precision, s: [measure(s)] * 5
    )
    monkeypatch.setenv("VASWANI_PRECISION_CACHE", str(tmp_path / "precision.json"))  # the trial is remembered there
    model = make_trainer(tokenizer, tmp_path).model
    choice = speedups_for_training("auto", model, CUDA, 160, ([3, 5, 7], [4, 6, 9]), None, "bf16", sharded=sharded)
    assert (choice.compile, choice.fused_adam) == (not sharded, True)
    assert (("compile",) in asked) is not sharded


def test_the_trainer_takes_the_optimizer_chosen_and_the_run_summary_names_it(tokenizer, tmp_path):  # noqa: F811
    fused = make_trainer(tokenizer, tmp_path / "a", speedups="fused_adam")
    assert fused.args.optim == "adamw_torch_fused" and str(fused.speedups).startswith("fused_adam")
    eager = make_trainer(tokenizer, tmp_path / "b", speedups="off")
    assert eager.args.optim == "adamw_torch"
    default = make_trainer(tokenizer, tmp_path / "c")  # auto on a CPU: Trainer's own default, as before
    assert default.args.optim == type(default.args).__dataclass_fields__["optim"].default
    from vaswani_hf.training.recipe import train

    assert train(eager)["speedups"].startswith("eager")


@pytest.mark.slow
def test_compiled_training_compiles_once_per_bucket_and_learns_as_eager(tokenizer, tmp_path):  # noqa: F811
    """torch.compile on CPU, a tiny model: the loss curve of eager training, and no recompilation per batch."""
    from torch._dynamo.utils import counters

    from vaswani_hf.training.recipe import train

    eager = make_trainer(tokenizer, tmp_path / "eager", speedups="off", max_steps=12, dropout=0.0)
    compiled = make_trainer(tokenizer, tmp_path / "compiled", speedups="compile", max_steps=12, dropout=0.0)
    eager.buckets = compiled.buckets  # the same batches, eager
    torch._dynamo.reset()
    counters.clear()
    train(eager)
    train(compiled)
    loader = compiled.get_train_dataloader()
    shapes = {tuple(batch["input_ids"].shape) for batch in loader}
    assert 1 <= counters["stats"]["unique_graphs"] <= 2 * len(shapes)  # a graph or two per shape, not per batch
    first = [e["loss"] for e in eager.state.log_history if "loss" in e]
    second = [e["loss"] for e in compiled.state.log_history if "loss" in e]
    np.testing.assert_allclose(first, second, rtol=2e-3)


# --- chunked_loss: the loss without the (tokens x vocabulary) logits ---------------------------------------------


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_the_chunked_loss_equals_the_whole_one_with_its_gradients(label_smoothing):
    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(dropout=0.0)).train()
    ids = torch.randint(4, model.config.vocab_size, (5, 13))
    labels = torch.randint(4, model.config.vocab_size, (5, 11))
    labels[1, 7:] = -100  # padding is ignored in both
    results = []
    for chunk in (None, 7):  # 55 positions in chunks of 7: the last one short
        model.zero_grad()
        keywords = {"loss_chunk_rows": chunk} if chunk else {}
        output = model(input_ids=ids, labels=labels, label_smoothing=label_smoothing, num_items_in_batch=40, **keywords)
        output.loss.backward()
        assert (output.logits is None) == bool(chunk)
        results.append((output.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (whole, whole_grads), (chunked, chunked_grads) = results
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_a_run_with_chunked_loss_trains_as_one_without(tokenizer, tmp_path):  # noqa: F811
    from vaswani_hf.training.trainer import VaswaniTrainer

    losses = []
    for asked in ("off", "chunked_loss"):
        trainer = make_trainer(tokenizer, tmp_path / asked, dropout=0.0, speedups=asked)
        trainer.speedups = Speedups.parse(asked)
        assert isinstance(trainer, VaswaniTrainer)
        calls, chunked = [], trainer.model.chunked_translation_loss
        trainer.model.chunked_translation_loss = lambda *a, calls=calls, chunked=chunked, **k: (
            calls.append(1) or chunked(*a, **k))  # fmt: skip
        trainer.train()
        assert bool(calls) == (asked == "chunked_loss")
        losses.append([entry["loss"] for entry in trainer.state.log_history if "loss" in entry])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


CHOSEN = st.none() | st.sampled_from(["", "  ", "0", "-1", "abc", "1", "2", " 4 ", "2,1", "x,2"])


@settings(max_examples=300, deadline=None)
@given(d_model=st.none() | st.sampled_from([1, 32, 63, 64, 65, 128]) | st.integers(1, 4096), omp=CHOSEN, mkl=CHOSEN,
       device=st.sampled_from(["cpu", "cuda"]), threads=st.integers(1, 16), settable=st.booleans())  # fmt: skip
@example(d_model=64, omp=None, mkl=None, device="cpu", threads=2, settable=True)  # the bound: one thread
@example(d_model=65, omp=None, mkl=None, device="cpu", threads=2, settable=True)  # past it: torch's count
def test_a_narrow_model_trains_on_one_thread_unless_the_user_chose_or_it_runs_on_a_gpu(d_model, omp, mkl, device,
                                                                                     threads, settable):  # fmt: skip
    from vaswani_hf.training import training_speed

    with pytest.MonkeyPatch.context() as patch:  # each draw's own environment and thread count
        for variable, value in (("OMP_NUM_THREADS", omp), ("MKL_NUM_THREADS", mkl)):
            patch.delenv(variable, raising=False)
            if value is not None:
                patch.setenv(variable, value)
        patch.setattr(torch, "get_num_threads", lambda: threads)
        patch.setattr(training_speed, "thread_counts_settable", lambda: settable)
        threads_chosen, why = training_threads(d_model, torch.device(device))
    assert ONE_THREAD_D_MODEL == 64  # the measured rule (docs/recipe.md)

    def a_count(value):  # what OpenMP and MKL read as a count: a positive number, or a list starting with one
        first = (value or "").split(",")[0].strip()
        return first.isdecimal() and int(first) > 0

    chosen = a_count(omp) or a_count(mkl)
    one = device == "cpu" and not chosen and d_model is not None and d_model <= 64 and threads > 1 and settable
    assert threads_chosen == (1 if one else threads)
    if one:  # the reason names the width and the switch
        assert f"d_model {d_model} <= 64" in why and "OMP_NUM_THREADS" in why
    elif device == "cpu" and chosen:
        variable, value = ("OMP_NUM_THREADS", omp) if a_count(omp) else ("MKL_NUM_THREADS", mkl)
        assert f"{variable}={value.strip()}" in why


def test_the_thread_benchmark_writes_its_table(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent.parent / "benchmarks" / "training_threads.py"
    out = tmp_path / "report.md"
    result = subprocess.run([sys.executable, str(script), "--widths", "32", "--steps", "2", "--rounds", "1",
                             "--precision", "fp32", "--threads", "2", "--out", str(out)],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 32 |")]
    assert len(rows) == 1 and rows[0].startswith("| 32 | fp32 |"), out.read_text()
    assert "--precision fp32 --threads 2" in out.read_text().splitlines()[-1]


def test_a_trainer_built_in_python_keeps_the_program_s_threads(tokenizer, tmp_path):  # noqa: F811
    # the rule is `vaswani train`'s (recipe.run_training): a hand-built trainer of a narrow model trains on the
    # program's count
    before = torch.get_num_threads()
    trainer = make_trainer(tokenizer, tmp_path, max_steps=2)
    assert trainer.model.config.d_model <= ONE_THREAD_D_MODEL
    seen, step = [], trainer.training_step
    trainer.training_step = lambda *args, **kwargs: seen.append(torch.get_num_threads()) or step(*args, **kwargs)
    trainer.train()
    assert seen and set(seen) == {before} and torch.get_num_threads() == before
