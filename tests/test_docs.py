"""Docs that run: every code block a user would paste, in README.md and docs/, runs here as written.

A block is fenced as `bash` or `python` and has a marker on the line above it:
- `<!-- docs-test: run -->`: run by the default suite;
- `<!-- docs-test: slow -->`: run under `-m slow` (compiles, long exports);
- `<!-- docs-test: not run (REASON) -->`: never run, and the reason stands beside the block.
A block without a marker, or a "not run" without a reason, fails `test_every_block_says_whether_it_runs`.

The blocks run in a folder laid out as a user's would be after the README's main job: `vaswani-model/` (trained by
`vaswani train` on the built-in task, with five checkpoints), `second-model/` (a copy, for ensembles),
`sentences.en` / `sentences.de`, `terms.tsv`, `starts.txt` and `data/train.{en,de}`; for parsing, `treebank/`
(`train.trees`, `dev.trees`), `vaswani-parser/`, `sentences.txt` and their trees in `gold.trees`. Each block gets a
fresh copy, bash with `-e -o pipefail`, python in a new process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .helpers import DOCS_PARSER_RUN, trained_once

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PASTED = ("bash", "python")  # what a user pastes; other fences (text, json, yaml) show output or files
MARKER = re.compile(r"<!-- docs-test: (?:(run|slow)|not run \((.+)\)) -->")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Block:
    document: Path
    line: int  # of the opening fence
    language: str
    code: str
    mode: str | None  # "run", "slow", "not run" or None (no marker)
    reason: str | None

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks(document: Path) -> list[Block]:
    lines = document.read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        above = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.fullmatch(above.strip())
        mode = None if marker is None else (marker.group(1) or "not run")
        found.append(Block(document, index + 1, fence.group(1), "\n".join(lines[index + 1 : end]), mode,
                           marker.group(2) if marker else None))  # fmt: skip
        index = end + 1
    return found


ALL_BLOCKS = [block for document in DOCUMENTS for block in blocks(document)]
PASTED_BLOCKS = [block for block in ALL_BLOCKS if block.language in PASTED]


def test_every_block_says_whether_it_runs():
    assert len(PASTED_BLOCKS) >= 20, "the parser found too few blocks: is the fence syntax still ```bash?"
    unmarked = [block.name for block in PASTED_BLOCKS if block.mode is None]
    assert not unmarked, f"code blocks without a docs-test marker on the line above: {unmarked}"
    unexplained = [block.name for block in PASTED_BLOCKS if block.mode == "not run" and not block.reason.strip()]
    assert not unexplained, f"'not run' blocks need their reason beside them: {unexplained}"
    stray = [block.name for block in ALL_BLOCKS if block.language not in PASTED and block.mode is not None]
    assert not stray, f"a docs-test marker above a block that is neither bash nor python: {stray}"


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # [text](target) or [text](target#anchor)
LINKED = [*DOCUMENTS, *sorted((ROOT / "benchmarks").rglob("*.md"))]


def broken_links(document: Path) -> list[str]:
    """Relative link targets in `document` that do not exist. A link resolves from the document's own folder, as
    GitHub and every Markdown viewer resolve it, so `benchmarks/...` written in docs/ is broken (it wants `../`)."""
    targets = [match.group(1) for match in LINK.finditer(document.read_text(encoding="utf-8"))]
    return [t for t in targets if "://" not in t and not t.startswith("mailto:") and not (document.parent / t).exists()]


def test_every_relative_link_resolves():
    broken = {str(d.relative_to(ROOT)): b for d in LINKED if (b := broken_links(d))}
    assert not broken, f"links to files that do not exist (relative to the linking file's folder): {broken}"


def test_a_link_resolves_from_its_own_folder(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "table.md").write_text("|a|\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("[good](../benchmarks/table.md#top), [bad](benchmarks/table.md), [web](https://example.org/x)\n")
    assert broken_links(page) == ["benchmarks/table.md"]


def test_the_marker_parser_sees_what_a_reader_sees(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: run -->\n```bash\necho one\n```\n\n```python\nprint(2)\n```\n"
        "<!-- docs-test: not run (needs the Hub) -->\n\n```bash\nvaswani push\n```\n"
    )
    found = blocks(page)
    assert [(b.language, b.mode, b.reason, b.code) for b in found] == [
        ("bash", "run", None, "echo one"),
        ("python", None, None, "print(2)"),
        ("bash", "not run", "needs the Hub", "vaswani push"),
    ]


@pytest.fixture(scope="session")
def workspace(tmp_path_factory, translator) -> Path:
    """The folder the blocks run in, as a user's after `vaswani train` (tiny settings): its `vaswani-model/` is the
    session's trained translator (conftest.py), checkpoints included, copied (a block may write into it)."""
    from vaswani_hf.data.number_words import builtin_splits

    root = tmp_path_factory.mktemp("docs") / "work"
    root.mkdir()
    model = root / "vaswani-model"
    shutil.copytree(translator, model)
    shutil.copytree(model, root / "second-model", ignore=shutil.ignore_patterns("checkpoint-*"))
    pairs = builtin_splits()["test"][:6]
    (root / "sentences.en").write_text("".join(f"{source}\n" for source, _ in pairs), encoding="utf-8")
    (root / "sentences.de").write_text("".join(f"{target}\n" for _, target in pairs), encoding="utf-8")
    (root / "terms.tsv").write_text("drei\n\nsieben\tzwei\n\n\n\n", encoding="utf-8")
    (root / "starts.txt").write_text("drei\n\n\n\n\n\n", encoding="utf-8")
    # parsing (docs/parsing.md): a treebank folder, a barely trained parser, sentences and their gold trees
    from vaswani_hf.parsing.builtin_treebank import builtin_treebank, write_treebank
    from vaswani_hf.parsing.treebank import gold_tree

    treebank = builtin_treebank(train_size=300, test_size=20)
    write_treebank(root / "treebank", {"train": treebank["train"], "dev": treebank["dev"]})
    # gold.trees as docs/parsing.md says to write a gold file: cleaned, under TOP. Six sentences whose only
    # punctuation is the final stop, which even a barely trained parser tags "." (EVALB deletes punctuation by each
    # tree's own tags: a mistagged comma makes an error sentence, without figures)
    gold = [gold_tree(tree) for tree in treebank["test"] if "," not in tree.words()][:6]
    (root / "gold.trees").write_text("".join(f"{tree}\n" for tree in gold))
    (root / "sentences.txt").write_text("".join(" ".join(t.words()) + "\n" for t in gold))
    shutil.copytree(trained_once("parser", DOCS_PARSER_RUN, tmp_path_factory)[0], root / "vaswani-parser")
    (root / "data").mkdir()
    train = builtin_splits()["train"][:2000]
    (root / "data" / "train.en").write_text("".join(f"{source}\n" for source, _ in train), encoding="utf-8")
    (root / "data" / "train.de").write_text("".join(f"{target}\n" for _, target in train), encoding="utf-8")
    return root


