"""Where a converter writes: a new folder, filled beside OUT_DIR and renamed to it only once whole, so a conversion
that stops (a malformed file, a refused field, an interrupt) leaves nothing half done."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def check_free(out_dir: str | Path) -> None:
    """A converter writes a new (or empty) folder: checked before anything is read."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir}: exists and is not empty; give a new folder.")


def staged_output(out_dir: Path) -> Path:
    """A fresh folder beside `out_dir`, renamed to it once everything is written (nothing half done is left)."""
    check_free(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))


def write_languages(folder: Path, source_lang: str, target_lang: str, converted_from: dict) -> None:
    """The pair, where `vaswani serve` and the model card read a model's languages (`training_facts.json`), and
    where the weights came from."""
    facts = {"data": {"src": source_lang, "tgt": target_lang}, "converted_from": converted_from}
    (folder / "training_facts.json").write_text(json.dumps(facts, indent=2) + "\n")


def publish(staging: Path, out_dir: Path) -> Path:
    if out_dir.exists():
        out_dir.rmdir()  # empty (checked before staging)
    staging.rename(out_dir)
    return out_dir


def copy_files(src_dir: Path, folder: Path, names: tuple[str, ...]) -> None:
    """The peer's files of these names that `src_dir` holds (its tokenizer's), copied into `folder`."""
    for name in names:
        if (src_dir / name).is_file():
            shutil.copy2(src_dir / name, folder / name)


def write_folder(out_dir: str | Path, fill: Callable[[Path], None]) -> Path:
    """`fill(folder)` writes the converted model into a staging folder, which becomes `out_dir` when it returns."""
    out_dir = Path(out_dir)
    staging = staged_output(out_dir)
    try:
        fill(staging)
        return publish(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
