"""`format: html`: the text between tags is translated, the markup is kept as it came. A document is split into
markup (kept byte for byte) and text nodes; every text node with words in it becomes one line to translate (its
character references decoded, its runs of white space made one space, as a browser shows them), and the document is
written back with each node's translation (escaped) in its place and the node's own leading and trailing white space.

Left as they are: the contents of script, style, code, pre, textarea and template (and of the other raw-text
elements: xmp, iframe, noembed, noframes, plaintext), any element marked `translate="no"` or with the class
`notranslate` (the HTML standard's and Google's conventions), comments, declarations, processing instructions, and
every tag with its attributes, byte for byte; text left untranslated is kept byte for byte too.

The splitting is a tokenizer of our own, after the HTML standard's tokenizer (13.2.5): a tag, a comment or a
declaration that is never closed runs to the end of the document, as there, so every character is read a bounded
number of times and the work is linear in the document, whatever it holds (each piece is found by str.find or by a
regular expression that cannot backtrack: atomic quantifiers, no nested alternatives that overlap). Measured on 2
cores, before it: the standard library's html.parser rescans an unclosed tag from each `<`, so `"x" + "<a " * N` took
0.77 s at 9 KB and 3.1 s at 19 KB (quadratic; the body limit is 1 MB), and nested `<![` raised an AssertionError;
selectolax's Lexbor engine is linear (1 MB of `<a ` in 0.04 s) but builds a tree and writes it back normalised
(html, head and body added, names lower-cased, attributes re-quoted, `<br/>` as `<br>`), which breaks the promise to
keep markup byte for byte. This tokenizer: 1 MB of any of `<a ` repeated, unclosed `<!--`, `<![` repeated, `<`
repeated, `<b>` repeated, in well under a second (tests/test_serve_hostile.py)."""

from __future__ import annotations

import html
import re

UNTRANSLATED = frozenset({"script", "style", "code", "pre", "textarea", "template", "plaintext"})
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})
# elements whose content is not markup, through their end tag: the standard's RAWTEXT and script data (kept as they
# are) and RCDATA (text: a title's is translated, a textarea's kept)
RAW = ("script", "style", "xmp", "iframe", "noembed", "noframes", "plaintext", "title", "textarea")
# the standard's "special" elements (13.2.4.2, those a page's structure is made of): an end tag of another element
# (a span's, say) is ignored where one of these stands open inside it, as the standard's "any other end tag" rule says
SPECIAL = frozenset({"address", "applet", "area", "article", "aside", "blockquote", "body", "caption", "center", "dd",
                     "details", "dialog", "dir", "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer",
                     "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hgroup", "html", "li", "main", "marquee",
                     "menu", "nav", "object", "ol", "p", "section", "select", "summary", "table", "tbody", "td",
                     "tfoot", "th", "thead", "tr", "ul"})  # fmt: skip
# end tags the standard implies: a start tag of these closes an open element of the same family on top of the stack
# (a list item the next item, a cell the next cell, a paragraph the next block), so that a `translate="no"` item
# does not swallow its siblings
IMPLIED = {"li": {"li"}, "dt": {"dt", "dd"}, "dd": {"dt", "dd"}, "option": {"option"},
           "optgroup": {"option", "optgroup"}, "td": {"td", "th"}, "th": {"td", "th"}, "tr": {"td", "th", "tr"},
           "tbody": {"td", "th", "tr", "tbody", "thead"}, "tfoot": {"td", "th", "tr", "tbody", "thead"},
           "rb": {"rb", "rt", "rp"}, "rt": {"rb", "rt", "rp"}, "rp": {"rb", "rt", "rp"}}  # fmt: skip
CLOSES_P = frozenset({"address", "article", "aside", "blockquote", "details", "div", "dl", "fieldset", "figcaption",
                      "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "main", "menu",
                      "nav", "ol", "p", "pre", "section", "table", "ul"})  # fmt: skip
SPACE = re.compile(r"\s+")
MARKING = ("translate", "class")  # the attributes that can keep an element's text untranslated

_WS = r"\t\n\f\r "
# an attribute as the standard's tokenizer reads one: a name (its first character may be '=', quotes and '<' are
# part of it), then maybe '=' and a value, quoted (an unclosed quote runs to the end of the document) or not
_ATTRIBUTE = rf"""[^{_WS}/>][^{_WS}/=>]*+(?:[{_WS}]*=[{_WS}]*+(?:"[^"]*+"?|'[^']*+'?|[^{_WS}>]*+))?"""
ATTRIBUTE = re.compile(
    rf"""([^{_WS}/>][^{_WS}/=>]*+)(?:[{_WS}]*=[{_WS}]*+(?:"([^"]*+)"?|'([^']*+)'?|([^{_WS}>]*+)))?""", re.ASCII
)
_ATTRIBUTES = rf"(?:[{_WS}/]++|{_ATTRIBUTE})*+"
# one token a match, in document order: text ('<' included where no tag can start), a comment, a declaration or
# processing instruction (or '<![...'), a raw-text element with its content, a start tag, an end tag, and '</...>'
# that is none (a comment to the standard). Whatever is never closed runs to the end of the document.
TOKEN = re.compile(
    rf"(?P<text>(?:[^<]++|<(?![A-Za-z!?]|/[\s\S]))++)"
    rf"|<!--(?:>|->|[\s\S]*?(?:--!?>|\Z))"
    rf"|<[!?][^>]*+>?"
    rf"|<(?P<raw>{'|'.join(RAW)})(?=[{_WS}/>]|\Z)(?P<rattributes>{_ATTRIBUTES})(?:>(?P<content>[\s\S]*?)"
    rf"(?=</(?P=raw)[{_WS}/>]|\Z))?"
    rf"|<(?P<start>[A-Za-z][^{_WS}/>]*+)(?P<attributes>{_ATTRIBUTES})(?P<closed>>?)"
    rf"|</(?P<end>[A-Za-z][^{_WS}/>]*+){_ATTRIBUTES}>?"
    rf"|</[^>]*+>?",
    re.IGNORECASE | re.ASCII,  # ASCII: with IGNORECASE alone, [A-Za-z] also matches "ſ" and the Kelvin sign
)


