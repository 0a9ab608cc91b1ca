# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Checks of the model's inputs: a bad id, mask shape or dtype gets a ValueError naming the argument and the fix,
instead of an index error deep inside torch (or a CUDA device-side assert).

Shipped as Hub remote code beside the modeling file: it imports only torch (and the config, for type hints)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .configuration_vaswani import VaswaniConfig


def _tracing() -> bool:
    # torch.compile / export cannot branch on tensor values, nor can a CUDA graph being captured (graph decoding);
    # the eager call before them has checked.
    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or _capturing()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_source(
    config: VaswaniConfig,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
) -> None:
    """The encoder's inputs, checked once per call of the encoder (by `forward()` or by `generate()`)."""
    names = ("input_ids", "inputs_embeds", "attention_mask")
    _check_stack(config, "VaswaniEncoder", names, input_ids, inputs_embeds, attention_mask)


def check_target(
    config: VaswaniConfig,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    past_length: int | torch.Tensor,
) -> None:
    """The decoder's inputs, checked on the prompt only (`past_length` 0): later steps feed ids the model generated
    and a mask that also covers the cached past, so one generate() call checks once and its decode steps not at all."""
    if input_ids is None and inputs_embeds is None:
        raise ValueError(
            "VaswaniDecoder: no `decoder_input_ids`: give them (or `decoder_inputs_embeds`), or give `labels` to "
            "VaswaniForConditionalGeneration, which builds them. To translate, call `generate()`."
        )
    tracing = _tracing()
    if not tracing and int(past_length) != 0:
        return  # an eager decode step
    names = ("decoder_input_ids", "decoder_inputs_embeds", "decoder_attention_mask")
    # torch.compile traces every step alike: check the structure there, not the mask (it may cover a cached past)
    _check_stack(config, "VaswaniDecoder", names, input_ids, inputs_embeds, None if tracing else attention_mask)


def _check_stack(
    config: VaswaniConfig,
    stack: str,
    names: tuple[str, str, str],
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
) -> None:
    """Exactly one of ids or embeddings, a non-empty (batch, length[, d_model]) shape, a mask of the same
    (batch, length), integer ids inside the vocabulary. `names` are the argument names the caller knows them by."""
    ids_name, embeds_name, mask_name = names
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"{stack}: give exactly one of `{ids_name}` or `{embeds_name}`.")
    given, name = (input_ids, ids_name) if input_ids is not None else (inputs_embeds, embeds_name)
    shape = tuple(given.shape[:2])
    expected = "(batch, length)" if input_ids is not None else "(batch, length, d_model)"
    if given.dim() != len(expected.split(",")) or 0 in shape:
        raise ValueError(
            f"`{name}` must be a non-empty batch of shape {expected}, got {tuple(given.shape)}: give at least "
            "one sequence of at least one token."
        )
    # a 4D mask is a ready-made (batch, 1, query, key) mask (Transformers builds one for static caches)
    if attention_mask is not None and attention_mask.dim() != 4 and tuple(attention_mask.shape) != shape:
        raise ValueError(
            f"`{mask_name}` has shape {tuple(attention_mask.shape)} but `{name}` has (batch, length) = {shape}: "
            "pass the mask the tokenizer returned with these ids."
        )
    if input_ids is None:
        return
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool or input_ids.is_complex():
        raise ValueError(f"`{ids_name}` must hold integer token ids, got dtype {input_ids.dtype}: use .long().")
    vocab_size = config.vocab_size
    if not _tracing() and not _BATCH_CHECKED.get():
        low, high = torch.stack(torch.aminmax(input_ids)).tolist()  # one device sync, not two
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"`{ids_name}` holds token id {low if low < 0 else high}, outside the vocabulary [0, {vocab_size}): "
                "the tokenizer does not match this model (compare len(tokenizer) with config.vocab_size)."
            )


_BATCH_CHECKED = contextvars.ContextVar("batch_checked_on_the_host", default=False)


@contextlib.contextmanager
def batch_checked_on_the_host() -> Iterator[None]:
    """Inside the block, the id checks (`check_labels`, the stacks' input ids) trust their caller, who checked the
    ids before they reached the device (the trainer's batches are checked in numpy or on the loader's host
    tensors): each check reads a device value back, which waits for the card."""
    token = _BATCH_CHECKED.set(True)
    try:
        yield
    finally:
        _BATCH_CHECKED.reset(token)


def check_labels(labels: torch.Tensor, vocab_size: int) -> None:
    """Target ids inside the vocabulary, or -100 for positions the loss ignores."""
    if _tracing() or _BATCH_CHECKED.get():
        return
    invalid = (labels != -100) & ((labels < 0) | (labels >= vocab_size))
    if invalid.any():
        raise ValueError(
            f"`labels` holds token id {int(labels[invalid][0])}, outside the vocabulary [0, {vocab_size}) (use -100 "
            "for positions to ignore): the tokenizer does not match this model."
        )
