"""A parse model from Python: `Parser` (sentences in, trees out), and the one code path `vaswani parse`, `vaswani
evaluate`, the `constituency-parsing` pipeline (`pipeline.py`) and `vaswani serve`'s POST /parse share (`parse_lines`):
the tree constraint, the escaping of brackets, the repair of outputs into trees of the sentence, the n-best scores.

A sentence is a string, tokenised as the Penn Treebank is (NLTK's `TreebankWordTokenizer`: rules only, no data to
download; `pip install "vaswani-hf[parse]"`), or a list of words taken as they are. Either way round brackets in a
word are written -LRB- and -RRB-, as the treebank writes them, so every tree reads back. Trees are `nltk.Tree`s
where NLTK is installed, this package's `Tree` otherwise (docs/parsing.md, "From Python")."""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from .linearization import escape_word
from .trees import Tree

TREE_SEARCHES = ("constrained", "plain")
PARSE_LONG_LINES = ("cut", "error")  # `split` would rejoin two trees: no tree of the sentence
INSTALL = 'pip install "vaswani-hf[parse]"'

Sentence = str | Sequence[str]
logger = logging.getLogger(__name__)


class ParseResult(NamedTuple):
    """One parse of a sentence: its tree (None for a sentence without words), the length-penalised log-probability
    beam search ranked it by (None for greedy search), and whether the output had to be repaired into a tree of
    the sentence (docs/parsing.md). A tuple, so `tree, score, repaired = result` reads it."""

    tree: Any
    score: float | None
    repaired: bool


def require_parser(model, model_dir: str | Path) -> dict:
    """A parse model's labels and form (`config.parsing`); a translation model is refused by name."""
    from .task import parsing_of

    parsing = parsing_of(getattr(model, "config", None))
    if parsing is None:
        raise ValueError(f"{model_dir} is a translation model, not a parser (its config has no `parsing`): train one "
                         "with `vaswani train --task parse`, or translate with `vaswani translate`.")  # fmt: skip
    return parsing


def _name_of(model) -> str:
    """How an error names a model given as an object: the folder or Hub id it was loaded from."""
    return getattr(getattr(model, "config", None), "_name_or_path", "") or "the model"


def check_choices(tree_search: str, long_lines: str, names: tuple[str, str] = ("tree_search", "long_lines")) -> None:
    """Refuse a search or a long-line rule a parse cannot take; `names`: the options as the caller spells them."""
    if tree_search not in TREE_SEARCHES:
        raise ValueError(f"{names[0]} {tree_search!r}: choose {' or '.join(TREE_SEARCHES)}.")
    if long_lines not in PARSE_LONG_LINES:
        raise ValueError(f"{names[1]} {long_lines}: a parse is one tree of the whole sentence; choose cut (the "
                         "words past the model's length are attached at the top, counted as repaired) or "
                         "error.")  # fmt: skip


def nltk_available() -> bool:
    try:
        import nltk  # noqa: F401
    except ImportError:
        return False
    return True


# Penn Treebank quotes, which NLTK's tokenizer would read as text: a closing '' after a space becomes an opening ``
TREEBANK_QUOTES = ("``", "''")


def tokenize(sentence: str, level: int = logging.WARNING) -> list[str]:
    """A sentence's Penn Treebank tokens (NLTK's TreebankWordTokenizer: `don't` -> `do n't`, quotes -> `` and '').

    Text already tokenised as the treebank is keeps its tokens: its quotes `` and '' are kept as they are, and only
    the text between them is tokenised (NLTK alone writes a '' after a space as ``). A character the tokenizer
    changes (a " written `` or '') is logged as a warning naming the words, never silent (at `level`: the server logs
    it at DEBUG, since the words are its clients' text)."""
    try:
        from nltk.tokenize import TreebankWordTokenizer
    except ImportError:
        raise ImportError(f"a sentence given as a string is tokenised with NLTK's TreebankWordTokenizer: {INSTALL} "
                          "(or give each sentence as a list of words)") from None  # fmt: skip
    tokenizer, words, text, changed = TreebankWordTokenizer(), [], [], []

    def flush() -> None:
        if text:
            tokens = tokenizer.tokenize(" ".join(text))
            if "".join(tokens) != "".join(text):
                changed.append(f"{' '.join(text)!r} -> {' '.join(tokens)!r}")
            words.extend(tokens)
            text.clear()

    for chunk in sentence.split():
        if chunk in TREEBANK_QUOTES:
            flush()
            words.append(chunk)
        else:
            text.append(chunk)
    flush()
    if changed:
        logger.log(level, "the Penn Treebank tokenizer changed characters of %s (give the sentence as a list of words "
                   "to keep them as they are)", "; ".join(changed))  # fmt: skip
    return words


