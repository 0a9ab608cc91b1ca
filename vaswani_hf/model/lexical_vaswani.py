# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Translator features that steer the search: target prefixes (`target_prefix`: the output starts with given
tokens) and lexical constraints (`force_words`: every phrase appears in the output), and the checks of what a caller
asks for (`LexicalRequests`).

Constraints are Post & Vilar's (2018) dynamic beam allocation, in tensors: `ConstrainedBeamStep` is their beam
step, behind the plain step's interface (`search_vaswani.BeamStep`), as fairseq's `LexicallyConstrainedBeamSearch`
stands beside its `BeamSearch`; `PhraseBanks` keeps every hypothesis' progress through its phrases, lets each beam
also propose the tokens that advance them, orders the candidates by bank (constraint tokens in place) and makes EOS
wait for the phrases. A prefix is forced by the search's own processors (`search_vaswani.apply_processors`).
Shipped as Hub remote code: imports only torch, transformers and the files beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from transformers.generation import GenerationConfig

from .search_vaswani import IMPOSSIBLE, BeamStep, Candidates, Proposals, StepResult, sentence_done

if TYPE_CHECKING:
    from .beam_history_vaswani import BeamHistory
    from .search_vaswani import Beams, DecodingSettings


@dataclass(frozen=True)
class LexicalConstraints:
    """Every example's phrases (Hokamp & Liu, 2017; Post & Vilar, 2018): token phrases that must all appear in its
    output. A phrase counts wherever it appears, whether forced or chosen by the model; a phrase under way that the
    next token breaks starts over. With `boundaries` (the ids of the tokens that begin a word), a phrase counts only
    where a word ends after it: "sieben" is not met by the first piece of "siebenundzwanzig"."""

    phrases: tuple[tuple[tuple[int, ...], ...], ...]  # per example, its phrases
    boundaries: frozenset[int] | None = None

    def tokens(self) -> list[int]:
        """Every token of every phrase (a vocabulary shortlist keeps them)."""
        return [token for example in self.phrases for phrase in example for token in phrase]

    def banks(self, num_beams: int, vocabulary: int, eos: torch.LongTensor, device: torch.device) -> PhraseBanks:
        count = max(map(len, self.phrases), default=0)
        longest = max((len(phrase) for example in self.phrases for phrase in example), default=1)
        tokens = torch.full((len(self.phrases), count, longest), -1, dtype=torch.long)
        for i, example in enumerate(self.phrases):
            for j, phrase in enumerate(example):
                tokens[i, j, : len(phrase)] = torch.tensor(phrase, dtype=torch.long)
        boundaries = None
        if self.boundaries is not None:
            boundaries = torch.zeros(vocabulary, dtype=torch.bool)
            boundaries[[t for t in self.boundaries if 0 <= t < vocabulary]] = True
            boundaries = boundaries.to(device)
        return PhraseBanks(tokens.to(device), num_beams, eos.to(device), boundaries)

    def beam_step(self, settings: DecodingSettings, history: BeamHistory | None) -> BeamStep:
        """The beam step that meets these phrases (the banks are made at the first step, when the vocabulary of
        the scores is known)."""
        return ConstrainedBeamStep(settings, self, history)


