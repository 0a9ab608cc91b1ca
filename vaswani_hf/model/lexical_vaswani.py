# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Translator features that steer the search: target prefixes (`target_prefix`: the output starts with given
tokens) and lexical constraints (`force_words`: every phrase appears in the output; Post & Vilar's dynamic beam
allocation in `constrained_beam_search`), and the checks of what a caller asks for (`LexicalRequests`).
A prefix is forced by the search's own processors (`search_vaswani.apply_processors`).
Shipped as Hub remote code: imports only torch, transformers and the files beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers.generation import GenerationConfig

from .search_vaswani import DecodingSettings, apply_processors, top_k_per_row

if TYPE_CHECKING:
    from .decoding_state_vaswani import DecodingState


class PhraseConstraints:
    """Lexical constraints of one sentence (Hokamp & Liu, 2017; Post & Vilar, 2018): token phrases that must all
    appear in its output. Immutable: `advance` gives the state after one more output token.

    A phrase counts wherever it appears, whether forced or chosen by the model; a phrase under way that the next
    token breaks starts over (its matched tokens count again only when matched again). With `boundaries` (the ids
    of the tokens that begin a word), a phrase counts only where a word ends after it: "sieben" is not met by the
    first piece of "siebenundzwanzig".
    """

    __slots__ = ("boundaries", "met", "phrases", "progress")

    def __init__(self, phrases: tuple[tuple[int, ...], ...], met: tuple[bool, ...] | None = None,
                 progress: tuple[int, int] | None = None, boundaries: frozenset[int] | None = None):  # fmt: skip
        self.phrases = phrases
        self.met = met if met is not None else (False,) * len(phrases)
        self.progress = progress  # (phrase, tokens of it matched) of the phrase under way
        self.boundaries = boundaries

    @property
    def done(self) -> bool:
        """Every phrase is in place (one may still wait for its word to end: EOS ends it)."""
        unmet = self.met.count(False)
        return unmet == 0 or (unmet == 1 and self._complete())

    def _complete(self) -> bool:
        return self.progress is not None and self.progress[1] == len(self.phrases[self.progress[0]])

    @property
    def tokens_met(self) -> int:
        """The bank of Post & Vilar's dynamic beam allocation: constraint tokens in place so far."""
        matched = sum(len(phrase) for phrase, met in zip(self.phrases, self.met, strict=True) if met)
        return matched + (self.progress[1] if self.progress is not None else 0)

    def next_tokens(self) -> set[int]:
        """The tokens that would make progress: the next of the phrase under way, else the first of each unmet
        (none while a complete phrase waits for its word to end: the model's choice decides)."""
        if self.progress is not None:
            phrase, matched = self.progress
            return set() if self._complete() else {self.phrases[phrase][matched]}
        return {phrase[0] for phrase, met in zip(self.phrases, self.met, strict=True) if not met}

    def advance(self, token: int) -> PhraseConstraints:
        met = self.met
        if self.progress is not None:
            phrase, matched = self.progress
            if self._complete():  # a new word begins: the phrase is met; the word goes on: it was not the phrase
                if token in self.boundaries:
                    met = met[:phrase] + (True,) + met[phrase + 1 :]
            elif self.phrases[phrase][matched] == token:
                return self._state(met, (phrase, matched + 1))
        for phrase, (tokens, done) in enumerate(zip(self.phrases, met, strict=True)):
            if not done and tokens[0] == token:
                return self._state(met, (phrase, 1))
        return PhraseConstraints(self.phrases, met, None, self.boundaries)

    def _state(self, met: tuple[bool, ...], progress: tuple[int, int]) -> PhraseConstraints:
        phrase, matched = progress
        if matched == len(self.phrases[phrase]) and self.boundaries is None:  # token phrases are met at once
            return PhraseConstraints(self.phrases, met[:phrase] + (True,) + met[phrase + 1 :])
        return PhraseConstraints(self.phrases, met, progress, self.boundaries)


@dataclass
class Hypothesis:
    """A partial output of the constrained beam search."""

    tokens: tuple[int, ...]
    score: float  # log-probability so far
    constraints: PhraseConstraints
    parent: int = 0  # the beam it extends
    ends: bool = False  # its last token is EOS


