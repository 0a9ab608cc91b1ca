"""An exported CTranslate2 model behind a token-id interface (ids in, ids out): the reference engine that
`tests/test_export.py` checks our export against and that `compare_marian.py` times. A harness, not part of the
library."""

from __future__ import annotations

from pathlib import Path

import torch

from vaswani_hf import VaswaniForConditionalGeneration
from vaswani_hf.interop.export import export_ctranslate2


class CTranslate2Runner:
    """An exported model behind a token-id interface, for tests and benchmarks (ids in, ids out)."""

    def __init__(self, path: str | Path, vocabulary: list[str], threads: int = 0):
        import ctranslate2

        self.translator = ctranslate2.Translator(str(path), device="cpu", compute_type="default",
                                                 inter_threads=1, intra_threads=threads)  # fmt: skip
        self.vocabulary = vocabulary
        self.ids = {token: i for i, token in enumerate(vocabulary)}

    @classmethod
    def from_model(cls, model: VaswaniForConditionalGeneration, path: str | Path, threads: int = 0,
                   vocabulary: list[str] | None = None,
                   quantization: str | None = None) -> CTranslate2Runner:  # fmt: skip
        """Export `model` (with placeholder token names when no vocabulary is given; weights in `quantization`, e.g.
        int8) and load it."""
        if vocabulary is None:
            special = {model.config.pad_token_id: "<pad>", model.config.bos_token_id: "<s>",
                       model.config.eos_token_id: "</s>", model.config.unk_token_id: "<unk>"}  # fmt: skip
            vocabulary = [special.get(i, f"t{i}") for i in range(model.config.vocab_size)]
        export_ctranslate2(model, vocabulary, path, quantization)
        return cls(path, vocabulary, threads)

    def _tokens(self, source: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[list[str]]:
        rows = []
        for i, row in enumerate(source.tolist()):
            length = int(attention_mask[i].sum()) if attention_mask is not None else len(row)
            rows.append([self.vocabulary[t] for t in row[:length]])
        return rows

    def translate_ids(self, source: torch.Tensor, attention_mask: torch.Tensor | None = None, beams: int = 1,
                      **options) -> list[list[int]]:  # fmt: skip
        """Output token ids per source row, without the start token and the end token."""
        results = self.translator.translate_batch(self._tokens(source, attention_mask), beam_size=beams, **options)
        return [[self.ids[t] for t in r.hypotheses[0]] for r in results]

    def generate_ids(self, source: torch.Tensor, beams: int, new_tokens: int) -> torch.Tensor:
        """Exactly `new_tokens` tokens per row (as a tensor), like generate() with min = max new tokens."""
        out = self.translate_ids(source, beams=beams, min_decoding_length=new_tokens,
                                 max_decoding_length=new_tokens, length_penalty=1.0)  # fmt: skip
        return torch.tensor(out)

    def call(self, source: torch.Tensor, beams: int, new_tokens: int):
        """A benchmark contender: `generate_ids`, returning how many tokens it produced."""
        return lambda: self.generate_ids(source, beams, new_tokens).numel()
