"""The training recipe on Seq2SeqTrainer: schedule, token-budget batches, gradient accumulation, checkpoint
averaging, resume, and data readers. In-process, on the tiny preset."""

import importlib.util
import json
import os
import signal

import numpy as np
import pytest
import torch
from transformers import DataCollatorForSeq2Seq, TrainerCallback, get_scheduler

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.data.batching import BatchRows, PadPairs, TokenBudgetBatchSampler
from vaswani_hf.data.number_words import number_pairs
from vaswani_hf.data.readers import load_split
from vaswani_hf.data.tokenization import train_shared_bpe
from vaswani_hf.training.averaging import (
    STOP_MARKER,
    average_checkpoints,
    last_checkpoints,
    list_checkpoints,
    load_weights,
)
from vaswani_hf.training.recipe import DataArguments, ModelArguments, VaswaniTrainingArguments, build_trainer, train
from vaswani_hf.training.stopping import GracefulStopCallback
from vaswani_hf.training.trainer import STAGING_DIR, noam_learning_rate

from .helpers import TINY_RUN, vaswani

PAIRS = {"train": number_pairs(96, seed=0), "val": number_pairs(9, seed=1)}


@pytest.fixture(scope="module")
def tokenizer():
    return train_shared_bpe((t for pair in PAIRS["train"] for t in pair), vocab_size=120)


def make_trainer(tokenizer, output_dir, callbacks=None, dropout=0.1, **overrides):
    args = {"output_dir": str(output_dir), "max_steps": 6, "warmup_steps": 3, "max_tokens": 160, "seed": 3,
            "save_strategy": "no", "report_to": "none", "disable_tqdm": True, "logging_steps": 1,
            "use_cpu": True, **overrides}  # fmt: skip
    return build_trainer(PAIRS, DataArguments(max_length=64), ModelArguments(preset="tiny", dropout=dropout),
                         VaswaniTrainingArguments(**args), tokenizer, callbacks=callbacks)  # fmt: skip


# --- section 5.3: the learning-rate schedule ---------------------------------------------------------------


@pytest.mark.parametrize("warmup, steps", [(3, 6), (0.5, 6)])  # steps, and Transformers' ratio of the updates
def test_a_hand_built_trainer_gets_the_papers_peak_and_learns(tokenizer, tmp_path, warmup, steps):
    """As a Seq2SeqTrainer user builds it, without build_trainer: learning_rate 0 is the Noam peak for the warmup
    the run resolves (3 updates either way), so the model changes; it ran at lr 0 and learned nothing."""
    from vaswani_hf.data.prepared import InMemoryData
    from vaswani_hf.training.trainer import VaswaniTrainer

    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=len(tokenizer)))
    data = InMemoryData(PAIRS, tokenizer, "train", 64)
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), max_steps=steps, warmup_steps=warmup, max_tokens=0,
                                    per_device_train_batch_size=8, report_to="none", save_strategy="no",
                                    logging_steps=1, use_cpu=True, disable_tqdm=True)  # fmt: skip
    trainer = VaswaniTrainer(model=model, args=args, train_dataset=data.tokens("train"),
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))  # fmt: skip
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.train()
    d_model = model.config.d_model
    assert args.learning_rate == pytest.approx(noam_learning_rate(3, d_model, 3), rel=1e-9)
    rates = [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]
    assert rates and all(rate > 0 for rate in rates)
    changed = sum(not torch.equal(p, start[name]) for name, p in model.named_parameters())
    assert changed == len(start)


def test_a_trainer_for_a_model_without_d_model_asks_for_a_learning_rate(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    from vaswani_hf.training.trainer import VaswaniTrainer

    model = BertForMaskedLM(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                       intermediate_size=8, vocab_size=20))  # fmt: skip
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), max_steps=1, max_tokens=0, report_to="none",
                                    use_cpu=True)  # fmt: skip
    trainer = VaswaniTrainer(model=model, args=args)
    with pytest.raises(ValueError, match="give --learning_rate"):
        trainer.create_optimizer_and_scheduler(num_training_steps=1)


