"""Parallel text: a folder of `{split}.{lang}` files (e.g. ../shared/data/multi30k_en_de: train.en, train.de...),
`{split}.tsv` or `{split}.jsonl` files, or a dataset from the Hugging Face Hub (for users online).

Every reader streams: it yields Arrow tables of a bounded number of lines (`source`, `target`, and `line`, the
number of the pair's line in its file), so a WMT-sized corpus never sits in memory as Python objects. Lines end at
"\\n" only (as Moses and fairseq read them), and each side is stripped. A malformed file is an error that names the
file, the line and the fix, at any size, never silently shorter or rewritten data. A UTF-8 byte-order mark at the
start of a file is dropped; one inside it (files joined with `cat`) is removed and counted; a file in UTF-16 or
UTF-32 is refused first, naming its encoding (`encodings`). A file may be gzipped
(`train.en.gz`). What a reader changes (a mark removed, a JSON null read as an empty side, a line break inside a
JSON value replaced by a space, a TSV header skipped) is counted and said once per file (`_Notes`).
`DropEmptyPairs` drops pairs with an empty side and logs how many; `keep_empty=True`, for scoring a test set, keeps
them, so each hypothesis stays beside its reference. `load_split` gives a small split as a Python list of pairs."""

from __future__ import annotations

import gzip
import io
import json
import locale
import logging
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice, zip_longest
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from .encodings import check_utf8_encoding

logger = logging.getLogger(__name__)

Pairs = list[tuple[str, str]]
CHUNK_LINES = 1 << 17  # lines read at a time: a few tens of MB of text


BOM = b"\xef\xbb\xbf"  # U+FEFF in UTF-8


class _Notes:
    """What a reader changed in one file, counted, with the first line where it did; said once, at the end."""

    SAID = {
        "bom": "removed {count:,} byte-order marks (U+FEFF) inside the file, the first on line {line} (files joined "
               "with `cat` keep each one's mark)",
        "null": "{count:,} null values read as empty sentences, the first on line {line} (in a training split such a "
                "pair is dropped and counted)",
        "break": "{count:,} values held a line break (\\n or \\r), each replaced by a space, the first on line {line}",
        "header": "line {line} is a header naming the languages (or the columns): skipped",
        "headers": "{count:,} lines are headers naming the languages (the first line, and one after each byte-order "
                   "mark inside the file, where files were joined with `cat`), the first on line {line}: skipped",
        "quoted": "every field of the first {count:,} lines is in double quotes, as a spreadsheet's export writes "
                  "them: they are read as written, quotes included; export the file without quoting if the quotes "
                  "are not part of the sentences",
    }  # fmt: skip

    def __init__(self, where: Path | str) -> None:
        self.where, self.counts, self.lines = where, {}, {}

    def add(self, kind: str, count: int, line: int) -> None:
        if count:
            self.counts[kind] = self.counts.get(kind, 0) + count
            self.lines[kind] = min(self.lines.get(kind, line), line)

    def say(self) -> None:
        for kind, count in self.counts.items():
            said = self.SAID[f"{kind}s" if count > 1 and f"{kind}s" in self.SAID else kind]
            logger.warning("%s: %s", self.where, said.format(count=count, line=self.lines[kind]))


def _first(mask: pa.Array | pa.ChunkedArray, numbers: pa.Array) -> int:
    return numbers[pc.index(mask, True).as_py()].as_py()


