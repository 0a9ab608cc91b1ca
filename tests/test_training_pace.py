"""`vaswani train` at its step's pace: compiled shapes planned and announced (dynamo's own counters), `auto` weighing
the compilations and remembering its trial, the step-phase profile, no read-back of a device value between the
finite-loss checks, the grad norm only when logged, eager batches padded to a few shapes, prompt stops."""

import itertools
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import TrainerCallback

from vaswani_hf.data.batching import BatchRows, PadPairs
from vaswani_hf.training import training_speed
from vaswani_hf.training.averaging import list_checkpoints
from vaswani_hf.training.recipe import train
from vaswani_hf.training.step_profile import ReadBacks
from vaswani_hf.training.stopping import GracefulStopCallback
from vaswani_hf.training.training_speed import (
    CompilePlan,
    CompileWatch,
    compile_buckets,
    resolve_speedups,
    speedups_for_training,
)

from .test_interruption import data, run_until_checkpoint  # noqa: F401 (a fixture)
from .test_recipe import make_trainer, tokenizer  # noqa: F401 (a fixture)

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path):
    """Measurements are remembered beside the precision cache: each test keeps its own."""
    monkeypatch.setenv("VASWANI_PRECISION_CACHE", str(tmp_path / "cache" / "precision.json"))


# --- the planned shapes ----------------------------------------------------------------------------------------


def padded_size(lengths, buckets):
    return int(np.asarray(buckets)[np.searchsorted(buckets, lengths)].sum())


@pytest.mark.parametrize("shapes", [1, 2, 3, 4])
def test_compile_buckets_pad_least_of_all_choices_with_that_many_shapes(shapes):
    rng = np.random.default_rng(shapes)
    lengths = np.minimum(rng.lognormal(3.0, 0.6, 2000).astype(int) + 1, 60)
    chosen = compile_buckets(lengths, shapes)
    assert len(chosen) <= shapes and chosen[-1] >= lengths.max() and all(b % 8 == 0 for b in chosen)
    candidates = list(range(8, 64 + 1, 8))
    best = min(padded_size(lengths, [*inner, 64 if lengths.max() > 56 else 56])
               for k in range(shapes) for inner in itertools.combinations(candidates[:-2], k))  # fmt: skip
    assert padded_size(lengths, chosen) == best


def test_a_bucket_no_pair_falls_in_is_not_planned():
    assert compile_buckets(np.array([100, 101, 99]), 4) == [104]
    with pytest.raises(ValueError, match="--compile_shapes must be at least 1"):
        compile_buckets(np.array([3]), 0)


