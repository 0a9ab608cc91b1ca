"""The lexically constrained search as it was written before it became a hook on the one beam step: Post & Vilar's
(2018) dynamic beam allocation, per sentence, in Python, one hypothesis at a time. The tests hold the tensor search
(`vaswani_hf.model.lexical_vaswani.PhraseBanks`) to it: a second, independent reading of the same algorithm."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy
import torch

from vaswani_hf.model.decoding_state_vaswani import DecodingState
from vaswani_hf.model.search_vaswani import DecodingSettings, apply_processors, top_k_per_row


class PhraseConstraints:
    """Lexical constraints of one sentence (Hokamp & Liu, 2017; Post & Vilar, 2018): token phrases that must all
    appear in its output. Immutable: `advance` gives the state after one more output token.

    A phrase counts wherever it appears, whether forced or chosen by the model. Every phrase is followed on its own,
    as fairseq's constraint trie follows its constraints: for each, the set of its prefix lengths the output ends
    with (a nondeterministic automaton), so phrases sharing first tokens and a phrase overlapping itself are
    found. With `boundaries` (the ids of the tokens that begin a word), a phrase counts only where a word ends after
    it: "sieben" is not met by the first piece of "siebenundzwanzig"; the end of the output (`advance(..., ends=True)`)
    ends a word too.
    """

    __slots__ = ("boundaries", "met", "partial", "phrases")

    def __init__(self, phrases: tuple[tuple[int, ...], ...], met: tuple[bool, ...] | None = None,
                 partial: tuple[frozenset[int], ...] | None = None,
                 boundaries: frozenset[int] | None = None):  # fmt: skip
        self.phrases = phrases
        self.met = met if met is not None else (False,) * len(phrases)
        self.partial = partial if partial is not None else (frozenset(),) * len(phrases)  # prefix lengths matched
        self.boundaries = boundaries

    def _progress(self, j: int) -> int:
        return 0 if self.met[j] else max(self.partial[j], default=0)

    @property
    def progress(self) -> tuple[int, int] | None:
        """(phrase, tokens matched) of the most advanced unmet phrase (the first of equals), None if none began."""
        best = max(range(len(self.phrases)), key=lambda j: (self._progress(j), -j), default=None)
        return None if best is None or self._progress(best) == 0 else (best, self._progress(best))

    @property
    def done(self) -> bool:
        """Every phrase is in place (complete ones may still wait for their word to end: EOS ends them)."""
        return all(met or self._progress(j) == len(self.phrases[j]) for j, met in enumerate(self.met))

    @property
    def tokens_met(self) -> int:
        """The bank of Post & Vilar's dynamic beam allocation: constraint tokens in place so far (the met phrases',
        and the most advanced unmet phrase's)."""
        matched = sum(len(phrase) for phrase, met in zip(self.phrases, self.met, strict=True) if met)
        return matched + (self.progress[1] if self.progress is not None else 0)

    def next_tokens(self) -> set[int]:
        """The tokens that would make progress: for each unmet phrase not complete, its token after its progress
        (a complete one waiting for its word to end proposes nothing: the model's choice decides)."""
        return {phrase[self._progress(j)] for j, phrase in enumerate(self.phrases)
                if not self.met[j] and self._progress(j) < len(phrase)}  # fmt: skip

    def advance(self, token: int, ends: bool = False) -> PhraseConstraints:
        met = list(self.met)
        if self.boundaries is not None and (token in self.boundaries or ends):  # a word ends: complete ones are met
            met = [m or self._progress(j) == len(self.phrases[j]) for j, m in enumerate(met)]
        partial = []
        for j, phrase in enumerate(self.phrases):
            grown = frozenset(k + 1 for k in self.partial[j] | {0} if k < len(phrase) and phrase[k] == token)
            if met[j]:
                grown = frozenset()
            elif self.boundaries is None and len(phrase) in grown:  # token phrases are met as soon as complete
                met[j], grown = True, frozenset()
            partial.append(grown)
        return PhraseConstraints(self.phrases, tuple(met), tuple(partial), self.boundaries)


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

    Model steps are batched as in `beam_search`; the choice of candidates runs per sentence, on the CPU. Scores are
    summed in float32, as the tensor search sums them.
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
    spec = settings.constraints
    first = [Hypothesis((), 0.0, PhraseConstraints(phrases, boundaries=spec.boundaries)) for phrases in spec.phrases]
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
                score = float(numpy.float32(beam[parent].score) + numpy.float32(value))
                if score != -math.inf:
                    after = beam[parent].constraints.advance(token, token in eos)  # EOS ends the last word
                    hyp = Hypothesis((*beam[parent].tokens, token), score, after, parent, ends=token in eos)
                    banks.setdefault(hyp.constraints.tokens_met, []).append(hyp)
            # Transformers' rule, per bank: an ending is final if it is among the beam's best; the rest go on
            for hyp in allocate(banks, beams):
                if hyp.ends:
                    finished[example].append(
                        (
                            hyp.constraints.done,
                            penalised(settings, hyp.score, step),
                            hyp.tokens,
                        )
                    )
            chosen = allocate({bank: [h for h in hyps if not h.ends] for bank, hyps in banks.items()}, beams)
            if step + 1 >= limits[example] or not chosen or finished_for_good(settings, finished[example], chosen,
                                                                                step, limits[example]):  # fmt: skip
                leaving.append(position)
                results = sorted(finished[example], key=lambda f: (f[0], f[1]), reverse=True)
                # fewer results than asked for: the best unfinished hypotheses (no EOS) make up the number
                results += [
                    (
                        h.constraints.done,
                        penalised(settings, h.score, step),
                        h.tokens,
                    )
                    for h in chosen
                ]
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


def penalised(settings: DecodingSettings, score: float, step: int) -> float:
    return float(numpy.float32(score) / numpy.float32(settings.penalty(step + 1)))


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