def test_schedule_follows_the_paper_formula_from_the_first_update(tokenizer, tmp_path):
    warmup, d_model = 10, VaswaniConfig.tiny().d_model
    trainer = make_trainer(tokenizer, tmp_path, warmup_steps=warmup, max_steps=4 * warmup)
    trainer.create_optimizer_and_scheduler(num_training_steps=4 * warmup)
    seen = {}
    for step in range(1, 4 * warmup + 1):
        seen[step] = trainer.optimizer.param_groups[0]["lr"]  # the rate the update numbered `step` runs at
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    for step in (1, warmup, 4 * warmup):
        assert seen[step] == pytest.approx(noam_learning_rate(step, d_model, warmup), rel=1e-9)
    # Trainer's own inverse_sqrt is the same curve one update late: its first update runs at lr 0.
    hf = get_scheduler("inverse_sqrt", torch.optim.SGD([torch.zeros(1)], lr=seen[warmup]), num_warmup_steps=warmup)
    hf_lrs = []
    for _ in range(4 * warmup + 1):
        hf_lrs.append(hf.get_last_lr()[0])
        hf.optimizer.step()
        hf.step()
    assert hf_lrs[0] == 0
    for step in (1, warmup, 4 * warmup):
        assert hf_lrs[step] == pytest.approx(seen[step], rel=1e-9)


# --- section 5.1: token-budget batches ----------------------------------------------------------------------


def test_batches_respect_the_token_budget_and_cover_every_pair_once():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 60, 500), rng.integers(1, 60, 500)
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=200, seed=1)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(500))
        for batch in batches:
            assert len(batch) * src[batch].max() <= 200 and len(batch) * tgt[batch].max() <= 200
        mean_fill = np.mean([len(b) * np.maximum(src[b], tgt[b]).max() for b in batches])
        assert mean_fill > 150  # packed, not one pair per batch
    sampler.set_epoch(0)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first  # reshuffled each epoch...
    sampler.set_epoch(0)
    assert list(sampler) == first  # ...and reproducible, which resuming relies on


def test_a_pair_longer_than_the_budget_is_a_clear_error():
    with pytest.raises(ValueError, match="1 training pairs are longer than --max_tokens=10"):
        TokenBudgetBatchSampler([3, 12], [3, 4], max_tokens=10)


def test_trainer_feeds_token_budget_batches(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, max_tokens=120)
    loader = trainer.get_train_dataloader()
    sizes = [batch["input_ids"].numel() for batch in loader]
    assert len(sizes) == len(loader) > 1 and max(sizes) <= 120
    assert sum(len(b) for b in trainer.token_sampler) == len(trainer.train_dataset)


def test_batch_rows_make_the_seq2seq_collators_tensors(tokenizer, tmp_path):
    from transformers import DataCollatorForSeq2Seq

    from vaswani_hf.training.training_speed import BucketPadding

    trainer = make_trainer(tokenizer, tmp_path)
    model, dataset = trainer.model, trainer.train_dataset
    dataset = dataset.select(np.random.default_rng(0).permutation(len(dataset)))  # an indices mapping over the table
    rows, pad = BatchRows(dataset), PadPairs(model.config.pad_token_id, model.config.decoder_start_token_id)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    bucketed = [BucketPadding(c, [8, 16, 32, 64], 256, model.config.pad_token_id) for c in (pad, collator)]
    for indices in ([0], [5, 1, 77, 30], list(range(40, 70))):
        ours, theirs = pad(rows.__getitems__(indices)), collator(dataset.__getitems__(indices))
        assert ours.keys() == theirs.keys() == {"input_ids", "attention_mask", "labels", "decoder_input_ids"}
        for name in ours:
            assert ours[name].dtype == theirs[name].dtype and torch.equal(ours[name], theirs[name]), name
        ours, theirs = bucketed[0](rows.__getitems__(indices)), bucketed[1](dataset.__getitems__(indices))
        assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
    with pytest.raises(ValueError, match="no labels column"):
        BatchRows(dataset.remove_columns("labels"))


