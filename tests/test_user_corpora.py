"""A user's own corpus, as users bring it (issue #101): values read as written or refused naming the line and the
fix, whatever else the chunk holds; what a reader changes counted and said; evaluation lines the model cannot take
cut before training; gzip, CR-only line ends, a read-only folder and a full disk named with the fix; and a property
test holding the pairs read to the pairs written, aligned, or to a one-line refusal."""

import errno
import gzip
import json
import re
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vaswani_hf.data.preparation import prepare
from vaswani_hf.data.prepared import InMemoryData
from vaswani_hf.data.prepared_cache import PreparationRequest
from vaswani_hf.data.readers import load_split

from .helpers import TINY_RUN, vaswani


def write(folder: Path, files: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        data = content if isinstance(content, bytes) else content.encode()
        (folder / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return folder


def jsonl(*records, blank: bool = False) -> str:
    """Records one a line; `blank`: a blank line first, which once sent the chunk to the line-by-line reader."""
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    return ("\n" if blank else "") + "\n".join(lines) + "\n"


def line_of(number: int, blank: bool) -> int:
    return number + blank


def refusal(folder: Path) -> str:
    """The refusal of the train split in `folder`: one line."""
    with pytest.raises(ValueError) as refused:
        load_split(str(folder), "train", "en", "de")
    assert "\n" not in str(refused.value), refused.value
    return str(refused.value)


# --- JSONL: values as written, or refused -------------------------------------------------------------------------


@pytest.mark.parametrize("blank", [False, True], ids=["arrow", "with-blank-line"])
def test_a_jsonl_null_is_an_empty_side_counted_never_the_text_none(blank, tmp_path, caplog):
    records = [{"translation": {"en": "one", "de": "eins"}}, {"translation": {"en": "two", "de": None}},
               {"translation": {"en": None, "de": "drei"}}]  # fmt: skip
    write(tmp_path, {"train.jsonl": jsonl(*records, blank=blank), "val.jsonl": jsonl(*records, blank=blank)})
    assert load_split(str(tmp_path), "train", "en", "de") == [("one", "eins")]
    assert "dropped 2 of 3 pairs with an empty side" in caplog.text
    assert f"2 null values read as empty sentences, the first on line {line_of(2, blank)}" in caplog.text
    assert load_split(str(tmp_path), "val", "en", "de", keep_empty=True) == [("one", "eins"), ("two", ""),
                                                                             ("", "drei")]  # fmt: skip


NOT_STRINGS = {"number": ("12.50", "a number (12.5)"), "boolean": ("true", "a boolean (true)"),
               "list": ('["a", "b"]', 'a list (["a", "b"])'),
               "object": ('{"x": 1}', 'an object ({"x": 1})')}  # fmt: skip


@pytest.mark.parametrize("blank", [False, True], ids=["arrow", "with-blank-line"])
@pytest.mark.parametrize("kind", NOT_STRINGS)
def test_a_jsonl_value_that_is_not_a_string_is_refused_naming_line_and_field(kind, blank, tmp_path):
    written, said = NOT_STRINGS[kind]
    # every line of the chunk the same type, as an all-boolean column was read as `true`, beside a blank as `True`
    lines = [f'{{"en": "price {n}", "de": {written}}}' for n in range(3)]
    write(tmp_path, {"train.jsonl": jsonl(*lines, blank=blank)})
    message = refusal(tmp_path)
    assert f"train.jsonl: line {line_of(1, blank)}: the 'de' value is {said}, not a string" in message, message
    assert "in quotes" in message


def test_jsonl_strings_are_kept_as_written_not_as_arrow_infers_them(tmp_path):
    # inferred, a column of dates became timestamps and came back as "2020-01-01 00:00:00"
    write(tmp_path, {"train.jsonl": jsonl({"en": "2020-01-01", "de": "1e3"}, {"en": "2021-02-03 10:00", "de": "007"})})
    assert load_split(str(tmp_path), "train", "en", "de") == [("2020-01-01", "1e3"), ("2021-02-03 10:00", "007")]


@pytest.mark.parametrize("blank", [False, True], ids=["arrow", "with-blank-line"])
def test_two_jsonl_objects_on_one_line_are_refused_whatever_the_chunk_holds(blank, tmp_path):
    two = '{"en": "a", "de": "b"}{"en": "c", "de": "d"}'
    write(tmp_path, {"train.jsonl": jsonl({"en": "x", "de": "y"}, two, {"en": "e", "de": "f"}, blank=blank)})
    with pytest.raises(ValueError, match=rf"train.jsonl: line {line_of(2, blank)} holds more than one JSON value"):
        load_split(str(tmp_path), "train", "en", "de")


def test_a_line_break_inside_a_jsonl_value_becomes_a_space_counted(tmp_path, caplog):
    records = [{"en": "one\ntwo", "de": "eins"}, {"en": "three", "de": "drei \r\n vier"}, {"en": "x", "de": "y"}]
    write(tmp_path, {"train.jsonl": jsonl(*records)})
    assert load_split(str(tmp_path), "train", "en", "de") == [("one two", "eins"), ("three", "drei vier"),
                                                              ("x", "y")]  # fmt: skip
    assert "2 values held a line break (\\n or \\r), each replaced by a space, the first on line 1" in caplog.text


@pytest.mark.parametrize("chunk", ["every-row-null", "mixed", "with-blank-line"])
def test_a_null_translation_reads_the_top_level_fields_whatever_the_chunk_holds(chunk, tmp_path, caplog):
    # Arrow read the top-level fields when every row's translation was null; beside another row the line-by-line
    # reader refused the same record
    rows = ['{"translation": null, "en": "a", "de": "b"}', '{"translation": null, "de": "c"}',
            '{"translation": null}', '{"translation": null, "en": "d", "de": "e"}']  # fmt: skip
    if chunk == "mixed":
        rows.append('{"translation": {"en": "f", "de": "g"}}')
    write(tmp_path, {"train.jsonl": jsonl(*rows, blank=chunk == "with-blank-line")})
    expected = [("a", "b"), ("", "c"), ("", ""), ("d", "e")] + ([("f", "g")] if chunk == "mixed" else [])
    assert load_split(str(tmp_path), "train", "en", "de", keep_empty=True) == expected
    assert f"3 null values read as empty sentences, the first on line {line_of(2, chunk == 'with-blank-line')}" in (
        caplog.text
    )
    assert load_split(str(tmp_path), "train", "en", "de") == [p for p in expected if all(p)]


@pytest.mark.parametrize("blank", [False, True], ids=["arrow", "with-blank-line"])
def test_a_lone_surrogate_in_a_jsonl_value_is_refused_naming_line_and_field(blank, tmp_path):
    write(tmp_path, {"train.jsonl": jsonl({"en": "x", "de": "y"}, '{"translation": {"en": "z", "de": "\\ud800x"}}',
                                          blank=blank)})  # fmt: skip
    message = refusal(tmp_path)
    assert f"train.jsonl: line {line_of(2, blank)}: the 'de' value holds a lone surrogate" in message, message
    assert "not valid Unicode" in message


# --- TSV: a header, and quoting -----------------------------------------------------------------------------------


def test_a_tsv_header_naming_the_languages_is_skipped_and_said_once(tmp_path, caplog):
    write(tmp_path, {"train.tsv": "\ufeffen\tde\nen\tde\nHello\tHallo\n", "val.tsv": "de\ten\nHallo\tHello\n"})
    # only the first line is a header: the same words later are a pair
    assert load_split(str(tmp_path), "train", "en", "de") == [("en", "de"), ("Hello", "Hallo")]
    assert caplog.text.count("is a header naming the languages (or the columns): skipped") == 1
    with pytest.raises(ValueError, match=r"val.tsv: line 1 is a header naming de<TAB>en: .* swap the columns"):
        load_split(str(tmp_path), "val", "en", "de")


@pytest.mark.parametrize(
    "line, said",
    [('"Hello,\tworld"\t"Hallo, Welt"', "has 3 tab-separated fields, not source<TAB>target; it holds quotes, and "
                                       "this reader takes no quoting"),
     ('"He said ""hi"""\tEr sagte "hallo"', "holds a field in quotes with its quotes doubled inside, as spreadsheets "
                                            "and pandas quote a field: this reader takes no quoting")],
    ids=["tab-inside-quotes", "doubled-quotes"],
)  # fmt: skip
def test_a_quoted_tsv_field_is_reported_as_quoting(line, said, tmp_path):
    write(tmp_path, {"train.tsv": f"a\tb\n{line}\n"})
    message = refusal(tmp_path)
    assert f"train.tsv: line 2 {said}" in message and "csv.QUOTE_NONE" in message


def test_a_tsv_quoted_throughout_is_read_as_written_and_said(tmp_path, caplog):
    write(tmp_path, {"train.tsv": '"Stop!"\t"Halt!"\n"Go."\t"Los."\n'})
    assert load_split(str(tmp_path), "train", "en", "de") == [('"Stop!"', '"Halt!"'), ('"Go."', '"Los."')]
    assert "every field of the first 2 lines is in double quotes" in caplog.text


def test_a_header_after_a_byte_order_mark_inside_the_file_is_skipped_too(tmp_path, caplog):
    # two exported files joined with `cat`: the second one's mark and header in the middle
    write(tmp_path, {"train.tsv": "en\tde\na\tx\n\ufeffen\tde\nb\ty\nen\tde\n",
                     "val.tsv": "en\tde\na\tx\n\ufeffde\ten\nb\ty\n"})  # fmt: skip
    assert load_split(str(tmp_path), "train", "en", "de") == [("a", "x"), ("b", "y"), ("en", "de")]
    assert "2 lines are headers naming the languages (the first line, and one after each byte-order mark" in caplog.text
    with pytest.raises(ValueError, match=r"val.tsv: line 3 is a header naming de<TAB>en: .* swap the columns"):
        load_split(str(tmp_path), "val", "en", "de")


@pytest.mark.parametrize("text, opens, closes",
                         [('a0\tb0\na1\t"b1\nb2\tb3"\na3\tb4\n', 2, 3),
                          ('"a1\ta2\n\na3"\tb1\na4\tb4\n', 1, 3),
                          ('a0\tb0\na1\t"b1\nb2\tb3 ""x"" b4\nb5"\na6\tb6\n', 2, 4)],
                         ids=["target", "source-and-blank-line", "three-lines"])  # fmt: skip
def test_a_quoted_tsv_field_holding_a_line_break_and_a_tab_is_refused_as_quoting(text, opens, closes, tmp_path):
    # pandas' to_csv(sep="\t") quotes a value holding a line break and a tab: read by lines, each line has two
    # fields, and the pairs were silently shifted
    write(tmp_path, {"train.tsv": text})
    message = refusal(tmp_path)
    assert f"train.tsv: line {opens} opens a field in quotes that ends on line {closes}" in message, message
    assert "this reader takes no quoting" in message


def test_quotes_that_span_sentences_in_plain_text_are_read_as_lines(tmp_path):
    # a quotation over two sentence lines, in quotes on one side only: as pandas' quoting would read it, but the
    # file's other quotes are plain text's (inside a field), so it is plain text
    text = '"We work.\t„Wir arbeiten.\nIt takes time."\tEs dauert.“\nHe said "yes".\tEr sagte „ja“.\n'
    write(tmp_path, {"train.tsv": text})
    assert load_split(str(tmp_path), "train", "en", "de") == [('"We work.', "„Wir arbeiten."),
                                                              ('It takes time."', "Es dauert.“"),
                                                              ('He said "yes".', "Er sagte „ja“.")]  # fmt: skip


# --- byte-order marks, gzip, line ends ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["parallel", "tsv", "jsonl"])
def test_a_byte_order_mark_inside_a_file_is_removed_and_counted(form, tmp_path, caplog):
    bom = "\ufeff"
    files = {
        "parallel": {"train.en": f"{bom}a\n{bom}b\n", "train.de": f"{bom}x\ny\n"},  # two files joined with cat
        "tsv": {"train.tsv": f"{bom}a\tx\n{bom}b\ty\n"},
        "jsonl": {"train.jsonl": f'{bom}{{"en": "a", "de": "x"}}\n{bom}{{"en": "b", "de": "y"}}\n'},
    }[form]
    write(tmp_path, files)
    assert load_split(str(tmp_path), "train", "en", "de") == [("a", "x"), ("b", "y")]
    assert "removed 1 byte-order marks (U+FEFF) inside the file, the first on line 2" in caplog.text


def test_gzipped_files_are_read_as_their_text(tmp_path, cache_env):
    pairs = [(f"sentence {n}", f"Satz {n}") for n in range(40)]
    write(tmp_path / "gz", {"train.en.gz": "".join(s + "\n" for s, _ in pairs),
                            "train.de.gz": "".join(t + "\n" for _, t in pairs),
                            "val.jsonl.gz": jsonl(*({"en": s, "de": t} for s, t in pairs[:3]))})  # fmt: skip
    assert load_split(str(tmp_path / "gz"), "train", "en", "de") == pairs
    request = PreparationRequest(str(tmp_path / "gz"), "en", "de", vocab_size=100)
    assert request.available_splits() == ["train", "val"]
    prepared = prepare(request, tmp_path / "prepared", workers=1, quiet=True, eval_splits=["val"])
    assert prepared.counts("train")["pairs"] == 40 and list(prepared.pairs("val")) == pairs[:3]


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("VASWANI_PREPARED_CACHE", str(tmp_path / "cache"))


def test_cr_only_line_ends_and_a_stray_cr_are_named(tmp_path):
    write(tmp_path / "mac", {"train.en": "a\rb\rc\r", "train.de": "x\ry\rz\r"})
    with pytest.raises(ValueError, match=r"train.en: its lines end with a carriage return alone \(CR, old Mac"):
        load_split(str(tmp_path / "mac"), "train", "en", "de")
    write(tmp_path / "stray", {"train.en": "a\r\nb\rc\r\nd\r\n", "train.de": "w\nx\ny\nz\n"})
    with pytest.raises(ValueError, match=r"train.en: line 2 holds a carriage return \(CR\) that does not end the line"):
        load_split(str(tmp_path / "stray"), "train", "en", "de")


@pytest.mark.parametrize("damage", ["truncated", "not-gzip", "corrupt"])
def test_a_damaged_gzip_file_is_named_with_the_fix(damage, tmp_path):
    whole = gzip.compress("".join(f"sentence {n}\n" for n in range(2000)).encode())
    broken = {"truncated": whole[: len(whole) // 2], "not-gzip": b"a\nb\n",
              "corrupt": whole[:40] + bytes(b ^ 0x5A for b in whole[40:80]) + whole[80:]}[damage]  # fmt: skip
    (tmp_path / "train.en.gz").write_bytes(broken)
    (tmp_path / "train.de.gz").write_bytes(whole)
    message = refusal(tmp_path)
    assert message.startswith(f"{tmp_path / 'train.en.gz'}: ") and "gzip" in message
    assert {"truncated": "cut short", "not-gzip": "not gzip", "corrupt": "damaged"}[damage] in message, message


def test_a_short_file_of_cr_line_ends_is_named_as_such(tmp_path):
    # two CRs on the one line a final \n ends: more CRs than lines, so they are the line ends, not strays
    write(tmp_path, {"train.en": "a1\ra2\ra3\n", "train.de": "x1\rx2\rx3\n"})
    with pytest.raises(ValueError, match=r"train.en: its lines end with a carriage return alone \(CR, old Mac"):
        load_split(str(tmp_path), "train", "en", "de")


# --- writing: a read-only folder, a full disk ---------------------------------------------------------------------


def corpus(folder: Path) -> Path:
    return write(folder, {"train.en": "".join(f"one {n}\n" for n in range(30)),
                          "train.de": "".join(f"eins {n}\n" for n in range(30))})  # fmt: skip


def test_a_read_only_output_folder_is_named_with_the_fix(tmp_path, cache_env, monkeypatch):
    from vaswani_hf.data import prepared_cache

    def read_only(self, *args, **kwargs):  # as a read-only file system answers (the tests run as root)
        raise OSError(errno.EROFS, "Read-only file system", self.lock_file)

    monkeypatch.setattr(prepared_cache.FileLock, "acquire", read_only)
    with pytest.raises(OSError) as refused:
        prepare(PreparationRequest(str(corpus(tmp_path / "data")), "en", "de", vocab_size=100),
                tmp_path / "ro" / "prepared", quiet=True)  # fmt: skip
    assert str(refused.value) == (f"cannot write in {tmp_path / 'ro'} (Read-only file system): prepare into a "
                                  "folder you can write to (--output_dir DIR).")  # fmt: skip


def test_a_full_disk_is_named_with_the_path_and_the_fix(tmp_path, cache_env, monkeypatch):
    from vaswani_hf.data import preparation

    def full(*args, **kwargs):  # Arrow's message names no path
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(preparation, "_tokenize", full)
    with pytest.raises(OSError) as refused:
        prepare(PreparationRequest(str(corpus(tmp_path / "data")), "en", "de", vocab_size=100),
                tmp_path / "out" / "prepared", workers=1, quiet=True)  # fmt: skip
    assert str(refused.value).startswith(f"the disk holding {tmp_path / 'out'} is full (No space left on device")
    assert "free some space, or prepare on another disk (--output_dir DIR)" in str(refused.value)
    assert not list((tmp_path / "out").iterdir()) or all(p.name.endswith(".lock") for p in (tmp_path / "out").iterdir())


def test_a_small_free_space_refusal_is_said_in_megabytes(tmp_path, monkeypatch):
    from vaswani_hf.data import prepared_cache

    monkeypatch.setattr(prepared_cache.shutil, "disk_usage", lambda _: shutil_usage(free=1_200_000))
    with pytest.raises(OSError, match=r"about 2.5 MB is needed while preparing, 1.2 MB is free"):
        prepared_cache.check_free_space(tmp_path, 2_500_000, "x")


def shutil_usage(free: int):
    import shutil

    return shutil._ntuple_diskusage(10 * free, 9 * free, free)


def test_a_failed_preparation_leaves_no_lock_file(tmp_path, cache_env):
    data = write(tmp_path / "data", {"train.tsv": "a\tb\nc\td\te\n"})
    for output in (tmp_path / "out" / "prepared", None):
        with pytest.raises(ValueError, match="has 3 tab-separated fields"):
            prepare(PreparationRequest(str(data), "en", "de", vocab_size=100), output, workers=1, quiet=True)
    assert not list((tmp_path / "out").glob(".*lock")) and not list((tmp_path / "cache").glob("*.lock"))


def test_an_output_folder_that_cannot_be_created_fails_at_once(tmp_path, cache_env):
    if not Path("/proc/self").is_dir():
        pytest.skip("needs /proc, a folder that takes no new files")

    def waited(*_):
        raise TimeoutError("prepare still waits on a lock it cannot create after 30 s")

    previous = signal.signal(signal.SIGALRM, waited)
    signal.alarm(30)
    try:
        with pytest.raises(OSError) as refused:
            prepare(PreparationRequest(str(corpus(tmp_path / "data")), "en", "de", vocab_size=100), "/proc/x",
                    quiet=True)  # fmt: skip
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert str(refused.value).startswith("cannot write in /proc ("), refused.value
    assert "(--output_dir DIR)" in str(refused.value)


# --- evaluation lines longer than the model takes -----------------------------------------------------------------


def test_evaluation_pairs_longer_than_max_length_are_cut_and_counted_before_training(caplog):
    from vaswani_hf.data.tokenization import train_shared_bpe
    from vaswani_hf.training.recipe import evaluation_set

    words = [f"w{n % 50}" for n in range(400)]
    tokenizer = train_shared_bpe([" ".join(words)], 100)
    pairs = [("w1 w2", "w3"), (" ".join(words), "w4 w5"), ("w6", " ".join(words[:90]))]
    data = InMemoryData({"train": pairs[:1], "val": pairs}, tokenizer)
    whole = data.tokens("val")
    cut = evaluation_set(data, "val", max_length=16)
    assert "val: 2 of 3 evaluation pairs have a side longer than 16 tokens, the first on line 2" in caplog.text
    eos = tokenizer.eos_token_id
    for row in cut:
        source, target = whole[row["row"]]["input_ids"], whole[row["row"]]["labels"]
        for ids, was in ((row["input_ids"], source), (row["labels"], target)):
            assert ids == (was if len(was) <= 16 else [*was[:15], eos])
        assert row["target_text"] == pairs[row["row"]][1]  # references scored whole, as written


def test_a_megabyte_evaluation_line_is_cut_before_training_and_the_run_ends_well(tmp_path):
    rng = np.random.default_rng(0)
    words = [f"w{n}" for n in range(30)]
    train = [(" ".join(rng.choice(words, 6)), " ".join(rng.choice(words, 6))) for _ in range(64)]
    long = " ".join(rng.choice(words, 1 << 18))  # about a megabyte
    val = [*train[:3], (long, "w1 w2")]
    files = {f"{split}.{lang}": "".join(pair[side] + "\n" for pair in rows)
             for split, rows in (("train", train), ("val", val)) for side, lang in ((0, "en"), (1, "de"))}  # fmt: skip
    result = vaswani("train", "--data", str(write(tmp_path / "data", files)), *TINY_RUN, "--save_strategy", "no",
                     "--output_dir", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "val: 1 of 4 evaluation pairs have a side longer than 256 tokens, the first on line 4" in result.stderr


# --- the property: the pairs read are the pairs written, aligned, or a one-line refusal -------------------------------

WORD = st.text(st.sampled_from("abcxyzäß日本0123.,!-\ufeff"), min_size=1, max_size=5)
INSIDE = {"parallel": " \t\u2028\x00\x0c\u00a0", "tsv": " \u2028\x00\x0c\u00a0", "jsonl": " \t\u2028\x00\n"}


@st.composite
def sentence(draw, form: str) -> str:
    """Empty, or words with separators between them, maybe spaces around; a stray CR in a text file, rarely."""
    if draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from(["", " ", "  "]))
    words = draw(st.lists(WORD, min_size=1, max_size=4))
    text = words[0] + "".join(draw(st.sampled_from(INSIDE[form])) + word for word in words[1:])
    if form != "jsonl" and len(words) > 1 and draw(st.integers(0, 20)) == 0:
        text = text.replace(words[0], words[0] + "\r", 1)  # never at the end of a line: that is a CRLF
    return draw(st.sampled_from(["", " "])) + text + draw(st.sampled_from(["", " "]))


@st.composite
def corpora(draw):
    form = draw(st.sampled_from(["parallel", "tsv", "jsonl"]))
    pairs = draw(st.lists(st.tuples(sentence(form), sentence(form)), max_size=8))
    jsonl, tsv = form == "jsonl", form == "tsv"
    return {"form": form, "pairs": pairs, "end": draw(st.sampled_from(["\n", "\r\n", "\n", "\r\n", "\r"])),
            "bom": draw(st.booleans()), "gzip": draw(st.integers(0, 3)) == 0,
            "header": tsv and draw(st.booleans()), "nested": draw(st.booleans()),
            "odd": draw(st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["de", "en"]),
                                           st.sampled_from([None, None, 1.5, True, ["a"], {"x": 1}, "\ud800x"])),
                                 max_size=2)) if jsonl else [],
            # `"translation": null` beside the record's own fields, both, one or none
            "untranslated": draw(st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["en de", "en", "de", ""])),
                                          max_size=2)) if jsonl else [],
            # files joined with `cat`: a byte-order mark and a header line inside the file
            "joined": draw(st.lists(st.tuples(st.integers(0, 8), st.sampled_from(["en\tde", "en\tde", "de\ten"])),
                                    max_size=2)) if tsv else [],
            # a target as pandas quotes a value holding a line break and a tab
            "pandas": draw(st.none() | st.integers(0, 7)) if tsv else None,
            "blank": draw(st.lists(st.integers(0, 8), max_size=2)) if form != "parallel" else []}  # fmt: skip


