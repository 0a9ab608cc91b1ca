"""`vaswani serve` with many models behind one URL, as a LibreTranslate instance: three models (en->de, de->en,
en->fr; the trained translator and two copies whose weights are nudged, so that a request routed to the wrong model
answers differently) in one real server process. Every client of docs/serving.md's table, as it calls
LibreTranslate (tests/test_serve_clients.py reads their sources), gets for every direct and composed pair what
`vaswani translate` gives: the model's translation, or the pivot's translated again. Also: `source: auto` among the
served languages, a line's sentences, n-best of composed pairs, models loaded on use past --max_loaded, per-key
limits, and the refusals at start."""

import json
import shutil

import httpx
import pytest
import torch
from libretranslatepy import LibreTranslateAPI

from vaswani_hf.data.number_words import builtin_splits

from .helpers import vaswani
from .test_serve import Server, free_port
from .test_serve_clients import multipart

LINES = [source for source, _ in builtin_splits()["test"][:3]]
FRENCH = "Un homme en chemise bleue se tient sur une échelle et nettoie les fenêtres de la maison."
GERMAN = "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt die Fenster des Hauses."
DIRECT = [("en", "de"), ("de", "en"), ("en", "fr")]
COMPOSED = [("de", "fr")]  # de->en, then en->fr