def test_batch_rows_on_and_off_train_alike(tokenizer, tmp_path, device):
    """--batch_rows false (Transformers' collator, row by row) and the default give the same batches and losses."""
    runs = {}
    for batch_rows in (True, False):
        trainer = make_trainer(tokenizer, tmp_path / str(batch_rows), max_tokens=120, batch_rows=batch_rows,
                               use_cpu=device == "cpu")  # fmt: skip
        loader = trainer.get_train_dataloader()
        assert isinstance(loader.dataset, BatchRows) is batch_rows
        batches = [{k: v.cpu() for k, v in batch.items()} for batch in loader]
        trainer.train()
        runs[batch_rows] = batches, [log["loss"] for log in trainer.state.log_history if "loss" in log]
    (fast, fast_losses), (plain, plain_losses) = runs[True], runs[False]
    # the loader's defaults: 2 processes reading ahead into pinned memory on a GPU, the main process on a CPU
    on_gpu = device == "cuda"
    assert trainer.args.dataloader_num_workers == (2 if on_gpu else 0)
    assert trainer.args.accelerator_config.non_blocking is on_gpu and (trainer.args.dataloader_pin_memory or not on_gpu)
    ahead = [{k: v.cpu() for k, v in batch.items()} for batch in make_trainer(
        tokenizer, tmp_path / "ahead", max_tokens=120, dataloader_num_workers=1).get_train_dataloader()]  # fmt: skip
    assert len(fast) == len(plain) == len(ahead) > 1 and len(fast_losses) == 6
    for ours, theirs, worker in zip(fast, plain, ahead, strict=True):
        assert ours.keys() == theirs.keys() == worker.keys()
        assert all(torch.equal(ours[k], theirs[k]) and torch.equal(ours[k], worker[k]) for k in ours)
    assert fast_losses == (plain_losses if device == "cpu" else pytest.approx(plain_losses, rel=1e-5))


# --- section 5.1: the shared BPE vocabulary -------------------------------------------------------------------

TRICKY = ['Ein Mann (im T-Shirt) sagt: "Hallo!" ... geht\'s?', "two  spaces, tab\tand\u00e4 umlaut.", "a,b"]


@pytest.mark.parametrize("split", [True, False])
def test_decoding_gives_back_the_text_exactly(split):
    tokenizer = train_shared_bpe(TRICKY * 20, vocab_size=200, split_punctuation=split)
    for text in TRICKY:
        assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text


def test_punctuation_gets_vocabulary_entries_of_its_own():
    texts = ["Ein Mann spielt Gitarre.", "Eine Frau, ein Mann."] * 50
    marked = {split: [t for t in train_shared_bpe(texts, 200, split_punctuation=split).get_vocab()
                      if len(t.strip("\u2581")) > 1 and t[-1] in ".,"] for split in (True, False)}  # fmt: skip
    assert marked[True] == [] and "\u2581Gitarre." in marked[False]


def test_bpe_dropout_resegments_every_draw_and_keeps_the_text(tokenizer):
    from vaswani_hf.data.tokenization import BPEDropoutPairs

    pairs = PAIRS["train"][:20]
    plain = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs])
    almost_off = BPEDropoutPairs(pairs, tokenizer, 1e-9)
    assert [almost_off[i]["input_ids"] for i in range(20)] == plain["input_ids"]
    assert [almost_off[i]["labels"] for i in range(20)] == plain["labels"]
    dropped = BPEDropoutPairs(pairs, tokenizer, 0.5)
    draws = [dropped[0]["labels"] for _ in range(10)]
    assert len({tuple(d) for d in draws}) > 1 and max(map(len, draws)) > len(plain["labels"][0])
    assert {tokenizer.decode(d, skip_special_tokens=True) for d in draws} == {pairs[0][1]}
    assert tokenizer.decode(tokenizer(pairs[0][1])["input_ids"]) == tokenizer.decode(almost_off[0]["labels"])


