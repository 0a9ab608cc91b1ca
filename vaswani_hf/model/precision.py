"""Numeric precision chosen by what the hardware does fast: fp32, bf16 (training and inference), int8 (CPU
inference). One module holds the whole feature: which precision a device runs fast, and how each is applied.

Measured on the base preset, 2 threads (`benchmarks/compare_marian.py`; figures and CPUs in the README):

- **bf16 is fast only where the CPU has native bf16 instructions** (AMX-BF16 on Intel Sapphire Rapids and later,
  AVX512-BF16 on AMD Zen 4 and Intel Cooper Lake) **or on a CUDA GPU with bf16**. On an AVX2-only CPU, torch
  emulates bf16 and a training step took 41.3 s against 1.38 s in fp32 (0.03x): there `bf16` is refused with the
  missing feature named, and `auto` picks fp32. A oneDNN cap (`ONEDNN_MAX_CPU_ISA=AVX2`) counts as such a CPU:
  torch then emulates bf16 matrix products whatever the hardware has.
- **bf16 training on CPU** keeps the model itself in bf16 (weights, activations, gradients: every matrix product runs
  on the bf16 kernels, no casts), while `MasterWeightAdamW` keeps fp32 master copies of the weights and Adam's
  moments, so small updates are not lost to bf16 rounding (Micikevicius et al., 2018). The loss is computed in fp32
  (`translation_loss` upcasts the logits) and attention runs in fp32 on CPU (`VaswaniMultiHeadAttention`), where
  torch's bf16 attention backward is slower. `torch.autocast("cpu")` instead casts fp32 weights at every op: slower.
  On CUDA, bf16 training is autocast (Trainer's `bf16=True`), the fast path there.
- **Native bf16 is not always faster**: on an Intel Xeon with AVX512-BF16 (no AMX) bf16 training ran at 0.7x
  fp32. So `auto` on a CPU with native bf16 times the job (a training step, or beam decoding) in both precisions
  once per machine, torch release and thread count, keeps the result in a JSON cache, and takes bf16 only where it
  measured faster (`measured_choice`); the ratio is in the reason runs print.
- **bf16 inference on CPU pays with rows, not at one row**: on Sapphire Rapids (AMX) 1.59x fp32 at beam 4 x 16
  sentences, 1.23x at beam 4 x 1, 0.97x for greedy one sentence (a bf16 matrix-vector product costs more than an
  fp32 one there). `auto`'s inference measurement decodes a batch (beam 4 x 4 sentences), as translate does.
- **int8 is dynamic quantization of every linear layer** (weights int8 per tensor, activations quantized per
  batch): `torch.ao.quantization.quantize_dynamic`, CPU only. torchao's int8 configurations were measured too and
  were slower than fp32 in eager mode on both kinds of CPU measured (0.4-0.9x on an AMD EPYC and an Intel Sapphire
  Rapids; they are built for `torch.compile`), so the kept library is torch's
  built-in one, deprecated but present in the pinned torch; `quantize_int8` says so if a torch release removes it.
  int8 is never picked by `auto`: it changes the model's numbers by more than rounding, so it is asked for.

    from vaswani_hf.model.precision import quantize_int8, resolve_precision
    model = quantize_int8(model)                        # CPU serving; the fp32 model is not changed
    choice = resolve_precision("auto", "cpu")           # Precision(name="bf16", reason="auto: ... AVX512-BF16")
    model = choice.apply(model)                          # inference: cast or quantize

Training with bf16 weights by hand:

    model = VaswaniForConditionalGeneration(config).to(torch.bfloat16)
    optimizer = MasterWeightAdamW(model.parameters(), lr=..., betas=(0.9, 0.98), eps=1e-9)
    ... loss.backward(); optimizer.step(); optimizer.zero_grad()
    optimizer.copy_master_weights_to(model.float())  # fp32 weights for saving and inference

`vaswani train --precision bf16` (or `auto` on such hardware) does all of this inside `VaswaniTrainer`.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

PRECISIONS = ("auto", "fp32", "bf16", "int8")
# `auto` takes bf16 only where its measurement beats fp32 by this margin: bf16 costs exactness, and a gain inside the
# small proxy's noise is not one the real job keeps. On an Intel Xeon-class CPU without AMX (Sapphire Rapids with
# oneDNN capped to AVX512_CORE_FP16) beam decoding measured 1.03x, and the base model's beam4-b16 ran at 0.95x fp32.
BF16_MIN_SPEEDUP = 1.1
# the most searches `measure_bf16_speedup` runs before it times decoding, while the model still times its ways
MAX_WARMUP_SEARCHES = 60


def cpu_name() -> str:
    """The CPU's model name, for logs and benchmark tables."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def native_bf16(device: str | torch.device = "cpu") -> str | None:
    """The hardware feature that makes bf16 fast on `device`, or None where bf16 would be emulated."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} supports bf16" if torch.cuda.is_bf16_supported() else None
    if device.type != "cpu":
        return None
    # torch's bf16 matrix products run on oneDNN; an instruction-set cap there emulates bf16 whatever the CPU has
    # (a bf16 linear layer measured 10x slower than fp32 under ONEDNN_MAX_CPU_ISA=AVX2 on an AVX512-BF16 CPU).
    cap = onednn_isa_cap()
    amx_allowed = cap is None or "AMX" in cap[1]
    bf16_allowed = amx_allowed or cap[1].startswith(("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10"))
    if torch.cpu._is_amx_tile_supported() and amx_allowed:
        return "this CPU has AMX-BF16"
    if torch.cpu._is_avx512_bf16_supported() and bf16_allowed:
        return "this CPU has AVX512-BF16"
    return None


def onednn_isa_cap() -> tuple[str, str] | None:
    """The variable that limits oneDNN's instruction set and its value, e.g. `("ONEDNN_MAX_CPU_ISA", "AVX2")` (or the
    old name `DNNL_MAX_CPU_ISA`), which emulates a CPU without AVX-512; None when none does."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        value = os.environ.get(name, "").strip().upper()
        if value:
            return None if value in ("ALL", "DEFAULT") else (name, value)
    return None


