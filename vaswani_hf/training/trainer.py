"""Seq2SeqTrainer with the paper's batching and schedule (section 5), atomic checkpoints and safe stops."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import datasets
import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback
from transformers.trainer_utils import (
    PREFIX_CHECKPOINT_DIR,
    SaveStrategy,
    SchedulerType,
    rotate_checkpoints,
    seed_worker,
)
from transformers.utils import CONFIG_NAME

from ..data.batching import BatchRows, CheckedOnTheHost, PadPairs, TokenBudgetBatchSampler
from ..model.precision import MasterWeightAdamW, Precision, resolve_precision
from ..model.validation_vaswani import batch_checked_on_the_host
from .averaging import list_checkpoints, load_weights
from .memory import memory_callbacks
from .regularization import drop_source_tokens, with_r_drop
from .step_profile import StepProfile
from .stopping import StopWithCheckpoint, last_checkpoint
from .training_speed import (
    BucketPadding,
    CompilePlan,
    CompileWatch,
    Speedups,
    compile_buckets,
    compile_in_place,
    loss_keywords,
    machine_key,
    tf32_products,
    uncompiled,
)

logger = logging.getLogger(__name__)

STAGING_DIR = ".checkpoint-staging"


def noam_learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Section 5.3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), step 1 = the first update."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def _noam_factor(completed_updates: int, warmup_steps: int) -> float:
    # LambdaLR evaluates at the number of completed updates, so the update about to run is that number + 1;
    # the factor scales `learning_rate`, the curve's peak (reached at step = warmup).
    peak = noam_learning_rate(warmup_steps, 1, warmup_steps)
    return noam_learning_rate(completed_updates + 1, 1, warmup_steps) / peak


def _start_loader_process(worker_id: int, then: Callable[[int], None] | None = None) -> None:
    """A loader process leaves SIGINT and SIGTERM to the run. A cluster's scheduler signals every process of a job,
    and a terminal's Ctrl-C the whole foreground group; the run finishes its step, writes a checkpoint and shuts its
    loader processes down (GracefulStopCallback). A loader process that died of the signal first would end the run
    with torch's "DataLoader worker is killed" instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if then is not None:
        then(worker_id)


def _leave_signals_to_the_run(loader: DataLoader) -> DataLoader:
    """The loader, its processes started by `_start_loader_process` before the start function it had. Accelerate's
    prepared loader iterates the DataLoader it wraps (`base_dataloader`): that one starts the processes."""
    iterated = getattr(loader, "base_dataloader", loader)
    start = iterated.worker_init_fn
    if iterated.num_workers and getattr(start, "func", None) is not _start_loader_process:
        iterated.worker_init_fn = partial(_start_loader_process, then=start)
    return loader


