# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Section 6.1 of the paper, the search, the decoding core: beam search with beam size 4, the GNMT length penalty
(alpha = 0.6), output length at most source length + 50 and early stopping, and greedy decoding.

Read it beside the paper: `gnmt_length_penalty` is lp(Y); `BeamStep` is one step of beam search, read top to
bottom: the decoder's log-probabilities, the processors (`apply_processors`, each of Transformers' rules written
once), then `advance`: candidates, the beams that go on, finished hypotheses, and `sentence_done`, the one
stopping rule; `limit_reached` is "input length + 50", the one source-length rule (Transformers' loop gets it as
`generation_vaswani.SourceLengthLimitLogitsProcessor`). `beam_search` runs the step with the eager batching
policy (`drop_finished`); the package's static-shape search (`vaswani_hf/model/speed/graph_search.py`) runs the
same step with finished sentences kept in place. Lexical constraints are their own step behind the same interface
(`lexical_vaswani.ConstrainedBeamStep`); the per-step outputs of `return_dict_in_generate` are kept by
`beam_history_vaswani.BeamHistory`. What cannot happen scores `IMPOSSIBLE` (-inf), everywhere.

The beam search is Transformers' algorithm (the same candidates, finished-hypothesis rules and scores, so
`length_penalty_type="hf"` and `max_length_offset=None` give exactly Transformers' sequences and scores) with the
paper's options and less work per step:
- the log-softmax is computed in place, and the top candidates are found in two stages (`top_k_per_row`);
- a sentence whose search is over leaves the batch at once, so long sentences do not keep short ones computing
  (every row stays, as in Transformers' loop, where a caller's processor may read which row is which example:
  `DecodingSettings.keeps_every_row`);
- the hypotheses' token buffers grow with the search (`WIDTH_STEP` positions at a time), so a step's bookkeeping
  copies the tokens written so far, not the longest output allowed (a parse allows input length + 300).
Two tricks were measured and went (docs/performance.md): seeking a parser's top candidates among its tree symbols
alone, and a first step of one row per sentence; neither saved time.