def _pairs(sources, targets, lines: int | list[int] | pa.Array, notes: _Notes | None = None,
           values: bool = False) -> pa.Table:  # fmt: skip
    """What every reader yields: both sides (lists of str, or Arrow text) as stripped large strings, and each
    pair's line number (`lines`: the numbers, or the first one of consecutive lines). A null side (JSON's null) is
    an empty one, counted in `notes`. `values`: the sides are JSON or dataset values, which may hold a byte-order
    mark or a line break a text line cannot: the marks are removed, each line break replaced by a space, counted."""
    text = pa.large_string()
    count = len(sources)
    numbers = pa.array(range(lines, lines + count) if isinstance(lines, int) else lines, pa.int64())
    sides = []
    for side in (sources, targets):
        side = pc.cast(side, text) if isinstance(side, pa.Array | pa.ChunkedArray) else pa.array(side, text)
        if side.null_count and notes is not None:
            notes.add("null", side.null_count, _first(pc.is_null(side), numbers))
        side = side.fill_null("") if side.null_count else side
        if values:
            marked = pc.match_substring(side, "\ufeff")
            if pc.any(marked).as_py():
                notes.add("bom", pc.sum(pc.count_substring(side, "\ufeff")).as_py(), _first(marked, numbers))
                side = pc.replace_substring(side, "\ufeff", "")
        side = pc.utf8_trim_whitespace(side)
        if values:
            broken = pc.match_substring_regex(side, "[\r\n]")
            if pc.any(broken).as_py():
                notes.add("break", pc.sum(broken).as_py(), _first(broken, numbers))
                side = pc.replace_substring_regex(side, "\\s*[\r\n]\\s*", " ")
        sides.append(side)
    return pa.table([*sides, numbers], names=["source", "target", "line"])


def _decoded_lines(path: Path, data: bytes, first_line: int, notes: _Notes,
                   marked: list[int] | None = None) -> list[str]:  # fmt: skip
    """`data`, whole lines (each ending with b"\\n" but maybe the last), as text; bad UTF-8 and a carriage return
    that is not part of a line end name their line; byte-order marks inside the file are removed and counted, and
    the number of each line one begins is added to `marked`. More CRs alone than lines are the file's line ends
    (old Mac files); as many or fewer are strays inside lines (one a line, `a<CR>b<LF>`, is not a line end: the
    advice to replace each by a space keeps the lines aligned). Each is named as such."""
    if b"\r" in data and data.count(b"\r") - data.count(b"\r\n") - data.endswith(b"\r"):
        at = data.index(b"\r", 0, len(data) - 1)
        while data[at + 1 : at + 2] == b"\n":
            at = data.index(b"\r", at + 1, len(data) - 1)
        line = first_line + data.count(b"\n", 0, at)
        if data.count(b"\r") - data.count(b"\r\n") > data.count(b"\n") + (not data.endswith(b"\n")):
            raise ValueError(f"{path}: its lines end with a carriage return alone (CR, old Mac line ends), which "
                             "this reader does not split at (lines end at \\n): convert the file, e.g. "
                             f"`tr '\\r' '\\n' < {path.name} > {path.name}.unix`.")  # fmt: skip
        raise ValueError(f"{path}: line {line} holds a carriage return (CR) that does not end the line; other "
                         "tools read it as a line end, which misaligns parallel text: replace it with a space (`tr "
                         f"'\\r' ' ' < {path.name} > {path.name}.fixed` does so for each CR).")  # fmt: skip
    if BOM in data:
        notes.add("bom", data.count(BOM), first_line + data.count(b"\n", 0, data.index(BOM)))
        if marked is not None:
            marked += [first_line + data.count(b"\n", 0, m.end()) for m in re.finditer(b"(?:^|\n)" + BOM, data)]
        data = data.replace(BOM, b"")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + data[: err.start].count(b"\n")
        raise ValueError(f"{path}: line {line} is not valid UTF-8; convert the file to UTF-8.") from None
    return text.removesuffix("\n").split("\n") if data else []


