"""Ensemble decoding: several models of one vocabulary translate together, their log-probabilities averaged at every
step inside the same greedy and beam search (the paper's big model is a single model; ensembling is the standard way
to add a point or so of BLEU at decoding time, as in fairseq, Marian and Sockeye).

`Ensemble([model_a, model_b]).generate(**batch)` works like one model's `generate()` for greedy and beam search
(n-best, scores, prefixes, constraints); `vaswani translate --models A B` and `vaswani evaluate --models A B` use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from transformers import GenerationConfig

from ..model.generation_vaswani import Source, VaswaniGenerationMixin

# config fields every member must share: the vocabulary and the ids that start, end and pad a sequence
SHARED_FIELDS = ("vocab_size", "pad_token_id", "eos_token_id", "decoder_start_token_id", "unk_token_id")


class EnsembleDecodingState:
    """The members' decoding states stepped together: each keeps its own encoder output and caches; the step's
    scores are the mean of the members' log-probabilities (a renormalised geometric mean of their distributions,
    as Marian and Sockeye's default combine them; fairseq averages probabilities instead)."""

    def __init__(self, states: list) -> None:
        self.states = states

    @property
    def encoder_hidden(self) -> torch.Tensor:
        return self.states[0].encoder_hidden

    @property
    def example_ids(self) -> torch.Tensor:
        return self.states[0].example_ids

    @property
    def fold(self) -> bool:
        """Whether every member keeps one encoder row per sentence, so beam search's first step can run one row
        per sentence (an ONNX member keeps one per beam)."""
        return all(getattr(state, "fold", False) for state in self.states)

    @contextlib.contextmanager
    def searching(self):
        """Each member's own preparation for a search (`DecodingState.searching`)."""
        with contextlib.ExitStack() as stack:
            for state in self.states:
                if hasattr(state, "searching"):
                    stack.enter_context(state.searching())
            yield

    def logits(self, tokens: torch.LongTensor) -> torch.Tensor:
        """(rows,) ids -> (vocabulary, rows) mean log-probabilities (the searches read them as `.t()`)."""
        total = None
        for state in self.states:
            log_probs = torch.log_softmax(state.logits(tokens), dim=0)
            total = log_probs if total is None else total.add_(log_probs)
        return total.div_(len(self.states))

    def reorder(self, row_idx: torch.LongTensor) -> None:
        for state in self.states:
            state.reorder(row_idx)

    def keep(self, examples: torch.Tensor) -> None:
        for state in self.states:
            state.keep(examples)


class Ensemble(VaswaniGenerationMixin):
    """Models of one vocabulary decoded as one: greedy and beam search with their mean log-probabilities.

    The generation config (beam size, length penalty, source + 50 limit) is the first model's. Members may differ
    in size and architecture (a base and a big model, checkpoints of one run, runs with other seeds), but not in
    their vocabulary or special tokens, and must sit on one device. Members can be PyTorch models in any precision
    or `vaswani_hf.interop.onnx.OnnxSeq2Seq` folders.
    """

    def __init__(self, models: Sequence) -> None:
        models = list(models)
        if len(models) < 2:
            raise ValueError(f"An ensemble needs at least two models, got {len(models)}.")
        first = models[0].config
        for index, model in enumerate(models[1:], 1):
            differ = [name for name in SHARED_FIELDS if getattr(model.config, name) != getattr(first, name)]
            if differ:
                details = ", ".join(
                    f"{name} {getattr(first, name)} vs {getattr(model.config, name)}" for name in differ
                )
                raise ValueError(f"Ensemble: model {index} does not share model 0's vocabulary ({details}): ensembles "
                                 "need models trained with one tokenizer.")  # fmt: skip
        devices = {str(model.device) for model in models}
        if len(devices) > 1:
            raise ValueError(f"Ensemble: the models sit on different devices ({', '.join(sorted(devices))}): move "
                             "them to one.")  # fmt: skip
        self.models = models
        self.config = first
        self.generation_config: GenerationConfig = models[0].generation_config
        self.device = models[0].device

    def eval(self) -> Ensemble:
        for model in self.models:
            model.eval()
        return self

    def _handed_over_because(self, config, model_kwargs, logits_processor=None) -> str | None:
        reason = super()._handed_over_because(config, model_kwargs, logits_processor)
        if reason is not None:
            raise ValueError(f"Ensemble decoding runs greedy and beam search only: {reason} needs a single model.")
        return None

    def _encode(self, source: Source) -> list[torch.Tensor]:
        return [model._encode(source) for model in self.models]

    def _decoding_state(self, hidden: list[torch.Tensor], mask: torch.Tensor | None, rows_per_example: int,
                        fast: bool = True):  # fmt: skip
        states = [
            model._decoding_state(h, mask, rows_per_example, fast) for model, h in zip(self.models, hidden, strict=True)
        ]
        return EnsembleDecodingState(states)
