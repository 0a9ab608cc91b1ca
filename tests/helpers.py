"""Shared by the tests: run the `vaswani` command in a subprocess, tiny training settings."""

import subprocess
import sys

TINY_RUN = ["--preset", "tiny", "--max_steps", "4", "--warmup_steps", "2", "--vocab_size", "120",
            "--per_device_train_batch_size", "8", "--disable_tqdm", "true", "--max_eval_samples", "8"]  # fmt: skip


def vaswani(*args, stdin=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "vaswani_hf.cli", *args], capture_output=True, text=True, input=stdin, env=env
    )
