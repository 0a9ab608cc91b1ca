"""The readers against an independent reading of the same files: generated corpora (Hypothesis), with their empty
and absent values drawn (empty and blank sides, JSON nulls, blank lines, no header, no byte-order mark), in UTF-8
or UTF-16/32, with duplicate JSON keys, headers, byte-order marks and every line end, read by vaswani-hf and by 🤗
Datasets (its csv reader for TSV, its json reader for JSONL) or by plain Python (two files), pair for pair, or
refused in one line naming the file, where docs/data.md says such a file is refused."""

import json
import os
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from vaswani_hf.data.readers import load_split

SIDE = st.one_of(st.sampled_from(["", " ", "  "]), st.text(st.sampled_from("abcäß日本0 .,"), min_size=1, max_size=6))
WORDS = st.text(st.sampled_from("abcäß日本0"), min_size=1, max_size=6)  # a side that is never empty
ENCODINGS = ["utf-8"] * 12 + ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"]
HEADERS = [None, None, "en\tde", "source\ttarget", "English\tGerman", "de\ten"]
ABSENT = "<absent>"  # a JSON field left out of its record (the alphabet above never spells it)


@st.composite
def corpora(draw) -> dict:
    form = draw(st.sampled_from(["tsv", "jsonl", "parallel"]))
    jsonl = form == "jsonl"
    side = st.none() | SIDE | st.just(ABSENT) if jsonl else SIDE  # a JSON null, or no field at all
    pairs = [(draw(WORDS), draw(WORDS)), *draw(st.lists(st.tuples(side, side), max_size=6))]
    pairs = draw(st.permutations(pairs))
    return {
        "form": form,
        "pairs": pairs,
        "encoding": draw(st.sampled_from(ENCODINGS)),
        "bom": draw(st.booleans()),
        "end": draw(st.sampled_from(["\n", "\r\n", "\r"])),
        "blank": draw(st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["", " "])), max_size=2))
        if form != "parallel"
        else [],
        "header": draw(st.sampled_from(HEADERS)) if form == "tsv" else None,
        "nested": draw(st.booleans()),
        "duplicate": draw(st.none() | st.tuples(st.integers(0, 6), st.sampled_from(["en", "de", "translation"])))
        if jsonl
        else None,
    }


def json_line(source, target, nested: bool, duplicate: str | None) -> str:
    """One record, written by hand where a key is named twice (no JSON library writes that)."""
    values = {lang: json.dumps(value, ensure_ascii=False) for lang, value in (("en", source), ("de", target))
              if value != ABSENT}  # fmt: skip
    fields = [f'"{key}": {value}' for key, value in values.items()]
    if duplicate in values:
        fields.append(f'"{duplicate}": "LAST"')
    record = "{" + ", ".join(fields) + "}"
    if not nested and duplicate != "translation":
        return record
    return (
        '{"translation": '
        + record
        + (', "translation": {"en": "x", "de": "y"}' if duplicate == "translation" else "")
        + "}"
    )


def write(corpus: dict, folder: Path) -> tuple[list[Path], list[str]]:
    """The corpus's files, and its lines as text (before the encoding and the line ends)."""
    form, duplicate = corpus["form"], corpus["duplicate"]
    if form == "parallel":
        texts = {"en": [s for s, _ in corpus["pairs"]], "de": [t for _, t in corpus["pairs"]]}
    else:
        lines = []
        for index, (source, target) in enumerate(corpus["pairs"]):
            twice = (
                duplicate[1] if duplicate is not None and min(duplicate[0], len(corpus["pairs"]) - 1) == index else None
            )
            lines.append(
                json_line(source, target, corpus["nested"], twice) if form == "jsonl" else f"{source}\t{target}"
            )
        for at, blank in sorted(corpus["blank"], reverse=True):
            lines.insert(min(at, len(lines)), blank)
        if corpus["header"]:
            lines.insert(0, corpus["header"])
        texts = {form: lines}
    paths = []
    for name, lines in texts.items():
        text = "".join(line + corpus["end"] for line in lines)
        mark = "\ufeff" if corpus["bom"] and corpus["encoding"] == "utf-8" else ""
        paths.append(folder / f"train.{name}")
        paths[-1].write_bytes((mark + text).encode(corpus["encoding"]))
    return paths, lines