def test_compiled_training_compiles_exactly_the_planned_shapes_and_learns_as_eager(
    tokenizer,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,  # noqa: F811
):
    """Dynamo's graphs (backend "eager": the same graphs and guards, without inductor's C++ builds) on batches of
    many row counts: one per planned shape, none unplanned; the losses are eager training's."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(training_speed, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    counters.clear()
    settings = {"max_steps": 24, "dropout": 0.0, "compile_shapes": 3, "max_tokens": 300}
    compiled = make_trainer(tokenizer, tmp_path / "compiled", speedups="compile", **settings)
    eager = make_trainer(tokenizer, tmp_path / "eager", speedups="off", **settings)
    eager.buckets = compiled.buckets  # the same batches, eager
    train(compiled)
    plan, watch = compiled.compile_watch.plan, compiled.compile_watch
    assert len(plan.shapes) == len(compiled.buckets) <= 3
    rows = {len(batch) for batch in compiled.get_train_dataloader().batch_sampler}
    assert len(rows) > len(plan.shapes)  # the batches' own row counts are many: the padding makes them few
    assert set(watch.compiled) <= set(plan.shapes) and watch.unplanned == 0
    graphs = counters["stats"]["unique_graphs"]
    assert graphs % len(watch.compiled) == 0 and graphs // len(watch.compiled) <= 2  # per shape, not per batch
    printed = capsys.readouterr().err
    assert f"compiling {len(plan.shapes)} shapes" in printed and "shape 1 of" in printed
    train(eager)
    first = [e["loss"] for e in eager.state.log_history if "loss" in e]
    second = [e["loss"] for e in compiled.state.log_history if "loss" in e]
    np.testing.assert_allclose(second, first, rtol=1e-4)


class Doubling(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_an_unplanned_recompilation_is_a_warning_naming_the_guard(monkeypatch, caplog):
    monkeypatch.setattr(training_speed, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    model = Doubling()  # dynamo leaves torch's own modules (nn.Linear) alone: a module of ours
    training_speed.compile_in_place(model, 1)
    said = []
    watch = CompileWatch(CompilePlan([(3, 4)], "key"), said.append)
    with watch.step((3, 4)):
        model(torch.ones(3, 4))
    assert said[0].startswith("compiling shape 1 of 1") and watch.unplanned == 0
    with watch.step((5, 4)):
        model(torch.ones(5, 4))
    assert watch.unplanned == 1
    assert "unplanned recompilation (batch shape 5x4)" in caplog.text and "size mismatch" in caplog.text


# --- auto: compilations counted, the trial remembered -----------------------------------------------------------


def test_auto_counts_every_planned_compile_against_the_planned_updates():
    def measure(speedups):  # a compiled step twice as fast, but its first one takes 60 s
        return (0.05, 60.0) if speedups.compile else (0.1, 0.1)

    long = resolve_speedups("auto", CUDA, 100_000, measure, "bf16", shapes=8)
    short = resolve_speedups("auto", CUDA, 5_000, measure, "bf16", shapes=8)
    assert long.compile and not short.compile
    assert "8 shapes to compile take about 480 s" in str(short)


def test_auto_remembers_its_trial_per_card_model_and_batch(tokenizer, tmp_path, monkeypatch):  # noqa: F811
    trials = []

    def step_times(model, device, rows, length, precision, speedups):
        trials.append(speedups)
        return [0.5 if speedups.fused_adam else 1.0] * 6

    monkeypatch.setattr(training_speed, "step_times", step_times)
    model = make_trainer(tokenizer, tmp_path).model
    lengths = ([3, 5, 7, 30], [4, 6, 9, 31])
    first = speedups_for_training("auto", model, CUDA, 160, lengths, None, "bf16", sharded=True)
    measured = len(trials)
    second = speedups_for_training("auto", model, CUDA, 160, lengths, None, "bf16", sharded=True)
    assert measured > 0 and len(trials) == measured  # nothing measured again
    assert first.fused_adam and second == first and "remembered in" in str(second)
    speedups_for_training("auto", model, CUDA, 320, lengths, None, "bf16", sharded=True)
    assert len(trials) > measured  # another batch: another trial


# --- the profile ------------------------------------------------------------------------------------------------


def test_the_profile_prints_every_phase_and_they_add_up_to_the_update(tokenizer, tmp_path, capsys):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, profile_steps=4, max_steps=6, speedups="off")
    train(trainer)
    table = capsys.readouterr().err
    profile = trainer.profile
    assert len([s for s in profile.update_seconds if s]) == 4
    for phase in ("wait for a batch", "forward", "output layer and loss", "backward", "optimizer", "logging"):
        assert f"| {phase}" in table, phase
    total = sum(profile.seconds.values())
    assert total == pytest.approx(sum(profile.update_seconds), rel=0.1)
    assert "read-backs of device values in the audited update" in table and "distinct batch shapes" in table
    assert profile.audited.count >= 1  # the audited update logs (logging_steps 1): its loss is read back


# --- read-backs, the finite-loss check, the grad norm -----------------------------------------------------------


class CountReadBacks(TrainerCallback):
    """Read-backs during each update's forward, backward and optimizer step (between on_step_begin and end)."""

    def __init__(self) -> None:
        self.counts, self.mode = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self.mode = ReadBacks()
        self.mode.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        self.mode.__exit__(None, None, None)
        self.counts.append((state.global_step, self.mode.count, dict(self.mode.where)))


# token batches made in numpy, or by the collator row by row; Trainer's fixed-size batches
@pytest.mark.parametrize("batch_rows, max_tokens", [(True, 160), (False, 160), (True, 0)])
def test_an_update_between_checks_reads_nothing_back_from_the_device(tokenizer, tmp_path, batch_rows, max_tokens):  # noqa: F811
    counter = CountReadBacks()
    trainer = make_trainer(tokenizer, tmp_path, [counter], max_steps=6, logging_steps=100, finite_check_steps=100,
                           batch_rows=batch_rows, max_tokens=max_tokens, per_device_train_batch_size=8)  # fmt: skip
    train(trainer)
    assert [count for _, count, _ in counter.counts] == [0] * 6, counter.counts


def test_the_audit_sees_every_way_a_value_reaches_python():
    probe = ReadBacks()
    with probe:
        ones = torch.ones(2)
        ones.sum().item(), ones.tolist(), ones.numpy(), bool(ones[0]), int(ones[0]), float(ones[0])
        np.asarray(ones)  # through Tensor.numpy
    assert probe.count == 7, probe.where
    assert "tolist" not in vars(torch.Tensor) and "numpy" not in vars(torch.Tensor)  # its patches undone


