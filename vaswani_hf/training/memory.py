"""Keeping a long CPU run's memory flat.

Token-budget batches give a training run hundreds of batch shapes. On a CPU each new shape makes oneDNN create its
matmul primitives (bf16/AMX ones among them) and its cache of 1,024 keeps replacing them; the replaced ones, scattered
among each update's freed activations, keep glibc from reusing that space, so the heap grows while live memory stays
flat: measured +370 MiB of RSS per 100 updates on a 20,000-tree treebank, with live allocations flat from update 75
(benchmarks/results/train_memory_xeon_amx.md). `malloc_trim(0)` hands the free pages back, so every `every` updates
RSS returns to what is live; a trim walks the heap once, milliseconds against seconds of updates.

The switch: `VASWANI_MALLOC_TRIM=0` turns it off (it is on for CPU runs under glibc)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from transformers import TrainerCallback

TRIM_EVERY = 50  # updates between trims: RSS climbs ~0.2 GB between two at the measured rate


def glibc_trim():
    """glibc's `malloc_trim`, or None where the C library is another (macOS, musl) or the switch is off."""
    if os.environ.get("VASWANI_MALLOC_TRIM", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


class MallocTrimCallback(TrainerCallback):
    """Every `every` updates, hand glibc's free heap pages back to the system (see the module's text)."""

    def __init__(self, trim, every: int = TRIM_EVERY) -> None:
        self.trim, self.every = trim, every
        self.trims = 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            self.trim(0)
            self.trims += 1


def memory_callbacks(device) -> list[TrainerCallback]:
    """The callbacks that keep a run's memory flat on `device` (none on a GPU: its host memory holds no batches)."""
    trim = glibc_trim() if getattr(device, "type", str(device)) == "cpu" else None
    return [MallocTrimCallback(trim)] if trim is not None else []
