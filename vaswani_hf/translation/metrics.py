"""Scores of translations (section 6.1: BLEU) through 🤗 Evaluate, offline by default.

The recipe's BLEU and chrF are `evaluate` metric modules shipped inside the package (`metric_modules/`, sacreBLEU's
own metrics with their signatures), loaded by path, so they need no network. Any other metric a user names is
loaded the same way: a packaged name, a local module (a folder holding NAME.py, or the .py file), or a Hub id when
online (`load_metrics`). `compute_metrics` builds a `Seq2SeqTrainer(predict_with_generate=True)` callback from a
tokenizer and metric names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from transformers import EvalPrediction, PreTrainedTokenizerBase

if TYPE_CHECKING:  # imported where a metric loads: `evaluate` imports Transformers' pipelines, a second a command
    import evaluate

PACKAGED = {name: Path(__file__).with_name("metric_modules") / name for name in ("bleu", "chrf", "tokenized_bleu")}
DEFAULT_METRICS = ("bleu", "chrf")  # the recipe's: always reported, `--metric` adds to them
_LOADED: dict[str, evaluate.EvaluationModule] = {}


def packaged(spec: str) -> tuple[Path, str | None] | None:
    """A packaged metric's module and configuration (`tokenized_bleu:de`: the Moses language), or None."""
    name, _, config = spec.partition(":")
    return (PACKAGED[name], config or None) if name in PACKAGED else None


def metric_name(spec: str) -> str:
    """The name a metric's results are reported under: a packaged name or Hub id as given, a local module by its
    file name ("my_metrics/ter.py" and "my_metrics/ter" are "ter")."""
    if packaged(spec):
        return spec.partition(":")[0]
    path = Path(spec)
    return path.stem if spec not in PACKAGED and (path.suffix == ".py" or path.exists()) else spec.split("/")[-1]


def load_metric(spec: str) -> evaluate.EvaluationModule:
    """One metric module: packaged (`bleu`, `chrf`), a local module path, or a Hub id when online; checked on a
    toy pair, so a broken module stops before any training or decoding, naming it."""
    if spec in _LOADED:
        return _LOADED[spec]
    path, config = packaged(spec) or (Path(spec), None)
    local = packaged(spec) is not None or path.exists() or path.suffix == ".py"
    if local and not path.exists():
        raise FileNotFoundError(f"--metric {spec}: no such file or folder.")
    import evaluate

    try:
        module = evaluate.load(str(path) if local else spec, config_name=config, keep_in_memory=True)
    except Exception as err:  # evaluate raises FileNotFoundError, ConnectionError, ImportError, ... by cause
        if local:
            raise ValueError(
                f"--metric {spec}: the metric module does not load ({type(err).__name__}: {err})."
            ) from err
        raise ValueError(
            f"--metric {spec}: not a packaged metric ({', '.join(PACKAGED)}) nor a local path, and the Hub did not "
            f"give it ({type(err).__name__}; offline, Hub names cannot load). Pass the path of a local metric module "
            f"instead: a folder holding {metric_name(spec)}.py, or the .py file itself."
        ) from err
    try:
        scalars(spec, _computed(module, ["a small test sentence ."], ["a small test sentence ."]))
    except Exception as err:
        raise ValueError(f"--metric {spec}: the metric module fails on a toy pair of sentences ({type(err).__name__}: "
                         f"{err}).") from err  # fmt: skip
    _LOADED[spec] = module
    return module


def load_metrics(specs: Iterable[str] = ()) -> dict[str, evaluate.EvaluationModule]:
    """The recipe's metrics (BLEU, chrF) and those asked for, by name, each loaded once and checked."""
    wanted = list(dict.fromkeys([*DEFAULT_METRICS, *specs]))
    return {spec: load_metric(spec) for spec in wanted}


def _computed(module: evaluate.EvaluationModule, hypotheses: list[str], references: list[str]) -> dict:
    """`module.compute`, with the references as the module takes them: strings, or one list of strings each (the
    Hub's `sacrebleu` module, for several references)."""
    features = module.features if isinstance(module.features, list) else [module.features]
    plain = any(getattr(f.get("references"), "dtype", None) == "string" for f in features)
    refs = references if plain else [[reference] for reference in references]
    return module.compute(predictions=hypotheses, references=refs) or {}