def test_bpe_dropout_trains_on_every_kept_pair_and_refuses_bad_settings(tokenizer, tmp_path):
    from vaswani_hf.data.tokenization import BPEDropoutPairs

    args = {"output_dir": str(tmp_path), "max_tokens": 160, "report_to": "none", "use_cpu": True}
    trainer = build_trainer(PAIRS, DataArguments(max_length=64, bpe_dropout=0.1), ModelArguments(preset="tiny"),
                            VaswaniTrainingArguments(**args), tokenizer)  # fmt: skip
    assert isinstance(trainer.train_dataset, BPEDropoutPairs) and len(trainer.train_dataset) == len(PAIRS["train"])
    batches = list(trainer.get_train_dataloader())
    assert sum(len(b["input_ids"]) for b in batches) == len(PAIRS["train"])
    with pytest.raises(ValueError, match=r"--bpe_dropout=1.0: .* must lie in \(0, 1\)"):
        BPEDropoutPairs(PAIRS["train"], tokenizer, 1.0)
    with pytest.raises(ValueError, match="--bpe_dropout needs a BPE tokenizer"):
        BPEDropoutPairs(PAIRS["train"], object(), 0.1)  # e.g. a fine-tuned Marian checkpoint's SentencePiece


# --- gradient accumulation ----------------------------------------------------------------------------------


class RecordFirstUpdate(TrainerCallback):
    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            self.grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_accumulating_two_half_batches_equals_one_full_batch(tokenizer, tmp_path):
    """Trainer passes num_items_in_batch; the loss is sum / items, so 2 x B/2 is 1 x B (padding differs)."""
    results = []
    for batch, accumulation in ((16, 1), (8, 2)):
        record = RecordFirstUpdate()
        trainer = make_trainer(tokenizer, tmp_path / str(batch), [record], dropout=0.0, max_tokens=0, max_steps=1,
                               per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                               train_sampling_strategy="sequential")  # fmt: skip
        trainer.train()
        results.append((trainer.state.log_history[0]["loss"], record.grads))
    (loss_full, grads_full), (loss_half, grads_half) = results
    assert loss_half == pytest.approx(loss_full, abs=1e-5)
    for name, grad in grads_full.items():
        torch.testing.assert_close(grads_half[name], grad, atol=1e-5, rtol=1e-4, msg=name)


# --- section 6.1: checkpoint averaging ----------------------------------------------------------------------


def test_averaging_equals_the_mean_of_the_weights(tmp_path, tokenizer):
    config = VaswaniConfig.tiny(vocab_size=len(tokenizer))
    models = []
    for step in (1, 2, 3):
        torch.manual_seed(step)
        model = VaswaniForConditionalGeneration(config)
        model.save_pretrained(tmp_path / f"checkpoint-{step}")
        models.append(model)
    tokenizer.save_pretrained(tmp_path / "checkpoint-3")
    (tmp_path / f"{STAGING_DIR}").mkdir()  # an unfinished save is never averaged
    checkpoints = list_checkpoints(tmp_path)
    assert [c.name for c in checkpoints] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    out = average_checkpoints(checkpoints[-2:], tmp_path / "avg")
    averaged = VaswaniForConditionalGeneration.from_pretrained(out)
    states = [m.state_dict() for m in models[1:]]
    for name, value in averaged.state_dict().items():
        torch.testing.assert_close(value, (states[0][name] + states[1][name]) / 2, msg=name)
    assert averaged.lm_head.weight.data_ptr() == averaged.model.shared.weight.data_ptr()  # still tied
    assert (out / "tokenizer.json").is_file() and json.loads((out / "averaged_from.json").read_text())[-1].endswith(
        "checkpoint-3"
    )


