"""A line's sentences, translated one by one and joined back with the line's own spacing.

The model was trained on sentences; a user's line (a paragraph pasted into a client) often holds several, and a
long one is cut at the model's limit. LibreTranslate splits with MiniSBD, Stanza or spaCy; we use sentencex
(Wikimedia's rule-based segmenter: about 300 languages, no model to download, no dependencies). Measured against
pysbd and sentence-splitter (Moses' rules) on newstest2014 paragraphs of three lines (benchmarks/sentence_splitters.py,
benchmarks/results/sentence_splitters.md): as accurate within a few points in English, German and French, and 15 to
200 times as fast. `--sentences off` sends each line whole, as before.

A line of one sentence is sent exactly as it was; each sentence of a longer line is sent without the spaces around
it, which stay in the answer where they were. A line's n-best are its sentences' k-th candidates side by side, with
their scores summed.

The split comes first (`split`), so that a request's sentences, the lines the model is sent, are counted against
--max_lines and the queue before anything is queued (app.py's `run`): one line of 5,000 characters of "a! " is
1,666 sentences. sentencex's own time grows with the square of a line's length on some text (100,000 characters of
'?"' took 4.8 s, holding the GIL, so a thread does not keep the event loop free), so a line is given to it in
windows of at most WINDOW characters, cut at white space where there is some: the cost is linear in the text (a
window's is bounded), and a sentence is never longer than a window (the model cuts far shorter ones anyway)."""

from __future__ import annotations

from .guard import each
from .service import Translation

Pieces = list[tuple[str, str, str]]  # a line's sentences as (spaces before, sentence, spaces after)
WINDOW = 1000  # characters given to the segmenter at once


def windows(text: str) -> list[str]:
    """`text` in consecutive pieces of at most WINDOW characters, each cut after white space where the second half
    of the window has some: joined, they give the text back."""
    out, at = [], 0
    while len(text) - at > WINDOW:
        cut = max(text.rfind(" ", at + WINDOW // 2, at + WINDOW), text.rfind("\t", at + WINDOW // 2, at + WINDOW))
        end = cut + 1 if cut >= 0 else at + WINDOW
        out.append(text[at:end])
        at = end
    out.append(text[at:])
    return out


def segmented(text: str, language: str) -> list[str]:
    """sentencex's sentences of `text`, window by window; a window it cannot split exactly is one piece."""
    import sentencex

    parts = []
    for window in windows(text):
        try:
            found = [part for part in sentencex.segment(language, window) if part]
        except Exception:  # whatever the segmenter cannot do, the window goes whole
            found = [window]
        parts += found if "".join(found) == window else [window]
    return parts


def sentences_of(line: str, language: str) -> Pieces:
    """The line's sentences as (spaces before, sentence, spaces after): joined, they give the line back. A line of
    one sentence (or none) is one piece, the line itself."""
    stripped = line.strip()
    if not stripped:
        return [("", line, "")]
    parts = _merged_spaces(segmented(stripped, language))
    if len(parts) < 2 or "".join(parts) != stripped:
        return [("", line, "")]
    pieces = [(part[: len(part) - len(part.lstrip())], part.strip(), part[len(part.rstrip()) :]) for part in parts]
    before, first, after = pieces[0]
    pieces[0] = (line[: len(line) - len(line.lstrip())] + before, first, after)
    before, last, after = pieces[-1]
    pieces[-1] = (before, last, after + line[len(line.rstrip()) :])
    return pieces


def _merged_spaces(parts: list[str]) -> list[str]:
    """Parts of white space alone joined to the part before (a window may end between sentences)."""
    merged: list[str] = []
    for part in parts:
        if merged and not part.strip():
            merged[-1] += part
        else:
            merged.append(part)
    return merged


def split(lines: list[str], language: str) -> list[Pieces]:
    """Each line's sentences (`sentences_of`): what the model is sent is every piece's sentence, in order."""
    return each(lambda line: sentences_of(line, language), lines)  # none started past the request's deadline


def flatten(split_lines: list[Pieces]) -> list[str]:
    """The sentences the model is sent for split lines, in order."""
    return [sentence for pieces in split_lines for _, sentence, _ in pieces]


def joined(results: list[Translation], split_lines: list[Pieces]) -> list[Translation]:
    """The sentences' results (in `flatten(split_lines)`'s order) as one result a line (see the docstring)."""
    out, at = [], 0
    for pieces in split_lines:
        mine, at = results[at : at + len(pieces)], at + len(pieces)
        if len(pieces) == 1:
            out.append(mine[0])
            continue
        nbest = []
        for k in range(max(len(t.nbest) for t in mine)):
            chosen = [t.nbest[min(k, len(t.nbest) - 1)] for t in mine]
            pairs = zip(chosen, pieces, strict=True)
            text = "".join(f"{before}{text}{after}" for (text, _), (before, _, after) in pairs)
            scores = [score for _, score in chosen]
            nbest.append((text, None if any(s is None for s in scores) else sum(scores)))
        out.append(Translation(nbest, tokens=sum(t.tokens for t in mine), attention=side_by_side(mine)))
    return out


def side_by_side(results: list[Translation]) -> dict | None:
    """A line's cross-attention from its sentences' (each decoded alone): their tokens in order, each sentence's
    rows over its own source tokens and zeros over the others'. None where the request asked for none."""
    if any(t.attention is None for t in results):
        return None
    parts = [t.attention for t in results]
    widths = [len(part["source_tokens"]) for part in parts]
    weights = [[0.0] * sum(widths[:i]) + row + [0.0] * sum(widths[i + 1 :])
               for i, part in enumerate(parts) for row in part["weights"]]  # fmt: skip
    tokens = {name: [token for part in parts for token in part[name]] for name in ("source_tokens", "target_tokens")}
    return {**tokens, "weights": weights}


async def by_sentences(decode, lines: list[str], options: dict, language: str) -> list[Translation]:
    """`decode(lines, options)`'s results a line, each line decoded sentence by sentence (see the docstring)."""
    split_lines = split(lines, language)
    return joined(await decode(flatten(split_lines), options), split_lines)