@dataclass
class VaswaniTrainingArguments(Seq2SeqTrainingArguments):
    """Seq2SeqTrainingArguments with the paper's optimisation as defaults (section 5.3): Adam(0.9, 0.98, 1e-9),
    warmup 4000 then inverse square root decay, no gradient clipping, token-budget batches (section 5.1).
    `learning_rate` 0 (default) means the Noam peak d_model^-0.5 * warmup^-0.5 (times --lr_scale)."""

    output_dir: str | None = field(default="vaswani-model")
    max_tokens: int = field(
        default=3125,
        metadata={"help": "token budget per batch and process, each side, padded (paper: 25,000 per step on 8 "
                  "GPUs = 3125 each; on fewer, multiply with --gradient_accumulation_steps); 0 = fixed "
                  "--per_device_train_batch_size sentences"},
    )  # fmt: skip
    average_last: int = field(
        default=0, metadata={"help": "average the last N checkpoints into the final model (paper: 5 base, 20 big)"}
    )
    resume: bool = field(default=False, metadata={"help": "continue from the last complete checkpoint"})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "delete an earlier run's output_dir"})
    max_train_minutes: float | None = field(default=None, metadata={"help": "stop (with a checkpoint) after this"})
    precision: str | None = field(
        default=None,
        metadata={"help": "fp32, bf16, or auto: bf16 where the hardware runs it natively (CPUs with AMX-BF16 or "
                  "AVX512-BF16, GPUs with bf16), else fp32 (model/precision.py). bf16 on CPU trains a bf16 model "
                  "with fp32 master weights, on GPU it is autocast; the final model is saved in fp32. Default: "
                  "fp32 (`vaswani train`: auto)", "choices": ["auto", "fp32", "bf16"]},
    )  # fmt: skip
    bf16_weights: bool = field(default=False, metadata={"help": "alias of --precision bf16 (older name)"})
    r_drop_alpha: float = field(
        default=0.0,
        metadata={"help": "R-Drop (Liang et al., 2021): run each batch twice with independent dropout and add alpha "
                  "times the symmetric KL divergence of the two predictions to the loss (training/regularization.py); "
                  "0 = off, the paper's recipe. Costs a second forward and backward of every batch"},
    )  # fmt: skip
    source_token_dropout: float = field(
        default=0.0,
        metadata={"help": "token drop on the source (Zhang et al., 2020): while training, replace each source token "
                  "(not padding or </s>) by <unk> with this probability (training/regularization.py); 0 = off, the "
                  "paper's recipe"},
    )  # fmt: skip
    speedups: str = field(
        default="auto",
        metadata={"help": "auto: on a GPU, measure a few steps and keep what is faster (torch.compile with bucketed "
                  "batches, fused Adam, TF32 for fp32, the loss in chunks; none on a CPU); off; or a comma list of "
                  "compile, fused_adam, tf32, chunked_loss (vaswani_hf.training.training_speed)"},
    )  # fmt: skip
    label_smoothing_factor: float = field(
        default=0.1,
        metadata={"help": "label smoothing of the training loss (paper: 0.1); not saved with the model, and the "
                  "evaluation loss stays plain cross-entropy", "aliases": ["--label_smoothing"]},
    )  # fmt: skip
    learning_rate: float = field(default=0.0)
    lr_scheduler_type: str = field(default="inverse_sqrt")
    warmup_steps: float = field(default=4000)
    adam_beta1: float = field(default=0.9)
    adam_beta2: float = field(default=0.98)
    adam_epsilon: float = field(default=1e-9)
    weight_decay: float = field(default=0.0)
    max_grad_norm: float = field(default=0.0)
    per_device_train_batch_size: int = field(default=64)
    per_device_eval_batch_size: int = field(default=64)
    logging_steps: float = field(default=50)
    save_strategy: str = field(default="steps")
    save_steps: float = field(default=1000)
    predict_with_generate: bool = field(default=True)
    ddp_find_unused_parameters: bool | None = field(default=False)
    batch_rows: bool = field(
        default=True,
        metadata={"help": "read each token batch of a tokenized training set in one gather from its Arrow table and "
                  "pad it in numpy (data/batching.py: the tensors DataCollatorForSeq2Seq makes, in a quarter of its "
                  "host time); false: the data collator, row by row"},
    )  # fmt: skip
    dataloader_num_workers: int = field(
        default=-1,
        metadata={"help": "processes that read and pad batches ahead of the step; -1 (default): 2 when training on "
                  "a GPU, so the card never waits for the host, 0 (the main process) on a CPU, where the step is "
                  "the host's work"},
    )  # fmt: skip
    compile_shapes: int = field(
        default=8,
        metadata={"help": "with --speedups compile: the batch shapes (length buckets) compiled, chosen from the "
                  "corpus's lengths to pad least (training_speed.compile_buckets); fewer compile sooner and pad "
                  "more"},
    )  # fmt: skip
    profile_steps: int = field(
        default=0,
        metadata={"help": "print, after this many updates, where an update's time went: waiting for a batch, "
                  "forward, loss, backward, optimizer, logging, read-backs of device values, batch shapes "
                  "(training/step_profile.py); 0 = off"},
    )  # fmt: skip
    finite_check_steps: int = field(
        default=100,
        metadata={"help": "check that the training loss stayed finite every this many updates and before every log "
                  "and save (the loss is watched on the device, so no update waits for the check); a non-finite "
                  "loss stops the run naming the last good checkpoint, and none is written after it"},
    )  # fmt: skip
    # Our finite check stops the run at a non-finite training loss, so Trainer's filter of such losses never
    # sees one; left on, it reads the loss back from the device after every step, and the host stops feeding it.
    logging_nan_inf_filter: bool = field(default=False)

    def __post_init__(self) -> None:
        # Under torchrun on a machine without GPUs, Accelerate only builds a gloo process group with use_cpu;
        # otherwise every process would silently train alone.
        if not torch.cuda.is_available():
            if self.fsdp or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
                # Accelerate turns FSDP on for GPU-class devices only; on CPU it would quietly run DDP instead, every
                # process holding the whole model. torch's FSDP2 itself shards on CPU (tests/fsdp_cpu.py).
                raise ValueError("FSDP needs GPUs: on CPU, Accelerate runs plain DDP instead (every process holds the "
                                 "whole model). On CPU train with DDP (torchrun --nproc_per_node N -m vaswani_hf.cli "
                                 "train ...), or run FSDP on a GPU machine.")  # fmt: skip
            self.dataloader_pin_memory = False  # pinning needs an accelerator; torch warns on every loader
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                self.use_cpu = True
        on_gpu = torch.cuda.is_available() and not self.use_cpu
        if self.dataloader_num_workers < 0:
            self.dataloader_num_workers = 2 if on_gpu else 0
        self.precision_choice = self._resolve_precision()
        super().__post_init__()
        # pinned batches copy to the card while it computes (Accelerate's send_to_device(non_blocking=True))
        self.accelerator_config.non_blocking |= on_gpu and self.dataloader_pin_memory
        self._check_averaging()
        if self.r_drop_alpha < 0:
            raise ValueError(f"--r_drop_alpha must be 0 (off) or positive (the KL term's weight), got "
                             f"{self.r_drop_alpha}.")  # fmt: skip
        if not 0 <= self.source_token_dropout < 1:
            raise ValueError(f"--source_token_dropout must be a probability in [0, 1) (0 = off), got "
                             f"{self.source_token_dropout}.")  # fmt: skip

    @property
    def sharded(self) -> bool:
        """FSDP or DeepSpeed, asked for here or by `accelerate launch`'s config."""
        launched = any(os.environ.get(f"ACCELERATE_USE_{name}", "false").lower() == "true"
                       for name in ("FSDP", "DEEPSPEED"))  # fmt: skip
        return bool(self.fsdp or self.deepspeed or launched)

    def _check_averaging(self) -> None:
        """`average_last` averages saved checkpoints: refuse settings under which it would silently average none."""
        n = self.average_last
        if n < 0:
            raise ValueError(f"--average_last must be 0 (off) or a number of checkpoints, got {n}.")
        if n and self.save_strategy == SaveStrategy.NO:
            raise ValueError(f"--average_last {n} averages the run's last {n} checkpoints, but --save_strategy is "
                             "'no', so none is written: add --save_strategy steps --save_steps N (the paper wrote "
                             "one every 10 minutes).")  # fmt: skip
        if n and self.save_total_limit is not None and self.save_total_limit < n:
            raise ValueError(f"--save_total_limit {self.save_total_limit} deletes checkpoints that --average_last "
                             f"{n} needs: raise it to at least {n}, or leave it out.")  # fmt: skip

    def _resolve_precision(self) -> Precision:
        """Once per run: the precision asked for (or picked by `auto`), applied as autocast on GPUs
        (Trainer's `bf16`) or as a bf16 model with fp32 master weights on CPU (`bf16_weights`)."""
        autocast = "bf16" if self.bf16 else "fp16" if self.fp16 else None
        requested = self.precision
        if self.bf16_weights:
            if requested not in (None, "auto", "bf16"):
                raise ValueError(f"--bf16_weights is --precision bf16; it contradicts --precision {requested}.")
            requested = "bf16"
        if autocast:
            if requested not in (None, "auto"):
                raise ValueError(f"--{autocast} (Transformers' autocast) and --precision {requested} both choose the "
                                 "precision: keep one.")  # fmt: skip
            return Precision(autocast, f"asked for: --{autocast} autocast")
        if requested is None:
            return Precision("fp32", "the default; --precision auto picks by the hardware")
        device = "cpu" if self.use_cpu or not torch.cuda.is_available() else "cuda"
        choice = resolve_precision(requested, device, training=True)
        if choice.name != "bf16":
            return choice
        self.bf16, self.bf16_weights = device == "cuda", device == "cpu"
        how = "autocast" if self.bf16 else "bf16 weights with fp32 master weights"
        return Precision("bf16", f"{choice.reason}; {how}")


