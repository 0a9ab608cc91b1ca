"""Translation (sections 5 and 6.1): a text to a text, BLEU and chrF, LibreTranslate's API. The default task: a
model no other task owns is a translation model."""

from __future__ import annotations

from pathlib import Path

from ..data.number_words import builtin_splits
from ..translation.metrics import TranslationMetrics
from .base import Pairs, Task

# Settings of the built-in task where it departs from the paper's WMT-sized defaults (small data, 2 CPU cores): the
# small preset at d_model 128 / d_ff 512 reached BLEU 98 at step 800 and 100 at 1,200 (200 test sentences), in
# 176 s for 1,600 steps on 2 cores limited to AVX2, where d_model 256 was at 85 after 800 steps.
BUILTIN_DEFAULTS = {"vocab_size": 500, "preset": "small", "config_overrides": "d_model=128,d_ff=512",
                    "warmup_steps": 400, "max_steps": 1200, "lr_scale": 0.5, "eval_split": "test", "max_tokens": 0,
                    "save_strategy": "no"}  # fmt: skip


class TranslationTask(Task):
    name = "translate"
    summary = "translate: --data holds parallel text (without it, the built-in number-words task)"

    def train_defaults(self, builtin: bool, device: str, preset_given: bool = False) -> dict:
        return dict(BUILTIN_DEFAULTS) if builtin else {}

    def builtin_pairs(self, data_args) -> dict[str, Pairs]:
        return builtin_splits()

    def describe(self, data_args, builtin: bool) -> str:
        if builtin:
            return "built-in English->German number words"
        return f"{data_args.dataset_name or data_args.data} ({data_args.src}->{data_args.tgt})"

    def metrics(self, tokenizer, model, data_args) -> TranslationMetrics:
        return TranslationMetrics(tokenizer, data_args.metric)

    def headline(self, metrics: dict, split: str) -> str:
        return f"BLEU {metrics['bleu']} on {split}, " if "bleu" in metrics else ""

    def card_use(self, data_args, builtin: bool, train_pairs: int) -> tuple[str, str, str]:
        if builtin:
            return (
                "built-in English-German number words",
                "A demonstration that the recipe learns: English number words below 1000 (up to four per sentence) "
                "into German number words, which needs reordering (twenty-one -> einundzwanzig).",
                "it knows nothing but number words; any other input gets meaningless output.",
            )
        name = data_args.dataset_name or Path(data_args.data).name
        use = (
            f"Research and education: the paper's model and recipe reproduced on {name}, {data_args.src} to "
            f"{data_args.tgt}. Evaluate it on your own domain before relying on it."
        )
        limits = (f"trained only on {train_pairs:,} sentence pairs of {name}; sentence-level, no document context; "
                  "text unlike the training data (domain, length, characters outside the BPE vocabulary) gets worse "
                  "and sometimes fluent but wrong output.")  # fmt: skip
        return name, use, limits

    def serving(self, args, model_dir: str) -> tuple:
        from ..serving.app import translation_routers
        from ..serving.service import model_languages

        return translation_routers, None, model_languages(model_dir, args.source, args.target)
