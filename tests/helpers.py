"""Shared by the tests: run the `vaswani` command in a subprocess, tiny training settings, remote-code loading."""

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY_RUN = ["--preset", "tiny", "--max_steps", "4", "--warmup_steps", "2", "--vocab_size", "120",
            "--per_device_train_batch_size", "8", "--disable_tqdm", "true", "--max_eval_samples", "8"]  # fmt: skip
# Enough steps that the tiny model translates the built-in task with varied outputs (a 4-step model repeats one
# token, which any export would reproduce): what the export tests export.
TRAINED_RUN = ["--preset", "tiny", "--max_steps", "250", "--warmup_steps", "50", "--vocab_size", "120",
               "--per_device_train_batch_size", "32", "--disable_tqdm", "true", "--max_eval_samples", "8",
               "--eval_split", "none"]  # fmt: skip
# The session's shared trainings (conftest.py's fixtures; test_docs.py's workspace parser):
# fp32 whatever the CPU: `--precision auto` trains in bf16 where it is fast, and a 4-step model's words (which
# the serve and CLI tests compare) then depend on the CPU kind
RUN = [*TINY_RUN, "--precision", "fp32"]
# checkpoints: the docs' `vaswani average` blocks use them
TRANSLATOR_RUN = [*TRAINED_RUN, "--max_steps", "1000", "--warmup_steps", "100", "--save_steps", "200"]
# 60 steps at the full rate after a 30-step warmup: enough for S/NP/VP brackets on every CPU kind tried (F1 23-55
# on the docs' six gold sentences; 30 steps under the built-in's 400-step warmup left flat trees and EVALB's F1 at
# -nan on some)
DOCS_PARSER_RUN = ["--task", "parse", "--preset", "tiny", "--max_steps", "60", "--warmup_steps", "30", "--lr_scale",
                   "1", "--vocab_size", "200", "--eval_split", "none", "--disable_tqdm", "true"]  # fmt: skip


# The shared models the tests train (session and module fixtures), kept between test sessions on this machine: the
# README's fast tier trains most, and .ci/run's second tier (both of its workers) and a developer's next run copy
# them while nothing they depend on changed. VASWANI_TEST_TRAININGS=0 trains afresh in every session; another value
# is the folder they are kept in.
TRAININGS = Path(os.environ.get("VASWANI_TEST_TRAININGS") or
                 Path(tempfile.gettempdir()) / f"vaswani-hf-test-trainings-{os.getuid()}").resolve()  # fmt: skip
_PACKAGE = Path(__file__).resolve().parent.parent
# what a training's output depends on besides the package's files, the installed distributions and the arguments
# (the per-session caches that conftest.py points into fresh temporary folders are left out: they hold
# measurements, not the model)
_ENVIRONMENT = ("VASWANI_", "ATEN_", "ONEDNN_", "DNNL_", "MKL_", "OMP_", "KMP_", "GOMP_", "TORCH", "PYTORCH_", "CUDA_",
                "CUBLAS_", "NVIDIA_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "ACCELERATE_", "PYTHONHASHSEED",
                "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_")  # fmt: skip
_SESSION_PATHS = ("VASWANI_PRECISION_CACHE", "VASWANI_PREPARED_CACHE", "VASWANI_TEST_TRAININGS")
_OUT = "<the model folder>"  # the training's output folder in its kept stdout: each session's own copy
_KEPT_DAYS = 3


def _training_key(args: list[str]) -> str:
    digest = hashlib.sha256(json.dumps(args).encode())
    distributions = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    digest.update("\n".join(distributions).encode())
    digest.update(f"{sys.version}|{platform.machine()}|{platform.processor()}|{os.cpu_count()}".encode())
    with contextlib.suppress(OSError):  # the CPU's model and flags: a float sum's order follows its kernels
        cpu = {line for line in open("/proc/cpuinfo", "rb") if line.startswith((b"model name", b"flags"))}
        digest.update(b"".join(sorted(cpu)))
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENVIRONMENT))
    digest.update(json.dumps([(k, v) for k, v in environment if k not in _SESSION_PATHS]).encode())
    for path in sorted([*(_PACKAGE / "vaswani_hf").rglob("*"), _PACKAGE / "pyproject.toml"]):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def _contents(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}  # fmt: skip


