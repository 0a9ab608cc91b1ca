"""Section 6.3's data: a treebank folder read, cleaned as parsing work cleans the Penn Treebank, and written as the
sentence pairs a translation model trains on (the words -> the linearised tree).

Cleaning: `-NONE-` elements are removed, and the constituents they leave empty; function tags and indices are
stripped (`NP-SBJ-1` -> `NP`, `S-TPC-2` -> `S`, `NP=2` -> `NP`; `-LRB-`, `-RRB-` and `-NONE-` are labels, not tags
on a label); the unary top (`( (S ...) )`, `(TOP (S ...))`, `(ROOT ...)`) is removed.

A folder holds `{split}.trees`, `.mrg` or `.ptb` (gzip too: `.gz` after the name). `pairs_folder` writes its
pairs once into the cache of prepared data, keyed by the tree files' content, so that everything translation
data has (the prepared cache, resume, DDP, token batches) holds for a treebank: `{split}.words` + `{split}.tree`,
the held-out splits' cleaned trees themselves (`{split}.gold`, what evaluation scores against: a tree rebuilt from
its target would carry the target's form, XX tags or the training labels) and `labels.json`, the treebank's phrase
labels and tags, which a parse model keeps in its config, and its longest target (refused when over --max_length).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from filelock import FileLock

from ..data.prepared_cache import cache_dir, content_hashes
from .linearization import FORMS, linearize
from .trees import MalformedTree, Tree, parse_tree, read_trees

SUFFIXES = (".trees", ".mrg", ".ptb")
TOP_LABELS = ("", "TOP", "ROOT")
NULL_ELEMENT = "-NONE-"
SOURCE, TARGET = "words", "tree"  # the pairs' file suffixes: {split}.words -> {split}.tree
CONVERSION = 2  # raise when the cleaning or the pairs' layout changes: older conversions are then made anew


def clean_label(label: str) -> str:
    """The label without function tags and indices: NP-SBJ-1 -> NP, NP=2 -> NP; -LRB- and -NONE- stay."""
    if label.startswith("-") and label.endswith("-"):
        return label
    return label.split("=")[0].split("-")[0] or label


def clean(tree: Tree) -> Tree | None:
    """The tree as parsers learn and are scored on it (see the module's text); None when nothing but null elements
    was in it."""
    cleaned = _clean_node(tree)
    while cleaned is not None and cleaned.label in TOP_LABELS and len(cleaned.children) == 1:
        child = cleaned.children[0]
        if isinstance(child, str) or child.is_preterminal():
            break
        cleaned = child
    if cleaned is not None and cleaned.label == "":
        cleaned.label = "TOP"  # a top bracket over several constituents keeps a label of its own
    return cleaned


def _clean_node(node: Tree) -> Tree | None:
    if node.is_preterminal():
        return None if node.label == NULL_ELEMENT else Tree(clean_label(node.label), list(node.children))
    children = [c for c in (_clean_node(child) for child in node.children if isinstance(child, Tree)) if c]
    return Tree(clean_label(node.label), children) if children else None


def split_file(folder: Path, split: str) -> Path:
    """The tree file of `split` in `folder` (`train.trees`, `train.mrg.gz`, ...)."""
    found = [folder / f"{split}{suffix}{gz}" for suffix in SUFFIXES for gz in ("", ".gz")]
    found = [path for path in found if path.is_file()]
    if len(found) > 1:
        raise ValueError(f"{folder} holds {len(found)} files for split {split!r} ({', '.join(p.name for p in found)}): "
                         "keep one.")  # fmt: skip
    if not found:
        have = ", ".join(available_splits(folder)) or "none"
        raise FileNotFoundError(f"{folder}: no tree file for split {split!r} ({split}.trees, {split}.mrg or "
                                f"{split}.ptb, gzip too); the folder's splits: {have}.")  # fmt: skip
    return found[0]


def available_splits(folder: Path) -> list[str]:
    names = {path.name.removesuffix(".gz") for path in Path(folder).iterdir() if path.is_file()}
    return sorted(name.rsplit(".", 1)[0] for name in names if name.endswith(SUFFIXES))


def sentence_pairs(trees: Iterable[Tree], form: str = "tags", labels: dict | None = None) -> Iterator[tuple[str, str]]:
    """(words, linearised tree) of each cleaned tree; a tree of null elements only gives nothing. With `labels`
    ({"phrase_labels": set, "tags": set}), the labels met are added to it."""
    for tree in trees:
        cleaned = clean(tree)
        if cleaned is None:
            continue
        tagged = cleaned.tagged_words()
        if labels is not None:
            labels["tags"].update(tag for tag, _ in tagged)
            labels["phrase_labels"].update(_phrase_labels(cleaned))
        yield " ".join(word for _, word in tagged), linearize(cleaned, form)


def gold_tree(tree: Tree) -> Tree | None:
    """The tree a parse of its words is scored against: cleaned, under the TOP bracket parses are written with."""
    return _under_top(clean(tree))


def _under_top(cleaned: Tree | None) -> Tree | None:
    return cleaned if cleaned is None or cleaned.label == "TOP" else Tree("TOP", [cleaned])


def gold_pairs(trees: Iterable[Tree], form: str = "tags") -> Iterator[tuple[str, str, Tree]]:
    """(words, linearised tree, gold tree) of each tree that cleaning leaves, as `sentence_pairs` gives them."""
    for tree in trees:
        cleaned = clean(tree)
        if cleaned is not None:
            yield " ".join(cleaned.words()), linearize(cleaned, form), _under_top(cleaned)


def _phrase_labels(tree: Tree) -> Iterator[str]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if not node.is_preterminal():
            yield node.label
            stack.extend(child for child in node.children if isinstance(child, Tree))


def write_pairs(pairs: Iterable[tuple[str, str]], folder: Path, split: str, longest: dict | None = None) -> int:
    """Write a split's pairs; with `longest`, keep there the longest target's line and its symbols (+ the end)."""
    count = 0
    with open(folder / f"{split}.{SOURCE}", "w", encoding="utf-8") as words, \
            open(folder / f"{split}.{TARGET}", "w", encoding="utf-8") as tree:  # fmt: skip
        for source, target in pairs:
            words.write(source + "\n")
            tree.write(target + "\n")
            count += 1
            if longest is not None and (length := target.count(" ") + 2) > longest.get("tokens", 0):
                longest.update(tokens=length, line=count, words=source.count(" ") + 1)
    return count


def write_gold(trees: Iterable[Tree], folder: Path, split: str) -> None:
    """A held-out split's gold trees, one a line, row for row with its pairs."""
    with open(folder / f"{split}.gold", "w", encoding="utf-8") as out:
        for tree in trees:
            if (gold := gold_tree(tree)) is not None:
                out.write(f"{gold}\n")


def read_gold(folder: str | Path, split: str) -> list[Tree] | None:
    """The split's gold trees written beside its pairs, or None where there are none (a folder of pairs)."""
    path = Path(folder) / f"{split}.gold"
    return [parse_tree(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else None


def pairs_folder(folder: str | Path, splits: Iterable[str], form: str = "tags", train_split: str = "train") -> Path:
    """The treebank's splits as sentence pairs, converted once into the cache of prepared data (keyed by the tree
    files' content, the form and the cleaning) and reused: by a rerun, by --resume and by the other processes of
    a distributed run, which wait on the lock. A malformed tree stops the conversion naming its file, number and
    line, and leaves nothing behind."""
    if form not in FORMS:
        raise ValueError(f"--linearization {form}: choose one of {', '.join(FORMS)}.")
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"--data {folder}: no such folder (expected {train_split}.trees inside).")
    splits = list(dict.fromkeys([train_split, *splits]))
    files = [split_file(folder, split) for split in splits]
    key = hashlib.sha256(json.dumps([CONVERSION, form, train_split, splits, content_hashes(files)]).encode())
    target = cache_dir() / "treebanks" / key.hexdigest()[:24]
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "labels.json").is_file():
            return target
        staging = target.parent / f".staging-{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            labels = {"phrase_labels": set(), "tags": set()}
            counts, longest = {}, {"file": str(files[0])}
            for split, path in zip(splits, files, strict=True):
                training = split == train_split
                met = labels if training else None
                counts[split] = write_pairs(sentence_pairs(read_trees(path), form, met), staging, split,
                                            longest if training else None)  # fmt: skip
                if not counts[split]:
                    raise MalformedTree(f"{path}: no tree in the file.")
                if not training:
                    write_gold(read_trees(path), staging, split)
            if form == "tags" and (both := labels["phrase_labels"] & labels["tags"]):
                raise ValueError(f"{files[0]}: {', '.join(sorted(both))} is both a phrase label and a tag, so the "
                                 "tags form (S NP DT NN /NP ...) would read two ways: train with --linearization xx, "
                                 "which writes every tag XX.")  # fmt: skip
            summary = {"form": form, "source": str(folder), "pairs": counts, "longest_target": longest,
                       **{name: sorted(values) for name, values in labels.items()}}  # fmt: skip
            (staging / "labels.json").write_text(json.dumps(summary, indent=1))
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def read_labels(folder: str | Path) -> dict:
    """The conversion's record: its form, its pairs per split, the training split's phrase labels and tags."""
    return json.loads((Path(folder) / "labels.json").read_text())