@dataclass(frozen=True)
class Precision:
    """A resolved precision: `name` is fp32, bf16 or int8; `reason` says why, for logs, summaries and cards."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model for inference in this precision (int8 returns a quantized copy; fp32 and bf16 cast in place)."""
        if self.name == "int8":
            return quantize_int8(model)
        return model.to(torch.bfloat16 if self.name == "bf16" else torch.float32)


def resolve_precision(requested: str, device: str | torch.device = "cpu", training: bool = False) -> Precision:
    """The precision to run in: `requested` if the device runs it fast, `auto`'s pick, or a ValueError that
    names the missing feature and the alternative."""
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {requested!r}.")
    device = torch.device(device)
    where = cpu_name() if device.type == "cpu" else str(device)
    if requested == "fp32":
        return Precision("fp32", "asked for")
    if requested == "int8":
        if training:
            raise ValueError("--precision int8 is for inference (translate, evaluate): train in fp32 or bf16.")
        if device.type != "cpu":
            raise ValueError(f"--precision int8 quantizes for CPU serving; on {where} use --precision bf16 or fp32.")
        return Precision("int8", "asked for: dynamic int8 quantization of the linear layers")
    native = native_bf16(device)
    if native is not None and requested == "auto" and device.type == "cpu":
        return measured_choice(native, training)
    if native is not None:
        return Precision("bf16", f"{'auto' if requested == 'auto' else 'asked for'}: {native}")
    missing = "neither AMX-BF16 nor AVX512-BF16" if device.type == "cpu" else "no bf16 support"
    cap = onednn_isa_cap() if device.type == "cpu" else None
    missing += f" enabled ({cap[0]}={cap[1]})" if cap else ""
    if requested == "bf16":
        raise ValueError(
            f"--precision bf16: {where} has {missing}, so bf16 is emulated there and runs many times slower "
            "than fp32 (a training step measured 30x slower on an AVX2-only CPU). Use --precision fp32 (or "
            "auto, which picks it)" + ("" if training else ", or int8 for faster CPU inference") + "."
        )
    return Precision("fp32", f"auto: {where} has {missing}")


