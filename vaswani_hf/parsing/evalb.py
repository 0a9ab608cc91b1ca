"""EVALB (Sekine & Collins, 1997), the constituency parse scorer of section 6.3, in Python: the same rules, the same
figures and the same printed layout as the C program run with COLLINS.prm (or nk.prm), so that scripts that read
EVALB's output read ours.

The rules, as the C program applies them (each tree on its own, gold and test alike):
- A preterminal whose tag is a DELETE_LABEL (punctuation, -NONE-) is dropped with its word. The test tree's own
  tags decide for the test tree: a parser that tags "." as NN keeps a word the gold drops, and the sentence becomes
  an error sentence (length mismatch), not a tagging error.
- A sentence's length (for the len<=40 summary) counts the gold's words except DELETE_LABEL_FOR_LENGTH tags
  (-NONE-): punctuation counts there.
- A test tree without any word left (an empty line, or a failed parse written `()`, `(())`, `(TOP)`) is a skip
  sentence; a test tree whose word
  count differs from the gold's (after the quote repair of QUOTE_LABEL, nk only), or whose words differ, is an
  error sentence. Neither adds to the bracket, crossing or tagging figures; both count as sentences.
- Every non-preterminal is a bracket (start, end) over the kept words, the label cut at its first '-' or '='
  (NP-SBJ-1 is NP). A bracket over no kept word, or labelled a DELETE_LABEL (TOP), is dropped. A top bracket
  without a label, `( (S ...) )`, is a bracket labelled '' and counts. Unary chains count once per node.
- Brackets match as a multiset: each gold bracket takes the first unused test bracket of its span and label
  (EQ_LABEL: ADVP = PRT). A test bracket crosses when a gold bracket overlaps it without nesting.
- Tagging accuracy compares the tags of the kept words, position by position.
- After more than MAX_ERROR + 1 error sentences EVALB gives up without a summary; we raise `EvalbAborted`.

- Brackets read as EVALB reads them where a tree has empty ones (which `trees.parse_tree` refuses): `(NP)` is a
  bracket over no word (dropped), and a label followed by a space and `)` is a word that is empty: `( )` is an
  empty word (an error sentence against any gold), `(TOP )` an empty word tagged TOP (deleted: a skip).

What differs, on purpose: EVALB reads one tree a line; we read pretty-printed files too (`read_tree_file`). EVALB
scores the common part of files with different numbers of lines (warning on stderr); we raise ValueError naming
both counts. A malformed tree is an error naming the file, the tree and its line, not an error sentence.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from vaswani_hf.parsing.trees import MalformedTree, Tree, open_text, parse_tree, tree_texts

OK, ERROR, SKIP = 0, 1, 2  # EVALB's status column
_RULE = "=" * 76
_HEADER = (
    "  Sent.                        Matched  Bracket   Cross        Correct Tag\n"
    " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy\n"  # sic: EVALB's spelling
    f"{_RULE}\n"
)
_QUOTE_WORDS = ("'", '"', "/")  # the words a QUOTE_LABEL tag may carry (possessive or quote)
# the summary figures as_dict reports besides evalb_f1, each as evalb_NAME and evalb_NAME_len40
_FIGURES = ("recall", "precision", "complete_match", "average_crossing", "no_crossing", "two_or_less_crossing")
_FIGURES += ("tagging_accuracy", "sentences", "error_sentences", "skip_sentences", "valid_sentences")


@dataclass(frozen=True)
class EvalbParameters:
    """What an EVALB .prm file sets."""

    name: str = "collins"
    delete_labels: tuple[str, ...] = ("TOP", "-NONE-", ",", ":", "``", "''", ".")
    delete_labels_for_length: tuple[str, ...] = ("-NONE-",)
    # tags of a quote word (' " /) that the scorer puts back when the two trees disagree on deleting it
    quote_labels: tuple[str, ...] = ()
    equal_labels: tuple[tuple[str, str], ...] = (("ADVP", "PRT"),)
    equal_words: tuple[tuple[str, str], ...] = ()
    labeled: bool = True
    max_errors: int | None = 10  # None: never give up
    cutoff_length: int = 40


COLLINS = EvalbParameters()  # COLLINS.prm
# nk.prm: new.prm (S1 of the Charniak parser, ? and !, quote repair) with MAX_ERROR 10000
NK = EvalbParameters(
    name="nk",
    delete_labels=("TOP", "S1", "-NONE-", ",", ":", "``", "''", ".", "?", "!"),
    quote_labels=("``", "''", "POS", "NN", "CD", "VBZ", ":"),
    max_errors=10000,
)
PRESETS = {"collins": COLLINS, "nk": NK}


def parameters(name: str) -> EvalbParameters:
    """A preset by name: 'collins' (COLLINS.prm) or 'nk' (nk.prm)."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown EVALB parameters {name!r}: choose from {', '.join(PRESETS)}") from None


