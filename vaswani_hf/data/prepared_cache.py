"""The cache of prepared data: what identifies a preparation (its key), where it lives, the lock and staging folder
that keep it whole, and how it is cleared.

A preparation's key covers what changes its result: the training files' *content* (a whole-file SHA-256), the
language pair, the vocabulary options (or the given tokenizer's content), `max_length`, and the format. Reading 9.3
GB to hash it takes about 10 s, so a file's hash is remembered beside the cache by what `stat` says of it (path,
size, modification and change time, inode): an untouched file is not read again, and a file rewritten in place with
its old size and modification time restored (`touch -r`, `cp -p`, `rsync -a`) has another change time or inode,
so it is hashed again. Each evaluation split is keyed on its own (its files and the vocabulary), so a split added
later is prepared alone, and a file the run does not ask for is never read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from .readers import folder_splits, hub_split, split_chunks, split_files

FORMAT = 2  # raise when the layout or the tokenized columns change: older preparations are then made anew
# raise when the readers give an evaluation split other pairs (3: a TSV line of a tab alone is a pair, no longer
# skipped as blank): its splits, small, are then prepared anew, and the training split, whose pairs it does not
# change, is kept
EVAL_READING = 3
HASHES = "file-hashes.json"


def cache_dir() -> Path:
    """Where `vaswani train --data RAW` keeps its preparations: $VASWANI_PREPARED_CACHE, else
    `vaswani_prepared/` in the 🤗 Datasets cache ($HF_DATASETS_CACHE, by default ~/.cache/huggingface/datasets)."""
    if os.environ.get("VASWANI_PREPARED_CACHE"):
        return Path(os.environ["VASWANI_PREPARED_CACHE"])
    import datasets.config

    return Path(datasets.config.HF_DATASETS_CACHE) / "vaswani_prepared"


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}:{stat.st_ino}:{stat.st_dev}"


def _memo() -> dict:
    try:
        return json.loads((cache_dir() / HASHES).read_text())
    except (OSError, ValueError):
        return {}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()  # (hashlib.file_digest is Python 3.11's; the package supports 3.10)
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 23), b""):
            digest.update(block)
    return digest.hexdigest()


def content_hashes(paths: list[Path], read: bool = True) -> list[str | None]:
    """The SHA-256 of each whole file, read only when the file's `stat` identity is not in the remembered hashes
    (`read=False`: None then). Files are hashed at once in threads (hashlib lets go of the GIL): the two sides of
    WMT14 en-fr, 9.8 GB, in about 6 s on 2 cores."""
    paths = [path.resolve() for path in paths]
    memo, stamps = _memo(), [_stamp(path) for path in paths]
    entries = [memo.get(str(path), {}) for path in paths]
    known = [e.get("sha256") if e.get("stamp") == s else None for e, s in zip(entries, stamps, strict=True)]
    missing = [i for i, sha in enumerate(known) if sha is None]
    if not read or not missing:
        return known
    with ThreadPoolExecutor(len(missing)) as pool:
        for i, sha in zip(missing, pool.map(_sha256, [paths[i] for i in missing]), strict=True):
            known[i] = sha
    memo = {p: entry for p, entry in _memo().items() if Path(p).is_file()}  # forget files that are gone
    for i in missing:
        if _stamp(paths[i]) == stamps[i]:  # not written to while we read: remember it
            memo[str(paths[i])] = {"stamp": stamps[i], "sha256": known[i]}
    memo_path = cache_dir() / HASHES
    staging = memo_path.with_name(f".{HASHES}.{uuid.uuid4().hex[:8]}")
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        staging.write_text(json.dumps(memo))
        os.replace(staging, memo_path)  # a concurrent writer's entry may be lost: that file is then hashed again
    except OSError:  # a cache that cannot be written to (read-only, full): the files are hashed again next time
        with contextlib.suppress(OSError):
            staging.unlink(missing_ok=True)
    return known


def file_identities(paths: list[Path]) -> list[dict]:
    return [{"path": str(path.resolve()), "size": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns,
             "sha256": sha} for path, sha in zip(paths, content_hashes(paths), strict=True)]  # fmt: skip


def changed(known: dict) -> bool:
    """Whether a file recorded by `file_identities` is gone or changed: another size or modification time, or
    other content where its hash is remembered (a warning for a prepared folder should not read 9 GB)."""
    path = Path(known.get("path", ""))
    if "path" not in known:
        return False  # a Hub dataset, named by its fingerprint
    stat = path.stat() if path.is_file() else None
    if stat is None or (stat.st_size, stat.st_mtime_ns) != (known["size"], known["mtime_ns"]):
        return True
    return content_hashes([path], read=False)[0] not in (None, known["sha256"])


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """A saved fast tokenizer: a folder (`AutoTokenizer`) or a tokenizer.json file."""
    path = Path(path)
    if path.is_file():
        return PreTrainedTokenizerFast(tokenizer_file=str(path), pad_token="<pad>", bos_token="<s>",
                                       eos_token="</s>", unk_token="<unk>")  # fmt: skip
    if not path.is_dir():
        raise FileNotFoundError(f"--tokenizer {path}: no such file or folder; give a folder with tokenizer.json "
                                "(a model's, or a prepared folder's tokenizer/) or the file itself.")  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.is_fast:
        raise ValueError(f"--tokenizer {path}: a slow (Python) tokenizer; give a folder with tokenizer.json.")
    return tokenizer


def tokenizer_hash(tokenizer: str | Path | PreTrainedTokenizerFast) -> str:
    """The SHA-256 of a fast tokenizer's whole definition (a saved one's path, or the tokenizer)."""
    tokenizer = tokenizer if isinstance(tokenizer, PreTrainedTokenizerFast) else load_tokenizer(tokenizer)
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


@dataclass(frozen=True)
class PreparationRequest:
    """What to prepare: a data folder or Hub dataset, its language pair, and the options that change the result."""

    data: str
    src: str
    tgt: str
    hub: bool = False
    config: str | None = None
    vocab_size: int = 37000
    split_punctuation: bool = True
    bpe_sample_lines: int | None = None  # None: every training pair
    tokenizer: str | None = None  # a saved tokenizer (folder or tokenizer.json) used instead of training BPE
    max_length: int | None = 256
    train_split: str = "train"
    whole_target_words: bool = False  # a parser's target: its space-separated symbols are vocabulary entries whole

    def available_splits(self) -> list[str]:
        if self.hub:
            from datasets import get_dataset_split_names

            return list(get_dataset_split_names(self.data, self.config))
        return folder_splits(self._folder(), self.src, self.tgt)

    def _folder(self) -> Path:
        folder = Path(self.data)
        if not folder.is_dir():
            raise FileNotFoundError(f"--data {self.data}: no such folder (expected {self.train_split}.{self.src} + "
                                    f"{self.train_split}.{self.tgt} inside).")  # fmt: skip
        return folder

    def files(self, split: str) -> list[dict]:
        """The files that hold `split`, with what identifies their content; a Hub dataset's split is named by its
        fingerprint. A split the data lacks is the reader's error, which names what the folder holds."""
        if self.hub:
            fingerprint = hub_split(self.data, self.config, split)._fingerprint
            return [{"dataset": self.data, "config": self.config, "split": split, "fingerprint": fingerprint}]
        paths = split_files(self._folder(), split, self.src, self.tgt)
        if not paths or not all(path.is_file() for path in paths):
            list(split_chunks(self.data, split, self.src, self.tgt))  # raises the reader's error
        return file_identities(paths)

    def vocabulary(self) -> dict:
        if self.tokenizer:
            return {"tokenizer": str(Path(self.tokenizer).resolve()), "sha256": tokenizer_hash(self.tokenizer)}
        bpe = {"vocab_size": self.vocab_size, "split_punctuation": self.split_punctuation,
               "sample_lines": self.bpe_sample_lines}  # fmt: skip
        return {"bpe": {**bpe, "whole_target_words": True} if self.whole_target_words else bpe}

    def key(self) -> tuple[str, dict]:
        """The training split's key, and its inputs for the manifest."""
        inputs = {"format": FORMAT, "files": self.files(self.train_split), "src": self.src, "tgt": self.tgt,
                  "train_split": self.train_split, "vocabulary": self.vocabulary(),
                  "max_length": self.max_length}  # fmt: skip
        return digest(inputs), inputs

    def split_key(self, split: str, tokenizer_sha256: str) -> tuple[str, dict]:
        """An evaluation split's key (its files and the vocabulary that tokenizes it), and its inputs."""
        inputs = {"format": FORMAT, "reading": EVAL_READING, "split": split, "files": self.files(split),
                  "src": self.src, "tgt": self.tgt, "tokenizer_sha256": tokenizer_sha256}  # fmt: skip
        return digest(inputs), inputs