def _open(path: Path):
    """A file's bytes: a gzipped one (`.gz`) decompressed as it is read."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """A damaged gzip file, said with its path and the fix (gzip and zlib name neither)."""
    try:
        yield
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        if isinstance(err, gzip.BadGzipFile) and "Not a gzipped file" in str(err):
            raise ValueError(f"{path}: not gzip data, though its name ends in .gz: rename it without .gz if it is "
                             "plain text, or compress it with gzip.") from None  # fmt: skip
        what = ("cut short (it ends before its end-of-stream marker, as an interrupted download or copy leaves it)"
                if isinstance(err, EOFError) else f"damaged ({err})")  # fmt: skip
        raise ValueError(f"{path}: the gzip file is {what}: fetch or compress it again (`gzip -t {path.name}` "
                         "checks a file).") from None  # fmt: skip


def _line_chunks(path: Path, chunk_lines: int, notes: _Notes,
                 marked: list[int] | None = None) -> Iterator[tuple[int, list[str]]]:  # fmt: skip
    """`chunk_lines` lines at a time, as text, with the number of the first; `marked`: see `_decoded_lines`."""
    with _reading(path), _open(path) as file:
        first = 1
        while raw := list(islice(file, chunk_lines)):
            if first == 1:  # a UTF-8 byte-order mark (Windows editors write one) is no part of the first sentence
                check_utf8_encoding(path, b"".join(line[:4096] for line in raw[:64])[:4096])
                raw[0] = raw[0].removeprefix(BOM)
            yield first, _decoded_lines(path, b"".join(raw), first, notes, marked)
            first += len(raw)


def _count_lines(path: Path) -> int:
    """Lines in a file, the last one counted whether or not it ends with a newline."""
    count, last = 0, b"\n"
    with _reading(path), _open(path) as file:
        for block in iter(lambda: file.read(1 << 24), b""):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")


def parallel_chunks(data_dir: str | Path, split: str, src: str, tgt: str,
                    chunk_lines: int = CHUNK_LINES) -> Iterator[pa.Table]:  # fmt: skip
    """Aligned pairs from `{split}.{src}` and `{split}.{tgt}` (or their `.gz`): the line counts must agree."""
    paths = [_either(Path(data_dir) / f"{split}.{lang}") for lang in (src, tgt)]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: --data must hold {split}.{src} and {split}.{tgt} (one sentence a line)."
            )
    notes = [_Notes(path) for path in paths]
    chunks = (_line_chunks(path, chunk_lines, note) for path, note in zip(paths, notes, strict=True))
    for source, target in zip_longest(*chunks):
        if source is None or target is None or len(source[1]) != len(target[1]):
            break
        yield _pairs(source[1], target[1], source[0])
    else:
        for note in notes:
            note.say()
        return
    counts = [_count_lines(path) for path in paths]
    raise ValueError(f"{paths[0]} has {counts[0]} lines but {paths[1]} has {counts[1]}: parallel files must be "
                     "aligned.")  # fmt: skip


QUOTE = '"'
# a field as a spreadsheet or pandas quotes it (csv.QUOTE_MINIMAL): in quotes, a quote inside it doubled
ESCAPED_FIELD = r'(^|\t)"([^"\t]|"")*""([^"\t]|"")*"(\t|\r?$)'
QUOTING_FIX = ("this reader takes no quoting (fields are read as written, and a tab always separates them): write "
               "the file without quoting and without tabs inside sentences (pandas: to_csv(path, sep='\\t', "
               "index=False, quoting=csv.QUOTE_NONE) after replacing the tabs)")  # fmt: skip


def tsv_chunks(path: str | Path, chunk_lines: int = CHUNK_LINES, src: str | None = None,
               tgt: str | None = None) -> Iterator[pa.Table]:  # fmt: skip
    """`source<TAB>target` lines; blank lines are skipped, and a line naming the languages (`src<TAB>tgt`, as
    pandas and spreadsheets write a header) is skipped and said where it is the first line or follows a byte-order
    mark inside the file (files joined with `cat`). No quoting rules: a tab inside a sentence is an error, not a
    silent shift, and a field quoted as a spreadsheet quotes it is refused as such."""
    path = Path(path)
    notes, spans = _Notes(path), _QuotedSpans(path)
    marked: list[int] = []  # the lines a byte-order mark began, in this chunk
    started = False  # a line that is not blank has been read
    for first, lines in _line_chunks(path, chunk_lines, notes, marked):
        lines = pa.array(lines, pa.large_string())
        numbers = pa.array(range(first, first + len(lines)), pa.int64())
        blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(lines)), 0)
        if pc.any(blank).as_py():  # a line holding a tab is a pair of empty sides (kept in an evaluation split)
            blank = pc.and_(blank, pc.invert(pc.match_substring(lines, "\t")))
            lines, numbers = lines.filter(pc.invert(blank)), numbers.filter(pc.invert(blank))
        if (not started or marked) and len(lines) and src is not None:
            # the header: the file's first line that is not blank, or one after a mark inside it
            candidates = [numbers[0].as_py()] * (not started) + marked
            lines, numbers = _skip_headers(path, lines, numbers, candidates, src, tgt, notes)
        started = started or len(numbers) > 0
        marked.clear()
        quoted = _quoted(lines)
        spans.check(lines, numbers, quoted)
        fields = pc.split_pattern(lines, "\t")
        counts = pc.list_value_length(fields)
        bad = pc.not_equal(counts, 2)
        if pc.any(bad).as_py():
            at = pc.index(bad, True).as_py()
            quoting = f"; it holds quotes, and {QUOTING_FIX}" if QUOTE in lines[at].as_py() else ""
            raise ValueError(f"{path}: line {numbers[at]} has {counts[at]} tab-separated fields, not "
                             f"source<TAB>target{quoting}.")  # fmt: skip
        escaped = pc.match_substring_regex(lines.take(quoted), ESCAPED_FIELD)
        if pc.any(escaped).as_py():
            at = quoted[pc.index(escaped, True).as_py()].as_py()
            raise ValueError(f"{path}: line {numbers[at]} holds a field in quotes with its quotes doubled inside, as "
                             f"spreadsheets and pandas quote a field: {QUOTING_FIX}.")  # fmt: skip
        sources, targets = pc.list_element(fields, 0), pc.list_element(fields, 1)
        if first == 1 and len(lines):
            wrapped = [pc.and_(pc.starts_with(side, QUOTE), pc.ends_with(side, QUOTE)) for side in (sources, targets)]
            if pc.all(pc.and_(*wrapped)).as_py() and pc.min(pc.utf8_length(sources)).as_py() > 1:
                notes.add("quoted", len(lines), numbers[0].as_py())
        yield _pairs(sources, targets, numbers)
    notes.say()


def _quoted(lines: pa.Array) -> pa.Array:
    """The indices of the lines that hold a double quote, found in the text's bytes at once (pc.match_substring,
    line by line, took ten times as long: 60 ms for 131,072 lines)."""
    offsets, data = lines.buffers()[1:3]
    at = np.flatnonzero(np.frombuffer(data, np.uint8) == ord(QUOTE)) if data is not None else []
    if not len(at):
        return pa.array([], pa.int64())
    starts = np.frombuffer(offsets, np.int64)[lines.offset : lines.offset + len(lines) + 1]
    rows = np.unique(np.searchsorted(starts, at, side="right") - 1)
    return pa.array(rows[(rows >= 0) & (rows < len(lines))], pa.int64())


COLUMN_NAMES = ({"source", "src", "input"}, {"target", "tgt", "output"})  # a header naming the columns' roles


def _language(name: str) -> str:
    """A language's code from its code or its English name (`German`, `deutsch`: the C library's table of locale
    names, `locale.locale_alias`), lower case; any other word as it is."""
    return locale.locale_alias.get(name, name).split(".")[0].split("_")[0].lower()


def _header_roles(text: str, src: str, tgt: str) -> list[str]:
    """What each field of a line names, where it names a column: "src" or "tgt" (its language, as `en` or
    `English`, or its role, as `source`), else ""."""
    names = [name.strip().strip(QUOTE).strip().lower() for name in text.split("\t")]
    return [("src" if name in COLUMN_NAMES[0] or _language(name) == _language(src.lower()) else
             "tgt" if name in COLUMN_NAMES[1] or _language(name) == _language(tgt.lower()) else "")
            for name in names]  # fmt: skip


def _skip_headers(path: Path, lines: pa.Array, numbers: pa.Array, candidates: list[int], src: str, tgt: str,
                  notes: _Notes) -> tuple[pa.Array, pa.Array]:  # fmt: skip
    """The lines without those of `candidates` (line numbers) that are a header: naming the languages (`en<TAB>de`,
    `English<TAB>German`) or the columns (`source<TAB>target`); one naming them the other way round is refused,
    since the columns would be read as each other's language."""
    at = pc.indices_nonzero(pc.is_in(numbers, value_set=pa.array(candidates, pa.int64()))).to_pylist()
    kept = [True] * len(lines)
    for index in at:
        text = lines[index].as_py()
        roles = _header_roles(text, src, tgt)
        if roles == ["src", "tgt"]:
            notes.add("header", 1, numbers[index].as_py())
            kept[index] = False
        elif roles == ["tgt", "src"]:
            shown = "<TAB>".join(name.strip() for name in text.split("\t"))
            raise ValueError(f"{path}: line {numbers[index]} is a header naming {shown}: the first column is "
                             f"{tgt}, but it is read as --src {src}; swap the columns (e.g. `awk -F'\\t' -v "
                             "OFS='\\t' '{print $2, $1}'`), or --src and --tgt.")  # fmt: skip
    if all(kept):
        return lines, numbers
    return lines.filter(pa.array(kept)), numbers.filter(pa.array(kept))