class EvalbAborted(ValueError):
    """Too many error sentences: EVALB stops there and prints no summary."""


@dataclass(frozen=True)
class SentenceRow:
    """One line of EVALB's per-sentence table."""

    id: int
    length: int
    status: int
    matched: int = 0
    gold_brackets: int = 0
    test_brackets: int = 0
    crossing: int = 0
    words: int = 0
    correct_tags: int = 0
    message: str = ""  # why an error sentence is one (EVALB's stderr line)

    @property
    def recall(self) -> float:
        return 100.0 * self.matched / self.gold_brackets if self.gold_brackets else 0.0

    @property
    def precision(self) -> float:
        return 100.0 * self.matched / self.test_brackets if self.test_brackets else 0.0

    @property
    def tagging_accuracy(self) -> float:
        return 100.0 * self.correct_tags / self.words if self.words else 0.0


@dataclass(frozen=True)
class EvalbSummary:
    """The counts behind one block of EVALB's summary, and its figures (percentages, as EVALB prints them)."""

    sentences: int = 0
    error_sentences: int = 0
    skip_sentences: int = 0
    gold_brackets: int = 0
    test_brackets: int = 0
    matched_brackets: int = 0
    crossing: int = 0
    words: int = 0
    correct_tags: int = 0
    complete_sentences: int = 0
    no_crossing_sentences: int = 0
    two_or_less_crossing_sentences: int = 0

    @property
    def valid_sentences(self) -> int:
        return self.sentences - self.error_sentences - self.skip_sentences

    @property
    def recall(self) -> float:
        return 100.0 * self.matched_brackets / self.gold_brackets if self.gold_brackets else 0.0

    @property
    def precision(self) -> float:
        return 100.0 * self.matched_brackets / self.test_brackets if self.test_brackets else 0.0

    @property
    def f_measure(self) -> float:
        """0.0 where recall and precision are both 0 (EVALB prints -nan there)."""
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def _per_valid(self, count: int, scale: float = 100.0) -> float:
        return scale * count / self.valid_sentences if self.valid_sentences > 0 else 0.0

    @property
    def complete_match(self) -> float:
        return self._per_valid(self.complete_sentences)

    @property
    def average_crossing(self) -> float:
        return self._per_valid(self.crossing, 1.0)

    @property
    def no_crossing(self) -> float:
        return self._per_valid(self.no_crossing_sentences)

    @property
    def two_or_less_crossing(self) -> float:
        return self._per_valid(self.two_or_less_crossing_sentences)

    @property
    def tagging_accuracy(self) -> float:
        return 100.0 * self.correct_tags / self.words if self.words else 0.0


@dataclass(frozen=True)
class EvalbResult:
    rows: list[SentenceRow]
    all: EvalbSummary
    cutoff: EvalbSummary  # sentences whose gold length is at most params.cutoff_length
    params: EvalbParameters = field(default=COLLINS)

    @property
    def f1(self) -> float:
        return self.all.f_measure

    def as_dict(self) -> dict[str, float | int]:
        """The summary figures for JSON results: `evalb_f1`, `evalb_recall`, ..., and `evalb_f1_len40` etc."""
        out: dict[str, float | int] = {}
        for suffix, summary in (("", self.all), (f"_len{self.params.cutoff_length}", self.cutoff)):
            out[f"evalb_f1{suffix}"] = summary.f_measure
            out.update({f"evalb_{name}{suffix}": getattr(summary, name) for name in _FIGURES})
        return out


