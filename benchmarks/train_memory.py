#!/usr/bin/env python
"""Memory of a long `vaswani train` run: does its RSS stay flat, step after step?

Runs one `vaswani train` process with the options after `--` and the environment given with `--env`, samples its
RSS (/proc/PID/status VmRSS) every `--interval` seconds together with the step reached (read from the progress bar
on stderr), and prints a small table: RSS at steps 50, 100, 200, 300, ... and at the end, the growth per 100
steps after the warm-up (a least-squares slope over the samples past `--warmup` steps), and the peak (the
process's ru_maxrss from wait4, what `/usr/bin/time -v` calls "Maximum resident set size").

Inside the process, every `--probe_every` steps, a TrainerCallback added from outside the package (the child is
started through a small bootstrap that wraps `transformers.Trainer.__init__`, the package is not edited) writes
glibc's own account of its heap, `mallinfo2()`: the bytes malloc holds (arena + mmapped) against the bytes in use
by live allocations (uordblks + mmapped). Held growing while in use stays flat is the allocator's free memory
(fragmentation, untrimmed tops); both growing is live memory. The same callback can call `malloc_trim(0)` every
`--trim_every` steps (hypothesis: the growth is free memory glibc keeps), and `--tracemalloc` adds Python's
tracemalloc total and its top growing lines (hypothesis: a Python object that grows per step).

    python benchmarks/train_memory.py --label base -- --task parse --data /tmp/tb7 --preset small \\
        --max_steps 600 --eval_split none --save_strategy no --output_dir /tmp/mem-run --overwrite_output_dir
    python benchmarks/train_memory.py --label cache16 --env ONEDNN_PRIMITIVE_CACHE_CAPACITY=16 -- ...
    python benchmarks/train_memory.py --label trim --trim_every 50 -- ...
    python benchmarks/train_memory.py --label arena2 --env MALLOC_ARENA_MAX=2 --csv /tmp/arena2.csv -- ...

`--csv` keeps every sample (seconds, step, RSS MiB, and the probe's figures where a probe fell near it);
`--markdown FILE` appends the row's table to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# The child: wraps Trainer.__init__ to add the probe callback, then runs `vaswani train` as the console script does.
BOOTSTRAP = r"""
import ctypes, json, os, sys, time
import transformers

probe_file = os.environ["TRAIN_MEMORY_PROBE"]
every = int(os.environ.get("TRAIN_MEMORY_PROBE_EVERY", "25"))
trim_every = int(os.environ.get("TRAIN_MEMORY_TRIM_EVERY", "0"))
use_tracemalloc = os.environ.get("TRAIN_MEMORY_TRACEMALLOC") == "1"
libc = ctypes.CDLL("libc.so.6")

class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

try:
    libc.mallinfo2.restype = _Mallinfo2
except AttributeError:
    libc = None

if use_tracemalloc:
    import tracemalloc
    tracemalloc.start(1)
    first = None

def rss_kib():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1])

