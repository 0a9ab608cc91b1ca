"""Parallel text: a folder of `{split}.{lang}` files (e.g. ../shared/data/multi30k_en_de: train.en, train.de...),
`{split}.tsv` or `{split}.jsonl` files, or a dataset from the Hugging Face Hub (for users online).

Every reader streams: it yields Arrow tables of a bounded number of lines (`source`, `target`, and `line`, the
number of the pair's line in its file), so a WMT-sized corpus never sits in memory as Python objects. Lines end at
"\\n" only (as Moses and fairseq read them), and each side is stripped. A malformed file is an error that names the
file and the line, at any size, never silently shorter data. A UTF-8 byte-order mark at the start of a file is
dropped. `DropEmptyPairs` drops pairs with an empty side and logs how many; `keep_empty=True`, for scoring a test
set, keeps them, so each hypothesis stays beside its reference.
`load_split` gives a small split as a Python list of pairs."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from itertools import islice, zip_longest
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

logger = logging.getLogger(__name__)

Pairs = list[tuple[str, str]]
CHUNK_LINES = 1 << 17  # lines read at a time: a few tens of MB of text


def _pairs(sources, targets, lines: int | list[int] | pa.Array) -> pa.Table:
    """What every reader yields: both sides (lists of str, or Arrow text) as stripped large strings, and each
    pair's line number (`lines`: the numbers, or the first one of consecutive lines)."""
    text = pa.large_string()
    sides = [pc.utf8_trim_whitespace(pc.cast(side, text) if isinstance(side, pa.Array | pa.ChunkedArray)
                                     else pa.array(side, text)) for side in (sources, targets)]  # fmt: skip
    if isinstance(lines, int):
        lines = range(lines, lines + len(sides[0]))
    return pa.table([*sides, pa.array(lines, pa.int64())], names=["source", "target", "line"])


def _decoded_lines(path: Path, raw: list[bytes], first_line: int) -> list[str]:
    """`raw` lines (each ending with b"\\n" but maybe the last) as text; bad UTF-8 names its line."""
    data = b"".join(raw)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + data[: err.start].count(b"\n")
        raise ValueError(f"{path}: line {line} is not valid UTF-8; convert the file to UTF-8.") from None
    return text.removesuffix("\n").split("\n") if raw else []


def _line_chunks(path: Path, chunk_lines: int) -> Iterator[tuple[int, list[str]]]:
    with open(path, "rb") as file:
        first = 1
        while raw := list(islice(file, chunk_lines)):
            if first == 1:  # a UTF-8 byte-order mark (Windows editors write one) is no part of the first sentence
                raw[0] = raw[0].removeprefix(b"\xef\xbb\xbf")
            yield first, _decoded_lines(path, raw, first)
            first += len(raw)


def _count_lines(path: Path) -> int:
    """Lines in a file, the last one counted whether or not it ends with a newline."""
    count, last = 0, b"\n"
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 24), b""):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")


def parallel_chunks(data_dir: str | Path, split: str, src: str, tgt: str,
                    chunk_lines: int = CHUNK_LINES) -> Iterator[pa.Table]:  # fmt: skip
    """Aligned pairs from `{split}.{src}` and `{split}.{tgt}`: the line counts must agree."""
    paths = [Path(data_dir) / f"{split}.{lang}" for lang in (src, tgt)]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: --data must hold {split}.{src} and {split}.{tgt} (one sentence a line)."
            )
    for source, target in zip_longest(*(_line_chunks(path, chunk_lines) for path in paths)):
        if source is None or target is None or len(source[1]) != len(target[1]):
            break
        yield _pairs(source[1], target[1], source[0])
    else:
        return
    counts = [_count_lines(path) for path in paths]
    raise ValueError(f"{paths[0]} has {counts[0]} lines but {paths[1]} has {counts[1]}: parallel files must be "
                     "aligned.")  # fmt: skip


def tsv_chunks(path: str | Path, chunk_lines: int = CHUNK_LINES) -> Iterator[pa.Table]:
    """`source<TAB>target` lines; blank lines are skipped. No quoting rules: a tab inside a sentence is an error,
    not a silent shift."""
    path = Path(path)
    for first, lines in _line_chunks(path, chunk_lines):
        lines = pa.array(lines, pa.large_string())
        numbers = pa.array(range(first, first + len(lines)), pa.int64())
        blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(lines)), 0)
        lines, numbers = lines.filter(pc.invert(blank)), numbers.filter(pc.invert(blank))
        fields = pc.split_pattern(lines, "\t")
        counts = pc.list_value_length(fields)
        bad = pc.not_equal(counts, 2)
        if pc.any(bad).as_py():
            at = pc.index(bad, True).as_py()
            raise ValueError(f"{path}: line {numbers[at]} has {counts[at]} tab-separated fields, not "
                             "source<TAB>target.")  # fmt: skip
        yield _pairs(pc.list_element(fields, 0), pc.list_element(fields, 1), numbers)


