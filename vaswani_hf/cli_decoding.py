"""The decoding jobs of the `vaswani` command: translate, evaluate, score, shortlist and serve, with the argument
builders they share (models or an ensemble, precision, engine, decoding settings). `cli.py` dispatches to them.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def at_least_one(text: str) -> int:
    """argparse type of counts (beams, batch size, n-best, checkpoints): 0 or less would be silently replaced."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def _add_precision(parser: argparse.ArgumentParser) -> None:
    from .model.precision import PRECISIONS

    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="auto (default): on a CPU with native bf16 (AMX-BF16 or AVX512-BF16), bf16 if it "
                        "measured faster than fp32 on this machine (timed once, then cached); bf16 on GPUs that have "
                        "it; else fp32. int8: dynamic quantization for CPU serving (never picked by auto); see "
                        "vaswani_hf.model.precision")  # fmt: skip


def _add_decoding(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--decoding", choices=["paper", "fairseq", "ott"], default=None,
                        help="the paper's search (beam 4, GNMT penalty 0.6, source + 50 tokens), fairseq-generate's "
                        "(beam 5, score / length, 200 tokens, </s> never first) or Ott et al. 2018's, behind the "
                        "converted fairseq models' 29.3 / 43.2 (fairseq's with beam 4 and score / length^0.6); "
                        "default: the model's generation config")  # fmt: skip
    parser.add_argument("--num-beams", type=at_least_one, default=None, help="default: the model's (paper: 4)")
    parser.add_argument("--length-penalty", type=float, default=None,
                        help="the model's length penalty (GNMT alpha for the paper's; default: the model's; paper: "
                        "0.6; tune it on a development set)")  # fmt: skip


def _decoding(args: argparse.Namespace, model=None) -> dict:
    """generate() settings the user gave (a preset, then single settings); the rest come from the model's
    generation config. fairseq's presets stop where fairseq would for this model (`fairseq_length`)."""
    from .model.search_vaswani import DECODING_PRESETS

    settings = {}
    if getattr(args, "decoding", None) in ("fairseq", "ott"):  # the converters' module, imported only for them
        from .interop.convert.fairseq import FAIRSEQ_DECODING, OTT_DECODING, fairseq_length

        preset = FAIRSEQ_DECODING if args.decoding == "fairseq" else OTT_DECODING
        settings = fairseq_length(getattr(model, "config", None), dict(preset))
    elif getattr(args, "decoding", None):
        settings = dict(DECODING_PRESETS[args.decoding])
    settings.update({name: value for name, value in (("num_beams", args.num_beams),
                     ("length_penalty", args.length_penalty)) if value is not None})  # fmt: skip
    return settings


def _add_long_lines(parser: argparse.ArgumentParser) -> None:
    from .translation.source_lines import LONG_LINES

    parser.add_argument("--long-lines", choices=LONG_LINES, default="cut",
                        help="a line longer than the model reads: cut (default: translate its first tokens, with a "
                        "warning naming the line), split (at sentence ends, translations rejoined), or error (stop, "
                        "naming the line)")  # fmt: skip


def _add_decoding_job_options(parser: argparse.ArgumentParser) -> None:
    """What translate and evaluate share: long lines, the search's settings, precision and engine."""
    _add_long_lines(parser)
    _add_decoding(parser)
    _add_precision(parser)
    _add_engine(parser)


def _add_engine(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=["torch", "onnxruntime"], default="torch",
                        help="onnxruntime: MODEL_DIR is a `vaswani export --format onnx` folder, decoded with the same "
                        "greedy/beam search (needs the onnx extra)")  # fmt: skip


