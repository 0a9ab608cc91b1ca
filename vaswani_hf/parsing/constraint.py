"""A parser's search kept to trees of the sentence (an option beside section 6.3's plain beam search): at each step a
hypothesis may only take a symbol after which it can still become a tree over exactly the sentence's words.

- a tag while fewer tags than words were written; an opening label too (it will hold one of the words left), up
  to two constituents a word and five more;
- the closing symbol of the innermost open constituent only, once that constituent holds a word;
- the end of the sentence only when every word has its tag and every constituent is closed;
- nothing else (the vocabulary's word pieces are no tree symbols).

So the search ranks only well-formed trees of the right length, where the plain search may let a hypothesis that
skipped a word or closed the wrong label win (measured: docs/parsing.md). The state of a hypothesis is read from
its prefix at each step with tensor operations (tags so far, depth, the innermost open label), so beams may be
reordered freely.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import LogitsProcessor, PreTrainedTokenizerBase

from .linearization import CLOSE

OTHER, OPEN, CLOSING, TAG = 0, 1, 2, 3


class TreeConstraint(LogitsProcessor):
    """Masks the symbols that would make a hypothesis no tree of its sentence (`words[example]` words); see the
    module's text. `kinds[id]` says what each vocabulary entry is, `closing[id]` the closing symbol of an opening
    label. The search tells it which example each row decodes (`row_examples`): finished sentences leave the
    batch."""

    reads_row_examples = True

    def __init__(self, kinds: torch.Tensor, closing: torch.Tensor, eos: int, words: torch.Tensor) -> None:
        self.kinds, self.closing, self.eos, self.words = kinds, closing, eos, words
        self.on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tables on the search's device, moved once: a copy a step, and a read-back a step for the rows,
        would make every step of a GPU search wait on the host."""
        if device not in self.on_device:
            self.on_device[device] = (self.kinds.to(device), self.closing.to(device), self.words.to(device))
        return self.on_device[device]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor,
                 row_examples: torch.Tensor | None = None) -> torch.FloatTensor:  # fmt: skip
        rows, device = input_ids.shape[0], input_ids.device
        kinds, closing, words = self.tables(device)
        if row_examples is None:  # every example still in the batch, its beams side by side
            row_examples = torch.arange(words.shape[0], device=device).repeat_interleave(rows // words.shape[0])
        words = words[row_examples.to(device)]
        if kinds.shape[0] < scores.shape[1]:  # entries past the tokenizer's (a resized model's): no tree symbols
            kinds = torch.cat([kinds, kinds.new_full((scores.shape[1] - kinds.shape[0],), OTHER)])
        # after the decoder's start symbol; a column of padding in front keeps the first step's tensors non-empty
        ids = torch.nn.functional.pad(input_ids[:, 1:], (1, 0), value=self.eos)
        kind = kinds[ids]
        kind[:, 0] = OTHER
        opens, tags = kind == OPEN, kind == TAG
        depth_after = (opens.long() - (kind == CLOSING).long()).cumsum(1)
        tags_after = tags.long().cumsum(1)
        depth, written = depth_after[:, -1], tags_after[:, -1]
        # the innermost open constituent: the last opening after which the depth is still the depth now
        innermost = opens & (depth_after == depth[:, None])
        position = (innermost.long() * torch.arange(ids.shape[1], device=ids.device)).argmax(1, keepdim=True)
        has_open = innermost.any(1) & (depth > 0)
        label = ids.gather(1, position).squeeze(1)
        holds_word = written > tags_after.gather(1, position).squeeze(1)

        allowed = torch.zeros_like(scores, dtype=torch.bool)
        room = written < words
        # at most 2 constituents a word and 5 more (treebanks have about one): an untrained model that keeps
        # opening would otherwise run to the length limit
        nesting = room & (opens.sum(1) < 2 * words + 5)
        allowed |= room[:, None] & (kinds == TAG)[None, :]
        allowed |= nesting[:, None] & (kinds == OPEN)[None, :]
        # each row may close its innermost constituent once it holds a word (a gather and scatter, not the rows'
        # indices, which a GPU would have to send back to the host)
        close = closing[label][:, None]
        allowed.scatter_(1, close, allowed.gather(1, close) | (has_open & holds_word)[:, None])
        allowed[:, self.eos] = (written == words) & (depth == 0)
        allowed[:, self.eos] |= ~allowed.any(1)  # a row past its limit or of a finished sentence: never all masked
        return scores.masked_fill(~allowed, float("-inf"))


def tree_constraint_factory(
    tokenizer: PreTrainedTokenizerBase, parsing: dict
) -> Callable[[torch.Tensor], list[LogitsProcessor]]:
    """For a parse model's tokenizer and labels (`config.parsing`): a function of a batch's source ids giving the
    batch's `TreeConstraint` (its sentences' word counts: the source tokens that begin a word)."""
    vocabulary = tokenizer.get_vocab()
    size = max(vocabulary.values()) + 1
    kinds = torch.full((size,), OTHER, dtype=torch.int8)
    closing = torch.zeros(size, dtype=torch.long)
    for label in parsing["phrase_labels"]:
        opening, closed = vocabulary.get("\u2581" + label), vocabulary.get("\u2581" + CLOSE + label)
        if opening is not None and closed is not None:
            kinds[opening], kinds[closed], closing[opening] = OPEN, CLOSING, closed
    for tag in ["XX"] if parsing.get("form") == "xx" else parsing["tags"]:
        if (index := vocabulary.get("\u2581" + tag)) is not None:
            kinds[index] = TAG
    starts = torch.zeros(size, dtype=torch.bool)
    special = set(tokenizer.all_special_ids)
    for token, index in vocabulary.items():
        starts[index] = token.startswith("\u2581") and index not in special

    def processors(input_ids: torch.Tensor) -> list[LogitsProcessor]:
        words = starts.to(input_ids.device)[input_ids].sum(1)
        return [TreeConstraint(kinds, closing, tokenizer.eos_token_id, words)]

    return processors