def constrained_beam_search(settings: DecodingSettings, state: DecodingState) -> dict:
    """Beam search whose outputs contain every phrase of their sentence's constraints: Post & Vilar's (2018) dynamic
    beam allocation. Each beam proposes its best `num_beams` tokens and every token that advances its constraints;
    the candidates are grouped in banks by how many constraint tokens they have in place, and the beam is filled
    from the banks in turn, most advanced first, best score first inside a bank, so hypotheses that spent a step on
    a constraint are not pushed out by freer ones. EOS is allowed once all of a hypothesis' phrases are in place;
    at the length limit it is forced, and a hypothesis that met its constraints ranks before any that did not.

    Model steps are batched as in `beam_search`; the choice of candidates runs per sentence, on the CPU.
    """
    beams, device = settings.num_beams, state.encoder_hidden.device
    eos = set(settings.eos.tolist())
    eos_ids = settings.eos.to(device)
    candidates = settings.candidates
    limits = settings.limits.tolist()
    n_return = settings.num_return_sequences
    batch = len(limits)
    out_sequences = torch.full((batch * n_return, settings.max_new_tokens), settings.fill, dtype=torch.long)
    out_scores = torch.zeros(batch * n_return)
    out_lengths = torch.zeros(batch * n_return, dtype=torch.long)
    first = [Hypothesis((), 0.0, constraints) for constraints in settings.constraints]
    running = [[hyp] + [Hypothesis((), -math.inf, hyp.constraints)] * (beams - 1) for hyp in first]
    finished: list[list[tuple[bool, float, tuple[int, ...]]]] = [[] for _ in range(batch)]
    tokens = torch.full((batch * beams,), settings.start, dtype=torch.long, device=device)

    for step in range(settings.max_new_tokens):
        log_probs = torch.log_softmax(state.logits(tokens).t(), dim=-1)
        blocked = [not hyp.constraints.done for beam in running for hyp in beam]
        if eos_ids.numel() and any(blocked):  # EOS must wait for the constraints (the limit below overrides this)
            rows = torch.tensor(blocked, device=device).nonzero().flatten()
            log_probs[rows[:, None], eos_ids] = -math.inf
        example_ids = state.example_ids.tolist()
        row_limits = torch.tensor([limits[i] for i in example_ids for _ in range(beams)], device=device)

        def input_ids(running=running):
            rows = [(settings.start, *hyp.tokens) for beam in running for hyp in beam]
            return torch.tensor(rows, dtype=torch.long, device=device)

        row_examples = state.example_ids.repeat_interleave(beams)
        log_probs = apply_processors(settings, log_probs, step, row_limits, input_ids, row_examples)
        values, best = (x.tolist() for x in top_k_per_row(log_probs, candidates))
        wanted = [(row, token) for row, hyp in enumerate(h for beam in running for h in beam)
                  for token in sorted(hyp.constraints.next_tokens())]  # fmt: skip
        wanted_scores = log_probs[[r for r, _ in wanted], [t for _, t in wanted]].tolist() if wanted else []
        proposals: list[dict[tuple[int, int], float]] = [{} for _ in running]
        for row in range(len(values)):
            for value, token in zip(values[row], best[row], strict=True):
                proposals[row // beams][(row % beams, token)] = value
        for (row, token), value in zip(wanted, wanted_scores, strict=True):
            proposals[row // beams][(row % beams, token)] = value

        next_running, leaving = [], []
        for position, example in enumerate(example_ids):
            beam = running[position]
            banks: dict[int, list[Hypothesis]] = {}
            for (parent, token), value in proposals[position].items():
                score = beam[parent].score + value
                if score != -math.inf:
                    hyp = Hypothesis((*beam[parent].tokens, token), score, beam[parent].constraints.advance(token),
                                     parent, ends=token in eos)  # fmt: skip
                    banks.setdefault(hyp.constraints.tokens_met, []).append(hyp)
            # Transformers' rule, per bank: an ending is final if it is among the beam's best; the rest go on
            for hyp in allocate(banks, beams):
                if hyp.ends:
                    finished[example].append((hyp.constraints.done, hyp.score / settings.penalty(step + 1), hyp.tokens))
            chosen = allocate({bank: [h for h in hyps if not h.ends] for bank, hyps in banks.items()}, beams)
            if step + 1 >= limits[example] or not chosen or finished_for_good(settings, finished[example], chosen,
                                                                                step, limits[example]):  # fmt: skip
                leaving.append(position)
                results = sorted(finished[example], key=lambda f: (f[0], f[1]), reverse=True)
                # fewer results than asked for: the best unfinished hypotheses (no EOS) make up the number
                results += [(h.constraints.done, h.score / settings.penalty(step + 1), h.tokens) for h in chosen]
                for rank, (_, score, hyp_tokens) in enumerate(results[:n_return]):
                    row = example * n_return + rank
                    out_sequences[row, : len(hyp_tokens)] = torch.tensor(hyp_tokens, dtype=torch.long)
                    out_scores[row], out_lengths[row] = score, len(hyp_tokens)
            else:
                filler = Hypothesis(chosen[0].tokens, -math.inf, chosen[0].constraints, chosen[0].parent)
                next_running.append(chosen + [filler] * (beams - len(chosen)))
        if leaving:
            stay = [p for p in range(len(running)) if p not in set(leaving)]
            if not stay:
                break
            state.keep(torch.tensor(stay, device=device))
        state.reorder(torch.tensor([p * beams + hyp.parent for p, beam in enumerate(next_running) for hyp in beam],
                                   device=device))  # fmt: skip
        running = next_running
        tokens = torch.tensor([hyp.tokens[-1] for beam in running for hyp in beam], dtype=torch.long, device=device)
    return {"sequences": out_sequences.to(device), "scores": out_scores.to(device), "lengths": out_lengths.to(device)}


def allocate(banks: dict[int, list[Hypothesis]], beams: int) -> list[Hypothesis]:
    """Post & Vilar's beam allocation: the banks take turns, most constraint tokens first, each giving its best
    remaining hypothesis, until the beam is full or the banks are empty."""
    queues = [sorted(banks[bank], key=lambda h: -h.score) for bank in sorted(banks, reverse=True)]
    chosen: list[Hypothesis] = []
    while len(chosen) < beams and any(queues):
        for queue in queues:
            if queue and len(chosen) < beams:
                chosen.append(queue.pop(0))
    return chosen


def finished_for_good(settings: DecodingSettings, finished: list, running: list[Hypothesis], step: int,
                      limit: int) -> bool:  # fmt: skip
    """No running hypothesis can beat the results: enough of them met every constraint (num_return_sequences with
    early stopping, else num_beams) and the best log-probability still running, which only falls, over the best
    length penalty it can still get, is below the worst of those."""
    n = settings.num_return_sequences if settings.early_stopping is True else settings.num_beams
    met = sorted((score for done, score, _ in finished if done), reverse=True)
    if len(met) < n:
        return False
    best_running = max(hyp.score for hyp in running)
    reachable = best_running / max(settings.penalty(limit), settings.penalty(step + 2))
    return met[n - 1] > reachable


@dataclass
class LexicalRequests:
    """A generate() call's target prefixes (`target_prefix`) and lexical constraints (`force_words`), checked.

    `target_prefix`: one list of token ids per example (empty for none), or a 2-D tensor; the output starts with it,
    and its log-probability counts in the score (CTranslate2's `target_prefix`, fairseq's `prefix_tokens`).
    `force_words`: one list of phrases per example, each phrase a list of token ids; every phrase appears in the
    output. `force_words_ids` is Transformers' (4.x) name for phrases shared by every example. `word_start_ids`:
    the ids of the tokens that begin a word; with them a phrase counts only where a word ends after it
    (`PhraseConstraints`; `vaswani_hf.translation.inference.word_start_ids` reads them from a tokenizer).
    The length limit of an example grows to fit its prefix and phrases (tokens of both, plus EOS).
    """

    constraints: list[PhraseConstraints] | None = None
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
            requests.constraints = []
            for i, phrases in enumerate(examples):
                if not _is_list(phrases):
                    raise ValueError(f"generate(): force_words[{i}] must be a list of phrases (lists of token ids).")
                checked = tuple(_token_ids(f"force_words[{i}][{j}]", phrase, vocab, forbidden, empty=False)
                                for j, phrase in enumerate(phrases))  # fmt: skip
                requests.constraints.append(PhraseConstraints(checked, boundaries=boundaries))
                needed[i] += sum(len(phrase) for phrase in checked)
        if target_prefix is not None:
            examples = _per_example("target_prefix", target_prefix, batch)
            prefixes = [_token_ids(f"target_prefix[{i}]", p, vocab, forbidden) for i, p in enumerate(examples)]
            requests.prefix = torch.full((batch, max(map(len, prefixes), default=0)), -1, dtype=torch.long)
            for i, prefix in enumerate(prefixes):
                requests.prefix[i, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
                needed[i] += len(prefix)
        requests.needed = needed
        return requests

    def apply(self, settings: DecodingSettings) -> None:
        if self.asked is None:
            return
        settings.prefix, settings.constraints = self.prefix, self.constraints
        settings.limits = torch.maximum(settings.limits, self.needed)
        settings.max_new_tokens = max(settings.max_new_tokens, int(settings.limits.max()))


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
