"""The paper's training recipe (section 5) and evaluation (section 6) on Seq2SeqTrainer."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import sacrebleu
import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from .configuration_vaswani import VaswaniConfig
from .modeling_vaswani import VaswaniForConditionalGeneration

PRESETS = ("base", "big", "small", "tiny")


def noam_learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Section 5.3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


@dataclass
class DataArguments:
    data: str | None = field(
        default=None, metadata={"help": "folder of {split}.{lang} files; none = the built-in number-words task"}
    )
    src: str = field(default="en", metadata={"help": "source language suffix"})
    tgt: str = field(default="de", metadata={"help": "target language suffix"})
    train_split: str = field(default="train")
    eval_split: str = field(default="val")
    vocab_size: int = field(default=37000, metadata={"help": "shared BPE vocabulary size (paper: 37,000)"})
    max_source_tokens: int = field(default=256, metadata={"help": "training pairs are truncated to this length"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "evaluate on the first N pairs only"})


@dataclass
class ModelArguments:
    preset: str = field(default="base", metadata={"help": f"model size when training from scratch: {PRESETS}"})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "fine-tune this checkpoint, keeping its tokenizer and config"}
    )
    label_smoothing: float = field(default=0.1, metadata={"help": "paper: 0.1"})
    lr_scale: float = field(default=1.0, metadata={"help": "multiplies the Noam learning rate"})


@dataclass
class VaswaniTrainingArguments(Seq2SeqTrainingArguments):
    """Seq2SeqTrainingArguments with the paper's optimisation as defaults (section 5.3): Adam(0.9, 0.98, 1e-9),
    warmup 4000 then inverse square root decay, no gradient clipping. `learning_rate` 0 (default) means the
    Noam peak d_model^-0.5 * warmup^-0.5 (times --lr_scale)."""

    output_dir: str | None = field(default="vaswani-model")
    learning_rate: float = field(default=0.0)
    lr_scheduler_type: str = field(default="inverse_sqrt")
    warmup_steps: float = field(default=4000)
    adam_beta1: float = field(default=0.9)
    adam_beta2: float = field(default=0.98)
    adam_epsilon: float = field(default=1e-9)
    weight_decay: float = field(default=0.0)
    max_grad_norm: float = field(default=0.0)
    per_device_train_batch_size: int = field(default=64)
    per_device_eval_batch_size: int = field(default=64)
    logging_steps: float = field(default=50)
    save_strategy: str = field(default="no")


def tokenize_pairs(pairs: list[tuple[str, str]], tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> Dataset:
    sources, targets = zip(*pairs, strict=True) if pairs else ((), ())
    encoded = tokenizer(list(sources), text_target=list(targets), truncation=True, max_length=max_tokens)
    return Dataset.from_dict({k: encoded[k] for k in ("input_ids", "attention_mask", "labels")})


def build_model(model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase) -> VaswaniForConditionalGeneration:
    if model_args.model_name_or_path:
        return AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path)
    if model_args.preset not in PRESETS:
        raise ValueError(f"--preset must be one of {PRESETS}, got {model_args.preset!r}.")
    special = {"pad_token_id": "<pad>", "bos_token_id": "<s>", "eos_token_id": "</s>", "unk_token_id": "<unk>"}
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in special.items()}
    config = getattr(VaswaniConfig, model_args.preset)(
        vocab_size=len(tokenizer), label_smoothing=model_args.label_smoothing, **ids
    )
    return VaswaniForConditionalGeneration(config)


def train(
    pairs: dict[str, list[tuple[str, str]]],
    data_args: DataArguments,
    model_args: ModelArguments,
    training_args: VaswaniTrainingArguments,
    tokenizer: PreTrainedTokenizerBase,
) -> tuple[VaswaniForConditionalGeneration, dict]:
    """Train on `pairs["train"]` with the paper's recipe, save model + tokenizer to `output_dir`."""
    model = build_model(model_args, tokenizer)
    model.config.label_smoothing = model_args.label_smoothing
    if not training_args.learning_rate:
        training_args.learning_rate = noam_learning_rate(
            int(training_args.warmup_steps), model.config.d_model, int(training_args.warmup_steps), model_args.lr_scale
        )
    train_set = tokenize_pairs(pairs["train"], tokenizer, data_args.max_source_tokens)
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
    )
    start = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(training_args.output_dir)
    mean_target_length = sum(len(x) for x in train_set["labels"]) / max(len(train_set), 1)
    pairs_seen = (
        result.global_step
        * training_args.per_device_train_batch_size
        * (training_args.gradient_accumulation_steps * training_args.world_size)
    )
    target_tokens = mean_target_length * min(pairs_seen, len(train_set) * training_args.num_train_epochs)
    if training_args.max_steps > 0:
        target_tokens = mean_target_length * pairs_seen
    return model, {"steps": result.global_step, "seconds": seconds, "target_tokens_per_s": target_tokens / seconds,
                   "train_loss": result.training_loss}  # fmt: skip


def translate(
    model: VaswaniForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    batch_size: int = 32,
    progress: bool = True,
    **generate_kwargs,
) -> list[str]:
    """Batched translation with the model's generation defaults (paper: beam 4, GNMT alpha 0.6, source + 50).

    Sentences are decoded longest first (less padding) and returned in input order."""
    model.eval()
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    outputs: list[str] = [""] * len(sentences)
    for start in tqdm(range(0, len(order), batch_size), desc="translating", disable=not progress, unit="batch"):
        index = order[start : start + batch_size]
        batch = tokenizer([sentences[i] for i in index], return_tensors="pt", padding=True, truncation=True)
        with torch.no_grad():
            generated = model.generate(**batch.to(model.device), **generate_kwargs)
        for i, text in zip(index, tokenizer.batch_decode(generated, skip_special_tokens=True), strict=True):
            outputs[i] = text.strip()
    return outputs


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Cased, detokenized corpus BLEU and chrF with sacrebleu (section 6.1), with their signatures."""
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "brevity_penalty": round(bleu_score.bp, 3),
    }


def load_for_inference(model_dir: str | Path):
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json). Train one with `vaswani train`.")
    model = AutoModelForSeq2SeqLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer
