#!/usr/bin/env python
"""`vaswani translate` against CTranslate2 and onnxruntime on one trained model, as whole processes.

    python benchmarks/engines.py MODEL_DIR [--lines 1000] [--rounds 3] [--batch-sizes 1 32] [--beams 1 4]
        [--input FILE --reference FILE] [--no-onnx] [--neighbour ct2|train] [--out FILE]

MODEL_DIR is a folder saved by `vaswani train`. The script exports it with `vaswani export` to CTranslate2 (float32
and int8) and ONNX (float32 and int8 graphs; `--no-onnx` skips them: the export takes minutes), then runs each
contender as a whole process on the first `--lines` lines of `--input` (default: Multi30k's test2016.en):

- `vaswani translate MODEL_DIR --precision fp32` and `--precision int8`;
- `vaswani translate ONNX_DIR --engine onnxruntime` (our search over onnxruntime's graphs), float32 and int8;
- `benchmarks/ct2_translate.py` (CTranslate2's `translate_batch` on the token ids our tokenizer gives), float32 and
  int8,

each with `--threads` threads (`OMP_NUM_THREADS` for ours, `intra_threads` for CTranslate2), batches of
`--batch-size` sentences and `--max-tokens` padded source tokens, the output limit source + 50 (the model's
`max_length_offset`), greedy and with the model's beam (GNMT alpha for ours; CTranslate2 ranks by its own score /
length ** alpha). Every round runs every contender once, in an order that alternates between rounds; the table
gives medians. Start-up is measured apart: the time to the first output line for a one-line input, beside
`python -c "import torch"` and `python -c "import ctranslate2"`; sentences/s is the lines over the process's time
less the same round's start-up, and "whole" keeps the start-up in. The outputs are compared line for line (the share
equal to CTranslate2 at the same precision and to our fp32) and scored against `--reference` with sacrebleu.

`--neighbour ct2` (or `train`) runs every round twice, quiet and then beside one CPU-bound process (a CTranslate2
process translating the input again and again with `--threads` threads, or `vaswani train --preset tiny`), and
reports each contender's speed beside it as a share of its quiet speed. A run beside the neighbour still going after
`--neighbour-limit` seconds (300) is stopped and reported as slower than that (CTranslate2 beside CTranslate2, both
spinning, took more than 9 minutes for 200 lines that take a few seconds quiet).

The markdown report (default benchmarks/results/engines_<cpu>.md) names the CPU, its vector extensions, the
versions, the date, the load average before and after, and the command. `--out` moves it; the contenders'
outputs stay in `--work` (default: a temporary folder, reused exports where the folder is given again).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
MULTI30K = HERE.parent.parent / "shared" / "data" / "multi30k_en_de" / "test2016.en"  # the worktrees' layout
VASWANI = [sys.executable, "-m", "vaswani_command"]  # the installed `vaswani` script's entry point


@dataclass
class Contender:
    label: str
    precision: str  # "fp32" | "int8": the CTranslate2 row of the same precision is its yardstick
    command: object  # (input file, beams, batch size) -> argv
    times: dict = field(default_factory=dict)  # (setting, case) -> [seconds]
    startup: dict = field(default_factory=dict)  # setting -> [seconds to the first line], one a round
    outputs: dict = field(default_factory=dict)  # case -> lines

    def rates(self, setting: str, case: tuple, lines: int) -> list[float]:
        """Sentences/s in each round: the lines over the process's time less the same round's start-up (a round
        whose start-up outlasted its whole run, on a machine too busy to say, gives none)."""
        pairs = zip(self.times[(setting, case)], self.startup[setting], strict=True)
        return [lines / (whole - start) for whole, start in pairs if whole > start]


def export(model: str, folder: Path, fmt: str, quantization: str | None) -> Path:
    """`vaswani export` of `model` into `folder` (kept if a previous run wrote it)."""
    if not (folder / ("vaswani_export.json" if fmt == "ctranslate2" else "config.json")).is_file():
        command = [*VASWANI, "export", model, str(folder), "--format", fmt]
        subprocess.run(command + (["--quantize", quantization] if quantization else []), check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    return folder


def contenders(args, work: Path) -> list[Contender]:
    limits = ["--max-tokens", str(args.max_tokens)]

    def ours(folder: str, *options: str):
        return lambda source, beams, batch: [*VASWANI, "translate", folder, "--input", str(source), "--num-beams",
                                             str(beams), "--batch-size", str(batch), *limits, *options]  # fmt: skip

    def ct2(quantization: str | None):
        folder = export(args.model, work / f"ct2-{quantization or 'float32'}", "ctranslate2", quantization)
        search = ["--threads", str(args.threads), "--length-penalty", str(args.alpha), "--offset", str(args.offset)]
        return lambda source, beams, batch: [sys.executable, str(HERE / "ct2_translate.py"), str(folder),
                                             "--tokenizer", args.model, "--input", str(source), "--beams", str(beams),
                                             "--batch-size", str(batch), *limits, *search]  # fmt: skip

    out = [Contender("vaswani translate fp32", "fp32", ours(args.model, "--precision", "fp32")),
           Contender("vaswani translate int8", "int8", ours(args.model, "--precision", "int8"))]  # fmt: skip
    if not args.no_ct2:
        out += [Contender("CTranslate2 fp32", "fp32", ct2(None)), Contender("CTranslate2 int8", "int8", ct2("int8"))]
    if not args.no_onnx:
        for precision, quantization in (("fp32", None), ("int8", "int8")):
            folder = export(args.model, work / f"onnx-{quantization or 'float32'}", "onnx", quantization)
            out.append(Contender(f"onnxruntime {precision} (vaswani translate)", precision,
                                 ours(str(folder), "--engine", "onnxruntime")))  # fmt: skip
    return out


def wait_policies() -> str:
    """Each engine's OpenMP wait policy, as its users get it: the environment's where set, else each one's default."""
    chosen = os.environ.get("OMP_WAIT_POLICY") or (os.environ.get("GOMP_SPINCOUNT") and "GOMP_SPINCOUNT")
    if chosen:
        return f"{chosen} for every contender (from the environment)"
    return (
        "each engine's default: `vaswani` passive (set when it imports vaswani_hf, vaswani_hf/openmp.py), "
        "CTranslate2 libgomp's spinning one"
    )