# --- one tree as EVALB sees it ---------------------------------------------------------------------------------


@dataclass
class _Bracket:
    start: int
    end: int
    label: str


@dataclass
class _Quote:
    index: int  # where the word is (or, if dropped, would be) among the kept words
    tag: str
    word: str
    bracket: int  # the number of brackets opened before it: the later ones lie to its right
    enclosing: tuple[int, ...]  # the brackets open around it


@dataclass
class _Sentence:
    words: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    brackets: list[_Bracket] = field(default_factory=list)  # in the order their '(' appear
    quotes: list[_Quote] = field(default_factory=list)
    length: int = 0


def _read(tree: Tree | None, params: EvalbParameters) -> _Sentence:
    sentence = _Sentence()
    if tree is None:
        return sentence
    open_brackets: list[int] = []

    def visit(node: Tree) -> None:
        if node.is_preterminal():
            tag, word = node.label, node.children[0]
            if tag not in params.delete_labels_for_length:
                sentence.length += 1
            if tag in params.quote_labels and word in _QUOTE_WORDS:
                quote = _Quote(len(sentence.words), tag, word, len(sentence.brackets), tuple(open_brackets))
                sentence.quotes.append(quote)
            if tag not in params.delete_labels:  # the tag as written: (-NONE- *), (. .)
                sentence.words.append(word)
                sentence.tags.append(tag)
            return
        number = len(sentence.brackets)
        sentence.brackets.append(_Bracket(len(sentence.words), -1, node.label))
        open_brackets.append(number)
        for child in node.children:
            if not isinstance(child, Tree):
                raise MalformedTree(f"the word {child!r} has no tag of its own: write it as (TAG {child})")
            visit(child)
        open_brackets.pop()
        sentence.brackets[number].end = len(sentence.words)

    visit(tree)
    return sentence


def _equal(a: str, b: str, pairs: tuple[tuple[str, str], ...]) -> bool:
    return a == b or (a, b) in pairs or (b, a) in pairs


def _put_back(sentence: _Sentence, quote: _Quote) -> None:
    """Reinsert a dropped quote word where it was, widening the brackets around it and shifting those after it."""
    sentence.words.insert(quote.index, quote.word)
    sentence.tags.insert(quote.index, quote.tag)
    for number, bracket in enumerate(sentence.brackets):
        if number >= quote.bracket:
            bracket.start += 1
            bracket.end += 1
    for number in quote.enclosing:
        sentence.brackets[number].end += 1


def _repair_quotes(gold: _Sentence, test: _Sentence, params: EvalbParameters) -> None:
    """QUOTE_LABEL: where one tree dropped a quote word (tagged '') that the other kept (tagged POS) at the same
    place, put it back in the tree that dropped it; EVALB does this only when the word counts differ."""
    for test_quote_number in range(len(test.quotes)):
        index = test.quotes[test_quote_number].index
        test_quote = test.quotes[test_quote_number]
        for gold_quote_number, gold_quote in enumerate(gold.quotes):
            if gold_quote.index != index or gold_quote.tag == test_quote.tag:
                continue
            gold_dropped = gold_quote.tag in params.delete_labels
            test_dropped = test_quote.tag in params.delete_labels
            if gold_dropped and not test_dropped:
                _put_back(gold, gold_quote)
                for later in gold.quotes[gold_quote_number:]:
                    later.index += 1
            elif test_dropped and not gold_dropped:
                _put_back(test, test_quote)
                for later in test.quotes[test_quote_number:]:
                    later.index += 1


def _kept(brackets: list[_Bracket], params: EvalbParameters) -> list[_Bracket | None]:
    """Each bracket with its label cut at the first '-' or '=', or None where EVALB drops it."""
    out: list[_Bracket | None] = []
    for bracket in brackets:
        label = re.split("[-=]", bracket.label, maxsplit=1)[0]
        empty = bracket.start == bracket.end
        deleted = any(_equal(label, name, params.equal_labels) for name in params.delete_labels)
        out.append(None if empty or deleted else _Bracket(bracket.start, bracket.end, label))
    return out


