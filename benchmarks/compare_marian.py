#!/usr/bin/env python
"""Vaswani vs Transformers' Marian: same configuration, same weights, timed side by side (issue 5).

Builds a `MarianMTModel` with the paper's sizes and random weights, converts it with
`vaswani_hf.interop.convert.marian_to_vaswani` (so both compute the same function), checks that they agree (logits and
greedy/beam outputs), then times every case interleaved: each round runs every contender once, in an order that
alternates between rounds, after warm-up rounds; the table gives the median and the spread (min-max over rounds)
of tokens per second, and the ratio to Marian measured in the same rounds.

Cases (`--cases`, default all):
  train        forward + backward + Adam(0.9, 0.98, 1e-9) with label smoothing 0.1, batch x source/target tokens
  encoder      encoder-only forward
  greedy-b1 / greedy-b16 / beam4-b1 / beam4-b16
               generate() with `--new-tokens` new tokens forced (min = max), fp32

Contenders: Marian and Vaswani in fp32 eager for every case; for `train` also both under naive
`torch.autocast("cpu", torch.bfloat16)` and our bf16 path (`vaswani_hf.model.precision.MasterWeightAdamW`: bf16 weights
and activations, fp32 master weights, fp32 loss and CPU attention); `--compile` adds torch.compile'd Vaswani
(training, and Transformers' static-cache compiled greedy decoding, also with torch's guard evaluation skipped after
warm-up: `without_guard_evaluation`); `--ctranslate2` adds the exported CTranslate2 model (generation cases; once it
has run, the PyTorch contenders in the same process ran at about 0.6x their speed on a Sapphire Rapids until its
Translator was freed, so compare it with them in a run of its own); `--precisions` adds the inference precisions of
`vaswani_hf.model.precision` to the generation cases: bf16 where the CPU has it natively, int8 (torch's dynamic
quantization, the library's choice, and torchao's two int8 configurations when torchao is installed), and
CTranslate2 int8 with `--ctranslate2`; `--onnx` adds the ONNX export run by onnxruntime in our own search
(`interop.onnx`), fp32 and int8 graphs; `--shortlist N` adds Vaswani fp32 (and int8 with `--precisions`) scoring
N fixed random target tokens, the size of a batch's vocabulary shortlist (`vaswani shortlist`; its BLEU cost is
measured on real data by benchmarks/shortlist_speed.py, not here).

Peak memory is the peak resident set (VmHWM) of a fresh process that builds the pair, keeps one model and runs one
case twice
(`--no-memory` skips it). Results: `--out` markdown table (plus the agreement checks and the machine) and a PNG bar
chart beside it.

    python benchmarks/compare_marian.py --preset base              # the README table, ~20 min on 2 cores
    python benchmarks/compare_marian.py --preset small --rounds 5  # ~3 min
    python benchmarks/compare_marian.py --preset base --cases greedy-b1 beam4-b1 beam4-b16 --precisions \
        --ctranslate2 --no-memory --out benchmarks/results/precision_base_<cpu>.md  # the precision table, ~15 min
    python benchmarks/compare_marian.py --preset base --cases greedy-b1 beam4-b1 beam4-b16 --precisions \
        --ctranslate2 --onnx --no-memory --out benchmarks/results/onnx_base_<cpu>.md  # with onnxruntime
    python benchmarks/compare_marian.py --preset base --cases greedy-b1 beam4-b1 beam4-b16 --precisions \
        --shortlist 3000 --no-memory --rounds 5 --warmup 1 --out benchmarks/results/cells_<cpu>.md  # issue 32's cells

An AVX2-only CPU is emulated on an AVX-512 one by limiting every kernel library to AVX2 (the report's machine line
names the limits; `auto` then picks fp32, as on such a CPU):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 \
        CT2_FORCE_CPU_ISA=AVX2 python benchmarks/compare_marian.py ...
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from torch.nn import functional as F
from transformers import MarianConfig, MarianMTModel
from transformers.utils import logging as hf_logging

from vaswani_hf.interop.convert import marian_to_vaswani

PRESETS = {
    "base": dict(vocab_size=37000, d_model=512, layers=6, heads=8, ffn=2048),
    "small": dict(vocab_size=8000, d_model=256, layers=3, heads=4, ffn=1024),
}
CASES = ("train", "encoder", "greedy-b1", "greedy-b16", "beam4-b1", "beam4-b16")
T = TypeVar("T")
PAD, BOS, EOS = 0, 1, 2


def build_marian(preset: str, seed: int = 0) -> MarianMTModel:
    """The paper's model as a Marian configuration (post-norm, ReLU, scaled shared embeddings, dropout 0.1)."""
    p = PRESETS[preset]
    config = MarianConfig(
        vocab_size=p["vocab_size"],
        decoder_vocab_size=p["vocab_size"],
        d_model=p["d_model"],
        encoder_layers=p["layers"],
        decoder_layers=p["layers"],
        encoder_attention_heads=p["heads"],
        decoder_attention_heads=p["heads"],
        encoder_ffn_dim=p["ffn"],
        decoder_ffn_dim=p["ffn"],
        activation_function="relu",
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        max_position_embeddings=512,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=None,
    )
    torch.manual_seed(seed)
    return MarianMTModel(config).eval()