class _QuotedSpans:
    """Fields in quotes that hold a line break and a tab, as pandas and spreadsheets write such a value
    (`a<TAB>"b<LF>c<TAB>d"`): read by lines, each of their lines may have two fields, and the pairs would shift
    silently, so they are refused as quoting. Plain text can look the same (a quotation over two sentence lines, in
    quotes on one side only), but holds quotes that quoting never writes (one inside a field, not doubled): a file
    with one in the chunk read or before is plain text, and is not looked at again. A field in quotes is followed
    into the next chunk."""

    OPENS = '(^|\t)"([^"]|"")*$'  # a field opens a quote that the line does not close
    PLAIN = '[^\t"]"[^\t"\r]'  # a quote inside a field, not doubled: plain text (\r: a CRLF line end)
    LONGEST = 100  # lines a field in quotes is followed over

    def __init__(self, path: Path) -> None:
        self.path, self.plain = path, False
        self.open: list | None = None  # a field in quotes the last chunk left open: [its line, tab inside, lines]

    def check(self, lines: pa.Array, numbers: pa.Array, quoted: pa.Array) -> None:
        """`quoted`: the indices of the lines that hold a quote (`_quoted`)."""
        if self.plain or not (len(quoted) or self.open):
            return
        texts = lines.take(quoted)
        if pc.any(pc.match_substring_regex(texts, self.PLAIN)).as_py():
            self.plain, self.open = True, None
            return
        starts = quoted.filter(pc.match_substring_regex(texts, self.OPENS)).to_pylist()
        found = None
        if self.open is not None:
            opened, self.open = self.open, None
            found = self._follow(lines, numbers, -1, *opened)
        for index in starts:
            opened = lines[index].as_py().removesuffix("\r")
            found = found or self._follow(lines, numbers, index, numbers[index].as_py(), self._tab(opened))
        if found:
            raise ValueError(f"{self.path}: line {found[0]} opens a field in quotes that ends on line {found[1]}, "
                             "with a line break and a tab inside, as pandas and spreadsheets quote such a value: "
                             f"{QUOTING_FIX}.")  # fmt: skip

    @staticmethod
    def _tab(text: str) -> bool:
        """Whether the field in quotes a line opens (its first field in quotes that no lone quote closes) holds a
        tab on that line."""
        fields = text.split("\t")
        for at, field in enumerate(fields):
            rest = "\t".join(fields[at:])[1:]
            if field.startswith(QUOTE) and QUOTE not in rest.replace('""', ""):
                return "\t" in rest
        return False

    def _follow(self, lines: pa.Array, numbers: pa.Array, index: int, line: int, tab: bool,
                followed: int = 0) -> tuple[int, int] | None:  # fmt: skip
        """(opening line, closing line) where the field in quotes opened on `line` (at `index`, -1 for a chunk
        before, after `followed` lines there) closes on a later line with a tab inside; None where it does not,
        or is not quoting."""
        for later in range(index + 1, len(lines)):
            if later - index + followed > self.LONGEST:
                return None
            text, at = lines[later].as_py().removesuffix("\r"), 0  # (a CRLF line end)
            while (at := text.find(QUOTE, at)) >= 0 and text[at + 1 : at + 2] == QUOTE:
                at += 2
            if at < 0:  # no quote of its own: a line inside the field
                tab = tab or "\t" in text
                continue
            if text[at + 1 : at + 2] not in ("\t", ""):
                return None  # a lone quote inside a field: not quoting
            return (line, numbers[later].as_py()) if tab or "\t" in text[:at] else None
        self.open = [line, tab, followed + len(lines) - index - 1]
        return None


