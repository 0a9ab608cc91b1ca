"""`vaswani train` under torchrun: 2 CPU processes (gloo DDP) train together and evaluate every example once;
FSDP2 on CPU (torch directly; through Accelerate it is a clear error)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from vaswani_hf.data.number_words import number_pairs
from vaswani_hf.training.averaging import list_checkpoints
from vaswani_hf.training.trainer import STAGING_DIR

# These are the CPU (gloo) tests: on a machine with one GPU, two processes would both pick it and NCCL refuses that.
CPU_ONLY = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_run(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split, count, seed in (("train", 200, 0), ("val", 37, 1)):  # 37: not a multiple of 2 processes x batch
        (data / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in number_pairs(count, seed)))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), "-m", "vaswani_hf.cli", "train", "--data", str(data), "--preset", "tiny",
               "--max_steps", "3", "--warmup_steps", "2", "--vocab_size", "120", "--max_tokens", "200",
               "--per_device_eval_batch_size", "8", "--output_dir", str(out), "--disable_tqdm", "true"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=CPU_ONLY, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    summaries = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"steps"')]
    assert len(summaries) == 1  # printed by the main process only
    # rank 0 prepared the data (every process that builds one says so); rank 1 waited and mapped the same files
    assert result.stderr.count("data: prepared into") == 1, result.stderr[-4000:]
    summary = summaries[0]
    assert summary["world_size"] == 2 and summary["steps"] == 3
    # TranslationMetrics checks each row's labels against the example at that position, so 37 rows in
    # dataset order means nothing was padded in twice or dropped.
    assert summary["samples"] == 37
    assert len((out / "val.hyp").read_text().splitlines()) == 37


def number_data(folder: Path, train: int = 200, val: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, count, seed in (("train", train, 0), ("val", val, 1)):
        (folder / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in number_pairs(count, seed)))
    return folder


def test_ranks_with_skewed_clocks_stop_after_the_same_update(tmp_path):
    """Rank 1's time limit passes at its first update, rank 0's never: one decision for both (at the next log
    point, update 4), one checkpoint holding both ranks' random states, and no rank left waiting in a collective
    the other skipped."""
    data, out = number_data(tmp_path / "data"), tmp_path / "out"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(Path(__file__).parent / "skewed_clock.py"), "train", "--data", str(data),
               "--preset", "tiny", "--max_steps", "40", "--warmup_steps", "2", "--vocab_size", "120",
               "--max_tokens", "200", "--logging_steps", "4", "--save_steps", "100", "--max_train_minutes", "1",
               "--eval_split", "none", "--output_dir", str(out), "--disable_tqdm", "true"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=CPU_ONLY, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "time limit of 1.0 minutes reached at step 4" in result.stderr
    assert [c.name for c in list_checkpoints(out)] == ["checkpoint-4"]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {f.name for f in (out / "checkpoint-4").iterdir()}


def two_nodes(tmp_path: Path, name: str, *options: str, shared: bool = False) -> list[Path]:
    """`vaswani train` on two nodes of one process each that share no folder: each runs in its own folder and
    writes its own `out/`, as two machines with their own disks would (`shared`: both in one folder)."""
    data, port = number_data(tmp_path / "data"), free_port()
    nodes = [tmp_path / name / ("shared" if shared else f"node{rank}") for rank in range(2)]
    processes, errors = [], []
    for rank, node in enumerate(nodes):
        node.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                   "--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port), "-m",
                   "vaswani_hf.cli", "train", "--data", str(data), "--preset", "tiny", "--warmup_steps", "2",
                   "--vocab_size", "120", "--max_tokens", "200", "--save_steps", "2", "--eval_split", "none",
                   "--seed", "5", "--output_dir", "out", "--disable_tqdm", "true", *options]  # fmt: skip
        processes.append(subprocess.Popen(command, cwd=node, env=CPU_ONLY, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))  # fmt: skip
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-4000:]
        errors.append(stderr)
    assert ("share no output folder" in "".join(errors)) != shared
    return [node / "out" for node in nodes]


def test_nodes_sharing_a_folder_save_each_checkpoint_once_with_every_ranks_state(tmp_path):
    out = two_nodes(tmp_path, "one", "--max_steps", "2", shared=True)[0]
    assert [c.name for c in list_checkpoints(out)] == ["checkpoint-2"]
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors"} <= {
        f.name for f in (out / "checkpoint-2").iterdir()
    }
    assert not any((out / STAGING_DIR).glob("*/*"))


def test_nodes_without_a_shared_folder_keep_their_own_checkpoints_and_resume_exactly(tmp_path):
    whole = two_nodes(tmp_path, "whole", "--max_steps", "4")
    for out in whole:  # every node: complete checkpoints of its own, nothing left in staging
        assert [c.name for c in list_checkpoints(out)] == ["checkpoint-2", "checkpoint-4"]
        assert not any((out / STAGING_DIR).glob("*/*")), list((out / STAGING_DIR).rglob("*"))
        for checkpoint in list_checkpoints(out):
            files = {f.name for f in checkpoint.iterdir()}
            assert {"model.safetensors", "trainer_state.json", "optimizer.pt"} <= files, (checkpoint, files)
    assert (whole[1] / "checkpoint-2" / "rng_state_1.pth").is_file()
    first = two_nodes(tmp_path, "resumed", "--max_steps", "2")
    resumed = two_nodes(tmp_path, "resumed", "--max_steps", "4", "--resume", "true")
    assert first == resumed
    for out, expected in zip(resumed, whole, strict=True):  # each rank's random state restored: the same weights
        got, want = load_file(out / "model.safetensors"), load_file(expected / "model.safetensors")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_ranks_wait_for_a_preparation_longer_than_the_ddp_timeout_on_the_lock_not_in_a_collective(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split, count, seed in (("train", 200, 0), ("val", 5, 1)):
        (data / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in number_pairs(count, seed)))
    log = tmp_path / "events.jsonl"
    env = {**CPU_ONLY, "VASWANI_TEST_LOG": str(log), "VASWANI_TEST_PREPARE_SECONDS": "8",
           "VASWANI_PREPARED_CACHE": str(tmp_path / "cache")}  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(Path(__file__).parent / "slow_preparation.py"), "train", "--data", str(data),
               "--preset", "tiny", "--max_steps", "2", "--warmup_steps", "1", "--vocab_size", "120",
               "--max_tokens", "200", "--ddp_timeout", "4", "--output_dir", str(tmp_path / "out"),
               "--disable_tqdm", "true"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    started = [e["time"] for e in events if e["event"] == "preparing"]
    ended = [e["time"] for e in events if e["event"] == "prepared"]
    assert len(started) == len(ended) == 1  # one rank prepared, the other waited for it
    collectives = [e for e in events if e["event"] not in ("preparing", "prepared")]
    assert collectives, "the run entered no collective at all: the recording is broken"
    assert not [e for e in collectives if started[0] <= e["time"] <= ended[0]]  # none while the data was prepared


def test_fsdp2_shards_trains_and_gathers_on_two_cpu_processes(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), "-m", "tests.fsdp_cpu", str(tmp_path / "saved")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=CPU_ONLY,
                            timeout=600, cwd=Path(__file__).parents[1])  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "FSDP2 OK: 4 units, 2 processes" in result.stdout


def test_fsdp_through_accelerate_on_cpu_stops_instead_of_running_ddp(tmp_path):
    config = (Path(__file__).parents[1] / "scripts" / "accelerate" / "fsdp-8gpu.yaml").read_text()
    cpu_config = tmp_path / "fsdp-cpu.yaml"
    for old, new in (("num_processes: 8", "num_processes: 2"), ("use_cpu: false", "use_cpu: true"),
                     ("mixed_precision: bf16", "mixed_precision: 'no'")):  # fmt: skip
        assert old in config
        config = config.replace(old, new)
    cpu_config.write_text(config)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(cpu_config),
               "--main_process_port", str(free_port()), "-m", "vaswani_hf.cli", "train", "--preset", "tiny",
               "--max_steps", "1", "--output_dir", str(tmp_path / "out")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=CPU_ONLY,
                            timeout=600)  # fmt: skip
    assert result.returncode != 0
    assert "error: FSDP needs GPUs: on CPU, Accelerate runs plain DDP instead" in result.stderr, result.stderr[-3000:]
