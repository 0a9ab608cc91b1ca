"""English constituency parsing (section 6.3): words to a linearised tree, EVALB's figures, `POST /parse`.

A parse model's `config.parsing` (its form and labels) is what makes it this task's: `vaswani parse`, `vaswani
evaluate`, the pipeline and the server read it to turn outputs back into trees."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from ..parsing.task import ParseMetrics, builtin_gold, builtin_pairs, make_parser, parsing_of
from .base import Pairs, Task

logger = logging.getLogger(__name__)

# The built-in treebank (`vaswani train --task parse`): the built-in number-words task's small model (d_model 128,
# d_ff 512), 64-sentence batches (length-sorted token batches ran 1.85x the sentences/s but reached F1 93.4 where
# these reached 98.4), warmup 400 at half the Noam rate, and a 1,000-entry vocabulary that keeps each of its 622
# words whole; the steps fit 10 minutes on 2 cores (docs/parsing-performance.md).
CPU_SETTINGS = {"vocab_size": 1000, "preset": "small", "config_overrides": "d_model=128,d_ff=512",
                "warmup_steps": 400, "max_steps": 1650, "lr_scale": 0.5, "max_tokens": 0}  # fmt: skip
# A target is about 2.8 symbols a word: WSJ's longest training sentences (over 140 words) need room past
# translation's 256, and a parser must learn every tree, so a longer one is refused, not dropped (`check_lengths`).
MAX_LENGTH = 1024


def add_tree_search(parser) -> None:
    """--tree_search, as `vaswani parse` and `vaswani evaluate` take it."""
    from ..parsing.parser import TREE_SEARCHES

    parser.add_argument("--tree_search", "--tree-search", choices=TREE_SEARCHES, default="constrained",
                        help="constrained (default): the beam search extends a hypothesis only where it can still "
                        "become a tree of the sentence (parsing/constraint.py); plain: section 6.3's search as it "
                        "is, its outputs repaired into trees (docs/parsing.md)")  # fmt: skip


class ParsingTask(Task):
    name = "parse"
    summary = (
        "parse: --data holds treebank files ({split}.trees, .mrg or .ptb, gzip too) and the model learns words -> "
        "linearised trees (section 6.3; docs/parsing.md); without --data, the built-in treebank"
    )
    output_dir = "vaswani-parser"  # a parser does not overwrite the translation model of the README's first command
    eval_split = "dev"  # a treebank's held-out split (WSJ section 22)
    whole_target_words = True
    hub_tag = "constituency-parsing"
    hub_metrics = ("evalb",)
    card_metric_description = "EVALB's figures (COLLINS.prm)"
    serves_pairs = False  # served at POST /parse, loaded at start and kept
    card_names_data = card_decodes_trees = True

    def owns(self, config) -> bool:
        return parsing_of(config) is not None

    def train_defaults(self, builtin: bool, device: str, preset_given: bool = False) -> dict:
        """On a CPU, the settings measured there (the built-in treebank's, and a user's treebank's unless a
        --preset is asked for: `--preset parse` is the paper's GPU recipe); on a GPU, the paper's."""
        defaults = {"max_length": MAX_LENGTH, "eval_split": "test" if builtin else self.eval_split}
        if builtin:
            return {**CPU_SETTINGS, **defaults, "save_strategy": "no"}
        return {**CPU_SETTINGS, **defaults} if device == "cpu" and not preset_given else defaults

    def check_options(self, data_args) -> None:
        # tree symbols hold punctuation (/NP, PRP$, -LRB-), and treebank words are already split
        data_args.split_punctuation = False

    def read_data(self, data_args, eval_splits: list[str] | None = None) -> None:
        """A treebank folder's training split and `eval_splits` (default: --eval_split, where the folder has it)
        converted once into sentence pairs in the cache (`vaswani_hf.parsing.treebank`), which --data then names;
        a prepared folder is taken as it is."""
        if data_args.treebank is not None or data_args.data is None:
            return
        from ..data.prepared import PreparedData
        from ..parsing.treebank import SOURCE, TARGET, available_splits, pairs_folder, read_labels

        if not PreparedData.is_prepared(data_args.data):
            if eval_splits is None:
                present = available_splits(Path(data_args.data)) if Path(data_args.data).is_dir() else []
                eval_splits = [split for split in [data_args.eval_split] if split in present]
            data_args.data = str(pairs_folder(data_args.data, eval_splits, data_args.linearization,
                                              data_args.train_split))  # fmt: skip
        data_args.treebank = read_labels(data_args.data)
        data_args.src, data_args.tgt = SOURCE, TARGET

    def after_prepare(self, data_args, folder: Path) -> None:
        """A parse model takes its labels, and evaluation its gold trees, from beside the prepared data."""
        (folder / "labels.json").write_text(json.dumps(data_args.treebank, indent=1))
        for gold in Path(data_args.data).glob("*.gold"):
            shutil.copyfile(gold, folder / gold.name)

    def train_hint(self, data_args) -> str:
        return "--task parse"

    def builtin_pairs(self, data_args) -> dict[str, Pairs]:
        pairs, data_args.treebank = builtin_pairs(data_args.linearization)
        return pairs

    def vocabulary_texts(self, train: Pairs):
        # the BPE is the words'; the tree's symbols are entries whole
        return (source for source, _ in train), {symbol for _, target in train for symbol in target.split()}

    def describe(self, data_args, builtin: bool) -> str:
        return f"parsing {'the built-in treebank' if data_args.data is None else data_args.data} (words->trees)"

    def prepare_model(self, model, data_args, fine_tuning: bool) -> None:
        if data_args.treebank is not None and not (fine_tuning and parsing_of(model.config)):
            make_parser(model, data_args.treebank)

    def check_lengths(self, data_args) -> None:
        """A tree longer than --max_length would be dropped from training: refuse it before training instead,
        naming the longest and the option."""
        longest = (data_args.treebank or {}).get("longest_target") or {}
        if longest.get("tokens", 0) > data_args.max_length:
            raise ValueError(
                f"{longest['file']}: tree {longest['line']} ({longest['words']} words) is {longest['tokens']} target "
                f"tokens long, over --max_length {data_args.max_length}; a parser must learn every tree: raise "
                f"--max_length to {longest['tokens']} or more (sinusoidal positions extend to any length)."
            )

    def gold(self, data_args, split: str) -> list:
        from ..parsing.linearization import to_tree
        from ..parsing.treebank import read_gold

        if data_args.data is None:
            return builtin_gold(split)
        gold = read_gold(data_args.data, split)
        if gold is None:  # a folder of pairs with no trees beside it: the best left is the target rebuilt
            logger.warning("%s holds no %s.gold (the split's cleaned trees): scoring against trees rebuilt from the "
                           "targets, whose tags are the target's form's", data_args.data, split)  # fmt: skip
            gold = [to_tree(target, source.split())[0] for source, target in data_args.load(split)]
        return gold

    def metrics(self, tokenizer, model, data_args) -> ParseMetrics:
        return ParseMetrics(tokenizer, parsing_of(model.config), self.gold(data_args, data_args.eval_split))

    def batch_processors(self, tokenizer, model, data_args):
        if data_args.tree_search != "constrained":
            return None
        from ..parsing.constraint import tree_constraint_factory

        return tree_constraint_factory(tokenizer, parsing_of(model.config))

    def headline(self, metrics: dict, split: str) -> str:
        if "evalb_f1" not in metrics:
            return ""
        return f"EVALB F1 {metrics['evalb_f1']:.2f} on {split} ({metrics.get('repaired', 0)} outputs repaired), "

    def evaluate_options(self, parser) -> None:
        add_tree_search(parser)

    def evaluate(self, args, model, tokenizer, precision, decoding: dict) -> int | None:
        """`vaswani evaluate` of a parse model: the split's trees parsed from their words and scored, with EVALB's
        rules, against the split's cleaned trees themselves (for every form: an xx model's words take the gold
        tags, `scored_tree`). Prints EVALB's summary, then the figures as JSON; --hypotheses writes the trees
        scored, so `vaswani evalb` of the cleaned gold file and them gives the same figures."""
        parsing = parsing_of(getattr(model, "config", None))
        if parsing is None:
            return None
        from ..parsing.builtin_treebank import builtin_treebank
        from ..parsing.evalb import format_summary, score_trees
        from ..parsing.parser import check_choices, parse_lines
        from ..parsing.task import SCORING, scored_tree
        from ..parsing.treebank import gold_pairs, split_file
        from ..parsing.trees import read_trees
        from ..translation.source_lines import LineReport

        check_choices(args.tree_search, args.long_lines, ("--tree_search", "--long-lines"))
        if args.data:
            trees = read_trees(split_file(Path(args.data), args.split))
        else:
            splits = builtin_treebank()
            if args.split not in splits:
                raise ValueError(f"--split {args.split}: the built-in treebank has {', '.join(splits)}.")
            trees = splits[args.split]
        examples = list(gold_pairs(trees, parsing["form"]))
        report = LineReport()
        parses = parse_lines(model, tokenizer, parsing, (words for words, *_ in examples),
                             constrained=args.tree_search == "constrained", batch_size=args.batch_size,
                             long_lines=args.long_lines, report=report, **decoding)  # fmt: skip
        gold, tests, repaired = [], [], 0
        for (_, _, gold_tree), ((tree, _, was_repaired), *_) in zip(examples, parses, strict=True):
            gold.append(gold_tree)
            tests.append(None if tree is None else scored_tree(tree, gold_tree, parsing))
            repaired += was_repaired
        result = score_trees(gold, tests, SCORING)
        if args.hypotheses:
            Path(args.hypotheses).write_text("".join(f"{tree or ''}\n" for tree in tests), encoding="utf-8")
        print(format_summary(result))
        print(json.dumps({"split": args.split, "sentences": len(examples), "precision": precision.name,
                          **result.as_dict(), "repaired": repaired, "lines_cut": len(report.cut)}))  # fmt: skip
        return 0

    def serving(self, args, model_dir: str) -> tuple:
        from ..parsing.parser import check_choices
        from ..serving.parsing_api import parse_batch, parsing_routers

        check_choices("constrained", args.long_lines, ("--tree_search", "--long-lines"))  # `split` would rejoin trees
        language = args.source or "en"  # a parser reads and writes one language (its trees' words)
        return parsing_routers, parse_batch, (language, language)

    def card_use(self, data_args, builtin: bool, train_pairs: int) -> tuple[str, str, str]:
        source = (data_args.treebank or {}).get("source") or data_args.data  # --data names the cache's pairs now
        name = "the built-in English-like treebank" if data_args.data is None else Path(source).name
        use = (
            f"Research and education: section 6.3's parser reproduced on {name}; `vaswani parse` writes its trees "
            "in Penn Treebank brackets and `vaswani evalb` scores them as EVALB does."
        )
        limits = (f"trained only on {train_pairs:,} trees of {name}; input must be tokenised as its training "
                  "sentences were (Penn Treebank tokens, brackets as -LRB-/-RRB-).")  # fmt: skip
        return name, use, limits

    def card_doing(self, src, tgt) -> str:
        return "parsing English into constituency trees (section 6.3)"

    def card_languages(self, src, tgt) -> list[str]:
        return ["en"]