def _value(fields: dict, lang: str, where: str) -> str | None:
    """A JSON value as written: a string, or None (null: an empty side); any other value is refused."""
    value = fields[lang]
    if value is None or isinstance(value, str):
        return value
    kinds = ((bool, "a boolean"), (int | float, "a number"), (list, "a list"), (dict, "an object"))
    kind = next(name for type_, name in kinds if isinstance(value, type_))  # (bool first: a bool is an int)
    shown = json.dumps(value, ensure_ascii=False)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise ValueError(f"{where}: the {lang!r} value is {kind} ({shown}), not a string: write each sentence as a JSON "
                     f"string, in quotes (\"{lang}\": \"...\").")  # fmt: skip


def _pair_from_record(record: dict, src: str, tgt: str, where: str) -> tuple[str | None, str | None]:
    """A record's two values. `"translation": null` is no translation: the record's own fields are read, a missing
    one as null (an empty side), as Arrow reads a chunk of such records."""
    fields = record.get("translation", record) if isinstance(record, dict) else record
    if fields is None and isinstance(record, dict):
        fields = {src: record.get(src), tgt: record.get(tgt)}
    if not isinstance(fields, dict) or src not in fields or tgt not in fields:
        keys = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
        raise ValueError(
            f"{where}: no {src!r} and {tgt!r} fields (found {keys}); expected {{{src!r}: ..., {tgt!r}: ...}} or "
            f"{{'translation': {{{src!r}: ..., {tgt!r}: ...}}}}. Check --src/--tgt."
        )
    return _value(fields, src, where), _value(fields, tgt, where)


