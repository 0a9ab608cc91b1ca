"""The task seam (vaswani_hf/tasks/): shared code asks the task and never tests its name; each task's defaults,
length check and evaluation are its own, and a parser is scored against the cleaned gold trees themselves."""

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from transformers import EvalPrediction

import vaswani_hf
from vaswani_hf.cli import main, train_arguments
from vaswani_hf.parsing.builtin_treebank import builtin_treebank, write_treebank
from vaswani_hf.parsing.task import ParseMetrics
from vaswani_hf.parsing.trees import parse_tree
from vaswani_hf.tasks import TASKS, task_named, task_of
from vaswani_hf.tasks.parsing import CPU_SETTINGS, MAX_LENGTH
from vaswani_hf.training.recipe import DataArguments, VaswaniTrainingArguments

PACKAGE = Path(vaswani_hf.__file__).parent
# the tasks' own modules may know their task; the command table names commands, some of which share tasks' names
OWN = ("tasks/", "parsing/", "cli_parsing.py")


def _shared_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not relative.startswith(OWN):
            yield relative, ast.parse(path.read_text(encoding="utf-8"))


def test_no_shared_module_tests_a_tasks_name_or_reads_a_parsers_config():
    names = set(TASKS)
    offences = []
    for relative, module in _shared_modules():
        for node in ast.walk(module):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                constants = [op for op in operands if isinstance(op, ast.Constant)]
                constants += [e for op in operands if isinstance(op, ast.Tuple | ast.Set | ast.List) for e in op.elts]
                if any(isinstance(c, ast.Constant) and c.value in names for c in constants):
                    offences.append(f"{relative}:{node.lineno} compares with a task's name")
            if isinstance(node, ast.Attribute) and node.attr == "parsing":
                offences.append(f"{relative}:{node.lineno} reads .parsing (ask the task: tasks.task_of)")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
                if any(isinstance(a, ast.Constant) and a.value in ("parsing", "task") for a in node.args[1:2]):
                    offences.append(f"{relative}:{node.lineno} getattr of a task marker")
            if isinstance(node, ast.ImportFrom) and any(alias.name == "parsing_of" for alias in node.names):
                offences.append(f"{relative}:{node.lineno} imports parsing_of")
    assert not offences, offences


def test_the_registry_names_each_task_once_and_finds_a_models_task():
    assert task_named("parse").name == "parse" and task_named("translate").name == "translate"
    with pytest.raises(ValueError, match="--task tag: choose one of translate, parse"):
        task_named("tag")

    class Config:
        parsing = {"form": "tags", "phrase_labels": ["S"], "tags": ["NN"]}

    assert task_of(Config()) is TASKS["parse"]
    assert task_of(object()) is TASKS["translate"] and task_of(None) is TASKS["translate"]


def test_train_defaults_are_the_tasks(tmp_path):
    fp32 = ["--precision", "fp32"]
    data, model, training, builtin = train_arguments(["--task", "parse", "--data", str(tmp_path), *fp32], "cpu")
    assert not builtin and model.preset == "small" and model.config_overrides == CPU_SETTINGS["config_overrides"]
    assert (training.max_steps, training.max_tokens, model.lr_scale) == (1650, 0, 0.5)
    assert (data.eval_split, data.max_length, data.vocab_size, training.output_dir) == ("dev", MAX_LENGTH, 1000,
                                                                                        "vaswani-parser")  # fmt: skip
    assert data.split_punctuation is False  # tree symbols hold punctuation
    # --preset parse keeps the paper's GPU recipe, and so does a GPU
    for argv, device in ((["--preset", "parse"], "cpu"), ([], "cuda")):
        data, model, training, _ = train_arguments(["--task", "parse", "--data", str(tmp_path), *argv, *fp32], device)
        paper = {
            name: VaswaniTrainingArguments.__dataclass_fields__[name].default for name in ("max_tokens", "max_steps")
        }
        assert (training.max_tokens, training.max_steps) == (paper["max_tokens"], paper["max_steps"])
        assert model.config_overrides is None and model.lr_scale == 1.0
        assert data.eval_split == "dev" and data.max_length == MAX_LENGTH
    data, model, training, builtin = train_arguments(["--data", str(tmp_path), *fp32], "cpu")
    assert (model.preset, data.eval_split, data.max_length, training.output_dir) == ("base", "val", 256,
                                                                                     "vaswani-model")  # fmt: skip
    data, model, training, builtin = train_arguments(fp32, "cpu")
    assert builtin and (model.preset, data.eval_split, training.max_steps) == ("small", "test", 1200)


