"""The parsing jobs of the `vaswani` command (section 6.3): parse sentences into trees, score trees as EVALB does.
`cli.py` dispatches to them; `vaswani evaluate` of a parse model is its task's (`tasks/parsing.py`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli_decoding import _add_decoding_job_options, _decoding, _load, _stream_lines, at_least_one

# the parse loop and its refusals live with the Python API (parsing/parser.py), which the server shares too
from .parsing.parser import check_choices, parse_lines
from .parsing.parser import require_parser as _require_parser
from .tasks.parsing import add_tree_search


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
    check_choices(args.tree_search, args.long_lines, ("--tree_search", "--long-lines"))
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


def evalb_command(argv: list[str]) -> int:
    from .parsing.evalb import evalb_command as command

    return command(argv)
