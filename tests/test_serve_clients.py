"""LibreTranslate's clients against a real `vaswani serve` process: the libraries themselves (libretranslatepy,
deep-translator) and, for the apps, their requests as their sources send them, byte for byte where it matters
(encoding, field order, empty keys, GETs with a body). Each answer is checked against `vaswani translate` of the
same text: a server that answers but translates differently would pass a status check.

Sources read (commit):
- LibreTranslate's web page: LibreTranslate/LibreTranslate 39429cbe, libretranslate/templates/app.js.template
- libretranslatepy: argosopentech/LibreTranslate-py 3435a960, libretranslatepy/api.py (run as is)
- deep-translator: nidhaloff/deep-translator fa67ada6, deep_translator/libre.py (run as is)
- Crow Translate: crow-translate/QOnlineTranslator 8541f9b7, src/qonlinetranslator.cpp
- Dialect: dialect-app/dialect 172df321, dialect/providers/modules/libretrans.py and providers/soup.py
- Nextcloud: v1r0x/integration_libretranslate 05144bc4 through jefs42/libretranslate dce7d90c, src/LibreTranslate.php
- SearXNG: searxng/searxng 9fea4120, searx/engines/libretranslate.py"""

import json
import re

import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from vaswani_hf.data.number_words import builtin_splits

from .helpers import vaswani
from .test_serve import Server

LINES = [source for source, _ in builtin_splits()["test"][:8]]
GERMAN = "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt die Fenster des Hauses."


@pytest.fixture(scope="module")
def server(translator):
    running = Server(translator, "--max_chars", "5000")
    yield running
    assert running.stop()[0] == 0


def translated(model, lines: list[str]) -> list[str]:
    """`vaswani translate` of the lines, as the server must answer them."""
    result = vaswani("translate", str(model), "--precision", "fp32", stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split("\n")[: len(lines)]


@pytest.fixture(scope="module")
def expected(translator) -> dict[str, str]:
    return dict(zip(LINES, translated(translator, LINES), strict=True))


def multipart(fields: list[tuple[str, str]], boundary: str = "------------------------5aba908afb50cbbc") -> bytes:
    """A multipart/form-data body as curl and browsers write it, fields in the client's order."""
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
             for name, value in fields]  # fmt: skip
    return ("".join(parts) + f"--{boundary}--\r\n").encode()


def test_libretranslatepy_translates_detects_and_lists(server, expected):
    client = LibreTranslateAPI(server.url)  # its languages() is a GET with a urlencoded body
    assert client.translate(LINES[0], "en", "de") == expected[LINES[0]]
    assert client.translate(LINES[1], "auto", "de") == expected[LINES[1]]
    assert client.detect(GERMAN)[0]["language"] == "de"  # honest, though the model reads English
    assert client.detect(LINES[2])[0]["language"] == "en"
    assert [language["code"] for language in client.languages()] == ["en", "de"]


def test_deep_translator_sends_its_fields_in_the_query_string(server, expected):
    from deep_translator import LibreTranslator

    # it needs a key to start; a server without --api_keys takes any key, as LibreTranslate does
    client = LibreTranslator(source="en", target="de", api_key="unused", use_free_api=False,
                             custom_url=server.url + "/")  # fmt: skip
    assert client.translate(LINES[0]) == expected[LINES[0]]
    assert client.translate_batch(LINES[:2]) == [expected[LINES[0]], expected[LINES[1]]]


