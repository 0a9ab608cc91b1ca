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
from typing import NamedTuple

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
    lets the constraint close the tree in time.

    It keeps static shapes and reads nothing on the host (`static_shapes`), so the static-shape search
    (`speed.graph_search`, a CUDA graph on a GPU) runs it inside its captured step. That search hands it a static
    view: `input_ids` is the whole fixed-length buffer of each row's tokens, the positions not yet written holding
    the search's fill token (EOS or padding: a symbol of kind OTHER, which changes none of the counts below), the
    rows' examples are fixed (finished sentences stay in that batch) and the tokens left are a device tensor. A
    kept graph decodes a later batch of the same shape with the processor it was captured with: `refill` takes the
    later batch's values into that one's tensors."""

    reads_row_examples = True  # the search calls `search_rows` before each call
    static_shapes = True  # a captured search step may run it (speed.graph_search.fits)

    def __init__(self, kinds: torch.Tensor, closing: torch.Tensor, eos: int, words: torch.Tensor) -> None:
        self.kinds, self.closing, self.eos, self.words = kinds, closing, eos, words
        self.on_device: dict[torch.device, Tables] = {}
        self.rows: tuple[torch.Tensor | None, torch.Tensor | None] | None = None

    def search_rows(self, examples: torch.Tensor | None, remaining: torch.Tensor | None) -> None:
        """For the next call only: the example each row decodes, and how many tokens each row may still generate,
        this step's included (1: this step is its last). Kept for one call, so that the same processor given
        later to Transformers' loop, which calls nothing first, does not read another search's rows."""
        self.rows = (examples, remaining)

    def tables(self, device: torch.device) -> Tables:
        """The tables on the search's device, made once: a copy a step, and a read-back a step for the rows,
        would make every step of a GPU search wait on the host. This processor's own (also on the CPU), since
        `refill` writes into them and the factory shares `kinds` and `closing` between batches."""
        if device not in self.on_device:
            self.on_device[device] = Tables.of(self.kinds, self.closing, self.eos, self.words, device)
        return self.on_device[device]

    def static_key(self) -> tuple:
        """What a captured step of this processor reads as constants (`speed.graph_search.GraphKey`)."""
        symbols = int((self.kinds != OTHER).sum())
        return type(self).__qualname__, tuple(self.kinds.shape), symbols, tuple(self.words.shape), self.eos

    def refill(self, other: TreeConstraint) -> None:
        """Take `other`'s tables and word counts (a later batch of the same `static_key`) into this processor's
        tensors, in place: a kept graph reads the addresses it was captured with."""
        self.kinds, self.closing, self.words = other.kinds, other.closing, other.words
        for device, kept in self.on_device.items():
            for mine, theirs in zip(kept, other.tables(device), strict=True):
                mine.copy_(theirs)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        (row_examples, remaining), self.rows = self.rows or (None, None), None
        rows, device = input_ids.shape[0], input_ids.device
        tables = self.tables(device)
        words = tables.words
        if row_examples is None:  # every example still in the batch, its beams side by side
            row_examples = torch.arange(words.shape[0], device=device).repeat_interleave(rows // words.shape[0])
        state = prefix_state(tables.kinds, input_ids)
        return allowed_only(scores, state, tables, words[row_examples.to(device)],
                            None if remaining is None else remaining.to(device))  # fmt: skip


class Tables(NamedTuple):
    """A constraint's tables on one device: each vocabulary entry's kind, an opening's closing symbol, each
    example's words; the tree symbols and the end (`symbols`, sorted), their kinds with one more column of kind 4
    (`symbol_kinds`: that column takes the scatter of a row with nothing to close), each entry's index among them
    (`symbol_of`: one past the last for an entry that is none), the entries that are none (`other`), the end's
    index among the symbols (`end`, a tensor: a captured step reads it from memory) and whether the vocabulary
    has an opening label and a tag at all (`present`). Derived once, not at every step."""

    kinds: torch.Tensor
    closing: torch.Tensor
    words: torch.Tensor
    symbols: torch.Tensor
    symbol_kinds: torch.Tensor
    symbol_of: torch.Tensor
    other: torch.Tensor
    end: torch.Tensor
    present: torch.Tensor

    @classmethod
    def of(cls, kinds: torch.Tensor, closing: torch.Tensor, eos: int, words: torch.Tensor, device) -> Tables:
        other = kinds == OTHER
        other[eos] = False
        symbols = (~other).nonzero().flatten()
        symbol_of = torch.full(kinds.shape, symbols.numel(), dtype=torch.long)
        symbol_of[symbols] = torch.arange(symbols.numel())
        symbol_kinds = torch.nn.functional.pad(kinds[symbols].long(), (0, 1), value=4)
        present = torch.stack([(symbol_kinds == kind).any() for kind in (OPEN, TAG)])
        tables = (kinds, closing, words, symbols, symbol_kinds, symbol_of, other, symbol_of[eos : eos + 1], present)
        return cls(*(t.to(device, copy=True) for t in tables))


class RowState(NamedTuple):
    """What the constraint needs of a hypothesis: its open constituents (`depth`), the tags and openings it has
    written, the innermost open constituent's label and whether that one holds a word yet."""

    depth: torch.Tensor
    written: torch.Tensor
    opens: torch.Tensor
    label: torch.Tensor
    has_open: torch.Tensor
    holds_word: torch.Tensor


