"""The `vaswani` command: train, translate, evaluate.

Trainer settings keep their Transformers names (`--max_steps`, `--learning_rate`, ...), with the paper's values as
defaults. Without `--data`, `vaswani train` runs the built-in number-words task, offline, in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from transformers import HfArgumentParser

# Settings of the built-in task where it departs from the paper's WMT-sized defaults (small data, 2 CPU cores).
BUILTIN_DEFAULTS = {"vocab_size": 500, "preset": "small", "warmup_steps": 400, "max_steps": 1200,
                    "lr_scale": 0.5, "eval_split": "test"}  # fmt: skip


def train_command(argv: list[str]) -> int:
    from .data import read_parallel
    from .recipe import DataArguments, ModelArguments, VaswaniTrainingArguments, score, train, translate
    from .tasks import builtin_splits
    from .tokenization import train_shared_bpe

    parser = HfArgumentParser((DataArguments, ModelArguments, VaswaniTrainingArguments), prog="vaswani train")
    if argv and argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    defaults = {}
    if "--data" not in argv:
        given = {a.lstrip("-").replace("-", "_").split("=")[0] for a in argv if a.startswith("--")}
        defaults = {k: v for k, v in BUILTIN_DEFAULTS.items() if k not in given}
    parser.set_defaults(**defaults)
    data_args, model_args, training_args = parser.parse_args_into_dataclasses(argv)
    if data_args.data:
        pairs = {
            "train": read_parallel(data_args.data, data_args.train_split, data_args.src, data_args.tgt),
            data_args.eval_split: read_parallel(data_args.data, data_args.eval_split, data_args.src, data_args.tgt),
        }
        task = f"{data_args.data} ({data_args.src}->{data_args.tgt})"
    else:
        pairs = builtin_splits()
        task = "built-in English->German number words"
    print(f"task: {task}; {len(pairs['train'])} training pairs", flush=True)
    if model_args.model_name_or_path:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    else:
        tokenizer = train_shared_bpe((t for pair in pairs["train"] for t in pair), data_args.vocab_size)
    model, stats = train(pairs, data_args, model_args, training_args, tokenizer)
    eval_pairs = pairs[data_args.eval_split][: data_args.max_eval_samples]
    hypotheses = translate(
        model, tokenizer, [s for s, _ in eval_pairs], batch_size=training_args.per_device_eval_batch_size
    )
    metrics = score(hypotheses, [t for _, t in eval_pairs])
    summary = {**stats, "eval_split": data_args.eval_split, **metrics, "model_dir": training_args.output_dir}
    print(json.dumps(summary))
    print(f"BLEU {metrics['bleu']} on {data_args.eval_split} after {stats['steps']} steps "
          f"({stats['seconds']:.0f} s, {stats['target_tokens_per_s']:.0f} target tokens/s); "
          f"model saved in {training_args.output_dir}")  # fmt: skip
    return 0


def translate_command(argv: list[str]) -> int:
    from .recipe import load_for_inference, translate

    parser = argparse.ArgumentParser(prog="vaswani translate", description="Translate lines from a file or stdin.")
    parser.add_argument("model_dir")
    parser.add_argument("--input", help="file with one sentence a line (default: stdin)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-beams", type=int, default=None, help="default: the model's (paper: 4)")
    args = parser.parse_args(argv)
    model, tokenizer = load_for_inference(args.model_dir)
    lines = open(args.input, encoding="utf-8").read().splitlines() if args.input else sys.stdin.read().splitlines()
    kwargs = {"num_beams": args.num_beams} if args.num_beams else {}
    for line in translate(model, tokenizer, lines, batch_size=args.batch_size, progress=sys.stderr.isatty(), **kwargs):
        print(line)
    return 0


def evaluate_command(argv: list[str]) -> int:
    from .data import read_parallel
    from .recipe import load_for_inference, score, translate
    from .tasks import builtin_splits

    parser = argparse.ArgumentParser(prog="vaswani evaluate", description="BLEU/chrF of a model with sacrebleu.")
    parser.add_argument("model_dir")
    parser.add_argument("--data", help="folder of {split}.{lang} files (default: the built-in task)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    model, tokenizer = load_for_inference(args.model_dir)
    pairs = read_parallel(args.data, args.split, args.src, args.tgt) if args.data else builtin_splits()[args.split]
    hypotheses = translate(model, tokenizer, [s for s, _ in pairs], batch_size=args.batch_size)
    print(json.dumps({"split": args.split, "sentences": len(pairs), **score(hypotheses, [t for _, t in pairs])},
                     indent=2))  # fmt: skip
    return 0


COMMANDS = {"train": train_command, "translate": translate_command, "evaluate": evaluate_command}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: vaswani {train,translate,evaluate} [options]   (vaswani COMMAND --help for options)")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[argv[0]](argv[1:])
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