def _add_models(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", nargs="?", help="a saved model folder (or --models for an ensemble)")
    parser.add_argument("--models", nargs="+", metavar="MODEL_DIR",
                        help="an ensemble: two or more model folders of one vocabulary (one tokenizer), decoded "
                        "together with their log-probabilities averaged at every step")  # fmt: skip


def _model_dirs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    if (args.model_dir is None) == (args.models is None):
        parser.error("give one model folder, or an ensemble with --models A B [C ...] (not both)")
    return [args.model_dir] if args.models is None else args.models


def _load(args: argparse.Namespace, model_dirs: list[str]):
    """The model (or ensemble) in the precision asked for, which is said on stderr (stdout holds the results)."""
    from .model.precision import resolve_precision
    from .translation.inference import check_model_folder, default_device, is_local, load_for_inference

    if getattr(args, "engine", "torch") == "onnxruntime":
        from .interop.onnx import OnnxSeq2Seq

        if args.precision != "auto":
            raise ValueError(f"--precision {args.precision} is for the torch engine: an onnxruntime folder runs the "
                             "weights it was exported with (export with --quantize int8 for int8).")  # fmt: skip
        loaded = [OnnxSeq2Seq.with_tokenizer(folder) for folder in model_dirs]
        weights = loaded[0][0].weights
        print(f"engine: onnxruntime ({weights}); device: cpu", file=sys.stderr)
        choice = argparse.Namespace(name=f"onnxruntime {weights}")
    else:
        for folder in model_dirs:  # a folder that is not a whole model stops before the precision is measured
            if is_local(folder):
                check_model_folder(folder)
        device = default_device(args.precision)
        choice = resolve_precision(args.precision, device)
        print(f"precision: {choice}; device: {device}", file=sys.stderr)
        loaded = [load_for_inference(folder, device=device, precision=choice) for folder in model_dirs]
    model, tokenizer = loaded[0]
    if len(loaded) == 1:
        return model, tokenizer, choice
    from .translation.ensemble import Ensemble

    for folder, (_, other) in zip(model_dirs[1:], loaded[1:], strict=True):
        if other.get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"--models: {folder} has another vocabulary than {model_dirs[0]} (their tokenizers "
                             "differ): an ensemble needs models trained with one tokenizer.")  # fmt: skip
    print(f"ensemble of {len(loaded)} models", file=sys.stderr)
    return Ensemble([m for m, _ in loaded]), tokenizer, choice


def translate_command(argv: list[str]) -> int:
    from .translation.source_lines import LineReport

    parser = argparse.ArgumentParser(
        prog="vaswani translate",
        description="Translate lines from a file or stdin, one translation a line. With --nbest N: N lines per input "
        "line, 'INDEX ||| TRANSLATION ||| SCORE' (Moses n-best format; INDEX counts input lines from 0, best first, "
        "SCORE is the length-penalised log-probability beam search ranks by). --alignments adds ' ||| ALIGNMENT' to "
        "each line (Moses 'i-j' word pairs).",
    )
    _add_models(parser)
    parser.add_argument("--input", help="file with one sentence a line (default: stdin)")
    parser.add_argument("--batch-size", type=at_least_one, default=32, help="most sentences per batch")
    parser.add_argument(
        "--max-tokens",
        type=at_least_one,
        default=4096,
        help="most padded source tokens per batch (sentences are sorted by length first)",
    )
    parser.add_argument("--window", type=at_least_one, default=10_000,
                        help="lines read, sorted and translated at a time; results are written in input order "
                        "after each window, so a file of any size never sits in memory")  # fmt: skip
    parser.add_argument("--nbest", type=at_least_one, default=None,
                        help="print the N best translations with their scores")  # fmt: skip
    parser.add_argument("--alignments", action="store_true",
                        help="add each translation's word alignment to its source line (Moses 'i-j': source word i, "
                        "translation word j, from 0, words split at whitespace), read from the cross-attention of the "
                        "config's alignment_layer / alignment_heads")  # fmt: skip
    parser.add_argument("--constraints", metavar="FILE",
                        help="one line per input line: phrases (separated by tabs) every translation of that line "
                        "must contain; an empty line for none (needs beam search)")  # fmt: skip
    parser.add_argument("--shortlist", nargs="?", const="", metavar="FILE",
                        help="score only each batch's likely target tokens (`vaswani shortlist`; default file: "
                        "MODEL_DIR/shortlist.safetensors): faster, at a small BLEU cost")  # fmt: skip
    parser.add_argument(
        "--prefix",
        metavar="FILE",
        help="one line per input line: the text its translation starts with (an empty line for none)",
    )
    _add_decoding_job_options(parser)
    args = parser.parse_args(argv)
    model_dirs = _model_dirs(parser, args)
    for name in ("input", "constraints", "prefix"):
        path = getattr(args, name)
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"--{name} {path}: no such file.")
    if args.alignments and (args.models or args.engine != "torch"):
        raise ValueError("--alignments reads one PyTorch model's cross-attention: give a single model and the torch "
                         "engine.")  # fmt: skip
    done, lines = _light_start(args, model_dirs[0], _stream_lines(args.input))
    if done:
        return 0
    from . import finish_import

    finish_import()  # handed over: Transformers' model, where the light start had left the package
    from .translation.inference import translate_stream

    progress, total = sys.stderr.isatty(), None
    if args.input is not None and (progress or args.constraints or args.prefix):
        total = _lines_in(args.input)  # the bar's total, the side files' check
    model, tokenizer, _ = _load(args, model_dirs)
    lexical = _lexical_files(args, tokenizer, total)
    if args.shortlist is not None:
        from .translation.shortlist import Shortlist

        lexical["shortlist"] = Shortlist.load(args.shortlist or model_dirs[0], tokenizer)
    report = LineReport()
    results = translate_stream(model, tokenizer, lines, window=args.window, progress=progress,
                               total=total, nbest=args.nbest or 1, batch_size=args.batch_size,
                               max_tokens=args.max_tokens, alignments=args.alignments, long_lines=args.long_lines,
                               report=report, **lexical, **_decoding(args, model))  # fmt: skip
    for index, candidates in enumerate(results):
        for text, value, *alignment in candidates[: args.nbest or 1]:
            fields = [text] if args.nbest is None else [str(index), text, f"{value:.6f}" if value is not None else ""]
            print(" ||| ".join(fields + alignment).rstrip())
        sys.stdout.flush()
    print(report.summary(), file=sys.stderr)
    return 0