def digest(inputs: dict) -> str:
    """A key from the inputs; paths and modification times are recorded, not hashed: the content decides."""
    hashed = {**inputs, "files": [{k: v for k, v in f.items() if k not in ("path", "mtime_ns")}
                                  for f in inputs["files"]]}  # fmt: skip
    return hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()[:20]


def _lock(final: Path) -> FileLock:
    return FileLock(str(final.parent / f".{final.name}.lock"))


def _built_name(entry: str) -> str:
    """The folder a staging folder (`.NAME.tmp-*`) is built for; any other name is its own."""
    return entry[1:].rsplit(".tmp-", 1)[0] if entry.startswith(".") and ".tmp-" in entry else entry


@contextlib.contextmanager
def locked(final: Path, say) -> Iterator[None]:
    """Hold `final`'s lock: processes that want the same preparation wait here, on a file, never in a collective
    that a distributed run could time out. Sweeps staging folders that killed preparations left beside it. A
    failure removes the lock file (a process waiting on it then takes a new one: `_acquire`); a folder where the
    lock file cannot be created is the system's error, at once, not a wait."""
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock(final)
    try:
        _acquire(lock, timeout=1)
    except Timeout:
        if not os.path.exists(lock.lock_file):  # no one holds it, yet it was not taken: can it be created at all?
            os.close(os.open(lock.lock_file, os.O_WRONLY | os.O_CREAT, 0o644))
        say(f"data: waiting for another process that is preparing {final} (lock {lock.lock_file})")
        _acquire(lock)
    try:
        sweep_staging(final.parent, held=final.name)
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(lock.lock_file)  # while it is held: no one else holds this file
        raise
    finally:
        lock.release()


