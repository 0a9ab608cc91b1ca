"""`vaswani train` under torchrun: 2 CPU processes (gloo DDP) train together and evaluate every example once."""

import json
import os
import socket
import subprocess
import sys

from vaswani_hf.tasks import number_pairs


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
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    summaries = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"steps"')]
    assert len(summaries) == 1  # printed by the main process only
    summary = summaries[0]
    assert summary["world_size"] == 2 and summary["steps"] == 3
    # TranslationMetrics checks each row's labels against the example at that position, so 37 rows in
    # dataset order means nothing was padded in twice or dropped.
    assert summary["samples"] == 37
    assert len((out / "val.hyp").read_text().splitlines()) == 37
