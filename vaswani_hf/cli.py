"""The `vaswani` command: train, prepare, translate, evaluate, score, average, export, shortlist, push, attention.
The decoding jobs (translate, evaluate, score, shortlist) live in `cli_decoding.py`.

Trainer settings keep their Transformers names (`--max_steps`, `--learning_rate`, ...), with the paper's values as
defaults. Without `--data`, `vaswani train` runs the built-in number-words task, offline, in a few minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import threading
from pathlib import Path

from huggingface_hub.errors import StrictDataclassError

# the decoding commands' module imports only the standard library at its top: each command imports what it uses
from .cli_decoding import (
    at_least_one,
    evaluate_command,
    score_command,
    serve_command,
    shortlist_command,
    translate_command,
)

logger = logging.getLogger("vaswani")


def _is_builtin(argv: list[str]) -> bool:
    return not any(a.split("=")[0] in ("--data", "--dataset_name", "--dataset-name") for a in argv)


def _repeated_metrics_joined(argv: list[str]) -> list[str]:
    """`--metric a --metric b` as one `--metric a b` (HfArgumentParser keeps only the last of a repeated list)."""
    metrics, rest, index = [], [], 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--metric" and index + 1 < len(argv):
            metrics.append(argv[index + 1])
            index += 2
            continue
        if arg.startswith("--metric="):
            metrics.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        index += 1
    return rest + (["--metric", *metrics] if metrics else [])


INTERRUPTED = 130  # the shell's code for a command ended by SIGINT (128 + 2)
TRAINING_ONLY_DATA_ARGUMENTS = ("bpe_dropout", "max_eval_samples", "metric", "tree_search")


def _option_names(argv: list[str]) -> set[str]:
    """The options given, spelled with underscores and without their values: `--bpe-dropout=0.1` -> bpe_dropout."""
    return {a.lstrip("-").replace("-", "_").split("=")[0] for a in argv if a.startswith("--")}


def _option_value(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in argv (the last one given)."""
    value = None
    for index, arg in enumerate(argv):
        if arg.replace("-", "_").lstrip("_") == name and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith("--") and arg[2:].replace("-", "_").split("=")[0] == name and "=" in arg:
            value = arg.split("=", 1)[1]
    return value


def train_arguments(argv: list[str], device: str | None = None) -> tuple:
    """`vaswani train`'s options as (data, model, training arguments, whether the data is built in), with the
    defaults of the task asked for: where they depart from the paper's WMT-sized ones, for its built-in data or
    for this `device` kind (default: "cuda" where one is visible and not --use_cpu, else "cpu")."""
    import torch
    from transformers import HfArgumentParser

    from .tasks import task_named
    from .training.recipe import DataArguments, ModelArguments, VaswaniTrainingArguments

    parser = HfArgumentParser((DataArguments, ModelArguments, VaswaniTrainingArguments), prog="vaswani train")
    argv = _repeated_metrics_joined(argv)
    builtin = _is_builtin(argv)
    given = _option_names(argv)
    task = task_named(_option_value(argv, "task") or DataArguments.task)
    if device is None:
        device = "cpu" if "use_cpu" in given or not torch.cuda.is_available() else "cuda"
    # The command picks the precision by the hardware (vaswani_hf.model.precision); the Python class keeps fp32.
    defaults = {"precision": "auto", "output_dir": task.output_dir,
                **task.train_defaults(builtin, device, preset_given="preset" in given)}  # fmt: skip
    if "preset" in given:  # the narrowing belongs to the built-in default preset, not to one asked for
        given.add("config_overrides")
    if given & {"save_steps", "average_last"}:  # asking for checkpoints ends the built-in task's "no checkpoints"
        given.add("save_strategy")
    parser.set_defaults(**{k: v for k, v in defaults.items() if k not in given})
    return (*parser.parse_args_into_dataclasses(argv), builtin)