def test_averaging_reports_a_truncated_checkpoint(tmp_path):
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny())
    for step in (1, 2):
        model.save_pretrained(tmp_path / f"checkpoint-{step}")
    weights = tmp_path / "checkpoint-1" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match="checkpoint-1: cannot read the weights.*truncated or corrupt"):
        average_checkpoints(list_checkpoints(tmp_path), tmp_path / "avg")


# --- resume --------------------------------------------------------------------------------------------------


class Crash(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 4:
            raise KeyboardInterrupt  # the machine went away after checkpoint-3, mid-way to the next one


def test_resume_after_an_interruption_reaches_the_same_weights(tokenizer, tmp_path):
    """Token-budget batches, dropout and Adam state: an interrupted + resumed run equals an uninterrupted one."""
    settings = {"max_steps": 6, "save_strategy": "steps", "save_steps": 3, "max_tokens": 500}
    whole = make_trainer(tokenizer, tmp_path / "whole", **settings)
    train(whole)
    interrupted = make_trainer(tokenizer, tmp_path / "cut", [Crash()], **settings)
    with pytest.raises(KeyboardInterrupt):
        train(interrupted)
    assert [c.name for c in list_checkpoints(tmp_path / "cut")] == ["checkpoint-3"]
    resumed = make_trainer(tokenizer, tmp_path / "cut", **settings)
    stats = train(resumed, resume=True)
    assert stats["steps"] == 6 and stats["resumed_from"].endswith("checkpoint-3")
    assert len(resumed.get_train_dataloader()) in (4, 5)  # resumed mid-epoch, then crossed into the next epoch
    expected, got = load_weights(tmp_path / "whole"), load_weights(tmp_path / "cut")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)


def test_averaging_after_training_loads_the_averaged_model(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, max_steps=4, save_strategy="steps", save_steps=1, average_last=2)
    stats = train(trainer)
    assert stats["averaged"] == ["checkpoint-3", "checkpoint-4"]
    last, before = load_weights(tmp_path / "checkpoint-4"), load_weights(tmp_path / "checkpoint-3")
    final = load_weights(tmp_path)
    name = "model.encoder.layers.0.feed_forward.fc1.weight"
    torch.testing.assert_close(final[name], (last[name] + before[name]) / 2)
    torch.testing.assert_close(trainer.model.state_dict()[name], final[name])


def test_averaging_fewer_checkpoints_than_asked_says_so(tokenizer, tmp_path, caplog):
    trainer = make_trainer(tokenizer, tmp_path, max_steps=4, save_strategy="steps", save_steps=2, average_last=5)
    assert train(trainer)["averaged"] == ["checkpoint-2", "checkpoint-4"]
    assert "--average_last 5: the run wrote 2 checkpoint(s), so the final model averages 2" in caplog.text


class SignalAfter(TrainerCallback):
    """What SIGTERM during update `step` does, without sending one: the stop callback sees it after that update."""

    def __init__(self, stop: GracefulStopCallback, step: int) -> None:
        self.stop, self.step = stop, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.stop.signal = signal.SIGTERM


@pytest.mark.parametrize("stop_at", [5, 4])  # off the save schedule (every 2), and on it
def test_a_stopped_and_resumed_run_averages_what_an_uninterrupted_one_does(tokenizer, tmp_path, stop_at):
    settings = {"max_steps": 8, "save_strategy": "steps", "save_steps": 2, "average_last": 3, "max_tokens": 500}
    stop = GracefulStopCallback()
    assert train(make_trainer(tokenizer, tmp_path, [SignalAfter(stop, stop_at), stop], **settings))["averaged"] == []
    marked = [c.name for c in list_checkpoints(tmp_path) if (c / STOP_MARKER).is_file()]
    assert marked == ([] if stop_at == 4 else ["checkpoint-5"])
    # still stopped: its latest checkpoint is the run's newest weights and counts
    assert last_checkpoints(tmp_path, 3, "--last")[-1].name == f"checkpoint-{stop_at}"
    resumed = make_trainer(tokenizer, tmp_path, [GracefulStopCallback()], **settings)
    assert train(resumed, resume=True)["averaged"] == ["checkpoint-4", "checkpoint-6", "checkpoint-8"]