def build_pair(preset: str) -> tuple[MarianMTModel, torch.nn.Module]:
    marian = build_marian(preset)
    return marian, marian_to_vaswani(marian)


def batch(preset: str, size: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, PRESETS[preset]["vocab_size"], (size, length), generator=generator)
    ids[:, -1] = EOS
    return ids


# --- what each contender runs ----------------------------------------------------------------------------------


def marian_loss(model, source, mask, target):
    decoder_input_ids = torch.cat([torch.full_like(target[:, :1], BOS), target[:, :-1]], dim=1)
    logits = model(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_input_ids, use_cache=False).logits
    # what Seq2SeqTrainer's label smoother computes for Marian (its own loss has no smoothing)
    return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), label_smoothing=0.1)


def vaswani_loss(model, source, mask, target):
    # the recipe's loss (VaswaniTrainer passes label_smoothing in training steps); Marian gets the same above
    return model(input_ids=source, attention_mask=mask, labels=target, label_smoothing=0.1).loss


@dataclass
class Contender:
    label: str
    model_name: str  # "marian" | "vaswani" | "ctranslate2"
    run: Callable[[], int]  # returns the tokens it produced or consumed
    notes: str = ""
    times: list[float] = field(default_factory=list)
    tokens: int = 0


def adam(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)