class TooManyTexts(ValueError):
    """A document with more text nodes to translate than a request may send the model (`most`)."""

    def __init__(self, most: int) -> None:
        super().__init__(f"more than {most} text nodes")
        self.most = most


class Document:
    """An HTML text as pieces: markup (kept) and text nodes, `texts()` the lines to translate, `render()` the
    document with them replaced. `most`: raise TooManyTexts as soon as the document has more text nodes than that
    (the request's bound on lines: the rest is not read)."""

    def __init__(self, text: str, most: int | None = None) -> None:
        self.pieces: list[str] = []  # the markup between the text nodes to translate, and "" in their places
        self.slots: list[tuple[int, str, str, str]] = []  # (piece index, leading space, text, trailing space)
        self.open: list[tuple[str, bool]] = []  # the open elements: (name, is its content left untranslated)
        self.counts: dict[str, int] = {}  # open elements by name: an end tag of none open is ignored
        self.text, self.done = text, 0  # the document, and how much of it is in `pieces`
        self.most = most
        for token in TOKEN.finditer(text):
            if token["text"] is not None:
                if not (self.open and self.open[-1][1]):
                    self._text(token.start(), token.end())
            elif token["start"] is not None:
                self._start(token["start"].lower(), token["attributes"], bool(token["closed"]))
            elif token["end"] is not None:
                self._close(token["end"].lower())
            elif token["content"] and token["raw"].lower() == "title":
                if not self._kept("title", token["rattributes"]):  # a title's text is translated
                    self._text(token.start("content"), token.end("content"))
        self.pieces.append(text[self.done :])

    def _kept(self, name: str, attributes: str) -> bool:
        """Whether the content of this element, opened here, is left untranslated."""
        if (self.open and self.open[-1][1]) or name in UNTRANSLATED:
            return True
        lowered = attributes.lower()
        if not any(attribute in lowered for attribute in MARKING):
            return False
        found: dict[str, str] = {}
        for attribute in ATTRIBUTE.finditer(attributes):  # the first of a name counts, as in the standard
            value = next((v for v in attribute.groups()[1:] if v is not None), "")
            found.setdefault(attribute.group(1).lower(), value)
        return (html.unescape(found.get("translate", "")).strip().lower() == "no"
                or "notranslate" in html.unescape(found.get("class", "")).split())  # fmt: skip

    def _start(self, name: str, attributes: str, closed: bool) -> None:
        family = IMPLIED.get(name, ())
        while self.open and (self.open[-1][0] in family or (name in CLOSES_P and self.open[-1][0] == "p")):
            self._pop()  # the end tag the standard implies
        foreign = self.counts.get("svg") or self.counts.get("math")
        if not closed or name in VOID or (attributes.endswith("/") and (foreign or name in ("svg", "math"))):
            # unclosed (the document ended inside it), void, or self-closing (only in svg and math: in HTML a
            # trailing slash is ignored, `<span/>` opens a span): no content
            return
        self.open.append((name, self._kept(name, attributes)))
        self.counts[name] = self.counts.get(name, 0) + 1

    def _pop(self) -> str:
        popped, _ = self.open.pop()
        self.counts[popped] -= 1
        return popped

    def _close(self, name: str) -> None:
        """An end tag closes the innermost open element of its name and those inside it; of none open, nothing;
        an end tag of an element that is not special is ignored where a special element stands open inside it."""
        if not self.counts.get(name):
            return
        if name not in SPECIAL:
            for open_name, _ in reversed(self.open):
                if open_name == name:
                    break
                if open_name in SPECIAL:
                    return
        while self.open and self._pop() != name:
            pass

    def _text(self, start: int, end: int) -> None:
        raw = self.text[start:end]
        if raw.isspace():
            return
        data = html.unescape(raw)
        words = SPACE.sub(" ", data).strip()
        if not words:
            return  # kept as it came
        self.pieces.append(self.text[self.done : start])
        self.slots.append((len(self.pieces), data[: len(data) - len(data.lstrip())], words,
                           data[len(data.rstrip()) :]))  # fmt: skip
        self.pieces.append("")
        self.done = end
        if self.most is not None and len(self.slots) > self.most:
            raise TooManyTexts(self.most)

    def texts(self) -> list[str]:
        """The text nodes to translate, in document order."""
        return [words for _, _, words, _ in self.slots]

    def render(self, translations: list[str]) -> str:
        """The document with each text node replaced by its translation (escaped), its white space kept."""
        pieces = list(self.pieces)
        for (at, leading, _, trailing), translation in zip(self.slots, translations, strict=True):
            pieces[at] = leading + html.escape(translation, quote=False) + trailing
        return "".join(pieces)