def words_of(sentence: Sentence, level: int = logging.WARNING) -> list[str]:
    """The words a sentence is parsed as: a string tokenised (a change of characters logged at `level`), a list of
    words as they are; round brackets escaped. A word holding white space is refused: the model reads a sentence as
    words split at spaces."""
    if isinstance(sentence, str):
        words = tokenize(sentence, level)
    elif isinstance(sentence, Sequence) and all(isinstance(word, str) for word in sentence):
        words = list(sentence)
        for number, word in enumerate(words, 1):
            if not word or word.split() != [word]:
                raise ValueError(f"word {number} ({word!r}) is empty or holds white space: a sentence is a string, "
                                 "or a list of words without spaces (to parse several sentences, give a list of "
                                 "them to parse_sents)")  # fmt: skip
    else:
        raise TypeError(f"a sentence is a string or a list of words (strings), not {type(sentence).__name__}")
    return [escape_word(word) for word in words]


def parse_lines(model, tokenizer, parsing: dict, lines: Iterable[str], nbest: int = 1, constrained: bool = True,
                **translate_kwargs) -> Iterator[list[ParseResult]]:  # fmt: skip
    """Each line's n-best parses, best first. A line is tokens split at spaces; round brackets in them are written
    -LRB-/-RRB-, as the treebank writes them. An empty line gives no tree (None), written as an empty line, as
    parsers write a sentence they could not parse. `translate_kwargs` go to `translate_stream` (batch_size,
    max_tokens, long_lines, num_beams, ...)."""
    from ..translation.inference import translate_stream
    from .task import output_tree

    sentences: deque[list[str]] = deque()  # the words of the lines read and not yet parsed (one window at most)
    if constrained:
        from .constraint import tree_constraint_factory

        translate_kwargs["batch_processors"] = tree_constraint_factory(tokenizer, parsing)

    def sources() -> Iterator[str]:
        for line in lines:
            words = [escape_word(word) for word in line.split()]
            sentences.append(words)
            yield " ".join(words)

    for candidates in translate_stream(model, tokenizer, sources(), nbest=nbest, **translate_kwargs):
        words = sentences.popleft()
        parses = []
        for text, value, *_ in candidates[:nbest]:
            if not words:
                parses.append(ParseResult(None, value, False))
                continue
            tree, repair = output_tree(text, words, parsing)
            parses.append(ParseResult(tree, value, bool(repair)))
        yield parses


def parse_words(model, tokenizer, parsing: dict, sentences: Iterable[list[str]], nbest: int = 1,
                tree_search: str = "constrained", **translate_kwargs) -> Iterator[list[ParseResult]]:  # fmt: skip
    """`parse_lines` of sentences already made words (`words_of`): what `Parser`, the pipeline and the server
    run."""
    lines = (" ".join(words) for words in sentences)
    return parse_lines(model, tokenizer, parsing, lines, nbest, tree_search == "constrained", **translate_kwargs)


def as_tree_kind(tree: Tree | None, as_nltk: bool):
    """`tree` as an `nltk.Tree` (built without recursion: a deep tree must not hit Python's limit) or as it is."""
    if tree is None or not as_nltk:
        return tree
    from nltk import Tree as NltkTree

    built: dict[int, NltkTree] = {}
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            kids = [built.pop(id(child)) if isinstance(child, Tree) else child for child in node.children]
            built[id(node)] = NltkTree(node.label, kids)
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in node.children if isinstance(child, Tree))
    return built[id(tree)]


def bracketed(tree) -> str:
    """A tree (ours or NLTK's) on one line of PTB brackets, as `vaswani parse` writes it (`str()` of an
    `nltk.Tree` breaks lines at 70 characters)."""
    if tree is None:
        return ""
    if isinstance(tree, Tree):
        return str(tree)
    return tree.pformat(margin=sys.maxsize)


