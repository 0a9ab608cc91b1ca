"""The paper's training recipe (section 5) on Seq2SeqTrainer, with BLEU during and after training (section 6),
and the `vaswani train` job around it (tokenizer, output folder, summary, model card)."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets import Dataset
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerBase,
    TrainerState,
    set_seed,
)
from transformers.trainer_utils import TrainOutput

from ..data.preparation import DEFAULT_BPE_SAMPLE, prepare, say
from ..data.prepared import InMemoryData, PreparedData, TokenizedData, list_lengths, token_lengths
from ..data.prepared_cache import PreparationRequest, cache_dir, load_tokenizer, tokenizer_hash
from ..data.readers import Pairs, load_split
from ..data.tokenization import BPEDropoutPairs, train_shared_bpe
from ..interop.hub import write_training_card
from ..model.configuration_vaswani import PAPER_ALIASES, VaswaniConfig
from ..model.modeling_vaswani import VaswaniForConditionalGeneration
from ..tasks import TASKS, Task, task_named
from ..thread_counts import this_thread_on
from ..translation.inference import load_model
from ..translation.metrics import TranslationMetrics, load_metrics
from .averaging import average_checkpoints, last_checkpoints, list_checkpoints, load_weights
from .stopping import GracefulStopCallback, WallClockCallback
from .trainer import VaswaniTrainer, VaswaniTrainingArguments, resumable_checkpoint
from .training_speed import speedups_for_training, training_threads, uncompiled

logger = logging.getLogger(__name__)

PRESETS = ("base", "big", "small", "tiny", "parse")
__all__ = ["TranslationMetrics"]  # moved to vaswani_hf.translation.metrics; kept importable from here


@dataclass
class DataArguments:
    data: str | None = field(
        default=None,
        metadata={"help": "folder of {split}.{src} + {split}.{tgt}, {split}.tsv or {split}.jsonl files (prepared "
                  "once into the cache), or a folder written by `vaswani prepare`; none (and no --dataset_name) = "
                  "the built-in number-words task"},
    )  # fmt: skip
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "reuse a vocabulary instead of training BPE: a folder holding tokenizer.json (a trained "
                  "model's, or a prepared folder's tokenizer/) or the file itself"},
    )  # fmt: skip
    bpe_sample_lines: int = field(
        default=DEFAULT_BPE_SAMPLE,
        metadata={"help": "learn the BPE vocabulary from this many training pairs drawn at random (seed 0), as Marian "
                  "and SentencePiece sample (docs/decisions.md); 0: from every pair"},
    )  # fmt: skip
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "processes that tokenize the data (default: one per core)"}
    )
    dataset_name: str | None = field(default=None, metadata={"help": "a `datasets` dataset instead, e.g. wmt14"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "its config, e.g. de-en"})
    src: str = field(default="en", metadata={"help": "source language suffix"})
    tgt: str = field(default="de", metadata={"help": "target language suffix"})
    train_split: str = field(default="train")
    eval_split: str = field(
        default="val", metadata={"help": "evaluated with beam search at the end (BLEU, chrF); none: no evaluation"}
    )
    vocab_size: int = field(default=37000, metadata={"help": "shared BPE vocabulary size (paper: 37,000)"})
    split_punctuation: bool = field(
        default=True,
        metadata={"help": "make punctuation marks BPE pre-tokens of their own, as tensor2tensor and Moses tokenizing "
                  "did for the paper (--no_split_punctuation: split at spaces only, as vaswani-hf did before "
                  "November 2026)"},
    )  # fmt: skip
    bpe_dropout: float = field(
        default=0.0,
        metadata={"help": "BPE-dropout (Provilkov et al., 2020): resegment each training pair whenever it is drawn, "
                  "skipping each merge with this probability (0.1 in their paper; 0 = off); evaluation and the "
                  "saved tokenizer are unaffected"},
    )  # fmt: skip
    max_length: int = field(
        default=256, metadata={"help": "training pairs with a side longer than this many tokens are dropped"}
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "evaluate on the first N pairs only"})
    task: str = field(
        default="translate",
        metadata={"help": "; ".join(task.summary for task in TASKS.values())},
    )
    linearization: str = field(
        default="tags",
        metadata={"help": "parse: the target form, tags (`S NP DT NN /NP ...`, tensor2tensor's) or xx (every "
                  "part-of-speech tag written XX, as Vinyals et al. 2015)"},
    )  # fmt: skip
    tree_search: str = field(
        default="constrained",
        metadata={"help": "parse: how evaluation decodes, constrained (the search keeps to trees of the sentence) "
                  "or plain (section 6.3's search, outputs repaired); as `vaswani parse --tree_search`"},
    )  # fmt: skip
    metric: list[str] = field(
        default_factory=list,
        metadata={"help": "a metric reported beside BLEU and chrF (repeatable): a packaged name (bleu, chrf), a local "
                  "🤗 Evaluate module (a folder holding NAME.py, or the .py file), or a Hub id when online"},
    )  # fmt: skip

    def __post_init__(self) -> None:
        self.run_task: Task = task_named(self.task)
        if self.tree_search not in ("constrained", "plain"):
            raise ValueError(f"--tree_search {self.tree_search}: choose constrained or plain.")
        self.treebank: dict | None = None  # a parse task's labels, once its treebank is read (`read_data`)
        self.run_task.check_options(self)

    def read_data(self, eval_splits: list[str] | None = None) -> None:
        """The task's reading of --data where its files are no sentence pairs (a treebank's trees)."""
        self.run_task.read_data(self, eval_splits)

    def request(self, tokenizer: str | None = None) -> PreparationRequest:
        """What `prepare` reads, with the options that change the prepared data."""
        self.read_data()
        if self.bpe_sample_lines < 0:
            raise ValueError(f"--bpe_sample_lines must be a number of pairs (0: every pair), got "
                             f"{self.bpe_sample_lines}.")  # fmt: skip
        hub = self.dataset_name is not None
        return PreparationRequest(self.dataset_name if hub else self.data, self.src, self.tgt, hub,
                                  self.dataset_config_name, self.vocab_size, self.split_punctuation,
                                  self.bpe_sample_lines or None, tokenizer or self.tokenizer, self.max_length,
                                  self.train_split, whole_target_words=self.run_task.whole_target_words)  # fmt: skip

    def load(self, split: str) -> Pairs:
        """A small split as pairs in memory; an evaluation split keeps every pair (it is scored whole)."""
        hub = self.dataset_name is not None
        return load_split(self.dataset_name if hub else self.data, split, self.src, self.tgt,
                          self.dataset_config_name, hub=hub, keep_empty=split != self.train_split)  # fmt: skip


@dataclass
class ModelArguments:
    preset: str = field(default="base", metadata={"help": f"model size when training from scratch: {PRESETS}"})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "fine-tune this checkpoint, keeping its tokenizer and config"}
    )
    dropout: float | None = field(default=None, metadata={"help": "residual dropout P_drop (default: the preset's)"})
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "override preset fields when training from scratch, as in Transformers' example scripts: "
                  "'N=2,d_model=128,d_ff=512,h=4' (config field names or the paper's symbols N, h, d_ff, d_k, "
                  "P_drop)"},
    )  # fmt: skip
    lr_scale: float = field(default=1.0, metadata={"help": "multiplies the Noam learning rate"})
    attn_implementation: str | None = field(
        default=None,
        metadata={"help": "attention kernel, as from_pretrained's: eager, sdpa (the default where torch has it), "
                  "flash_attention_2/3 where that package is installed (CUDA, bf16)"},
    )  # fmt: skip


def tokenize_pairs(
    pairs: Pairs, tokenizer: PreTrainedTokenizerBase, max_length: int | None = None, keep_text: bool = False
) -> Dataset:
    """Encode pairs (no truncation) as `prepare` does, with their lengths and their index in `pairs` (column
    `pair`); with `max_length`, drop and count the longer pairs. With `keep_text`, an evaluation set: never
    filtered, in the given order, with its references as written (`target_text`)."""
    data = InMemoryData({"pairs": pairs}, tokenizer, "pairs", None if keep_text else max_length)
    return evaluation_set(data, "pairs") if keep_text else data.tokens("pairs")


def card_example(data: TokenizedData, split: str, max_length: int | None) -> str:
    """The model card's example, whose translation and attention maps are drawn after training: the split's first
    source that is not empty and fits `max_length` tokens (EOS included), found from the token lengths, so that no
    other line is read; where none fits, the first source cut to `max_length` tokens. A line of a megabyte drawn
    whole would ask generate() and eager attention for hours and terabytes after the whole training."""
    sources = token_lengths(data.tokens(split))[0]
    limit = max_length or int(sources.max(initial=1))
    fitting = np.flatnonzero((sources > 1) & (sources <= limit))
    if len(fitting):
        return data.pairs(split)[int(fitting[0])][0]
    tokenizer = data.tokenizer()
    ids = data.tokens(split)[0]["input_ids"]
    return tokenizer.decode(ids[: max(limit - 1, 0)], skip_special_tokens=True)


def evaluation_set(data: TokenizedData, split: str, max_samples: int | None = None, by_length: bool = False,
                   max_length: int | None = None) -> Dataset:  # fmt: skip
    """A split's first `max_samples` pairs, tokenized, with each reference and source as written (`target_text`,
    `source_text`, over whose words a parse model's trees are built, and `row`, its place in the split): BLEU is
    scored against the references as written, not as the vocabulary can spell them. Evaluation sets are never
    filtered (dropping test sentences would change the BLEU). `by_length`: longest source first, for less padding
    in generation (BLEU does not depend on the order). `max_length`: a side longer than this many tokens is cut to
    it (its first tokens and </s>), counted and said: a line of a megabyte would otherwise ask the attention for
    terabytes at the final evaluation, after the whole training."""
    tokens = data.tokens(split).data.table
    tokens = tokens.slice(0, len(tokens) if max_samples is None else max_samples)
    text = data.text(split).data.table.slice(0, len(tokens))  # evaluation splits are never filtered: row for row
    count = len(tokens)
    if max_length:
        cut = {name: truncated(tokens.column(name), max_length) for name in ("input_ids", "labels")}
        longer = np.flatnonzero(cut["input_ids"][1] | cut["labels"][1])
        if len(longer):
            for name, (column, _) in cut.items():
                tokens = tokens.set_column(tokens.schema.get_field_index(name), name, column)
            logger.warning("%s: %d of %d evaluation pairs have a side longer than %d tokens, the first on line %d: "
                           "cut to %d tokens for the model; their references are scored whole, as written", split,
                           len(longer), count, max_length, text.column("line")[int(longer[0])].as_py(),
                           max_length)  # fmt: skip
    order = np.arange(count)
    if by_length:
        order = np.argsort(-pc.utf8_length(text.column("source")).to_numpy(), kind="stable")
    tokens = tokens.take(order).append_column("target_text", text.column("target").take(order))
    tokens = tokens.append_column("source_text", text.column("source").take(order))
    return Dataset(tokens.append_column("row", pa.array(order)))  # the example's row in the split (its gold tree)


def truncated(column: pa.ChunkedArray, limit: int) -> tuple[pa.Array, np.ndarray]:
    """Each list of ids cut to `limit` (its first `limit - 1` ids and its last, </s>), in numpy over the Arrow
    values; and which lists were cut."""
    lengths = list_lengths(column)
    cut = lengths > limit
    if not cut.any():
        return column, cut
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    place, length = np.arange(len(values)) - starts, np.repeat(lengths, lengths)
    kept = values[(place < limit - 1) | (place == length - 1)]
    offsets = np.concatenate([[0], np.cumsum(np.minimum(lengths, limit))]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(kept)).cast(column.type), cut


def evaluation_length(model: VaswaniForConditionalGeneration, max_length: int | None) -> int:
    """The longest side an evaluation pair may have: --max_length, as training pairs (the model's positions where
    none is given, or where its learned positions are fewer)."""
    positions = model.config.max_position_embeddings
    limit = max_length or positions
    return min(limit, positions) if model.config.position_embedding_type == "learned" else limit


def build_model(
    model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments | None = None
) -> VaswaniForConditionalGeneration:
    """A new model of the preset (or the checkpoint to fine-tune), made the task's (a parser of its labels)."""
    if model_args.model_name_or_path:
        model = load_model(model_args.model_name_or_path)
    else:
        special = {"pad_token_id": "<pad>", "bos_token_id": "<s>", "eos_token_id": "</s>", "unk_token_id": "<unk>"}
        ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in special.items()}
        model = VaswaniForConditionalGeneration(model_config(model_args, vocab_size=len(tokenizer), **ids))
    if data_args is not None:
        data_args.run_task.prepare_model(model, data_args, fine_tuning=bool(model_args.model_name_or_path))
    if model_args.attn_implementation:
        set_attention_kernel(model, model_args.attn_implementation)
    return model


