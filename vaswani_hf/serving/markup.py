"""`format: html`: the text between tags is translated, the markup kept. A document is parsed by lxml's HTML parser
(libxml2, a C parser made for the web's broken markup, whose HTML tokenizer follows the HTML standard since 2.14);
every text node with words in it becomes one line to translate (its character references decoded, its runs of white
space made one space, as a browser shows them), and the tree is written back with each node's translation in its
place and the node's own leading and trailing white space.

Left untranslated: the contents of script, style, code, pre, textarea, template and plaintext, any element marked
`translate="no"` or with the class `notranslate` (the HTML standard's and Google's conventions), comments,
processing instructions and every attribute.

The markup comes back as libxml2 writes its tree, which is what changes (LibreTranslate's BeautifulSoup path changes
markup too): tag and attribute names in lower case, attribute values in double quotes, end tags the markup implies
written out (`<li>a<li>b` as `<li>a</li><li>b</li>`), void elements without a slash (`<br/>` as `<br>`), character
references in text written as characters (`&nbsp;` as U+00A0) except those HTML needs (`&amp;`, `&lt;`, `&gt;`),
`<![CDATA[...]]>` and `<?...>` as the comments the standard reads them as, end tags of nothing open dropped. A
fragment comes back a fragment (no html, head or body added); a document that starts with a doctype or `<html>`
comes back whole. Nothing is dropped: libxml2 stops reading at `</html>`, where the standard reads on (the text after
it belongs to the body), so that end tag is hidden from it (`HIDDEN`) and the text after it translated as the body's.

Why this parser (measured on 2 AMD EPYC Zen 3 cores, 2026-12-06; tests/test_serve_hostile.py holds the linearity):
the tokenizer of our own before it was quadratic on `<i><div>` + `<b>` * k + `</i>` * m (100 KB in 25 s);
selectolax's Lexbor builds the standard's tree, whose every start tag checks the open elements' stack for a `<p>` to
close, so `<div>` * k is quadratic (250 KB in 17.6 s, and `<p><i>x<div>y</i>z</p>` repeated, 250 KB in 3.8 s);
html5lib is pure Python (50 KB of unclosed `<a ` in 2.1 s, of `<div>` in 19.5 s); libxml2 bounds the depth of its
tree (256 elements), so each step is bounded and the work linear (a tag of more than 512 attributes is refused
first: every parser above takes time growing with the square of a tag's attributes). A document nested deeper than
that bound is refused (`BadMarkup`), not cut short."""

from __future__ import annotations

import re
from itertools import islice

from lxml import etree
from lxml import html as lxml_html

UNTRANSLATED = frozenset({"script", "style", "code", "pre", "textarea", "template", "plaintext"})
DEPTH = 256  # libxml2's bound on the depth of a tree (without XML_PARSE_HUGE)
SPACE = re.compile(r"\s+")
# characters an lxml tree refuses in its text (XML's excluded controls): dropped from a translation put back
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
# `</html` as libxml2 never sees it (it would stop reading there); given back as `</html` in what is written
END_HTML = re.compile("</html", re.IGNORECASE)
HIDDEN = "</vaswani-end-of-html"
# libxml2 (as Lexbor and html5lib) compares each attribute of a tag with those before it (duplicates are dropped):
# time growing with the square of a tag's attributes (20,000 in 3.2 s, 80,000 in 57 s). A tag of more is refused,
# found before the parse by a scan that reads each character once (a start tag as the standard's tokenizer reads
# it: names, then attributes whose quoted values run to their closing quote; possessive, so nothing is read again).
# It reads script and comments as markup too, so it may count more than the parser would, never fewer.
MOST_ATTRIBUTES = 512
_WS = r"\t\n\f\r "
_ATTRIBUTE = rf"""[^{_WS}/>][^{_WS}/=>]*+(?:[{_WS}]*+=[{_WS}]*+(?:"[^"]*+"?|'[^']*+'?|[^{_WS}>]*+))?+"""
START_TAG = re.compile(rf"<[A-Za-z][^{_WS}/>]*+((?:[{_WS}/]++|{_ATTRIBUTE})*+)", re.ASCII)
ATTRIBUTE = re.compile(_ATTRIBUTE, re.ASCII)
WHOLE = re.compile(r"\s*<(?:!doctype|html[\s>])", re.IGNORECASE)  # a document, written back whole


class TooManyTexts(ValueError):
    """A document with more text nodes to translate than a request may send the model (`most`)."""

    def __init__(self, most: int) -> None:
        super().__init__(f"more than {most} text nodes")
        self.most = most


class BadMarkup(ValueError):
    """A document the parser cannot read whole, or not in linear time (nested deeper than libxml2's bound, a tag of
    more than MOST_ATTRIBUTES attributes): refused, never cut short."""