@contextlib.contextmanager
def _locked(kept: Path, blocking: bool = True, wait: float = 3600):
    """`kept`'s lock (a file beside it), held by one session at a time; None when `blocking` is off and another
    session holds it."""

    def taken(lock) -> bool:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    with open(f"{kept}.lock", "a") as lock:  # the lock files stay: removing one would let two sessions lock two
        start = time.monotonic()
        while not taken(lock):
            if not blocking:
                yield None
                return
            if time.monotonic() - start > wait:
                raise TimeoutError(f"another test session held {kept}.lock for {wait:.0f} s: is it stuck?")
            time.sleep(0.5)  # another session (an xdist worker) is training the same
        yield lock


def _kept_record(kept: Path) -> dict | None:
    """The kept training's record, if it is whole and its files are as they were when it was kept."""
    try:
        record = json.loads((kept / "training.json").read_text())
        return record if record["contents"] == _contents(kept / "model") else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _train(args: list[str], out: Path) -> str:
    result = vaswani("train", *args, "--output_dir", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _train_command(args: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "vaswani_command", "train", *args, "--output_dir", str(out)]


class _Started:
    """A shared training started at the session's start (`start_training`), running in a process of its own."""

    def __init__(self, args: list[str], out: Path, key: str | None) -> None:
        self.args, self.out, self.key = args, out, key  # the key of the environment it runs in, read now
        self.stdout, self.stderr = out.parent / "train.stdout", out.parent / "train.stderr"
        with open(self.stdout, "w") as stdout, open(self.stderr, "w") as stderr:
            command = [sys.executable, "-c", _DIE_WITH_PARENT, *_train_command(args, out)]
            self.process = subprocess.Popen(command, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)

    def result(self) -> str:
        returncode = self.process.wait()
        assert returncode == 0, self.stderr.read_text()[-3000:]
        return self.stdout.read_text()

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


# Runs the command after it, killed when the test session ends without its finish hook (a SIGTERM, a CI
# timeout) instead of training for no one: Linux's PR_SET_PDEATHSIG, which the exec keeps; elsewhere nothing.
# (A `preexec_fn` would do it in the forked child, which is not safe while the session has threads.)
_DIE_WITH_PARENT = """import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except Exception:
    pass
os.execv(sys.argv[1], sys.argv[1:])"""


# (name, arguments) -> the training started at the session's start and not yet taken by `trained_once`
_STARTED: dict[tuple[str, tuple[str, ...]], _Started] = {}


def _fresh() -> bool:
    return os.environ.get("VASWANI_TEST_TRAININGS") == "0"


def start_training(name: str, args: list[str], tmp_path_factory) -> None:
    """Start `trained_once(name, args)`'s training now, in a process of its own, unless a kept one will do: the
    shared models (a `tiny` training runs on one thread) train on the core the session's first tests leave free,
    instead of each stopping the session when its first test asks for it (conftest.py's
    `pytest_collection_finish`). `stop_started_trainings` ends those no test took."""
    if (name, tuple(args)) in _STARTED:
        return
    key = None if _fresh() else _training_key(args)  # a fresh session keeps nothing: no key to hash
    if key is not None:
        TRAININGS.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _locked(TRAININGS / f"{name}-{key}", blocking=False) as lock:
            # kept already, or another session training it now (its fixture will wait for that one)
            if lock is None or _kept_record(TRAININGS / f"{name}-{key}") is not None:
                return
    _STARTED[name, tuple(args)] = _Started(args, tmp_path_factory.mktemp(name) / "model", key)


def stop_started_trainings() -> None:
    for started in _STARTED.values():
        started.stop()
    _STARTED.clear()


def trained_once(name: str, args: list[str], tmp_path_factory) -> tuple[Path, str]:
    """`vaswani train ARGS --output_dir FOLDER` -> (FOLDER, its stdout): FOLDER is this session's own (tests may
    write into it, as before), a copy of the same training kept by an earlier session (TRAININGS above) under a key
    of the arguments, the package's files, the installed distributions, the Python, the CPU and the environment.
    A kept training whose files changed since, or whose record is cut short, is trained again: by the process
    `start_training` started, where it did."""
    started = _STARTED.get((name, tuple(args)))
    out = started.out if started is not None else tmp_path_factory.mktemp(name) / "model"
    if started is not None:  # left in `_STARTED` until it ends: a session stopped meanwhile stops it

        def train() -> str:
            try:
                return started.result()
            finally:
                _STARTED.pop((name, tuple(args)), None)

    else:
        train = lambda: _train(args, out)  # noqa: E731
    if _fresh():
        return out, train()
    TRAININGS.mkdir(mode=0o700, parents=True, exist_ok=True)
    kept = TRAININGS / f"{name}-{started.key if started is not None else _training_key(args)}"
    with _locked(kept):
        record = _kept_record(kept)
        if record is None:
            stdout = train()
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(out, kept / "model")
            record = {"stdout": stdout.replace(str(out), _OUT), "contents": _contents(kept / "model")}
            (kept / "training.part").write_text(json.dumps(record))
            os.replace(kept / "training.part", kept / "training.json")  # whole, or not there
        else:
            if started is not None:  # kept by another session since this one started its own
                started.stop()
                _STARTED.pop((name, tuple(args)), None)
                shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(kept / "model", out)
            os.utime(kept / "training.json")
    _forget_old_trainings()
    return out, record["stdout"].replace(_OUT, str(out))


def _forget_old_trainings() -> None:
    """Trainings of code long changed (none used for _KEPT_DAYS days), each under its lock, passed over while a
    session holds it."""
    for kept in TRAININGS.iterdir():
        if not kept.is_dir():
            continue
        with _locked(kept, blocking=False) as lock:
            used = kept / "training.json" if (kept / "training.json").exists() else kept
            with contextlib.suppress(OSError):
                if lock is not None and time.time() - used.stat().st_mtime > _KEPT_DAYS * 86400:
                    shutil.rmtree(kept)


def forget_measured_ways(monkeypatch) -> None:
    """Empty, for one test, every choice of way that decoding has measured in this process (the decoder's linears and
    the output projection, decided or under trial), so that the test's searches measure again."""
    from vaswani_hf.model.speed import fast_products as fp

    for table in ("_FASTEST_LINEAR", "_LINEAR_TRIALS", "_FASTEST_PRODUCT", "_OUTPUT_TRIALS"):
        monkeypatch.setattr(fp, table, {})
    monkeypatch.setattr(fp, "_OUTPUT_TIMED_ON_STEPS", set())


def vaswani(*args, stdin=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "vaswani_command", *args], capture_output=True, text=True, input=stdin, env=env
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


# Load a saved model as remote code where vaswani_hf cannot be imported, and compute on the inputs saved beside it.
REMOTE_LOAD = """
import sys, torch
sys.modules["vaswani_hf"] = None  # only the checkpoint's own code may be used
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
path = sys.argv[1]
model = AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
assert type(AutoModel.from_pretrained(path, trust_remote_code=True)).__name__ == "VaswaniModel"
assert AutoConfig.from_pretrained(path, trust_remote_code=True).model_type == "vaswani"
inputs = torch.load(path + "/inputs.pt", weights_only=True)
source = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
force_words = inputs.pop("force_words", None)
with torch.no_grad():
    logits = model(**inputs).logits
    outputs = {"logits": logits, "beam": model.generate(**source), "greedy": model.generate(**source, num_beams=1)}
    if force_words is not None:  # n-best and constrained decoding too, with their scores
        for name, extra in (("nbest", {}), ("constrained", {"force_words": force_words})):
            out = model.generate(**source, num_return_sequences=2, output_sequence_scores=True, **extra)
            outputs[name], outputs[name + "_scores"] = out.sequences, out.sequences_scores
torch.save(outputs, path + "/remote.pt")
"""


def remote_code_outputs(path: Path, inputs: dict) -> dict:
    """The logits (for `inputs`, which hold input_ids, attention_mask and decoder_input_ids) and the default beam
    and greedy `generate()` outputs of the model saved in `path`, loaded as remote code in a fresh process."""
    import torch

    path = Path(path)
    torch.save(inputs, path / "inputs.pt")
    env = {**os.environ, "HF_HOME": str(path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", REMOTE_LOAD, str(path)], capture_output=True, text=True, env=env,
                            cwd=path, stdin=subprocess.DEVNULL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(path / "remote.pt", weights_only=True)


def broken_copy(source, target, how: str):
    """A copy of the model folder `source` at `target`, broken one way: "no weights", "truncated weights", "no
    config", "config not JSON", "another model type" (bert), "no tokenizer", "tokenizer larger than the model"."""
    import json
    import shutil

    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

    shutil.copytree(source, target)
    weights, config = target / "model.safetensors", target / "config.json"
    if how == "no weights":
        weights.unlink()
    elif how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:4096])
    elif how == "no config":
        config.unlink()
    elif how == "config not JSON":
        config.write_text("{oops")
    elif how == "another model type":
        config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "bert"}))
    elif how == "no tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (target / name).unlink(missing_ok=True)
    elif how == "tokenizer larger than the model":
        config.write_text(json.dumps({**json.loads(config.read_text()), "vocab_size": 50}))
        VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=50)).save_pretrained(target)
    else:
        raise ValueError(f"no such way to break a model folder: {how!r}")
    return target