def set_attention_kernel(model: VaswaniForConditionalGeneration, name: str) -> None:
    """`model.set_attn_implementation(name)`, with a missing kernel package reported as bad input (Transformers
    raises ImportError for it) rather than a traceback."""
    try:
        model.set_attn_implementation(name)
    except ImportError as err:
        raise ValueError(f"--attn_implementation {name}: {err} Install it, or use sdpa (the default).") from err


def model_config(model_args: ModelArguments, **fields) -> VaswaniConfig:
    """The preset with --dropout and --config_overrides applied over `fields`; a bad preset, an unknown field name
    or an invalid value raises here."""
    if model_args.preset not in PRESETS:
        raise ValueError(f"--preset must be one of {PRESETS}, got {model_args.preset!r}.")
    if model_args.dropout is not None:
        fields["dropout"] = model_args.dropout
    overrides = parse_overrides(model_args.config_overrides)
    unknown = sorted(set(overrides) - set(VaswaniConfig().to_dict()) - set(PAPER_ALIASES))
    if unknown:
        raise ValueError(f"--config_overrides: {', '.join(unknown)} is not a VaswaniConfig field or paper symbol "
                         f"({', '.join(PAPER_ALIASES)}).")  # fmt: skip
    return getattr(VaswaniConfig, model_args.preset)(**fields, **overrides)


