"""The rerunnable engine comparisons of docs/engines-performance.md: benchmarks/engines.py (`vaswani translate` against
CTranslate2 as whole processes) and benchmarks/serve_engines.py (`vaswani serve` against CTranslate2 behind an HTTP
loop), each run end to end on a few lines of a trained tiny model. Greedy fp32 outputs are the same tokens in both
engines (tests/test_export.py), so any line that differs is the harness's fault: the token strings CTranslate2 was
handed, the decoding, the output limit or the order the batches put back."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).parents[1]
HAS_CT2 = importlib.util.find_spec("ctranslate2") is not None


def table(text: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in `text`, by column name."""
    rows = [line.strip().strip("|").split("|") for line in text.splitlines() if line.startswith("|")]
    header = [name.strip() for name in rows[0]]
    return [dict(zip(header, (cell.strip() for cell in row), strict=True)) for row in rows[2:]]


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.fixture
def lines(tmp_path):
    """Built-in test sentences of different lengths (so batches are sorted and put back) and their references."""
    from vaswani_hf.data.number_words import builtin_splits

    pairs = sorted(builtin_splits()["test"][:40], key=lambda pair: len(pair[0]))[::6][:6]
    source, reference = tmp_path / "lines.en", tmp_path / "lines.de"
    source.write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
    reference.write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
    return source, reference


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 300), max_size=80), batch_size=st.integers(1, 40),
       max_tokens=st.integers(1, 5000))  # fmt: skip