def measured_choice(native: str, training: bool) -> Precision:
    """`auto` on a CPU with native bf16: bf16 only where it measured faster than fp32 on this machine.

    Native bf16 instructions do not make bf16 fast everywhere: on an Intel Xeon with AVX512-BF16 (no AMX) bf16
    training ran at 0.7x fp32, where the rule on CPU flags had picked it. So the first `auto` on a machine times
    the job itself on a small model in both precisions (`measure_bf16_speedup`, a few seconds), takes bf16 from
    `BF16_MIN_SPEEDUP` (1.1x) up, and keeps the result per CPU model, torch release, thread count, oneDNN cap and
    job (training or inference) in a JSON file (`precision_cache_path()`); later runs read it. The choice and the
    measured ratio are in the reason, which runs print in their summary. `--precision fp32/bf16` skips all of this."""
    job = "training" if training else "inference"
    cap = onednn_isa_cap()
    key = " | ".join([cpu_name(), f"torch {torch.__version__}", f"{torch.get_num_threads()} threads", job,
                      f"{cap[0]}={cap[1]}" if cap else "no ISA cap"])  # fmt: skip
    path = precision_cache_path()
    ratio = read_measurements(path).get(key)
    where = f"cached in {path}"
    if not isinstance(ratio, (int, float)):
        ratio = measure_bf16_speedup(training)
        if not write_measurement(path, key, round(ratio, 3)):
            where = "not cached: cannot write " + str(path)
    name = "bf16" if ratio >= BF16_MIN_SPEEDUP else "fp32"
    what = "a training step" if training else "beam decoding"
    rule = f"bf16 from {BF16_MIN_SPEEDUP:.2f}x"
    return Precision(name, f"auto: {native}; measured here, {what} in bf16 runs at {ratio:.2f}x fp32, {rule} "
                           f"({where})")  # fmt: skip


def read_measurements(path: Path) -> dict:
    """A cache of measurements (a JSON object, key -> result); empty when it is missing or unreadable."""
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def write_measurement(path: Path, key: str, value) -> bool:
    """Keep `value` under `key` in the cache at `path`; False where it cannot be written (a read-only home: the
    measurement is taken again next time)."""
    cache = read_measurements(path)
    cache[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1, sort_keys=True))
    except OSError:
        return False
    return True


def precision_cache_path() -> Path:
    """Where `auto` keeps its measurements: `$VASWANI_PRECISION_CACHE`, else `$XDG_CACHE_HOME/vaswani_hf/
    precision.json` (`~/.cache/...`). Delete it to measure again (after a BIOS or library change)."""
    if os.environ.get("VASWANI_PRECISION_CACHE"):
        return Path(os.environ["VASWANI_PRECISION_CACHE"])
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "vaswani_hf" / "precision.json"