def _long_treebank(folder: Path, words: int) -> None:
    splits = builtin_treebank(train_size=20, test_size=3)
    long = parse_tree("(S (NP " + " ".join(f"(NN w{i})" for i in range(words)) + ") (VP (VBD ran)))")
    write_treebank(folder, {"train": [*splits["train"][:1], long, *splits["train"][1:]], "dev": splits["dev"]})


def test_a_tree_longer_than_max_length_is_refused_before_training_naming_it(tmp_path, capsys):
    _long_treebank(tmp_path / "tb", words=120)  # the built-in trees take under 100 tokens
    data_args = DataArguments(task="parse", data=str(tmp_path / "tb"), max_length=100)
    data_args.read_data()
    with pytest.raises(ValueError, match=r"train.trees: tree 2 \(121 words\) is 128 target tokens long, over "
                       r"--max_length 100.*raise --max_length to 128"):  # fmt: skip
        data_args.run_task.check_lengths(data_args)
    status = main(["train", "--task", "parse", "--data", str(tmp_path / "tb"), "--max_length", "100", "--precision",
                   "fp32", "--output_dir", str(tmp_path / "out")])  # fmt: skip
    assert status == 2 and "tree 2 (121 words)" in capsys.readouterr().err
    assert not (tmp_path / "out" / "config.json").exists()
    data_args = DataArguments(task="parse", data=str(tmp_path / "tb"), max_length=128)
    data_args.read_data()
    data_args.run_task.check_lengths(data_args)  # at the limit: taken


class _Outputs:
    """A tokenizer stand-in whose ids are the rows of `texts` (ParseMetrics only decodes)."""

    pad_token_id = -1

    def __init__(self, texts):
        self.texts = texts

    def batch_decode(self, ids, skip_special_tokens=True):
        return [self.texts[row[0]] for row in ids]


def test_evaluation_during_training_scores_against_the_gold_trees_themselves():
    # "oh" is tagged UH in the gold tree, a tag the training split never had: a gold tree rebuilt from the target
    # with the training labels would read UH as a phrase label and shift the words' tags
    gold = [parse_tree("(TOP (S (NP (DT the) (NN dog)) (VP (VBD barked) (UH oh))))")]
    parsing = {"form": "tags", "phrase_labels": ["S", "NP", "VP"], "tags": ["DT", "NN", "VBD"]}
    output = "S NP DT NN /NP VP VBD NN /VP /S"  # the model tags "oh" NN
    metrics = ParseMetrics(_Outputs([output]), parsing, gold)
    metrics.expect({"source_text": ["the dog barked oh"], "row": [0]})
    figures = metrics(EvalPrediction(predictions=np.array([[0]]), label_ids=np.array([[0]])))
    assert figures["evalb_f1"] == 100.0 and figures["evalb_tagging_accuracy"] == 75.0
    assert figures["evalb_error_sentences"] == 0 and figures["repaired"] == 0
    # the xx form: the words take the gold tags, so punctuation is deleted on both sides, as EVALB deletes it
    gold = [parse_tree("(TOP (S (NP (NN it)) (VP (VBD rained)) (. .)))")]
    parsing = {"form": "xx", "phrase_labels": ["S", "NP", "VP"], "tags": ["NN", "VBD", "."]}
    metrics = ParseMetrics(_Outputs(["S NP XX /NP VP XX /VP XX /S"]), parsing, gold)
    metrics.expect({"source_text": ["it rained ."], "row": [0]})
    figures = metrics(EvalPrediction(predictions=np.array([[0]]), label_ids=np.array([[0]])))
    assert figures["evalb_f1"] == 100.0 and figures["evalb_error_sentences"] == 0
    assert metrics.hypotheses == ["(TOP (S (NP (NN it)) (VP (VBD rained)) (. .)))"]


