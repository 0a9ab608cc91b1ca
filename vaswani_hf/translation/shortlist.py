"""A vocabulary shortlist (Marian's lexical shortlist, CTranslate2's vmap): for each batch, the output layer scores
only the target tokens likely for its source tokens plus the most frequent ones, instead of the whole vocabulary.

The tied output projection of the base model is about as many multiply-adds per generated token as all six decoder
layers together (37,000 x 512 against 6 x (4 x 512 x 512 + 2 x 512 x 2048)), so scoring 2,000-5,000 rows instead
of 37,000 saves most of it. The search cannot produce a token outside the shortlist (`DecodingState.restrict` in
search_vaswani.py: the search runs on the shortlist's columns, or gives the other tokens -inf).

    shortlist = build_shortlist(tokenizer, pairs)   # once, from the training data (`vaswani shortlist`)
    shortlist.save(model_dir)                        # shortlist.safetensors beside the model
    model.generate(**batch, vocabulary_shortlist=Shortlist.load(model_dir, tokenizer).allowed(batch["input_ids"]))
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerBase

FILE_NAME = "shortlist.safetensors"


def vocabulary_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of the tokenizer's token -> id map: a shortlist is only valid for the vocabulary it was built with."""
    vocabulary = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return hashlib.sha256(vocabulary.encode()).hexdigest()[:16]


@dataclass
class Shortlist:
    """`candidates[s]`: the target ids most associated with source id s (-1 padded); `frequent`: the most frequent
    target ids, always allowed; `fingerprint`: the vocabulary it was built for."""

    candidates: torch.LongTensor
    frequent: torch.LongTensor
    fingerprint: str

    def allowed(self, input_ids: torch.LongTensor) -> torch.LongTensor:
        """The sorted target ids a batch may produce: its source tokens' candidates and the frequent tokens
        (`generate()` adds the tokens its settings force: EOS, prefixes, constraints)."""
        rows = self.candidates[input_ids.flatten().cpu().clamp(0, self.candidates.shape[0] - 1)].flatten()
        return torch.unique(torch.cat([rows[rows >= 0], self.frequent]))

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / FILE_NAME
        save_file({"candidates": self.candidates.contiguous(), "frequent": self.frequent.contiguous()}, str(path),
                  metadata={"fingerprint": self.fingerprint})  # fmt: skip
        return path

    @classmethod
    def load(cls, path: str | Path, tokenizer: PreTrainedTokenizerBase) -> Shortlist:
        """A saved shortlist (a file, or a model folder holding `shortlist.safetensors`), checked against the
        tokenizer it will be used with."""
        path = Path(path)
        if path.is_dir():
            path = path / FILE_NAME
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no shortlist there; build one with `vaswani shortlist MODEL --data DIR`.")
        with safe_open(str(path), "pt") as handle:
            fingerprint = (handle.metadata() or {}).get("fingerprint")
        tensors = load_file(str(path))
        if fingerprint != vocabulary_fingerprint(tokenizer):
            raise ValueError(f"{path} was built for another vocabulary than this model's tokenizer: build it again "
                             "with `vaswani shortlist MODEL --data DIR` for this model.")  # fmt: skip
        return cls(tensors["candidates"], tensors["frequent"], fingerprint)


def build_shortlist(tokenizer: PreTrainedTokenizerBase, pairs: Sequence[tuple[str, str]], per_source: int = 50,
                    frequent: int = 500) -> Shortlist:  # fmt: skip
    """From parallel sentences: for every source token, the `per_source` target tokens with the highest Dice
    association 2 c(s, t) / (c(s) + c(t)) over sentence co-occurrence counts (tokens counted once per sentence),
    and the `frequent` most frequent target tokens."""
    size = len(tokenizer)
    sources = tokenizer([s for s, _ in pairs], add_special_tokens=False)["input_ids"]
    targets = tokenizer([t for _, t in pairs], add_special_tokens=False)["input_ids"]
    source_count, target_count = torch.zeros(size), torch.zeros(size)
    keys, counts = torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    chunk: list[torch.Tensor] = []
    for index, (source, target) in enumerate(zip(sources, targets, strict=True)):
        s, t = torch.tensor(sorted(set(source)), dtype=torch.long), torch.tensor(sorted(set(target)), dtype=torch.long)
        source_count[s] += 1
        target_count[t] += 1
        chunk.append((s[:, None] * size + t[None, :]).flatten())
        if len(chunk) == 2000 or index == len(pairs) - 1:  # merge as we go: memory stays at the distinct pairs
            merged, merged_counts = (
                torch.cat([keys, *chunk]),
                torch.cat([counts, torch.ones(sum(map(len, chunk)), dtype=torch.long)]),
            )
            keys, inverse = torch.unique(merged, return_inverse=True)
            counts = torch.zeros_like(keys).index_add_(0, inverse, merged_counts)
            chunk = []
    s, t = keys // size, keys % size
    dice = 2 * counts / (source_count[s] + target_count[t])
    order = torch.argsort(-dice, stable=True)
    order = order[torch.argsort(s[order], stable=True)]  # by source, best association first
    s, t = s[order], t[order]
    starts = torch.searchsorted(s, torch.arange(size))
    rank = torch.arange(len(s)) - starts[s]
    keep = rank < per_source
    candidates = torch.full((size, per_source), -1, dtype=torch.long)
    candidates[s[keep], rank[keep]] = t[keep]
    most_frequent = torch.argsort(target_count, descending=True)[:frequent]
    return Shortlist(candidates, most_frequent[target_count[most_frequent] > 0], vocabulary_fingerprint(tokenizer))