class _Object(dict):
    """A JSON object as read, with the keys it names more than once (`twice`): json keeps the last value in
    silence; Arrow's JSON reader refuses the line."""

    twice: frozenset = frozenset()

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, object]]) -> _Object:
        read = cls(pairs)
        if len(read) < len(pairs):
            names = [name for name, _ in pairs]
            read.twice = frozenset(name for name in read if names.count(name) > 1)
        return read


def _check_unique(record: object, src: str, tgt: str, where: str) -> None:
    """A key the reader reads (`translation`, `src`, `tgt`), named twice in the record or its translation, is
    refused; one inside a field the reader ignores may repeat, as Arrow reads it (what a chunk holds decides
    nothing)."""
    for fields in (record, record.get("translation") if isinstance(record, dict) else None):
        twice = sorted(getattr(fields, "twice", frozenset()) & {src, tgt, "translation"})
        if twice:
            raise ValueError(f"{where} names the key {twice[0]!r} twice in one object (JSON readers differ on which "
                             "value they keep): keep one of them.")  # fmt: skip


def _records_in_python(path: Path, lines: list[str], numbers: list[int], src: str, tgt: str,
                       notes: _Notes) -> pa.Table:  # fmt: skip
    """The slow reader, for a chunk Arrow's JSON reader refused or could not read as written: it names the line
    at fault."""
    sources, targets = [], []
    for number, line in zip(numbers, lines, strict=True):
        try:
            record = json.loads(line, object_pairs_hook=_Object.from_pairs)
        except json.JSONDecodeError as err:
            if err.msg == "Extra data":
                raise ValueError(f"{path}: line {number} holds more than one JSON value (column {err.colno}): JSON "
                                 "Lines takes one object a line; put each on its own line.") from None  # fmt: skip
            if err.msg == "Invalid control character at":
                character = json.dumps(line[err.pos])
                raise ValueError(f"{path}: line {number} holds a control character ({character}, column "
                                 f"{err.colno}) written as it is inside a JSON string, which JSON forbids: write it "
                                 f"escaped ({character}; json.dumps and every JSON library escape it), or replace "
                                 "it with a space.") from None  # fmt: skip
            raise ValueError(f"{path}: line {number} is not valid JSON ({err.msg}).") from None
        _check_unique(record, src, tgt, f"{path}: line {number}")
        source, target = _pair_from_record(record, src, tgt, f"{path}: line {number}")
        sources.append(source), targets.append(target)
    try:
        return _pairs(sources, targets, numbers, notes, values=True)
    except UnicodeEncodeError:  # a JSON escape of half a surrogate pair (\ud800): no character
        for number, *sides in zip(numbers, sources, targets, strict=True):
            for lang, value in zip((src, tgt), sides, strict=True):
                if value is not None and not value.isascii() and re.search("[\ud800-\udfff]", value):
                    raise ValueError(f"{path}: line {number}: the {lang!r} value holds a lone surrogate (a JSON escape "
                                     "from \\ud800 to \\udfff without its pair), which is not valid Unicode text: "
                                     "fix or remove that line (a character beyond U+FFFF is escaped as a pair, e.g. "
                                     "\\ud83d\\ude00).") from None  # fmt: skip
        raise


