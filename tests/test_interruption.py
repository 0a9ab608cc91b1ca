"""Interrupted work loses nothing: SIGTERM writes a checkpoint and exits cleanly, SIGKILL at any moment leaves the
last complete checkpoint usable, and --resume reaches the same weights as an uninterrupted run."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from vaswani_hf.data.number_words import number_pairs
from vaswani_hf.training.averaging import STOP_MARKER, list_checkpoints, load_weights
from vaswani_hf.training.trainer import STAGING_DIR, _start_loader_process

from .test_recipe import make_trainer, tokenizer  # noqa: F401  (fixture)

STEPS = 120


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    for split, count, seed in (("train", 300, 0), ("val", 4, 1)):
        (folder / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in number_pairs(count, seed)))
    return folder


def command(data, out, *extra):
    return [sys.executable, "-m", "vaswani_hf.cli", "train", "--data", str(data), "--preset", "tiny",
            "--vocab_size", "120", "--max_tokens", "300", "--max_steps", str(STEPS), "--warmup_steps", "20",
            "--save_steps", "20", "--save_total_limit", "3", "--max_eval_samples", "2", "--disable_tqdm", "true",
            "--output_dir", str(out), *extra]  # fmt: skip


def run_until_checkpoint(data, out, step: int, *extra, group: bool = False) -> subprocess.Popen:
    process = subprocess.Popen(command(data, out, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=group)  # fmt: skip
    deadline = time.time() + 300
    while not (out / f"checkpoint-{step}").is_dir():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.01)
    return process


def assert_same_weights(a, b):
    expected, got = load_weights(a), load_weights(b)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    result = subprocess.run(command(data, out), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_sigterm_writes_a_checkpoint_and_exits_cleanly_then_resume_matches(data, uninterrupted, tmp_path):
    out = tmp_path / "run"
    process = run_until_checkpoint(data, out, 40)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr and "stopped by SIGTERM at step" in stderr and "--resume" in stderr
    stopped_at = int(stderr.split("stopped by SIGTERM at step ")[1].split(":")[0])
    assert list_checkpoints(out)[-1].name == f"checkpoint-{stopped_at}"  # written at the step it stopped
    # marked when off the save schedule (every 20), so averaging leaves it out once the run resumes past it
    assert (out / f"checkpoint-{stopped_at}" / STOP_MARKER).is_file() == (stopped_at % 20 != 0)
    result = subprocess.run(command(data, out, "--resume"), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_weights(uninterrupted, out)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_whole_group_stops_cleanly_with_loader_processes(data, tmp_path, name):
    """A cluster's scheduler signals every process of a job, a terminal's Ctrl-C the whole foreground group: the
    loader processes (the default on a GPU) leave the signal to the run, which writes its checkpoint and stops."""
    out, stop = tmp_path / "run", getattr(signal, name)
    process = run_until_checkpoint(data, out, 20, "--dataloader_num_workers", "2", group=True)
    os.killpg(process.pid, stop)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + stop, stderr[-3000:]
    assert "Traceback" not in stderr and f"stopped by {name} at step" in stderr
    stopped_at = int(stderr.split(f"stopped by {name} at step ")[1].split(":")[0])
    assert list_checkpoints(out)[-1].name == f"checkpoint-{stopped_at}"


def test_every_loader_with_processes_leaves_signals_to_the_run(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path / "budget", dataloader_num_workers=1)
    fixed = make_trainer(tokenizer, tmp_path / "fixed", dataloader_num_workers=1, max_tokens=0)
    loaders = [trainer.get_train_dataloader(), trainer.get_eval_dataloader(),
               trainer.get_test_dataloader(trainer.eval_dataset), fixed.get_train_dataloader()]  # fmt: skip
    iterated = [getattr(loader, "base_dataloader", loader) for loader in loaders]  # what Accelerate's wrapper runs
    assert all(loader.worker_init_fn.func is _start_loader_process for loader in iterated)
    assert make_trainer(tokenizer, tmp_path / "main").get_eval_dataloader().num_workers == 0  # on a CPU: none


def test_sigkill_at_a_random_moment_then_resume_matches(data, uninterrupted, tmp_path):
    out = tmp_path / "run"
    process = run_until_checkpoint(data, out, 60)
    time.sleep(random.uniform(0, 0.3))  # somewhere in the next steps, maybe inside a save
    process.kill()
    process.communicate()
    for checkpoint in list_checkpoints(out):  # every checkpoint-N folder that exists is complete
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= {p.name for p in checkpoint.iterdir()}
    result = subprocess.run(command(data, out, "--resume"), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_weights(uninterrupted, out)


def test_a_death_inside_a_save_leaves_only_a_staged_folder(tokenizer, tmp_path, monkeypatch):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, max_steps=4, save_strategy="steps", save_steps=2)

    def die(*args, **kwargs):
        raise SystemExit("killed while writing the optimizer state")

    monkeypatch.setattr(trainer, "_save_optimizer_and_scheduler", die)
    with pytest.raises(SystemExit):
        trainer.train()
    assert list_checkpoints(tmp_path) == []  # nothing half-written looks like a checkpoint
    assert (tmp_path / STAGING_DIR / "checkpoint-2" / "model.safetensors").is_file()


def test_resume_skips_a_bad_newest_checkpoint_and_names_it(data, tmp_path):
    out = tmp_path / "run"
    steps = ["--max_steps", "60"]
    first = subprocess.run(command(data, out, *steps), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    weights = out / "checkpoint-60" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy cut short
    (out / "trainer_state.json").unlink()  # and the run killed before it ended (a finished run stays finished)
    result = subprocess.run(command(data, out, "--resume", *steps), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "checkpoint-60 cannot be resumed from" in result.stderr and "truncated or corrupt" in result.stderr
    assert "data: reused the prepared data" in result.stderr  # the resumed run tokenized nothing
    summary = json.loads(next(line for line in result.stdout.splitlines() if line.startswith('{"steps"')))
    assert summary["resumed_from"].endswith("checkpoint-40") and summary["steps"] == 60


def test_a_finished_run_stays_finished_when_resumed_again(data, tmp_path):
    out = tmp_path / "run"
    # fp32: the weights are compared with a checkpoint's, and bf16 training (auto, where the CPU has it fast) hands
    # back weights rounded through bf16, unlike the checkpoint's fp32 masters
    steps = ["--max_steps", "30", "--save_steps", "10", "--precision", "fp32"]
    assert subprocess.run(command(data, out, *steps), capture_output=True).returncode == 0
    weights = (out / "model.safetensors").read_bytes()
    # a scheduler requeues the job that already ended
    again = subprocess.run(command(data, out, "--resume", *steps), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"the run in {out} already finished at step 30; nothing to train" in again.stdout
    assert (out / "model.safetensors").read_bytes() == weights and not (out / "checkpoint-31").exists()
    # killed after its last checkpoint, before it ended: it ends from that checkpoint, without a step more
    (out / "trainer_state.json").unlink()
    ended = subprocess.run(command(data, out, "--resume", *steps), capture_output=True, text=True)
    assert ended.returncode == 0, ended.stderr[-3000:]
    summary = json.loads(next(line for line in ended.stdout.splitlines() if line.startswith('{"steps"')))
    assert summary["steps"] == 30 and summary["resumed_from"].endswith("checkpoint-30")
    assert not (out / "checkpoint-31").exists()
    assert_same_weights(out / "checkpoint-30", out)
    # and a higher --max_steps goes on training
    more = subprocess.run(command(data, out, "--resume", "--max_steps", "40", "--save_steps", "10"),
                          capture_output=True, text=True)  # fmt: skip
    assert more.returncode == 0 and (out / "checkpoint-40").is_dir(), more.stderr[-3000:]


@pytest.mark.parametrize("damage", ["truncated weights", "no optimizer state", "trainer state not JSON"])
def test_the_newest_checkpoint_that_loads_is_resumed_and_none_is_an_error(damage, tokenizer, tmp_path):  # noqa: F811
    from vaswani_hf.training.trainer import resumable_checkpoint, why_not_resumable

    trainer = make_trainer(tokenizer, tmp_path, max_steps=2, save_strategy="steps", save_steps=1)
    trainer.train()
    good, newest = list_checkpoints(tmp_path)[-2:]
    assert why_not_resumable(newest) is None
    if damage == "truncated weights":
        path = newest / "model.safetensors"
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "no optimizer state":
        (newest / "optimizer.pt").unlink()
    else:
        (newest / "trainer_state.json").write_text("{not json")
    assert resumable_checkpoint(tmp_path) == str(good)
    for checkpoint in (good,):
        (checkpoint / "optimizer.pt").write_bytes(b"PK\x03\x04 cut")
    with pytest.raises(ValueError, match=r"no checkpoint in .* loads \(checkpoint-2: .*; checkpoint-1: optimizer.pt"):
        resumable_checkpoint(tmp_path)
