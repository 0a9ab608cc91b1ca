"""fairseq itself, for the tests that hold `vaswani convert fairseq` and `vaswani translate` to it: PyPI's
`fairseq-fixed==0.12.3.1` (fairseq 0.12 with its build fixed for today's Python) in a virtual environment of its own,
built once and kept in ~/.cache/vaswani-tests (VASWANI_TEST_CACHE elsewhere). fairseq builds from source (6.2
minutes on this project's 2 shared cores, 2.7 minutes of CPU): against the environment's own CPU torch, with Cython
and numpy present and without pip's build isolation, which would otherwise pull a CUDA torch of several GB. A build
that fails raises: the oracle test fails, it does not skip.

`python -m tests.fairseq_venv` builds it and prints the interpreter's path."""

import fcntl
import os
import subprocess
import sys
from pathlib import Path

FAIRSEQ = "fairseq-fixed==0.12.3.1"
TORCH = "torch==2.13.0"
# what fairseq's hub interface needs beside itself: its Moses tokenizer and subword-nmt BPE
EXTRAS = ("sacremoses", "subword-nmt")


def cache_dir() -> Path:
    root = os.environ.get("VASWANI_TEST_CACHE") or Path.home() / ".cache" / "vaswani-tests"
    return Path(root)


def fairseq_python(log=sys.stderr) -> Path:
    """The interpreter of a virtual environment in which `import fairseq` works, built on first use."""
    venv = cache_dir() / f"{FAIRSEQ.replace('==', '-')}-{TORCH.replace('==', '-')}"
    python = venv / "bin" / "python"
    done = venv / ".built"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test sessions at once build it once
        if done.is_file():
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        for step in ([TORCH, "numpy<2", "Cython", "setuptools", "wheel", *EXTRAS],
                     ["--no-build-isolation", FAIRSEQ]):  # fmt: skip
            print(f"fairseq's environment: pip install {' '.join(step)}", file=log, flush=True)
            result = subprocess.run([*pip, *step], env=env, capture_output=True, text=True)
            if result.returncode:
                raise RuntimeError(f"building fairseq's test environment in {venv} failed at `pip install "
                                   f"{' '.join(step)}`:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")  # fmt: skip
        probe = "import fairseq, fairseq.sequence_generator; print(fairseq.__version__)"
        check = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if check.returncode:
            raise RuntimeError(f"fairseq was installed in {venv} but does not import:\n{check.stderr[-5000:]}")
        done.write_text(check.stdout)
        return python


if __name__ == "__main__":
    print(fairseq_python())