def test_libretranslates_web_page(server, expected, translator):
    # on load: two bare GETs, then a multipart /translate (browser FormData) with alternatives "3" and an empty key
    settings = httpx.get(f"{server.url}/frontend/settings").json()
    assert settings["language"] == {"source": {"code": "en", "name": "English"},
                                    "target": {"code": "de", "name": "German"}}  # fmt: skip
    assert settings["charLimit"] == 5000 and settings["filesTranslation"] and not settings["suggestions"]
    assert {".txt", ".html"} <= set(settings["supportedFilesFormat"]) and settings["frontendTimeout"] > 0
    assert all(isinstance(language["targets"], list) for language in httpx.get(f"{server.url}/languages").json())
    body = multipart([("q", LINES[0]), ("source", "auto"), ("target", "de"), ("format", "text"),
                      ("alternatives", "3"), ("api_key", "")], "----WebKitFormBoundary7MA4YWxkTrZu0gW")  # fmt: skip
    answer = server.post("/translate", content=body, headers={
        "Content-Type": "multipart/form-data; boundary=----WebKitFormBoundary7MA4YWxkTrZu0gW"}).json()  # fmt: skip
    assert answer["translatedText"] == expected[LINES[0]]
    assert answer["detectedLanguage"]["language"] == "en" and 0 < answer["detectedLanguage"]["confidence"] <= 100
    assert expected[LINES[0]] not in answer["alternatives"] and len(set(answer["alternatives"])) == len(
        answer["alternatives"]) <= 3  # fmt: skip
    # its file translation: multipart with the file, then a GET of the URL it is given
    files = {"file": ("lines.txt", "\n".join(LINES[:3]).encode(), "text/plain")}
    url = server.post("/translate_file", data={"source": "en", "target": "de", "api_key": ""}, files=files).json()
    download = httpx.get(url["translatedFileUrl"])
    assert download.status_code == 200 and download.text == "\n".join(expected[line] for line in LINES[:3])
    assert 'filename="lines_de.txt"' in download.headers["content-disposition"]


def test_crow_translate_detects_first_then_translates_120_character_pieces(server, translator):
    # bodies start with "&", spaces are %20, the empty key is sent raw; /detect gets the whole text first
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    text = " ".join(LINES[:4])
    detect = server.post("/detect", content=f"&q={text.replace(' ', '%20')}&api_key=".encode(), headers=headers)
    assert detect.json()[0]["language"] == "en"
    pieces, rest = [], text  # Crow's getSplitIndex: at the last space before 120 characters
    while len(rest) >= 120:
        cut = rest.rfind(" ", 0, 119)
        pieces.append(rest[:cut])
        rest = rest[cut:]
    pieces.append(rest)
    out = ""
    for piece in pieces:
        body = f"&q={piece.replace(' ', '%20').replace(',', '%2C')}&source=en&target=de&api_key="
        out += server.post("/translate", content=body.encode(), headers=headers).json()["translatedText"]
    assert len(pieces) > 1 and out == "".join(translated(translator, pieces))


def test_dialect_checks_the_spec_and_the_settings_then_translates_json(server, expected):
    agent = {"User-Agent": "Dialect App"}
    spec = httpx.get(f"{server.url}/spec", headers=agent).json()
    assert spec["info"]["title"] == "LibreTranslate" and spec["swagger"] == "2.0"  # its instance check
    key_check = server.post("/detect", data={"q": "hello", "api_key": ""}, headers=agent).json()
    assert "confidence" in key_check[0]
    settings = httpx.get(f"{server.url}/frontend/settings", headers=agent).json()
    assert int(settings["charLimit"]) == 5000 and not settings["apiKeys"] and not settings["keyRequired"]
    body = json.dumps({"q": LINES[3], "source": "auto", "target": "de"}).encode()
    answer = server.post("/translate", content=body, headers={**agent, "Content-Type": "application/json"}).json()
    assert answer["translatedText"] == expected[LINES[3]] and answer["detectedLanguage"]["language"] == "en"
    # its error matching: "is not supported" and "exceeds text limit" by text
    wrong = server.post("/translate", json={"q": LINES[3], "source": "fr", "target": "de"}).json()
    assert "is not supported" in wrong["error"]


def test_nextcloud_sends_html_always_and_detects_through_the_query_string(server, expected):
    empty = {"Accept": "*/*", "Content-Type": "application/x-www-form-urlencoded", "Content-Length": "0"}
    assert server.post("/", headers=empty).status_code == 405  # its connection test: any answer will do
    assert "language" in httpx.request("GET", f"{server.url}/frontend/settings", headers=empty).json()
    codes = [language["code"] for language in httpx.request("GET", f"{server.url}/languages", headers=empty).json()]
    assert {"en", "de"} <= set(codes)  # its defaults must be there, or it will not start
    detect = server.post("/detect", params={"q": LINES[4], "api_key": ""}, headers=empty).json()
    assert detect[0]["language"] == "en"
    html = f"<p>{LINES[4]}</p> <b>{LINES[5]}</b>"
    body = multipart([("q", html), ("format", "html"), ("source", "en"), ("target", "de"), ("api_key", "")])
    answer = server.post("/translate", content=body, headers={
        "Content-Type": "multipart/form-data; boundary=------------------------5aba908afb50cbbc"}).json()  # fmt: skip
    assert answer["translatedText"] == f"<p>{expected[LINES[4]]}</p> <b>{expected[LINES[5]]}</b>"