def resolve_nltk(as_nltk: bool | None) -> bool:
    """None: NLTK's trees where NLTK is installed; True: NLTK's (an ImportError naming the extra without it)."""
    if as_nltk is None:
        return nltk_available()
    if as_nltk and not nltk_available():
        raise ImportError(f"as_nltk=True returns nltk.Tree objects: {INSTALL}")
    return bool(as_nltk)


class Parser:
    """A parse model with `vaswani parse`'s decoding: `parse(sentence)` gives its tree, `parse_sents(sentences)`
    the trees of many, batched by length (at most `batch_size` sentences and `max_tokens` padded tokens a batch).
    With `nbest=N` each sentence gives its N best as `ParseResult(tree, score, repaired)`, best first."""

    def __init__(self, model, tokenizer, *, num_beams: int | None = None, length_penalty: float | None = None,
                 tree_search: str = "constrained", batch_size: int = 32, max_tokens: int | None = 4096,
                 long_lines: str = "cut", as_nltk: bool | None = None, name: str | None = None) -> None:  # fmt: skip
        check_choices(tree_search, long_lines)
        self.model, self.tokenizer = model, tokenizer
        self.parsing = require_parser(model, name or _name_of(model))
        self.decoding = {k: v for k, v in (("num_beams", num_beams), ("length_penalty", length_penalty))
                         if v is not None}  # fmt: skip
        self.tree_search, self.long_lines = tree_search, long_lines
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.as_nltk = resolve_nltk(as_nltk)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, device: str | None = None, precision: str = "auto",
                        num_beams: int | None = None, tree_search: str = "constrained",
                        **kwargs) -> Parser:  # fmt: skip
        """Load a parse model as `vaswani parse` loads it: a local folder (checked first, for clear errors) or a Hub
        id, on the GPU when there is one, in `precision` (auto, fp32, bf16, int8: `vaswani_hf.model.precision`).
        A translation model is refused. `kwargs`: `Parser`'s (batch_size, max_tokens, long_lines, as_nltk, ...)."""
        from ..model.precision import resolve_precision
        from ..translation.inference import check_model_folder, default_device, is_local, load_for_inference

        check_choices(tree_search, kwargs.get("long_lines", "cut"))
        if is_local(model_dir):  # a folder that is not a whole model stops before the precision is measured
            check_model_folder(model_dir)
        device = device or default_device(precision)
        model, tokenizer = load_for_inference(model_dir, device=device, precision=resolve_precision(precision, device))
        return cls(model, tokenizer, num_beams=num_beams, tree_search=tree_search, name=str(model_dir), **kwargs)

    def parse(self, sentence: Sentence, nbest: int | None = None, **options):
        """The tree of one sentence (None when it has no words); with `nbest=N`, its N best `ParseResult`s.
        `options`: tree_search, num_beams, length_penalty for this call."""
        if not isinstance(sentence, str | Sequence):
            raise TypeError(f"a sentence is a string or a list of words, not {type(sentence).__name__}")
        return next(iter(self.parse_sents([sentence], nbest, **options)))

    def parse_sents(self, sentences: Iterable[Sentence], nbest: int | None = None, *,
                    batch_size: int | None = None, max_tokens: int | None = None, **options) -> Iterator:  # fmt: skip
        """Each sentence's tree (with `nbest=N`: its N best `ParseResult`s), in input order, lazily: sentences are
        read and parsed 10,000 at a time, so an iterator of any length streams."""
        if nbest is not None and (not isinstance(nbest, int) or nbest < 1):
            raise ValueError(f"nbest must be a whole number of at least 1, got {nbest!r}")
        tree_search = options.pop("tree_search", self.tree_search)
        check_choices(tree_search, self.long_lines)
        unknown = set(options) - {"num_beams", "length_penalty"}
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}: tree_search, num_beams, length_penalty")
        decoding = {**self.decoding, **{k: v for k, v in options.items() if v is not None}}
        results = parse_words(self.model, self.tokenizer, self.parsing, map(words_of, sentences), nbest or 1,
                              tree_search, batch_size=batch_size or self.batch_size,
                              max_tokens=max_tokens or self.max_tokens, long_lines=self.long_lines,
                              **decoding)  # fmt: skip
        for parses in results:
            kept = [ParseResult(as_tree_kind(p.tree, self.as_nltk), p.score, p.repaired) for p in parses]
            yield kept[0].tree if nbest is None else kept