def measure_bf16_speedup(training: bool, d_model: int = 512, rounds: int = 5) -> float:
    """fp32 time over bf16 time (median of `rounds`, interleaved, after a warm-up) of a training step (bf16 weights
    with `MasterWeightAdamW`, as `vaswani train` runs it) or of beam-4 decoding (as `vaswani translate`), on a
    one-layer model of width `d_model` with an 8,000-token vocabulary: the same kernels as the real job, a few
    seconds in all. Decoding warms up until the fp32 model's searches have chosen their ways
    (`speed.fast_products.decoding_ways_settled`): until then its steps try each way in turn, slower ones included,
    and timed then, fp32 measured 1.40-1.63x slower than bf16 on an AMD EPYC (Zen 4) where settled it was
    1.10-1.33x (the bf16 model times no ways)."""
    from .configuration_vaswani import VaswaniConfig
    from .modeling_vaswani import VaswaniForConditionalGeneration
    from .speed.fast_products import decoding_ways_settled

    generator = torch.Generator().manual_seed(0)
    config = VaswaniConfig(vocab_size=8000, d_model=d_model, encoder_layers=1, decoder_layers=1,
                           encoder_ffn_dim=4 * d_model, decoder_ffn_dim=4 * d_model)  # fmt: skip
    source = torch.randint(4, 8000, (16, 32), generator=generator)
    jobs, sentences, beams = [], 4, 4
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(config).to(dtype)
        if training:
            optimizer = (MasterWeightAdamW if dtype == torch.bfloat16 else torch.optim.AdamW)(model.parameters())

            def job(model=model, optimizer=optimizer):
                model(input_ids=source, labels=source).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        else:
            model.eval()

            def job(model=model):
                model.generate(input_ids=source[:sentences], num_beams=beams, max_new_tokens=8, min_new_tokens=8)

            for _ in range(MAX_WARMUP_SEARCHES):  # each search gives the trial 7 steps
                if decoding_ways_settled(model, rows=sentences * beams):
                    break
                job()
        jobs.append(job)
    times: list[list[float]] = [[], []]
    for round_ in range(rounds + 1):
        for index, job in enumerate(jobs):
            start = time.perf_counter()
            job()
            if round_:  # the first round warms up
                times[index].append(time.perf_counter() - start)
    fp32, bf16 = (statistics.median(t) for t in times)
    return fp32 / bf16


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with every `nn.Linear` dynamically quantized to int8, for CPU inference; the original
    is not changed. Quantized models are for serving: save the fp32 model, quantize after loading."""
    quantize = getattr(getattr(torch.ao, "quantization", None), "quantize_dynamic", None)
    if quantize is None:
        raise RuntimeError(
            f"torch {torch.__version__} no longer has torch.ao.quantization.quantize_dynamic: install the torch "
            "release pinned in the README or use --precision fp32/bf16."
        )
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 dynamic quantization runs on CPU: move the model with model.to('cpu') first.")
    model = copy.deepcopy(model).float().eval()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            # the fused Q/K/V projections are plain linears at run time; torch quantizes exact nn.Linear types only
            module.__class__ = torch.nn.Linear
    with warnings.catch_warnings():  # deprecated in favour of torchao, which measured slower in eager mode
        warnings.simplefilter("ignore")
        quantized = quantize(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    if hasattr(quantized, "save_pretrained"):  # push_to_hub writes its files through it too
        quantized.save_pretrained = _refuse_to_save
    return quantized


def _refuse_to_save(*args, **kwargs) -> None:
    raise ValueError(
        "this model is quantized to int8 for serving; its packed weights are not a checkpoint. Save the fp32 model "
        "and quantize after loading (vaswani_hf.model.precision.quantize_int8, or --precision int8)."
    )


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
        super().__init__(master_groups, **{"weight_decay": 0.0, **kwargs})  # AdamW's own default is 0.01

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
    def full_precision_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """`model.state_dict()` with each trained parameter's fp32 master in place of its low-precision copy, and
        floating buffers in fp32: what an fp32 run would save. Tied names share one tensor, as in the model."""
        masters = {id(p): m.detach() for p, m in zip(self.model_params, self.master_params, strict=True)}
        return {
            name: masters[id(t)] if id(t) in masters else t.detach().float() if t.is_floating_point() else t.detach()
            for name, t in model.state_dict(keep_vars=True).items()
        }

    @torch.no_grad()
    def copy_master_weights_to(self, model: torch.nn.Module) -> torch.nn.Module:
        """Write the fp32 masters into `model` (call `model.float()` first to keep them at full precision)."""
        by_id = {id(p): i for i, p in enumerate(self.model_params)}
        masters = self.master_params
        for param in model.parameters():
            if id(param) in by_id:
                param.copy_(masters[by_id[id(param)]])
        return model
