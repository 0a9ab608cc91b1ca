"""Users' corpora, the next layer: evaluation splits kept line for line in every format (a TSV line of a tab alone
is a pair of empty sides, not a blank line), the model card's example within the model's length, UTF-16/32 and
JSONL duplicate keys named, TSV headers that name the languages in words or the columns skipped, and every fault a
user can reach said as one `error:` line through the command line (a parquet folder of two schemas, the BPE
learner killed, a tab written raw inside a JSON string)."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from vaswani_hf.cli import main
from vaswani_hf.data.preparation import prepare
from vaswani_hf.data.prepared import InMemoryData
from vaswani_hf.data.prepared_cache import PreparationRequest
from vaswani_hf.data.readers import load_split

from .helpers import TINY_RUN
from .test_user_corpora import write

# a 24-line evaluation file with two pairs of empty sides, as the user had it
PAIRS = [(f"one {n}", f"eins {n}") for n in range(22)]
PAIRS[5:5] = [("", "")]
PAIRS[17:17] = [("", "")]


def files_of(form: str, split: str, pairs: list[tuple[str, str]]) -> dict:
    if form == "tsv":
        return {f"{split}.tsv": "".join(f"{s}\t{t}\n" for s, t in pairs)}
    if form == "jsonl":
        return {f"{split}.jsonl": "".join(json.dumps({"translation": {"en": s, "de": t}}) + "\n" for s, t in pairs)}
    return {f"{split}.en": "".join(f"{s}\n" for s, _ in pairs), f"{split}.de": "".join(f"{t}\n" for _, t in pairs)}


def one_error_line(capsys) -> str:
    """The command's stderr ends with one `error:` line, and holds no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: "), err[-3000:]
    return last


# --- evaluation splits whole, line for line ---------------------------------------------------------------------


@pytest.mark.parametrize("form", ["tsv", "jsonl", "parallel"])
def test_an_evaluation_split_keeps_every_pair_of_empty_sides(form, tmp_path, monkeypatch):
    monkeypatch.setenv("VASWANI_PREPARED_CACHE", str(tmp_path / "cache"))
    train = [(f"w{n} w{n + 1}", f"v{n} v{n + 1}") for n in range(40)]
    data = write(tmp_path / "data", {**files_of(form, "train", train), **files_of(form, "val", PAIRS)})
    assert load_split(str(data), "val", "en", "de", keep_empty=True) == PAIRS
    prepared = prepare(PreparationRequest(str(data), "en", "de", vocab_size=100), quiet=True, eval_splits=["val"])
    assert prepared.counts("val")["read"] == prepared.counts("val")["pairs"] == 24
    assert list(prepared.pairs("val")) == PAIRS


def test_a_training_split_drops_a_tsv_pair_of_empty_sides_and_counts_it(tmp_path, caplog):
    write(tmp_path, {"train.tsv": "a\tb\n\t\n  \t \n\nc\td\n"})  # two pairs of empty sides, one blank line
    assert load_split(str(tmp_path), "train", "en", "de") == [("a", "b"), ("c", "d")]
    assert "dropped 2 of 4 pairs with an empty side" in caplog.text


@pytest.mark.parametrize("form", ["tsv", "jsonl", "parallel"])
def test_hypotheses_have_the_reference_s_line_count_in_every_format(form, trained, tmp_path, capsys):
    data = write(tmp_path / "data", files_of(form, "test", PAIRS))
    hypotheses = tmp_path / "test.hyp"
    assert main(["evaluate", str(trained[0]), "--data", str(data), "--hypotheses", str(hypotheses)]) == 0
    assert json.loads(capsys.readouterr().out)["sentences"] == 24
    lines = hypotheses.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 25 and lines[-1] == ""  # 24 lines, each ended
    assert lines[5] == lines[17] == ""  # an empty source gives an empty hypothesis, in its place


# --- nothing after training reads a line whole ----------------------------------------------------------------


def test_the_card_example_is_the_first_source_within_the_model_s_length():
    from vaswani_hf.data.tokenization import train_shared_bpe
    from vaswani_hf.training.recipe import card_example

    words = [f"w{n % 50}" for n in range(400)]
    tokenizer = train_shared_bpe([" ".join(words)], 100)
    long = " ".join(words)
    pairs = [(long, "w1"), ("", "w2"), ("w3 w4", "w5"), ("w6", "w7")]
    data = InMemoryData({"train": pairs[2:], "val": pairs}, tokenizer)
    assert card_example(data, "val", 16) == "w3 w4"  # not the long line, nor the empty one
    cut = card_example(InMemoryData({"train": pairs[2:], "val": pairs[:2]}, tokenizer), "val", 16)
    assert cut == " ".join(words[:15])  # none fits: the first, cut to 15 tokens and </s>