def _acquire(lock: FileLock, timeout: float = -1) -> None:
    """Take `lock`, on the file its path names now: a process that failed removes the file it held, and a process
    that was waiting on that file then holds a file no one else opens (recent filelock releases check this too)."""
    while True:
        lock.acquire(timeout=timeout)
        held = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
        try:
            if held is None or os.path.samestat(os.fstat(held), os.stat(lock.lock_file)):
                return
        except FileNotFoundError:
            pass
        lock.release()


def staging_folder(final: Path) -> Path:
    return final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"


def sweep_staging(parent: Path, held: str | None = None) -> None:
    """Delete the staging folders of preparations that no process is building (their lock is free)."""
    for stale in parent.glob(".*.tmp-*"):
        name = _built_name(stale.name)
        if name == held:  # our own lock is held by us: its staging folders are a killed run's
            shutil.rmtree(stale, ignore_errors=True)
            continue
        lock = _lock(parent / name)
        try:
            _acquire(lock, timeout=0)
        except Timeout:
            continue  # being built right now
        try:
            shutil.rmtree(stale, ignore_errors=True)
        finally:
            lock.release()


def check_free_space(folder: Path, needed: int, what: str) -> None:
    """Stop before writing when the disk cannot hold `needed` bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(f"not enough free disk space in {folder} to prepare {what}: about {_size(needed)} is needed "
                      f"while preparing, {_size(free)} is free. Free some space, or prepare elsewhere "
                      "(vaswani prepare --output_dir DIR, or VASWANI_PREPARED_CACHE=DIR).")  # fmt: skip


def _size(count: int) -> str:
    """Bytes as GB, below one GB as MB, below 0.1 MB as kB (a small need is not "0.0 GB")."""
    if count >= 1e9:
        return f"{count / 1e9:.1f} GB"
    return f"{count / 1e6:.1f} MB" if count >= 1e5 else f"{count / 1e3:.0f} kB"


def clear_cache(say) -> tuple[Path, int]:
    """Delete every preparation in the cache, each under its lock (one being built is skipped and named); returns
    the cache folder and the bytes freed. The empty lock files stay: deleting a lock file that another process
    may be about to open would let two processes hold it."""
    folder = cache_dir()
    if not folder.is_dir():
        return folder, 0
    freed = 0
    for entry in sorted(folder.iterdir()):
        if entry.name.endswith(".lock"):
            continue
        if entry.is_file():  # the remembered file hashes
            freed += entry.stat().st_size
            entry.unlink()
            continue
        lock = _lock(folder / _built_name(entry.name))
        try:
            _acquire(lock, timeout=0)
        except Timeout:
            say(f"data: {entry} is being prepared by another process: left in place")
            continue
        try:
            freed += sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
            shutil.rmtree(entry)
        finally:
            lock.release()
    return folder, freed