class PoisonBefore(TrainerCallback):
    """NaN weights from update `step` on: its loss is NaN."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.step:
            with torch.no_grad():
                model.model.shared.weight.fill_(float("nan"))


def test_a_nan_loss_stops_at_the_next_check_before_any_checkpoint_of_it(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, [PoisonBefore(3)], max_steps=8, save_strategy="steps", save_steps=2,
                           logging_steps=100, finite_check_steps=100)  # fmt: skip
    with pytest.raises(FloatingPointError, match=r"NaN or infinite in 2 of the updates 3-4.*checkpoint-2.*learning"):
        trainer.train()
    assert [c.name for c in list_checkpoints(tmp_path)] == ["checkpoint-2"]


def test_a_nan_loss_after_the_last_check_never_reaches_the_saved_model(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, [PoisonBefore(5)], max_steps=5, logging_steps=100,
                           finite_check_steps=100)  # fmt: skip
    with pytest.raises(FloatingPointError, match="updates 1-5"):
        train(trainer)
    assert not (tmp_path / "model.safetensors").exists()


def test_the_grad_norm_is_computed_only_for_logged_updates(tokenizer, tmp_path, monkeypatch):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, max_steps=6, logging_steps=3)
    norms, clip = [], trainer.accelerator.clip_grad_norm_
    monkeypatch.setattr(trainer.accelerator, "clip_grad_norm_", lambda *a, **k: norms.append(1) or clip(*a, **k))
    train(trainer)
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert len(norms) == len(logged) == 2 and all("grad_norm" in e for e in logged)


# --- eager batches on a GPU: lengths padded to multiples of 8 ---------------------------------------------------


def test_ids_outside_the_vocabulary_are_refused_on_the_host(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path)
    config = trainer.model.config
    rows = BatchRows(trainer._remove_unused_columns(trainer.train_dataset))
    small = PadPairs(config.pad_token_id, config.decoder_start_token_id, vocab_size=5)
    with pytest.raises(ValueError, match=r"input_ids hold token id \d+, outside the model's vocabulary \[0, 5\)"):
        small(rows.__getitems__([0, 1]))


def test_padding_to_multiples_of_8_gives_a_few_shapes_and_the_same_loss(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path)
    model, config = trainer.model.eval(), trainer.model.config
    rows = BatchRows(trainer._remove_unused_columns(trainer.train_dataset))
    plain, eights = (PadPairs(config.pad_token_id, config.decoder_start_token_id, m) for m in (1, 8))
    widths, plain_widths = set(), set()
    for batch in trainer.get_train_dataloader().batch_sampler:
        a, b = plain(rows.__getitems__(batch)), eights(rows.__getitems__(batch))
        assert b["input_ids"].shape[1] % 8 == 0 and b["labels"].shape[1] % 8 == 0
        widths.add(b["input_ids"].shape[1])
        plain_widths.add(a["input_ids"].shape[1])
        with torch.no_grad():
            torch.testing.assert_close(model(**a).loss, model(**b).loss, rtol=1e-5, atol=1e-6)
    assert len(widths) < len(plain_widths) / 2


# --- stopping --------------------------------------------------------------------------------------------------


def test_a_first_signal_says_what_the_update_is_doing_and_how_to_stop_now(capsys):
    stop = GracefulStopCallback(status=lambda: "compiling shape 3 of 6")
    stop._handle(signal.SIGTERM, None)
    assert stop.signal == signal.SIGTERM
    assert ("SIGTERM: stopping after this update (compiling shape 3 of 6); send the signal again to stop now"
            in capsys.readouterr().err)  # fmt: skip


@pytest.mark.parametrize(("first", "second"), [(signal.SIGTERM, signal.SIGINT), (signal.SIGINT, signal.SIGTERM)])
def test_a_second_signal_to_the_group_stops_at_once_naming_the_last_checkpoint(data, tmp_path, first, second):  # noqa: F811
    """Two signals back to back, as an impatient user or a scheduler's escalation sends them (of two numbers: two
    of one number arriving together are one signal to the kernel), to the whole process group with loader
    processes: the second ends the run at once, with its own exit status, before the first's checkpoint."""
    out = tmp_path / "run"
    process = run_until_checkpoint(data, out, 20, "--dataloader_num_workers", "2", group=True)
    os.killpg(process.pid, first)
    os.killpg(process.pid, second)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode in (128 + first, 128 + second), stderr[-3000:]
    handled_second = signal.Signals(process.returncode - 128).name  # Python runs pending handlers by signal number
    assert "send the signal again to stop now" in stderr, stderr[-3000:]
    assert (f"stopped at once by a second {handled_second}: the last complete checkpoint is {out}{os.sep}checkpoint-"
            in stderr), stderr[-3000:]  # fmt: skip
    assert "Traceback" not in stderr, stderr[-3000:]  # the loader processes were ended, not orphaned


if __name__ == "__main__":
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", __file__]))
