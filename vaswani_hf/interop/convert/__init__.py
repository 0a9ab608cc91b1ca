"""Converters into Vaswani models: trained models from fairseq, FSMT and Marian (`vaswani convert`), and
`torch.nn.Transformer`, one of the peers we prove parity against."""

from .fairseq import FairseqArchiveError, convert_fairseq_checkpoint
from .fsmt import convert_fsmt_checkpoint, fsmt_to_vaswani
from .marian import convert_marian_checkpoint, marian_to_vaswani
from .torch_transformer import torch_transformer_to_vaswani

__all__ = [
    "FairseqArchiveError",
    "convert_fairseq_checkpoint",
    "convert_fsmt_checkpoint",
    "convert_marian_checkpoint",
    "fsmt_to_vaswani",
    "marian_to_vaswani",
    "torch_transformer_to_vaswani",
]