# Scores of two paths that batch differently (a sentence alone or beside others, another row order) are the same
# sums added in another order: in fp32 they agree to about 1e-7 relative (-235.982498 against -235.982529 on an
# AVX2 CPU), so they are compared within this; trees and tokens are compared exactly.
SCORE_TOLERANCE = {"rel": 1e-5, "abs": 1e-4}


def same_rows_but_scores(got: list, expected: list, score_at: int = -1) -> None:
    """Rows of printed fields (`[..., tree, score]`, a score written as text or '' for none) equal field for field,
    but for their scores, which are equal within SCORE_TOLERANCE."""
    import pytest

    assert len(got) == len(expected), (got, expected)
    for row, want in zip(got, expected, strict=True):
        if isinstance(row[0], list):  # rows grouped by sentence
            same_rows_but_scores(row, want, score_at)
            continue
        fields, want_fields = [*row], [*want]
        score, want_score = fields.pop(score_at), want_fields.pop(score_at)
        assert fields == want_fields, (row, want)
        assert (score == "") == (want_score == ""), (row, want)
        if score != "":
            assert float(score) == pytest.approx(float(want_score), **SCORE_TOLERANCE), (row, want)


def grows_linearly(work, small: int, factor: int = 4, margin: float = 2.5) -> None:
    """Linear work shown without a wall-clock bound: `work(small * factor)` takes under `margin * factor` times as
    long as `work(small)` (a quadratic takes `factor` times more again), each timed as the least of five runs
    interleaved in this one run, so that a slower CPU or a busy machine slows both sizes alike. Under 10 ms for the
    larger size, the timer's noise and the machine's other jobs decide the ratio, not the work: such work passes
    (a quadratic this test is for takes seconds there)."""
    import time

    least = {small: float("inf"), small * factor: float("inf")}
    for _ in range(5):
        for size in least:
            start = time.perf_counter()
            work(size)
            least[size] = min(least[size], time.perf_counter() - start)
    assert least[small * factor] < max(margin * factor * least[small], 0.01), least


LETTER_WORDS = [a + b for a in "abcdefgh" for b in "aeiou"]  # the text of `paper_model_folder`'s tokenizer


def paper_model_folder(path: Path, seed: int = 0, model_max_length: int = 64, **overrides) -> Path:
    """A saved tiny model of random weights with a BPE tokenizer as `vaswani train` saves them (`train_shared_bpe`,
    its tokenizer.json and tokenizer_config.json) and the paper's decoding: the folders `vaswani translate` reads."""
    import torch

    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_hf.data.tokenization import train_shared_bpe

    texts = [" ".join(LETTER_WORDS[(i * 7 + k) % len(LETTER_WORDS)] for k in range(6)) + " ." for i in range(60)]
    tokenizer = train_shared_bpe(texts, vocab_size=80, model_max_length=model_max_length)
    torch.manual_seed(seed)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=len(tokenizer), **overrides))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