class Document:
    """An HTML text as a tree: `texts()` the lines to translate, `render()` the document with them replaced.
    `most`: raise TooManyTexts as soon as the document has more text nodes than that (the request's bound)."""

    def __init__(self, text: str, most: int | None = None) -> None:
        self.text, self.whole = text, WHOLE.match(text) is not None
        for tag in START_TAG.finditer(text):  # (a tag of fewer characters than the bound has fewer attributes)
            attributes = ATTRIBUTE.finditer(tag[1]) if tag.end(1) - tag.start(1) > MOST_ATTRIBUTES else iter(())
            if next(islice(attributes, MOST_ATTRIBUTES, None), None) is not None:
                raise BadMarkup(
                    f"the HTML cannot be read whole: a tag has more than {MOST_ATTRIBUTES} attributes "
                    "(an HTML parser's time grows with the square of that): send it with fewer"
                )
        parser = lxml_html.HTMLParser(encoding="utf-8", default_doctype=False, remove_comments=False)
        source = END_HTML.sub(HIDDEN, text)
        # a fragment is parsed inside a body of ours (its first child, so that a `<title>` stays where it was)
        self.root = etree.fromstring((source if self.whole else "<html><body>" + source).encode(), parser)
        fatal = next((error for error in parser.error_log if error.level == etree.ErrorLevels.FATAL), None)
        if fatal is not None and fatal.type_name == "ERR_RESOURCE_LIMIT":
            raise BadMarkup(f"the HTML cannot be read whole: its elements are nested deeper than {DEPTH}, the HTML "
                            "parser's bound: send it less deeply nested")  # fmt: skip
        if fatal is not None:
            raise BadMarkup(f"the HTML cannot be read whole (the HTML parser says: {fatal.message.strip()[:200]})")
        # (element, attribute, leading space, words, trailing space)
        self.slots: list[tuple[etree._Element, str, str, str, str]] = []
        if self.root is None:  # a document of nothing but comments or a doctype
            return
        # in document order: an element's text at its start, its tail (the text after it, its parent's) once the
        # walk has left it; `opened` holds the element's ancestors and whether each one's content is kept. One Python
        # step a node, comments and processing instructions included (lxml's iter is C and linear; its iterwalk is
        # quadratic in a run of sibling comments, and XPath's `//text()` sorts what it finds)
        opened: list[tuple[etree._Element, bool]] = []
        for element in self.root.iter():
            parent = element.getparent()
            while opened and opened[-1][0] is not parent:
                self._left(opened, most)
            kept = (opened[-1][1] if opened else False) or not isinstance(element.tag, str) or self._marked(element)
            if not kept:
                self._slot(element, "text", most)
            opened.append((element, kept))
        while opened:
            self._left(opened, most)

    def _left(self, opened: list[tuple[etree._Element, bool]], most: int | None) -> None:
        """The walk has left the innermost open element: its tail is its parent's text."""
        element, _ = opened.pop()
        if opened and not opened[-1][1]:
            self._slot(element, "tail", most)

    @staticmethod
    def _marked(element: etree._Element) -> bool:
        """Whether this element's content is left untranslated by its name or its attributes."""
        return (element.tag.lower() in UNTRANSLATED
                or (element.get("translate") or "").strip().lower() == "no"
                or "notranslate" in (element.get("class") or "").split())  # fmt: skip

    def _slot(self, element: etree._Element, attribute: str, most: int | None) -> None:
        data = getattr(element, attribute) or ""
        words = SPACE.sub(" ", data).strip()
        if not words:  # no text, or only white space: kept as it came
            return
        self.slots.append((element, attribute, data[: len(data) - len(data.lstrip())], words,
                           data[len(data.rstrip()) :]))  # fmt: skip
        if most is not None and len(self.slots) > most:
            raise TooManyTexts(most)

    def texts(self) -> list[str]:
        """The text nodes to translate, in document order."""
        return [words for _, _, _, words, _ in self.slots]

    def render(self, translations: list[str]) -> str:
        """The document with each text node replaced by its translation, its white space kept."""
        for (element, attribute, leading, _, trailing), translation in zip(self.slots, translations, strict=True):
            setattr(element, attribute, leading + NOT_XML.sub("", translation) + trailing)
        if self.root is None:
            return self.text
        if self.whole:
            written = lxml_html.tostring(self.root.getroottree(), encoding="unicode", method="html")
        else:
            written = inner(self.root, unwrap=self.root.find("body"))
        return written.replace(HIDDEN, "</html")


def inner(element: etree._Element, unwrap: etree._Element | None = None) -> str:
    """What is inside `element`, as HTML; `unwrap`, a child of it, written as what is inside it (and its tail)."""
    pieces = [escape(element.text or "")]
    for child in element:
        if child is unwrap:  # written whole at once (a tag at a time would be a Python call a tag)
            written = lxml_html.tostring(child, encoding="unicode", method="html", with_tail=False)
            # its start tag ends at the first '>' (the writer escapes those in attribute values), then its end tag
            pieces += [written[written.index(">") + 1 : -len("</body>")], escape(child.tail or "")]
        else:
            pieces.append(lxml_html.tostring(child, encoding="unicode", method="html", with_tail=True))
    return "".join(pieces)


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