def _light_start(args: argparse.Namespace, model_dir: str, lines: Iterator[str]) -> tuple[bool, Iterator[str]]:
    """`vaswani translate` on torch alone (translation/light_translator.py), for an input of any length: (True, _)
    where it translated and wrote the lines; (False, the lines) where it hands over to the Transformers model, which
    it does before reading any line (and before saying the precision, which the model's path then says). The
    precision is said before any line is read, as the model's path says it."""
    plain = (args.models is None and args.engine == "torch" and args.nbest is None and not args.alignments
             and args.constraints is None and args.prefix is None and args.shortlist is None
             and args.decoding in (None, "paper"))  # fmt: skip
    if not plain:
        return False, lines
    import torch

    from .translation.light_translator import switched_on

    if not switched_on() or torch.cuda.is_available():  # a GPU runs Transformers' model (`default_device`)
        return False, lines
    fast = "VASWANI_CPU_FAST_PATHS"  # set and on: the user asked for the fast products, which the model's path has
    if os.environ.get(fast, "").strip() and switched_on(fast):
        return False, lines
    from .model.precision import resolve_precision
    from .translation.light_translator import LightTranslator
    from .translation.source_lines import LineReport

    # before any line is read (as the model's path): a precision this CPU lacks, or a folder it does not read, hands
    # over at once, and the model's path says what is wrong in its own order (the folder first)
    try:
        choice = resolve_precision(args.precision, "cpu")
    except ValueError:
        return False, lines
    translator = LightTranslator.of(model_dir, choice.name)
    if translator is None or not translator.takes(_decoding(args)):
        return False, lines
    print(f"precision: {choice}; device: cpu", file=sys.stderr)
    from tqdm import tqdm

    progress = sys.stderr.isatty()
    total = _lines_in(args.input) if args.input is not None and progress else None
    report, first_line = LineReport(), 1
    # as `translate_stream`: `--window` lines at a time, each written before the next is read (memory flat)
    with tqdm(total=total, desc="translating", unit="line", disable=not progress) as bar:
        while window := list(itertools.islice(lines, args.window)):
            for text in translator.translate_lines(window, batch_size=args.batch_size, max_tokens=args.max_tokens,
                                                   long_lines=args.long_lines, report=report, first_line=first_line,
                                                   **_decoding(args)):  # fmt: skip
                print(text.rstrip())
            sys.stdout.flush()
            first_line += len(window)
            bar.update(len(window))
    print(report.summary(), file=sys.stderr)
    return True, iter(())