class ConstrainedBeamStep(BeamStep):
    """Section 6.1's beam step under lexical constraints (Post & Vilar's dynamic beam allocation): `BeamStep`'s
    interface and decoder, masks and processors, with its own `advance`. EOS waits for the phrases (`mask`); every
    beam also proposes the tokens that advance its phrases; the candidates are taken in the banks' order rather
    than by score alone; a finished hypothesis that met every phrase ranks first, and only those stop the search."""

    def __init__(self, settings: DecodingSettings, constraints: LexicalConstraints, history: BeamHistory | None):
        super().__init__(settings, history=history)
        self.constraints = constraints
        self.banks: PhraseBanks | None = None

    def mask(self, log_probs: torch.Tensor) -> None:
        if self.banks is None:
            s = self.settings
            self.banks = self.constraints.banks(s.num_beams, log_probs.shape[-1], s.eos, log_probs.device)
        self.banks.block_eos(log_probs)

    def advance(self, step: int | torch.Tensor, log_probs: torch.Tensor, beams: Beams) -> StepResult:
        settings, k, banks = self.settings, self.settings.num_beams, self.banks
        proposals = Proposals.of(*banks.propose(log_probs, *self.proposals(log_probs)), beams)
        every = proposals.scores.shape[1]
        top = Candidates.take(settings, step, beams, proposals, *banks.order(proposals.scores, None, every))
        running_scores, next_index = banks.order(top.going_on(), top.index, k)
        finished_scores, merged_index, finished_met = banks.merge_finished(
            beams.finished_scores, beams.is_finished, top.finished_scores(settings), top.just_finished, top.index, k
        )
        new = beams.advanced(top, running_scores, next_index, finished_scores, merged_index)
        done, new.improvable = sentence_done(settings, step, running_scores,
                                             *banks.met_only(finished_scores, new.is_finished, finished_met),
                                             beams.improvable, beams.limits)  # fmt: skip
        banks.follow(top.index, next_index, finished_met)
        return StepResult(new, top.parent_rows(next_index), done, top.parents, next_index, merged_index)

    def keep(self, sentences: torch.Tensor) -> None:
        super().keep(sentences)
        self.banks.select(sentences)


class Pool(NamedTuple):
    """What a step's candidates would lead to, in the step's pool layout (batch, beams * width): their states
    (met, phrase, matched), banks, whether every phrase is in place, and their order of arrival. `propose` makes it,
    `order` and `merge_finished` read it, `follow` spends it."""

    states: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    bank: torch.LongTensor
    done: torch.BoolTensor
    arrival: torch.LongTensor


