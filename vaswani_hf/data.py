"""Parallel text: a folder of `{split}.{lang}` files (e.g. ../shared/data/multi30k_en_de: train.en, train.de...),
`{split}.tsv` or `{split}.jsonl` files, or a dataset from the Hugging Face Hub (for users online).

Every reader strips lines, drops pairs with an empty side (and logs how many; `keep_empty=True`, for scoring a
test set, keeps them, so each hypothesis stays beside its reference), and turns a malformed file into an error that
names the file and line, never silently shorter data."""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

Pairs = list[tuple[str, str]]


def _decode(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line} is not valid UTF-8; convert the file to UTF-8.") from None


def _clean(pairs: list[tuple[str, str]], where: str, keep_empty: bool = False) -> Pairs:
    stripped = [(s.strip(), t.strip()) for s, t in pairs]
    kept = stripped if keep_empty else [(s, t) for s, t in stripped if s and t]
    if len(kept) < len(stripped):
        logger.warning("%s: dropped %d of %d pairs with an empty side", where, len(stripped) - len(kept), len(pairs))
    if not kept:
        raise ValueError(f"{where} holds no non-empty sentence pairs.")
    return kept


def read_parallel(data_dir: str | Path, split: str, src: str, tgt: str, keep_empty: bool = False) -> Pairs:
    """Aligned (source, target) pairs from `{split}.{src}` and `{split}.{tgt}`: the line counts must agree."""
    paths = [Path(data_dir) / f"{split}.{lang}" for lang in (src, tgt)]
    sides = []
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: --data must hold {split}.{src} and {split}.{tgt} (one sentence a line)."
            )
        sides.append(_decode(path).splitlines())
    if len(sides[0]) != len(sides[1]):
        raise ValueError(
            f"{paths[0]} has {len(sides[0])} lines but {paths[1]} has {len(sides[1])}: parallel files must be aligned."
        )
    return _clean(list(zip(*sides, strict=True)), f"{paths[0]} + {paths[1]}", keep_empty)


def read_tsv(path: str | Path, keep_empty: bool = False) -> Pairs:
    """`source<TAB>target` lines. No quoting rules: a tab inside a sentence is an error, not a silent shift."""
    path = Path(path)
    pairs = []
    for number, line in enumerate(_decode(path).splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}: line {number} has {len(fields)} tab-separated fields, not source<TAB>target.")
        pairs.append((fields[0], fields[1]))
    return _clean(pairs, str(path), keep_empty)


def _pair_from_record(record: dict, src: str, tgt: str, where: str) -> tuple[str, str]:
    fields = record.get("translation", record)
    if not isinstance(fields, dict) or src not in fields or tgt not in fields:
        keys = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
        raise ValueError(
            f"{where}: no {src!r} and {tgt!r} fields (found {keys}); expected {{{src!r}: ..., {tgt!r}: ...}} or "
            f"{{'translation': {{{src!r}: ..., {tgt!r}: ...}}}}. Check --src/--tgt."
        )
    return str(fields[src]), str(fields[tgt])


def read_jsonl(path: str | Path, src: str, tgt: str, keep_empty: bool = False) -> Pairs:
    """One JSON object a line: `{"translation": {"en": ..., "de": ...}}` (run_translation's format) or flat."""
    path = Path(path)
    pairs = []
    for number, line in enumerate(_decode(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {number} is not valid JSON ({err.msg}).") from None
        pairs.append(_pair_from_record(record, src, tgt, f"{path}: line {number}"))
    return _clean(pairs, str(path), keep_empty)


def read_hub_dataset(name: str, config: str | None, split: str, src: str, tgt: str) -> Pairs:
    """A split of a `datasets` dataset (Hub name or local folder), e.g. `wmt14` `de-en` (columns `translation`)."""
    from datasets import load_dataset

    try:
        dataset = load_dataset(name, config, split=split)
    except ValueError as err:
        raise ValueError(f"dataset {name!r} ({config}): cannot load split {split!r}: {err}") from None
    if "translation" not in dataset.column_names and not {src, tgt} <= set(dataset.column_names):
        raise ValueError(
            f"dataset {name!r} split {split!r} has columns {dataset.column_names}, but neither 'translation' nor "
            f"{src!r} and {tgt!r}. Check --src/--tgt."
        )
    where = f"dataset {name!r} split {split!r}"
    if "translation" in dataset.column_names:
        return _clean([_pair_from_record(r, src, tgt, where) for r in dataset["translation"]], where)
    return _clean(list(zip(dataset[src], dataset[tgt], strict=True)), where)


def load_split(data: str | None, split: str, src: str, tgt: str, dataset_config: str | None = None,
               hub: bool = False, keep_empty: bool = False) -> Pairs:  # fmt: skip
    """One split from `data`: a Hub dataset name when `hub`, else a folder holding `{split}.{src}` +
    `{split}.{tgt}`, `{split}.tsv` or `{split}.jsonl` (first found)."""
    if hub:
        return read_hub_dataset(data, dataset_config, split, src, tgt)
    folder = Path(data)
    if not folder.is_dir():
        raise FileNotFoundError(f"--data {data}: no such folder (expected {split}.{src} + {split}.{tgt} inside).")
    if (folder / f"{split}.{src}").is_file() or (folder / f"{split}.{tgt}").is_file():
        return read_parallel(folder, split, src, tgt, keep_empty)
    if (folder / f"{split}.tsv").is_file():
        return read_tsv(folder / f"{split}.tsv", keep_empty)
    if (folder / f"{split}.jsonl").is_file():
        return read_jsonl(folder / f"{split}.jsonl", src, tgt, keep_empty)
    raise FileNotFoundError(
        f"{folder} holds no {split}.{src} + {split}.{tgt}, {split}.tsv or {split}.jsonl: check --data and the split "
        f"name (found: {', '.join(sorted(p.name for p in folder.iterdir())[:10]) or 'nothing'})."
    )