def expected_text(value: str | None, form: str) -> str:
    """A side as the readers give it: marks removed, stripped, a line break in a JSON value a space."""
    value = (value or "").replace("\ufeff", "").strip()
    return re.sub(r"[\t\n\f\r ]*[\r\n][\t\n\f\r ]*", " ", value) if form == "jsonl" else value


def written(corpus: dict, folder: Path) -> tuple[list, str | None]:
    """Write the corpus; return the pairs a reader must give, or the refusal it must give (a regular expression)."""
    form, pairs, end = corpus["form"], list(corpus["pairs"]), corpus["end"]
    lines: list[tuple] = []  # each line as written: (text, pair index or None, what else it is)
    odd = {index: (lang, value) for index, lang, value in corpus["odd"] if index < len(pairs)}
    untranslated = {index: kept.split() for index, kept in corpus["untranslated"] if index < len(pairs)}
    read = {}  # a JSONL pair's values as the reader finds them
    for index, (source, target) in enumerate(pairs):
        if form == "jsonl":
            sides = {"en": source, "de": target}
            if index in odd:
                sides[odd[index][0]] = odd[index][1]
            record = {"translation": sides} if corpus["nested"] else sides
            if index in untranslated:
                record = {"translation": None, **{lang: sides[lang] for lang in untranslated[index]}}
            read[index] = [record.get(lang) if index in untranslated else sides[lang] for lang in ("en", "de")]
            ascii_only = index % 2 == 0 or "\ud800x" in read[index]
            lines.append((json.dumps(record, ensure_ascii=ascii_only), index, None))
        elif form == "tsv" and index == corpus["pandas"]:
            lines += [(f'{source}\t"{target}', index, None), ('b\tc"', None, "closes")]
        elif form == "tsv":
            lines.append((f"{source}\t{target}", index, None))
        else:
            lines.append(((source, target), index, None))
    for at in sorted(corpus["blank"], reverse=True):
        lines.insert(min(at, len(lines)), ("", None, None))
    for at, header in corpus["joined"]:
        lines.insert(min(at, len(lines)), ("\ufeff" + header, None, "reversed" if header == "de\ten" else None))
    if corpus["header"]:
        lines.insert(0, ("en\tde", None, None))
    names = ["train.en", "train.de"] if form == "parallel" else [f"train.{form}"]
    names = [name + ".gz" * corpus["gzip"] for name in names]
    for side, name in enumerate(names):
        texts = [text[side] if form == "parallel" else text for text, *_ in lines]
        data = (("\ufeff" if corpus["bom"] else "") + "".join(t + end for t in texts)).encode("utf-8")
        (folder / name).write_bytes(gzip.compress(data) if corpus["gzip"] else data)

    # what must happen: the first line at fault is named, each file's lines decoded before they are split
    def first(fault) -> int | None:
        return next((n for n, (_, i, _) in enumerate(lines, 1) if i is not None and fault(pairs[i], i)), None)

    def line_of(what: str) -> int | None:
        return next((n for n, (*_, kind) in enumerate(lines, 1) if kind == what), None)

    if end == "\r" and len(lines) > 1:
        return [], rf"{names[0]}: its lines end with a carriage return alone"
    for side, name in enumerate(names):
        if at := first(lambda pair, _, side=side: "\r" in (pair[side] if form == "parallel" else "".join(pair))):
            return [], rf"{name}: (line {at} holds a carriage return|its lines end with a carriage return alone)"
    if at := line_of("reversed"):
        return [], rf"{names[0]}: line {at} is a header naming de<TAB>en"
    if at := line_of("closes"):
        opens = first(lambda _, i: i == corpus["pandas"])
        return [], rf"{names[0]}: line {opens} opens a field in quotes that ends on line {at}"
    if form == "tsv" and (at := first(lambda pair, _: "\t" in "".join(pair))):
        return [], rf"{names[0]}: line {at} has \d tab-separated fields"
    for fault, said in ((lambda v: v is not None and not isinstance(v, str), "is"),
                        (lambda v: v == "\ud800x", "holds a lone surrogate")):  # fmt: skip
        if at := first(lambda _, i, fault=fault: i in read and any(map(fault, read[i]))):
            lang = "en" if fault(read[lines[at - 1][1]][0]) else "de"
            return [], rf"{names[0]}: line {at}: the '{lang}' value {said}"
    result = []
    for _, index, _ in lines:
        if index is None:
            continue
        source, target = read[index] if form == "jsonl" else pairs[index]
        result.append((expected_text(source, form), expected_text(target, form)))
    return result, None if result else r"holds no non-empty sentence pairs"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora())