def _lines_in(path: str) -> int:
    """How many lines a file has (a progress bar's total): one extra pass over its bytes."""
    with open(path, "rb") as counted:
        return sum(1 for _ in counted)


def _lexical_files(args: argparse.Namespace, tokenizer, input_lines: int | None) -> dict:
    """--constraints / --prefix, read and checked in full before anything is translated (so a bad line stops the
    run with nothing written), as `translate_stream`'s `constraints` / `prefixes`."""
    from .translation.inference import lexical_ids

    lexical = {}
    for name, kind, key in (("constraints", "constraint", "constraints"), ("prefix", "prefix", "prefixes")):
        path = getattr(args, name)
        if path is None:
            continue
        lines = _read_lines(path)
        entries = (
            [[p.strip() for p in line.split("\t") if p.strip()] for line in lines] if kind == "constraint" else lines
        )
        if input_lines is not None and len(lines) != input_lines:
            raise ValueError(f"--{name} {path} has {len(lines)} lines but --input {args.input} has {input_lines}: "
                             "give one line per input line (an empty line for none).")  # fmt: skip
        lexical_ids(tokenizer, entries, kind, len(entries))
        lexical[key] = entries
    return lexical


def _stream_lines(path: str | None):
    """Lines of a file (or stdin) one at a time, without their line ends; bad UTF-8 names the line (each line is
    decoded by itself: a text stream decodes ahead in blocks and cannot say where)."""
    from .data.encodings import check_utf8_encoding

    if path is None and sys.stdin is None:  # started with stdin closed (`<&-`)
        raise ValueError("stdin is closed: pipe the lines in, or give --input FILE.")
    stream = sys.stdin.buffer if path is None else open(path, "rb")
    try:
        # UTF-16 (Notepad's "Unicode") named as such, before its NULs are read as text
        check_utf8_encoding(path or "stdin", stream.peek(4096)[:4096] if hasattr(stream, "peek") else b"")
        for number, raw in enumerate(stream, 1):
            try:
                line = raw.rstrip(b"\r\n").decode("utf-8")
                yield line.removeprefix("\ufeff") if number == 1 else line  # a byte-order mark, as prepare drops
            except UnicodeDecodeError as err:
                raise ValueError(f"{path or 'stdin'} is not UTF-8 text (line {number}, byte {err.start}).") from None
    finally:
        if path is not None:
            stream.close()


def score_command(argv: list[str]) -> int:
    from .translation.inference import load_for_inference, score_translations
    from .translation.source_lines import SCORE_LONG_LINES

    parser = argparse.ArgumentParser(
        prog="vaswani score",
        description="Forced decoding: the log-probability of each target line given its source line, one JSON "
        "object a line: log_prob (natural log, sum over the target tokens and EOS), tokens, mean_log_prob, "
        "token_log_probs, token_strings. For filtering parallel data and reranking n-best lists.",
    )
    parser.add_argument("model_dir")
    parser.add_argument("--source", required=True, help="file with one source sentence a line")
    parser.add_argument("--target", required=True, help="file with the target sentences, aligned with --source")
    parser.add_argument("--batch-size", type=at_least_one, default=32)
    parser.add_argument("--long-lines", choices=SCORE_LONG_LINES, default="error",
                        help="a pair with a side longer than the model reads (never cut: a cut sentence's score is not "
                        "the sentence's): error (default: stop, naming every such line) or skip (as fairseq's "
                        "--skip-invalid-size-inputs-valid-test: a warning names it, and its output line is "
                        "{\"skipped\": why})")  # fmt: skip
    args = parser.parse_args(argv)
    sources, targets = _read_lines(args.source), _read_lines(args.target)
    if len(sources) != len(targets):
        raise ValueError(f"--source {args.source} has {len(sources)} lines but --target {args.target} has "
                         f"{len(targets)}: the files must be aligned, a target line for each source line.")  # fmt: skip
    model, tokenizer = load_for_inference(args.model_dir)
    for result in score_translations(model, tokenizer, sources, targets, args.batch_size, sys.stderr.isatty(),
                                     args.long_lines):  # fmt: skip
        print(json.dumps(result, ensure_ascii=False))
    return 0


