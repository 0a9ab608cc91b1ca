"""Start-up of `vaswani translate`: one line piped in, whole processes, beside `python -c "import torch"`.

    python benchmarks/startup.py MODEL_DIR [--rounds 5] [--line "a man walks ."] [--compare OTHER_CHECKOUT]

Runs, interleaved round after round (a slow spell of the machine slows them all), and reports each one's median:
- `python -c "import torch"`;
- `python -c "import torch; from transformers import PreTrainedModel"`;
- the libraries' floor: a process importing what the model's files and the command import from Transformers
  (`FLOOR`: PreTrainedModel, GenerationMixin, the masks, the Auto classes, BART's attention), which any
  PreTrainedModel decoded through Transformers' generation pays before its first step;
- `echo LINE | vaswani translate MODEL_DIR` through the command's entry point (`vaswani_command.main`: its light
  start, translation/light_translator.py), the same with the light start off (`VASWANI_LIGHT_START=0`: the
  Transformers model), and the same from `--compare`'s checkout (e.g. an older commit extracted with
  `git archive`), whose outputs must all be the same.
The CPU, the load average before and after, and the torch and Transformers versions are printed with the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the installed `vaswani` script's entry point; an older checkout without it runs its `vaswani_hf.cli`
TRANSLATE = (
    "import sys\ntry:\n    from vaswani_command import main\nexcept ImportError:\n"
    "    from vaswani_hf.cli import main\nsys.exit(main(['translate', sys.argv[1]]))"
)
FLOOR = ("import torch; from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationMixin, "
         "PreTrainedModel; import transformers.masking_utils, transformers.models.bart.modeling_bart")  # fmt: skip


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run(argv: list[str], line: str, pythonpath: Path, env: dict | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one process. The CPU seconds hold on a loaded machine, where the wall
    clock also counts the time the process waited for a core."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(pythonpath)}
    start, cpu = time.perf_counter(), cpu_seconds()
    done = subprocess.run(argv, input=line + "\n", capture_output=True, text=True, env=env)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])}... failed:\n{done.stderr[-2000:]}")
    return seconds, cpu, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--line", default="a man walks .")
    parser.add_argument("--compare", type=Path, help="another checkout's root, its `vaswani translate` timed too")
    args = parser.parse_args()
    python = sys.executable
    commands = {
        'python -c "import torch"': [python, "-c", "import torch"],
        "import torch; from transformers import PreTrainedModel": [
            python, "-c", "import torch; from transformers import PreTrainedModel"],
        "the libraries' floor (FLOOR)": [python, "-c", FLOOR],
        "vaswani translate (this checkout)": [python, "-c", TRANSLATE, args.model_dir],
        "vaswani translate, light start off": [python, "-c", TRANSLATE, args.model_dir],
    }  # fmt: skip
    envs = {"vaswani translate, light start off": {"VASWANI_LIGHT_START": "0"}}
    paths = dict.fromkeys(commands, ROOT)
    if args.compare:
        name = f"vaswani translate ({args.compare})"
        commands[name], paths[name] = [python, "-c", TRANSLATE, args.model_dir], args.compare
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    outputs: dict[str, set[str]] = {name: set() for name in commands}
    for _ in range(args.rounds):
        for name, argv in commands.items():
            seconds, cpu, output = run(argv, args.line, paths[name], envs.get(name))
            times[name].append(seconds)
            cpus[name].append(cpu)
            outputs[name].add(output)
            print(f"{name}: {seconds:.2f} s, {cpu:.2f} s of CPU", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    import torch
    import transformers

    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}, Transformers "
          f"{transformers.__version__}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
          f"{args.rounds} rounds, interleaved; {time.strftime('%Y-%m-%d')}")  # fmt: skip
    torch_wall, torch_cpu = (statistics.median(t['python -c "import torch"']) for t in (times, cpus))
    print("\n| command | wall s, median | minus `import torch` | CPU s, median | minus `import torch` |")
    print("|---|---:|---:|---:|---:|")
    for name, values in times.items():
        wall, cpu = statistics.median(values), statistics.median(cpus[name])
        print(f"| {name} | {wall:.2f} | {wall - torch_wall:+.2f} | {cpu:.2f} | {cpu - torch_cpu:+.2f} |")
    translated = {n: o for n, o in outputs.items() if n.startswith("vaswani translate")}
    print("\noutputs:", {n: sorted(o) for n, o in translated.items()})
    if len({frozenset(o) for o in translated.values()}) > 1 or any(len(o) > 1 for o in translated.values()):
        raise SystemExit("the translations differ between runs or checkouts")


if __name__ == "__main__":
    main()
