"""bf16 training with fp32 master weights: the fast training path on CPUs with AMX (and on GPUs).

`torch.autocast("cpu", torch.bfloat16)` keeps fp32 weights and casts them, and many activations, at every op;
on a 2-core Sapphire Rapids it made Marian's training step 0.95x its fp32 speed. Here the model itself is bf16
(weights, activations, gradients: every matrix product runs on the bf16 AMX/AVX-512 kernels, no casts), while
the optimizer keeps fp32 master copies of the weights and its Adam moments in fp32, so small updates are not
lost to bf16 rounding (Micikevicius et al., 2018). The loss is computed in fp32 (`translation_loss` upcasts the
logits) and attention runs in fp32 on CPU (`VaswaniMultiHeadAttention`), where torch's bf16 flash-attention
backward is slower than fp32.

    model = VaswaniForConditionalGeneration(config).to(torch.bfloat16)
    optimizer = MasterWeightAdamW(model.parameters(), lr=..., betas=(0.9, 0.98), eps=1e-9)
    ... loss.backward(); optimizer.step(); optimizer.zero_grad()
    optimizer.copy_master_weights_to(model.float())  # fp32 weights for saving and inference

`vaswani train --bf16_weights` does all of this inside `VaswaniTrainer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW (with weight_decay=0: the paper's Adam) that updates fp32 master copies of low-precision parameters.

    `step()` upcasts the model's gradients into the masters, steps, and writes the rounded masters back into the
    model. `state_dict()` carries the masters, so a resumed run continues from the exact fp32 weights.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter] | Iterable[dict], **kwargs):
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.model_params: list[torch.nn.Parameter] = []
        master_groups = []
        for group in groups:
            model_params = [p for p in group["params"] if p.requires_grad]
            self.model_params += model_params
            masters = [p.detach().to(torch.float32, copy=True) for p in model_params]
            master_groups.append({**group, "params": masters})
        super().__init__(master_groups, **kwargs)

    @property
    def master_params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        for param, master in zip(self.model_params, self.master_params, strict=True):
            master.grad = None if param.grad is None else param.grad.to(torch.float32)
        loss = super().step(closure)
        torch._foreach_copy_(self.model_params, self.master_params)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.model_params:
            param.grad = None
        super().zero_grad(set_to_none)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["master_weights"] = [m.detach().clone() for m in self.master_params]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        masters = state_dict.pop("master_weights", None)
        super().load_state_dict(state_dict)
        if masters is not None:
            with torch.no_grad():
                for master, saved in zip(self.master_params, masters, strict=True):
                    master.copy_(saved)
                torch._foreach_copy_(self.model_params, self.master_params)

    @torch.no_grad()
    def copy_master_weights_to(self, model: torch.nn.Module) -> torch.nn.Module:
        """Write the fp32 masters into `model` (call `model.float()` first to keep them at full precision)."""
        by_id = {id(p): i for i, p in enumerate(self.model_params)}
        masters = self.master_params
        for param in model.parameters():
            if id(param) in by_id:
                param.copy_(masters[by_id[id(param)]])
        return model
