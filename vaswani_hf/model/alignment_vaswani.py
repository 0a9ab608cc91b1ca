# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Word alignments read from cross-attention (`generate(return_alignments=True)`, fairseq's hard alignment).
Shipped as Hub remote code: imports only torch, transformers and the files beside it.
"""

from __future__ import annotations

import torch
from transformers.modeling_outputs import BaseModelOutput


def forced_attentions(model, **inputs):
    """The model's forward on given inputs with every attention weight returned (eager attention for the call:
    sdpa and flash kernels do not return the weights)."""
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        return model(**inputs, output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation(implementation)


def with_alignments(model, output, source) -> object:
    """`output` with `alignments`: for each returned sequence, a (pairs, 2) LongTensor of (source token, output
    token) positions, one pair per output token: the source token its cross-attention weighs most, in the
    config's `alignment_layer`, averaged over `alignment_heads` (fairseq's hard alignment). Positions count the
    real tokens: the source without padding, the output from its first generated token. EOS and padding on
    either side are left out. `vaswani_hf.translation.inference` merges subword pieces into Moses `i-j` word pairs."""
    sequences = output.sequences
    rows_per_example = sequences.shape[0] // source.lengths.shape[0]
    repeat = lambda x: x.repeat_interleave(rows_per_example, dim=0) if x is not None else None  # noqa: E731
    encoder_outputs = None
    if source.input_ids is None:
        encoder_outputs = BaseModelOutput(last_hidden_state=repeat(source.encoder_outputs[0]))
    input_ids = repeat(source.input_ids)
    mask = repeat(source.attention_mask)
    if mask is None:
        shape = (input_ids if input_ids is not None else encoder_outputs.last_hidden_state).shape[:2]
        mask = torch.ones(shape, dtype=torch.long, device=model.device)
    attentions = forced_attentions(model, input_ids=input_ids, attention_mask=mask, encoder_outputs=encoder_outputs,
                                   decoder_input_ids=sequences[:, :-1]).cross_attentions  # fmt: skip
    if not attentions or attentions[0] is None:
        raise ValueError("generate(return_alignments=True): the model returned no cross-attention weights, which "
                         "the alignments are read from.")  # fmt: skip
    weights = attentions[model.config.alignment_layer_index].float()
    if model.config.alignment_heads is not None:
        weights = weights[:, model.config.alignment_heads]
    weights = weights.mean(dim=1)  # (rows, output tokens, source tokens)
    eos = model.generation_config.eos_token_id
    eos = torch.tensor([eos] if isinstance(eos, int) else list(eos or []), device=sequences.device)
    specials = torch.cat([eos, torch.tensor([model.config.pad_token_id], device=sequences.device)])
    outputs = sequences[:, 1:]
    output_ok = ~torch.isin(outputs, specials) & (torch.isin(outputs, eos).cumsum(dim=1) == 0)
    source_ok = mask.bool()
    if input_ids is not None:
        source_ok &= ~torch.isin(input_ids, specials)
    best = weights.masked_fill(~source_ok[:, None, :], -1.0).argmax(dim=-1)
    source_position = mask.long().cumsum(dim=1) - 1
    alignments = []
    for row in range(sequences.shape[0]):
        targets = output_ok[row].nonzero().flatten() if bool(source_ok[row].any()) else outputs.new_zeros(0)
        alignments.append(torch.stack([source_position[row, best[row, targets]], targets], dim=1).cpu())
    output["alignments"] = alignments
    return output