def environment(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


def run_whole(argv: list[str], env: dict, output: Path, limit: float | None = None) -> float:
    """Seconds a whole process takes; its stdout in `output`. A process still running after `limit` seconds is
    stopped: infinity."""
    start = time.perf_counter()
    with output.open("w") as sink:
        try:
            subprocess.run(argv, stdout=sink, stderr=subprocess.DEVNULL, env=env, check=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return math.inf
    return time.perf_counter() - start


def first_line(argv: list[str], env: dict, limit: float | None = None) -> float:
    """Seconds from the start of a process to its first line on stdout; infinity where it had none after `limit`
    seconds (it is stopped)."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    timer = threading.Timer(limit, process.kill) if limit is not None else None
    if timer is not None:
        timer.start()
    line = process.stdout.readline()
    seconds = time.perf_counter() - start
    if timer is not None:
        timer.cancel()
    process.stdout.close()
    if not line and limit is not None and seconds >= limit:
        process.kill()
        process.wait()
        return math.inf
    if process.wait() != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit {process.returncode})")
    return seconds


@contextlib.contextmanager
def neighbour(kind: str | None, args, work: Path, source: Path):
    """One CPU-bound process beside the measurement (`kind` None: nothing)."""
    if kind is None:
        yield
        return
    if kind == "ct2":
        argv = [sys.executable, str(HERE / "ct2_translate.py"), str(work / "ct2-float32"), "--tokenizer", args.model,
                "--input", str(source), "--beams", "4", "--threads", str(args.threads), "--loop"]  # fmt: skip
    else:
        argv = [*VASWANI, "train", "--preset", "tiny", "--max_steps", "1000000", "--eval_split", "none",
                "--disable_tqdm", "true", "--output_dir", str(work / "neighbour-train")]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=environment(args.threads), start_new_session=True)  # fmt: skip
    time.sleep(args.neighbour_warmup)  # past its start-up: the measurement meets it working
    try:
        if process.poll() is not None:
            raise SystemExit(f"the neighbour ({' '.join(argv)}) ended early (exit {process.returncode})")
        yield
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def measure(args, work: Path, field_: list[Contender], source: Path, one_line: Path) -> dict[str, list[float]]:
    """Times every contender into its `times` and `startup`; gives the seconds of `python -c "import torch"` (and
    ctranslate2) measured in the same rounds, quiet."""
    probes = [name for name in ("torch", "ctranslate2") if importlib.util.find_spec(name) is not None]
    imports: dict[str, list[float]] = {name: [] for name in probes}
    cases = [(beams, batch) for beams in args.beams for batch in args.batch_sizes]
    env = environment(args.threads)
    settings = ["quiet"] + ([f"beside {args.neighbour}"] if args.neighbour else [])
    for r in range(args.rounds):
        for setting in settings:
            with neighbour(None if setting == "quiet" else args.neighbour, args, work, source):
                for beams, batch in cases:
                    for c in field_ if r % 2 == 0 else field_[::-1]:
                        output = work / f"{slug(c.label)}_b{beams}_n{batch}.txt"
                        limit = None if setting == "quiet" else args.neighbour_limit
                        seconds = run_whole(c.command(source, beams, batch), env, output, limit)
                        c.times.setdefault((setting, (beams, batch)), []).append(seconds)
                        if setting == "quiet":  # a run stopped beside the neighbour wrote part of its lines
                            c.outputs[(beams, batch)] = output.read_text(encoding="utf-8").splitlines()
                        print(f"round {r + 1} {setting} beam {beams} batch {batch}: {c.label} {seconds:.2f} s",
                              flush=True)  # fmt: skip
                for c in field_ if r % 2 == 0 else field_[::-1]:
                    limit = None if setting == "quiet" else args.neighbour_limit
                    c.startup.setdefault(setting, []).append(first_line(c.command(one_line, 1, 32), env, limit))
                for name in probes if setting == "quiet" else []:
                    imports[name].append(run_whole([sys.executable, "-c", f"import {name}"], env, Path(os.devnull)))
    return imports


def cpu_slug() -> str:
    """The report's name for this CPU: its name and widest vector extension (and the cap, where one is set)."""
    from compare_marian import cpu_flags

    from vaswani_hf.model.precision import cpu_name

    flags = cpu_flags()
    best = next((name for flag, name in (("amx_bf16", "amx"), ("avx512_bf16", "avx512bf16"), ("avx512f", "avx512"),
                                         ("avx2", "avx2")) if flag in flags), "noavx2")  # fmt: skip
    capped = "_capped_" + os.environ["ATEN_CPU_CAPABILITY"] if os.environ.get("ATEN_CPU_CAPABILITY") else ""
    return f"{slug(cpu_name())}_{best}{capped}"


def slug(text: str) -> str:
    return re.sub(r"\W+", "_", text.lower()).strip("_")


def versions() -> str:
    import importlib.metadata as metadata

    found = []
    for name in ("torch", "transformers", "ctranslate2", "onnxruntime", "sacrebleu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{name} {metadata.version(name)}")
    return ", ".join(found)


def rate(value: float) -> str:
    """Sentences/s as the table writes them: n/a where every round's start-up outlasted its run."""
    return "n/a" if value != value else f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def percent_equal(a: list[str], b: list[str]) -> str:
    return f"{100 * sum(x == y for x, y in zip(a, b, strict=True)) / max(len(a), 1):.1f}%"


def report(args, field_: list[Contender], loads: tuple, import_times: dict, references: list[str] | None) -> str:
    import sacrebleu
    import torch
    from compare_marian import machine

    torch.set_num_threads(args.threads)  # the machine line names the contenders' thread count
    by_label = {c.label: c for c in field_}
    lines = [
        f"# `vaswani translate` against CTranslate2 and onnxruntime: {Path(args.model).name}",
        "",
        f"Machine: {machine()}.",
        f"Versions: {versions()}. Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC. Load average "
        f"(1, 5, 15 min) before: {loads[0]}, after: {loads[1]}.",
        "",
        f"Model: `{args.model}`; input: the first {args.lines} lines of `{args.input}`; whole processes, "
        f"{args.threads} threads each, batches of {args.batch_sizes} sentences and at most {args.max_tokens} padded "
        f"source tokens, output limit source + {args.offset}; beam search with length penalty {args.alpha} (GNMT "
        f"for ours, score / length ** alpha for CTranslate2); medians of {args.rounds} rounds, the contenders taking "
        "turns. sentences/s: lines / (process time - its start-up); whole: start-up included.",
        "",
        f"OpenMP's wait policy: {wait_policies()}.",
        "",
        "Start-up, time to the first line of a one-line input (medians): "
        + ", ".join(f"{c.label} {statistics.median(c.startup['quiet']):.2f} s" for c in field_)
        + "; beside "
        + ", ".join(f'`python -c "import {name}"` {seconds:.2f} s' for name, seconds in import_times.items())
        + ".",
        "",
    ]
    if args.neighbour:
        lines[-1:-1] = [f"Start-up beside {args.neighbour}: "
                        + ", ".join(f"{c.label} {statistics.median(c.startup[f'beside {args.neighbour}']):.2f} s"
                                    .replace("inf s", f"more than {args.neighbour_limit:g} s")
                                    for c in field_) + "."]  # fmt: skip
    settings = ["quiet"] + ([f"beside {args.neighbour}"] if args.neighbour else [])
    header = "| beams | batch | contender | sentences/s | spread | x CTranslate2 | whole, sentences/s | equal to CT2 | "
    header += "equal to ours fp32 | BLEU |"
    header += f" {settings[1]}, sentences/s | share of quiet |" if args.neighbour else ""
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for beams in args.beams:
        for batch in args.batch_sizes:
            case = (beams, batch)
            rates = {c.label: c.rates("quiet", case, args.lines) for c in field_}
            for c in field_:
                median = statistics.median(rates[c.label]) if rates[c.label] else float("nan")
                ct2 = by_label.get(f"CTranslate2 {c.precision}")
                known = ct2 and rates[ct2.label] and rates[c.label]
                ratio = f"{median / statistics.median(rates[ct2.label]):.2f}" if known else "n/a" if ct2 else ""
                whole = args.lines / statistics.median(c.times[("quiet", case)])
                same_ct2 = percent_equal(c.outputs[case], ct2.outputs[case]) if ct2 and ct2 is not c else ""
                ours = by_label["vaswani translate fp32"]
                same_ours = percent_equal(c.outputs[case], ours.outputs[case]) if c is not ours else ""
                bleu = (f"{sacrebleu.corpus_bleu(c.outputs[case], [references]).score:.2f}"
                        if references is not None else "")  # fmt: skip
                spread = f"{rate(min(rates[c.label]))}-{rate(max(rates[c.label]))}" if rates[c.label] else ""
                row = (f"| {beams} | {batch} | {c.label} | {rate(median)} | {spread} | {ratio} | {rate(whole)} | "
                       f"{same_ct2} | {same_ours} | {bleu} |")  # fmt: skip
                if args.neighbour:
                    row += beside_cells(c, settings[1], case, args, median)
                lines.append(row)
    lines += ["", f"Rerun: `python benchmarks/engines.py {' '.join(args.argv)}`", ""]
    return "\n".join(lines)


def beside_cells(c: Contender, setting: str, case: tuple, args, quiet: float) -> str:
    """The sentences/s beside the neighbour and its share of the quiet rate. A round stopped at the limit counts
    as its bound, lines / (limit - its start-up): the rate it stayed below; the median is a bound ("<") where half
    the rounds or more were stopped."""
    values, stopped = [], 0
    for whole, start in zip(c.times[(setting, case)], c.startup[setting], strict=True):
        if math.isinf(whole) or math.isinf(start):
            stopped += 1
            left = args.neighbour_limit - (0.0 if math.isinf(start) else start)
            values.append(args.lines / left if left > 0 else math.inf)
        elif whole > start:
            values.append(args.lines / (whole - start))
    beside = statistics.median(values) if values else float("nan")
    if stopped * 2 < len(c.times[(setting, case)]):
        return f" {rate(beside)} | {beside / quiet:.2g} |".replace("nan", "n/a")
    note = f"{stopped} of {len(c.times[(setting, case)])} rounds stopped after {args.neighbour_limit:g} s"
    if math.isinf(beside):
        return f" n/a ({note}) | n/a |"
    return f" < {rate(beside)} ({note}) | < {beside / quiet:.2g} |"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model folder saved by `vaswani train`")
    parser.add_argument("--input", type=Path, default=MULTI30K, help="one sentence a line (default: %(default)s)")
    parser.add_argument("--reference", type=Path,
                        help="its translations, for BLEU (default: the input's .de beside its .en)")  # fmt: skip
    parser.add_argument("--lines", type=int, default=1000, help="the first LINES lines of the input")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--beams", type=int, nargs="+", default=None, help="default: 1 and the model's beam")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--no-onnx", action="store_true", help="leave out onnxruntime (its export takes minutes)")
    parser.add_argument("--no-ct2", action="store_true", help=argparse.SUPPRESS)  # the smoke test without CT2
    parser.add_argument("--neighbour", choices=["ct2", "train"], help="measure again beside one CPU-bound process")
    parser.add_argument("--neighbour-warmup", type=float, default=5.0, help="seconds the neighbour runs first")
    parser.add_argument(
        "--neighbour-limit",
        type=float,
        default=300.0,
        help="seconds a run beside the neighbour may take before it is stopped (default: %(default)s)",
    )
    parser.add_argument("--work", type=Path, help="exports and outputs (default: a temporary folder)")
    parser.add_argument("--out", type=Path, help="the report (default: benchmarks/results/engines_<cpu>.md)")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if not (Path(args.model) / "config.json").is_file() or not (Path(args.model) / "tokenizer.json").is_file():
        parser.error(f"{args.model}: not a model folder saved by `vaswani train` (config.json and tokenizer.json)")
    if not args.input.is_file():
        parser.error(f"--input {args.input}: no such file; give one sentence a line with --input FILE")
    if args.reference is None and args.input.suffix == ".en" and args.input.with_suffix(".de").is_file():
        args.reference = args.input.with_suffix(".de")
    if not args.neighbour_limit > 0:
        parser.error(f"--neighbour-limit must be a number of seconds above 0, not {args.neighbour_limit:g}")
    if args.neighbour == "ct2" and args.no_ct2:
        parser.error("--neighbour ct2 needs CTranslate2: use --neighbour train")
    generation = json.loads((Path(args.model) / "generation_config.json").read_text())
    args.alpha = generation.get("length_penalty", 1.0)
    args.offset = generation.get("max_length_offset") or 50
    args.beams = args.beams or sorted({1, generation.get("num_beams", 4)})
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    sys.path.insert(0, str(HERE))
    loads = [f"{x:.2f}" for x in os.getloadavg()]
    work = args.work or Path(tempfile.mkdtemp(prefix="vaswani-engines-"))
    work.mkdir(parents=True, exist_ok=True)
    source, one_line = work / "input.txt", work / "one-line.txt"
    lines = args.input.read_text(encoding="utf-8").splitlines()[: args.lines]
    args.lines = len(lines)
    source.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    one_line.write_text(f"{lines[0]}\n", encoding="utf-8")
    references = None
    if args.reference is not None:
        references = args.reference.read_text(encoding="utf-8").splitlines()[: args.lines]
    field_ = contenders(args, work)
    print(f"exports in {work}; contenders: {', '.join(c.label for c in field_)}", flush=True)
    import_times = {name: statistics.median(times) for name, times in measure(args, work, field_, source,
                                                                               one_line).items()}  # fmt: skip
    text = report(args, field_, (" ".join(loads), " ".join(f"{x:.2f}" for x in os.getloadavg())), import_times,
                  references)  # fmt: skip
    write_report(text, args.out, "engines")


def write_report(text: str, out: Path | None, name: str) -> None:
    """The report to `out`, or to benchmarks/results/NAME_<cpu>.md, and to the screen."""
    out = out or HERE / "results" / f"{name}_{cpu_slug()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
