"""Regularizers beyond the paper's (section 5.4 has dropout and label smoothing), opt-in training options for small
data. The paper's recipe is the default: each option here is off unless asked for.

R-Drop (Liang et al., 2021, "R-Drop: Regularized Dropout for Neural Networks"): every pair is run twice through
the model with independent dropout, and the loss adds the symmetric KL divergence between the two predicted
distributions to the two cross-entropies. Per target token, the paper's loss is
    NLL_1 + NLL_2 + (alpha / 2) * (KL(P_1 || P_2) + KL(P_2 || P_1)).
`r_drop_loss` returns half of it (the mean of the two cross-entropies plus alpha / 4 times the two KL terms), so a
run's loss keeps the scale of a plain run's while alpha means what it means in the paper.

Token drop on the source (Zhang et al., 2020, "Token Drop mechanism for Neural Machine Translation"; Sennrich et al.,
2016, dropped whole source words for the same reason): during training, each source token is replaced by a drop
token with probability p, so the model cannot lean on any one source token. Only the replacement is implemented,
not the paper's two auxiliary losses. The drop token is `<unk>`, which subword data almost never contains, so the
vocabulary and a trained model's files stay as they are. Padding and the end-of-sentence token are never dropped.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.utils import ModelOutput

BATCHED = ("input_ids", "attention_mask", "labels", "decoder_input_ids", "decoder_attention_mask")


def r_drop_loss(model: torch.nn.Module, inputs: dict, alpha: float, num_items_in_batch=None):
    """R-Drop's loss for one batch (halved, see the module docstring) and the model's outputs on the doubled batch.

    The two passes run as one forward of the batch stacked twice (independent dropout per row, one call);
    `inputs` may carry `label_smoothing`, which smooths both cross-entropies; `num_items_in_batch` counts one
    pass's target tokens (Trainer's count under gradient accumulation)."""
    doubled = {name: torch.cat([value, value]) if name in BATCHED and value is not None else value
               for name, value in inputs.items()}  # fmt: skip
    labels = inputs["labels"]
    tokens = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum().clamp(min=1)
    outputs = model(**doubled, num_items_in_batch=2 * tokens)
    first, second = outputs.logits.float().chunk(2)
    log_p, log_q = first.log_softmax(-1), second.log_softmax(-1)
    # KL(P || Q) + KL(Q || P) = sum over the vocabulary of (P - Q)(log P - log Q), per target token
    symmetric = ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum(-1)
    symmetric = symmetric.masked_fill(labels.to(symmetric.device) == -100, 0.0).sum()
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.to(symmetric.device)
    return outputs.loss + alpha / 4 * symmetric / tokens, outputs


def drop_source_tokens(input_ids: torch.Tensor, p: float, drop_token_id: int, keep_ids: list[int]) -> torch.Tensor:
    """`input_ids` with each token not in `keep_ids` replaced by `drop_token_id` with probability `p`, independently
    (a new tensor; the batch the loader gave is not changed)."""
    droppable = ~torch.isin(input_ids, torch.tensor(keep_ids, device=input_ids.device))
    dropped = droppable & (torch.rand(input_ids.shape, device=input_ids.device) < p)
    return input_ids.masked_fill(dropped, drop_token_id)


def with_r_drop(model: torch.nn.Module, alpha: float) -> Callable[..., ModelOutput]:
    """`model`'s call as Trainer's `compute_loss` makes it (keyword inputs, `num_items_in_batch` among them), with
    R-Drop's loss as the outputs' `loss`."""

    def call(**inputs) -> ModelOutput:
        num_items_in_batch = inputs.pop("num_items_in_batch", None)
        loss, outputs = r_drop_loss(model, inputs, alpha, num_items_in_batch)
        outputs.loss = loss
        return outputs

    return call
