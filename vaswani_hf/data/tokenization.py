"""Section 5.1: one BPE vocabulary shared by source and target, trained with `tokenizers`.

Special tokens sit at the ids `VaswaniConfig` expects (<pad>=0, <s>=1, </s>=2, <unk>=3), so Trainer's habit of
copying the tokenizer's ids into the model config changes nothing. The Metaspace pre-tokenizer and decoder make
decoding give back the text exactly (spaces included).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]


def train_shared_bpe(
    texts: Iterable[str],
    vocab_size: int = 37000,
    model_max_length: int = 1024,
    split_punctuation: bool = True,
    whole_words: Iterable[str] = (),
) -> PreTrainedTokenizerFast:
    """Train a BPE vocabulary on source and target text together; returns a `PreTrainedTokenizerFast` that
    appends </s> to every sequence and saves beside the model (`AutoTokenizer` reloads it).

    `split_punctuation` makes every punctuation mark a pre-token of its own, as the paper's subword pipeline did
    (tensor2tensor splits text wherever alphanumeric and other characters meet; Moses-tokenized text does the
    same), so "Gitarre," and "Gitarre" share one entry instead of spending the vocabulary on word+mark pairs: on
    Multi30k, 1,136 of 8,000 entries without it. Decoding stays exact, since no space is added.

    `whole_words` (a parser's tree symbols: `NP`, `/NP`, `PRP$`, `-LRB-`) become entries of their own, added after
    the `vocab_size` learned ones, and a word written with spaces around it is always that one entry, never split
    by BPE (the model looks a pre-token up whole before merging). Punctuation inside such words must stay in the
    word: give `split_punctuation=False` with them."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    words = pre_tokenizers.Metaspace()
    punctuation = pre_tokenizers.Punctuation("isolated")
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([words, punctuation]) if split_punctuation else words
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if whole_words := sorted(set(whole_words)):
        if split_punctuation:
            raise ValueError("whole words need split_punctuation=False: the pre-tokenizer would split them.")
        tokenizer = with_whole_words(tokenizer, whole_words)
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


def with_whole_words(tokenizer: Tokenizer, words: list[str]) -> Tokenizer:
    """`tokenizer` with each of `words` (as a pre-token: "▁NP") an entry of its own, looked up before merging."""
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for word in words:
        vocab.setdefault("\u2581" + word, len(vocab))
    spec["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(spec))


class BPEDropoutPairs(Dataset):
    """BPE-dropout (Provilkov et al., 2020): each time a training pair is drawn, both sides are segmented anew with
    every BPE merge skipped with probability `dropout`, so the model sees a word spelled in several ways. A
    regulariser for small data; evaluation and the saved tokenizer keep the deterministic segmentation.

    The sampling is tokenizers' own and cannot be seeded: runs with it are not bit-reproducible, and a resumed
    run draws other segmentations than the interrupted one would have."""

    def __init__(self, pairs: Sequence[tuple[str, str]], tokenizer: PreTrainedTokenizerBase, dropout: float) -> None:
        if not 0.0 < dropout < 1.0:
            raise ValueError(f"--bpe_dropout={dropout}: a merge-skipping probability must lie in (0, 1); 0.1 is the "
                             "value of Provilkov et al. (2020), 0 turns it off.")  # fmt: skip
        backend = getattr(tokenizer, "backend_tokenizer", None)
        kind = type(backend.model).__name__ if backend is not None else type(tokenizer).__name__
        if kind != "BPE":
            raise ValueError(f"--bpe_dropout needs a BPE tokenizer, but this one is {kind}: drop --bpe_dropout, or "
                             "train from scratch, which builds a BPE vocabulary.")  # fmt: skip
        self.pairs = pairs
        self.tokenizer = Tokenizer.from_str(backend.to_str())  # a copy: the saved tokenizer keeps its merges
        self.tokenizer.model.dropout = dropout

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        source, target = (self.tokenizer.encode(text).ids for text in self.pairs[index])
        return {"input_ids": source, "attention_mask": [1] * len(source), "labels": target}