def _crosses(a: _Bracket, b: _Bracket) -> bool:
    return a.start < b.start < a.end < b.end or b.start < a.start < b.end < a.end


def score_sentence(number: int, gold_tree: Tree | None, test_tree: Tree | None, params: EvalbParameters) -> SentenceRow:
    """One sentence's row; `number` is its ID in the table (EVALB's line number, 1-based)."""
    gold, test = _read(gold_tree, params), _read(test_tree, params)
    if not test.words:
        return SentenceRow(number, gold.length, SKIP)
    if len(gold.words) != len(test.words):
        _repair_quotes(gold, test, params)
        if len(gold.words) != len(test.words):
            message = f"Length unmatch ({len(gold.words)}|{len(test.words)})"
            return SentenceRow(number, gold.length, ERROR, message=message)
    for gold_word, test_word in zip(gold.words, test.words, strict=True):
        if not _equal(gold_word, test_word, params.equal_words):
            return SentenceRow(number, gold.length, ERROR, message=f"Words unmatch ({gold_word}|{test_word})")

    gold_brackets = [b for b in _kept(gold.brackets, params) if b is not None]
    test_brackets = [b for b in _kept(test.brackets, params) if b is not None]
    used = [False] * len(test_brackets)
    matched = 0
    for g in gold_brackets:
        for j, t in enumerate(test_brackets):
            same_span = not used[j] and (g.start, g.end) == (t.start, t.end)
            if same_span and (not params.labeled or _equal(g.label, t.label, params.equal_labels)):
                used[j] = True
                matched += 1
                break
    # crossing counts test brackets (Collins), each once however many gold brackets it crosses
    crossing = sum(any(_crosses(g, t) for g in gold_brackets) for t in test_brackets)
    correct = sum(_equal(a, b, params.equal_labels) for a, b in zip(gold.tags, test.tags, strict=True))
    return SentenceRow(
        number, gold.length, OK, matched, len(gold_brackets), len(test_brackets), crossing, len(gold.words), correct
    )


def _summarize(rows: Sequence[SentenceRow]) -> EvalbSummary:
    valid = [row for row in rows if row.status == OK]
    return EvalbSummary(
        sentences=len(rows),
        error_sentences=sum(row.status == ERROR for row in rows),
        skip_sentences=sum(row.status == SKIP for row in rows),
        gold_brackets=sum(row.gold_brackets for row in valid),
        test_brackets=sum(row.test_brackets for row in valid),
        matched_brackets=sum(row.matched for row in valid),
        crossing=sum(row.crossing for row in valid),
        words=sum(row.words for row in valid),
        correct_tags=sum(row.correct_tags for row in valid),
        complete_sentences=sum(row.matched == row.gold_brackets == row.test_brackets for row in valid),
        no_crossing_sentences=sum(row.crossing == 0 for row in valid),
        two_or_less_crossing_sentences=sum(row.crossing <= 2 for row in valid),
    )


def score_trees(
    gold: Sequence[Tree | None], test: Sequence[Tree | None], params: EvalbParameters = COLLINS
) -> EvalbResult:
    """Score test trees against gold trees, sentence by sentence; None is an empty tree (a test None: a skip)."""
    if len(gold) != len(test):
        raise ValueError(f"{len(gold)} gold trees but {len(test)} test trees: EVALB scores them pairwise")
    rows: list[SentenceRow] = []
    errors = 0
    for number, (gold_tree, test_tree) in enumerate(zip(gold, test, strict=True), start=1):
        row = score_sentence(number, gold_tree, test_tree, params)
        if row.status == ERROR:
            errors += 1
            if params.max_errors is not None and errors > params.max_errors + 1:
                raise EvalbAborted(
                    f"sentence {number}: {row.message}: error sentence {errors}, more than MAX_ERROR "
                    f"{params.max_errors} allows, so EVALB gives up here (the nk parameters allow 10000)"
                )
        rows.append(row)
    short = [row for row in rows if row.length <= params.cutoff_length]
    return EvalbResult(rows, _summarize(rows), _summarize(short), params)