def _read_lines(path: str | None) -> list[str]:
    """A file's (or stdin's) lines, ending at \\n only, as `_stream_lines` reads --input (str.splitlines would also
    split at U+2028, NEL, form feeds and the like, giving more lines than the input has), each without its line
    end: a final \\n ends the last line, and a CR before a \\n is part of the line end."""
    from .data.encodings import check_utf8_encoding

    data = sys.stdin.buffer.read() if path is None else Path(path).read_bytes()
    check_utf8_encoding(path or "stdin", data[:4096])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path or 'stdin'} is not UTF-8 text (byte {err.start}).") from None
    text = text.removeprefix("\ufeff")  # a byte-order mark (Notepad writes one), as prepare drops it
    return [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")] if text else []


def evaluate_command(argv: list[str]) -> int:
    """`vaswani evaluate`: the model's task evaluates it (a parser's EVALB figures), or, where the task leaves it
    to the shared evaluation, BLEU and chrF of its translations."""
    from .data.number_words import builtin_splits
    from .data.readers import load_split
    from .translation.inference import evaluate
    from .translation.metrics import load_metrics
    from .translation.source_lines import LineReport

    parser = argparse.ArgumentParser(prog="vaswani evaluate", description="BLEU/chrF of a model with sacrebleu; a "
                                     "parse model's EVALB figures (docs/parsing.md).")  # fmt: skip
    _add_models(parser)
    parser.add_argument("--data", help="folder of {split}.{lang} files (default: the built-in task); for a parse "
                        "model, of {split}.trees files (default: the built-in treebank)")  # fmt: skip
    parser.add_argument("--split", default="test")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--batch-size", type=at_least_one, default=32)
    parser.add_argument("--hypotheses", help="also write the translations to this file, one line per source line")
    parser.add_argument("--metric", action="append", default=[],
                        help="a metric reported beside BLEU and chrF (repeatable): a packaged name (bleu, chrf), a "
                        "local 🤗 Evaluate module (a folder holding NAME.py, or the .py file), or a Hub id when "
                        "online")  # fmt: skip
    _add_decoding_job_options(parser)
    from .tasks import TASKS, task_of

    for task in TASKS.values():
        task.evaluate_options(parser)
    args = parser.parse_args(argv)
    model_dirs = _model_dirs(parser, args)
    load_metrics(args.metric)  # a metric that does not load stops before any model is read or sentence decoded
    model, tokenizer, precision = _load(args, model_dirs)
    task = task_of(getattr(model, "config", None))
    if (status := task.evaluate(args, model, tokenizer, precision, _decoding(args, model))) is not None:
        return status
    # every pair of a test set is scored, an empty source too (its hypothesis is empty), so that the hypotheses
    # stay line by line beside the references
    pairs = (load_split(args.data, args.split, args.src, args.tgt, keep_empty=True) if args.data
             else builtin_splits()[args.split])  # fmt: skip
    report = LineReport()
    result, hypotheses = evaluate(model, tokenizer, pairs, args.batch_size, metrics=args.metric,
                                  long_lines=args.long_lines, report=report, **_decoding(args, model))  # fmt: skip
    if args.hypotheses:
        Path(args.hypotheses).write_text("".join(f"{line}\n" for line in hypotheses), encoding="utf-8")
    lines = {"empty_sources": report.empty, "lines_cut": len(report.cut), "lines_split": len(report.split)}
    print(json.dumps({"split": args.split, "sentences": len(pairs), "precision": precision.name, **result, **lines},
                     indent=2))  # fmt: skip
    return 0


def shortlist_command(argv: list[str]) -> int:
    from transformers import AutoTokenizer

    from .data.readers import load_split
    from .translation.shortlist import build_shortlist

    parser = argparse.ArgumentParser(prog="vaswani shortlist", description="Build a vocabulary shortlist from "
                                     "training data and save it beside the model (translate --shortlist).")  # fmt: skip
    parser.add_argument("model_dir")
    parser.add_argument("--data", required=True, help="folder of {split}.{lang} files (the training data)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--per-source", type=at_least_one, default=50, help="target tokens kept per source token")
    parser.add_argument("--frequent", type=at_least_one, default=500, help="most frequent target tokens, always kept")
    args = parser.parse_args(argv)
    if not (Path(args.model_dir) / "config.json").is_file():
        raise FileNotFoundError(f"{args.model_dir} is not a model directory (no config.json).")
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    shortlist = build_shortlist(tokenizer, load_split(args.data, args.split, args.src, args.tgt), args.per_source,
                                args.frequent)  # fmt: skip
    path = shortlist.save(args.model_dir)
    print(f"shortlist of {args.per_source} targets per source token and {len(shortlist.frequent)} frequent ones "
          f"written to {path}; translate with `vaswani translate {args.model_dir} --shortlist`")  # fmt: skip
    return 0


# `vaswani serve`'s bounds on one request and on the queue (docs/serving.md, "Limits"); defaults: serving.Settings
SERVE_BOUNDS = {
    "max_chars": "most characters a request, its texts together (400 on LibreTranslate's API, 413 on the native one)",
    "max_lines": "most lines a request, its texts together",
    "batch_limit": "most texts in a request's list (LibreTranslate's --batch-limit)",
    "max_body_bytes": "most bytes a request body, refused before it is read (files for /translate_file included)",
    "max_queue_lines": "most lines waiting, for a batch or for their model to load; past it a request is refused at "
    "once with Retry-After (429 on LibreTranslate's API, 503 on the native one)",
    "max_connections": "most connections and requests at once (uvicorn's limit_concurrency; 503 past it)",
    "max_header_bytes": "most bytes of a request's line and headers (431 and the connection closed past it)",
    "max_headers": "most header fields a request (431 and the connection closed past it)",
    "max_beam": "the widest beam a request may ask for",
    "max_nbest": "most translations a request may ask for (n-best; alternatives + 1)",
}


def _served_models(args: argparse.Namespace):
    """The folders to serve (MODEL_DIR ..., or every model in --models FOLDER), each checked and described without
    loading it: a ServedModel a folder, and what its task serves it with (routers, batch function) by model."""
    from transformers import AutoConfig

    from .serving.catalog import ServedModel
    from .serving.service import saved_facts
    from .tasks import task_of
    from .translation.inference import check_model_folder, is_local

    folders = list(args.model_dirs)
    if args.models:
        root = Path(args.models)
        if not root.is_dir():
            raise FileNotFoundError(f"--models {root}: no such folder; give a folder whose subfolders are models.")
        found = sorted(str(p) for p in root.iterdir() if (p / "config.json").is_file())
        if not found:
            raise FileNotFoundError(f"--models {root}: no model folder inside (none holds a config.json).")
        folders += found
    if not folders:
        raise ValueError("give a model folder to serve (vaswani serve MODEL_DIR [MODEL_DIR ...]), or --models FOLDER")
    if len(folders) > 1 and (args.source or args.target):
        raise ValueError("--source and --target name one model's pair: with several models, each says its own "
                         "(training_facts.json)")  # fmt: skip
    served, serving = [], {}
    for folder in folders:
        if is_local(folder) and args.engine != "onnxruntime":
            check_model_folder(folder)
        task = task_of(AutoConfig.from_pretrained(folder))
        routers, decode_batch, languages = task.serving(args, folder)
        bleu = (saved_facts(folder).get("evaluation") or {}).get("bleu")
        model = ServedModel(folder, *languages, task.serves_pairs, bleu if isinstance(bleu, int | float) else None)
        served.append(model)
        serving[model] = routers, decode_batch
    return served, serving


def _api_keys(path_name: str | None) -> tuple[frozenset, dict]:
    """--api_keys FILE: a key a line, optionally followed by its requests per minute and characters per request
    (`-` for the server's), as LibreTranslate's keys have them."""
    if not path_name:
        return frozenset(), {}
    path = Path(path_name)
    if not path.is_file():
        raise FileNotFoundError(f"--api_keys {path}: no such file.")
    limits = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        numbers = [None if value == "-" else value for value in fields[1:3]]
        if len(fields) > 3 or not all(v is None or (v.isdigit() and int(v) > 0) for v in numbers):
            raise ValueError(f"--api_keys {path}, line {number}: write `KEY [REQUESTS_PER_MINUTE [CHARS_PER_REQUEST]]`"
                             " with whole numbers above 0 (or - for the server's limit).")  # fmt: skip
        limits[fields[0]] = tuple(int(v) if v else None for v in [*numbers, None, None][:2])
    if not limits:
        raise ValueError(f"--api_keys {path} holds no key: one key a line.")
    return frozenset(limits), limits


def serve_command(argv: list[str]) -> int:
    try:
        from .serving.catalog import Catalog
        from .serving.server import bound_memory, serve
        from .serving.service import Service, Settings, check_model_files
    except ImportError as err:  # FastAPI, uvicorn, prometheus-client: the serve extra
        raise ImportError(f"vaswani serve needs the serve extra ({err.name} is missing): pip install "
                          "\"vaswani-hf[serve]\"") from None  # fmt: skip

    parser = argparse.ArgumentParser(
        prog="vaswani serve",
        description="Serve models over HTTP, every pair behind one URL: LibreTranslate's API and a native one, "
        "concurrent requests batched per model (docs/serving.md).",
    )
    parser.add_argument("model_dirs", nargs="*", metavar="MODEL_DIR", help="saved model folders, one per pair")
    parser.add_argument("--models", metavar="FOLDER", help="serve every model folder inside FOLDER too")
    parser.add_argument("--max_loaded", type=at_least_one, default=None,
                        help="most models in memory: the others load on first use, the least recently used one "
                        "unloaded for them (default: all, loaded at start)")  # fmt: skip
    parser.add_argument("--preload", default=None, metavar="NAME,...",
                        help="with --max_loaded: models to load at start, by folder name or pair (en-de); 'all' "
                        "(default: none)")  # fmt: skip
    parser.add_argument("--sentences", choices=["on", "off"], default="on",
                        help="on (default): a line's sentences are translated one by one and joined with its "
                        "spacing; off: each line whole")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=5000, help="LibreTranslate's port by default")
    defaults = Settings()  # one place for the defaults: the options' and the in-process service's
    parser.add_argument("--max_batch_tokens", type=int, default=defaults.max_batch_tokens,
                        help="padded source tokens per batch (lines x longest); 1 turns batching off (one line a "
                        "batch)")  # fmt: skip
    parser.add_argument("--max_wait_ms", type=float, default=defaults.max_wait_ms,
                        help="how long the oldest waiting line waits for others to share its batch")  # fmt: skip
    for name, text in SERVE_BOUNDS.items():
        parser.add_argument(f"--{name}", type=at_least_one, default=getattr(defaults, name), help=text)
    parser.add_argument("--max_client_lines", type=at_least_one, default=None,
                        help="most lines one client (its address) may have in flight; past it 429 (default: half of "
                        "--max_queue_lines, at least --max_lines)")  # fmt: skip
    parser.add_argument("--header_timeout", type=float, default=defaults.header_timeout,
                        help="seconds a connection may take to send a request's headers (slow clients cut off)"
                        )  # fmt: skip
    parser.add_argument("--body_timeout", type=float, default=defaults.body_timeout,
                        help="seconds a request's body may pause between two chunks, and 6 times this in all (408 "
                        "past it)")  # fmt: skip
    parser.add_argument("--forwarded_allow_ips", default=None, metavar="IPS",
                        help="behind a proxy: the proxies (comma-separated addresses, or *) whose X-Forwarded-For "
                        "names the client, for --max_client_lines (uvicorn's; default: 127.0.0.1)")  # fmt: skip
    parser.add_argument("--open_metrics", action="store_true",
                        help="with --api_keys, serve /metrics without a key too (a scraper inside your "
                        "network)")  # fmt: skip
    parser.add_argument("--detect_threshold", type=float, default=defaults.detect_threshold,
                        help="source auto: refuse text the language identifier gives another language with at least "
                        "this probability (0-1; 1.01 never refuses)")  # fmt: skip
    parser.add_argument("--request_timeout", type=float, default=defaults.request_timeout,
                        help="seconds from a request's arrival to its answer, across parsing, loads, queues and "
                        "both legs of a composed pair (504; 503 while its model loads)")  # fmt: skip
    parser.add_argument("--drain_seconds", type=float, default=defaults.drain_seconds,
                        help="after SIGTERM, how long requests in flight may take to finish; the whole stop takes "
                        "at most 3 s more; a second signal stops at once")  # fmt: skip
    parser.add_argument("--api_keys", metavar="FILE", help="a file of API keys, one a line, each optionally with "
                        "its requests per minute and characters per request: a request without a key gets 400, with "
                        "a wrong one 403 (default: no keys needed)")  # fmt: skip
    parser.add_argument("--cors_origins", default="", help="comma-separated origins allowed to call from a "
                        "browser (CORS; default: none)")  # fmt: skip
    parser.add_argument("--source", help="the source language code, with one model (default: its training facts)")
    parser.add_argument("--target", help="the target language code, with one model (default: its training facts)")
    _add_decoding_job_options(parser)
    args = parser.parse_args(argv)
    bound_memory()
    keys, key_limits = _api_keys(args.api_keys)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings) if f.name in vars(args)}
    settings = Settings(
        **{
            **given,
            "api_keys": keys,
            "key_limits": key_limits,
            "sentences": args.sentences == "on",
            "decoding": _decoding(args),
            "cors_origins": tuple(o.strip() for o in args.cors_origins.split(",") if o.strip()),
            "max_client_lines": args.max_client_lines or 0,
        }
    )
    served, serving = _served_models(args)

    def load(model, metrics) -> Service:
        loaded, tokenizer, precision = _load(args, [model.model_dir])
        catalog.device, catalog.precision = str(getattr(loaded, "device", "cpu")), precision.name
        service = Service(loaded, tokenizer, settings, model.model_dir, catalog.device, precision.name,
                          (model.source, model.target), serving[model][1], metrics, catalog.device_lock)  # fmt: skip
        service.warm_up()
        return service

    catalog = Catalog(served, settings, load, args.max_loaded, check=lambda model: check_model_files(model.model_dir))
    catalog.precision = args.precision  # until a model loads and says what it resolved to
    routers_of = list(dict.fromkeys(routers for routers, _ in serving.values()))

    def routers(catalog_, run, check_key):
        return [router for routers_ in routers_of for router in routers_(catalog_, run, check_key)]

    start = time.monotonic()
    pairs = ", ".join(f"{m.pair} ({m.name})" for m in served)

    def ready() -> None:
        failed = "".join(f"; {m.name} failed to load: {catalog.failed[m].cause}" for m in served if m in catalog.failed)
        print(f"ready in {time.monotonic() - start:.1f} s; serving {pairs} on http://{args.host}:{args.port} (try it: "
              f"GET /; docs at /docs){failed}", file=sys.stderr, flush=True)  # fmt: skip

    print(f"listening on http://{args.host}:{args.port}: /health says loading until the models are in",
          file=sys.stderr, flush=True)  # fmt: skip
    serve(catalog, args.host, args.port, routers, _preloaded(catalog, args), ready)
    print("stopped", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # at once: the interpreter's teardown of torch and Transformers takes seconds (1.9 s measured), past the stop's
    # bound, and nothing is left to write; a batch that outlived the stop ends with the process
    os._exit(0)


def _preloaded(catalog, args: argparse.Namespace) -> list:
    """The models to load before serving: all without --max_loaded; else those --preload names (at most
    --max_loaded)."""
    if args.max_loaded is None:
        return list(catalog.models)
    if not args.preload:
        return []
    if args.preload == "all":
        return list(catalog.models)[: args.max_loaded]
    chosen = []
    for name in (n.strip() for n in args.preload.split(",") if n.strip()):
        model = next((m for m in catalog.models if name in (m.name, f"{m.source}-{m.target}", m.pair)), None)
        if model is None:
            raise ValueError(f"--preload {name}: no served model has that folder name or pair (e.g. en-de).")
        chosen.append(model)
    if len(chosen) > args.max_loaded:
        raise ValueError(f"--preload names {len(chosen)} models but --max_loaded is {args.max_loaded}.")
    return chosen