def test_a_converted_treebank_keeps_its_held_out_gold_trees(tmp_path):
    splits = builtin_treebank(train_size=30, test_size=4)
    write_treebank(tmp_path / "tb", {"train": splits["train"], "dev": splits["dev"]})
    data_args = DataArguments(task="parse", data=str(tmp_path / "tb"), linearization="xx", eval_split="dev")
    data_args.read_data()
    gold = data_args.run_task.gold(data_args, "dev")
    # the cleaned trees, with their real tags, under TOP: not the xx targets rebuilt
    assert [str(tree) for tree in gold] == [f"(TOP {tree})" for tree in map(_clean, splits["dev"])]
    assert all("XX" not in str(tree) for tree in gold)
    labels = json.loads((Path(data_args.data) / "labels.json").read_text())
    assert labels["longest_target"]["tokens"] == max(
        len(line.split()) + 1 for line in (Path(data_args.data) / "train.tree").read_text().splitlines()
    )


def _clean(tree):
    from vaswani_hf.parsing.treebank import clean

    return clean(tree)


def test_an_xx_parser_is_scored_against_the_gold_trees_in_training_and_evaluate_as_evalb_scores_it(tmp_path):
    """With every tag written XX, a tree rebuilt from the target kept the punctuation that EVALB deletes by its
    gold tag: every sentence with punctuation was an error sentence. Now both evaluations score the real gold."""
    from vaswani_hf.parsing.treebank import gold_tree

    from .helpers import vaswani
    from .test_parsing_training import PARSE_RUN

    splits = builtin_treebank(train_size=200, test_size=6)
    write_treebank(tmp_path / "tb", {"train": splits["train"], "dev": splits["dev"]})
    assert sum("(. " in str(tree) for tree in splits["dev"]) >= 3  # sentences with punctuation
    env = {**__import__("os").environ, "VASWANI_PREPARED_CACHE": str(tmp_path / "cache")}
    run = [*PARSE_RUN, "--max_steps", "20", "--linearization", "xx", "--eval_split", "dev"]
    result = vaswani("train", *run, "--data", str(tmp_path / "tb"), "--output_dir", str(tmp_path / "m"), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(next(line for line in result.stdout.splitlines() if line.startswith('{"')))
    assert summary["evalb_error_sentences"] == 0 and summary["evalb_valid_sentences"] == 6
    result = vaswani("evaluate", str(tmp_path / "m"), "--data", str(tmp_path / "tb"), "--split", "dev",
                     "--num-beams", "2", "--hypotheses", str(tmp_path / "hyp.trees"), env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.splitlines()[-1])
    assert figures["evalb_error_sentences"] == 0 and figures["evalb_valid_sentences"] == 6
    (tmp_path / "gold.trees").write_text("".join(f"{gold_tree(tree)}\n" for tree in splits["dev"]))
    scored = vaswani("evalb", str(tmp_path / "gold.trees"), str(tmp_path / "hyp.trees"), "-e", "0", "--json")
    assert scored.returncode == 0, scored.stderr
    by_evalb = json.loads(scored.stdout.splitlines()[-1])
    assert {k: by_evalb[k] for k in figures if k.startswith("evalb_")} == {
        k: v for k, v in figures.items() if k.startswith("evalb_")
    }
