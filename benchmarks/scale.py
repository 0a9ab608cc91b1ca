#!/usr/bin/env python
"""The data pipeline at the paper's scale: WMT14-shaped corpora from 0.1M pairs to WMT14 en-fr's 36M, each phase in
its own process, with its wall time and the peak RSS of any process in it (the tokenizing workers included).

`--mode prepare` (the en-fr table): for each size, `vaswani prepare --output_dir` from nothing (wall, phases, the
peak RSS of any process, and the peak of `free`'s "used" memory above what was used before it started, which
counts the pages forked workers share once), the prepared folder's size, then a later run: `vaswani train --data
PREPARED` with 5 tiny-preset steps (the time to the end of its steps, its wall time with the final evaluation and
saving, and its peak RSS).

    python benchmarks/scale.py --mode prepare --vocab open --sizes 4500000 36000000 --out results.md
    python benchmarks/scale.py --mode prepare --corpus /data/wmt-shaped-36m      # a corpus already written

`--mode train` (the default), for each size, with an empty preparation cache:
- `first run`: `vaswani train --data RAW` with 5 tiny-preset steps: reads, trains the BPE, tokenizes into the
  cache, trains (the preparation's own phases come from its manifest);
- `second run`: the same command with another --output_dir: the data comes from the cache; `start` is the time to
  the line printed just before the first step;
- `DDP x2` (with --ddp): the first run under torchrun with 2 CPU processes and an empty cache: how many processes
  tokenized, and each one's peak RSS.

    python benchmarks/scale.py --sizes 100000 1000000 4500000 --ddp 1000000 --out benchmarks/results/scale_epyc.md
    python benchmarks/scale.py --sizes 2000 --work /tmp/scale      # seconds: what the test suite runs

Corpora come from ../shared/scale/make_corpus.py (or --corpus_script) and are kept in --work between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from compare_marian import machine  # noqa: E402 (a script beside this one: the CPU, its flags, the versions)

TINY = ["--src", "en", "--tgt", "de", "--eval_split", "val", "--preset", "tiny", "--vocab_size", "37000",
        "--max_tokens", "3125", "--max_steps", "5", "--max_eval_samples", "8", "--save_strategy", "no",
        "--disable_tqdm", "true"]  # fmt: skip
START_LINE = "task: "  # printed by `vaswani train` just before the first step
TRAINED_LINE = "'train_runtime'"  # printed by Trainer when the steps are done


def timed(command: list[str], env: dict, log: Path) -> dict:
    """Run `command`; its wall time, the time its output first showed START_LINE, and the peak RSS (GiB) of it
    and every process it waited for."""
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        first_step = trained = None
        for line in process.stdout:
            out.write(line)
            if first_step is None and line.startswith(START_LINE):
                first_step = time.perf_counter() - start
            if trained is None and TRAINED_LINE in line:
                trained = time.perf_counter() - start
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}); see {log}")
    return {"wall": time.perf_counter() - start, "start": first_step, "trained": trained,
            "rss": usage.ru_maxrss / 2**20}  # fmt: skip


def corpus(work: Path, size: int, script: Path, vocab: str = "closed") -> Path:
    folder = work / (f"corpus-{size}" if vocab == "closed" else f"corpus-{vocab}-{size}")
    if not (folder / "train.de").is_file():
        subprocess.run([sys.executable, str(script), str(folder), str(size), "--vocab", vocab], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    return folder


def memory_used() -> int:
    """What `free` shows as used: total less free, buffers and page cache (bytes)."""
    info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in open("/proc/meminfo")}
    return info["MemTotal"] - info["MemFree"] - info["Buffers"] - info["Cached"] - info["SReclaimable"]


def timed_with_free(command: list[str], env: dict, log: Path) -> dict:
    """`timed`, and the peak of `free`'s used memory above its level before the command (sampled every 0.2 s)."""
    import threading

    idle, peak, done = memory_used(), [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], memory_used() - idle)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        row = timed(command, env, log)
    finally:
        done.set()
        sampler.join()
    return {**row, "used": peak[0] / 2**30}


def folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def prepare_rows(args, env: dict) -> list[str]:
    """`vaswani prepare` from nothing, then a later 5-step run on the prepared folder, for each corpus."""
    folders = args.corpus or [corpus(args.work, size, args.corpus_script, args.vocab) for size in args.sizes]
    lines = ["| corpus | pairs | prepare | read | BPE | tokenize | peak RSS | used above idle (free) | prepared folder "
             "| text | later run: start to the end of 5 steps | its wall | its peak RSS |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    run_env = {**env, "VASWANI_PREPARED_CACHE": str(args.work / "cache-prepare")}
    for data in folders:
        out = args.work / f"prepared-{data.name}"
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(args.work / "cache-prepare", ignore_errors=True)  # the remembered file hashes too
        command = [sys.executable, "-m", "vaswani_hf.cli", "prepare", "--data", str(data), "--src", "en", "--tgt",
                   "de", "--vocab_size", str(args.vocab_size), "--output_dir", str(out)]  # fmt: skip
        first = timed_with_free(command, run_env, args.work / f"prepare-{data.name}.log")
        manifest = json.loads((out / "manifest.json").read_text())
        phases, pairs = manifest["seconds"], manifest["counts"]["read"]
        later_out = args.work / f"later-{data.name}"
        shutil.rmtree(later_out, ignore_errors=True)
        later = timed([sys.executable, "-m", "vaswani_hf.cli", "train", "--data", str(out), *TINY,
                       "--output_dir", str(later_out)], run_env, args.work / f"later-{data.name}.log")  # fmt: skip
        text = sum(f["size"] for f in manifest["files"])
        lines.append(f"| {data.name} | {pairs:,} | {first['wall']:.0f} s | {phases['reading']:.0f} s | "
                     f"{phases['vocabulary']:.0f} s | {phases['tokenizing']:.0f} s | {first['rss']:.2f} GiB | "
                     f"{first['used']:.2f} GiB | {folder_size(out) / 1e9:.2f} GB | {text / 1e9:.2f} GB | "
                     f"{later['trained']:.0f} s | {later['wall']:.0f} s | {later['rss']:.2f} GiB |")  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RANK_WRAPPER = """
import json, os, resource, sys
from vaswani_hf.cli import main
code = main(sys.argv[1:])
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print("RANK_RSS " + json.dumps({"rank": int(os.environ.get("RANK", 0)), "rss": rss}), flush=True)
sys.exit(code)
"""


def ddp_row(data: Path, work: Path, env: dict) -> dict:
    """2 CPU processes from an empty cache: builds seen, and each rank's peak RSS beside an idle process's."""
    env = {**env, "VASWANI_PREPARED_CACHE": str(work / "cache-ddp"), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    shutil.rmtree(work / "cache-ddp", ignore_errors=True)
    shutil.rmtree(work / "ddp", ignore_errors=True)
    probe = (
        "import resource, vaswani_hf.training.recipe; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)"
    )
    idle = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    (work / "rank_wrapper.py").write_text(RANK_WRAPPER)  # each rank reports its own peak RSS
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(work / "rank_wrapper.py"), "train", "--data", str(data), *TINY,
               "--output_dir", str(work / "ddp")]  # fmt: skip
    log = work / "ddp.log"
    row = timed(command, env, log)
    text = log.read_text()
    ranks = {r["rank"]: r["rss"] for r in (json.loads(x) for x in re.findall(r"RANK_RSS (\{.*\})", text))}
    return {**row, "builds": text.count("data: prepared into"), "rank_rss": ranks, "idle_rss": float(idle.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["train", "prepare"], default="train")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 4_500_000])
    parser.add_argument("--vocab", choices=["closed", "open"], default="closed", help="make_corpus.py's --vocab")
    parser.add_argument("--corpus", type=Path, nargs="+", help="(prepare) corpora already written, instead of --sizes")
    parser.add_argument("--vocab_size", type=int, default=32000, help="(prepare) WMT14 en-fr's 32,000")
    parser.add_argument("--work", type=Path, default=Path("/tmp/vaswani-scale"))
    parser.add_argument("--corpus_script", type=Path, default=ROOT.parent / "shared" / "scale" / "make_corpus.py")
    parser.add_argument("--ddp", type=int, metavar="PAIRS", help="add the 2-process DDP row, at this size")
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    header = [f"CPU: {machine()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}", ""]
    if args.mode == "prepare":
        table = "\n".join(header + prepare_rows(args, env))
        print(table)
        if args.out:
            args.out.write_text(table + "\n")
        return
    rows = []
    for size in args.sizes:
        data = corpus(args.work, size, args.corpus_script, args.vocab)
        cache = args.work / f"cache-{size}"
        shutil.rmtree(cache, ignore_errors=True)
        run_env = {**env, "VASWANI_PREPARED_CACHE": str(cache)}
        runs = {}
        for name in ("first", "second"):
            out = args.work / f"run-{size}-{name}"
            shutil.rmtree(out, ignore_errors=True)
            command = [sys.executable, "-m", "vaswani_hf.cli", "train", "--data", str(data), *TINY,
                       "--output_dir", str(out)]  # fmt: skip
            runs[name] = timed(command, run_env, args.work / f"run-{size}-{name}.log")
        manifest = json.loads(next(cache.glob("*/manifest.json")).read_text())
        rows.append((size, runs, manifest["seconds"]))
        print(f"{size:,} pairs: {json.dumps({**runs, 'prepare': manifest['seconds']})}", flush=True)
    ddp = ddp_row(corpus(args.work, args.ddp, args.corpus_script), args.work, env) if args.ddp else None

    lines = [*header, "| pairs | first run: read | BPE | tokenize | prepare total | first run wall | peak RSS | "
             "second run: start | second run wall | peak RSS |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for size, runs, phases in rows:
        first, second = runs["first"], runs["second"]
        lines.append(f"| {size:,} | {phases['reading']:.0f} s | {phases['vocabulary']:.0f} s | "
                     f"{phases['tokenizing']:.0f} s | {phases['total']:.0f} s | {first['wall']:.0f} s | "
                     f"{first['rss']:.2f} GiB | {second['start']:.0f} s | {second['wall']:.0f} s | "
                     f"{second['rss']:.2f} GiB |")  # fmt: skip
    if ddp:
        ranks = ", ".join(f"rank {r}: {rss:.2f} GiB" for r, rss in sorted(ddp["rank_rss"].items()))
        lines += ["", f"DDP, 2 CPU processes, {args.ddp:,} pairs, empty cache: {ddp['builds']} preparation(s) "
                  f"built; {ddp['wall']:.0f} s; peak RSS {ranks} (an idle process that imported the package: "
                  f"{ddp['idle_rss']:.2f} GiB)"]  # fmt: skip
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
