"""Converters from the two peers we prove parity against: Transformers' Marian and `torch.nn.Transformer`."""

from .marian import convert_marian_checkpoint, marian_to_vaswani
from .torch_transformer import torch_transformer_to_vaswani

__all__ = ["convert_marian_checkpoint", "marian_to_vaswani", "torch_transformer_to_vaswani"]