def _run(block: Block, folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = [sys.executable, "-c", block.code] if block.language == "python" else ["bash", "-e", "-o", "pipefail",
                                                                                      "-c", block.code]  # fmt: skip
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900)  # fmt: skip


def _params(mode: str) -> list:
    marks = [pytest.mark.slow] if mode == "slow" else []
    return [pytest.param(block, id=block.name, marks=marks) for block in PASTED_BLOCKS if block.mode == mode]


@pytest.mark.parametrize("block", _params("run") + _params("slow"))
def test_the_block_runs_as_written(block, workspace, tmp_path):
    folder = tmp_path / "work"
    shutil.copytree(workspace, folder)
    result = _run(block, folder)
    assert result.returncode == 0, (
        f"{block.name} failed (exit {result.returncode}):\n{block.code}\n--- stderr ---\n{result.stderr[-3000:]}"
    )
    if "vaswani evalb gold.trees" in block.code:  # a summary of every sentence, with real figures
        summaries = result.stdout.split("=== Summary ===")[1:]
        assert len(summaries) == block.code.count("vaswani evalb gold.trees"), result.stdout
        for summary in summaries:
            figures = dict(line.split("=") for line in summary.split("-- len<=40 --")[0].splitlines() if "=" in line)
            figures = {name.strip(): value.strip() for name, value in figures.items()}
            # every sentence read and most scored: a barely trained parser may still mistag a stop, which EVALB
            # deletes by each tree's own tags (an error sentence); raw gold with traces would make all six errors
            assert figures["Number of sentence"] == "6" and int(figures["Number of Valid sentence"]) >= 4, summary
            assert 0 < float(figures["Bracketing FMeasure"]) <= 100, summary


