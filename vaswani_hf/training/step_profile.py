"""Where a training update's time goes: `vaswani train --profile_steps N` prints, after N updates, a table of its
phases (waiting for a batch, inputs to the device, forward, output layer and loss, backward, gradient norm,
optimizer, scheduling and callbacks, logging and saving), the read-backs of device values in one audited update
(the last), the distinct batch shapes, and on CUDA the allocator's retries and the card's busy share (its kernels'
time in the update before the audited one, from torch.profiler).

The phases are the intervals between marks the trainer sets as an update runs (`VaswaniTrainer`), so they add up
to the update's time. On a GPU every mark waits for the card (`torch.cuda.synchronize`): the card's work then lands
in the phase that queued it, and the profiled updates run a little slower than unprofiled ones.
"""

from __future__ import annotations

import os
import statistics
import time
import traceback
from collections import Counter, defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# reads of host tensors on any device: Adam's step counters, and the loader's batches checked before they move
HOST_SCALAR_READERS = (
    os.sep + os.path.join("torch", "optim") + os.sep,
    os.path.join("vaswani_hf", "data", "batching.py"),
)


class ReadBacks(TorchDispatchMode):
    """Counts (and times) every way a device value reaches Python: a tensor's `.item()`, `bool()`, `int()`,
    `float()` (aten `_local_scalar_dense`), `.tolist()` and `.numpy()` (which read memory without a torch op, so the
    mode patches them while it is on), and every copy from the device to the host. On a CPU every tensor is on
    the host, so a read is counted where a GPU run would have waited for the card; the optimizer's own step
    counters, host tensors on any device, are not counted. `where` keeps the first caller outside torch of each."""

    # Tensor methods that hand values to Python without dispatching an op
    READERS = ("tolist", "numpy")

    def __init__(self) -> None:
        super().__init__()
        self.count, self.seconds, self.where = 0, 0.0, Counter()
        self._patched: dict[str, object] = {}

    def __enter__(self):
        for name in self.READERS:
            self._patched[name] = vars(torch.Tensor).get(name)  # None: inherited from torch's C tensor
            setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name)))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for name, own in self._patched.items():
                if own is None:
                    delattr(torch.Tensor, name)
                else:
                    setattr(torch.Tensor, name, own)
            self._patched.clear()

    def _counting(self, original):
        def read(tensor, *args, **kwargs):
            start = time.perf_counter()
            result = original(tensor, *args, **kwargs)
            self._count(tensor, _caller(inner=2), time.perf_counter() - start)
            return result

        return read

    def _count(self, source: torch.Tensor | None, caller: str, seconds: float) -> None:
        if source is not None and source.device.type == "cpu" and any(part in caller for part in HOST_SCALAR_READERS):
            return  # a host tensor on any device
        self.count += 1
        self.seconds += seconds
        self.where[caller] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        to_host = func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default) and source is not None and (
            (str(kwargs.get("device", "")) == "cpu" and source.device.type != "cpu")
            or (func is torch.ops.aten.copy_.default and source.device.type == "cpu" and len(args) > 1
                and isinstance(args[1], torch.Tensor) and args[1].device.type != "cpu"))  # fmt: skip
        if func is not torch.ops.aten._local_scalar_dense.default and not to_host:
            return func(*args, **kwargs)
        caller = _caller()
        start = time.perf_counter()
        result = func(*args, **kwargs)
        # a copy to the host reads a device tensor; a scalar read of a host tensor may be exempt
        self._count(None if to_host else source, caller, time.perf_counter() - start)
        return result


def _caller(inner: int = 3) -> str:
    """The first frame outside torch's own tensor code, under the `inner` frames of the counting itself: where the
    read was asked for."""
    frames = traceback.extract_stack()[:-inner]
    for frame in reversed(frames):
        if os.sep + "torch" + os.sep not in frame.filename or os.sep + "optim" + os.sep in frame.filename:
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return "torch"


