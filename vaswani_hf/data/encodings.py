"""Files that are not UTF-8 but UTF-16 or UTF-32 (Excel's "Unicode Text" export, Notepad's "Unicode"), found from
their first bytes and refused with their encoding and the `iconv` command that converts them, before a reader says
anything else of them: read as UTF-8, their NULs pass for characters and their line ends for carriage returns."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# byte-order marks of the encodings that are not UTF-8, longest first (UTF-32LE's begins with UTF-16LE's)
WIDE_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32LE"), (b"\x00\x00\xfe\xff", "UTF-32BE"), (b"\xff\xfe", "UTF-16LE"),
             (b"\xfe\xff", "UTF-16BE"))  # fmt: skip


def wide_encoding(head: bytes) -> str | None:
    """The UTF-16 or UTF-32 encoding a file's first bytes are in, or None. By its byte-order mark; without one, by
    where its NUL bytes fall (text in the Latin script: a NUL after every character in UTF-16LE, in every second
    byte; three in four in UTF-32) over 8 bytes or more, or by its line ends (every `\n` the low byte of a
    character whose other bytes are NUL: text in other scripts) where two or more say so, or one and the bytes are
    not UTF-8, the NULs agree, or it ends the file. NULs inside UTF-8 text are kept as characters: such a file is
    taken for neither unless nearly every second byte is NUL, or its lines begin (or end) with one."""
    for mark, name in WIDE_BOMS:
        if head.startswith(mark):
            return f"{name} (with a byte-order mark)"
    by_nuls = _by_nuls(head)
    if by_nuls is not None and len(head) >= 8:
        return f"{by_nuls} (without a byte-order mark)"
    if 2 <= len(head) < 8 and len(head) % 2 == 0:  # a whole file of one to three characters and no line end
        nul = np.frombuffer(head, np.uint8).reshape(-1, 2) == 0
        for high, name in ((1, "UTF-16LE"), (0, "UTF-16BE")):
            if nul[:, high].all() and not nul[:, 1 - high].any():
                return f"{name} (without a byte-order mark)"
    by_ends, count, last = _by_line_ends(head)
    if by_ends is None:
        return None
    try:
        head.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError as err:
        utf8 = err.reason == "unexpected end of data"  # a character cut where the head ends, not a wrong byte
    if count >= 2 or not utf8 or by_nuls == by_ends or last:
        return f"{by_ends} (without a byte-order mark)"
    return None


def _by_nuls(head: bytes) -> str | None:
    """The wide encoding whose NUL bytes fall where `head`'s do: in UTF-16LE the high byte of every Latin
    character (nearly always NUL) and not its low byte; in UTF-32 the two high bytes of every character."""
    data = np.frombuffer(head[: len(head) // 4 * 4], np.uint8)
    if not len(data):
        return None
    nul = (data.reshape(-1, 4) == 0).mean(axis=0)  # how often each of the 4 positions is NUL
    for high, low, name in (([2, 3], [0], "UTF-32LE"), ([0, 1], [3], "UTF-32BE"), ([1, 3], [0, 2], "UTF-16LE"),
                            ([0, 2], [1, 3], "UTF-16BE")):  # fmt: skip
        if nul[high].min() > 0.8 and nul[low].max() < 0.5:
            return name
    return None


def _by_line_ends(head: bytes) -> tuple[str | None, int, bool]:
    """The wide encoding whose line ends `head`'s `\n` bytes (or `\r`, where it has no `\n`) are: units of the
    line-end character (its low byte, the others NUL), at least as many as the `\n` bytes in the same place inside
    other characters (上 U+4E0A, ช U+0E0A, 😊's low surrogate DE0A), which in UTF-8 would each end a line of its
    own (those in another place, as Gurmukhi's U+0A00-0AFF, may be any number); how many there are; and whether
    the last of them ends `head` (a file of one line whose last bytes are the NULs after it, or before it in
    big-endian order). A file without NUL bytes has no such unit: UTF-8 text is never taken for one; nor is one
    that, read in that encoding, holds a NUL character or a lone surrogate (`_reads_as_text`)."""
    end = ord("\n") if b"\n" in head else ord("\r")  # CR alone ends the lines of old Mac files
    for width, name in ((4, "UTF-32"), (2, "UTF-16")):
        units = np.frombuffer(head[: len(head) // width * width], np.uint8).reshape(-1, width)
        ends = units == end
        for order, first in (("LE", 0), ("BE", width - 1)):
            line_ends = ends[:, first] & (np.delete(units, first, axis=1) == 0).all(axis=1)
            count = int(line_ends.sum())
            if count and int(ends[:, first].sum()) - count <= count and _reads_as_text(units, f"{name}-{order}"):
                # the last line end ends the file, NULs after it (little-endian) or before it (big-endian): no
                # UTF-8 file ends so
                last = len(head) % width == 0 and bool(line_ends[-1])
                return f"{name}{order}", count, last
    return None, 0, False


def _reads_as_text(units: np.ndarray, encoding: str) -> bool:
    """Whether the head's `units` read in `encoding` are text: no NUL character (U+0000: no text file holds one,
    where UTF-8 text with NULs gives one for two NUL bytes in a row) and no lone surrogate or code point past
    U+10FFFF (a character cut at the head's end is left out)."""
    data = units.tobytes()
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as err:
        if err.reason != "unexpected end of data":
            return False
        text = data[: err.start].decode(encoding)
    return "\x00" not in text


def check_utf8_encoding(path: Path | str, head: bytes) -> None:
    """A file in UTF-16 or UTF-32 (Excel's "Unicode Text", Notepad's "Unicode"), refused with its encoding and the
    fix, before anything else is said of it: its line ends and NULs would be misread."""
    if name := wide_encoding(head):
        # with a mark, iconv's UTF-16 reads the order from it (and drops it); without, the order must be named
        given, shown = name.split()[0] if "without" in name else name[:6], Path(path).name
        # a gzipped file converts through zcat, back under its own name (the one the reader looks for)
        fix = (f"zcat {shown} | iconv -f {given} -t UTF-8 | gzip > {shown}.utf8 && mv {shown}.utf8 {shown}"
               if shown.endswith(".gz") else f"iconv -f {given} -t UTF-8 {shown} > {shown}.utf8")  # fmt: skip
        raise ValueError(
            f'{path} is {name}, not UTF-8: convert it, e.g. `{fix}` (as Excel\'s "Unicode Text" export and '
            'Notepad\'s "Unicode" write it).'
        )
