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

Where the search tells it how many tokens each row may still generate (`TreeConstraint.search_rows`), it also
keeps every hypothesis finishable within that budget: an opening only while the tags left, the closings of what
is open, the new constituent's closing and the end still fit; so at the length limit a sentence gets a tree of
all its words, not an output cut short. Where even a flat tree of tags cannot fit (a limit shorter than the
words), the tags and closings that fit are allowed and the last step ends the sentence (`to_tree` attaches the
words left); a row is never left without a candidate.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import LogitsProcessor, PreTrainedTokenizerBase

from .linearization import CLOSE, UNKNOWN_TAG

OTHER, OPEN, CLOSING, TAG = 0, 1, 2, 3


class TreeConstraint(LogitsProcessor):
    """Masks the symbols that would make a hypothesis no tree of its sentence (`words[example]` words); see the
    module's text. `kinds[id]` says what each vocabulary entry is, `closing[id]` the closing symbol of an opening
    label.

    `__call__(input_ids, scores)` is a standard logits processor, so Transformers' own generation loop (sampling,
    repetition_penalty, ...) runs it too; there the rows are every example's beams side by side, as that loop
    keeps them. This package's search declares more before each call (`reads_row_examples`, `search_rows`):
    finished sentences leave its batch, so a row's index no longer names its sentence, and each row's limit
    lets the constraint close the tree in time."""

    reads_row_examples = True  # the search calls `search_rows` before each call

    def __init__(self, kinds: torch.Tensor, closing: torch.Tensor, eos: int, words: torch.Tensor) -> None:
        self.kinds, self.closing, self.eos, self.words = kinds, closing, eos, words
        self.on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.rows: tuple[torch.Tensor | None, torch.Tensor | None] | None = None

    def search_rows(self, examples: torch.Tensor | None, remaining: torch.Tensor | None) -> None:
        """For the next call only: the example each row decodes, and how many tokens each row may still generate,
        this step's included (1: this step is its last). Kept for one call, so that the same processor given
        later to Transformers' loop, which calls nothing first, does not read another search's rows."""
        self.rows = (examples, remaining)

    def tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tables on the search's device, moved once: a copy a step, and a read-back a step for the rows,
        would make every step of a GPU search wait on the host."""
        if device not in self.on_device:
            self.on_device[device] = (self.kinds.to(device), self.closing.to(device), self.words.to(device))
        return self.on_device[device]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        (row_examples, remaining), self.rows = self.rows or (None, None), None
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
        if remaining is not None:
            # the fewest tokens that finish the tree: a tag for each word left, a closing for each open
            # constituent (an empty innermost one gets the next tag), the end. A tag or a closing takes one of
            # them and one step; an opening adds its closing: it needs two more steps than that to spare
            needed = (words - written).clamp(min=0) + depth.clamp(min=0) + 1
            nesting &= needed + 2 <= remaining.to(device)
        allowed |= room[:, None] & (kinds == TAG)[None, :]
        allowed |= nesting[:, None] & (kinds == OPEN)[None, :]
        # each row may close its innermost constituent once it holds a word (a gather and scatter, not the rows'
        # indices, which a GPU would have to send back to the host)
        close = closing[label][:, None]
        allowed.scatter_(1, close, allowed.gather(1, close) | (has_open & holds_word)[:, None])
        allowed[:, self.eos] = (written == words) & (depth == 0)
        if remaining is not None:
            # the row's last step ends it: a finished tree ends here anyway, an unfinished one (a limit shorter
            # than the words) is mended by `to_tree`, where masking the end would leave the row nothing
            last = remaining.to(device) <= 1
            allowed &= ~last[:, None]
            allowed[:, self.eos] |= last
        allowed[:, self.eos] |= ~allowed.any(1)  # a row of a finished sentence: never all masked
        return scores.masked_fill(~allowed, float("-inf"))


def tree_constraint_factory(
    tokenizer: PreTrainedTokenizerBase, parsing: dict
) -> Callable[[torch.Tensor], list[LogitsProcessor]]:
    """For a parse model's tokenizer and labels (`config.parsing`): a function of a batch's source ids giving the
    batch's `TreeConstraint` (its sentences' word counts: the source tokens that begin a word).

    Raises ValueError when the tokenizer lacks tree symbols as entries of their own (a translation checkpoint's
    vocabulary): the constraint could never allow them, and with none at all every sentence would just end."""
    vocabulary = tokenizer.get_vocab()
    tags = [UNKNOWN_TAG] if parsing.get("form") == "xx" else list(parsing["tags"])
    needed = [symbol for label in parsing["phrase_labels"] for symbol in (label, CLOSE + label)] + tags
    missing = [symbol for symbol in needed if "\u2581" + symbol not in vocabulary]
    if missing:
        shown = ", ".join(map(repr, missing[:6])) + (", ..." if len(missing) > 6 else "")
        raise ValueError(
            f"the tokenizer lacks {len(missing)} of the {len(needed)} tree symbols of this parser as entries of their "
            f"own ({shown}): the tree-constrained search could never write them. Train the parser with its own "
            "vocabulary (`vaswani train --task parse` without --tokenizer), which holds every symbol whole, or "
            "give a tokenizer that holds each phrase label, its closing symbol (/NP) and each tag as one entry."
        )
    size = max(vocabulary.values()) + 1
    kinds = torch.full((size,), OTHER, dtype=torch.int8)
    closing = torch.zeros(size, dtype=torch.long)
    for label in parsing["phrase_labels"]:
        opening, closed = vocabulary["\u2581" + label], vocabulary["\u2581" + CLOSE + label]
        kinds[opening], kinds[closed], closing[opening] = OPEN, CLOSING, closed
    for tag in tags:
        kinds[vocabulary["\u2581" + tag]] = TAG
    starts = torch.zeros(size, dtype=torch.bool)
    special = set(tokenizer.all_special_ids)
    for token, index in vocabulary.items():
        starts[index] = token.startswith("\u2581") and index not in special

    def processors(input_ids: torch.Tensor) -> list[LogitsProcessor]:
        words = starts.to(input_ids.device)[input_ids].sum(1)
        return [TreeConstraint(kinds, closing, tokenizer.eos_token_id, words)]

    return processors