def _pair_from_record(record: dict, src: str, tgt: str, where: str) -> tuple[str, str]:
    fields = record.get("translation", record) if isinstance(record, dict) else record
    if not isinstance(fields, dict) or src not in fields or tgt not in fields:
        keys = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
        raise ValueError(
            f"{where}: no {src!r} and {tgt!r} fields (found {keys}); expected {{{src!r}: ..., {tgt!r}: ...}} or "
            f"{{'translation': {{{src!r}: ..., {tgt!r}: ...}}}}. Check --src/--tgt."
        )
    return str(fields[src]), str(fields[tgt])


def _records_in_python(path: Path, lines: list[str], first: int, src: str, tgt: str) -> pa.Table:
    """The slow reader, for a chunk Arrow's JSON reader refused: it names the line at fault."""
    sources, targets, numbers = [], [], []
    for number, line in enumerate(lines, first):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {number} is not valid JSON ({err.msg}).") from None
        source, target = _pair_from_record(record, src, tgt, f"{path}: line {number}")
        sources.append(source), targets.append(target), numbers.append(number)
    return _pairs(sources, targets, numbers)


def jsonl_chunks(path: str | Path, src: str, tgt: str, chunk_lines: int = CHUNK_LINES) -> Iterator[pa.Table]:
    """One JSON object a line: `{"translation": {"en": ..., "de": ...}}` (run_translation's format) or flat.
    Arrow's JSON reader parses each chunk; a chunk it refuses (bad JSON, a missing field, mixed types) is read
    again line by line, which names the line at fault or reads what Arrow would not."""
    path = Path(path)
    for first, lines in _line_chunks(path, chunk_lines):
        if "" in lines or any(map(str.isspace, lines)):  # keep line numbers exact: the slow reader skips blanks
            yield _records_in_python(path, lines, first, src, tgt)
            continue
        try:
            table = pa_json.read_json(io.BytesIO("\n".join(lines).encode()))
            sides = table.column("translation").combine_chunks() if "translation" in table.column_names else table
            columns = [_text(sides.field(n) if "translation" in table.column_names else sides.column(n))
                       for n in (src, tgt)]  # fmt: skip
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError):
            yield _records_in_python(path, lines, first, src, tgt)
            continue
        yield _pairs(*columns, first)