The searches step a decoding state (`decoding_state_vaswani.DecodingState`, or an ONNX or ensemble state), which
owns the model, its caches and its products; nothing here knows how a product is computed. Shipped as Hub remote
code: imports only torch, transformers and the files beside it; Transformers' processors only where a search has
some to look at, so the searches also run where nothing imports Transformers (`vaswani translate`'s light start).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers.generation import LogitsProcessorList, NoBadWordsLogitsProcessor

    from .beam_history_vaswani import BeamHistory
    from .decoding_state_vaswani import DecodingState
    from .lexical_vaswani import LexicalConstraints


# The paper's decoding (section 6.1), written into every new model's generation config.
PAPER_GENERATION_DEFAULTS = {
    "num_beams": 4,
    "length_penalty": 0.6,
    "length_penalty_type": "gnmt",
    "max_length_offset": 50,
    "early_stopping": True,
}
# fairseq-generate's decoding (beam 5, score / length, at most 200 tokens and then </s>), as its converted models
# decode; `vaswani translate --decoding fairseq|paper` picks either for any model.
FAIRSEQ_GENERATION_DEFAULTS = {
    "num_beams": 5,
    "length_penalty": 1.0,
    "length_penalty_type": "hf",
    "max_length_offset": None,
    "max_length": 202,  # the decoder's start, 200 tokens, </s>
    "early_stopping": True,  # a sentence ends with its beam-size finished hypotheses, as fairseq's search
    "forced_eos_score": "model",  # the </s> forced at that cap keeps the model's log-probability, as fairseq's
}
DECODING_PRESETS = {"paper": PAPER_GENERATION_DEFAULTS, "fairseq": FAIRSEQ_GENERATION_DEFAULTS}
LENGTH_PENALTY_TYPES = ("gnmt", "hf")
# What the EOS that `forced_eos_token_id` forces at the length cap scores: "zero" (Transformers'
# ForcedEOSTokenLogitsProcessor: log 1, whatever the model thinks of it) or "model" (fairseq's SequenceGenerator: the
# model's own log-probability of it, every other token impossible).
FORCED_EOS_SCORES = ("zero", "model")


@functools.cache
def row_local_processors() -> tuple[type, ...]:
    """Transformers' processors whose each row's scores depend on that row's tokens and scores alone (exact classes:
    a subclass may read more), so a search may drop finished sentences' rows under them. Imported when a search has
    processors to look at: this file's searches run on torch alone (`vaswani translate`'s light start)."""
    from transformers import generation

    return tuple(getattr(generation, name) for name in (
        "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor", "InfNanRemoveLogitsProcessor",
        "LogitNormalization", "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor",
        "NoBadWordsLogitsProcessor", "NoRepeatNGramLogitsProcessor", "RepetitionPenaltyLogitsProcessor",
        "SequenceBiasLogitsProcessor", "SuppressTokensLogitsProcessor", "TemperatureLogitsWarper"))  # fmt: skip


# The one score of what cannot happen: a masked token, a candidate a row cannot give, an empty finished slot.
IMPOSSIBLE = -math.inf


def gnmt_length_penalty(length: int | float | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """GNMT's length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016), used by the paper (section 6.1)."""
    return ((5 + length) / 6) ** alpha


# How many positions the eager beam search's token buffers grow by when they are full.
WIDTH_STEP = 32


def top_k_per_row(scores: torch.Tensor, k: int, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(scores, k)` over the last dimension of (rows, vocabulary) scores, in two cheap passes: the best k
    chunks of each row by their maximum, then the best k entries inside those chunks (the k best entries of a row
    always lie in its k best chunks). ~5x faster than `torch.topk` on CPU for 64 x 37,000 scores.

    Works in either layout `output_logits` writes (`scores` or `scores.t()` contiguous) without copying it.
    """
    vocab = scores.shape[-1]
    full = vocab - vocab % chunk
    if scores.is_contiguous():
        x, d = scores, 1  # the vocabulary dimension of x
    elif scores.t().is_contiguous():
        x, d = scores.t(), 0
    else:
        return scores.topk(k, dim=-1)
    if full // chunk < k:
        return scores.topk(k, dim=-1)
    chunk_max = x.narrow(d, 0, full).unflatten(d, (-1, chunk)).amax(d + 1)
    if full < vocab:  # the ragged tail is one more chunk
        chunk_max = torch.cat([chunk_max, x.narrow(d, full, vocab - full).amax(d, keepdim=True)], dim=d)
    best_chunks = chunk_max.topk(k, dim=d).indices
    offsets = torch.arange(chunk, device=scores.device).view([chunk if i == d + 1 else 1 for i in range(3)])
    index = (best_chunks.unsqueeze(d + 1) * chunk + offsets).flatten(d, d + 1)
    outside = index >= vocab
    candidates = x.gather(d, index.clamp(max=vocab - 1)).masked_fill_(outside, IMPOSSIBLE)
    values, position = candidates.topk(k, dim=d)
    index = index.gather(d, position)
    return (values, index) if d == 1 else (values.t(), index.t())


@dataclass
class DecodingSettings:
    """One generate() call's decoding settings, resolved from the generation config and the call's arguments."""

    num_beams: int
    num_return_sequences: int
    max_new_tokens: int  # the most tokens any row generates (EOS included)
    limits: torch.LongTensor  # per example: the most tokens it generates (source + offset, or max_new_tokens)
    min_new_tokens: int  # EOS is impossible before this many tokens
    eos: torch.LongTensor
    forced_eos: tuple[int, ...] | None  # forced at the max_length limit (Transformers' forced_eos_token_id: each id)
    limit_eos: int | None  # forced at a per-example limit (the paper's source + offset)
    forced_bos: int | None
    start: int
    fill: int
    length_penalty: float
    gnmt: bool
    early_stopping: bool | str
    suppress: torch.LongTensor | None
    bad_words: NoBadWordsLogitsProcessor | None
    user_processors: LogitsProcessorList
    renormalize: bool  # log-softmax again after the processors (Opus-MT's generation configs ask for it)
    return_dict: bool
    output_scores: bool
    output_logits: bool
    prefix: torch.LongTensor | None = None  # (examples, P) target prefix tokens, -1 after an example's own prefix
    constraints: LexicalConstraints | None = None  # every example's phrases (`lexical_vaswani`)
    sequence_scores: bool = False  # beam search's `sequences_scores` without the per-step scores
    forced_eos_keeps_score: bool = False  # `forced_eos` keeps the model's score (fairseq's), not 0 (Transformers')

    @property
    def candidates(self) -> int:
        """How many continuations beam search takes from each row (Transformers': enough that `num_beams` of
        them do not end, whatever the EOS tokens)."""
        return max(2, 1 + self.eos.numel()) * self.num_beams if self.num_beams > 1 else 1

    @property
    def keeps_every_row(self) -> bool:
        """Whether every row stays in the eager search to its end, as in Transformers' loop (a finished sentence's
        rows keep computing, greedy's fed the fill token): where a caller's processor may read which row is which
        example (Transformers' `PrefixConstrainedLogitsProcessor` reads row // beams, a bias may hold one row per
        beam). Not where each declares `row_independent` (its rows' scores depend on their own tokens and scores
        alone), or `reads_row_examples` (told each row's example before each call), or is one of Transformers'
        row-local processors: then finished sentences leave the batch, which is faster."""
        return any(not (getattr(processor, "row_independent", False) or getattr(processor, "reads_row_examples", False)
                        or type(processor) in row_local_processors())
                   for processor in self.user_processors)  # fmt: skip

    @property
    def per_step_outputs(self) -> bool:
        """Whether the result returns every step's (rows x vocabulary) scores or logits (and `beam_indices`)."""
        return self.return_dict and (self.output_scores or self.output_logits)

    def searches_within(self, allowed: int) -> bool:
        """Whether the search can score one column per token of an `allowed`-token shortlist: not when a logits
        processor reads the whole vocabulary's ids (bad words, the caller's), per-step scores over the vocabulary
        are returned, or the shortlist is narrower than the candidates a row gives."""
        return (self.bad_words is None and not self.user_processors and not self.per_step_outputs
                and self.constraints is None and allowed >= self.candidates)  # fmt: skip

    def vocabulary_with(self, shortlist: torch.LongTensor) -> torch.LongTensor:
        """A vocabulary shortlist plus every token these settings may force: EOS, start, fill, forced BOS/EOS,
        prefix and constraint tokens (a shortlist never makes a forced token impossible)."""
        forced = [*self.eos.tolist(), self.start, self.fill, self.forced_bos, *(self.forced_eos or ()), self.limit_eos]
        if self.prefix is not None:
            forced += self.prefix[self.prefix >= 0].tolist()
        if self.constraints is not None:
            forced += self.constraints.tokens()
        extra = torch.tensor([t for t in forced if t is not None and t >= 0], dtype=torch.long)
        return torch.unique(torch.cat([shortlist.flatten().cpu(), extra]))

    def within(self, vocabulary: torch.LongTensor) -> DecodingSettings:
        """These settings for a search whose score columns are the sorted `vocabulary` (a shortlist from
        `vocabulary_with`, so it holds every token named here): each token id becomes its column."""

        def column(token: int | None) -> int | None:
            return token if token is None or token < 0 else int(torch.searchsorted(vocabulary, token))

        prefix, suppress = self.prefix, self.suppress
        if prefix is not None:
            prefix = torch.where(prefix >= 0, torch.searchsorted(vocabulary, prefix.clamp(min=0)), prefix)
        if suppress is not None:  # a suppressed token outside the shortlist is impossible anyway
            suppress = torch.searchsorted(vocabulary, suppress[torch.isin(suppress, vocabulary)])
            suppress = suppress if suppress.numel() else None
        forced_eos = None if self.forced_eos is None else tuple(map(column, self.forced_eos))
        return replace(self, eos=torch.searchsorted(vocabulary, self.eos), forced_eos=forced_eos,
                       limit_eos=column(self.limit_eos), forced_bos=column(self.forced_bos), start=column(self.start),
                       fill=column(self.fill), prefix=prefix, suppress=suppress)  # fmt: skip

    def on(self, device: torch.device) -> DecodingSettings:
        """These settings with their per-token and per-example tensors on `device`, moved once rather than at
        every step."""
        return replace(self, eos=self.eos.to(device), limits=self.limits.to(device))

    def penalty(self, length: int | torch.Tensor) -> float | torch.Tensor:
        if self.gnmt:
            return gnmt_length_penalty(length, self.length_penalty)
        return length**self.length_penalty


def apply_processors(settings: DecodingSettings, scores: torch.Tensor, step: int | torch.Tensor,
                     limits: torch.Tensor, input_ids, row_examples: torch.Tensor | None,
                     any_at_limit: bool | None = None) -> torch.Tensor:  # fmt: skip
    """The logits processors of Transformers' loop for the supported settings, in its order, in place where it can,
    then a target prefix's tokens. The per-example limit's EOS comes after the caller's processors, as
    `SourceLengthLimitLogitsProcessor` does where generate() hands over to Transformers' loop: a processor that
    masks EOS (a parser's tree constraint on an unfinished tree) would otherwise leave a row at its limit nothing.

    `scores` are (rows, vocabulary); `step` tokens were generated before this one; `limits` are each row's most
    generated tokens; `input_ids()` builds the decoder input so far, only for the processors that read it;
    `row_examples` is the example each row decodes (on the CPU; needed with a target prefix, and told, with each
    row's tokens left, to a user processor that declares `reads_row_examples`); `any_at_limit`: whether a row
    takes its last token now, where the host knows it (the eager searches), so that a step where none does
    skips the limit's rule.

    Each rule is written once, for either kind of `step`: a host integer in the eager searches, where a rule that
    does not apply now costs nothing, or a device tensor in a captured step (`speed.graph_search`), which reads
    no device value on the host and so pays a masked copy every step for each rule that depends on the step.

    A target prefix is Transformers' `decoder_input_ids` prompt: a row with a prefix token at the first step takes
    it, not the forced BOS (Transformers forces BOS only where the prompt is the start token alone).
    """
    captured = isinstance(step, torch.Tensor)
    prefix = None
    if settings.prefix is not None and not captured and step < settings.prefix.shape[1]:
        prefix = settings.prefix[row_examples, step]  # on the host: which rows it forces, known without a read
        prefix = prefix.to(scores.device) if bool((prefix >= 0).any()) else None
    if settings.bad_words is not None:
        scores = settings.bad_words(input_ids(), scores)
    at_cap = False  # at the longest limit (a captured step's `max_new_tokens` is a bucket's)
    if settings.forced_eos is not None:
        at_cap = limit_reached(step, limits.max() if captured else settings.max_new_tokens)
    # the cap's EOS keeps the model's score as the minimum length found it: at the cap it wins over that rule, as
    # Transformers' forced EOS does (fairseq asserts min_len <= max_len), instead of keeping the rule's -inf
    eos_score = None
    if settings.forced_eos_keeps_score and at_cap is not False:  # read at the cap only (a host step knows when)
        eos_score = scores[:, settings.forced_eos].clone()
    if settings.min_new_tokens:
        forbid(scores, step < settings.min_new_tokens, settings.eos)
    if settings.forced_bos is not None:
        force(scores, step == 0, settings.forced_bos, rows=None if prefix is None else prefix < 0)
    if settings.forced_eos is not None:
        force(scores, at_cap, settings.forced_eos, keep_score=settings.forced_eos_keeps_score, kept=eos_score)
    if settings.suppress is not None:
        forbid(scores, True, settings.suppress)
    if settings.user_processors:
        # a processor that declares `reads_row_examples` is told, just before the call, which example each row
        # decodes (rows of sentences already done leave the batch, so a row's index no longer names its sentence)
        # and how many tokens each row may still generate; its __call__ keeps Transformers' two arguments, so it
        # runs in Transformers' loop too, which calls processors with (input_ids, scores) only
        for processor in settings.user_processors:
            if getattr(processor, "reads_row_examples", False):
                processor.search_rows(row_examples, limits - step)
        scores = settings.user_processors(input_ids(), scores)
    if settings.limit_eos is not None and any_at_limit is not False:
        force(scores, True, settings.limit_eos, rows=limit_reached(step, limits))
    if settings.renormalize:
        scores = scores.log_softmax(dim=-1)
    if prefix is not None:
        scores = force_prefix(scores, prefix)
    return scores


def limit_reached(generated: int | torch.Tensor, limits: torch.Tensor) -> torch.BoolTensor:
    """Section 6.1's "maximum output length = input length + 50", the one rule every search and Transformers' loop
    (`SourceLengthLimitLogitsProcessor`) follow: after `generated` tokens, the token chosen now is the last a row
    with these `limits` (its most generated tokens, EOS included) may take; it ends there, EOS forced where the
    limit is the source's."""
    return generated + 1 >= limits


def force_prefix(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Rows whose `tokens` entry is a token (not -1) can only continue with it, at its own score: a prefix's
    log-probability counts in the hypothesis' score, as in fairseq's and CTranslate2's prefix decoding."""
    rows = tokens >= 0
    index = tokens.clamp(min=0)[:, None]
    forced = torch.full_like(scores, IMPOSSIBLE).scatter_(1, index, scores.gather(1, index))
    return torch.where(rows[:, None], forced, scores)


def force(scores: torch.Tensor, when: bool | torch.Tensor, token: int | tuple[int, ...],
          rows: torch.BoolTensor | None = None, keep_score: bool = False,
          kept: torch.Tensor | None = None) -> None:  # fmt: skip
    """Transformers' forced-token rule, in place: the token (each of the tokens) scores 0, every other token is
    impossible, `when` holds (a host bool, or a device one in a captured step) in `rows` (None: every row).
    `keep_score`: the token keeps its own score instead of 0 (fairseq's length cap: only EOS possible); `kept`,
    that score as read before other rules changed it."""
    if when is False:
        return
    token = list(token) if isinstance(token, tuple) else token
    if keep_score and kept is None:
        kept = scores[:, token].clone()
    if when is True and rows is None:
        kept = kept if keep_score else 0
        scores.fill_(IMPOSSIBLE)
        scores[:, token] = kept
        return
    forced = torch.full_like(scores if keep_score else scores[:1], IMPOSSIBLE)
    forced[:, token] = kept if keep_score else 0
    chosen = when if rows is None else rows & when
    scores.copy_(torch.where(chosen.view(-1, 1) if chosen.dim() else chosen, forced, scores))


def forbid(scores: torch.Tensor, when: bool | torch.Tensor, tokens: torch.LongTensor) -> None:
    """These tokens impossible in every row, in place, `when` holds (a host bool, or a device one)."""
    if when is True:
        scores[:, tokens] = IMPOSSIBLE
    elif when is not False:
        scores[:, tokens] = torch.where(when, IMPOSSIBLE, scores[:, tokens])


def greedy_search(settings: DecodingSettings, state: DecodingState) -> dict:
    """Greedy decoding: the most probable token at each step, from the raw logits (no softmax needed)."""
    batch = int(state.example_ids.shape[0])
    device = state.encoder_hidden.device
    host_limits, settings = settings.limits, settings.on(device)
    output = torch.full((batch, settings.max_new_tokens), settings.fill, dtype=torch.long, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    tokens = torch.full((batch,), settings.start, dtype=torch.long, device=device)
    generated = torch.full((batch, settings.max_new_tokens), settings.fill, dtype=torch.long, device=device)
    limits, eos = settings.limits, settings.eos
    # the screened projection's upper bounds stay upper bounds under the built-in processors (they mask or force
    # tokens); a caller's processor may do anything with them
    screened = not settings.user_processors and hasattr(state, "greedy_logits")
    # rows whose sentence ended, where every row stays to the end (`keeps_every_row`): on the host
    ended = torch.zeros(batch, dtype=torch.bool) if settings.keeps_every_row else None
    for step in range(settings.max_new_tokens):
        scores, floor = state.greedy_logits(tokens) if screened else (state.logits(tokens).t(), None)

        def input_ids(step=step, generated=generated):
            start = torch.full_like(generated[:, :1], settings.start)
            return torch.cat([start, generated[:, :step]], dim=1)

        any_at_limit = bool((host_limits[state.example_ids] <= step + 1).any())  # host values: no read
        scores = apply_processors(settings, scores, step, limits, input_ids, state.example_ids,
                                  any_at_limit=any_at_limit)  # fmt: skip
        tokens = scores.argmax(-1)
        if floor is not None and not bool((scores.gather(1, tokens[:, None]) >= floor).all()):
            # a processor removed every candidate of a row (a suppressed token, EOS before min_new_tokens): the best
            # token left is known only approximately, so this step is decided on the exact logits
            scores = apply_processors(settings, state.exact_logits(), step, limits, input_ids, state.example_ids,
                                      any_at_limit=any_at_limit)  # fmt: skip
            tokens = scores.argmax(-1)
        if ended is not None and bool(ended.any()):  # Transformers' loop feeds an ended row the fill token
            tokens = tokens.masked_fill(ended.to(device), settings.fill)
        generated[:, step] = tokens
        finished = (torch.isin(tokens, eos) | limit_reached(step, limits)).cpu()  # the step's one read
        if ended is not None:
            finished &= ~ended
        if bool(finished.any()):
            done = finished.nonzero().flatten()
            ids = state.example_ids[done].to(device)
            output[ids] = generated[done.to(device)]
            lengths[ids] = step + 1
            if ended is not None:  # the rows stay, their results written
                ended |= finished
                if bool(ended.all()):
                    break
                continue
            keep = (~finished).nonzero().flatten()
            if keep.numel() == 0:
                break
            state.keep(keep)  # host indices
            keep = keep.to(device)
            tokens, generated, limits = tokens[keep], generated[keep], limits[keep]
    return {"sequences": output, "lengths": lengths}


@dataclass
class Beams:
    """The search state of every sentence in the batch: its `num_beams` running hypotheses and their scores, and
    its best finished hypotheses (penalised scores, lengths, which slots hold one)."""

    running: torch.LongTensor  # (batch, beams, steps) tokens
    running_scores: torch.Tensor  # (batch, beams) log-probabilities
    finished: torch.LongTensor  # (batch, beams, steps)
    finished_scores: torch.Tensor  # (batch, beams) log-probabilities / length penalty
    finished_lengths: torch.LongTensor  # (batch, beams)
    is_finished: torch.BoolTensor  # (batch, beams)
    improvable: torch.BoolTensor  # (batch,) Transformers' heuristic (`sentence_done`)
    limits: torch.LongTensor  # (batch,) the most tokens each sentence generates

    @classmethod
    def start(cls, settings: DecodingSettings, batch: int, device: torch.device, steps: int | None = None) -> Beams:
        """The search before its first step; `steps` positions of tokens (max_new_tokens unless given; fewer where
        the search `widened` them as it goes)."""
        beams, steps = settings.num_beams, steps or settings.max_new_tokens
        running = torch.full((batch, beams, steps), settings.fill, dtype=torch.long, device=device)
        running_scores = torch.zeros(batch, beams, device=device)
        # the beams start identical: only the first one proposes at step 0 (Transformers starts the others at -1e9,
        # which lets them end as hypotheses of about -1e9 where a row has fewer possible tokens than candidates)
        running_scores[:, 1:] = IMPOSSIBLE
        return cls(running, running_scores, running.clone(), torch.full((batch, beams), IMPOSSIBLE, device=device),
                   torch.zeros(batch, beams, dtype=torch.long, device=device),
                   torch.zeros(batch, beams, dtype=torch.bool, device=device),
                   torch.ones(batch, dtype=torch.bool, device=device), settings.limits)  # fmt: skip

    def select(self, sentences: torch.Tensor) -> Beams:
        """Only these sentences (indices into the batch)."""
        return Beams(*(getattr(self, f.name)[sentences] for f in fields(self)))

    def widened(self, positions: int, fill: int) -> Beams:
        """These beams with token buffers of `positions` tokens, the new ones holding `fill`."""
        more = positions - self.running.shape[-1]
        running, finished = (torch.nn.functional.pad(t, (0, more), value=fill) for t in (self.running, self.finished))
        return replace(self, running=running, finished=finished)

    def keep_where(self, done: torch.BoolTensor, before: Beams) -> Beams:
        """These beams, except for the sentences already `done`, which keep their state `before` (a static-shape
        search keeps finished sentences in the batch)."""

        def pick(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
            return torch.where(done.view(-1, *[1] * (new.dim() - 1)), old, new)

        return Beams(*(pick(getattr(self, f.name), getattr(before, f.name)) for f in fields(self)))

    def advanced(self, top: Candidates, running_scores: torch.Tensor, next_index: torch.LongTensor,
                 finished_scores: torch.Tensor, merged_index: torch.LongTensor) -> Beams:  # fmt: skip
        """The beams after a step: the `next_index` candidates of `top` go on with `running_scores`; the finished
        hypotheses are the `merged_index` entries of these finished ones followed by the candidates."""
        steps = self.running.shape[-1]
        running = top.sequences.gather(1, next_index[..., None].expand(-1, -1, steps))
        merged = merged_index[..., None].expand(-1, -1, steps)
        finished = torch.cat([self.finished, top.sequences], dim=1).gather(1, merged)
        lengths = torch.cat([self.finished_lengths, torch.zeros_like(top.index) + top.length], dim=1)
        is_finished = torch.cat([self.is_finished, top.just_finished], dim=1)
        return Beams(running, running_scores, finished, finished_scores, lengths.gather(1, merged_index),
                     is_finished.gather(1, merged_index), self.improvable, self.limits)  # fmt: skip

    def copy_(self, other: Beams) -> None:
        """Take `other`'s values into these tensors, in place (a captured step writes where its graph reads)."""
        for f in fields(self):
            getattr(self, f.name).copy_(getattr(other, f.name))


@dataclass
class Candidates:
    """A step's best candidates of each sentence, (batch, n) each, best first (or in the order a step ranks them):
    their scores (log-probabilities), their places in the pool of every beam's proposals (`index`), the beam each
    continues (`parents`), its token, its hypothesis (the beam's tokens and the new one, `length` tokens), whether
    it ends here (EOS, or the sentence's limit: `limit_reached`), and whether it becomes a finished hypothesis."""

    scores: torch.Tensor
    index: torch.LongTensor
    parents: torch.LongTensor
    tokens: torch.LongTensor
    sequences: torch.LongTensor
    ends: torch.BoolTensor
    just_finished: torch.BoolTensor
    length: int | torch.Tensor

    @classmethod
    def take(cls, settings: DecodingSettings, step: int | torch.Tensor, beams: Beams, proposals: Proposals,
             scores: torch.Tensor, index: torch.LongTensor) -> Candidates:  # fmt: skip
        """The candidates at these `index` places of the `proposals`, with these `scores`. Those that end among the
        first `num_beams` become finished hypotheses, where possible (a candidate scored impossible, where a row
        had fewer possible tokens than it proposes, is never a hypothesis, whichever token fills it)."""
        k = settings.num_beams
        parents = (index // proposals.width).clamp(max=k - 1)
        tokens = proposals.token_ids.gather(1, index)
        sequences = beams.running.gather(1, parents[..., None].expand(-1, -1, beams.running.shape[-1]))
        write_step(sequences, step, tokens)
        ends = torch.isin(tokens, settings.eos) | limit_reached(step, beams.limits)[:, None]
        first = torch.arange(scores.shape[1], device=scores.device) < k
        just_finished = ends & first & (scores > IMPOSSIBLE)
        return cls(scores, index, parents, tokens, sequences, ends, just_finished, step + 1)

    def going_on(self) -> torch.Tensor:
        """Their scores, an ended one impossible: an ended hypothesis never goes on."""
        return self.scores.masked_fill(self.ends, IMPOSSIBLE)

    def finished_scores(self, settings: DecodingSettings) -> torch.Tensor:
        """Their scores as finished hypotheses, log-probability over lp(Y); impossible where none is."""
        return (self.scores / settings.penalty(self.length)).masked_fill(~self.just_finished, IMPOSSIBLE)

    def parent_rows(self, next_index: torch.LongTensor) -> torch.LongTensor:
        """The row of batch x beams each beam that goes on came from."""
        k = next_index.shape[1]
        batch = torch.arange(next_index.shape[0], device=next_index.device)[:, None]
        return self.parents.gather(1, next_index) + batch * k


@dataclass
class Proposals:
    """What every beam proposes at a step, in the pool of its sentence: (batch, beams * width) `scores` (the
    beam's score plus the token's log-probability) and `token_ids`, each beam's `width` proposals side by side."""

    scores: torch.Tensor
    token_ids: torch.LongTensor
    width: int

    @classmethod
    def of(cls, values: torch.Tensor, token_ids: torch.LongTensor, beams: Beams, at_least: int = 0) -> Proposals:
        """(rows, width) proposals of each row, scored with their beam; padded with impossible ones to `at_least`
        (where the rows give fewer than a sentence takes candidates)."""
        batch, width = beams.running.shape[0], values.shape[-1]
        scores = (values + beams.running_scores.view(-1, 1)).reshape(batch, -1)
        # not a score (a caller's processor gave NaN, or +inf met an impossible beam's -inf): impossible, so that a
        # NaN never outranks every hypothesis and ends none
        scores.nan_to_num_(nan=IMPOSSIBLE, posinf=math.inf, neginf=IMPOSSIBLE)  # one pass, in place (a new tensor)
        token_ids = token_ids.reshape(batch, -1)
        if scores.shape[1] < at_least:
            scores = torch.nn.functional.pad(scores, (0, at_least - scores.shape[1]), value=IMPOSSIBLE)
            token_ids = torch.nn.functional.pad(token_ids, (0, at_least - token_ids.shape[1]), value=0)
        return cls(scores, token_ids, width)


@dataclass
class StepResult:
    """One beam step's outcome: the new `beams`, each new beam's parent row, which sentences' searches are over,
    and the indices `BeamHistory` follows (the top candidates' beams, the running and finished selections)."""

    beams: Beams
    parent_rows: torch.LongTensor  # (batch, beams) rows of batch x beams
    done: torch.BoolTensor  # (batch,)
    top_beams: torch.LongTensor
    next_index: torch.LongTensor
    merged_index: torch.LongTensor


class BeamStep:
    """Section 6.1, one step of beam search, the step both batching policies run (the eager `beam_search` drops
    finished sentences; the static-shape search of `speed.graph_search` keeps them, frozen). Called with the rows'
    newest tokens, it reads top to bottom:

    1. the decoder's log-probabilities of every row's next token;
    2. what the settings rule out or force: the step's own masks (`mask`), then the logits processors of
       Transformers' loop (`apply_processors`);
    3. `advance`: every beam proposes its best continuations; a sentence keeps the best `candidates` of its beams'
       proposals; the best `num_beams` that do not end go on; those among the first `num_beams` that end become
       finished hypotheses, scored with lp(Y); then the stopping rule (`sentence_done`).

    Lexical constraints are their own step behind this interface (`lexical_vaswani.ConstrainedBeamStep`), as
    fairseq's `LexicallyConstrainedBeamSearch` stands beside its `BeamSearch`. Tensor work only after the decoder
    (no value goes to the host), so a captured search step runs it as it is, `step` a device tensor. `history`:
    the per-step outputs of `return_dict_in_generate` (`BeamHistory`)."""

    def __init__(self, settings: DecodingSettings, history: BeamHistory | None = None):
        self.settings, self.history = settings, history

    def __call__(self, step: int | torch.Tensor, state: DecodingState, tokens: torch.LongTensor, beams: Beams,
                 input_ids, row_examples: torch.Tensor | None,
                 any_at_limit: bool | None = None) -> StepResult:  # fmt: skip
        """One step for the rows' newest `tokens`. `input_ids`, `row_examples` and `any_at_limit` are the
        processors' (`apply_processors`)."""
        settings, k, history = self.settings, self.settings.num_beams, self.history
        logits = state.logits(tokens)  # (vocabulary, rows)
        if history is not None and settings.output_logits:
            history.record(history.logits, logits.t(), state.example_ids)
        log_probs = log_softmax_in_place(logits)  # (rows, vocabulary)
        self.mask(log_probs)
        log_probs = apply_processors(settings, log_probs, step, beams.limits.repeat_interleave(k), input_ids,
                                     row_examples, any_at_limit)  # fmt: skip
        if history is not None and settings.output_scores:
            history.record(history.scores, log_probs, state.example_ids)
        result = self.advance(step, log_probs, beams)
        if history is not None:
            history.follow(result, state.example_ids, step)
        return result

    def mask(self, log_probs: torch.Tensor) -> None:
        """What this step rules out before the processors run (the plain step: nothing)."""

    def proposals(self, log_probs: torch.Tensor) -> tuple[torch.Tensor, torch.LongTensor]:
        """Each row's best `candidates` continuations, (rows, C) log-probabilities and token ids (all of them where
        it has fewer: a sentence's best lie among its rows' best)."""
        return top_k_per_row(log_probs, min(self.settings.candidates, log_probs.shape[-1]))

    def advance(self, step: int | torch.Tensor, log_probs: torch.Tensor, beams: Beams) -> StepResult:
        """Transformers' beam step with the paper's options, for (batch * num_beams, vocabulary) processed
        log-probabilities."""
        settings, k = self.settings, self.settings.num_beams
        proposals = Proposals.of(*self.proposals(log_probs), beams, at_least=settings.candidates)
        top = Candidates.take(settings, step, beams, proposals, *proposals.scores.topk(settings.candidates, dim=-1))
        running_scores, next_index = top.going_on().topk(k, dim=-1)
        # (stable: where fewer than `num_beams` have finished, the empty slots stay before the candidates that go on)
        ended = torch.cat([beams.finished_scores, top.finished_scores(settings)], dim=1)
        finished_scores, merged_index = (x[:, :k] for x in ended.sort(dim=1, descending=True, stable=True))
        new = beams.advanced(top, running_scores, next_index, finished_scores, merged_index)
        done, new.improvable = sentence_done(settings, step, running_scores, finished_scores, new.is_finished,
                                             beams.improvable, beams.limits)  # fmt: skip
        return StepResult(new, top.parent_rows(next_index), done, top.parents, next_index, merged_index)

    def keep(self, sentences: torch.Tensor) -> None:
        """Only these sentences (indices into the batch) go on: the step's own state drops the others."""
        if self.history is not None:
            self.history.keep(sentences)


def write_step(tensor: torch.Tensor, step: int | torch.Tensor, values: torch.Tensor) -> None:
    """`tensor[..., step] = values`, also where `step` is a device tensor (a captured step reads no host value)."""
    if isinstance(step, int):
        tensor[..., step] = values
    else:
        tensor.index_copy_(-1, step.view(1), values.unsqueeze(-1))


def beam_search(settings: DecodingSettings, state: DecodingState) -> dict:
    """Beam search (section 6.1): `BeamStep` after step (`lexical_vaswani.ConstrainedBeamStep` with constraints).
    A sentence is done when its search can no longer change its result (`sentence_done`); it then leaves the batch
    (`drop_finished`), so long sentences do not keep short ones computing.
    """
    k = settings.num_beams
    device = state.encoder_hidden.device
    host_limits, settings = settings.limits, settings.on(device)
    batch = int(state.example_ids.shape[0])
    steps = settings.max_new_tokens
    search = Beams.start(settings, batch, device, steps=min(steps, WIDTH_STEP))
    n_return = settings.num_return_sequences
    out = {
        "sequences": torch.full((batch * n_return, steps), settings.fill, dtype=torch.long, device=device),
        "scores": torch.zeros(batch * n_return, device=device),
        "lengths": torch.zeros(batch * n_return, dtype=torch.long, device=device),
    }
    tokens = torch.full((batch * k,), settings.start, dtype=torch.long, device=device)
    # Transformers returns beam_indices with the scores they index (its docs: "returned when output_scores=True");
    # without them, translation with return_dict_in_generate (n-best scores) pays nothing for the bookkeeping
    from .beam_history_vaswani import BeamHistory  # (it reads IMPOSSIBLE from here)

    history = BeamHistory(settings, batch, steps, device) if settings.per_step_outputs else None
    if settings.constraints is not None:
        step_rule = settings.constraints.beam_step(settings, history)
    else:
        step_rule = BeamStep(settings, history=history)
    # only a target prefix and user processors read which example a row decodes
    examples_read = settings.prefix is not None or bool(settings.user_processors)
    # sentences whose results are written, where every row stays to the end (`keeps_every_row`): on the host
    ended = torch.zeros(batch, dtype=torch.bool) if settings.keeps_every_row else None

    for step in range(steps):
        if step == search.running.shape[-1]:  # the token buffers are full: more columns
            search = search.widened(min(steps, step + WIDTH_STEP), settings.fill)

        def input_ids(step=step, running=search.running):
            start = torch.full((running.shape[0] * k, 1), settings.start, dtype=torch.long, device=device)
            return torch.cat([start, running[..., :step].flatten(0, 1)], dim=1)

        row_examples = state.example_ids.repeat_interleave(k) if examples_read else None
        any_at_limit = bool((host_limits[state.example_ids] <= step + 1).any())  # host values: no read
        result = step_rule(step, state, tokens, search, input_ids, row_examples, any_at_limit)
        search, parent_rows = result.beams, result.parent_rows
        done = result.done.cpu()  # the one read of a step: whose search is over (the device alone knows)
        if ended is not None:  # their rows go on computing, unread, as in Transformers' loop
            done &= ~ended
            if bool(done.any()):
                write_finished(settings, state, search, done, history, out)
                ended |= done
                if bool(ended.all()):
                    break
        elif bool(done.any()):
            search, parent_rows = drop_finished(settings, state, result, done, step_rule, out)
            if search is None:
                break
        state.reorder(parent_rows.flatten())
        tokens = search.running[:, :, step].flatten()
    if history is not None:
        out.update(history.outputs())
    return out


def drop_finished(settings: DecodingSettings, state: DecodingState, result: StepResult, done: torch.BoolTensor,
                  step_rule: BeamStep, out: dict) -> tuple[Beams | None, torch.LongTensor | None]:  # fmt: skip
    """The eager search's batching policy: the sentences whose search is over (`done`, read to the host) write
    their results into `out` and leave the batch (the decoding state, the beams and the step's own state drop
    their rows). The beams and parent rows of the sentences that go on, renumbered (None once none does)."""
    search, k = result.beams, settings.num_beams
    device = search.running.device
    write_finished(settings, state, search, done, step_rule.history, out)
    stay = (~done).nonzero().flatten()  # on the host: no further read
    if stay.numel() == 0:
        return None, None
    state.keep(stay)  # host indices: the state keeps its example ids on the host
    stay = stay.to(device)
    row_stay = (stay[:, None] * k + torch.arange(k, device=device)).flatten()
    # rows of the sentences that go on, renumbered after the others leave
    position = torch.full((done.shape[0] * k,), -1, dtype=torch.long, device=device)
    position[row_stay] = torch.arange(row_stay.numel(), device=device)
    step_rule.keep(stay)
    return search.select(stay), position[result.parent_rows[stay]]


def write_finished(settings: DecodingSettings, state: DecodingState, search: Beams, done: torch.BoolTensor,
                   history: BeamHistory | None, out: dict) -> None:  # fmt: skip
    """The results of the sentences whose search is over (`done`, on the host) into `out`."""
    n_return, device = settings.num_return_sequences, search.running.device
    leaving = done.nonzero().flatten()
    ids = state.example_ids[leaving].to(device)
    leaving = leaving.to(device)
    rows = (ids[:, None] * n_return + torch.arange(n_return, device=device)).flatten()
    out["sequences"][rows, : search.finished.shape[-1]] = search.finished[leaving, :n_return].flatten(0, 1)
    out["scores"][rows] = search.finished_scores[leaving, :n_return].flatten()
    out["lengths"][rows] = search.finished_lengths[leaving, :n_return].flatten()
    if history is not None:
        history.out[rows] = history.finished[leaving, :n_return].flatten(0, 1)


def log_softmax_in_place(logits: torch.Tensor) -> torch.Tensor:
    """(vocabulary, rows) logits -> (rows, vocabulary) log-probabilities, in place where the layout allows (the
    logits are the search's alone)."""
    log_probs = logits.t()
    if logits.is_contiguous():
        torch.log_softmax(logits, dim=0, out=logits)
    elif log_probs.is_contiguous():
        torch.log_softmax(log_probs, dim=-1, out=log_probs)
    else:
        log_probs = torch.log_softmax(log_probs, dim=-1)
    return log_probs


def sentence_done(settings: DecodingSettings, step: int, running_scores: torch.Tensor, finished_scores: torch.Tensor,
                  is_finished: torch.Tensor, improvable: torch.Tensor, limits: torch.Tensor):  # fmt: skip
    """Which sentences' searches are over after `step + 1` generated tokens (and the updated `improvable`): those
    where no running hypothesis is possible any more (every candidate ended or was impossible), and by this rule:

    GNMT (the paper, as tensor2tensor's beam search): over when the best score a running beam can still reach,
    its log-probability (which only falls) over the largest length penalty it can still get, is below the
    `n`-th best finished score: n = num_return_sequences with `early_stopping=True` (the best results are final),
    n = num_beams otherwise (every finished slot is final).
    "hf": Transformers' rules: `early_stopping=True` once `num_beams` hypotheses are finished; otherwise its
    heuristic with the current length (False) or the longest possible one ("never", for a positive penalty).
    """
    nothing_goes_on = (running_scores == IMPOSSIBLE).all(dim=1)
    if settings.gnmt:
        n = settings.num_return_sequences if settings.early_stopping is True else settings.num_beams
        largest_penalty = torch.maximum(
            torch.as_tensor(settings.penalty(limits.float())), torch.as_tensor(settings.penalty(step + 2))
        )
        reachable = running_scores.amax(dim=1) / largest_penalty
        return (finished_scores[:, n - 1] > reachable) | nothing_goes_on, improvable
    alpha = settings.length_penalty
    if settings.early_stopping == "never" and alpha > 0.0:
        length = settings.max_new_tokens
    else:
        length = step + 1
    best_running = running_scores.amax(dim=1, keepdim=True) / length**alpha
    worst_finished = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values, IMPOSSIBLE)
    improvable = improvable & (best_running > worst_finished).any(dim=1)
    return (is_finished.all(dim=1) & (settings.early_stopping is True)) | ~improvable | nothing_goes_on, improvable