def read_tree(text: str) -> Tree | None:
    """One tree as EVALB reads it, None for a tree of no words: an empty text, or empty brackets only (`()`,
    `(())`, `(TOP)`: what parsers write for a sentence they failed). Empty brackets inside a tree are read as EVALB
    reads them (see the module's text). Raises MalformedTree for anything else that is no tree."""
    if not text.strip():
        return None
    try:
        return parse_tree(text)
    except MalformedTree as err:
        refused = err  # parse_tree refuses empty brackets; EVALB reads them
    tree = _with_empty_brackets(text)
    if tree is False:
        raise refused
    return tree


def _with_empty_brackets(text: str) -> Tree | None | bool:
    """`text` read as EVALB's read_line reads a line: '(' and a label (up to a space or bracket); after a space,
    a word (possibly empty) directly followed by ')' makes a preterminal; otherwise the bracket holds brackets, or
    none. None where it holds no word at all; False where it is no tree this way either (a word outside a
    preterminal, unbalanced brackets, text after the tree)."""
    stack: list[Tree] = []
    root: Tree | None = None
    words = 0
    index = 0
    while index < len(text):
        char = text[index]
        if char.isspace():
            index += 1
        elif char == "(" and root is None:
            end = index + 1
            while end < len(text) and not (text[end].isspace() or text[end] in "()"):
                end += 1
            node = Tree(text[index + 1 : end])
            word_start = end
            while word_start < len(text) and text[word_start].isspace():
                word_start += 1
            word_end = word_start
            while word_end < len(text) and not (text[word_end].isspace() or text[word_end] in "()"):
                word_end += 1
            preterminal = word_start > end and text[word_end : word_end + 1] == ")"
            if not preterminal and word_end > word_start:
                return False  # a word followed by more than its ')'
            if stack:
                stack[-1].children.append(node)
            if preterminal:
                node.children.append(text[word_start:word_end])
                words += 1
                root = None if stack else node
                index = word_end + 1
            else:
                stack.append(node)
                index = end
        elif char == ")" and stack:
            node = stack.pop()
            root = None if stack else node
            index += 1
        else:
            return False
    if stack or root is None:
        return False
    return root if words else None


def read_tree_file(path: str | Path) -> list[Tree | None]:
    """The trees of a gold or test file, None for an empty tree (`read_tree`). In a file of one tree a line
    (EVALB's format), every blank line is an empty tree (a failed parse); in a file where any tree spans several
    lines, blank lines only separate trees. Raises MalformedTree naming the file, the tree's number and its line."""
    with open_text(path) as file:
        texts = list(tree_texts(file, keep_empty=True))
    if any("\n" in text.strip() for _, text in texts):
        texts = [(line, text) for line, text in texts if text]
    trees: list[Tree | None] = []
    for number, (line, text) in enumerate(texts, start=1):
        try:
            trees.append(read_tree(text))
        except MalformedTree as err:
            raise MalformedTree(f"{path}: tree {number} (line {line}): {err}") from None
    return trees


def score_files(gold_path: str | Path, test_path: str | Path, params: EvalbParameters = COLLINS) -> EvalbResult:
    """Score a test file against a gold file (one tree a line, or pretty-printed; gzip too)."""
    gold, test = read_tree_file(gold_path), read_tree_file(test_path)
    if len(gold) != len(test):
        raise ValueError(
            f"{gold_path} holds {len(gold)} trees but {test_path} holds {len(test)}: a test file needs one tree "
            "(or an empty line, for a failed parse) per gold tree"
        )
    return score_trees(gold, test, params)


# --- EVALB's printed layout -----------------------------------------------------------------------------------


def _format_row(row: SentenceRow) -> str:
    return (
        f"{row.id:4d}  {row.length:3d}    {row.status:d}  "
        f"{row.recall:6.2f} {row.precision:6.2f}   {row.matched:3d}    {row.gold_brackets:3d}  "
        f"{row.test_brackets:3d}    {row.crossing:3d}   {row.words:4d}  {row.correct_tags:4d}   "
        f"{row.tagging_accuracy:6.2f}\n"
    )


