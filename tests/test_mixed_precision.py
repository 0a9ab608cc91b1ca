"""bf16 weights with fp32 master weights (`vaswani_hf.mixed_precision`)."""

import torch

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.mixed_precision import MasterWeightAdamW

ADAM = dict(lr=1e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)


def test_master_weights_follow_fp32_adam_on_the_same_gradients():
    torch.manual_seed(0)
    fp32 = torch.nn.Linear(8, 4)
    bf16 = torch.nn.Linear(8, 4).to(torch.bfloat16)
    bf16.load_state_dict(fp32.state_dict())
    fp32.load_state_dict(bf16.state_dict())  # both start from the same (bf16-representable) weights
    reference, ours = torch.optim.AdamW(fp32.parameters(), **ADAM), MasterWeightAdamW(bf16.parameters(), **ADAM)
    for _ in range(5):
        grads = [torch.randn_like(p) for p in fp32.parameters()]
        for p, q, g in zip(fp32.parameters(), bf16.parameters(), grads, strict=True):
            p.grad, q.grad = g.clone(), g.to(torch.bfloat16)
        reference.step()
        ours.step()
    for p, master, q in zip(fp32.parameters(), ours.master_params, bf16.parameters(), strict=True):
        assert master.dtype == torch.float32 and q.dtype == torch.bfloat16
        torch.testing.assert_close(master, p, atol=2e-4, rtol=0)  # only the bf16 rounding of the gradients
        torch.testing.assert_close(q, master.to(torch.bfloat16), atol=0, rtol=0)


def test_updates_below_bf16_resolution_are_not_lost():
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    optimizer = MasterWeightAdamW([weight], lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)
    for _ in range(50):  # 50 updates of 1e-4: each is below bf16's spacing at 1.0 (2^-7)
        weight.grad = torch.ones_like(weight)
        optimizer.step()
    assert optimizer.master_params[0][0].item() < 1 - 4e-3
    assert weight[0].item() < 1.0


def test_state_dict_carries_the_master_weights():
    weight = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    optimizer = MasterWeightAdamW([weight], **ADAM)
    weight.grad = torch.full_like(weight, 0.5)
    optimizer.step()
    state = optimizer.state_dict()
    other_weight = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    other = MasterWeightAdamW([other_weight], **ADAM)
    other.load_state_dict(state)
    assert torch.equal(other.master_params[0], optimizer.master_params[0])
    assert torch.equal(other_weight, weight)


def test_bf16_model_trains_and_copies_fp32_masters_back():
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(dropout=0.0)).to(torch.bfloat16).train()
    optimizer = MasterWeightAdamW(model.parameters(), **ADAM)
    source, labels = torch.randint(4, 99, (4, 7)), torch.randint(4, 99, (4, 6))
    losses = []
    for _ in range(20):
        loss = model(input_ids=source, labels=labels).loss
        assert loss.dtype == torch.float32
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0
    optimizer.copy_master_weights_to(model.float())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for param, master in zip(optimizer.model_params, optimizer.master_params, strict=True):
        assert torch.equal(param, master)
