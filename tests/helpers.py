"""Shared by the tests: run the `vaswani` command in a subprocess, tiny training settings."""

import subprocess
import sys

TINY_RUN = ["--preset", "tiny", "--max_steps", "4", "--warmup_steps", "2", "--vocab_size", "120",
            "--per_device_train_batch_size", "8", "--disable_tqdm", "true", "--max_eval_samples", "8"]  # fmt: skip


def vaswani(*args, stdin=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "vaswani_hf.cli", *args], capture_output=True, text=True, input=stdin, env=env
    )


def paper_marian_config(**overrides):
    """A tiny random Marian with the paper's architecture (post-norm, relu, sinusoids, shared embeddings)."""
    from transformers import MarianConfig

    settings = dict(
        vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="relu",
        scale_embedding=True, max_position_embeddings=64, forced_eos_token_id=None,
    )  # fmt: skip
    return MarianConfig(**{**settings, **overrides})