class PhraseBanks:
    """Post & Vilar's dynamic beam allocation for a batch of sentences, the state `ConstrainedBeamStep` keeps.

    Each hypothesis has a state: which phrases are met (`met`, (batch, beams, phrases)) and the longest end of its
    output that begins an unmet phrase: that phrase (`phrase`, -1 for none; the first such phrase) and its length
    (`matched`). Every unmet phrase's progress (the longest end of the output that begins it) is an end of that one
    (an Aho-Corasick state), so the state follows every phrase at once, as fairseq's constraint trie does: phrases
    that share first tokens, and a phrase that overlaps itself (`5 5 6` in `5 5 5 6`). At each step:
    - `block_eos`: EOS waits until all of a hypothesis' phrases are in place (the length limit, forced after,
      overrides this);
    - `propose`: every beam also proposes each token that advances one of its unmet phrases, beside its best
      candidates;
    - `order`: the candidates are grouped in banks by how many constraint tokens they have in place, and the banks
      take turns, most advanced first, each giving its best remaining candidate, so hypotheses that spent a step
      on a constraint are not pushed out by freer ones. The step takes the first `num_beams` of this order for its
      finished hypotheses and orders the candidates that go on the same way;
    - `merge_finished`: a finished hypothesis that met every phrase ranks before any that did not;
    - `met_only`: the stopping rule reads only the finished hypotheses that met every phrase;
    - `follow`: the states of the hypotheses that go on. `propose` leaves the candidates' states in a `Pool`, which
      `order` and `merge_finished` read and `follow` spends.
    With word boundaries a complete phrase waits for its word to end: the next token begins a word, or the output
    ends (EOS, whether or not it is among the word starts). Tensor work only, one state per hypothesis, no value
    read on the host.
    """

    def __init__(self, tokens: torch.LongTensor, num_beams: int, eos: torch.LongTensor,
                 boundaries: torch.BoolTensor | None):  # fmt: skip
        self.tokens = tokens  # (batch, phrases, longest) ids, -1 past a phrase's end and for missing phrases
        self.lengths = (tokens >= 0).sum(-1)  # (batch, phrases)
        self.eos, self.boundaries = eos, boundaries
        batch, count, longest = tokens.shape
        # prefixes[b, j, k]: phrase j's first k + 1 tokens at the end of a window of `longest` tokens (-1: any
        # token; -3, which no token equals, where the phrase is shorter than k + 1)
        k = torch.arange(longest, device=tokens.device)[:, None]
        w = torch.arange(longest, device=tokens.device)
        position = w - (longest - 1 - k)  # (k, w): the phrase's token at window place w
        prefixes = tokens.gather(2, position.clamp(min=0).flatten()[None, None].expand(batch, count, -1))
        prefixes = torch.where(position.flatten() >= 0, prefixes, -1).view(batch, count, longest, longest)
        self.prefixes = torch.where((k[:, 0] < self.lengths[..., None])[..., None], prefixes, -3)
        self.met = (self.lengths == 0)[:, None, :].expand(batch, num_beams, count).clone()  # padding is met
        self.phrase = torch.full((batch, num_beams), -1, dtype=torch.long, device=tokens.device)
        self.matched = torch.zeros_like(self.phrase)
        self.finished_met = torch.zeros(batch, num_beams, dtype=torch.bool, device=tokens.device)
        self.pool: Pool | None = None

    def select(self, sentences: torch.Tensor) -> None:
        """Only these sentences (indices into the batch) go on."""
        for name in ("tokens", "lengths", "prefixes", "met", "phrase", "matched", "finished_met"):
            setattr(self, name, getattr(self, name)[sentences])

    # --- a state's facts ---------------------------------------------------------------------------------------

    def _window(self, phrase: torch.LongTensor, matched: torch.LongTensor) -> torch.LongTensor:
        """The output's last `longest` tokens that the state knows, (batch, n, longest): the `matched` first tokens
        of `phrase` at the end, -2 (no token) before them."""
        longest = self.tokens.shape[-1]
        position = matched[..., None] - longest + torch.arange(longest, device=matched.device)
        known = self._token_of(phrase[..., None].expand_as(position), position)
        return torch.where(position >= 0, known, -2)

    def _progress(self, met: torch.BoolTensor, window: torch.LongTensor) -> torch.LongTensor:
        """(batch, n, phrases): for each unmet phrase the longest end of the `window` that begins it (0 if met)."""
        prefixes = self.prefixes[:, None]  # (batch, 1, phrases, k, window)
        fits = ((prefixes == -1) | (prefixes == window[:, :, None, None, :])).all(-1)  # (batch, n, phrases, k)
        length = torch.arange(1, fits.shape[-1] + 1, device=window.device)
        return torch.where(met, 0, (fits * length).amax(-1))

    def _state(self, met: torch.BoolTensor, progress: torch.LongTensor):
        """(met, phrase, matched) from every phrase's progress: the most advanced unmet phrase, the first of equals."""
        count = progress.shape[-1]
        matched = progress.amax(-1)
        first = (progress * (count + 1) + count - torch.arange(count, device=progress.device)).argmax(-1)
        return met, torch.where(matched > 0, first, -1), matched

    def _done(self, met, phrase, matched) -> torch.BoolTensor:
        """Every phrase is in place (complete ones may still wait for their word to end: EOS ends them)."""
        progress = self._progress(met, self._window(phrase, matched))
        return (met | (progress == self.lengths[:, None, :])).all(-1)

    def _bank(self, met, phrase, matched) -> torch.LongTensor:
        """The bank: constraint tokens in place (the met phrases', and the most advanced unmet phrase's)."""
        return (met * self.lengths[:, None, :]).sum(-1) + matched

    def _token_of(self, phrase: torch.LongTensor, position: torch.LongTensor) -> torch.LongTensor:
        """tokens[example, phrase, position] for (batch, ...) phrases and positions."""
        longest = self.tokens.shape[-1]
        flat = self.tokens.flatten(1)
        index = phrase.clamp(min=0) * longest + position.clamp(min=0, max=longest - 1)
        return flat.gather(1, index.flatten(1)).view_as(phrase)

    def _advance(self, met, phrase, matched, token, ends: torch.BoolTensor | None = None):
        """The states after one more token, for (batch, n) states and tokens (met: (batch, n, phrases)); `ends`:
        where the token ends the output (EOS), which ends a word too."""
        before = self._window(phrase, matched)
        lengths = self.lengths[:, None, :]
        if self.boundaries is not None:  # a complete phrase is met where the next token begins a word
            word = self.boundaries[token.clamp(min=0)]
            word = word | ends if ends is not None else word
            complete = ~met & (self._progress(met, before) == lengths)
            met = met | (complete & word[..., None])
        after = torch.cat([before[..., 1:], token[..., None]], dim=-1)
        progress = self._progress(met, after)
        if self.boundaries is None:  # token phrases are met as soon as they are complete
            full = ~met & (progress == lengths)
            met, progress = met | full, progress.masked_fill(full, 0)
        return self._state(met, progress)

    # --- the hooks of the beam step ----------------------------------------------------------------------------

    def block_eos(self, log_probs: torch.Tensor) -> None:
        """(batch * beams, vocabulary) scores: EOS impossible where a hypothesis' phrases are not all in place."""
        if self.eos.numel():
            done = self._done(self.met, self.phrase, self.matched).flatten()
            log_probs[:, self.eos] = torch.where(done[:, None], log_probs[:, self.eos], IMPOSSIBLE)

    def propose(self, log_probs: torch.Tensor, values: torch.Tensor, token_ids: torch.LongTensor):
        """Each row's candidates (values, token_ids: (rows, C)) plus the tokens that advance its constraints (for
        each unmet phrase not yet complete, its token after its progress, its first where none; each once,
        ascending, and none a row already proposes), and the state every candidate would lead to."""
        batch, beams, count = self.met.shape
        rows, best = values.shape
        progress = self._progress(self.met, self._window(self.phrase, self.matched))  # (batch, beams, phrases)
        longest = self.tokens.shape[-1]
        following = self.tokens[:, None].expand(batch, beams, count, longest)
        following = following.gather(3, progress.clamp(max=longest - 1)[..., None])[..., 0]
        wanted = torch.where(self.met | (progress == self.lengths[:, None, :]), -1, following)
        wanted = wanted.view(rows, count)
        wanted = torch.where(wanted < 0, torch.iinfo(torch.long).max, wanted).sort(dim=-1).values
        wanted = torch.where(wanted == torch.iinfo(torch.long).max, -1, wanted)
        repeated = torch.zeros_like(wanted, dtype=torch.bool)
        repeated[:, 1:] = wanted[:, 1:] == wanted[:, :-1]
        repeated |= (wanted[:, :, None] == token_ids[:, None, :]).any(-1)
        wanted = torch.where(repeated, -1, wanted)
        wanted_values = log_probs.gather(1, wanted.clamp(min=0)).masked_fill(wanted < 0, IMPOSSIBLE)
        values, token_ids = torch.cat([values, wanted_values], 1), torch.cat([token_ids, wanted.clamp(min=0)], 1)
        # the states the candidates lead to, in the step's pool layout (batch, beams * width)
        width = best + count
        pool = (batch, beams * width)
        met = self.met[:, :, None].expand(batch, beams, width, count).reshape(*pool, count)
        phrase = self.phrase[:, :, None].expand(batch, beams, width).reshape(pool)
        matched = self.matched[:, :, None].expand(batch, beams, width).reshape(pool)
        ends = torch.isin(token_ids.view(pool), self.eos)
        states = self._advance(met, phrase, matched, token_ids.view(pool), ends)
        # Post & Vilar's order of equals within a bank: every row's best candidates in turn, then what they want
        column = torch.arange(width, device=values.device)
        beam = torch.arange(beams, device=values.device)[:, None]
        arrival = torch.where(column < best, beam * best + column, beams * best + beam * count + column - best)
        self.pool = Pool(states, self._bank(*states), self._done(*states), arrival.flatten())
        return values, token_ids

    def order(self, scores: torch.Tensor, positions: torch.LongTensor | None, n: int):
        """The first `n` of (batch, m) candidate scores (at these pool `positions`; all of the pool for None) in
        the order of the dynamic beam allocation: rounds, in each of which every bank, most constraint tokens
        first, gives its best remaining candidate. Impossible candidates (-inf) come last. (values, indices)."""
        bank, arrival = self.pool.bank, self.pool.arrival.expand_as(self.pool.bank)
        if positions is not None:
            bank, arrival = bank.gather(1, positions), arrival.gather(1, positions)
        possible = scores > IMPOSSIBLE
        # each candidate's rank inside its bank (0 for its best; equal scores in the order they arrived), by sorting:
        # by arrival, then score, then bank, each stable, so a bank's candidates stand together, best first
        # (O(m log m): a beam of 21 with constraints pools about 900 candidates a sentence)
        order = arrival.argsort(dim=1, stable=True)
        order = order.gather(1, scores.gather(1, order).argsort(dim=1, descending=True, stable=True))
        order = order.gather(1, bank.gather(1, order).argsort(dim=1, stable=True))
        grouped = bank.gather(1, order)
        place = torch.arange(grouped.shape[1], device=grouped.device).expand_as(grouped)
        starts = torch.ones_like(grouped, dtype=torch.bool)
        starts[:, 1:] = grouped[:, 1:] != grouped[:, :-1]
        first = torch.where(starts, place, 0).cummax(dim=1).values  # where each candidate's bank begins
        rank = torch.empty_like(order).scatter_(1, order, place - first)
        banks = self.tokens.shape[1] * self.tokens.shape[2] + 1  # more than any bank (read from shapes alone)
        key = torch.where(possible, rank * banks + (banks - 1 - bank), torch.iinfo(torch.long).max)
        index = key.argsort(dim=1, stable=True)[:, :n]
        return scores.gather(1, index), index

    def merge_finished(self, finished_scores, is_finished, scored, just_finished, top_index, k: int):
        """The best `k` of the finished hypotheses and the step's new ones: those that met every phrase first, then
        the others, each by score (equals in the order they finished). (scores, indices into both, and which of
        them met every phrase)."""
        met = torch.cat([self.finished_met, self.pool.done.gather(1, top_index)], dim=1)
        ended = torch.cat([is_finished, just_finished], dim=1)
        scores = torch.cat([finished_scores, scored], dim=1)
        by_score = scores.argsort(dim=1, descending=True, stable=True)
        group = (ended.long() * (1 + met.long())).gather(1, by_score)  # 2: met all, 1: finished, 0: none
        index = by_score.gather(1, group.argsort(dim=1, descending=True, stable=True))[:, :k]
        return scores.gather(1, index), index, met.gather(1, index)

    @staticmethod
    def met_only(finished_scores: torch.Tensor, is_finished: torch.Tensor, finished_met: torch.BoolTensor):
        """The finished hypotheses the stopping rule reads: those that met every phrase (ranked first)."""
        met = is_finished & finished_met
        return finished_scores.masked_fill(~met, IMPOSSIBLE), met

    def follow(self, top_index: torch.LongTensor, next_index: torch.LongTensor, finished_met: torch.BoolTensor):
        """The states of the hypotheses that go on (from the step's pool), and which finished ones met every
        phrase; the pool is spent."""
        chosen = top_index.gather(1, next_index)
        met, phrase, matched = self.pool.states
        self.met = met.gather(1, chosen[..., None].expand(-1, -1, met.shape[-1]))
        self.phrase, self.matched = phrase.gather(1, chosen), matched.gather(1, chosen)
        self.finished_met, self.pool = finished_met, None