def test_the_pairs_read_are_the_pairs_written_or_a_one_line_refusal(corpus):
    with tempfile.TemporaryDirectory() as folder:
        expected, refusal = written(corpus, Path(folder))
        try:
            pairs = load_split(folder, "train", "en", "de", keep_empty=True)
        except (ValueError, FileNotFoundError) as err:
            assert refusal is not None and re.search(refusal, str(err)), (str(err), refusal)
            assert "\n" not in str(err) and folder in str(err)
            return
        assert refusal is None, f"read {pairs}, expected the refusal {refusal}"
        assert pairs == expected


# --- vaswani translate's side files and vaswani score: lines end at \n ----------------------------------------------


@pytest.mark.parametrize("stdin", [False, True], ids=["file", "stdin"])
def test_command_line_files_split_at_newlines_only(stdin, tmp_path, monkeypatch):
    import io
    import sys

    from vaswani_hf.cli_decoding import _read_lines

    # U+2028, NEL, a file separator and a form feed are characters inside a line, as the translation reads them
    lines = ["one\u2028two", "three\x85four", "five\x1csix\x0cseven", "", "eight\r", "nine"]
    data = "\n".join(lines).encode() + b"\n"
    (tmp_path / "in.txt").write_bytes(data)
    if stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    assert _read_lines(None if stdin else str(tmp_path / "in.txt")) == [line.rstrip("\r") for line in lines]


@pytest.mark.parametrize("reader", ["_read_lines", "_stream_lines"])
def test_command_line_files_lose_a_leading_byte_order_mark_as_prepare_does(reader, tmp_path):
    # a file saved by Notepad starts with U+FEFF: kept, the first sentence was translated or scored with an <unk>
    from vaswani_hf import cli_decoding

    (tmp_path / "in.txt").write_bytes("\ufeffhello world\nsecond\n".encode())
    assert list(getattr(cli_decoding, reader)(str(tmp_path / "in.txt"))) == ["hello world", "second"]