def format_per_sentence(result: EvalbResult) -> str:
    """EVALB's table: the header, a row a sentence, and the total row; `format_summary` follows it."""
    total = result.all
    lines = [_HEADER, *map(_format_row, result.rows), f"{_RULE}\n"]
    if total.gold_brackets > 0 and total.test_brackets > 0:  # EVALB leaves the bracket totals out otherwise
        lines.append(
            f"                {total.recall:6.2f} {total.precision:6.2f} {total.matched_brackets:6d} "
            f"{total.gold_brackets:5d} {total.test_brackets:5d}  {total.crossing:5d}"
        )
    lines.append(f"  {total.words:5d} {total.correct_tags:5d}   {total.tagging_accuracy:6.2f}\n")
    return "".join(lines)


def _format_block(title: str, summary: EvalbSummary) -> str:
    # C's 2*p*r/(p+r) is 0/0 where both are 0, which glibc prints as -nan
    f_measure = f"{summary.f_measure:6.2f}" if summary.precision + summary.recall else "  -nan"
    return (
        f"\n-- {title} --\n"
        f"Number of sentence        = {summary.sentences:6d}\n"
        f"Number of Error sentence  = {summary.error_sentences:6d}\n"
        f"Number of Skip  sentence  = {summary.skip_sentences:6d}\n"
        f"Number of Valid sentence  = {summary.valid_sentences:6d}\n"
        f"Bracketing Recall         = {summary.recall:6.2f}\n"
        f"Bracketing Precision      = {summary.precision:6.2f}\n"
        f"Bracketing FMeasure       = {f_measure}\n"
        f"Complete match            = {summary.complete_match:6.2f}\n"
        f"Average crossing          = {summary.average_crossing:6.2f}\n"
        f"No crossing               = {summary.no_crossing:6.2f}\n"
        f"2 or less crossing        = {summary.two_or_less_crossing:6.2f}\n"
        f"Tagging accuracy          = {summary.tagging_accuracy:6.2f}\n"
    )


def format_summary(result: EvalbResult) -> str:
    """EVALB's '=== Summary ===' section: all sentences, then those of length <= the cut-off."""
    return (
        "=== Summary ===\n"
        + _format_block("All", result.all)
        + _format_block(f"len<={result.params.cutoff_length}", result.cutoff)
    )


# --- command line ---------------------------------------------------------------------------------------------


def evalb_command(argv: list[str]) -> int:
    """`vaswani evalb GOLD TEST [--params collins|nk] [--per_sentence] [--json]`: print EVALB's summary (and
    table, and figures as JSON)."""
    parser = argparse.ArgumentParser(
        prog="vaswani evalb",
        description="Score constituency parses as EVALB does (COLLINS.prm by default), printing its summary.",
        epilog="Files hold one tree a line (an empty line: a failed parse, counted as a skip sentence) or "
        "pretty-printed trees separated by blank lines; gzip files are read too.",
    )
    parser.add_argument("gold", help="the gold trees")
    parser.add_argument("test", help="the parser's trees, one per gold tree")
    parser.add_argument(
        "--params",
        default="collins",
        choices=sorted(PRESETS),
        help="collins: COLLINS.prm (the default, the usual WSJ figures); nk: nk.prm (also drops S1, ? and !, "
        "repairs quote tags, and gives up only after 10000 error sentences)",
    )
    parser.add_argument("--per_sentence", action="store_true", help="print EVALB's table before the summary")
    parser.add_argument("--json", action="store_true",
                        help="then the figures as one JSON line, named as `vaswani evaluate` names them")  # fmt: skip
    parser.add_argument("-e", "--max_errors", type=int, default=None,
                        help="give up after this many error sentences, as EVALB's -e (default: the parameters'; "
                        "COLLINS.prm: 10); 0: never")  # fmt: skip
    args = parser.parse_args(argv)
    chosen = parameters(args.params)
    if args.max_errors is not None:
        chosen = replace(chosen, max_errors=args.max_errors or None)
    result = score_files(args.gold, args.test, chosen)
    if args.per_sentence:
        sys.stdout.write(format_per_sentence(result))
    sys.stdout.write(format_summary(result))
    if args.json:
        print(json.dumps(result.as_dict()))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(evalb_command(sys.argv[1:]))
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