@pytest.fixture(scope="module")
def models(translator, tmp_path_factory):
    """Three model folders, one per pair; the copies' weights nudged (each its own seed) so their answers differ."""
    from transformers import AutoModelForSeq2SeqLM

    root = tmp_path_factory.mktemp("pairs")
    folders = {}
    for seed, (source, target) in enumerate(DIRECT):
        folder = root / f"{source}-{target}"
        shutil.copytree(translator, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
        facts = json.loads((folder / "training_facts.json").read_text())
        facts["data"] = {**facts.get("data", {}), "src": source, "tgt": target}
        (folder / "training_facts.json").write_text(json.dumps(facts))
        if seed:
            model = AutoModelForSeq2SeqLM.from_pretrained(folder)
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(0.3 * parameter.std() * torch.randn(parameter.shape, generator=generator))
            model.save_pretrained(folder)
        folders[(source, target)] = folder
    return folders


def translate(folder, lines: list[str]) -> list[str]:
    result = vaswani("translate", str(folder), "--precision", "fp32", stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split("\n")[: len(lines)]


@pytest.fixture(scope="module")
def expected(models) -> dict[tuple[str, str], dict[str, str]]:
    """What each pair must answer for LINES and GERMAN: the model's `vaswani translate`, or for a composed pair the
    first model's output translated by the second; the identity gives the text back."""
    texts = [*LINES, GERMAN]
    out = {pair: dict(zip(texts, translate(folder, texts), strict=True)) for pair, folder in models.items()}
    pivot = out[("de", "en")]
    again = translate(models[("en", "fr")], [pivot[text] for text in texts])
    out[("de", "fr")] = dict(zip(texts, again, strict=True))
    out[("fr", "fr")] = {text: text for text in texts}
    return out


@pytest.fixture(scope="module")
def server(models):
    running = Server(list(models.values()), "--max_chars", "5000")
    yield running
    assert running.stop()[0] == 0


# Each client as it sends a translation (the requests of tests/test_serve_clients.py, with the pair as a parameter).
def libretranslatepy(server, text, source, target):
    return LibreTranslateAPI(server.url).translate(text, source, target)


def deep_translator(server, text, source, target):
    from deep_translator import LibreTranslator

    client = LibreTranslator(source=source, target=target, api_key="unused", use_free_api=False,
                             custom_url=server.url + "/")  # fmt: skip
    return client.translate(text)


def libretranslate_page(server, text, source, target):
    boundary = "----WebKitFormBoundary7MA4YWxkTrZu0gW"
    body = multipart([("q", text), ("source", source), ("target", target), ("format", "text"),
                      ("alternatives", "3"), ("api_key", "")], boundary)  # fmt: skip
    answer = server.post(
        "/translate", content=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    return answer.json()["translatedText"]


def crow(server, text, source, target):
    body = f"&q={text.replace(' ', '%20').replace(',', '%2C')}&source={source}&target={target}&api_key="
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    return server.post("/translate", content=body.encode(), headers=headers).json()["translatedText"]


def dialect(server, text, source, target):
    body = json.dumps({"q": text, "source": source, "target": target}).encode()
    headers = {"User-Agent": "Dialect App", "Content-Type": "application/json"}
    return server.post("/translate", content=body, headers=headers).json()["translatedText"]


def nextcloud(server, text, source, target):
    body = multipart([("q", f"<p>{text}</p>"), ("format", "html"), ("source", source), ("target", target),
                      ("api_key", "")])  # fmt: skip
    answer = server.post("/translate", content=body, headers={
        "Content-Type": "multipart/form-data; boundary=------------------------5aba908afb50cbbc"}).json()  # fmt: skip
    return answer["translatedText"].removeprefix("<p>").removesuffix("</p>")


def searxng(server, text, source, target):
    body = json.dumps({"q": text, "source": source, "target": target, "alternatives": 3}).encode()
    return server.post("/translate", content=body, headers={"Content-Type": "application/json"}).json()[
        "translatedText"]  # fmt: skip


CLIENTS = [libretranslatepy, deep_translator, libretranslate_page, crow, dialect, nextcloud, searxng]


@pytest.mark.parametrize("pair", DIRECT + COMPOSED + [("fr", "fr")], ids="->".join)
def test_every_client_gets_every_pair_as_vaswani_translate_gives_it(server, expected, pair):
    for client in CLIENTS:
        for text in LINES[:2]:
            assert client(server, text, *pair) == expected[pair][text], (client.__name__, pair, text)


def test_languages_list_each_source_s_direct_composed_and_identity_targets(server):
    languages = {entry["code"]: entry["targets"] for entry in httpx.get(f"{server.url}/languages").json()}
    assert languages == {"en": ["de", "fr", "en"], "de": ["en", "fr", "de"], "fr": ["fr"]}
    models = httpx.get(f"{server.url}/v1/models").json()
    assert sorted((m["source"], m["target"]) for m in models["models"]) == sorted(DIRECT)
    composed = [p for p in models["pairs"] if p["composed"]]
    assert composed == [{"source": "de", "target": "fr", "pivot": "en", "models": ["de-en", "en-fr"],
                         "composed": True, "source_name": "German", "target_name": "French",
                         "pivot_name": "English"}]  # fmt: skip
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ready" and all(m["loaded"] for m in health["models"]) and len(health["models"]) == 3


def test_source_auto_routes_to_the_detected_language_s_model(server, expected):
    german = server.post("/translate", json={"q": GERMAN, "source": "auto", "target": "en"}).json()
    assert german["detectedLanguage"]["language"] == "de"
    assert german["translatedText"] == expected[("de", "en")][GERMAN]
    composed = server.post("/translate", json={"q": GERMAN, "source": "auto", "target": "fr"}).json()
    assert composed["translatedText"] == expected[("de", "fr")][GERMAN]
    english = server.post("/translate", json={"q": LINES[0], "source": "auto", "target": "fr"}).json()
    assert english["translatedText"] == expected[("en", "fr")][LINES[0]]
    # already in the target language: back as it is (LibreTranslate's answer to source == target)
    itself = server.post("/translate", json={"q": GERMAN, "source": "auto", "target": "de"}).json()
    assert itself == {"detectedLanguage": itself["detectedLanguage"], "translatedText": GERMAN}
    assert itself["detectedLanguage"]["language"] == "de"
    # sure of a language no model reads to the target: refused, naming it and what is served
    refused = server.post("/translate", json={"q": FRENCH, "source": "auto", "target": "de"})
    error = refused.json()["error"]
    assert refused.status_code == 400 and "French (fr" in error and "translates English (en) to German (de)" in error


def test_a_line_of_several_sentences_comes_back_sentence_by_sentence_with_its_spacing(server, models):
    sentences = [f"{LINES[0]}.", f"{LINES[1]}!", f"{LINES[2]}?"]
    line = f"  {sentences[0]}  {sentences[1]} {sentences[2]} "
    each = translate(models[("en", "de")], sentences)
    answer = server.post("/translate", json={"q": [line, "", LINES[0]], "source": "en", "target": "de"}).json()
    assert answer["translatedText"][0] == f"  {each[0]}  {each[1]} {each[2]} "
    assert answer["translatedText"][1:] == ["", translate(models[("en", "de")], [LINES[0]])[0]]


def test_a_composed_pair_says_so_and_gives_n_best_from_summed_scores(server, expected):
    answer = server.post("/v1/translate", json={"texts": [LINES[0]], "source": "de", "target": "fr", "nbest": 3})
    body = answer.json()
    assert answer.status_code == 200, body
    assert body["route"] == {"source": "de", "target": "fr", "pivot": "en", "models": ["de-en", "en-fr"],
                             "composed": True}  # fmt: skip
    nbest = body["translations"][0]["nbest"]
    scores = [candidate["score"] for candidate in nbest[1:]]  # the best is the chain's; the others by summed score
    assert scores == sorted(scores, reverse=True) and len(nbest) == 3
    assert nbest[0]["text"] == body["translations"][0]["text"] == expected[("de", "fr")][LINES[0]]
    direct = server.post("/v1/translate", json={"texts": [LINES[0]], "source": "en", "target": "de"}).json()
    assert direct["route"]["pivot"] is None and direct["translations"][0]["text"] == expected[("en", "de")][LINES[0]]
    facts = httpx.get(f"{server.url}/v1/model", params={"source": "de", "target": "fr"}).json()
    alone = [httpx.get(f"{server.url}/v1/model", params=dict(zip(("source", "target"), pair, strict=True))).json()
             for pair in (("de", "en"), ("en", "fr"))]  # fmt: skip
    assert facts["model"] == "de-en + en-fr" and [m["model"] for m in facts["each_model"]] == ["de-en", "en-fr"]
    assert facts["parameters"] == alone[0]["parameters"] + alone[1]["parameters"]  # not the first model's alone
    assert facts["size"] == {} and facts["scores"] == {}
    identity = httpx.get(f"{server.url}/v1/model", params={"source": "fr", "target": "fr"}).json()
    assert identity["model"] == "identity" and identity["parameters"] == 0 and identity["each_model"] == []
    assert identity["loaded"] and identity["size"] == {}
    attention = server.post("/v1/translate", json={"texts": ["x"], "source": "de", "target": "fr", "attention": True})
    assert attention.status_code == 422 and "composed" in attention.json()["error"]
    unknown = server.post("/translate", json={"q": "x", "source": "fr", "target": "de"})
    assert unknown.status_code == 400 and unknown.json()["error"] == "German (de) is not available as a target " \
        "language from French (fr)"  # fmt: skip


def test_past_max_loaded_models_load_on_use_and_the_least_recent_leaves(models, expected, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("limited 2 40\nfree\n")
    running = Server(list(models.values()), "--max_loaded", "1", "--preload", "en-de", "--api_keys", str(keys))
    try:
        loaded = {(m["source"], m["target"]): m["loaded"] for m in httpx.get(f"{running.url}/health").json()["models"]}
        assert loaded == {("en", "de"): True, ("de", "en"): False, ("en", "fr"): False}
        for pair in [("en", "fr"), ("en", "de"), ("de", "fr"), ("en", "de")]:
            answer = running.post("/translate", json={"q": LINES[0], "source": pair[0], "target": pair[1],
                                                      "api_key": "free"})  # fmt: skip
            assert answer.json()["translatedText"] == expected[pair][LINES[0]], pair
            in_memory = [m for m in httpx.get(f"{running.url}/health").json()["models"] if m["loaded"]]
            assert len(in_memory) == 1
        # per-key limits: 2 requests a minute and 40 characters a request for "limited"
        ask = {"q": LINES[0][:30], "source": "en", "target": "de", "api_key": "limited"}
        assert running.post("/translate", json=ask).status_code == 200
        too_long = running.post("/translate", json={**ask, "q": LINES[1]})
        assert too_long.status_code == 400 and "exceeds text limit (40)" in too_long.json()["error"]
        slowed = running.post("/translate", json=ask)
        assert slowed.status_code == 429 and 1 <= int(slowed.headers["Retry-After"]) <= 60
        assert "2 requests a minute" in slowed.json()["error"]
        assert running.post("/translate", json={**ask, "api_key": "free"}).status_code == 200
    finally:
        assert running.stop()[0] == 0


@pytest.mark.parametrize("how", ["missing folder", "not a model", "two models for one pair"])
def test_a_server_that_cannot_serve_its_models_stops_at_start_saying_why(models, tmp_path, how):
    if how == "missing folder":
        folders, message = [models[("en", "de")], tmp_path / "nope"], "nope: no such folder"
    elif how == "not a model":
        (tmp_path / "empty").mkdir()
        folders, message = [models[("en", "de")], tmp_path / "empty"], "is not a model directory (no config.json)"
    else:
        shutil.copytree(models[("en", "de")], tmp_path / "again")
        folders, message = [models[("en", "de")], tmp_path / "again"], "both serve en->de"
    result = vaswani("serve", *map(str, folders), "--port", str(free_port()))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_parser_and_a_translator_for_one_route_are_refused():
    from vaswani_hf.serving.catalog import ServedModel, check_models

    with pytest.raises(ValueError, match="translator and parser both serve en->en"):
        check_models([ServedModel("translator", "en", "en"), ServedModel("parser", "en", "en", routed=False)])
    with pytest.raises(ValueError, match="one and two are both parsers"):
        check_models([ServedModel("one", "en", "en", routed=False), ServedModel("two", "de", "de", routed=False)])


def test_loads_are_one_at_a_time_and_never_past_max_loaded_under_concurrent_requests():
    """Catalog alone, with a loader that takes time: 40 concurrent requests for three models, at most one in
    memory. Before the fix two loads ran at once (one per model), which also broke Transformers' loading."""
    import asyncio
    import threading
    import time
    import types

    from vaswani_hf.serving.catalog import Catalog, ServedModel
    from vaswani_hf.serving.service import Settings, Translation

    models = [ServedModel(f"m{i}", "en", target) for i, target in enumerate(("de", "fr", "es"))]
    loading, most, loads = [0], [0], []
    guard = threading.Lock()

    def load(model, metrics):
        with guard:
            loading[0] += 1
            most[0] = max(most[0], loading[0] + len(catalog.loaded))
        time.sleep(0.02)
        with guard:
            loading[0] -= 1
        loads.append(model.target)

        async def decode(lines, options, left, deadline=None):
            await asyncio.sleep(0.005)
            return [Translation([(f"{model.target}:{line}", 0.0)]) for line in lines]

        return types.SimpleNamespace(decode=decode, batcher=types.SimpleNamespace(stop=lambda: None, depth=0))

    catalog = Catalog(models, Settings(), load, max_loaded=1)

    async def ask(i):
        target = ("de", "fr", "es")[i % 3]
        route = catalog.route("en", target)
        result = await catalog.decode(route, [str(i)], {}, left=lambda: asyncio.sleep(3600),
                                      deadline=time.monotonic() + 60)  # fmt: skip
        return result[0].nbest[0][0] == f"{target}:{i}"

    async def main():
        return await asyncio.gather(*(ask(i) for i in range(40)))

    assert all(asyncio.run(main()))
    assert most[0] == 1 and len(catalog.loaded) == 1 and set(loads) == {"de", "fr", "es"}


def test_the_pivot_is_the_one_whose_weaker_model_scored_best():
    from vaswani_hf.serving.catalog import ServedModel, plan_routes

    models = [ServedModel("de-en", "de", "en", score=30.0), ServedModel("en-fr", "en", "fr", score=20.0),
              ServedModel("de-es", "de", "es", score=40.0), ServedModel("es-fr", "es", "fr", score=25.0)]  # fmt: skip
    routes = plan_routes(models)
    assert routes[("de", "fr")].pivot == "es"  # min(40, 25) = 25 beats min(30, 20) = 20
    assert [m.name for m in routes[("de", "fr")].models] == ["de-es", "es-fr"]
    assert routes[("fr", "fr")].models == () and ("fr", "de") not in routes
    unscored = plan_routes([ServedModel("de-en", "de", "en"), ServedModel("en-fr", "en", "fr")])
    assert unscored[("de", "fr")].pivot == "en"


def test_v1_model_of_a_composed_pair_says_failed_when_any_of_its_models_failed():
    """de->fr through en: de-en merely unloaded, en-fr failed its file check. The route's state is "failed" with
    en-fr's failure, not the first model's "unloaded" beside another model's failure."""
    from fastapi.testclient import TestClient

    from vaswani_hf.serving.app import create_app
    from vaswani_hf.serving.catalog import Catalog, ServedModel
    from vaswani_hf.serving.service import Settings

    def check(model):
        if model.name == "en-fr":
            raise ValueError("en-fr is broken")

    def load(model, metrics):
        raise RuntimeError("not loaded in this test")

    catalog = Catalog([ServedModel("de-en", "de", "en"), ServedModel("en-fr", "en", "fr")], Settings(), load, None,
                      check=check)  # fmt: skip
    catalog.check_files()
    facts = TestClient(create_app(catalog)).get("/v1/model", params={"source": "de", "target": "fr"}).json()
    assert facts["state"] == "failed" and "en-fr is broken" in facts["failure"]["cause"]
    assert not facts["loaded"] and [m["state"] for m in facts["each_model"]] == ["unloaded", "failed"]