def _records_in_arrow(lines: list[str], count: int, src: str, tgt: str) -> list[pa.ChunkedArray] | None:
    """Both sides of a chunk's records read by Arrow's JSON reader, every field read as a string; None where the
    slow reader must decide (a value that is not a string, a null or missing field, a line of two objects, bad
    JSON). The schema is explicit: inferred, a column of dates would be read as timestamps and written back in
    another spelling, and one of numbers in a spelling that depends on its neighbours."""
    schema = pa.schema([("translation", pa.struct([(src, pa.string()), (tgt, pa.string())])),
                        (src, pa.string()), (tgt, pa.string())])  # fmt: skip
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pa_json.read_json(io.BytesIO("\n".join(lines).encode()), parse_options=options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if len(table) != count:  # two objects on a line, or a blank line Arrow skipped
        return None
    nested = table.column("translation")
    if nested.null_count == 0:
        nested = nested.combine_chunks()
        sides = [nested.field(src), nested.field(tgt)]
    elif nested.null_count == len(table):
        sides = [table.column(src), table.column(tgt)]
    else:
        return None
    return None if any(side.null_count for side in sides) else sides


def jsonl_chunks(path: str | Path, src: str, tgt: str, chunk_lines: int = CHUNK_LINES) -> Iterator[pa.Table]:
    """One JSON object a line: `{"translation": {"en": ..., "de": ...}}` (run_translation's format) or flat;
    blank lines are skipped. Values are taken as written: a string (stripped; a line break inside it replaced by a
    space, counted), or null, read as an empty side (counted); any other value is refused, naming the line and the
    field. Arrow's JSON reader parses each chunk; a chunk it refuses or cannot read as written is read again line
    by line, which names the line at fault or reads what Arrow would not."""
    path = Path(path)
    notes = _Notes(path)
    for first, lines in _line_chunks(path, chunk_lines, notes):
        texts = pa.array(lines, pa.large_string())
        numbers = pa.array(range(first, first + len(lines)), pa.int64())
        kept = pc.invert(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(texts)), 0))
        if not pc.all(kept).as_py():  # keep line numbers exact: blank lines are not records
            texts, numbers = texts.filter(kept), numbers.filter(kept)
            lines = texts.to_pylist()
        sides = _records_in_arrow(lines, len(lines), src, tgt)
        if sides is None:
            yield _records_in_python(path, lines, numbers.to_pylist(), src, tgt, notes)
        else:
            yield _pairs(*sides, numbers, notes, values=True)
    notes.say()


def hub_split(name: str, config: str | None, split: str):
    """A split of a `datasets` dataset (Hub name or local folder), loaded; what `load_dataset` raises for data it
    cannot read said in one line with the fix."""
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    try:
        return load_dataset(name, config, split=split)
    except ValueError as err:
        raise ValueError(f"dataset {name!r} ({config}): cannot load split {split!r}: {err}") from None
    except DatasetGenerationError as err:  # its message names neither the file nor the cause: its cause does
        cause = " ".join(str(err.__cause__ or err).split())
        fix = (
            "give every split's files the same columns (🤗 Datasets builds every split of a folder with one schema)"
            if "CastError" in type(err.__cause__).__name__
            else "check the dataset's files"
        )
        raise ValueError(f"dataset {name!r} ({config}): cannot build split {split!r}: {cause}: {fix}.") from None