class StepProfile:
    """The phase marks of `updates` training updates, then the table. `mark(name)` ends the phase under way and
    starts `name`; `end_update()` closes the update. The last update is audited for read-backs (`ReadBacks`)."""

    def __init__(self, updates: int, device: torch.device, audit: bool = True) -> None:
        self.updates, self.device, self.audit = updates, device, audit
        self.seconds: dict[str, float] = defaultdict(float)
        self.update_seconds: list[float] = []
        self.shapes: Counter = Counter()
        self.phase: str | None = None
        self.started = self.update_start = 0.0
        self.read_backs: ReadBacks | None = None
        self.audited: ReadBacks | None = None
        self.retries = self._retries()
        self.busy: float | None = None
        self._kernels: torch.profiler.profile | None = None

    @property
    def active(self) -> bool:
        return len(self.update_seconds) < self.updates

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _retries(self) -> int:
        return torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0) if self.device.type == "cuda" else 0

    def mark(self, name: str) -> None:
        if not self.active:
            return
        self._sync()
        now = time.perf_counter()
        if self.phase is None:  # an update begins
            self.update_start = now
            if self.audit and len(self.update_seconds) == self.updates - 1:  # the last one: audited for read-backs
                self.read_backs = ReadBacks()
                self.read_backs.__enter__()
            if self.device.type == "cuda" and len(self.update_seconds) == self.updates - 2:
                self._kernels = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
                self._kernels.__enter__()
        else:
            self.seconds[self.phase] += now - self.started
        self.phase, self.started = name, now

    def batch(self, inputs: dict) -> None:
        if self.active and "input_ids" in inputs:
            self.shapes[tuple(inputs["input_ids"].shape)] += 1

    def end_update(self) -> None:
        if not self.active or self.phase is None:
            return
        self._sync()
        now = time.perf_counter()
        self.seconds[self.phase] += now - self.started
        self.update_seconds.append(now - self.update_start)
        self.phase = None
        if self._kernels is not None:  # the card's kernels' time over this update's (CUPTI, through torch.profiler)
            self._kernels.__exit__(None, None, None)
            kernels = sum(event.self_device_time_total for event in self._kernels.key_averages()) / 1e6
            self.busy, self._kernels = kernels / self.update_seconds[-1], None
        if self.read_backs is not None:
            self.read_backs.__exit__(None, None, None)
            self.audited, self.read_backs = self.read_backs, None

    def table(self) -> str:
        """The profile as a Markdown table, with the update's own time to compare the phases' sum with."""
        n = len(self.update_seconds)
        total = sum(self.seconds.values())
        median = statistics.median(self.update_seconds)
        lines = [f"step profile: {n} updates on {self.device}, median {median * 1000:.1f} ms an update (mean "
                 f"{sum(self.update_seconds) / n * 1000:.1f} ms)", "",
                 "| phase | ms per update | share |", "|---|---:|---:|"]  # fmt: skip
        for name, seconds in self.seconds.items():
            lines.append(f"| {name} | {seconds / n * 1000:.2f} | {seconds / total:.1%} |")
        lines.append(f"| **sum of the phases** | {total / n * 1000:.2f} | {total / sum(self.update_seconds):.1%} of "
                     "the updates' time |")  # fmt: skip
        audited = self.audited
        if audited is not None:
            where = "; ".join(f"{count}x {place}" for place, count in audited.where.most_common(4)) or "none"
            lines.append(f"\nread-backs of device values in the audited update: {audited.count} "
                         f"({audited.seconds * 1000:.2f} ms): {where}")  # fmt: skip
        elif not self.audit:
            lines.append(
                "\nread-backs: not audited (the counting mode would make a compiled model recompile); "
                "profile with --speedups off to count them"
            )
        shapes = ", ".join(f"{rows}x{length}" for (rows, length), _ in sorted(self.shapes.items()))
        lines.append(f"distinct batch shapes: {len(self.shapes)} ({shapes})")
        if self.device.type == "cuda":
            busy = f"{self.busy:.0%} of the update's time" if self.busy is not None else "not measured (2+ updates)"
            lines.append(
                f"allocator retries: {self._retries() - self.retries}; the card busy with kernels in the "
                f"update before the audited one: {busy}"
            )
        return "\n".join(lines)