def parse_overrides(text: str | None) -> dict:
    """'N=2,d_model=128,P_drop=0.3,position_embedding_type=learned' -> typed keyword arguments."""
    overrides = {}
    for item in filter(None, (text or "").split(",")):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--config_overrides: {item!r} is not NAME=VALUE (e.g. 'N=2,d_model=128').")
        try:
            overrides[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[name.strip()] = value.strip()  # a string such as `learned` or `pre`
    return overrides


def build_trainer(
    data: TokenizedData | dict[str, Pairs],
    data_args: DataArguments,
    model_args: ModelArguments,
    training_args: VaswaniTrainingArguments,
    tokenizer: PreTrainedTokenizerBase,
    callbacks: list | None = None,
) -> VaswaniTrainer:
    """The paper's recipe on Seq2SeqTrainer: model (new or fine-tuned), token-budget batches, Noam schedule,
    label smoothing, BLEU `compute_metrics` on the evaluation split when there is one. `data`: prepared data
    (`vaswani_hf.data.preparation`), or pairs in memory by split, tokenized here."""
    if isinstance(data, dict):
        data = InMemoryData(data, tokenizer, data_args.train_split, data_args.max_length)
    set_seed(training_args.seed)
    model = build_model(model_args, tokenizer, data_args)
    train_set = data.tokens(data_args.train_split)
    # Batches are packed by the deterministic segmentation's lengths: with BPE-dropout a batch holds the same
    # pairs, spelled in about 14% more tokens at 0.1 (Multi30k).
    train_lengths = token_lengths(train_set)
    planned = training_args.max_steps if training_args.max_steps > 0 else None
    training_args.speedups_choice = speedups_for_training(
        training_args.speedups,
        model,
        training_args.device,
        training_args.max_tokens,
        train_lengths,
        planned,
        training_args.precision_choice.name,
        sharded=training_args.sharded,
        compile_shapes=training_args.compile_shapes,
    )
    if data_args.bpe_dropout:
        train_set = BPEDropoutPairs(data.pairs(data_args.train_split), tokenizer, data_args.bpe_dropout)
    eval_set = None
    if data_args.eval_split in data.splits:
        eval_set = evaluation_set(data, data_args.eval_split, data_args.max_eval_samples, by_length=True,
                                  max_length=evaluation_length(model, data_args.max_length))  # fmt: skip
    trainer = VaswaniTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        compute_metrics=data_args.run_task.metrics(tokenizer, model, data_args) if eval_set is not None else None,
        train_lengths=train_lengths,
        callbacks=callbacks,
        lr_scale=model_args.lr_scale,
    )
    trainer.batch_processors = data_args.run_task.batch_processors(tokenizer, model, data_args)
    return trainer


