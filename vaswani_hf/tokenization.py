"""Section 5.1: one BPE vocabulary shared by source and target, trained with `tokenizers`.

Special tokens sit at the ids `VaswaniConfig` expects (<pad>=0, <s>=1, </s>=2, <unk>=3), so Trainer's habit of
copying the tokenizer's ids into the model config changes nothing. The Metaspace pre-tokenizer and decoder make
decoding give back the text exactly (spaces included).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]


def train_shared_bpe(texts: Iterable[str], vocab_size: int = 37000, model_max_length: int = 1024):
    """Train a BPE vocabulary on source and target text together; returns a `PreTrainedTokenizerFast` that
    appends </s> to every sequence and saves beside the model (`AutoTokenizer` reloads it)."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    eos = tokenizer.token_to_id("</s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=model_max_length,
    )