def train_command(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        from transformers import HfArgumentParser

        from .training.recipe import DataArguments, ModelArguments, VaswaniTrainingArguments

        HfArgumentParser((DataArguments, ModelArguments, VaswaniTrainingArguments), prog="vaswani train").print_help()
        return 0
    from .training.recipe import run_training

    *arguments, builtin = train_arguments(argv)
    return run_training(*arguments, builtin=builtin)


def prepare_command(argv: list[str]) -> int:
    from transformers import HfArgumentParser

    from .data.preparation import prepare, say
    from .data.prepared_cache import clear_cache
    from .tasks import task_named
    from .training.recipe import DataArguments

    parser = HfArgumentParser(DataArguments, prog="vaswani prepare",
                              description="Read, learn the BPE vocabulary and tokenize a corpus once, into a folder "
                              "that `vaswani train --data DIR` memory-maps.")  # fmt: skip
    parser.add_argument("--output_dir", help="where to write the prepared data (default: the cache)")
    parser.add_argument("--eval_splits", nargs="*", default=None,
                        help="evaluation splits to prepare beside the training split, each kept whole (default: "
                        "--eval_split, when the data holds it); one added later is prepared alone")  # fmt: skip
    parser.add_argument("--clear_cache", action="store_true", help="delete the cache of prepared data and stop")
    # DataArguments also holds what only training reads: hidden here, and refused by name rather than ignored
    for action in parser._actions:
        if action.dest in TRAINING_ONLY_DATA_ARGUMENTS:
            action.help = argparse.SUPPRESS
    if given := [f"--{a}" for a in TRAINING_ONLY_DATA_ARGUMENTS if a in _option_names(argv)]:
        parser.error(f"{', '.join(given)}: a training option, not a preparation one; give it to `vaswani train "
                     "--data DIR` with the prepared folder.")  # fmt: skip
    parser.set_defaults(eval_split=task_named(_option_value(argv, "task") or DataArguments.task).eval_split)
    data_args, args = parser.parse_args_into_dataclasses(argv)
    if args.clear_cache:
        folder, freed = clear_cache(say)
        print(f"cleared {folder} ({freed / 2**30:.2f} GiB)")
        return 0
    if data_args.data is None and data_args.dataset_name is None:
        parser.error("give the corpus: --data FOLDER or --dataset_name NAME")
    data_args.read_data(args.eval_splits)
    request = data_args.request()
    evaluated = args.eval_splits
    if evaluated is None:  # the default split, where there is one
        evaluated = [s for s in [data_args.eval_split] if s != "none" and s in request.available_splits()]
    prepared = prepare(request, args.output_dir, data_args.preprocessing_num_workers, eval_splits=evaluated)
    data_args.run_task.after_prepare(data_args, prepared.path)
    pair = data_args.run_task.train_hint(data_args)
    print(f"prepared data in {prepared.path} (splits: {', '.join(prepared.splits)}); train on it with `vaswani train "
          f"--data {prepared.path} {pair} ...`")  # fmt: skip
    return 0


def push_command(argv: list[str]) -> int:
    from .interop.hub import push

    parser = argparse.ArgumentParser(prog="vaswani push", description="Share a saved model on the Hugging Face Hub.")
    parser.add_argument("model_dir")
    parser.add_argument("repo_id", help="user-or-org/name")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--revision", help="branch to commit to (created if missing; default: main)")
    parser.add_argument("--commit-message")
    parser.add_argument("--token", help="default: HF_TOKEN or the token saved by `hf auth login`")
    args = parser.parse_args(argv)
    info = push(args.model_dir, args.repo_id, args.private, args.revision, args.token, args.commit_message)
    print(f"pushed {args.model_dir} to {info.commit_url}")
    return 0


def attention_command(argv: list[str]) -> int:
    from .translation.attention import write_attention_maps
    from .translation.inference import load_for_inference

    parser = argparse.ArgumentParser(
        prog="vaswani attention", description="Heat maps of every layer and head for one sentence (PNG)."
    )
    parser.add_argument("model_dir")
    parser.add_argument("sentence")
    parser.add_argument("--output", default="attention", help="file prefix: PREFIX-{encoder,decoder,cross}.png")
    parser.add_argument("--num-beams", type=at_least_one, default=None, help="default: the model's (paper: 4)")
    args = parser.parse_args(argv)
    model, tokenizer = load_for_inference(args.model_dir)
    kwargs = {"num_beams": args.num_beams} if args.num_beams else {}
    for path in write_attention_maps(model, tokenizer, args.sentence, args.output, **kwargs):
        print(path)
    return 0


def average_command(argv: list[str]) -> int:
    from .training.averaging import average_checkpoints, last_checkpoints
    from .translation.inference import check_model_folder

    parser = argparse.ArgumentParser(prog="vaswani average", description="Average the last N checkpoints of a run.")
    parser.add_argument("run_dir", help="the --output_dir of a training run (holding checkpoint-* folders)")
    parser.add_argument("--last", type=at_least_one, default=5,
                        help="latest checkpoints to average (paper: 5 base, 20 big)")  # fmt: skip
    parser.add_argument("--output", help="where to save the averaged model (default: RUN_DIR/averaged)")
    args = parser.parse_args(argv)
    checkpoints = last_checkpoints(args.run_dir, args.last, "--last")
    if not checkpoints:
        raise FileNotFoundError(f"{args.run_dir} holds no complete checkpoint-N folder: train with --save_steps N so "
                                "that the run keeps checkpoints, then average them.")  # fmt: skip
    check_model_folder(checkpoints[-1])  # the averaged model takes its config and tokenizer from the last
    output = average_checkpoints(checkpoints, args.output or Path(args.run_dir) / "averaged")
    print(f"averaged {', '.join(c.name for c in checkpoints)} into {output}")
    return 0


def export_command(argv: list[str]) -> int:
    from .interop.export import export_ctranslate2, tokenizer_vocabulary
    from .translation.inference import load_for_inference

    parser = argparse.ArgumentParser(prog="vaswani export", description="Export a saved model to another engine.")
    parser.add_argument("model_dir", help="a saved model folder, or an ONNX export to quantize (--quantize int8)")
    parser.add_argument("output_dir", nargs="?", help="where to write it (or --output_dir)")
    parser.add_argument("--output_dir", dest="output_dir_option", metavar="OUTPUT_DIR")
    parser.add_argument("--format", "--to", dest="format", choices=["ctranslate2", "onnx"], default="ctranslate2",
                        help="ctranslate2 (default) or onnx (Optimum's seq2seq layout, run with onnxruntime: "
                        "`vaswani translate OUT --engine onnxruntime`)")  # fmt: skip
    parser.add_argument("--quantization", "--quantize", dest="quantization", default=None,
                        help="weights: CTranslate2's int8, int8_float32, float16, bfloat16...; ONNX: int8 "
                        "(onnxruntime dynamic quantization); default float32")  # fmt: skip
    args = parser.parse_args(argv)
    output_dir = args.output_dir_option or args.output_dir
    if output_dir is None:
        parser.error("give the output folder: vaswani export MODEL OUTPUT_DIR (or --output_dir OUTPUT_DIR)")
    from .interop.onnx import is_onnx_folder, quantize_onnx_folder

    if is_onnx_folder(args.model_dir):  # an ONNX export: its graphs, quantized
        if args.format != "onnx" or args.quantization != "int8":
            parser.error(f"{args.model_dir} holds ONNX graphs: give it --format onnx --quantize int8 to quantize "
                         "them; export the model folder itself for anything else")  # fmt: skip
        output = quantize_onnx_folder(args.model_dir, output_dir)
        print(f"ONNX graphs of {args.model_dir} quantized into {output} (int8); translate with `vaswani translate "
              f"{output} --engine onnxruntime`")  # fmt: skip
        return 0
    model, tokenizer = load_for_inference(args.model_dir, device="cpu")
    if args.format == "onnx":
        from .interop.onnx import export_onnx

        output = export_onnx(model, tokenizer, output_dir, args.quantization)
        print(f"ONNX graphs written to {output} ({args.quantization or 'float32'}); translate with `vaswani translate "
              f"{output} --engine onnxruntime`")  # fmt: skip
        return 0
    output = export_ctranslate2(model, tokenizer_vocabulary(tokenizer, model.config.vocab_size), output_dir,
                                args.quantization)  # fmt: skip
    print(f"CTranslate2 model written to {output} (ctranslate2.Translator({str(output)!r}); source tokens from the "
          "tokenizer saved beside the Vaswani model)")  # fmt: skip
    return 0


CONVERT_FORMATS = {
    "fairseq": "an extracted fairseq translation archive (model.pt, dict.SRC.txt, dict.TGT.txt, bpecodes or code), "
    "e.g. the paper's model trained by Ott et al. (2018): wmt16.en-de.joined-dict.transformer",
    "fsmt": "a saved Transformers FSMTForConditionalGeneration folder with one shared vocabulary",
    "marian": "a saved Transformers MarianMTModel folder (an Opus-MT model, config.json + weights + tokenizer files)",
}


def _yes_no(value: str) -> bool:
    if value.lower() not in ("yes", "no", "true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"give yes or no, not {value!r}")
    return value.lower() in ("yes", "true", "1")


def convert_command(argv: list[str]) -> int:
    """`vaswani convert FORMAT SRC_DIR OUT_DIR`: another library's trained model as a Vaswani model folder."""
    from .interop.convert import convert_fairseq_checkpoint, convert_fsmt_checkpoint, convert_marian_checkpoint

    about = "Convert another library's trained model into a Vaswani model folder (docs/trained-models.md)."
    parser = argparse.ArgumentParser(prog="vaswani convert", description=about)
    parser.add_argument("format", choices=list(CONVERT_FORMATS),
                        help="; ".join(f"{name}: {text}" for name, text in CONVERT_FORMATS.items()))  # fmt: skip
    parser.add_argument("src_dir", help="the folder the publisher ships")
    parser.add_argument("out_dir", help="where the Vaswani model folder is written (new or empty)")
    parser.add_argument("--paper-decoding", "--paper_decoding", dest="paper_decoding", action="store_true",
                        help="decode with the paper's settings (beam 4, GNMT penalty 0.6, source + 50) instead of "
                        "the converted model's own (fairseq's: beam 5, length penalty 1)")  # fmt: skip
    fairseq = parser.add_argument_group("fairseq archives")
    fairseq.add_argument("--checkpoint", help="which .pt file of the archive (needed where it holds several)")
    fairseq.add_argument("--source-lang", "--source_lang", dest="source_lang",
                         help="source language, where the checkpoint does not say")  # fmt: skip
    fairseq.add_argument("--target-lang", "--target_lang", dest="target_lang",
                         help="target language, where the checkpoint does not say")  # fmt: skip
    fairseq.add_argument("--bpe-codes", "--bpe_codes", dest="bpe_codes",
                         help="subword-nmt codes file, where the archive has no bpecodes or code file")  # fmt: skip
    fairseq.add_argument("--aggressive-dash-splits", "--aggressive_dash_splits", dest="aggressive_dash_splits",
                         type=_yes_no, metavar="yes|no",
                         help="Moses -a (default: the checkpoint's setting, else what the dictionary shows, else "
                         "yes, fairseq's)")  # fmt: skip
    fairseq.add_argument(
        "--escape",
        type=_yes_no,
        metavar="yes|no",
        help="Moses' XML escaping (default: the checkpoint's setting, else what the dictionary shows, else yes)",
    )
    fairseq.add_argument("--normalize-punctuation", "--normalize_punctuation", dest="normalize_punctuation",
                         action="store_true", help="Moses' punctuation normalisation before tokenizing")  # fmt: skip
    args = parser.parse_args(argv)
    if args.format == "fairseq":
        output = convert_fairseq_checkpoint(
            args.src_dir, args.out_dir, checkpoint=args.checkpoint, paper_decoding=args.paper_decoding,
            source_lang=args.source_lang, target_lang=args.target_lang, bpe_codes=args.bpe_codes,
            aggressive_dash_splits=args.aggressive_dash_splits, escape=args.escape,
            normalize_punctuation=args.normalize_punctuation, report=print,
        )  # fmt: skip
    else:
        given = [f"--{n.replace('_', '-')}" for n in ("checkpoint", "source_lang", "target_lang", "bpe_codes",
                 "aggressive_dash_splits", "escape") if getattr(args, n) is not None]  # fmt: skip
        if given or args.normalize_punctuation:
            parser.error(f"{', '.join(given) or '--normalize-punctuation'}: options of fairseq archives only")
        convert = convert_fsmt_checkpoint if args.format == "fsmt" else convert_marian_checkpoint
        output = convert(args.src_dir, args.out_dir, paper_decoding=args.paper_decoding)
    print(f"Vaswani model written to {output} (AutoModelForSeq2SeqLM.from_pretrained, or vaswani translate {output})")
    return 0


def _imported_when_run(module: str, name: str):
    """A command whose module is imported only when that command runs: `vaswani translate` must not pay for the
    parser's imports (its task, treebanks, PEFT) at every start."""

    def command(argv: list[str]) -> int:
        return getattr(importlib.import_module(module, __package__), name)(argv)

    command.__name__ = name
    return command


parse_command = _imported_when_run(".cli_parsing", "parse_command")
evalb_command = _imported_when_run(".cli_parsing", "evalb_command")

COMMANDS = {"train": train_command, "prepare": prepare_command, "translate": translate_command,
            "evaluate": evaluate_command, "average": average_command, "push": push_command,
            "attention": attention_command, "export": export_command, "score": score_command,
            "shortlist": shortlist_command, "serve": serve_command, "parse": parse_command,
            "evalb": evalb_command, "convert": convert_command}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"usage: vaswani {{{','.join(COMMANDS)}}} [options]   (vaswani COMMAND --help for options)")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if COMMANDS[argv[0]] is not translate_command:  # a process's earlier light start left the package's import
        from . import finish_import

        finish_import()
    try:
        return COMMANDS[argv[0]](argv[1:])
    except (ValueError, OSError, FloatingPointError, StrictDataclassError, ImportError, MemoryError) as err:
        # a config's @strict validation wraps our message: print the message itself
        message = err.__cause__ if isinstance(err, StrictDataclassError) and err.__cause__ else err
        print(f"error: {message}", file=sys.stderr)
        return _ended(2)
    except KeyboardInterrupt:  # Ctrl-C (a training run handles its signals itself and ends with a checkpoint)
        print("interrupted", file=sys.stderr)
        return _ended(INTERRUPTED)


def _ended(code: int) -> int:
    """`code`, or the process ended at once with it where decoding workers are still inside a search
    (translation/batch_workers.py, after an error or an interrupt): the interpreter's exit would wait for their
    batches, and a second Ctrl-C meanwhile aborts it. What was printed is flushed first, where it still can be (a
    reader of stdout that went away leaves nothing to flush to)."""
    if any(thread.name.startswith("vaswani-decoding") for thread in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