def checkpoint_step(checkpoint: str | Path) -> int:
    return json.loads((Path(checkpoint) / "trainer_state.json").read_text())["global_step"]


def train(trainer: VaswaniTrainer, resume: bool = False) -> dict:
    """Train (with `resume`, from the newest checkpoint that loads whole), average the last `average_last` checkpoints
    when asked, save model + tokenizer to `output_dir`. Returns steps, time, throughput, loss."""
    args = trainer.args
    checkpoint = resumable_checkpoint(args.output_dir) if resume else None
    if resume and checkpoint is None:
        logger.warning("--resume: no checkpoint in %s yet, starting from scratch", args.output_dir)
    if checkpoint is not None and 0 < args.max_steps <= checkpoint_step(checkpoint):
        # A run stopped after its last checkpoint and before its end: Trainer would take one step more before it
        # looks at max_steps, so the checkpoint's weights and state are taken as they are.
        trainer._load_from_checkpoint(checkpoint)
        trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        result = TrainOutput(trainer.state.global_step, losses[-1] if losses else float("nan"), {"train_runtime": 0.0})
    else:
        result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.check_finite()  # the updates since the last check: a non-finite loss must not reach the saved model
    tokens = trainer.accelerator.reduce(torch.as_tensor(trainer.target_tokens_seen).to(args.device), "sum")
    trainer.save_model(args.output_dir)
    trainer.save_state()  # trainer_state.json: the log history (loss, BLEU, elapsed_s) for curves
    averaged = []
    interrupted = any(getattr(cb, "signal", None) is not None for cb in trainer.callback_handler.callbacks)
    if args.average_last and not interrupted:
        averaged = last_checkpoints(args.output_dir, args.average_last, "--average_last")
        if args.should_save and averaged:
            average_checkpoints(averaged, args.output_dir)
        trainer.accelerator.wait_for_everyone()
        if averaged:
            trainer.model.load_state_dict(load_weights(args.output_dir), strict=False)
    seconds = result.metrics["train_runtime"]
    return {"steps": result.global_step, "seconds": round(seconds, 1), "world_size": args.world_size,
            "target_tokens_per_s": round(int(tokens) / max(seconds, 1e-9)),
            "train_loss": round(result.training_loss, 4) if np.isfinite(result.training_loss) else None,
            "resumed_from": checkpoint, "averaged": [p.name for p in averaged],
            "precision": str(args.precision_choice), "speedups": str(trainer.speedups),
            **peak_accelerator_memory(args.device)}  # fmt: skip