def _text(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A JSON field read by Arrow, refused unless every value is a scalar (the slow reader then decides)."""
    if pa.types.is_struct(column.type) or pa.types.is_list(column.type) or column.null_count:
        raise pa.ArrowInvalid("not a text field")
    return column


def hub_chunks(name: str, config: str | None, split: str, src: str, tgt: str,
               chunk_lines: int = CHUNK_LINES) -> Iterator[pa.Table]:  # fmt: skip
    """A split of a `datasets` dataset (Hub name or local folder), e.g. `wmt14` `de-en` (columns `translation`),
    read from its Arrow files a chunk at a time."""
    from datasets import load_dataset

    try:
        dataset = load_dataset(name, config, split=split)
    except ValueError as err:
        raise ValueError(f"dataset {name!r} ({config}): cannot load split {split!r}: {err}") from None
    translation = "translation" in dataset.column_names
    if not translation and not {src, tgt} <= set(dataset.column_names):
        raise ValueError(
            f"dataset {name!r} split {split!r} has columns {dataset.column_names}, but neither 'translation' nor "
            f"{src!r} and {tgt!r}. Check --src/--tgt."
        )
    first = 1
    for table in dataset.with_format("arrow").iter(batch_size=chunk_lines):
        sides = table.column("translation").combine_chunks() if translation else table
        missing = [lang for lang in (src, tgt) if lang not in [f.name for f in sides.type]] if translation else []
        if missing:
            _pair_from_record(sides[0].as_py(), src, tgt, f"dataset {name!r} split {split!r}")
        yield _pairs(*(sides.field(n) if translation else sides.column(n) for n in (src, tgt)), first)
        first += len(table)


def split_files(folder: Path, split: str, src: str, tgt: str) -> list[Path]:
    """The files that hold `split` in `folder` (the first format found), or [] when none does."""
    for candidates in ([f"{split}.{src}", f"{split}.{tgt}"], [f"{split}.tsv"], [f"{split}.jsonl"]):
        if any((folder / name).is_file() for name in candidates):
            return [folder / name for name in candidates]
    return []


def folder_splits(folder: Path, src: str, tgt: str) -> list[str]:
    """Every split a data folder holds, in any of the three formats."""
    names = set()
    for path in folder.iterdir():
        stem, suffix = path.stem, path.suffix.lstrip(".")
        if path.is_file() and suffix in (src, tgt, "tsv", "jsonl") and split_files(folder, stem, src, tgt):
            names.add(stem)
    return sorted(names)


def split_chunks(data: str, split: str, src: str, tgt: str, dataset_config: str | None = None,
                 hub: bool = False, chunk_lines: int = CHUNK_LINES) -> Iterator[pa.Table]:  # fmt: skip
    """One split from `data`, as Arrow tables of at most `chunk_lines` pairs: a Hub dataset name when `hub`, else
    a folder holding `{split}.{src}` + `{split}.{tgt}`, `{split}.tsv` or `{split}.jsonl` (first found)."""
    if hub:
        return hub_chunks(data, dataset_config, split, src, tgt, chunk_lines)
    folder = Path(data)
    if not folder.is_dir():
        raise FileNotFoundError(f"--data {data}: no such folder (expected {split}.{src} + {split}.{tgt} inside).")
    files = split_files(folder, split, src, tgt)
    if not files:
        raise FileNotFoundError(
            f"{folder} holds no {split}.{src} + {split}.{tgt}, {split}.tsv or {split}.jsonl: check --data and the "
            f"split name (found: {', '.join(sorted(p.name for p in folder.iterdir())[:10]) or 'nothing'})."
        )
    if files[0].suffix == ".tsv":
        return tsv_chunks(files[0], chunk_lines)
    if files[0].suffix == ".jsonl":
        return jsonl_chunks(files[0], src, tgt, chunk_lines)
    return parallel_chunks(folder, split, src, tgt, chunk_lines)


class DropEmptyPairs:
    """Drops the pairs of a split with an empty side, chunk by chunk, and counts them."""

    def __init__(self, where: str, keep_empty: bool = False) -> None:
        self.where, self.keep_empty = where, keep_empty
        self.seen = self.dropped = 0

    def __call__(self, table: pa.Table) -> pa.Table:
        self.seen += len(table)
        if self.keep_empty:
            return table
        empty = pc.or_(*(pc.equal(pc.utf8_length(table.column(side)), 0) for side in ("source", "target")))
        kept = table.filter(pc.invert(empty))
        self.dropped += len(table) - len(kept)
        return kept

    def finish(self) -> None:
        """Log what was dropped; a split left with no pair is an error."""
        if self.dropped:
            logger.warning("%s: dropped %d of %d pairs with an empty side", self.where, self.dropped, self.seen)
        if self.seen - self.dropped == 0 or (self.keep_empty and not self.seen):
            raise ValueError(f"{self.where} holds no non-empty sentence pairs.")


def _as_pairs(chunks: Iterator[pa.Table], where: str, keep_empty: bool) -> Pairs:
    cleaner = DropEmptyPairs(where, keep_empty)
    tables = [cleaner(table) for table in chunks]
    cleaner.finish()
    table = pa.concat_tables(tables)
    return list(zip(table.column("source").to_pylist(), table.column("target").to_pylist(), strict=True))


def read_parallel(data_dir: str | Path, split: str, src: str, tgt: str, keep_empty: bool = False) -> Pairs:
    """Aligned (source, target) pairs from `{split}.{src}` and `{split}.{tgt}`: the line counts must agree."""
    where = f"{Path(data_dir) / f'{split}.{src}'} + {Path(data_dir) / f'{split}.{tgt}'}"
    return _as_pairs(parallel_chunks(data_dir, split, src, tgt), where, keep_empty)


def load_split(data: str | None, split: str, src: str, tgt: str, dataset_config: str | None = None,
               hub: bool = False, keep_empty: bool = False) -> Pairs:  # fmt: skip
    """One (small) split from `data` as a list of pairs: see `split_chunks`."""
    where = f"dataset {data!r} split {split!r}" if hub else " + ".join(
        str(p) for p in split_files(Path(data), split, src, tgt)) if Path(data).is_dir() else str(data)  # fmt: skip
    return _as_pairs(split_chunks(data, split, src, tgt, dataset_config, hub), where, keep_empty)
