"""The seam every task sits behind, as fairseq's `tasks/`: what a task learns and how its data, model, metric,
decoding, card and server differ. The recipe, the CLI, preparation, the cache, the Hub card and the server ask the
task they are given (`vaswani_hf.tasks.task_named`, `task_of`); none of them tests a task's name.

A new task is one module beside `translation.py` and `parsing.py` that subclasses `Task`, and one line in
`vaswani_hf/tasks/__init__.py`'s registry (docs/layout.md, "A new task")."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from transformers import PreTrainedModel, PreTrainedTokenizerBase

Pairs = list[tuple[str, str]]


class Task:
    """A task's answers to what shared code asks. The defaults are translation's (a text to a text)."""

    name: ClassVar[str]  # the --task value
    summary: ClassVar[str]  # one line for `vaswani train --help`
    output_dir: ClassVar[str] = "vaswani-model"  # `vaswani train`'s default --output_dir
    # the --eval_split of a user's data (a built-in data set's defaults say their own)
    eval_split: ClassVar[str] = "val"
    # a target's space-separated symbols are vocabulary entries whole (a parser's tree symbols), not BPE'd
    whole_target_words: ClassVar[bool] = False
    # the model card's and Hub's tag, and the metrics the card names
    hub_tag: ClassVar[str] = "translation"
    hub_metrics: ClassVar[tuple[str, ...]] = ("bleu", "chrf")
    card_metric_description: ClassVar[str] = "Cased, detokenized corpus BLEU and chrF (sacreBLEU)"
    card_names_data: ClassVar[bool] = False  # the card's first line names the data set, not the run's description
    card_decodes_trees: ClassVar[bool] = False  # the card says how the output becomes a tree (the template's text)
    serves_pairs: ClassVar[bool] = True  # `vaswani serve` routes requests to it by source and target (a parser: no)

    # --- which models are this task's ----------------------------------------------------------------------------
    def owns(self, config) -> bool:
        """Whether a saved model's config is this task's (the registry's default task owns the rest)."""
        return False

    # --- training: options, data, vocabulary, model --------------------------------------------------------------
    def train_defaults(self, builtin: bool, device: str, preset_given: bool = False) -> dict[str, Any]:
        """`vaswani train`'s defaults where the paper's WMT-sized ones do not fit: the built-in data set's, or a
        user's data on this `device` kind ("cpu", "cuda", ...); `preset_given`: the user chose a --preset."""
        return {}

    def check_options(self, data_args) -> None:
        """Fix or refuse options that do not fit the task (called when the options are parsed)."""

    def read_data(self, data_args, eval_splits: list[str] | None = None) -> None:
        """Turn a user's data folder into sentence pairs where the task's files are no pairs (once, cached)."""

    def after_prepare(self, data_args, folder) -> None:
        """What `vaswani prepare` leaves beside the prepared data for training to find (a parser's labels)."""

    def train_hint(self, data_args) -> str:
        """The options `vaswani prepare` tells the user to train the prepared folder with."""
        return f"--src {data_args.src} --tgt {data_args.tgt}"

    def builtin_pairs(self, data_args) -> dict[str, Pairs]:
        """The built-in data set's splits as pairs in memory."""
        raise NotImplementedError

    def vocabulary_texts(self, train: Pairs) -> tuple[Iterable[str], set[str]]:
        """The texts a shared BPE is learned from, and the symbols kept whole."""
        return (text for pair in train for text in pair), set()

    def describe(self, data_args, builtin: bool) -> str:
        """What the run learns, for the first log line and the card."""
        raise NotImplementedError

    def prepare_model(self, model: PreTrainedModel, data_args, fine_tuning: bool) -> None:
        """Mark a new (or fine-tuned) model as the task's: its config and decoding defaults."""

    def check_lengths(self, data_args) -> None:
        """Refuse, before training, data the model cannot learn whole (the task decides what is too long)."""

    # --- evaluation ---------------------------------------------------------------------------------------------
    def metrics(self, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, data_args):
        """`compute_metrics` for Seq2SeqTrainer, with `expect(dataset)`, `names` and `hypotheses`."""
        raise NotImplementedError

    def batch_processors(
        self, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, data_args
    ) -> Callable | None:
        """A function of a batch's source ids giving its logits processors during evaluation, or None."""
        return None

    def headline(self, metrics: dict, split: str) -> str:
        """The figure `vaswani train` ends with ("BLEU 27.3 on test, ")."""
        return ""

    def evaluate_options(self, parser) -> None:
        """Options `vaswani evaluate` takes for this task's models."""

    def evaluate(self, args, model, tokenizer, precision, decoding: dict) -> int | None:
        """`vaswani evaluate` of the task's model; None hands it to the shared BLEU evaluation."""
        return None

    # --- the model card ------------------------------------------------------------------------------------------
    def card_use(self, data_args, builtin: bool, train_pairs: int) -> tuple[str, str, str]:
        """(data set name, intended use, limitations) for the model card."""
        raise NotImplementedError

    def card_doing(self, src: str | None, tgt: str | None) -> str:
        """What the model does, for the card's first line ("translating en to de")."""
        return f"translating {src} to {tgt}"

    def card_languages(self, src: str | None, tgt: str | None) -> list[str]:
        return [x for x in (src, tgt) if x]

    # --- serving ---------------------------------------------------------------------------------------------------
    def serving(self, args, model_dir: str) -> tuple[Callable, Callable | None, tuple[str, str]]:
        """What `vaswani serve` (its parsed options `args`) serves the task's model in `model_dir` with: its routers
        (a function `(catalog, run, check_key) -> [APIRouter]`, `create_app`'s), its batch function (`Service`'s;
        None: translating) and its languages."""
        raise NotImplementedError
