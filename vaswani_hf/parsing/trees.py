"""Phrase-structure trees in Penn Treebank brackets (section 6.3): reading them, one a line or pretty-printed over
several, and writing them back.

A `Tree` is a label and its children; a child is a `Tree` or a word (a `str`). A preterminal is a tree whose only
child is a word: `(NN dog)`. The reader keeps the tree as written (the cleaning parsing work applies is
`treebank.clean`), so the scorer (`evalb`) and the treebank reader share it.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# a bracket, or a run of characters that holds neither a bracket nor a space
_TOKENS = re.compile(r"\(|\)|[^\s()]+")


class MalformedTree(ValueError):
    """A tree that cannot be read: unbalanced brackets, a word without a tag, text outside any tree."""


@dataclass
class Tree:
    label: str
    children: list[Tree | str] = field(default_factory=list)

    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def words(self) -> list[str]:
        return [word for _, word in self.tagged_words()]

    def tagged_words(self) -> list[tuple[str, str]]:
        """(tag, word) of every preterminal, left to right."""
        out: list[tuple[str, str]] = []
        stack: list[Tree | str] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, Tree):
                if node.is_preterminal():
                    out.append((node.label, node.children[0]))
                else:
                    stack.extend(reversed(node.children))
        return out

    def __str__(self) -> str:
        """One line of PTB brackets: `(S (NP (DT the) (NN dog)) (VP (VBD barked)))`."""
        inside = " ".join(str(child) for child in self.children)
        return f"({self.label} {inside})" if self.label else f"( {inside})"


def parse_tree(text: str) -> Tree:
    """One tree from its bracketed text (on one line or several). A top bracket without a label (`( (S ...) )`)
    gives a tree labelled ''. Raises MalformedTree naming what is wrong."""
    tokens = _TOKENS.findall(text)
    if not tokens:
        raise MalformedTree("no tree: the text is empty")
    if tokens[0] != "(":
        raise MalformedTree(f"a tree starts with '(', not {tokens[0]!r}")
    stack: list[Tree] = []
    root: Tree | None = None
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if root is not None and token == ")":
            raise MalformedTree("unbalanced brackets: a ')' after the tree's last bracket closes nothing")
        if root is not None:
            raise MalformedTree(f"text after the tree's last bracket: {' '.join(tokens[index : index + 5])!r}")
        if token == "(":
            label = tokens[index + 1] if index + 1 < len(tokens) and tokens[index + 1] not in "()" else ""
            node = Tree(label)
            if stack:
                stack[-1].children.append(node)
            stack.append(node)
            index += 2 if label else 1
            continue
        if token == ")":
            node = stack.pop()
            if not node.children:
                raise MalformedTree(f"an empty constituent: '({node.label})'" if node.label else "an empty '()'")
            if not stack:
                root = node
        else:  # a word: it must be the only child of a tagged bracket
            node = stack[-1]
            if tokens[index + 1 : index + 2] == ["("] and node.label and not node.children:
                raise MalformedTree(f"a bracket inside the word after {token!r}: write round brackets in words as "
                                    "-LRB- and -RRB-")  # fmt: skip
            if node.children or not node.label or tokens[index + 1 : index + 2] != [")"]:
                raise MalformedTree(f"the word {token!r} has no tag of its own: write it as (TAG {token})")
            node.children.append(token)
        index += 1
    if root is None:
        raise MalformedTree(f"unbalanced brackets: {len(stack)} '(' left open at the end of the tree")
    return root


def tree_texts(lines: Iterable[str], keep_empty: bool = False) -> Iterator[tuple[int, str]]:
    """The text of each tree and the number of its first line (1-based): a tree ends where its brackets balance, so
    a tree may sit on one line or span several. Blank lines between trees are skipped, or with `keep_empty` given
    as ('') trees of their own (a parser's output file writes a failed parse as an empty line)."""
    pending: list[str] = []
    depth, start = 0, 0
    for number, line in enumerate(lines, start=1):
        if not pending and not line.strip():
            if keep_empty:
                yield number, ""
            continue
        if not pending:
            start = number
        pending.append(line)
        for token in _TOKENS.findall(line):
            if token == "(":
                depth += 1
            elif token == ")":
                depth -= 1
        if depth <= 0:  # balanced (or over-closed: parse_tree names that) at the end of this line
            yield start, "".join(pending)
            pending, depth = [], 0
    if pending:
        yield start, "".join(pending)  # left open at the end of the file: parse_tree says so


def open_text(path: str | Path):
    """A tree file for reading as text, gzip-compressed or not (by its first two bytes, not its name)."""
    path = Path(path)
    with open(path, "rb") as file:
        magic = file.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")  # "-sig": a byte-order mark (Notepad's) is no part of the first tree


def read_trees(path: str | Path) -> Iterator[Tree]:
    """Every tree of a bracket file (`.mrg`, `.ptb`, `.trees`, gzip too), as written. A malformed tree raises
    MalformedTree naming the file, the tree's number and its first line."""
    with open_text(path) as file:
        for count, (line, text) in enumerate(tree_texts(file), start=1):
            try:
                yield parse_tree(text)
            except MalformedTree as err:
                raise MalformedTree(f"{path}: tree {count} (line {line}): {err}") from None