def test_a_long_first_evaluation_line_ends_the_run_in_minutes(tmp_path):
    rng = np.random.default_rng(0)
    words = [f"w{n}" for n in range(30)]
    train = [(" ".join(rng.choice(words, 6)), " ".join(rng.choice(words, 6))) for _ in range(64)]
    val = [(" ".join(rng.choice(words, 1 << 16)), "w1 w2"), *train[:3]]  # the first line: 65,536 words
    files = {**files_of("parallel", "train", train), **files_of("parallel", "val", val)}
    argv = ["train", "--data", str(write(tmp_path / "data", files)), *TINY_RUN, "--save_strategy", "no",
            "--output_dir", str(tmp_path / "out")]  # fmt: skip
    # before, the card's attention maps drew the whole first line: hours, and terabytes of attention
    result = subprocess.run([sys.executable, "-m", "vaswani_hf.cli", *argv], capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "could not be written" not in result.stderr  # the card, with its attention maps
    facts = json.loads((tmp_path / "out" / "training_facts.json").read_text())
    assert facts["data"]["example"][0] == val[1][0]  # the first evaluation source that fits
    assert (tmp_path / "out" / "attention-cross.png").is_file()


# --- encodings and duplicate keys named ---------------------------------------------------------------------------

ENCODINGS = {
    "utf-16": "UTF-16LE (with a byte-order mark)",
    "utf-16-le": "UTF-16LE (without a byte-order mark)",
    "utf-16-be": "UTF-16BE (without a byte-order mark)",
    "utf-32": "UTF-32LE (with a byte-order mark)",
    "utf-32-le": "UTF-32LE (without a byte-order mark)",
    "utf-32-be": "UTF-32BE (without a byte-order mark)",
}


@pytest.mark.parametrize("form", ["tsv", "jsonl", "parallel"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_utf16_and_utf32_are_named_with_the_fix_before_any_line_end_advice(encoding, form, tmp_path):
    # Windows line ends, as Excel's "Unicode Text" export writes them: the CR advice once came first
    files = {name: text.replace("\n", "\r\n").encode(encoding) for name, text in files_of(form, "train", PAIRS).items()}
    write(tmp_path, files)
    with pytest.raises(ValueError) as refused:
        load_split(str(tmp_path), "train", "en", "de")
    said = str(refused.value)
    assert f"is {ENCODINGS[encoding]}, not UTF-8" in said and "\n" not in said
    given = encoding.upper().replace("-LE", "LE").replace("-BE", "BE") if "without" in ENCODINGS[encoding] else None
    assert f"`iconv -f {given or encoding.upper()} -t UTF-8 " in said


@pytest.mark.parametrize("reader", ["_read_lines", "_stream_lines"])
def test_command_line_files_in_utf16_are_named(reader, tmp_path):
    from vaswani_hf import cli_decoding

    (tmp_path / "in.txt").write_bytes("Two young people\nare outside.\n".encode("utf-16-le"))
    with pytest.raises(ValueError, match=r"in.txt is UTF-16LE \(without a byte-order mark\).*iconv -f UTF-16LE"):
        list(getattr(cli_decoding, reader)(str(tmp_path / "in.txt")))


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("text", ["Hi", "a", "Hey"])
def test_a_file_of_a_few_utf16_characters_without_a_line_end_is_named(text, encoding):
    # an attacker's find: under 8 bytes the NULs were not looked at, and "Hi" in UTF-16LE was read as "H\0i\0"
    from vaswani_hf.data.encodings import wide_encoding

    assert (
        wide_encoding(text.encode(encoding))
        == f"{encoding.upper().replace('-LE', 'LE').replace('-BE', 'BE')} (without a byte-order mark)"
    )
    assert wide_encoding(text.encode("utf-8")) is None


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("text", ["a\t日", "a\t本", "日", "本"])
def test_a_short_utf16be_file_of_characters_without_a_nul_byte_is_named(text, end):
    # the differential test's find: 日 and 本 have no NUL byte in UTF-16BE, so one line of them had too few NULs to
    # count, and its one line end "\0\n" (ending the file, as "\n\0" does in UTF-16LE) was not taken as a sign;
    # "e\xe5\0" is not UTF-8, but was forgiven as a character cut where the head ends
    from vaswani_hf.data.encodings import wide_encoding

    assert wide_encoding((text + end).encode("utf-16-be")) == "UTF-16BE (without a byte-order mark)"
    assert wide_encoding((text + end).encode("utf-8")) is None


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("end", ["\n", "\r\n"], ids=["LF", "CRLF"])
@pytest.mark.parametrize(
    "lines",
    [
        ["ช้าง", "ไป", "ช้า"],
        ["ਪੰਜਾਬੀ", "ਭਾਸ਼ਾ", "ਹੈ"],
        ["Њива", "Њој", "Бео"],
        ["上海", "《书》", "日本"],
        ["ok 😊", "🌊 sea", "go"],
    ],
    ids=["thai", "gurmukhi", "serbian", "chinese", "emoji"],
)
def test_a_wide_file_whose_characters_hold_a_line_feed_byte_is_named(lines, end, encoding):
    # an attacker's find: ช U+0E0A, Gurmukhi's U+0A00-0AFF, Њ U+040A, 上 U+4E0A, 《 U+300A and 😊's low surrogate
    # DE0A hold a 0x0A byte beside a non-NUL one: that byte turned the line-end rule off for the whole file, and a
    # Thai UTF-16LE file (all of its bytes below 0x80, valid UTF-8) was read as twice its lines of garbage
    from vaswani_hf.data.encodings import wide_encoding

    text = "".join(line + end for line in lines)
    name = encoding.upper().replace("-LE", "LE").replace("-BE", "BE")
    assert wide_encoding(text.encode(encoding)) == f"{name} (without a byte-order mark)"
    assert wide_encoding(text.encode("utf-8")) is None


def test_a_wrong_byte_near_the_end_of_the_head_is_not_forgiven_as_a_cut_character():
    # 日 in UTF-16BE is e5 65 ... read as UTF-8 `\xe5` then a NUL: not a character cut where the head ends (the
    # decoder's reason tells), so a file with one line end and a wrong byte in its last three is named
    from vaswani_hf.data.encodings import wide_encoding

    assert wide_encoding("a\n日b".encode("utf-16-be")) == "UTF-16BE (without a byte-order mark)"
    assert wide_encoding("a\nb日".encode()[:-1]) is None  # a UTF-8 head cut inside 日


def test_utf8_files_full_of_nuls_are_seldom_taken_for_utf16():
    # docs/data.md's rate: files of 1-5 short lines from an alphabet where NULs are two symbols in seven (real
    # UTF-8 text has none), drawn with a fixed seed: 2.5% are taken for UTF-16 or UTF-32 (0.9% before the
    # big-endian and in-character line-feed rules, 7.6% with those rules and no `_reads_as_text`)
    import random

    from vaswani_hf.data.encodings import wide_encoding

    draw, alphabet = random.Random(1), ["a", "b", "\x00", " ", "日", "ä", "\x00\x00"]
    taken = 0
    for _ in range(5000):
        lines = ["".join(draw.choice(alphabet) for _ in range(draw.randint(0, 8))) for _ in range(draw.randint(1, 5))]
        end = draw.choice(["\n", "\r\n"])
        taken += wide_encoding("".join(line + end for line in lines).encode("utf-8")) is not None
    assert taken / 5000 < 0.03


def test_a_gzipped_utf16_file_is_told_to_convert_through_zcat(tmp_path):
    # an attacker's find: the advice ran iconv on the compressed bytes and wrote a name the reader does not read
    import gzip

    (tmp_path / "train.tsv.gz").write_bytes(gzip.compress("a b\tc d\n".encode("utf-32")))
    with pytest.raises(ValueError) as refused:
        load_split(str(tmp_path), "train", "en", "de")
    assert (
        "`zcat train.tsv.gz | iconv -f UTF-32 -t UTF-8 | gzip > train.tsv.gz.utf8 && mv train.tsv.gz.utf8 train.tsv.gz`"
        in str(refused.value)
    )


def test_nul_characters_inside_utf8_text_are_not_taken_for_utf16(tmp_path):
    pairs = [("a\x00b", "c\x00\x00d"), ("\x00\x00\x00\x00", "e")]
    write(tmp_path, files_of("parallel", "train", pairs))
    assert load_split(str(tmp_path), "train", "en", "de") == pairs


DUPLICATES = [
    ('{"en": "FIRST", "en": "LAST", "de": "x"}', "en"),
    ('{"translation": {"en": "a", "de": "FIRST", "de": "LAST"}}', "de"),
    ('{"translation": {"en": "a", "de": "b"}, "translation": {"en": "c", "de": "d"}}', "translation"),
]


@pytest.mark.parametrize("blank", [False, True], ids=["arrow", "with-blank-line"])
@pytest.mark.parametrize("line, key", DUPLICATES, ids=["flat", "nested", "translation"])
def test_a_jsonl_key_named_twice_is_refused_naming_file_line_and_key(line, key, blank, tmp_path):
    write(tmp_path, {"train.jsonl": "\n" * blank + '{"en": "ok", "de": "gut"}\n' + line + "\n"})
    with pytest.raises(ValueError) as refused:
        load_split(str(tmp_path), "train", "en", "de")
    assert str(refused.value).startswith(f"{tmp_path / 'train.jsonl'}: line {2 + blank} names the key {key!r} twice")


def test_a_key_the_reader_ignores_may_repeat(tmp_path):
    write(tmp_path, {"train.jsonl": '{"id": 1, "id": 2, "en": "a", "de": "b"}\n'})  # as Arrow reads it
    assert load_split(str(tmp_path), "train", "en", "de") == [("a", "b")]


# --- TSV headers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["source\ttarget", "English\tGerman", "SRC\tTGT", "\nen\tde", "\n \nDeutsch"])
def test_a_header_naming_the_columns_or_the_languages_in_words_is_skipped_and_said(header, tmp_path, caplog):
    header = header.replace("Deutsch", "english\tDeutsch")
    write(tmp_path, {"train.tsv": f"{header}\na\tb\n"})
    assert load_split(str(tmp_path), "train", "en", "de") == [("a", "b")]
    assert f"line {header.count(chr(10)) + 1} is a header naming the languages (or the columns): skipped" in caplog.text


@pytest.mark.parametrize("header", ["target\tsource", "German\tEnglish", "\nde\ten"])
def test_a_header_naming_them_the_other_way_round_is_refused(header, tmp_path):
    write(tmp_path, {"train.tsv": f"{header}\na\tb\n"})
    with pytest.raises(ValueError, match=rf"line {header.count(chr(10)) + 1} is a header naming .*swap the columns"):
        load_split(str(tmp_path), "train", "en", "de")


# --- no traceback a user can reach: one error line through the command line -------------------------------------


def test_an_unescaped_tab_inside_a_json_string_is_named_with_the_fix(tmp_path, capsys):
    write(tmp_path / "data", {"train.jsonl": '{"en": "a\tb", "de": "c"}\n'})
    assert main(["prepare", "--data", str(tmp_path / "data"), "--output_dir", str(tmp_path / "out")]) == 2
    said = one_error_line(capsys)
    assert 'line 1 holds a control character ("\\t", column 10)' in said and "write it escaped" in said


def test_parquet_splits_of_two_schemas_are_one_error_line(tmp_path, capsys, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    (tmp_path / "hub").mkdir()
    pq.write_table(pa.table({"translation": [{"en": "a", "de": "b"}] * 3}), tmp_path / "hub" / "train.parquet")
    pq.write_table(pa.table({"en": ["a"] * 3, "de": ["b"] * 3}), tmp_path / "hub" / "validation.parquet")
    argv = ["prepare", "--dataset_name", str(tmp_path / "hub"), "--output_dir", str(tmp_path / "out")]
    assert main(argv) == 2
    said = one_error_line(capsys)
    assert "cannot build split 'train'" in said and "because column names don't match" in said
    assert "give every split's files the same columns" in said


def killed(*args) -> None:
    """The kernel's OOM killer, in the child that learns the BPE (a module's function: the child is sent it)."""
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_bpe_learner_names_memory_and_the_longest_line(tmp_path, capsys, monkeypatch):
    from vaswani_hf.data import preparation

    monkeypatch.setattr(preparation, "_learn_bpe", killed)
    monkeypatch.setenv("VASWANI_PREPARED_CACHE", str(tmp_path / "cache"))
    train = [("a b", "c d"), ("e " * 600, "f"), ("g", "h")]
    write(tmp_path / "data", files_of("tsv", "train", train))
    assert main(["prepare", "--data", str(tmp_path / "data"), "--output_dir", str(tmp_path / "out")]) == 2
    said = one_error_line(capsys)
    assert "the process learning the BPE vocabulary was killed (out of memory?)" in said
    assert "the longest training line is line 2 of" in said and "(en), 0.0 MB" in said
    assert "--bpe_sample_lines" in said


def test_a_treebank_saved_with_a_byte_order_mark_is_read(tmp_path):
    from vaswani_hf.parsing.trees import read_trees

    (tmp_path / "train.trees").write_bytes("\ufeff(S (NP (DT The) (NN cat)) (VP (VBZ sleeps)))\n".encode())
    assert [str(tree) for tree in read_trees(tmp_path / "train.trees")] == [
        "(S (NP (DT The) (NN cat)) (VP (VBZ sleeps)))"
    ]


def test_score_with_unequal_files_names_both(tmp_path, capsys):
    (tmp_path / "src").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("c\n", encoding="utf-8")
    # the files are compared before any model is read: no model is needed to be told
    argv = ["score", str(tmp_path / "model"), "--source", str(tmp_path / "src"), "--target", str(tmp_path / "tgt")]
    assert main(argv) == 2
    said = one_error_line(capsys)
    assert f"--source {tmp_path / 'src'} has 2 lines but --target {tmp_path / 'tgt'} has 1" in said


def test_an_evaluation_split_prepared_by_the_earlier_reading_is_prepared_again(tmp_path, monkeypatch):
    from vaswani_hf.data.prepared_cache import digest

    monkeypatch.setenv("VASWANI_PREPARED_CACHE", str(tmp_path / "cache"))
    train = [(f"w{n} w{n + 1}", f"v{n} v{n + 1}") for n in range(40)]
    data = write(tmp_path / "data", {**files_of("tsv", "train", train), **files_of("tsv", "val", PAIRS)})
    request = PreparationRequest(str(data), "en", "de", vocab_size=100)
    out = tmp_path / "out"
    prepare(request, out, quiet=True, eval_splits=["val"])
    # as the earlier reading left it: no reading version, 22 pairs (the tab lines skipped)
    manifest = out / "splits" / "val" / "split.json"
    earlier = {k: v for k, v in json.loads(manifest.read_text()).items() if k not in ("key", "reading")}
    earlier["counts"] = {**earlier.pop("counts"), "read": 22, "pairs": 22}
    inputs = {k: v for k, v in earlier.items() if k != "counts"}
    manifest.write_text(json.dumps({**earlier, "key": digest(inputs)}))
    prepared = prepare(request, out, quiet=True, eval_splits=["val"])
    assert prepared.counts("val")["read"] == 24 and list(prepared.pairs("val")) == PAIRS


@pytest.mark.parametrize("beside", ["", '{"en": null, "de": "c"}\n'], ids=["arrow", "line-by-line"])
def test_a_key_named_twice_inside_an_ignored_field_is_read_whatever_the_chunk_holds(beside, tmp_path):
    # a null beside it sends the chunk to the line-by-line reader, which once refused what Arrow reads
    write(tmp_path, {"train.jsonl": '{"meta": {"en": 1, "en": 2}, "en": "a", "de": "b"}\n' + beside})
    assert load_split(str(tmp_path), "train", "en", "de", keep_empty=True)[0] == ("a", "b")


REFUSED = {
    "utf-16": ({"train.tsv": "a\tb\r\nc\td\r\n".encode("utf-16")}, "train.tsv is UTF-16LE (with a byte-order mark)"),
    "reversed header": ({"train.tsv": "German\tEnglish\na\tb\n"}, "line 1 is a header naming German<TAB>English"),
    "duplicate key": ({"train.jsonl": '{"en": "a", "en": "b", "de": "c"}\n'}, "line 1 names the key 'en' twice"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_this_layer_s_refusals_are_one_error_line_through_the_command_line(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VASWANI_PREPARED_CACHE", str(tmp_path / "cache"))
    files, said = REFUSED[case]
    write(tmp_path / "data", files)
    assert main(["prepare", "--data", str(tmp_path / "data"), "--output_dir", str(tmp_path / "out")]) == 2
    assert said in one_error_line(capsys)