def refusal(corpus: dict, lines: list[str]) -> str | None:
    """The refusal docs/data.md promises for this corpus (a regular expression), or None."""
    if corpus["encoding"] != "utf-8":
        return r"is UTF-(16|32)(LE|BE) \(with(out)? a byte-order mark\), not UTF-8: convert it, e\.g\. `iconv -f UTF-"
    if corpus["end"] == "\r" and len(lines) > 1:
        return r"carriage return"
    if corpus["header"] == "de\ten":
        return r"line \d+ is a header naming de<TAB>en"
    for number, line in enumerate(lines if corpus["form"] == "jsonl" else [], 1):  # the first line at fault
        if "LAST" in line or line.count('"translation"') > 1:
            return rf"line {number} names the key '{corpus['duplicate'][1]}' twice"
        if line.strip() and not {"en", "de"} <= set(json.loads(line).get("translation", json.loads(line))):
            return rf"line {number}: no 'en' and 'de' fields"
    return None


def independent(corpus: dict, paths: list[Path]) -> list[tuple[str, str]]:
    """The pairs as 🤗 Datasets (TSV, JSONL) or plain Python (two files) read them, each side stripped and a null
    read as empty, as docs/data.md says the readers give them."""
    form = corpus["form"]
    if form == "parallel":
        sides = [path.read_bytes().decode("utf-8-sig").split("\n") for path in paths]
        sides = [side[:-1] if side[-1] == "" else side for side in sides]
        return [(s.strip(), t.strip()) for s, t in zip(*sides, strict=True)]
    from datasets import Features, Value, load_dataset

    if form == "tsv":
        features = Features({"en": Value("string"), "de": Value("string")})
        options = {"sep": "\t", "quoting": 3, "keep_default_na": False, "features": features}  # no quoting, no NA
        header = 0 if corpus["header"] else None
        rows = load_dataset("csv", data_files=str(paths[0]), split="train", column_names=["en", "de"], header=header,
                            **options)  # fmt: skip
    else:
        rows = load_dataset("json", data_files=str(paths[0]), split="train")
    pairs = []
    for row in rows:
        values = row["translation"] if "translation" in row else row
        pairs.append(tuple((values[lang] or "").strip() for lang in ("en", "de")))
    return pairs


@pytest.fixture(scope="module", autouse=True)
def datasets_cache(tmp_path_factory):
    """🤗 Datasets caches every file it reads: in a folder of the test's own."""
    import datasets

    before = os.environ.get("HF_DATASETS_CACHE")
    os.environ["HF_DATASETS_CACHE"] = str(tmp_path_factory.mktemp("datasets"))
    datasets.config.HF_DATASETS_CACHE = Path(os.environ["HF_DATASETS_CACHE"])
    datasets.disable_progress_bars()
    yield
    if before is None:
        os.environ.pop("HF_DATASETS_CACHE")
    else:
        os.environ["HF_DATASETS_CACHE"] = before


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora())
def test_the_readers_give_what_an_independent_reader_gives_or_refuse_in_one_line(corpus):
    with tempfile.TemporaryDirectory() as folder:
        paths, lines = write(corpus, Path(folder))
        expected = refusal(corpus, lines)
        try:
            pairs = load_split(folder, "train", "en", "de", keep_empty=True)
        except ValueError as err:
            said = str(err)
            assert expected is not None and re.search(expected, said), (said, expected)
            event(f"refused: {expected[:12]}")
            assert "\n" not in said and any(str(path) in said for path in paths)
            return
        assert expected is None, f"read {pairs}, expected the refusal {expected}"
        assert pairs == independent(corpus, paths)
        event(f"read alike: {corpus['form']}")
