"""The parsing jobs of the `vaswani` command (section 6.3): parse sentences into trees, score trees as EVALB does,
and evaluate a parse model on a treebank split. `cli.py` dispatches to them; `vaswani evaluate` hands a parse model
here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli_decoding import _add_decoding_job_options, _decoding, _load, _stream_lines, at_least_one
from .cli_decoding import evaluate_command as evaluate_models

# the parse loop and its refusals live with the Python API (parsing/parser.py), which the server shares too
from .parsing.parser import PARSE_LONG_LINES, TREE_SEARCHES, parse_lines
from .parsing.parser import require_parser as _require_parser


def add_tree_search(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree_search", "--tree-search", choices=TREE_SEARCHES, default="constrained",
                        help="constrained (default): the beam search extends a hypothesis only where it can still "
                        "become a tree of the sentence (parsing/constraint.py); plain: section 6.3's search as it "
                        "is, its outputs repaired into trees (docs/parsing.md)")  # fmt: skip


def _check_long_lines(args: argparse.Namespace) -> None:
    if args.long_lines not in PARSE_LONG_LINES:
        raise ValueError(
            f"--long-lines {args.long_lines}: a parse is one tree of the whole sentence; choose cut (the "
            "words past the model's length are attached at the top, counted as repaired) or error."
        )


def parse_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vaswani parse",
        description="Parse tokenised sentences (one a line, tokens split at spaces) with a parse model: one tree a "
        "line in Penn Treebank brackets, under a TOP bracket. Every tree is well formed and its leaves are the "
        "line's tokens in order, whatever the model emitted (docs/parsing.md says how outputs are repaired; the "
        "count is reported). With --nbest N: N lines per input line, 'INDEX ||| TREE ||| SCORE'.",
    )
    parser.add_argument("model_dir", help="a model trained with `vaswani train --task parse`")
    parser.add_argument("input", nargs="?", help="file of sentences (default: stdin)")
    parser.add_argument("--output", help="write the trees here (default: stdout)")
    parser.add_argument("--nbest", type=at_least_one, default=None, help="print the N best trees with their scores")
    parser.add_argument("--batch-size", type=at_least_one, default=32, help="most sentences per batch")
    parser.add_argument("--max-tokens", type=at_least_one, default=4096, help="most padded source tokens per batch")
    _add_decoding_job_options(parser)
    add_tree_search(parser)
    args = parser.parse_args(argv)
    _check_long_lines(args)
    if args.input is not None and not Path(args.input).is_file():
        raise FileNotFoundError(f"{args.input}: no such file.")
    model, tokenizer, _ = _load(args, [args.model_dir])
    parsing = _require_parser(model, args.model_dir)
    from .translation.source_lines import LineReport

    report = LineReport()
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    sentences = repaired = 0
    try:
        for index, parses in enumerate(parse_lines(model, tokenizer, parsing, _stream_lines(args.input),
                                                   args.nbest or 1, args.tree_search == "constrained",
                                                   batch_size=args.batch_size,
                                                   max_tokens=args.max_tokens, long_lines=args.long_lines,
                                                   report=report, progress=sys.stderr.isatty(),
                                                   **_decoding(args))):  # fmt: skip
            sentences += 1
            repaired += parses[0][2]
            for tree, value, _ in parses:
                tree = "" if tree is None else str(tree)
                fields = (
                    [tree] if args.nbest is None else [str(index), tree, f"{value:.6f}" if value is not None else ""]
                )
                out.write(" ||| ".join(fields) + "\n")
            out.flush()
    finally:
        if args.output:
            out.close()
    print(f"{sentences} sentences parsed; {repaired} best outputs needed repair to be trees of their sentence "
          f"(docs/parsing.md). {report.summary()}", file=sys.stderr)  # fmt: skip
    return 0


def evaluate_parser(args: argparse.Namespace, model, tokenizer, precision) -> int:
    """`vaswani evaluate` of a parse model: the split's trees (cleaned) parsed from their words, scored with
    EVALB's rules; prints EVALB's summary, then the figures as JSON."""
    from .parsing.evalb import format_summary, score_trees
    from .parsing.linearization import to_tree
    from .parsing.task import SCORING, builtin_pairs
    from .parsing.treebank import sentence_pairs, split_file
    from .parsing.trees import read_trees
    from .translation.source_lines import LineReport

    _check_long_lines(args)
    parsing = _require_parser(model, args.model_dir)
    if args.data:
        pairs = list(sentence_pairs(read_trees(split_file(Path(args.data), args.split)), parsing["form"]))
    else:
        splits, _ = builtin_pairs(parsing["form"])
        if args.split not in splits:
            raise ValueError(f"--split {args.split}: the built-in treebank has {', '.join(splits)}.")
        pairs = splits[args.split]
    gold = [to_tree(target, source.split())[0] for source, target in pairs]
    report = LineReport()
    parses = parse_lines(model, tokenizer, parsing, (source for source, _ in pairs),
                         constrained=getattr(args, "tree_search", "constrained") == "constrained",
                         batch_size=args.batch_size,
                         long_lines=args.long_lines, report=report, **_decoding(args))  # fmt: skip
    tests, repaired = [], 0
    for (tree, _, was_repaired), *_ in parses:
        tests.append(tree)
        repaired += was_repaired
    result = score_trees(gold, tests, SCORING)
    if args.hypotheses:
        Path(args.hypotheses).write_text("".join(f"{tree or ''}\n" for tree in tests), encoding="utf-8")
    print(format_summary(result))
    print(json.dumps({"split": args.split, "sentences": len(pairs), "precision": precision.name, **result.as_dict(),
                      "repaired": repaired, "lines_cut": len(report.cut)}))  # fmt: skip
    return 0


def evaluate_command(argv: list[str]) -> int:
    """`vaswani evaluate`: a translation model's BLEU and chrF, a parse model's EVALB figures."""

    def parser_or_none(args, model, tokenizer, precision) -> int | None:
        if getattr(getattr(model, "config", None), "parsing", None):
            return evaluate_parser(args, model, tokenizer, precision)
        return None

    return evaluate_models(argv, add_tree_search, parser_or_none)


def evalb_command(argv: list[str]) -> int:
    from .parsing.evalb import evalb_command as command

    return command(argv)