def prefix_state(kinds: torch.Tensor, input_ids: torch.Tensor) -> RowState:
    """Each row's `RowState`, read from its whole prefix (after the decoder's start symbol) with tensor operations,
    so beams may be reordered freely. A negative id (a search's fill where it has no padding) is no symbol."""
    # a column of padding in front keeps the first step's tensors non-empty
    ids = torch.nn.functional.pad(input_ids[:, 1:], (1, 0), value=-1)
    kind = torch.where(ids >= 0, kinds[ids.clamp(min=0)], OTHER)
    opens, tags = kind == OPEN, kind == TAG
    depth_after = (opens.long() - (kind == CLOSING).long()).cumsum(1)
    tags_after = tags.long().cumsum(1)
    depth, written = depth_after[:, -1], tags_after[:, -1]
    # the innermost open constituent: the last opening after which the depth is still the depth now
    innermost = opens & (depth_after == depth[:, None])
    position = (innermost.long() * torch.arange(ids.shape[1], device=ids.device)).argmax(1, keepdim=True)
    has_open = innermost.any(1) & (depth > 0)
    label = ids.gather(1, position).squeeze(1).clamp(min=0)
    holds_word = written > tags_after.gather(1, position).squeeze(1)
    return RowState(depth, written, opens.sum(1), label, has_open, holds_word)


def allowed_only(scores: torch.Tensor, state: RowState, tables: Tables, words: torch.Tensor,
                 remaining: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """`scores` with every symbol the rules of the module's text forbid at -inf. Each rule is decided per row
    (a few values a row), then spread over the tree symbols by each one's kind; every other entry is masked in
    one pass over the vocabulary (at beam 21 the passes over rows x vocabulary were most of the constraint's
    time, and a parser's vocabulary is mostly word pieces, never allowed)."""
    room = state.written < words
    # at most 2 constituents a word and 5 more (treebanks have about one): an untrained model that keeps
    # opening would otherwise run to the length limit
    nesting = room & (state.opens < 2 * words + 5)
    can_close = state.has_open & state.holds_word
    can_end = (state.written == words) & (state.depth == 0)
    if remaining is not None:
        # the fewest tokens that finish the tree: a tag for each word left, a closing for each open
        # constituent (an empty innermost one gets the next tag), the end. A tag or a closing takes one of
        # them and one step; an opening adds its closing: it needs two more steps than that to spare
        needed = (words - state.written).clamp(min=0) + state.depth.clamp(min=0) + 1
        nesting &= needed + 2 <= remaining
        # the row's last step ends it: a finished tree ends here anyway, an unfinished one (a limit shorter
        # than the words) is mended by `to_tree`, where masking the end would leave the row nothing
        last = remaining <= 1
        room, nesting, can_close, can_end = room & ~last, nesting & ~last, can_close & ~last, can_end | last
    # a row with nothing allowed (a finished sentence's row) may end: never all masked. A kind absent from the
    # vocabulary allows nothing
    can_end |= ~((nesting & tables.present[0]) | (room & tables.present[1]) | can_close | can_end)
    none = torch.zeros_like(room)
    # (rows, symbols + 1): each symbol by its kind, then a last column that takes the scatter of a row with
    # nothing to close
    allowed = torch.stack([none, nesting, none, room, none], 1).index_select(1, tables.symbol_kinds)
    # each row may close its innermost constituent (a gather and scatter, not the rows' indices, which a GPU
    # would have to send back to the host)
    close = tables.symbol_of[tables.closing[state.label]][:, None]
    allowed.scatter_(1, close, allowed.gather(1, close) | can_close[:, None])
    allowed = allowed[:, :-1].index_copy(1, tables.end, can_end[:, None])
    other = tables.other
    if other.shape[0] < scores.shape[1]:  # entries past the tokenizer's (a resized model's): no tree symbols
        other = torch.nn.functional.pad(other, (0, scores.shape[1] - other.shape[0]), value=True)
    masked = torch.where(other, float("-inf"), scores)
    masked[:, tables.symbols] = torch.where(allowed, scores[:, tables.symbols], float("-inf"))
    return masked


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