class MemoryProbe(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        global first
        step = state.global_step
        if trim_every and step % trim_every == 0:
            libc.malloc_trim(0)
        if step % every and step != 1:
            return
        row = {"step": step, "t": time.time(), "rss_mib": rss_kib() / 1024}
        if libc is not None:
            info = libc.mallinfo2()
            row["held_mib"] = (info.arena + info.hblkhd) / 2**20   # what malloc got from the kernel
            row["in_use_mib"] = (info.uordblks + info.hblkhd) / 2**20  # live allocations
            row["mmapped_mib"] = info.hblkhd / 2**20
        if use_tracemalloc:
            snapshot = tracemalloc.take_snapshot()
            row["python_mib"] = sum(s.size for s in snapshot.statistics("filename")) / 2**20
            if first is None and step >= every:
                first = snapshot
            elif first is not None:
                row["python_growth"] = [str(s) for s in snapshot.compare_to(first, "lineno")[:6]]
            row["log_history"] = len(state.log_history)
        with open(probe_file, "a") as out:
            out.write(json.dumps(row) + "\n")

_init = transformers.Trainer.__init__
def __init__(self, *a, **k):
    _init(self, *a, **k)
    self.add_callback(MemoryProbe())
transformers.Trainer.__init__ = __init__

from vaswani_hf.cli import main
sys.exit(main(["train", *sys.argv[1:]]))
"""

STEP = re.compile(rb"(\d+)/(\d+) \[")


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024
    except (OSError, StopIteration):
        return None


def run(args: argparse.Namespace, train_args: list[str]) -> dict:
    probe = Path(tempfile.mkstemp(prefix="train_memory_", suffix=".jsonl")[1])
    env = {
        **os.environ,
        "TRAIN_MEMORY_PROBE": str(probe),
        "TRAIN_MEMORY_PROBE_EVERY": str(args.probe_every),
        "TRAIN_MEMORY_TRIM_EVERY": str(args.trim_every),
        "TRAIN_MEMORY_TRACEMALLOC": str(int(args.tracemalloc)),
    }
    env.update(dict(pair.split("=", 1) for pair in args.env))
    log = open(args.log, "wb") if args.log else None
    start = time.time()
    child = subprocess.Popen(
        [sys.executable, "-c", BOOTSTRAP, *train_args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL if not args.log else log,
        env=env,
    )
    step = [0]

    def read_progress() -> None:
        for chunk in iter(lambda: child.stderr.read1(4096), b""):
            if log:
                log.write(chunk)
                log.flush()
            found = STEP.findall(chunk)
            if found:
                step[0] = max(step[0], int(found[-1][0]))  # the bar only counts up

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    samples: list[tuple[float, int, float]] = []
    status = None
    while status is None:
        pid, status_word, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            status = os.waitstatus_to_exitcode(status_word)
            child.returncode = status
            break
        rss = rss_mib(child.pid)
        if rss is not None:
            samples.append((time.time() - start, step[0], rss))
        time.sleep(args.interval)
    reader.join(timeout=5)
    text = probe.read_text() if probe.exists() else ""
    probes = [json.loads(line) for line in text.splitlines() if line.strip()]
    probe.unlink(missing_ok=True)
    return {
        "label": args.label,
        "returncode": status,
        "samples": samples,
        "probes": probes,
        "peak_mib": usage.ru_maxrss / 1024,
        "seconds": time.time() - start,
        "env": args.env,
        "trim_every": args.trim_every,
    }


def at_step(samples, step: int) -> float | None:
    """The RSS of the first sample taken at `step` or later."""
    return next((rss for _, s, rss in samples if s >= step), None)


def slope_per_100(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return None if sxx == 0 else 100 * sum((x - mx) * (y - my) for x, y in points) / sxx


def table(result: dict, warmup: int) -> str:
    samples = result["samples"]
    last = max((s for _, s, _ in samples), default=0)
    marks = [m for m in [50, 100] + list(range(200, last + 1, 100)) if m <= last]
    rows = [(str(m), at_step(samples, m)) for m in marks]
    rows.append((f"end ({last})", at_step(samples, last)))
    # samples once the last step is reached: saving the model, writing its card (not the training loop)
    after = [rss for _, s, rss in samples if s >= last][1:]
    probes = {p["step"]: p for p in result["probes"]}

    def probe_at(step: int) -> str:
        near = [p for s, p in probes.items() if s <= step]
        if not near or "held_mib" not in near[-1]:
            return ""
        p = near[-1]
        extra = f", python {p['python_mib']:.1f}" if "python_mib" in p else ""
        return f"malloc held {p['held_mib']:.0f} / in use {p['in_use_mib']:.0f} (step {p['step']}){extra}"

    out = [
        f"### {result['label']}",
        "",
        f"env: {' '.join(result['env']) or '(none)'}"
        + (f"; malloc_trim(0) every {result['trim_every']} steps" if result["trim_every"] else ""),
        f"exit {result['returncode']}, {result['seconds']:.0f} s, peak RSS (ru_maxrss) {result['peak_mib']:.0f} MiB"
        + (f"; after the last step (saving, model card) up to {max(after):.0f} MiB" if after else ""),
        "",
        "| step | RSS MiB | glibc malloc (MiB) |",
        "|---:|---:|:---|",
    ]
    for mark, rss in rows:
        step = last if mark.startswith("end") else int(mark)
        out.append(f"| {mark} | {'' if rss is None else f'{rss:.0f}'} | {probe_at(step)} |")
    growth = slope_per_100([(s, rss) for _, s, rss in samples if warmup <= s < last])
    held = slope_per_100(
        [(p["step"], p["held_mib"]) for p in result["probes"] if p["step"] >= warmup and "held_mib" in p]
    )
    in_use = slope_per_100(
        [(p["step"], p["in_use_mib"]) for p in result["probes"] if p["step"] >= warmup and "in_use_mib" in p]
    )
    fmt = lambda v: "n/a" if v is None else f"{v:+.1f}"  # noqa: E731
    out += [
        "",
        f"growth per 100 steps after step {warmup}: RSS {fmt(growth)} MiB, malloc held {fmt(held)} MiB, "
        f"malloc in use {fmt(in_use)} MiB",
        "",
    ]
    growths = [p for p in result["probes"] if "python_growth" in p]
    if growths:
        out += [
            f"tracemalloc: Python-allocated {growths[-1]['python_mib']:.1f} MiB at step {growths[-1]['step']}, "
            f"log_history {growths[-1]['log_history']} entries; top growth since step {args_every(result)}:",
            "",
        ]
        out += [f"    {line}" for line in growths[-1]["python_growth"]] + [""]
    return "\n".join(out)


def args_every(result: dict) -> int:
    with_growth = [p["step"] for p in result["probes"] if "python_mib" in p]
    return with_growth[1] if len(with_growth) > 1 else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="run")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--warmup", type=int, default=100, help="steps left out of the growth slope")
    parser.add_argument("--probe_every", type=int, default=25, help="steps between in-process mallinfo2 probes")
    parser.add_argument("--trim_every", type=int, default=0, help="call malloc_trim(0) every N steps (0: never)")
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace Python allocations (many times slower: for a few dozen updates)",
    )
    parser.add_argument("--csv", help="write every sample here")
    parser.add_argument("--log", help="keep the run's stdout and stderr here")
    parser.add_argument("--markdown", help="append the table to this file")
    parser.add_argument("--json", help="write the raw samples and probes here")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then `vaswani train`'s options")
    args = parser.parse_args()
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    result = run(args, train_args)
    text = table(result, args.warmup)
    print(text)
    if args.csv:
        with open(args.csv, "w") as out:
            out.write("seconds,step,rss_mib\n")
            out.writelines(f"{t:.1f},{s},{rss:.1f}\n" for t, s, rss in result["samples"])
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    if args.markdown:
        with open(args.markdown, "a") as out:
            out.write(text + "\n")
    return 0 if result["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
