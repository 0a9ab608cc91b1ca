"""`format: html`: the text between tags is translated, the markup is kept as it came. Python's own HTML parser
(html.parser, the standard library's, maintained with it) splits the document; every text node with words in it
becomes one line to translate (its runs of white space made one space, as a browser shows them), and the document
is written back with each node's translation in its place and the node's own leading and trailing white space.

Left as they are: the contents of script, style, code, pre, textarea and template, any element marked
`translate="no"` or with the class `notranslate` (the HTML standard's and Google's conventions), comments,
declarations, and every tag with its attributes, byte for byte."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

UNTRANSLATED = frozenset({"script", "style", "code", "pre", "textarea", "template"})
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})
SPACE = re.compile(r"\s+")


class Document(HTMLParser):
    """An HTML text as pieces: markup (kept) and text nodes, `texts()` the lines to translate, `render()` the
    document with them replaced."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.pieces: list[str] = []
        self.slots: list[tuple[int, str, str, str]] = []  # (piece index, leading space, text, trailing space)
        self.kept: list[bool] = []  # per open element: is its content left untranslated
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.pieces.append(self.get_starttag_text() or "")
        if tag in VOID:
            return
        classes = dict(attrs).get("class") or ""
        self.kept.append((self.kept and self.kept[-1]) or tag in UNTRANSLATED
                         or dict(attrs).get("translate") == "no" or "notranslate" in classes.split())  # fmt: skip

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.pieces.append(self.get_starttag_text() or "")

    def handle_endtag(self, tag: str) -> None:
        self.pieces.append(f"</{tag}>")
        if self.kept and tag not in VOID:
            self.kept.pop()

    def handle_data(self, data: str) -> None:
        words = SPACE.sub(" ", data).strip()
        if not words or (self.kept and self.kept[-1]):
            # script and style arrive raw (html.parser does not decode them); other text is escaped back
            raw = self.lasttag in ("script", "style") and bool(self.kept and self.kept[-1])
            self.pieces.append(data if raw else html.escape(data, quote=False))
            return
        leading = data[: len(data) - len(data.lstrip())]
        trailing = data[len(data.rstrip()) :]
        self.slots.append((len(self.pieces), leading, words, trailing))
        self.pieces.append("")

    def handle_comment(self, data: str) -> None:
        self.pieces.append(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.pieces.append(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self.pieces.append(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self.pieces.append(f"<![{data}]>")

    def texts(self) -> list[str]:
        """The text nodes to translate, in document order."""
        return [words for _, _, words, _ in self.slots]

    def render(self, translations: list[str]) -> str:
        """The document with each text node replaced by its translation (escaped), its white space kept."""
        pieces = list(self.pieces)
        for (at, leading, _, trailing), translation in zip(self.slots, translations, strict=True):
            pieces[at] = leading + html.escape(translation, quote=False) + trailing
        return "".join(pieces)