def scalars(spec: str, result: dict) -> dict:
    """A metric's numbers and strings (lists and arrays are left out: Trainer logs scalars), each reported under
    the metric's name: a key that starts with it as it is, the others as NAME_KEY (the packaged metrics' keys as
    they are: `brevity_penalty` is BLEU's, as the recipe has always reported it)."""
    name = "" if packaged(spec) else metric_name(spec)
    out = {}
    for key, value in result.items():
        if isinstance(value, (np.floating, np.integer)):
            value = value.item()
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out[key if key.startswith(name) else f"{name}_{key}"] = value
    return out


def score_with(metrics: dict[str, evaluate.EvaluationModule], hypotheses: Sequence[str],
               references: Sequence[str]) -> dict:  # fmt: skip
    """Every metric's results on the corpus, in one flat dict; BLEU and chrF rounded to 2 decimals, the brevity
    penalty to 3, as the recipe has always reported them."""
    results: dict = {}
    for spec, module in metrics.items():
        results.update(scalars(spec, _computed(module, list(hypotheses), list(references))))
    for key, digits in (("bleu", 2), ("chrf", 2), ("tokenized_bleu", 2), ("brevity_penalty", 3)):
        if isinstance(results.get(key), float):
            results[key] = round(results[key], digits)
    return results


def decode(tokenizer: PreTrainedTokenizerBase, ids) -> list[str]:
    """Token ids to text: -100 (label padding) read as padding, special tokens skipped, white space stripped."""
    ids = np.asarray(ids)
    ids = np.where(ids != -100, ids, tokenizer.pad_token_id)
    return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]


def compute_metrics(tokenizer: PreTrainedTokenizerBase, metrics: Iterable[str] = DEFAULT_METRICS
                    ) -> Callable[[EvalPrediction], dict]:  # fmt: skip
    """A `compute_metrics` for `Seq2SeqTrainer(..., predict_with_generate=True)`: decodes the generated ids and the
    labels (-100 and padding read as padding, special tokens skipped) and scores them with each metric (packaged
    names, local module paths or Hub ids; loaded and checked here, before training starts)."""
    modules = {spec: load_metric(spec) for spec in dict.fromkeys(metrics)}

    def compute(prediction: EvalPrediction) -> dict:
        predictions = prediction.predictions
        predictions = predictions[0] if isinstance(predictions, tuple) else predictions
        return score_with(modules, decode(tokenizer, predictions), decode(tokenizer, prediction.label_ids))

    return compute


class TranslationMetrics:
    """`compute_metrics` for Seq2SeqTrainer with `predict_with_generate`: sacreBLEU's BLEU and chrF, and the
    `metrics` asked for, through 🤗 Evaluate (`vaswani_hf.translation.metrics`).

    `VaswaniTrainer` calls `expect(dataset)` before each evaluation. Rows beyond the data set (DDP pads its last
    batches by repeating examples) are cut, and the remaining rows' labels must be the data set's, in order: no
    example counts twice or goes missing."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, metrics: list[str] | tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.metrics = load_metrics(metrics)
        # what its results are reported under ("brevity_penalty" is BLEU's)
        self.names = (*(metric_name(spec) for spec in self.metrics), "brevity_penalty")
        self.expected_labels: list[list[int]] | None = None
        self.references: list[str] | None = None
        self.hypotheses: list[str] = []

    def expect(self, dataset) -> None:
        self.expected_labels = dataset["labels"]
        self.references = dataset["target_text"] if "target_text" in dataset.column_names else None

    def __call__(self, prediction: EvalPrediction) -> dict:
        predictions = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        labels = prediction.label_ids
        if self.expected_labels is not None:
            expected = len(self.expected_labels)
            if len(predictions) < expected:
                raise RuntimeError(f"evaluation returned {len(predictions)} rows for {expected} examples.")
            predictions, labels = predictions[:expected], labels[:expected]
            for row, (got, want) in enumerate(zip(labels, self.expected_labels, strict=True)):
                # Seq2SeqTrainer pads labels with -100 or the pad id, which no real target contains.
                if got[(got != -100) & (got != self.tokenizer.pad_token_id)].tolist() != want:
                    raise RuntimeError(f"evaluation row {row} is not example {row}: rows were duplicated or reordered.")
        self.hypotheses = decode(self.tokenizer, predictions)
        references = self.references if self.references is not None else decode(self.tokenizer, labels)
        return {**score_with(self.metrics, self.hypotheses, list(references)), "samples": len(self.hypotheses)}