def test_every_name_in_the_second_tier_is_a_test():
    """tests/extended_tier.txt names tests by node id, documentation blocks by line: a block that moved, or a test
    renamed, would fall back into the fast tier unseen."""
    import ast

    names = [line.strip() for line in (ROOT / "tests" / "extended_tier.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]  # fmt: skip
    blocks = {block.name for block in PASTED_BLOCKS}
    for name in names:
        path, _, rest = name.partition("::")
        function, _, param = rest.partition("[")
        tree = ast.parse((ROOT / path).read_text())
        # a test, or a test class (all its tests)
        functions = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        # a file alone takes all its tests
        assert function in functions if function else any(f.startswith("test_") for f in functions), name
        if path == "tests/test_docs.py" and param:
            assert param.rstrip("]") in blocks, f"{name}: no such block (its line moved?)"


def test_every_name_the_docs_take_from_the_package_is_there():
    """`from vaswani_hf import X` and `vaswani_hf.X` in the README and docs name the package's top level, whatever
    folder X lives in; and `import vaswani_hf` alone loads no part beyond the model and its registration with
    Transformers (and the OpenMP and thread-count helpers the model's speed paths use; the rest loads on first
    use)."""
    text = "\n".join(d.read_text() for d in DOCUMENTS)
    names = {n.strip() for group in re.findall(r"from vaswani_hf import ([\w, ]+)", text) for n in group.split(",")}
    names.discard("")
    names |= set(re.findall(r"`vaswani_hf\.([A-Za-z_]\w*)\(", text))
    assert {"quantize_int8", "compute_metrics", "Ensemble", "OnnxSeq2Seq"} <= names
    code = (f"import sys, vaswani_hf; parts = [m for m in sys.modules if m.startswith('vaswani_hf.') and "
            f"not m.startswith('vaswani_hf.model') and m not in ('vaswani_hf.openmp', 'vaswani_hf.registration', "
            f"'vaswani_hf.thread_counts')]; "
            f"assert not parts, parts; "
            f"[getattr(vaswani_hf, name) for name in {sorted(names)!r}]")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_training_started_with_the_session_is_the_one_its_fixture_gets(tmp_path, tmp_path_factory, monkeypatch):
    """docs/tests.md: the shared trainings start as soon as the tests are collected, each in a process of its own
    (`start_training`); the fixture that asks for one waits for it, a kept one starts nothing, and one no test took
    is stopped at the session's end."""
    from . import helpers

    marks = tmp_path / "marks"
    marks.mkdir()
    script = (
        "import os, sys, time, pathlib; out = pathlib.Path(sys.argv[sys.argv.index('--output_dir') + 1]); "
        "time.sleep(float(os.environ.get('SLEEP', sys.argv[1]))); out.mkdir(parents=True); "
        "(out / 'model.bin').write_text('trained'); "
        "open(os.path.join(sys.argv[2], str(os.getpid())), 'w').close(); print('trained into', out)"
    )
    command = lambda args, out: [sys.executable, "-c", script, *args, "--output_dir", str(out)]  # noqa: E731
    monkeypatch.setattr(helpers, "_STARTED", {})  # this session's own early trainings stay as they are
    monkeypatch.setattr(helpers, "_train_command", command)
    monkeypatch.setattr(helpers, "_train", lambda *_: pytest.fail("trained again instead of waiting"))
    monkeypatch.setenv("VASWANI_TEST_TRAININGS", "0")
    helpers.start_training("m", ["0.5", str(marks)], tmp_path_factory)
    helpers.start_training("m", ["0.5", str(marks)], tmp_path_factory)  # asked twice: started once
    folder, stdout = helpers.trained_once("m", ["0.5", str(marks)], tmp_path_factory)
    assert (folder / "model.bin").read_text() == "trained" and stdout == f"trained into {folder}\n"
    assert len(list(marks.iterdir())) == 1 and not helpers._STARTED

    # kept: the same arguments, kept by an earlier session, start nothing
    monkeypatch.setenv("VASWANI_TEST_TRAININGS", str(tmp_path / "kept"))
    monkeypatch.setattr(helpers, "TRAININGS", tmp_path / "kept")
    env = {**os.environ, "SLEEP": "0"}
    train_now = lambda args, out: subprocess.run(command(args, out), capture_output=True, text=True, env=env).stdout  # noqa: E731
    monkeypatch.setattr(helpers, "_train", train_now)
    helpers.trained_once("k", ["30", str(marks)], tmp_path_factory)
    helpers.start_training("k", ["30", str(marks)], tmp_path_factory)
    assert not helpers._STARTED and len(list(marks.iterdir())) == 2

    # kept mode, nothing kept yet: the started training is waited for and kept, not trained again
    helpers.start_training("w", ["0.5", str(marks)], tmp_path_factory)
    with monkeypatch.context() as patch:
        patch.setattr(helpers, "_train", lambda *_: pytest.fail("trained again instead of waiting"))
        folder = helpers.trained_once("w", ["0.5", str(marks)], tmp_path_factory)[0]
    assert (folder / "model.bin").read_text() == "trained" and len(list(marks.iterdir())) == 3
    assert helpers.trained_once("w", ["0.5", str(marks)], tmp_path_factory)[0] != folder  # the kept one, copied
    assert len(list(marks.iterdir())) == 3

    # a training that fails fails its fixture
    helpers.start_training("f", ["not a number", str(marks)], tmp_path_factory)
    with pytest.raises(AssertionError, match="ValueError"):
        helpers.trained_once("f", ["not a number", str(marks)], tmp_path_factory)

    # kept by another session while this one's started training ran: that one is stopped, the kept one copied
    helpers.start_training("j", ["30", str(marks)], tmp_path_factory)
    key, started = helpers._STARTED.popitem()
    helpers.trained_once("j", ["30", str(marks)], tmp_path_factory)  # the other session
    helpers._STARTED[key] = started
    folder = helpers.trained_once("j", ["30", str(marks)], tmp_path_factory)[0]
    assert (folder / "model.bin").read_text() == "trained" and started.process.returncode is not None

    # one no test took is stopped at the session's end
    helpers.start_training("slow", ["600", str(marks)], tmp_path_factory)
    [started] = helpers._STARTED.values()
    helpers.stop_started_trainings()
    assert started.process.returncode is not None and not helpers._STARTED


def test_the_session_starts_the_trainings_its_tests_ask_for_and_no_other():
    """docs/tests.md: a training starts early where a collected test asks for its fixture, the conftest's or the
    docs workspace's, not another module's fixture of the same name (test_edges.py's own `translator`)."""
    selections = {
        "test_edges.py::test_pipeline_truncates": ["run"],  # its own `translator` takes `trained`
        "test_docs.py::test_the_block_runs_as_written": ["translator", "parser"],
        "test_model.py::": [],
    }
    plugin = (
        "import pytest, sys\nfrom tests import conftest\nclass Early:\n"
        "    def pytest_collection_finish(self, session):\n"
        f"        for part in {list(selections)!r}:\n"
        "            items = [item for item in session.items if part in item.nodeid]\n"
        "            print('EARLY', part, [name for name, _ in conftest.early_trainings(items)])\n"
        "pytest.main(sys.argv[1:] + ['-q', '--co', '-p', 'no:cacheprovider'], plugins=[Early()])"
    )
    files = ["tests/test_edges.py", "tests/test_docs.py", "tests/test_model.py"]
    result = subprocess.run([sys.executable, "-c", plugin, *files], capture_output=True, text=True)
    for part, expected in selections.items():
        assert f"EARLY {part} {expected}" in result.stdout.splitlines(), result.stdout[-2000:]


def test_a_kept_training_is_reused_only_while_nothing_it_depends_on_changed(tmp_path, tmp_path_factory, monkeypatch):
    """docs/tests.md: the tests' shared trainings are kept between sessions (`trained_once`); each session gets its
    own copy."""
    from . import helpers

    runs = []

    def train(*args, **_):  # a stand-in for `vaswani train`: its output folder, and what it printed
        out = Path(args[args.index("--output_dir") + 1])
        out.mkdir(parents=True)
        (out / "model.bin").write_text(f"run {len(runs)}")
        runs.append(args)
        return subprocess.CompletedProcess(args, 0, stdout=f"trained {len(runs)} into {out}\n", stderr="")

    kept = tmp_path / "kept"
    monkeypatch.setattr(helpers, "vaswani", train)
    monkeypatch.setattr(helpers, "TRAININGS", kept)
    monkeypatch.delenv("VASWANI_TEST_TRAININGS", raising=False)
    once = lambda *args: helpers.trained_once("m", list(args), tmp_path_factory)  # noqa: E731
    first = once("--max_steps", "4")
    assert first[1] == f"trained 1 into {first[0]}\n"
    (first[0] / "model.bin").write_text("written into by a test")  # its own copy: the kept one stays
    second = once("--max_steps", "4")
    assert len(runs) == 1 and second[0] != first[0] and second[1] == f"trained 1 into {second[0]}\n"
    assert (second[0] / "model.bin").read_text() == "run 0"
    once("--max_steps", "5")  # other arguments: another training
    assert len(runs) == 2
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")  # the environment is part of the key
    once("--max_steps", "4")
    assert len(runs) == 3
    monkeypatch.delenv("DNNL_MAX_CPU_ISA")
    [folder] = [f for f in kept.iterdir() if f.is_dir() and (f / "model" / "model.bin").read_text() == "run 0"]
    (folder / "model" / "model.bin").write_text("changed")  # a kept folder changed since: trained again
    assert (once("--max_steps", "4")[0] / "model.bin").read_text() == "run 3" and len(runs) == 4
    (folder / "training.json").write_text('{"stdout": "tra')  # a record cut short: trained again
    once("--max_steps", "4")
    assert len(runs) == 5
    monkeypatch.setattr(helpers, "_PACKAGE", tmp_path / "package")  # so are the package's files
    (tmp_path / "package" / "vaswani_hf").mkdir(parents=True)
    (tmp_path / "package" / "vaswani_hf" / "x.py").write_text("x = 1\n")
    once("--max_steps", "4")
    assert len(runs) == 6
    # a training unused for days is forgotten, but not while another session holds it
    old = time.time() - 4 * 86400
    os.utime(folder / "training.json", (old, old))
    with helpers._locked(folder):
        once("--max_steps", "4")
        assert folder.is_dir()
    once("--max_steps", "4")
    assert not folder.exists() and len(runs) == 6
    monkeypatch.setenv("VASWANI_TEST_TRAININGS", "0")  # off: every session trains afresh, nothing kept
    before = sorted(kept.iterdir())
    off = once("--max_steps", "4")
    assert len(runs) == 7 and not off[0].is_relative_to(kept) and sorted(kept.iterdir()) == before