def test_the_ctranslate2_process_batches_as_vaswani_translate(lengths, batch_size, max_tokens):
    """The same sentences in each batch, in the same order: the engines are timed on the same batch shapes."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from ct2_translate import Ct2Translator

    from vaswani_hf.translation.inference import _batches

    contender = object.__new__(Ct2Translator)  # its batching alone: no model loaded
    contender.batch_size, contender.max_tokens = batch_size, max_tokens
    ours = list(_batches(lengths, batch_size, False, "", max_tokens))
    assert contender.batches([["t"] * n for n in lengths]) == ours


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def test_engines_benchmark_runs_whole_processes_and_compares_outputs(translator, lines, tmp_path):
    source, reference = lines
    out = tmp_path / "engines.md"
    run("engines.py", str(translator), "--input", str(source), "--reference", str(reference), "--lines", "6",
        "--rounds", "1", "--batch-sizes", "32", "--beams", "1", "--no-onnx", "--work", str(tmp_path / "work"),
        "--out", str(out), *([] if HAS_CT2 else ["--no-ct2"]))  # fmt: skip
    report = out.read_text()
    rows = {row["contender"]: row for row in table(report[report.index("| beams") :])}
    expected = {"vaswani translate fp32", "vaswani translate int8"}
    expected |= {"CTranslate2 fp32", "CTranslate2 int8"} if HAS_CT2 else set()
    assert set(rows) == expected
    for row in rows.values():
        assert number(row["whole, sentences/s"]) > 0, row
        assert float(row["BLEU"]) > 0, row  # the outputs are translations of the input, in its order
    assert 'python -c "import torch"`' in report and "Load average" in report
    if HAS_CT2:
        assert rows["vaswani translate fp32"]["equal to CT2"] == "100.0%", report
        assert rows["CTranslate2 fp32"]["equal to ours fp32"] == "100.0%", report


def test_a_run_beside_the_neighbour_past_its_limit_is_stopped_and_reported_as_slower(translator, lines, tmp_path):
    # CTranslate2 beside CTranslate2 (both spinning) took more than 9 minutes for 200 lines that take a few seconds
    # quiet, and the benchmark waited for it: `--neighbour-limit` stops such a run, and the report says so
    source, _ = lines
    out = tmp_path / "engines.md"
    run("engines.py", str(translator), "--input", str(source), "--lines", "6", "--rounds", "1", "--batch-sizes", "32",
        "--beams", "1", "--no-onnx", "--no-ct2", "--neighbour", "train", "--neighbour-warmup", "1",
        "--neighbour-limit", "0.01", "--work", str(tmp_path / "work"), "--out", str(out))  # fmt: skip
    report = out.read_text()
    rows = {row["contender"]: row for row in table(report[report.index("| beams") :])}
    assert set(rows) == {"vaswani translate fp32", "vaswani translate int8"}
    for row in rows.values():
        assert row["beside train, sentences/s"] == "< 600.0 (1 of 1 rounds stopped after 0.01 s)", row
        assert number(row["whole, sentences/s"]) > 0, row  # the quiet runs have no limit


def test_rounds_stopped_beside_the_neighbour_count_as_their_bound_in_the_median(tmp_path, capsys):
    # one stopped round of three threw the finished rounds away ("< 0.667 ... | < 0.00" where two rounds ran at
    # 50 sentences/s); the bound is lines / (limit - start-up); a limit of 0 or below is refused before measuring
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import engines
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    for name in ("config.json", "tokenizer.json", "generation_config.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "input.txt").write_text("A line.\n")
    model = [str(tmp_path), "--input", str(tmp_path / "input.txt"), "--neighbour", "train"]
    args = engines.parse([*model, "--lines", "200", "--neighbour-limit", "120"])
    contender = engines.Contender("vaswani translate fp32", "fp32", None)
    case, setting = (1, 1), "beside train"
    contender.startup[setting] = [1.0, 20.0, 1.0]
    contender.times[(setting, case)] = [5.0, math.inf, 5.0]
    assert engines.beside_cells(contender, setting, case, args, quiet=100.0) == " 50.0 | 0.5 |"
    contender.times[(setting, case)] = [math.inf, math.inf, 5.0]
    assert engines.beside_cells(contender, setting, case, args, quiet=100.0) == (
        " < 2 (2 of 3 rounds stopped after 120 s) | < 0.02 |")  # fmt: skip
    for limit in ("0", "-5"):
        with pytest.raises(SystemExit):
            engines.parse([*model, "--neighbour-limit", limit])
        assert "--neighbour-limit must be a number of seconds above 0" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_CT2, reason="needs CTranslate2 (pip install ctranslate2)")
def test_serve_engines_benchmark_drives_both_servers_with_one_client_loop(translator, lines, tmp_path):
    source, _ = lines
    out = tmp_path / "serve.md"
    # 32 clients connect at once, as the documented run's do: the CTranslate2 server's listen backlog was the
    # stdlib's 5, and the connections past it were reset
    run("serve_engines.py", str(translator), "--lines", str(source), "--count", "6", "--clients", "1", "32",
        "--requests", "32", "--rounds", "1", "--beams", "1", "--work", str(tmp_path), "--out", str(out))  # fmt: skip
    report = out.read_text()
    rows = table(report[report.index("| precision") :])
    assert [row["clients"] for row in rows] == ["1", "32"]
    for row in rows:
        assert number(row["vaswani serve, sentences/s"]) > 0 and number(row["CTranslate2, sentences/s"]) > 0, row
        assert row["equal answers"] == "100.0%", row  # greedy fp32: the same tokens through either server


def test_the_product_benchmark_times_every_way_on_the_model_s_own_weights(trained, tmp_path):
    # benchmarks/one_row_products.py, whose report docs/engines-performance.md cites: each way's row for each
    # number of rows and threads, the memory's floor beside them, the model's weights counted
    out = tmp_path / "products.md"
    result = run("one_row_products.py", str(trained[0]), "--rows", "1", "3", "--threads", "1", "--rounds", "2",
                 "--out", str(out))  # fmt: skip
    report = out.read_text()
    assert report == result.stdout
    rows = table(report[report.index("| rows") :])
    ways = {"F.linear", "weight @ hidden^T", "transposed weight", "memory (a sum)"}
    for count in ("1", "3"):
        timed = {row["way"]: row for row in rows if row["rows"] == count}
        assert ways <= set(timed), timed
        assert all(float(row["decoder linears"]) > 0 and float(row["output projection"]) > 0 for row in timed.values())
    config = json.loads((trained[0] / "config.json").read_text())
    weight = f"a ({config['vocab_size']}, {config['d_model']}) output weight"
    assert f"{6 * config['decoder_layers']} decoder linears and {weight}" in report  # every step's weight, no other