def hub_chunks(name: str, config: str | None, split: str, src: str, tgt: str,
               chunk_lines: int = CHUNK_LINES) -> Iterator[pa.Table]:  # fmt: skip
    """A split of a `datasets` dataset (Hub name or local folder), e.g. `wmt14` `de-en` (columns `translation`),
    read from its Arrow files a chunk at a time."""
    dataset = hub_split(name, config, split)
    translation = "translation" in dataset.column_names
    if not translation and not {src, tgt} <= set(dataset.column_names):
        raise ValueError(
            f"dataset {name!r} split {split!r} has columns {dataset.column_names}, but neither 'translation' nor "
            f"{src!r} and {tgt!r}. Check --src/--tgt."
        )
    first, notes = 1, _Notes(f"dataset {name!r} split {split!r}")
    for table in dataset.with_format("arrow").iter(batch_size=chunk_lines):
        sides = table.column("translation").combine_chunks() if translation else table
        missing = [lang for lang in (src, tgt) if lang not in [f.name for f in sides.type]] if translation else []
        if missing:
            _pair_from_record(sides[0].as_py(), src, tgt, f"dataset {name!r} split {split!r}")
        columns = [sides.field(n) if translation else sides.column(n) for n in (src, tgt)]
        for lang, column in zip((src, tgt), columns, strict=True):
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                    or pa.types.is_null(column.type)):  # fmt: skip
                raise ValueError(f"dataset {name!r} split {split!r}: the {lang!r} field holds {column.type}, not "
                                 "text: give a dataset whose sentences are strings.")  # fmt: skip
        yield _pairs(*columns, first, notes, values=True)
        first += len(table)
    notes.say()


def _either(path: Path) -> Path:
    """`path`, or its gzipped form (`train.en.gz`) where only that is there."""
    gzipped = path.with_name(path.name + ".gz")
    return gzipped if not path.is_file() and gzipped.is_file() else path


def split_files(folder: Path, split: str, src: str, tgt: str) -> list[Path]:
    """The files that hold `split` in `folder` (the first format found, each file maybe gzipped), or [] when none
    does."""
    for candidates in ([f"{split}.{src}", f"{split}.{tgt}"], [f"{split}.tsv"], [f"{split}.jsonl"]):
        paths = [_either(folder / name) for name in candidates]
        if any(path.is_file() for path in paths):
            return paths
    return []


def _format(path: Path) -> str:
    """A data file's format suffix, past a `.gz`: "tsv", "jsonl" or a language."""
    return Path(path.name.removesuffix(".gz")).suffix.lstrip(".")


def folder_splits(folder: Path, src: str, tgt: str) -> list[str]:
    """Every split a data folder holds, in any of the three formats."""
    names = set()
    for path in folder.iterdir():
        stem = Path(path.name.removesuffix(".gz")).stem
        if path.is_file() and _format(path) in (src, tgt, "tsv", "jsonl") and split_files(folder, stem, src, tgt):
            names.add(stem)
    return sorted(names)


def split_chunks(data: str, split: str, src: str, tgt: str, dataset_config: str | None = None,
                 hub: bool = False, chunk_lines: int = CHUNK_LINES) -> Iterator[pa.Table]:  # fmt: skip
    """One split from `data`, as Arrow tables of at most `chunk_lines` pairs: a Hub dataset name when `hub`, else
    a folder holding `{split}.{src}` + `{split}.{tgt}`, `{split}.tsv` or `{split}.jsonl` (first found; each may
    be gzipped, `train.en.gz`)."""
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
    if _format(files[0]) == "tsv":
        return tsv_chunks(files[0], chunk_lines, src, tgt)
    if _format(files[0]) == "jsonl":
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