def test_evaluation_scores_every_example_once_against_raw_references(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, max_steps=1, per_device_eval_batch_size=4)
    metrics = trainer.predict(trainer.eval_dataset, metric_key_prefix="val", max_new_tokens=4).metrics
    assert metrics["val_samples"] == len(PAIRS["val"]) == 9 and "val_bleu" in metrics
    assert sorted(trainer.compute_metrics.references) == sorted(t for _, t in PAIRS["val"])


# --- data readers -------------------------------------------------------------------------------------------


def test_tsv_and_jsonl_folders_read_the_same_pairs(tmp_path):
    pairs = [("one", "eins"), ("two , three", "zwei , drei")]
    (tmp_path / "train.tsv").write_text("".join(f" {s}\t{t} \n" for s, t in pairs) + "\n", encoding="utf-8")
    (tmp_path / "val.jsonl").write_text(
        "\n".join(json.dumps({"translation": {"en": s, "de": t}}) for s, t in pairs), encoding="utf-8"
    )
    assert load_split(str(tmp_path), "train", "en", "de") == pairs
    assert load_split(str(tmp_path), "val", "en", "de") == pairs
    with pytest.raises(ValueError, match="no 'en' and 'fr' fields"):
        load_split(str(tmp_path), "val", "en", "fr")