def peak_accelerator_memory(device: torch.device) -> dict:
    """The peak GPU memory the run allocated, for the summary (CPU memory is the benchmarks' business)."""
    if device.type != "cuda":
        return {}
    return {"peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)}


def load_or_train_tokenizer(
    data_args: DataArguments, model_args: ModelArguments, training_args: VaswaniTrainingArguments, pairs: dict
) -> PreTrainedTokenizerBase:
    """For pairs in memory: the checkpoint's tokenizer when fine-tuning, --tokenizer when given; otherwise a shared
    BPE trained once (by the main process, the others load it) and kept in output_dir, where --resume finds it."""
    if model_args.model_name_or_path or data_args.tokenizer:
        return load_tokenizer(data_args.tokenizer or model_args.model_name_or_path)
    output_dir = Path(training_args.output_dir)
    with training_args.main_process_first(desc="shared BPE vocabulary"):
        saved = (output_dir / "tokenizer.json").is_file()
        if (training_args.resume and saved) or not training_args.should_save:
            return AutoTokenizer.from_pretrained(output_dir)
        texts, whole = data_args.run_task.vocabulary_texts(pairs[data_args.train_split])
        tokenizer = train_shared_bpe(texts, data_args.vocab_size, split_punctuation=data_args.split_punctuation,
                                     whole_words=whole)  # fmt: skip
        tokenizer.save_pretrained(output_dir)
        return tokenizer


def resumed_vocabulary(data_args: DataArguments, training_args: VaswaniTrainingArguments) -> str | None:
    """On --resume, the vocabulary the run began with (its output_dir's tokenizer), so that the run goes on with
    it; None when the cache's preparation under the BPE options holds that very vocabulary (then it is reused)."""
    saved = Path(training_args.output_dir)
    if not (training_args.resume and (saved / "tokenizer.json").is_file()):
        return None
    cached = cache_dir() / data_args.request().key()[0]
    same = PreparedData.is_prepared(cached) and tokenizer_hash(cached / "tokenizer") == tokenizer_hash(saved)
    return None if same else str(saved)


def training_data(data_args: DataArguments, model_args: ModelArguments, training_args: VaswaniTrainingArguments,
                  builtin: bool) -> tuple[TokenizedData, PreTrainedTokenizerBase]:  # fmt: skip
    """The run's data and vocabulary (section 5.1), saved beside the model:
    - the built-in task: its pairs in memory, and a BPE vocabulary trained on them;
    - a folder written by `vaswani prepare`: its vocabulary and splits, memory-mapped;
    - raw data (a folder or a Hub dataset): its training split and the evaluation split prepared once into the
      cache (`vaswani_hf.data.preparation`) by the first process to take the lock while the others wait on it (a file
      lock, not a collective that a distributed run could time out), then memory-mapped by all; a rerun, --resume
      or another run with the same data and vocabulary options finds it there.
    Fine-tuning keeps the checkpoint's vocabulary; one without a fast tokenizer reads its pairs into memory."""
    quiet = not training_args.should_log
    checkpoint_vocabulary = model_args.model_name_or_path
    data_args.read_data()
    data_args.run_task.check_lengths(data_args)
    if checkpoint_vocabulary and not AutoTokenizer.from_pretrained(checkpoint_vocabulary).is_fast:
        builtin = True  # a slow (Python) tokenizer cannot run in the preparing processes
    if builtin:
        own = data_args.data is None and data_args.dataset_name is None
        pairs = data_args.run_task.builtin_pairs(data_args) if own else {
            split: data_args.load(split) for split in (data_args.train_split, data_args.eval_split)}  # fmt: skip
        tokenizer = load_or_train_tokenizer(data_args, model_args, training_args, pairs)
        return InMemoryData(pairs, tokenizer, data_args.train_split, data_args.max_length), tokenizer
    if PreparedData.is_prepared(data_args.data):
        data = PreparedData(data_args.data)
        if (data.manifest["src"], data.manifest["tgt"]) != (data_args.src, data_args.tgt):
            raise ValueError(f"{data.path} holds {data.manifest['src']}->{data.manifest['tgt']} data, not "
                             f"{data_args.src}->{data_args.tgt}: check --src/--tgt.")  # fmt: skip
        given = data_args.tokenizer or checkpoint_vocabulary
        if given and tokenizer_hash(given) != tokenizer_hash(data.path / "tokenizer"):
            raise ValueError(f"{data.path} was tokenized with another vocabulary than {given}'s: prepare the data "
                             f"with --tokenizer {given}.")  # fmt: skip
        if stale := data.stale_files():
            logger.warning("%s was prepared from files that have changed since: %s. Prepare again to train on "
                           "them as they are now.", data.path, ", ".join(stale))  # fmt: skip
        say(f"data: the prepared data in {data.path}: {data.describe()}", quiet)
    else:
        vocabulary = data_args.tokenizer or checkpoint_vocabulary or resumed_vocabulary(data_args, training_args)
        evaluated = [] if data_args.eval_split == "none" else [data_args.eval_split]
        request = data_args.request(vocabulary)
        if evaluated and evaluated[0] not in request.available_splits():
            raise ValueError(f"--eval_split {evaluated[0]}: the data holds no such split (it has "
                             f"{', '.join(request.available_splits())}); name one of them, or none to train without "
                             "it.")  # fmt: skip
        data = prepare(request, workers=data_args.preprocessing_num_workers, quiet=quiet, eval_splits=evaluated)
    tokenizer = data.tokenizer()
    if training_args.should_save:
        tokenizer.save_pretrained(training_args.output_dir)
    return data, tokenizer


def prepare_output_dir(training_args: VaswaniTrainingArguments) -> None:
    """An output_dir holding an earlier run's checkpoints is continued (--resume) or cleared
    (--overwrite_output_dir), never silently mixed with a new run."""
    output_dir = Path(training_args.output_dir)
    if output_dir.is_dir() and list_checkpoints(output_dir) and not training_args.resume:
        if not training_args.overwrite_output_dir:
            raise ValueError(f"{output_dir} holds checkpoints of an earlier run: continue it with --resume, or "
                             "start over with --overwrite_output_dir or another --output_dir.")  # fmt: skip
        if training_args.should_save:
            shutil.rmtree(output_dir)


def finished_at(training_args: VaswaniTrainingArguments) -> int | None:
    """The step at which the run in output_dir ended, when it reached the steps (or epochs) asked for now; None
    when it did not end, or ended short of them (stopped by a signal or --max_train_minutes)."""
    try:
        state = json.loads((Path(training_args.output_dir) / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    if training_args.max_steps > 0:
        goal = training_args.max_steps
    elif state.get("num_train_epochs") == training_args.num_train_epochs:
        goal = state.get("max_steps", 0)
    else:
        return None
    return state["global_step"] if goal and state.get("global_step", 0) >= goal else None


def run_training(
    data_args: DataArguments, model_args: ModelArguments, training_args: VaswaniTrainingArguments, builtin: bool
) -> int:
    """`vaswani train`: train on the data (or the built-in task), evaluate the final model with beam search,
    write its model card, print the summary. Returns the exit status (128 + signal when stopped by one). The run
    may run the calling thread on fewer threads (`training_threads`); it gets its own count back after."""
    with contextlib.ExitStack() as threads:
        return _run_training(data_args, model_args, training_args, builtin, threads)


def _run_training(data_args: DataArguments, model_args: ModelArguments, training_args: VaswaniTrainingArguments,
                  builtin: bool, threads_until_the_end: contextlib.ExitStack) -> int:  # fmt: skip
    if not model_args.model_name_or_path:
        model_config(model_args)  # a bad --preset or --config_overrides fails now, not after the data and the BPE
    if model_args.attn_implementation:  # and so does a kernel that is not installed
        set_attention_kernel(VaswaniForConditionalGeneration(VaswaniConfig.tiny()), model_args.attn_implementation)
    load_metrics(data_args.metric)  # and a metric that does not load or fails on a toy pair
    prepare_output_dir(training_args)
    output_dir = Path(training_args.output_dir)
    if training_args.resume and (finished := finished_at(training_args)) is not None:
        if training_args.process_index == 0:  # a requeued job that already ended must not train on, nor replace
            print(f"--resume: the run in {output_dir} already finished at step {finished}; nothing to train, the "
                  "model there is unchanged. Raise --max_steps (or --num_train_epochs) to train further.")  # fmt: skip
        return 0
    task = data_args.run_task.describe(data_args, builtin)
    data, tokenizer = training_data(data_args, model_args, training_args, builtin)
    if data_args.eval_split not in (*data.splits, "none"):  # a misspelt split must not skip the evaluation quietly
        raise ValueError(f"--eval_split {data_args.eval_split}: the data holds no such split (it has "
                         f"{', '.join(data.splits)}); name one of them, or none to train without it.")  # fmt: skip
    stop = GracefulStopCallback(status=lambda: trainer.compile_watch and trainer.compile_watch.status)
    trainer = build_trainer(data, data_args, model_args, training_args, tokenizer,
                            callbacks=[stop, WallClockCallback(training_args.max_train_minutes)])  # fmt: skip
    count, why = training_threads(getattr(trainer.model.config, "d_model", None), training_args.device)
    threads_until_the_end.enter_context(this_thread_on(count))
    threads = f"{count} ({why})"
    main = trainer.is_world_process_zero()
    if main:
        print(f"task: {task}; {len(trainer.train_dataset)} training pairs; world size {training_args.world_size}; "
              f"precision {training_args.precision_choice}; speed-ups {trainer.speedups}; threads {threads}",
              flush=True)  # fmt: skip
    stats = train(trainer, resume=training_args.resume)
    if stop.signal is not None:
        if main:
            print(f"stopped by {signal.Signals(stop.signal).name} at step {stats['steps']}: checkpoint saved in "
                  f"{output_dir}; continue with the same command and --resume", file=sys.stderr)  # fmt: skip
        return 128 + stop.signal
    metrics = {}
    if trainer.eval_dataset is not None:
        prefix = data_args.eval_split
        result = trainer.predict(trainer.eval_dataset, metric_key_prefix=prefix)
        names = trainer.compute_metrics.names
        metrics = {k.removeprefix(f"{prefix}_"): v for k, v in result.metrics.items()
                   if k.removeprefix(f"{prefix}_").startswith(names) or k.endswith(("_loss", "_samples"))}  # fmt: skip
        if main:
            (output_dir / f"{prefix}.hyp").write_text("\n".join(trainer.compute_metrics.hypotheses) + "\n")
    if main:
        try:
            shown = data_args.eval_split if data_args.eval_split in data.splits else data_args.train_split
            example = card_example(data, shown, data_args.max_length)
            with uncompiled(trainer.model):  # the card's example and attention maps have shapes of their own
                write_training_card(trainer, data_args, stats, metrics, example, builtin, task)
        except Exception as err:  # the trained model matters more than its card: say so, keep going
            logger.warning("the model card could not be written (%s: %s); the model is saved", type(err).__name__, err)
        summary = {**stats, "threads": threads, "eval_split": data_args.eval_split, **metrics,
                   "model_dir": str(output_dir)}  # fmt: skip
        print(json.dumps(summary))
        headline = data_args.run_task.headline(metrics, data_args.eval_split)
        print(f"{headline}{stats['steps']} steps ({stats['seconds']:.0f} s, {stats['target_tokens_per_s']} target "
              f"tokens/s); model saved in {output_dir}")  # fmt: skip
    return 0