class VaswaniTrainer(Seq2SeqTrainer):
    """Seq2SeqTrainer for the paper's recipe.

    - `args.max_tokens > 0`: token-budget batches (`TokenBudgetBatchSampler`) from the `source_length` and
      `target_length` columns of the training set; 0 keeps Trainer's fixed-size batches.
    - `lr_scheduler_type="inverse_sqrt"` is the paper's formula with `learning_rate` as its peak, counting the
      first update as step 1 (Trainer's own inverse_sqrt runs the first update at lr 0). Other types pass through.
    - Checkpoints are written to a staging folder and renamed into place: a `checkpoint-N` folder is complete.
    - A NaN or infinite loss stops training with the step and a hint instead of training on garbage.
    - `args.label_smoothing_factor` (section 5.4) smooths the training loss only, inside the model's loss (exact
      under gradient accumulation); evaluation loss stays plain cross-entropy, and nothing is written into the
      model's config. (Transformers' own smoother would smooth `eval_loss` too.)
    """

    def __init__(self, model=None, args: VaswaniTrainingArguments | None = None, *rest,
                 train_lengths: tuple[np.ndarray, np.ndarray] | None = None, lr_scale: float = 1.0,
                 **kwargs) -> None:  # fmt: skip
        if not isinstance(args, VaswaniTrainingArguments):
            raise TypeError(f"VaswaniTrainer needs VaswaniTrainingArguments (token budget, label smoothing, "
                            f"precision), got {type(args).__name__}.")  # fmt: skip
        if args.bf16_weights and model is not None:
            model.to(torch.bfloat16)  # see vaswani_hf.model.precision; `train` writes the fp32 master weights back
        super().__init__(model, args, *rest, **kwargs)
        self.label_smoother = None  # ours is the model's loss with `label_smoothing`, see compute_loss
        self.train_lengths = train_lengths
        self.lr_scale = lr_scale  # multiplies the Noam peak where `learning_rate` is 0 (`resolve_learning_rate`)
        self.token_sampler: TokenBudgetBatchSampler | None = None
        self.target_tokens_seen = 0
        # the speed-ups `build_trainer` chose (`training_speed`); none when the trainer is built by hand
        self.speedups: Speedups = getattr(args, "speedups_choice", None) or Speedups(decided=False)
        self.buckets: list[int] | None = None
        self.compile_watch: CompileWatch | None = None
        self.profile = None
        if args.profile_steps:
            self.profile = StepProfile(args.profile_steps, args.device, audit=not self.speedups.compile)
        self.nonfinite = None  # updates with a non-finite loss since the last check, a device tensor
        self.batch_checked = False  # whether the training batches' ids are checked on the host (`_batch_reader`)
        self.checked_step = 0
        if self.speedups.decided:
            self.args.optim = "adamw_torch_fused" if self.speedups.fused_adam else "adamw_torch"
        if self.speedups.compile:
            if not args.max_tokens:
                raise ValueError("--speedups compile pads token-budget batches to a few shapes; give --max_tokens.")
            longest = np.maximum(np.asarray(train_lengths[0]), np.asarray(train_lengths[1]))  # numpy, not per row
            self.buckets = compile_buckets(longest, args.compile_shapes)
            plan = CompilePlan.for_buckets(
                self.buckets, args.max_tokens, machine_key(self.model, args.device, args.precision_choice.name)
            )
            self.compile_watch = CompileWatch(plan, self._say)
            compile_in_place(self.model, len(self.buckets))
        for callback in memory_callbacks(self.args.device):  # a long CPU run's RSS stays flat (memory.py)
            self.add_callback(callback)
        if self.profile is not None:
            self.add_callback(_OptimizerMarks(self.profile))
            if not self.speedups.compile:  # the encoder-decoder's end: forward | output layer and loss
                stack = getattr(self.accelerator.unwrap_model(self.model), "model", None)
                if stack is not None:
                    stack.register_forward_hook(lambda *_: self.profile.mark("output layer and loss"))

    def get_train_dataloader(self) -> DataLoader:
        max_tokens = self.args.max_tokens
        if not max_tokens:  # Trainer's fixed-size batches, their ids checked on the host as the others are
            plain, self.data_collator = (
                self.data_collator,
                CheckedOnTheHost(self.data_collator, self.model.config.vocab_size),
            )
            try:
                loader = super().get_train_dataloader()
            finally:
                self.data_collator = plain
            self.batch_checked = True
            return _leave_signals_to_the_run(loader)
        if self.train_lengths is None:
            raise ValueError("max_tokens needs the training pairs' lengths: pass train_lengths=(sources, targets).")
        start = time.perf_counter()
        self.token_sampler = TokenBudgetBatchSampler(*self.train_lengths, max_tokens=max_tokens, seed=self.args.seed,
                                                     buckets=self.buckets)  # fmt: skip
        if self.args.should_log:
            seconds = time.perf_counter() - start
            print(f"batches: {len(self.train_lengths[0]):,} pairs packed into {len(self.token_sampler):,} batches of "
                  f"at most {max_tokens:,} tokens a side in {seconds:.1f} s", file=sys.stderr)  # fmt: skip
        dataset, collator = self._batch_reader()
        if self.buckets is not None:  # compiled: every batch padded to one of a few shapes
            collator = BucketPadding(collator, self.buckets, max_tokens, self.model.config.pad_token_id)
            if self.compile_watch is not None:
                self._say(self.compile_watch.plan.announcement())
        workers = self.args.dataloader_num_workers
        loader = DataLoader(
            dataset,
            batch_sampler=self.token_sampler,
            collate_fn=collator,
            num_workers=workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers and workers > 0,
            prefetch_factor=self.args.dataloader_prefetch_factor if workers else None,
            worker_init_fn=partial(seed_worker, num_workers=workers, rank=self.args.process_index),
        )
        return _leave_signals_to_the_run(self.accelerator.prepare(loader))

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        return _leave_signals_to_the_run(super().get_eval_dataloader(eval_dataset))

    def get_test_dataloader(self, test_dataset) -> DataLoader:
        return _leave_signals_to_the_run(super().get_test_dataloader(test_dataset))

    def _batch_reader(self) -> tuple[torch.utils.data.Dataset, Callable]:
        """The training set as the loader reads it, and the collator that makes its batches. A tokenized
        `datasets.Dataset` with Transformers' seq2seq collator is read a batch at a time (`BatchRows` + `PadPairs`,
        the same tensors) unless --batch_rows false; any other collator or dataset (BPEDropoutPairs, whose items
        are model inputs) goes through the collator row by row."""
        dataset, collator, config = self.train_dataset, self.data_collator, self.model.config
        self.batch_checked = True  # on the host, here: the model's checks would read back every step
        if not isinstance(dataset, datasets.Dataset):
            return dataset, CheckedOnTheHost(collator, config.vocab_size)
        dataset = self._remove_unused_columns(dataset, description="training")
        default = type(collator) is DataCollatorForSeq2Seq and collator.label_pad_token_id == -100 and not (
            collator.pad_to_multiple_of or collator.max_length) and collator.padding in (True, "longest")  # fmt: skip
        if not (self.args.batch_rows and default and set(dataset.column_names) == {"input_ids", "labels"}):
            return dataset, CheckedOnTheHost(collator, config.vocab_size)
        # on a GPU, lengths padded to a multiple of 8: a few shapes (the allocator's blocks and cuBLAS's kernels are
        # reused), and tensor-core tiles; the padding is masked, so the loss is the same
        multiple = 8 if self.args.device.type == "cuda" and self.buckets is None else 1
        return BatchRows(dataset), PadPairs(config.pad_token_id, config.decoder_start_token_id, multiple,
                                            config.vocab_size)  # fmt: skip

    def _run_epoch(self, model, epoch, *args, **kwargs):
        # Trainer cannot reach a batch sampler behind both a skip wrapper and a DDP shard wrapper on resume;
        # the batch order of an epoch must not depend on how the run got there.
        if self.token_sampler is not None:
            self.token_sampler.set_epoch(epoch)
        return super()._run_epoch(model, epoch, *args, **kwargs)

    def _expect(self, dataset) -> None:
        if hasattr(self.compute_metrics, "expect") and dataset is not None and not isinstance(dataset, dict):
            self.compute_metrics.expect(dataset)

    def evaluate(self, eval_dataset=None, *args, **kwargs):
        self._expect(eval_dataset if eval_dataset is not None else self.eval_dataset)
        return super().evaluate(eval_dataset, *args, **kwargs)

    def predict(self, test_dataset, *args, **kwargs):
        self._expect(test_dataset)
        return super().predict(test_dataset, *args, **kwargs)

    # a function of a batch's source ids giving logits processors for its generation (a parser's TreeConstraint)
    batch_processors = None

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        if self.batch_processors is not None and not prediction_loss_only:
            gen_kwargs = {**getattr(self, "_gen_kwargs", {}), **gen_kwargs,
                          "logits_processor": self.batch_processors(inputs["input_ids"])}  # fmt: skip
        # Seq2SeqTrainer fills the model's generation config with Transformers' defaults (max_length=20) after each
        # batch; the paper's source + 50 limit would then be overridden in the saved config. Keep ours.
        generation_config = copy.deepcopy(self.model.generation_config)
        try:
            # evaluation batches have shapes of their own: a compiled forward would compile each anew
            with uncompiled(self.model) if self.speedups.compile else contextlib.nullcontext():
                return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = generation_config

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        if not self.args.bf16_weights or self.optimizer is not None:
            return super().create_optimizer(model)
        # The model is bf16 (see `vaswani_hf.model.precision`): Adam steps fp32 master copies of its weights.
        model = model or self.model
        decay = set(self.get_decay_parameter_names(model))
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [
            {"params": [p for n, p in named if n in decay], "weight_decay": self.args.weight_decay},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
        ]
        self.optimizer = MasterWeightAdamW(
            [g for g in groups if g["params"]],
            lr=self.args.learning_rate,
            betas=(self.args.adam_beta1, self.args.adam_beta2),
            eps=self.args.adam_epsilon,
        )
        return self.optimizer

    def _save_on_each_node_without_a_shared_folder(self) -> None:
        """Nodes that share no output folder (each writes its own disk) save every checkpoint on every node, as
        `--save_on_each_node` asks: else the others' folders would hold only their processes' random states in the
        staging folder, and a resume there could load no weights. Told by a file the first process writes and
        every process looks for, once, before training."""
        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.args.world_size))
        if self.args.save_on_each_node or local >= self.args.world_size or not torch.distributed.is_initialized():
            return
        folder = Path(self.args.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".shared-folder-probe"
        token = torch.tensor([secrets.randbits(62) if self.args.process_index == 0 else 0], device=self.args.device)
        torch.distributed.broadcast(token, src=0)
        token = str(int(token))
        if self.args.process_index == 0:
            probe.write_text(token)
        self.accelerator.wait_for_everyone()
        unseen = torch.tensor([not (probe.is_file() and probe.read_text() == token)], device=self.args.device)
        torch.distributed.all_reduce(unseen, op=torch.distributed.ReduceOp.MAX)
        self.accelerator.wait_for_everyone()
        if self.args.process_index == 0:
            probe.unlink(missing_ok=True)
        if bool(unseen):
            self.args.save_on_each_node = True
            if self.args.local_process_index == 0:
                logger.warning("the nodes share no output folder (%s): every checkpoint is saved on every node, as "
                               "--save_on_each_node asks, so each node resumes from its own", folder)  # fmt: skip

    def _master_weights(self) -> MasterWeightAdamW | None:
        """The optimizer holding the fp32 masters while the model is their bf16 copy; None otherwise (fp32 runs,
        before training, and after `train()` has handed the masters, or the best checkpoint, back in fp32)."""
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        bf16_copy = self.args.bf16_weights and self.model.dtype != torch.float32
        return optimizer if bf16_copy and isinstance(optimizer, MasterWeightAdamW) else None

    def train(self, *args, **kwargs):
        self._save_on_each_node_without_a_shared_folder()
        with tf32_products(self.speedups.tf32):
            result = super().train(*args, **kwargs)
        if optimizer := self._master_weights():  # save and evaluate the fp32 masters, not their bf16 copy
            optimizer.copy_master_weights_to(self.model.float())
        return result

    def _load_best_model(self) -> None:
        if self.args.bf16_weights:  # the checkpoint holds fp32 master weights (`_save`): load them at full precision
            self.model.float()
        super()._load_best_model()

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        with self._weights_saved_where_asked():
            self._save_weights(output_dir, state_dict)

    @contextlib.contextmanager
    def _weights_saved_where_asked(self):
        """Transformers 5.24's `save_pretrained` writes the weights on global rank 0 alone, whatever the Trainer's
        `should_save`: with `--save_on_each_node` every other node's checkpoints had no weights. A DDP replica is
        whole on every process, so the process that saves writes them."""
        model = self.accelerator.unwrap_model(self.model)
        if not (self.args.save_on_each_node and hasattr(model, "should_save_on_this_rank")):
            yield
            return
        model.should_save_on_this_rank = lambda is_main_process: is_main_process
        try:
            yield
        finally:
            del model.should_save_on_this_rank

    def _save_weights(self, output_dir: str | None, state_dict: dict | None) -> None:
        optimizer = self._master_weights()
        if state_dict is not None or optimizer is None:
            return super()._save(output_dir, state_dict)
        # A bf16-weights run saves its fp32 master weights, as an fp32 run would: checkpoint averaging (section 6.1)
        # then averages the weights Adam stepped, not their bf16 roundings, and a checkpoint loads at full precision.
        super()._save(output_dir, optimizer.full_precision_state_dict(self.accelerator.unwrap_model(self.model)))
        config_file = Path(output_dir or self.args.output_dir) / CONFIG_NAME
        if self.args.should_save and config_file.is_file():  # save_pretrained wrote the bf16 model's dtype
            saved = json.loads(config_file.read_text())
            config_file.write_text(json.dumps({**saved, "dtype": "float32"}, indent=2, sort_keys=True) + "\n")

    def resolve_learning_rate(self, warmup: int, optimizer: torch.optim.Optimizer) -> None:
        """`learning_rate` 0 is the paper's peak (section 5.3), d_model^-0.5 * warmup^-0.5 times `lr_scale`, with
        `warmup` resolved as Transformers resolves `warmup_steps` (steps, or a ratio of the run's updates): here,
        where the run's length is known, so a hand-built trainer gets what `vaswani train` gets."""
        if self.args.learning_rate:
            return
        d_model = getattr(self.accelerator.unwrap_model(self.model).config, "d_model", None)
        if not d_model:
            raise ValueError("learning_rate 0 means the Noam peak d_model^-0.5 * warmup^-0.5, but this model's "
                             "config has no d_model: give --learning_rate.")  # fmt: skip
        self.args.learning_rate = noam_learning_rate(warmup, d_model, warmup, self.lr_scale)
        for group in optimizer.param_groups:
            if not group["lr"]:
                group["lr"] = self.args.learning_rate

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        warmup = max(1, self.args.get_warmup_steps(num_training_steps))
        if self.lr_scheduler is None:
            self.resolve_learning_rate(warmup, optimizer or self.optimizer)
        if self.lr_scheduler is None and self.args.lr_scheduler_type == SchedulerType.INVERSE_SQRT:
            self.lr_scheduler = LambdaLR(optimizer or self.optimizer, partial(_noam_factor, warmup_steps=warmup))
        return super().create_scheduler(num_training_steps, optimizer)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and self.args.label_smoothing_factor and "labels" in inputs:
            inputs = {**inputs, "label_smoothing": self.args.label_smoothing_factor}
        if model.training and self.args.source_token_dropout and "input_ids" in inputs:
            inputs = {**inputs, "input_ids": self._drop_source_tokens(model, inputs["input_ids"])}
        runner = model
        if model.training and self.args.r_drop_alpha and "labels" in inputs:
            runner = with_r_drop(model, self.args.r_drop_alpha)  # it compares two passes' logits: never chunked
        elif model.training and "labels" in inputs:
            inputs = {**inputs, **loss_keywords(self.speedups)}
        with batch_checked_on_the_host() if self.batch_checked and model.training else contextlib.nullcontext():
            result = super().compute_loss(runner, inputs, return_outputs, num_items_in_batch)
        if self.profile is not None:
            self.profile.mark("backward")
        if model.training:
            # kept on the device and read at the checks (`check_finite`): a check here would wait for every step
            loss = result[0] if return_outputs else result
            bad = (~torch.isfinite(loss.detach())).any().to(torch.int32)
            self.nonfinite = bad if self.nonfinite is None else self.nonfinite + bad
            if "labels" in inputs:  # a tensor on the device: int() here would wait for the step every step
                self.target_tokens_seen = self.target_tokens_seen + (inputs["labels"] != -100).sum()
        return result

    def check_finite(self) -> None:
        """Stop the run if a training loss since the last check was NaN or infinite: the weights may be corrupted
        since, so nothing more is saved; the message names the last checkpoint written before (all were checked)."""
        self.decide_stop(stops=[])

    def decide_stop(self, stops: list[StopWithCheckpoint] | None = None, read_loss: bool = True) -> None:
        """One decision for every process: whether a training loss since the last check was not finite (an error,
        before any checkpoint of the weights it may have corrupted; with `read_loss`), and whether any process
        asked to stop (a signal, the time limit): then every process stops, with a checkpoint, after this update.
        Under DDP the processes' counts and wishes are summed in one all-reduce and read back once; every process
        calls this at the same updates (`_maybe_log_save_evaluate`), so none enters a collective the others skip."""
        if stops is None:
            stops = [c for c in self.callback_handler.callbacks if isinstance(c, StopWithCheckpoint)]
        wishes = [stop.requested() for stop in stops]  # host values
        nonfinite, since = None, self.checked_step
        if read_loss:
            nonfinite, self.nonfinite, self.checked_step = self.nonfinite, None, self.state.global_step
        if _distributed():
            values = torch.tensor([0.0, *map(float, wishes)], device=self.args.device)
            if nonfinite is not None:
                values[:1] += nonfinite  # on the device: no read before the all-reduce
            torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.SUM)
            bad, *wishes = values.tolist()  # the one read-back of the decision
            bad, wishes = int(bad), [wish > 0 for wish in wishes]
        else:
            bad = int(nonfinite) if nonfinite is not None else 0  # the one read-back, at the checks
        for stop, wish in zip(stops, wishes, strict=True):
            if wish and not bad:
                stop.decide(self.control, self.state)
        if bad:
            checkpoint = last_checkpoint(self.args.output_dir)
            last = f"the last good checkpoint is {checkpoint}" if checkpoint else "no checkpoint was written yet"
            raise FloatingPointError(
                f"the training loss was NaN or infinite in {bad} of the updates {since + 1}-{self.state.global_step}: "
                f"training stopped before a checkpoint of corrupted weights; {last}. Lower the learning rate "
                "(--learning_rate / --lr_scale) or raise --warmup_steps; with --fp16 prefer --bf16. Resume from "
                "the last checkpoint with --resume."
            )

    def _maybe_log_save_evaluate(self, *args, **kwargs):
        step, control = self.state.global_step, self.control
        # the decision points, the same update on every process: before every log, save and evaluation, every
        # finite_check_steps updates and at the last; a single process also decides its host wishes every update
        checks = control.should_log or control.should_save or control.should_evaluate or (
            step - self.checked_step >= self.args.finite_check_steps) or step >= self.state.max_steps  # fmt: skip
        if checks or not _distributed():
            self.decide_stop(read_loss=checks)
        if self.profile is not None:
            self.profile.mark("logging, saving")
        result = super()._maybe_log_save_evaluate(*args, **kwargs)
        if self.profile is not None and self.profile.active:
            self.profile.end_update()
            if not self.profile.active and self.args.should_log:
                self._say(self.profile.table())
        return result

    def _will_log(self) -> bool:
        """Whether the update under way ends in a log entry (Transformers' DefaultFlowCallback rule)."""
        args, step = self.args, self.state.global_step + 1
        if args.logging_strategy != "steps":
            return True
        every = self.state.logging_steps or 1
        return (args.logging_first_step and step == 1) or step % every == 0 or step >= self.state.max_steps

    def _get_grad_norm(self, model, grad_norm=None):
        # Transformers computes the norm of every gradient every update, for its log; without clipping
        # (the paper's recipe) it is computed only for the updates that log it
        if grad_norm is None and not self._will_log():
            return None
        return super()._get_grad_norm(model, grad_norm)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        if self.profile is not None:
            self.profile.mark("wait for a batch (and the loader's copy)")
        batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.profile is not None:
            for batch in batches:
                self.profile.batch(batch)
        return batches, items

    def _prepare_inputs(self, inputs):
        if self.profile is not None and self.model.training:
            self.profile.mark("inputs to the device")
        inputs = super()._prepare_inputs(inputs)
        if self.profile is not None and self.model.training:
            self.profile.mark("forward")
        return inputs

    def training_step(self, model, inputs, num_items_in_batch=None):
        watching = contextlib.nullcontext()
        if self.compile_watch is not None:
            watching = self.compile_watch.step(tuple(inputs["input_ids"].shape))
        with watching:
            loss = super().training_step(model, inputs, num_items_in_batch)
        if self.profile is not None:
            self.profile.mark("gradient norm (logged updates)")
        return loss

    def _say(self, text: str) -> None:
        if self.args.should_log:
            print(text, file=sys.stderr, flush=True)

    def _drop_source_tokens(self, model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        config = self.accelerator.unwrap_model(model).config
        if config.unk_token_id is None:
            raise ValueError("--source_token_dropout replaces source tokens by <unk>, but the model's config has "
                             "no unk_token_id: set one (--config_overrides unk_token_id=ID) or leave the option "
                             "at 0.")  # fmt: skip
        keep = [i for i in (config.pad_token_id, config.eos_token_id, config.bos_token_id) if i is not None]
        return drop_source_tokens(input_ids, self.args.source_token_dropout, config.unk_token_id, keep)

    def _issue_warnings_after_load(self, load_result) -> None:
        # Tied copies (embeddings, output projection) are saved once; their absence on resume is expected.
        tied = set(getattr(self.model, "all_tied_weights_keys", {}) or {})
        load_result.missing_keys[:] = [k for k in load_result.missing_keys if k not in tied]
        super()._issue_warnings_after_load(load_result)

    def _get_output_dir(self, trial) -> str:
        if getattr(self, "_staging", False):
            return os.path.join(super()._get_output_dir(trial), STAGING_DIR)
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        """Write the checkpoint under a staging folder, then rename it into place (atomic on one filesystem)."""
        run_dir = self._get_output_dir(trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staged, final = os.path.join(run_dir, STAGING_DIR, name), os.path.join(run_dir, name)
        if self.args.should_save and os.path.exists(staged):
            shutil.rmtree(staged)  # left by a run killed while saving
        self.accelerator.wait_for_everyone()
        self._staging = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging = False
        self.accelerator.wait_for_everyone()
        if self.args.should_save:  # the saving process of each folder (of each node, where nodes share none)
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(staged, final)
            best = self.state.best_model_checkpoint
            if best and STAGING_DIR in best:
                self.state.best_model_checkpoint = best.replace(os.path.join(STAGING_DIR, ""), "")
            rotate_checkpoints(run_dir, self.args.save_total_limit, self.state.best_model_checkpoint, use_mtime=False)
        self.accelerator.wait_for_everyone()


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


# what Trainer writes into a checkpoint and reads back on resume (transformers.trainer's names)
RESUMED_FILES = ("optimizer.pt", "scheduler.pt")


def why_not_resumable(checkpoint: Path) -> str | None:
    """Why training cannot resume from `checkpoint`, or None: its weights, optimizer, scheduler and trainer state
    must all load (a disk filled up or a copy cut short leaves a folder that looks whole)."""
    try:
        load_weights(checkpoint)
    except (ValueError, FileNotFoundError) as err:
        return str(err)
    for name in RESUMED_FILES:
        if not (checkpoint / name).is_file():
            return f"{name} is missing"
        try:
            torch.load(checkpoint / name, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several kinds for a cut or foreign file: all mean "cannot resume"
            return f"{name} does not load ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError) as err:
        return f"trainer_state.json does not load ({err})"
    return None


def resumable_checkpoint(output_dir: str | Path) -> str | None:
    """The newest checkpoint of a run that loads whole (`why_not_resumable`); each newer one that does not is named
    in a warning. None when the run has no checkpoint yet; an error when it has some and none loads."""
    checkpoints = list_checkpoints(output_dir) if Path(output_dir).is_dir() else []
    problems = []
    for checkpoint in reversed(checkpoints):
        problem = why_not_resumable(checkpoint)
        if problem is None:
            return str(checkpoint)
        problems.append(f"{checkpoint.name}: {problem}")
        logger.warning("--resume: %s cannot be resumed from (%s); trying the checkpoint before it", checkpoint, problem)
    if checkpoints:
        raise ValueError(f"--resume: no checkpoint in {output_dir} loads ({'; '.join(problems)}). Start over with "
                         "--overwrite_output_dir, or copy a good checkpoint-N folder back.")  # fmt: skip
    return None


class _OptimizerMarks(TrainerCallback):
    """The optimizer's step in a `StepProfile`: between Trainer's pre- and post-optimizer callbacks."""

    def __init__(self, profile: StepProfile) -> None:
        self.profile = profile

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.profile.mark("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.profile.mark("schedule, zero_grad, step-end callbacks")