def test_searxng_asks_for_three_alternatives_in_json(server, expected):
    body = json.dumps({"q": LINES[6], "source": "en", "target": "de", "alternatives": 3}).encode()
    answer = server.post("/translate", content=body, headers={"Content-Type": "application/json"}).json()
    assert answer["translatedText"] == expected[LINES[6]]
    assert isinstance(answer["alternatives"], list) and expected[LINES[6]] not in answer["alternatives"]
    assert "" not in answer["alternatives"] and len(set(answer["alternatives"])) == len(answer["alternatives"])


def test_source_auto_refuses_text_the_identifier_is_sure_is_another_language(server, expected):
    french = "Un homme en chemise bleue se tient sur une échelle et nettoie les fenêtres de la maison."
    refused = server.post("/translate", json={"q": french, "source": "auto", "target": "de"})
    assert refused.status_code == 400
    assert re.match(r"Invalid request: the text is French \(fr, confidence (9\d|100)(\.\d)?\), but this server "
                    r"translates English \(en\) to German \(de\)$", refused.json()["error"])  # fmt: skip
    # text already in the target comes back as it is (LibreTranslate's answer when source == target)
    same = server.post("/translate", json={"q": GERMAN, "source": "auto", "target": "de"}).json()
    assert same["translatedText"] == GERMAN and same["detectedLanguage"]["language"] == "de"
    short = server.post("/translate", json={"q": "Hallo", "source": "auto", "target": "de"})
    assert short.status_code == 200  # too short to be sure: translated
    detected = server.post("/detect", json={"q": GERMAN}).json()
    assert detected[0]["language"] == "de" and detected[0]["confidence"] > 90
    assert server.post("/detect", json={"q": "12 34"}).json() == [{"confidence": 0.0, "language": "en"}]


def test_html_keeps_the_markup_in_the_parser_s_form_and_translates_the_text_between(server, expected, translator):
    html = (f'<!DOCTYPE html><div class="x" data-a="1 &amp; 2"><p>{LINES[0]}</p><script>if (a < b) f();</script>'
            f'<!-- {LINES[1]} --><p translate="no">{LINES[2]}</p><code>{LINES[3]}</code><br/>\n  {LINES[7]}  '
            f"<em>{LINES[5]}</em></div>")  # fmt: skip
    answer = server.post("/translate", json={"q": html, "source": "en", "target": "de", "format": "html"}).json()
    # a document (it starts with a doctype) comes back whole, as lxml writes it: html and body added, <br/> as <br>
    assert answer["translatedText"] == (
        f'<!DOCTYPE html>\n<html><body><div class="x" data-a="1 &amp; 2"><p>{expected[LINES[0]]}</p><script>'
        f'if (a < b) f();</script><!-- {LINES[1]} --><p translate="no">{LINES[2]}</p><code>{LINES[3]}</code><br>\n  '
        f"{expected[LINES[7]]}  <em>{expected[LINES[5]]}</em></div></body></html>")  # fmt: skip
    escaped = server.post("/translate", json={"q": "<p>a &lt; b</p>", "source": "en", "target": "de",
                                              "format": "html"}).json()["translatedText"]  # fmt: skip
    assert escaped == f"<p>{translated(translator, ['a < b'])[0].replace('<', '&lt;')}</p>"


def test_errors_are_json_everywhere_and_codes_are_case_insensitive(server, expected):
    assert httpx.get(f"{server.url}/no-such-page").json() == {"error": "not found: /no-such-page"}
    assert httpx.get(f"{server.url}/translate").status_code == 405
    assert "error" in httpx.get(f"{server.url}/translate").json()
    upper = server.post("/translate", json={"q": LINES[0], "source": "EN", "target": "De"})
    assert upper.json() == {"translatedText": expected[LINES[0]]}
    missing = httpx.get(f"{server.url}/download_file/nothing.txt")
    assert missing.status_code == 404 and "no translated file" in missing.json()["error"]
    unsupported = server.post("/translate_file", data={"source": "en", "target": "de"},
                              files={"file": ("a.pdf", b"%PDF", "application/pdf")})  # fmt: skip
    assert unsupported.status_code == 400 and "file format not supported" in unsupported.json()["error"]
    # the metrics' labels stay few whatever paths clients try
    assert "no-such-page" not in httpx.get(f"{server.url}/metrics").text