@dataclass
class LexicalRequests:
    """A generate() call's target prefixes (`target_prefix`) and lexical constraints (`force_words`), checked.

    `target_prefix`: one list of token ids per example (empty for none), or a 2-D tensor; the output starts with it,
    and its log-probability counts in the score (CTranslate2's `target_prefix`, fairseq's `prefix_tokens`).
    `force_words`: one list of phrases per example, each phrase a list of token ids; every phrase appears in the
    output. `force_words_ids` is Transformers' (4.x) name for phrases shared by every example. `word_start_ids`:
    the ids of the tokens that begin a word; with them a phrase counts only where a word ends after it
    (`LexicalConstraints`; `vaswani_hf.translation.inference.word_start_ids` reads them from a tokenizer).
    The length limit of an example grows to fit its prefix and phrases (tokens of both, plus EOS).
    """

    constraints: LexicalConstraints | None = None
    prefix: torch.LongTensor | None = None  # (examples, P), -1 after an example's own prefix
    needed: torch.LongTensor | None = None  # per example: the fewest tokens its output needs

    @property
    def asked(self) -> str | None:
        names = [f"`{name}`" for name, value in (("force_words", self.constraints), ("target_prefix", self.prefix))
                 if value is not None]  # fmt: skip
        return " and ".join(names) or None

    @classmethod
    def check(cls, model_config, config: GenerationConfig, force_words, force_words_ids, target_prefix,
              batch: int, word_start_ids=None) -> LexicalRequests:  # fmt: skip
        eos = config.eos_token_id
        forbidden = {token: "the end-of-sequence token" for token in ([eos] if isinstance(eos, int) else eos or [])}
        if model_config.unk_token_id is not None:
            forbidden[model_config.unk_token_id] = "the unknown token (text the vocabulary cannot spell)"
        vocab = model_config.vocab_size
        if force_words is not None and force_words_ids is not None:
            raise ValueError("generate(): give `force_words` (a list of phrases per example) or `force_words_ids` "
                             "(Transformers' name: the same phrases for every example), not both.")  # fmt: skip
        if force_words_ids is not None:
            if not _is_list(force_words_ids) or not all(_is_list(phrase) for phrase in force_words_ids):
                raise ValueError("generate(): `force_words_ids` is a list of phrases, each a list of token ids.")
            if any(_is_list(token) for phrase in force_words_ids for token in phrase):
                raise ValueError("generate(): `force_words_ids` with alternatives (lists of phrases) are Transformers' "
                                 "disjunctive constraints, which this beam search does not have: give one phrase per "
                                 "entry.")  # fmt: skip
            force_words = [force_words_ids] * batch
        requests = cls()
        needed = torch.ones(batch, dtype=torch.long)
        if force_words is not None:
            if config.num_beams < 2:
                raise ValueError("generate(): `force_words` needs beam search: set num_beams to 2 or more (the "
                                 "paper's 4).")  # fmt: skip
            examples = _per_example("force_words", force_words, batch)
            boundaries = None if word_start_ids is None else frozenset(_token_ids("word_start_ids", word_start_ids,
                                                                                  vocab, {}))  # fmt: skip
            constraints = []
            for i, phrases in enumerate(examples):
                if not _is_list(phrases):
                    raise ValueError(f"generate(): force_words[{i}] must be a list of phrases (lists of token ids).")
                checked = tuple(_token_ids(f"force_words[{i}][{j}]", phrase, vocab, forbidden, empty=False)
                                for j, phrase in enumerate(phrases))  # fmt: skip
                constraints.append(checked)
                needed[i] += sum(len(phrase) for phrase in checked)
            requests.constraints = LexicalConstraints(tuple(constraints), boundaries)
        if target_prefix is not None:
            examples = _per_example("target_prefix", target_prefix, batch)
            prefixes = [_token_ids(f"target_prefix[{i}]", p, vocab, forbidden) for i, p in enumerate(examples)]
            requests.prefix = torch.full((batch, max(map(len, prefixes), default=0)), -1, dtype=torch.long)
            for i, prefix in enumerate(prefixes):
                requests.prefix[i, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
                needed[i] += len(prefix)
        requests.needed = needed
        return requests


def _is_list(value) -> bool:
    return isinstance(value, (list, tuple)) or (isinstance(value, torch.Tensor) and value.dim() > 0)


def _per_example(name: str, value, batch: int) -> list:
    if not _is_list(value) or len(value) != batch:
        given = f"{len(value)} entries" if _is_list(value) else type(value).__name__
        raise ValueError(f"generate(): `{name}` needs one entry per example ({batch} here), got {given}.")
    return list(value)


def _token_ids(name: str, ids, vocab: int, forbidden: dict[int, str], empty: bool = True) -> tuple[int, ...]:
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
    if not _is_list(ids) or not all(isinstance(token, int) and not isinstance(token, bool) for token in ids):
        raise ValueError(f"generate(): {name} must be a list of token ids (whole numbers), got {ids!r}.")
    if not ids and not empty:
        raise ValueError(f"generate(): {name} is empty: a phrase needs at least one token.")
    for token in ids:
        if not 0 <= token < vocab:
            raise ValueError(f"generate(): {name} holds token id {token}, outside the vocabulary [0, {vocab}).")
        if token in forbidden:
            raise ValueError(f"generate(): {name} holds token id {token}, {forbidden[token]}: leave it out.")
    return tuple(ids)
