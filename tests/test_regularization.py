"""The opt-in regularizers of training/regularization.py. R-Drop: its loss as the paper defines it, computed here
independently with `F.kl_div` on the logits of the two dropout passes, and what a run with it does. Token drop on
the source: which tokens it replaces and how often, and that a training step's loss is the loss on the dropped
source."""

import pytest
import torch
from torch.nn import functional as F

from vaswani_hf.training.regularization import drop_source_tokens, r_drop_loss

from .test_recipe import make_trainer, tokenizer  # noqa: F401 (a fixture)


def training_batch(trainer, rows: int = 4) -> dict:
    loader = trainer.get_train_dataloader()
    batch = next(iter(loader))
    return {name: value[:rows] for name, value in batch.items()}


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_r_drop_adds_the_symmetric_kl_of_two_dropout_passes_to_their_cross_entropies(tokenizer, tmp_path,  # noqa: F811
                                                                                      label_smoothing):  # fmt: skip
    trainer = make_trainer(tokenizer, tmp_path, dropout=0.3)
    model = trainer.model.train()
    batch = {**training_batch(trainer), "label_smoothing": label_smoothing}
    captured = {}
    model.lm_head.register_forward_hook(lambda module, args, output: captured.setdefault("logits", output))
    alpha = 0.7
    loss, _ = r_drop_loss(model, batch, alpha)
    first, second = captured["logits"].float().chunk(2)
    labels = batch["labels"]
    keep = labels != -100
    tokens = keep.sum()
    cross_entropy = [F.cross_entropy(x[keep], labels[keep], label_smoothing=label_smoothing) for x in (first, second)]
    p, q = first.log_softmax(-1)[keep], second.log_softmax(-1)[keep]
    kl = F.kl_div(q, p, log_target=True, reduction="sum") + F.kl_div(p, q, log_target=True, reduction="sum")
    # the paper's NLL_1 + NLL_2 + alpha / 2 * (KL_12 + KL_21), halved
    expected = (cross_entropy[0] + cross_entropy[1]) / 2 + alpha / 4 * kl / tokens
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    assert kl > 0  # dropout made the two passes differ


def test_without_dropout_r_drop_is_the_plain_loss(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, dropout=0.0)
    model = trainer.model.train()
    batch = training_batch(trainer)
    loss, _ = r_drop_loss(model, batch, alpha=5.0)
    torch.testing.assert_close(loss, model(**batch).loss, atol=1e-6, rtol=1e-6)


def test_the_trainer_steps_on_r_drops_loss_and_a_run_trains(tokenizer, tmp_path):  # noqa: F811
    from vaswani_hf.training.recipe import train

    trainer = make_trainer(tokenizer, tmp_path, dropout=0.3, r_drop_alpha=1.0)
    model = trainer.model.train()
    batch = training_batch(trainer)
    torch.manual_seed(0)
    expected, _ = r_drop_loss(model, {**batch, "label_smoothing": trainer.args.label_smoothing_factor}, 1.0)
    torch.manual_seed(0)
    torch.testing.assert_close(trainer.compute_loss(model, batch), expected)
    train(trainer)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == trainer.args.max_steps and all(0 < x < 20 for x in losses)


def test_a_negative_alpha_is_refused(tmp_path):
    from vaswani_hf.training.trainer import VaswaniTrainingArguments

    with pytest.raises(ValueError, match="r_drop_alpha must be 0"):
        VaswaniTrainingArguments(output_dir=str(tmp_path), r_drop_alpha=-1.0, use_cpu=True, report_to=[])


# --- token drop on the source -----------------------------------------------------------------------------


def test_token_drop_replaces_other_tokens_by_unk_at_its_rate_and_keeps_padding_and_eos():
    torch.manual_seed(0)
    pad, eos, unk = 0, 2, 3
    input_ids = torch.randint(4, 100, (200, 500))
    input_ids[:, -1], input_ids[:100, -50:] = eos, pad
    dropped = drop_source_tokens(input_ids, 0.25, unk, [pad, eos])
    kept = torch.isin(input_ids, torch.tensor([pad, eos]))
    assert torch.equal(dropped[kept], input_ids[kept])
    changed = dropped != input_ids
    assert (dropped[changed] == unk).all()
    assert changed[~kept].float().mean().item() == pytest.approx(0.25, abs=0.005)  # ~95,000 droppable tokens
    assert torch.equal(drop_source_tokens(input_ids, 0.0, unk, [pad, eos]), input_ids)


def test_a_training_step_with_token_drop_is_the_loss_on_the_dropped_source(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, dropout=0.0, source_token_dropout=0.3)
    model = trainer.model.train()
    batch = training_batch(trainer)
    config = model.config
    smoothed = {**batch, "label_smoothing": trainer.args.label_smoothing_factor}
    torch.manual_seed(0)
    source = drop_source_tokens(
        batch["input_ids"], 0.3, config.unk_token_id, [config.pad_token_id, config.eos_token_id, config.bos_token_id]
    )
    expected = model(**{**smoothed, "input_ids": source}).loss
    torch.manual_seed(0)
    loss = trainer.compute_loss(model, batch)
    torch.testing.assert_close(loss, expected)
    assert (source == config.unk_token_id).any() and not torch.allclose(loss, model(**smoothed).loss)
    model.eval()  # evaluation sees the whole source
    torch.manual_seed(0)
    torch.testing.assert_close(trainer.compute_loss(model, batch), model(**batch).loss)


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_a_token_drop_outside_zero_to_one_is_refused(tmp_path, p):
    from vaswani_hf.training.trainer import VaswaniTrainingArguments

    with pytest.raises(ValueError, match="source_token_dropout must be a probability"):
        VaswaniTrainingArguments(output_dir=str(tmp_path), source_token_dropout=p, use_cpu=True, report_to=[])
