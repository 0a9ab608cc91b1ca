"""What the translating commands do with each input line before the model sees it, so that no text is invented or
dropped without a word: an empty line (or one of spaces only) is never sent to the model and gives an empty line;
a line longer than the model reads is cut with a warning (the default, as in Marian and CTranslate2), stops the
run, or is split at sentence ends and its translations rejoined, as the user chose (`LONG_LINES`).

`generate()` and `pipeline()` keep Transformers' behaviour: the tokenizer cuts at `model_max_length` only when
asked (`truncation=True`), and a longer input reaches the model (see docs/translator-features.md).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger("vaswani")

LONG_LINES = ("cut", "split", "error")
SCORE_LONG_LINES = ("error", "skip")  # scoring never cuts: a cut sentence's score is not the sentence's
# a sentence ends at . ! ? (or their fullwidth forms) followed by white space
SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")


@dataclass
class LineReport:
    """What happened to the lines of one run, for its summary."""

    lines: int = 0
    empty: int = 0
    cut: list[int] = field(default_factory=list)  # line numbers
    split: list[int] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{self.lines} lines", f"{self.empty} empty (left empty)"]
        parts += [f"{len(self.cut)} cut to the model's length", f"{len(self.split)} split at sentence ends"]
        return "translated " + ", ".join(parts)


def source_limit(model, tokenizer: PreTrainedTokenizerBase) -> int:
    """The most source tokens (EOS included) the model reads: the tokenizer's `model_max_length`, and a learned
    position table's size (sinusoids extend to any length, so the tokenizer's limit is the one that holds)."""
    limits = [tokenizer.model_max_length] if 0 < tokenizer.model_max_length < 10**9 else []
    config = getattr(model, "config", None)
    if getattr(config, "position_embedding_type", None) == "learned":
        limits.append(config.max_position_embeddings)
    return min(limits, default=10**9)


def too_long(count: int, limit: int) -> str:
    """How translate and score say a side longer than the model reads (its tokens with EOS, and the limit)."""
    return f"has {count} tokens, more than the {limit} the model reads"


def long_pairs(tokenizer: PreTrainedTokenizerBase, sources: list[str], targets: list[str], limit: int) -> dict:
    """The pairs with a side over `limit` tokens (as `pieces_of` counts them, EOS included): {index: what is too
    long, e.g. "the target has 2000 tokens, more than the 1024 the model reads"}."""
    if not sources:  # a tokenizer given no text fails
        return {}
    counts = [[len(ids) for ids in tokenizer(**{key: list(texts)}, truncation=False, verbose=False)["input_ids"]]
              for key, texts in (("text", sources), ("text_target", targets))]  # fmt: skip
    return {index: " and ".join(f"the {side} {too_long(count, limit)}"
                                for side, count in zip(("source", "target"), pair, strict=True) if count > limit)
            for index, pair in enumerate(zip(*counts, strict=True)) if max(pair) > limit}  # fmt: skip


def pieces_of(lines: list[str], tokenizer: PreTrainedTokenizerBase, limit: int, long_lines: str = "cut",
              first_line: int = 1, report: LineReport | None = None) -> list[list[str]]:  # fmt: skip
    """Each line as the texts to translate for it: none for an empty line, itself, or (`long_lines="split"`) its
    sentences packed into pieces of at most `limit` tokens. A line over the limit is reported by its number
    (`first_line` numbers the first) and token count: a warning when cut or split, an error with "error"."""
    if long_lines not in LONG_LINES:
        raise ValueError(f"long lines: choose one of {', '.join(LONG_LINES)}, not {long_lines!r}.")
    report = report if report is not None else LineReport()
    counts = [len(ids) for ids in tokenizer(list(lines), truncation=False, verbose=False)["input_ids"]]
    result = []
    for number, (line, count) in enumerate(zip(lines, counts, strict=True), first_line):
        report.lines += 1
        if not line.strip():
            report.empty += 1
            result.append([])
        elif count <= limit:
            result.append([line])
        elif long_lines == "error":
            raise ValueError(f"line {number} {too_long(count, limit)}: shorten it, or translate with --long-lines cut "
                             "(the default) or --long-lines split.")  # fmt: skip
        elif long_lines == "split":
            pieces = _packed(SENTENCE_END.split(line.strip()), tokenizer, limit)
            report.split.append(number)
            cut = sum(1 for piece in pieces if _tokens(tokenizer, piece) > limit)
            logger.warning("line %d %s: split into %d pieces at sentence ends%s", number, too_long(count, limit),
                           len(pieces),
                           f", {cut} of them still too long and cut" if cut else "")  # fmt: skip
            result.append(pieces)
        else:
            report.cut.append(number)
            logger.warning("line %d %s: only its first %d are translated (--long-lines split translates it all)",
                           number, too_long(count, limit), limit)  # fmt: skip
            result.append([line])
    return result


def _tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    return len(tokenizer(text, truncation=False, verbose=False)["input_ids"])


def _packed(sentences: list[str], tokenizer: PreTrainedTokenizerBase, limit: int) -> list[str]:
    """Consecutive sentences joined into as few pieces as fit `limit` tokens each (a sentence longer than the limit
    is a piece of its own, cut when translated)."""
    pieces: list[str] = []
    for sentence in sentences:
        if pieces and _tokens(tokenizer, f"{pieces[-1]} {sentence}") <= limit:
            pieces[-1] = f"{pieces[-1]} {sentence}"
        else:
            pieces.append(sentence)
    return pieces


def rejoined(pieces: list[str], candidates: list[list[tuple]], nbest: int, alignments: bool) -> list[tuple]:
    """A line's n-best from its `pieces`' n-best lists (each best first): the k-th candidate joins every piece's
    k-th (or its last, where a piece has fewer), texts with a space, scores summed, alignments shifted by the words
    of the pieces before it. One piece: its own list. No piece (an empty line): one empty candidate, score None."""
    if not pieces:
        return [("", None, "")] if alignments else [("", None)]
    if len(pieces) == 1:
        return candidates[0]
    result = []
    for k in range(min(nbest, max(len(c) for c in candidates))):
        chosen = [c[min(k, len(c) - 1)] for c in candidates]
        scores = [item[1] for item in chosen]
        text = " ".join(item[0] for item in chosen if item[0])
        total = None if any(score is None for score in scores) else sum(scores)
        result.append((text, total, _joined_alignments(pieces, chosen)) if alignments else (text, total))
    return result


def _joined_alignments(pieces: list[str], chosen: list[tuple]) -> str:
    """Moses "i-j" pairs of the pieces, each shifted by the source and target words of the pieces before it."""
    pairs, source_offset, target_offset = [], 0, 0
    for piece, (text, _, alignment) in zip(pieces, chosen, strict=True):
        for link in alignment.split():
            i, j = link.split("-")
            pairs.append(f"{int(i) + source_offset}-{int(j) + target_offset}")
        source_offset += len(piece.split())
        target_offset += len(text.split())
    return " ".join(pairs)


def batch_indices(lengths: list[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Indices of the inputs in batches, longest first (less padding): at most `batch_size` inputs and, with
    `max_tokens`, at most that many padded tokens (inputs x the longest; a longer input goes alone). Callers put
    the results back in order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, start = [], 0
    while start < len(order):
        size = min(batch_size, len(order) - start)
        if max_tokens is not None:  # the first of a batch is its longest
            size = max(1, min(size, max_tokens // max(lengths[order[start]], 1)))
        batches.append(order[start : start + size])
        start += size
    return batches
