"""Section 6.3: a tree as a target sequence, and a target sequence back into a tree whose words are the sentence's.

The target is the tree depth first, each constituent opened by its label and closed by its own label after a
slash, each word stood for by its part-of-speech tag (the form tensor2tensor prepared for the paper):

    (S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))  ->  S NP DT NN /NP VP VBD /VP . /S

With `form="xx"` every tag is written `XX` (Vinyals et al., 2015): the model then predicts brackets only.

A decoder may emit any sequence, so `to_tree` builds a well-formed tree from whatever it gets, with the
sentence's words as its leaves in order (`Repair` lists what it had to mend; docs/parsing.md states the rules).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from .trees import Tree

FORMS = ("tags", "xx")
CLOSE = "/"
OUTPUT_TOP = "TOP"  # the label of the top bracket written around every parse (EVALB deletes it)
UNKNOWN_TAG = "XX"  # the tag of a word the output left without one
# A word the output left without a tag gets its punctuation tag when it is a punctuation mark (EVALB deletes
# punctuation by the test tree's own tags: an XX there would make the sentence an error), else XX.
PUNCTUATION_TAGS = {",": ",", ".": ".", "?": ".", "!": ".", ":": ":", ";": ":", "--": ":", "...": ":", "``": "``",
                    "''": "''", "-LRB-": "-LRB-", "-RRB-": "-RRB-", "$": "$", "#": "#"}  # fmt: skip


def linearize(tree: Tree, form: str = "tags") -> str:
    """The target sequence of a (cleaned) tree: `S NP DT NN /NP ... /S`."""
    if form not in FORMS:
        raise ValueError(f"linearization form {form!r}: choose one of {', '.join(FORMS)}.")
    out: list[str] = []
    stack: list[Tree | str] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, str):  # a closing symbol put on the stack below the constituent's children
            out.append(node)
        elif node.is_preterminal():
            out.append(UNKNOWN_TAG if form == "xx" else node.label)
        else:
            out.append(node.label)
            stack.append(CLOSE + node.label)
            stack.extend(reversed(node.children))
    return " ".join(out)


def symbols(target: str) -> set[str]:
    """The opening labels, closing symbols and tags a target uses."""
    return set(target.split())


@dataclass
class Repair:
    """What `to_tree` mended in one output; empty when the output was a tree of the sentence as it stands."""

    dropped_closes: int = 0  # a closing symbol with no open constituent of its label
    unclosed: int = 0  # constituents still open at the end, closed there
    extra_tags: int = 0  # tags beyond the sentence's words, dropped
    missing_tags: int = 0  # words the output gave no tag, attached at the top (tag XX, or punctuation's own)
    unknown_tokens: int = 0  # tokens that are no label of the treebank, dropped
    empty_constituents: int = 0  # constituents left without words, removed

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def kinds(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


def _openings(tokens: list[str], phrase_labels: set[str] | None, tags: set[str] | None) -> list[bool]:
    """Which tokens open a constituent. Read from the right, a label token opens one when it matches the innermost
    closing symbol still unmatched (so a treebank whose labels double as tags still reads right), or when it is a
    phrase label and never a tag (an output cut short leaves its constituents open)."""
    closes: list[str] = []
    opens = [False] * len(tokens)
    for index in range(len(tokens) - 1, -1, -1):
        token = tokens[index]
        if token.startswith(CLOSE) and len(token) > 1:
            closes.append(token[1:])
        elif closes and closes[-1] == token:
            closes.pop()
            opens[index] = True
        elif phrase_labels is not None and token in phrase_labels and token not in (tags or ()):
            opens[index] = True
    return opens


def to_tree(
    target: str | Iterable[str],
    words: list[str],
    phrase_labels: Iterable[str] | None = None,
    tags: Iterable[str] | None = None,
) -> tuple[Tree, Repair]:
    """The tree an output stands for, over `words`, always well formed, its leaves exactly `words` in order, under
    a `TOP` bracket. `phrase_labels` and `tags` (the treebank's, saved in a parse model's config) let an output
    that was cut short still open its constituents, and drop tokens that are no label; without them every token
    that opens nothing is a tag."""
    tokens = target.split() if isinstance(target, str) else list(target)
    phrase_labels = set(phrase_labels) if phrase_labels is not None else None
    tags = set(tags) if tags is not None else None
    known = None if phrase_labels is None or tags is None else phrase_labels | tags | {UNKNOWN_TAG}
    repair = Repair()
    top = Tree(OUTPUT_TOP)
    stack = [top]
    next_word = 0
    for token, opens in zip(tokens, _openings(tokens, phrase_labels, tags), strict=True):
        if opens:
            node = Tree(escape_word(token))
            stack[-1].children.append(node)
            stack.append(node)
        elif token.startswith(CLOSE) and len(token) > 1:
            depth = next((i for i in range(len(stack) - 1, 0, -1) if stack[i].label == token[1:]), None)
            if depth is None:
                repair.dropped_closes += 1
                continue
            repair.unclosed += len(stack) - 1 - depth  # constituents inside it that the output left open
            del stack[depth:]
        elif known is not None and token not in known:
            repair.unknown_tokens += 1
        elif next_word < len(words):
            stack[-1].children.append(Tree(escape_word(token), [words[next_word]]))
            next_word += 1
        else:
            repair.extra_tags += 1
    repair.unclosed += len(stack) - 1
    for word in words[next_word:]:
        top.children.append(Tree(PUNCTUATION_TAGS.get(word, UNKNOWN_TAG), [word]))
        repair.missing_tags += 1
    repair.empty_constituents = _remove_empty(top)
    return top, repair


def _remove_empty(tree: Tree) -> int:
    """Remove the constituents without words under `tree`; returns how many."""
    removed = 0
    kept: list[Tree | str] = []
    for child in tree.children:
        if isinstance(child, Tree) and not child.is_preterminal():
            removed += _remove_empty(child)
            if not child.children:
                removed += 1
                continue
        kept.append(child)
    tree.children = kept
    return removed


def escape_word(word: str) -> str:
    """A word as PTB brackets write it: round brackets are -LRB- and -RRB-, so that every tree reads back."""
    return word.replace("(", "-LRB-").replace(")", "-RRB-")