def train_step(model, loss_fn, optimizer, data, autocast: bool = False) -> Callable[[], int]:
    source, mask, target = data

    def run() -> int:
        model.train()
        with torch.autocast("cpu", torch.bfloat16) if autocast else contextlib.nullcontext():
            loss = loss_fn(model, source, mask, target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return target.numel()

    return run


def compiled_generation_kwargs() -> dict:
    """Transformers' own compiled decoding: a static cache and a compiled decoder step (greedy and sampling only;
    its beam search always runs eager). On CPU it has to be asked for with `_compile_all_devices`."""
    from transformers import CompileConfig

    config = CompileConfig(mode="default", fullgraph=True)
    config._compile_all_devices = True
    return {"cache_implementation": "static", "compile_config": config}


def without_guard_evaluation(run: Callable[[], T]) -> Callable[[], T]:
    """`run` under `torch.compiler.set_stance(skip_guard_eval_unsafe=True)` after one ordinary call: torch.compile
    then checks only the guards that tell its compiled graphs apart, not the ~300 us of guards on every parameter
    and cache tensor per decoding step. Valid when every call has shapes seen before, as in a benchmark or a
    fixed-shape server; a new shape could silently run the wrong graph (hence torch's "unsafe")."""
    warmed = []

    def wrapped() -> T:
        if not warmed:
            warmed.append(run())
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return run()

    return wrapped


def generate_call(model, source, beams: int, new_tokens: int, ours: bool, **extra) -> Callable[[], int]:
    if ours:
        extra["length_penalty_type"] = "hf"  # the same normalisation as Marian: same outputs

    def run() -> int:
        model.eval()
        out = model.generate(
            input_ids=source,
            attention_mask=torch.ones_like(source),
            num_beams=beams,
            do_sample=False,
            min_new_tokens=new_tokens,
            max_new_tokens=new_tokens,
            length_penalty=1.0,
            early_stopping=True,
            **extra,
        )
        return source.shape[0] * (out.shape[1] - 1)

    return run


def encoder_call(model, source) -> Callable[[], int]:
    def run() -> int:
        model.eval()
        with torch.no_grad():
            model.get_encoder()(input_ids=source, attention_mask=torch.ones_like(source))
        return source.numel()

    return run


def contenders_for(case: str, args, marian, vaswani, extras: dict) -> list[Contender]:
    if case == "train":
        data = (batch(args.preset, args.batch, args.length, 1), None, batch(args.preset, args.batch, args.length, 2))
        data = (data[0], torch.ones_like(data[0]), data[2])
        m, v = extras["train_models"]
        out = [
            Contender("Marian fp32", "marian", train_step(m["fp32"], marian_loss, m["opt_fp32"], data)),
            Contender("Vaswani fp32", "vaswani", train_step(v["fp32"], vaswani_loss, v["opt_fp32"], data)),
        ]
        if not args.no_bf16:
            out += [
                Contender("Marian bf16 autocast", "marian",
                          train_step(m["ac"], marian_loss, m["opt_ac"], data, autocast=True)),
                Contender("Vaswani bf16 autocast", "vaswani",
                          train_step(v["ac"], vaswani_loss, v["opt_ac"], data, autocast=True)),
                Contender("Vaswani bf16 + fp32 master", "vaswani",
                          train_step(v["bf16"], vaswani_loss, v["opt_bf16"], data)),
            ]  # fmt: skip
        if args.compile:
            out.append(Contender("Vaswani fp32 compiled", "vaswani",
                                 train_step(v["compiled"], vaswani_loss, v["opt_compiled"], data)))  # fmt: skip
        return out
    if case == "encoder":
        source = batch(args.preset, args.batch, args.length, 3)
        return [
            Contender("Marian fp32", "marian", encoder_call(marian, source)),
            Contender("Vaswani fp32", "vaswani", encoder_call(vaswani, source)),
        ]
    kind, size = case.split("-b")
    beams = 4 if kind == "beam4" else 1
    source = batch(args.preset, int(size), args.length, 4)
    out = [
        Contender("Marian fp32", "marian", generate_call(marian, source, beams, args.new_tokens, ours=False)),
        Contender("Vaswani fp32", "vaswani", generate_call(vaswani, source, beams, args.new_tokens, ours=True)),
    ]
    if args.compile and beams == 1:
        compiled = generate_call(vaswani, source, beams, args.new_tokens, ours=True, **compiled_generation_kwargs())
        out.append(Contender("Vaswani fp32 compiled", "vaswani", compiled))
        out.append(Contender("Vaswani fp32 compiled, no guard checks", "vaswani", without_guard_evaluation(compiled)))
    if extras.get("ct2") is not None:
        out.append(Contender("CTranslate2 fp32", "ctranslate2", extras["ct2"].call(source, beams, args.new_tokens)))
    for label, model in extras.get("precisions", {}).items():
        out.append(Contender(f"Vaswani {label}", "vaswani", generate_call(model, source, beams, args.new_tokens, True)))
    if extras.get("ct2_int8") is not None:
        ct2_int8 = extras["ct2_int8"].call(source, beams, args.new_tokens)
        out.append(Contender("CTranslate2 int8", "ctranslate2", ct2_int8))
    for label, runner in extras.get("onnx", {}).items():
        out.append(Contender(label, "onnxruntime", generate_call(runner, source, beams, args.new_tokens, True)))
    if args.shortlist:
        allowed = torch.randperm(PRESETS[args.preset]["vocab_size"], generator=torch.Generator().manual_seed(7))
        allowed = allowed[: args.shortlist]
        int8 = extras.get("precisions", {}).get("int8 (torch dynamic)")
        for label, model in (("fp32", vaswani), ("int8", int8)):
            if model is not None:
                run = generate_call(model, source, beams, args.new_tokens, True, vocabulary_shortlist=allowed)
                out.append(Contender(f"Vaswani {label} + shortlist", "vaswani", run))
    return out


def onnx_runners(args, vaswani) -> dict:
    """The model exported to ONNX (fp32 and int8 graphs), each run by onnxruntime inside our own search."""
    from vaswani_hf.interop.onnx import OnnxSeq2Seq, export_onnx

    runners = {}
    for label, quantize in (("onnxruntime fp32", None), ("onnxruntime int8", "int8")):
        folder = export_onnx(vaswani, None, tempfile.mkdtemp(prefix="vaswani-onnx-"), quantize)
        runners[label] = OnnxSeq2Seq(folder, threads=args.threads)
    return runners


def precision_models(args, vaswani) -> tuple[dict, list[str]]:
    """The inference precisions of `vaswani_hf.model.precision` this CPU can run fast, and what was left out and why."""
    from vaswani_hf.model.precision import quantize_int8, resolve_precision

    models, notes = {"int8 (torch dynamic)": quantize_int8(vaswani)}, []
    auto = resolve_precision("auto", "cpu")  # its reason names a oneDNN cap when one is set (emulated AVX2)
    if auto.name == "bf16":
        models["bf16"] = copy.deepcopy(vaswani).to(torch.bfloat16)
    else:
        notes.append(f"no Vaswani bf16 row: {auto.reason.removeprefix('auto: ')}, so bf16 would be emulated")
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
    except ImportError:
        notes.append("no torchao rows: `pip install torchao` to add them")
        return models, notes
    for label, config in (("int8 (torchao dynamic)", Int8DynamicActivationInt8WeightConfig()),
                          ("int8 (torchao weight-only)", Int8WeightOnlyConfig())):  # fmt: skip
        model = copy.deepcopy(vaswani)
        quantize_(model, config)
        models[label] = model
    return models, notes


# --- agreement ---------------------------------------------------------------------------------------------------


def agreement(args, marian, vaswani, ct2, onnx: dict) -> list[str]:
    """Same function, same outputs: refuse to time two models that do not compute the same thing."""
    lines = []
    source = batch(args.preset, 4, args.length, 5)
    mask = torch.ones_like(source)
    target = batch(args.preset, 4, args.length, 6)
    with torch.no_grad():
        decoder_input_ids = torch.cat([torch.full_like(target[:, :1], BOS), target[:, :-1]], dim=1)
        a = marian(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_input_ids).logits
        b = vaswani(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_input_ids).logits
    diff = (a - b).abs().max().item()
    lines.append(f"logits max |Marian - Vaswani| = {diff:.2e} (4 x {args.length} tokens, fp32)")
    if diff > 1e-3:
        raise SystemExit(f"Marian and Vaswani disagree (logits differ by {diff}); not timing them.")
    for beams in (1, 4):
        kwargs = dict(num_beams=beams, do_sample=False, min_new_tokens=10, max_new_tokens=10, length_penalty=1.0)
        x = marian.generate(input_ids=source, attention_mask=mask, **kwargs)
        y = vaswani.generate(input_ids=source, attention_mask=mask, length_penalty_type="hf", **kwargs)
        same = x.shape == y.shape and bool((x == y).all())
        lines.append(f"{'greedy' if beams == 1 else 'beam 4'} outputs identical: {same}")
        if not same:
            raise SystemExit(f"Marian and Vaswani generate different tokens with {beams} beam(s); not timing them.")
        if args.compile and beams == 1:
            compiled_kwargs = {**kwargs, "length_penalty_type": "hf", **compiled_generation_kwargs()}
            compiled = functools.partial(vaswani.generate, input_ids=source, attention_mask=mask, **compiled_kwargs)
            same = all(torch.equal(run_ids(), y) for run_ids in (compiled, without_guard_evaluation(compiled)))
            lines.append(f"compiled greedy outputs (guards checked and skipped) identical to eager: {same}")
            if not same:
                raise SystemExit("Compiled greedy decoding differs from eager; not timing it.")
        if ct2 is not None:
            z = ct2.generate_ids(source, beams, 10)
            same = bool((y[:, 1:] == z).all())
            lines.append(f"CTranslate2 {'greedy' if beams == 1 else 'beam 4'} outputs identical to Vaswani: {same}")
        for label, runner in onnx.items():
            z = runner.generate(input_ids=source, attention_mask=mask, length_penalty_type="hf", **kwargs)
            same = z.shape == y.shape and bool((y == z).all())
            lines.append(f"{label} {'greedy' if beams == 1 else 'beam 4'} outputs identical to Vaswani: {same}")
    return lines


# --- timing -------------------------------------------------------------------------------------------------------


def time_case(contenders: list[Contender], warmup: int, rounds: int) -> None:
    for r in range(warmup + rounds):
        order = contenders if r % 2 == 0 else contenders[::-1]
        for c in order:
            start = time.perf_counter()
            tokens = c.run()
            elapsed = time.perf_counter() - start
            if r >= warmup:
                c.times.append(elapsed)
                c.tokens = tokens


def tokens_per_second(c: Contender) -> tuple[float, float, float]:
    rates = [c.tokens / t for t in c.times]
    return statistics.median(rates), min(rates), max(rates)


# --- peak memory (one fresh process per model and case) ------------------------------------------------------------


def peak_rss_child(args) -> None:
    model_name, case = args.memory_child
    marian, vaswani = build_pair(args.preset)
    models = {"marian": marian, "vaswani": vaswani}
    model = models[model_name]
    if case == "train":
        opt = adam(model)
        loss_fn = marian_loss if model_name == "marian" else vaswani_loss
        source = batch(args.preset, args.batch, args.length, 1)
        run = train_step(
            model, loss_fn, opt, (source, torch.ones_like(source), batch(args.preset, args.batch, args.length, 2))
        )
    elif case == "encoder":
        run = encoder_call(model, batch(args.preset, args.batch, args.length, 3))
    else:
        kind, size = case.split("-b")
        run = generate_call(model, batch(args.preset, int(size), args.length, 4), 4 if kind == "beam4" else 1,
                            args.new_tokens, ours=model_name == "vaswani")  # fmt: skip
    other = models["vaswani" if model_name == "marian" else "marian"]
    del models, other, marian, vaswani
    run()
    run()
    print(json.dumps({"peak_rss_mb": own_peak_rss_mb()}))


def own_peak_rss_mb() -> float:
    # VmHWM belongs to this process's memory map; ru_maxrss can carry over the parent's peak across fork + exec
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_rss(args, model_name: str, case: str) -> float | None:
    cmd = [sys.executable, __file__, "--preset", args.preset, "--batch", str(args.batch), "--length",
           str(args.length), "--new-tokens", str(args.new_tokens), "--threads", str(args.threads),
           "--memory-child", model_name, case]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        print(result.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_rss_mb"]


# --- report -------------------------------------------------------------------------------------------------------


# the CPU features that decide which kernels (and so which precisions) are fast
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
# what limits the kernels below the hardware: how an AVX2-only CPU is emulated on an AVX-512 one (all five = AVX2)
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
              "FBGEMM_ENABLE_INSTRUCTIONS", "CT2_FORCE_CPU_ISA")  # fmt: skip


def cpu_flags() -> set[str]:
    """The CPU's flags as /proc/cpuinfo lists them (none where it is absent)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def machine() -> str:
    import transformers

    from vaswani_hf.model.precision import cpu_name

    flags = cpu_flags()
    present = " ".join(flag for flag in CPU_FLAGS if flag in flags) or "none of " + " ".join(CPU_FLAGS)
    limits = " ".join(f"{name}={os.environ[name]}" for name in ISA_LIMITS if os.environ.get(name))
    present += f"; limited by {limits}" if limits else ""
    return (f"{cpu_name()} [{present}], {torch.get_num_threads()} threads, torch {torch.__version__} "
            f"({torch.backends.cpu.get_cpu_capability()}), transformers {transformers.__version__}, "
            f"Python {platform.python_version()}")  # fmt: skip


def write_report(args, results: dict, checks: list[str], memory: dict, path: Path) -> None:
    p = PRESETS[args.preset]
    lines = [
        f"# Vaswani vs Marian, `{args.preset}` preset",
        "",
        f"d_model {p['d_model']}, {p['layers']}+{p['layers']} layers, {p['heads']} heads, d_ff {p['ffn']}, "
        f"vocabulary {p['vocab_size']:,}; training and encoder batches {args.batch} x {args.length} tokens per side; "
        f"generation from {args.length}-token sources with {args.new_tokens} new tokens forced. "
        f"Median of {args.rounds} interleaved rounds after {args.warmup} warm-up rounds; spread = min-max.",
        "",
        f"Machine: {machine()}.",
        "",
        "Agreement (same weights through `vaswani_hf.interop.convert.marian_to_vaswani`): " + "; ".join(checks) + ".",
        "",
        "| case | contender | tokens/s (median) | spread | x Marian fp32 | x Vaswani fp32 | peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for case, contenders in results.items():
        base, ours = (next(tokens_per_second(c)[0] for c in contenders if c.label == label)
                      for label in ("Marian fp32", "Vaswani fp32"))  # fmt: skip
        for c in contenders:
            med, low, high = tokens_per_second(c)
            mem = memory.get((c.label, case))
            mem_text = f"{mem / 1024:.2f} GB" if mem else ""
            lines.append(f"| {case} | {c.label} | {med:,.0f} | {low:,.0f}-{high:,.0f} | {med / base:.2f} | "
                         f"{med / ours:.2f} | {mem_text} |")  # fmt: skip
    lines += ["", f"Rerun: `python benchmarks/compare_marian.py {' '.join(args.argv)}`".replace("  ", " "), ""]
    path.write_text("\n".join(lines))
    print("\n".join(lines))


def plot(results: dict, path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no chart (pip install matplotlib)", file=sys.stderr)
        return
    labels = sorted({c.label for cs in results.values() for c in cs}, key=lambda s: (not s.startswith("Marian"), s))
    cases = list(results)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases)), 4))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        xs, ys = [], []
        for j, case in enumerate(cases):
            base = next(tokens_per_second(c)[0] for c in results[case] if c.label == "Marian fp32")
            for c in results[case]:
                if c.label == label:
                    xs.append(j + i * width)
                    ys.append(tokens_per_second(c)[0] / base)
        ax.bar(xs, ys, width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases)
    ax.set_ylabel("tokens/s relative to Marian fp32")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# --- main ---------------------------------------------------------------------------------------------------------


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=PRESETS, default="base")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--batch", type=int, default=32, help="sentences per training/encoder batch")
    parser.add_argument("--length", type=int, default=30, help="tokens per source and target sentence")
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--no-bf16", action="store_true", help="skip the bf16 training contenders")
    parser.add_argument("--compile", action="store_true", help="add torch.compile'd Vaswani (slow to compile on CPU)")
    parser.add_argument(
        "--ctranslate2", action="store_true", help="add the CTranslate2 export (pip install ctranslate2)"
    )
    parser.add_argument("--onnx", action="store_true",
                        help="add the ONNX export (fp32, int8 graphs) run by onnxruntime (onnx extra)")  # fmt: skip
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--precisions", action="store_true",
                        help="generation cases: add Vaswani bf16 (where native), int8 (torch dynamic, and torchao if "
                        "installed) and, with --ctranslate2, CTranslate2 int8")  # fmt: skip
    parser.add_argument("--shortlist", type=int, default=0, metavar="N",
                        help="generation cases: add Vaswani fp32 (and int8 with --precisions) scoring N random "
                        "target tokens (a vocabulary shortlist) instead of the whole vocabulary")  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=None, help="markdown table (default benchmarks/results/compare_marian_PRESET.md)"
    )
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    if args.memory_child:
        peak_rss_child(args)
        return
    print(f"machine: {machine()}", flush=True)
    marian, vaswani = build_pair(args.preset)
    ct2 = None
    if args.ctranslate2:
        from ctranslate2_runner import CTranslate2Runner

        ct2 = CTranslate2Runner.from_model(vaswani, Path(tempfile.mkdtemp(prefix="vaswani-ct2-")), threads=args.threads)
    onnx = onnx_runners(args, vaswani) if args.onnx else {}
    checks = agreement(args, marian, vaswani, ct2, onnx)
    print("\n".join(checks))
    extras = {"ct2": ct2, "onnx": onnx}
    if args.precisions:
        extras["precisions"], notes = precision_models(args, vaswani)
        checks += notes
        if ct2 is not None:
            extras["ct2_int8"] = CTranslate2Runner.from_model(vaswani, Path(tempfile.mkdtemp(prefix="vaswani-ct2-")),
                                                              threads=args.threads, quantization="int8")  # fmt: skip
    if "train" in args.cases:
        m = {"fp32": copy.deepcopy(marian), "ac": copy.deepcopy(marian)}
        v = {"fp32": copy.deepcopy(vaswani), "ac": copy.deepcopy(vaswani)}
        m["opt_fp32"], m["opt_ac"] = adam(m["fp32"]), adam(m["ac"])
        v["opt_fp32"], v["opt_ac"] = adam(v["fp32"]), adam(v["ac"])
        if not args.no_bf16:
            from vaswani_hf.model.precision import MasterWeightAdamW

            v["bf16"] = copy.deepcopy(vaswani).to(torch.bfloat16)
            v["opt_bf16"] = MasterWeightAdamW(
                v["bf16"].parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0
            )
        if args.compile:
            v["compiled"] = copy.deepcopy(vaswani)
            v["compiled"].forward = torch.compile(v["compiled"].forward)
            v["opt_compiled"] = adam(v["compiled"])
        extras["train_models"] = (m, v)
    results, memory = {}, {}
    for case in args.cases:
        contenders = contenders_for(case, args, marian, vaswani, extras)
        print(f"timing {case}: {', '.join(c.label for c in contenders)}", flush=True)
        time_case(contenders, args.warmup, args.rounds)
        results[case] = contenders
        for c in contenders:
            med, low, high = tokens_per_second(c)
            print(f"  {c.label:26s} {med:10,.0f} tok/s ({low:,.0f}-{high:,.0f})", flush=True)
    if not args.no_memory:
        for case in args.cases:
            for label, name in (("Marian fp32", "marian"), ("Vaswani fp32", "vaswani")):
                memory[(label, case)] = peak_rss(args, name, case)
    out = args.out or Path(__file__).parent / "results" / f"compare_marian_{args.preset}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_report(args, results, checks, memory, out)
    plot(results, out.with_suffix(".png"), f"Vaswani vs Marian ({args.preset}, {args.threads} CPU threads)")


if __name__ == "__main__":
    main()