def test_a_datasets_folder_loads_like_a_hub_dataset(tmp_path):
    os.makedirs(tmp_path / "ds")
    rows = [{"translation": {"en": "one", "de": "eins"}}, {"translation": {"en": " ", "de": "leer"}}]
    (tmp_path / "ds" / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    assert load_split(str(tmp_path / "ds"), "train", "en", "de", hub=True) == [("one", "eins")]


def test_overlong_training_pairs_are_dropped_and_counted(tokenizer, caplog):
    from vaswani_hf.training.recipe import tokenize_pairs

    pairs = [("one", "eins"), (" , ".join(["seven hundred seventy-seven"] * 20), "x")]
    dataset = tokenize_pairs(pairs, tokenizer, max_length=32)
    assert len(dataset) == 1 and "dropped 1 of 2 training pairs longer than --max_length=32" in caplog.text
    assert len(tokenize_pairs(pairs, tokenizer)) == 2  # evaluation sets keep everything


def test_config_overrides_set_fields_and_paper_symbols_and_refuse_typos():
    from vaswani_hf.training.recipe import ModelArguments, build_model

    tokenizer = train_shared_bpe(["one two three", "eins zwei drei"], 60)
    model = build_model(ModelArguments(preset="small", config_overrides="N=2,d_model=64,d_ff=128,h=2,"
                                       "position_embedding_type=learned,P_drop=0.3"), tokenizer)  # fmt: skip
    config = model.config
    assert (config.encoder_layers, config.decoder_layers, config.d_model, config.encoder_ffn_dim) == (2, 2, 64, 128)
    assert (config.encoder_attention_heads, config.position_embedding_type, config.dropout) == (2, "learned", 0.3)
    with pytest.raises(ValueError, match="d_modl is not a VaswaniConfig field"):
        build_model(ModelArguments(preset="small", config_overrides="d_modl=64"), tokenizer)
    with pytest.raises(ValueError, match="is not NAME=VALUE"):
        build_model(ModelArguments(preset="small", config_overrides="d_model"), tokenizer)


def test_bad_config_overrides_fail_before_the_data_and_the_vocabulary(tmp_path, capsys):
    from vaswani_hf.cli import main

    assert main(["train", "--config_overrides", "P_drop=1.5", "--output_dir", str(tmp_path / "run")]) == 2
    assert "`dropout` must be a number in [0, 1), got 1.5" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # no BPE trained, nothing written


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            ["--save_strategy", "no"],
            "--average_last 3 averages the run's last 3 checkpoints, but --save_strategy is 'no'",
        ),
        (["--save_total_limit", "2"], "--save_total_limit 2 deletes checkpoints that --average_last 3 needs"),
    ],
)
def test_averaging_that_would_find_no_checkpoints_is_refused(tmp_path, capsys, settings, message):
    from vaswani_hf.cli import main

    argv = ["train", "--data", str(tmp_path), "--average_last", "3", *settings, "--output_dir", str(tmp_path / "run")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_attn_implementation_reaches_the_model_and_changes_no_numbers(implementation):
    from vaswani_hf.training.recipe import ModelArguments, build_model

    tokenizer = train_shared_bpe(["one two three", "eins zwei drei"], 60)
    torch.manual_seed(0)
    reference = build_model(ModelArguments(preset="tiny"), tokenizer).eval()
    torch.manual_seed(0)
    model = build_model(ModelArguments(preset="tiny", attn_implementation=implementation), tokenizer).eval()
    assert model.config._attn_implementation == implementation
    ids = torch.tensor([[5, 6, 7, 2], [5, 6, 2, 0]])
    mask, labels = (ids != 0).long(), torch.tensor([[8, 9, 2], [8, 2, -100]])
    torch.testing.assert_close(model(ids, attention_mask=mask, labels=labels).logits,
                               reference(ids, attention_mask=mask, labels=labels).logits)  # fmt: skip


def test_an_unknown_attn_implementation_is_refused_by_name():
    from vaswani_hf.training.recipe import ModelArguments, build_model

    tokenizer = train_shared_bpe(["one two three", "eins zwei drei"], 60)
    with pytest.raises(ValueError, match="flashy"):
        build_model(ModelArguments(preset="tiny", attn_implementation="flashy"), tokenizer)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn is installed here")
def test_a_missing_attention_kernel_is_a_clear_error_before_the_data(tmp_path):
    result = vaswani("train", *TINY_RUN, "--attn_implementation", "flash_attention_2", "--output_dir",
                     str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "--attn_implementation flash_attention_2" in result.stderr and "use sdpa" in result.stderr
    assert not (tmp_path / "run" / "tokenizer.json").exists()  # refused before the BPE was trained


# --- a long CPU run's memory (training/memory.py) --------------------------------------------------------------


def test_a_cpu_run_hands_glibcs_free_pages_back_on_schedule(tokenizer, tmp_path, monkeypatch):
    import sys

    from vaswani_hf.training import memory

    calls = []
    monkeypatch.setattr(memory, "glibc_trim", lambda: calls.append)
    trainer = make_trainer(tokenizer, tmp_path, max_steps=6)
    [trim] = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, memory.MallocTrimCallback)]
    trim.every = 2
    trainer.train()
    assert calls == [0, 0, 0] and trim.trims == 3  # after updates 2, 4 and 6
    # the real one, where the C library is glibc; off by the switch, and never on a GPU
    monkeypatch.undo()
    if sys.platform.startswith("linux") and memory.glibc_trim() is not None:
        assert memory.glibc_trim()(0) in (0, 1)
    monkeypatch.setenv("VASWANI_MALLOC_TRIM", "0")
    assert memory.glibc_trim() is None and memory.memory_callbacks(torch.device("cpu")) == []
    monkeypatch.delenv("VASWANI_MALLOC_TRIM")
    assert memory.memory_callbacks(torch.device("meta")) == []
