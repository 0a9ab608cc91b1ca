# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""What `return_dict_in_generate` adds to a beam search's result (`search_vaswani.BeamStep` keeps it): the beam
indices of every returned hypothesis and, where asked, every step's scores and logits, as Transformers' beam search
returns them. Shipped as Hub remote code: imports only torch and the files beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .search_vaswani import IMPOSSIBLE

if TYPE_CHECKING:
    from .search_vaswani import DecodingSettings, StepResult


class BeamHistory:
    """What `return_dict_in_generate` adds to a beam search's result, as Transformers' beam search returns it:
    `beam_indices` (for each returned hypothesis and step, the row of batch x beams its token came from, -1 after
    its end), and with `output_scores` / `output_logits` the per-step processed log-probabilities / raw logits of
    every row, (batch * beams, vocabulary) each, which `compute_transition_scores` reads through `beam_indices`.

    A sentence leaves the batch once its search is over (`beam_search`); Transformers' loop goes on computing its
    rows, which no hypothesis reads. Here those rows of later steps hold -inf (nothing was computed there).
    """

    def __init__(self, settings: DecodingSettings, batch: int, steps: int, device: torch.device):
        self.beams = settings.num_beams
        self.total_rows = batch * self.beams
        self.running = torch.full((batch, self.beams, steps), -1, dtype=torch.int32, device=device)
        self.finished = self.running.clone()
        self.out = torch.full((batch * settings.num_return_sequences, steps), -1, dtype=torch.int32, device=device)
        self.scores: list[torch.Tensor] = []
        self.logits: list[torch.Tensor] = []
        self._ids: tuple[torch.Tensor, torch.Tensor] | None = None  # (host example ids, their copy on the device)

    def on_device(self, example_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The host's example ids on the device, copied once each time the batch changes, not at every step."""
        if self._ids is None or self._ids[0] is not example_ids or self._ids[1].device != device:
            self._ids = (example_ids, example_ids.to(device))
        return self._ids[1]

    def rows(self, example_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        beams = torch.arange(self.beams, device=device)
        return (self.on_device(example_ids, device)[:, None] * self.beams + beams).flatten()

    def keep(self, sentences: torch.Tensor) -> None:
        """Only these sentences (indices into the batch) go on."""
        self.running, self.finished = self.running[sentences], self.finished[sentences]

    def record(self, steps: list[torch.Tensor], values: torch.Tensor, example_ids: torch.Tensor) -> None:
        """One step's (rows, vocabulary) values of the sentences still in the batch, in the full batch's rows."""
        full = values.new_full((self.total_rows, values.shape[-1]), IMPOSSIBLE, dtype=torch.float32)
        full[self.rows(example_ids, values.device)] = values
        steps.append(full)

    def top_origins(self, top_beams: torch.Tensor, example_ids: torch.Tensor, step: int) -> torch.Tensor:
        """The beam indices of the step's top candidates: their parents' history, then the parent's row."""
        origins = self.running.gather(1, top_beams[..., None].expand(-1, -1, self.running.shape[-1]))
        parent_rows = self.on_device(example_ids, top_beams.device)[:, None] * self.beams + top_beams
        origins[:, :, step] = parent_rows.to(origins.dtype)
        return origins

    def follow(self, result: StepResult, example_ids: torch.Tensor, step: int) -> None:
        """The beam indices of a step's new running and finished hypotheses."""
        steps = self.running.shape[-1]
        top_origins = self.top_origins(result.top_beams, example_ids, step)
        self.running = top_origins.gather(1, result.next_index[..., None].expand(-1, -1, steps))
        merged = torch.cat([self.finished, top_origins], dim=1)
        self.finished = merged.gather(1, result.merged_index[..., None].expand(-1, -1, steps))

    def outputs(self) -> dict:
        return {
            "beam_indices": self.out,
            "step_scores": tuple(self.scores) or None,
            "step_logits": tuple(self.logits) or None,
        }
