"""The page of `vaswani serve` (`GET /`) in headless Chromium, against a real server: the model's facts, translating
as one types (one request after the pause, the same words as `POST /v1/translate`), the alternatives, the attention
heat map's shape, a stale answer never shown, errors in #error, and the keyboard. Needs Debian's chromium and
chromium-driver and the selenium package; skipped without them."""

import shutil
import time

import httpx
import pytest

pytest.importorskip("selenium", reason="the page test drives Chromium with selenium: pip install selenium")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service as ChromeService  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from .test_serve import LINES, Server  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="no chromium and chromedriver on the PATH "
                                "(Debian: apt-get install chromium chromium-driver)")  # fmt: skip

# Wraps window.fetch to record each translate request (its body, when it started, whether it was aborted). The page
# looks fetch up at each call, so a wrapper installed after loading sees every request. `window.__fake`, when set,
# answers in place of the server: a function of the request's number, URL and options giving a Promise of a Response.
RECORD_REQUESTS = """
window.__requests = [];
const realFetch = window.__realFetch = window.fetch;
window.fetch = function (url, options = {}) {
  if (!String(url).includes('v1/translate')) return realFetch.apply(this, arguments);
  const entry = {body: JSON.parse(options.body), at: performance.now(), aborted: false,
                 authorization: (options.headers || {}).Authorization || null};
  if (options.signal) options.signal.addEventListener('abort', () => { entry.aborted = true; });
  window.__requests.push(entry);
  const answer = window.__fake ? window.__fake(window.__requests.length - 1, url, options)
                              : realFetch.apply(this, arguments);
  // what the page was answered, kept to compare with what it shows
  return answer.then(response => { response.clone().json().then(j => { entry.response = j; }, () => {});
                                   return response; });
};
"""


@pytest.fixture(scope="module")
def server(model):
    running = Server(model)
    yield running
    assert running.stop()[0] == 0


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=ChromeService(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def open_page(driver, server: Server) -> dict:
    """Load the page, wait until it has read /v1/model, install the request recorder; the model's facts."""
    page = httpx.get(f"{server.url}/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), \
        f"GET / must serve the page: {page.status_code} {page.text[:200]}"  # fmt: skip
    driver.get_log("browser")  # drop what earlier tests logged
    driver.get(f"{server.url}/")
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "model-name").text not in ("", "loading…"))
    driver.execute_script(RECORD_REQUESTS)
    return httpx.get(f"{server.url}/v1/model", timeout=10).json()


def requests(driver) -> list[dict]:
    return driver.execute_script("return window.__requests")


def text_of(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).get_property("textContent")


def wait_for_translation(driver, expected: str, timeout: float = 30) -> None:
    def shown(d):
        output = d.find_element(By.ID, "translation")
        return output.get_property("textContent") == expected and output.get_attribute("aria-busy") == "false"

    try:
        WebDriverWait(driver, timeout).until(shown)
    except Exception:  # say what was shown instead
        raise AssertionError(f"#translation is {text_of(driver, 'translation')!r} (#error "
                             f"{text_of(driver, 'error')!r}), not {expected!r}") from None  # fmt: skip


def api(server: Server, info: dict, text: str, **kwargs) -> httpx.Response:
    """What the page asks the server for this text, asked directly."""
    body = {"texts": [text], "nbest": min(4, info["max_nbest"]), "scores": True, "attention": True}
    return server.post("/v1/translate", json=body, **kwargs)


def severe(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def test_the_page_shows_the_model_and_one_request_after_typing_gives_the_api_s_translation(server, browser):
    info = open_page(browser, server)
    header = browser.find_element(By.TAG_NAME, "header").text
    assert f"{info['source_name']} → {info['target_name']}" in header
    assert info["model"] in header and "parameters" in header and f"d_model {info['size']['d_model']}" in header
    assert all(f"{key}: " in header for key in info["scores"])
    assert browser.find_element(By.TAG_NAME, "html").get_attribute("lang") == "en"
    assert browser.find_elements(By.CSS_SELECTOR, "main h1")
    source = browser.find_element(By.ID, "source")
    assert source.get_attribute("lang") == info["source"]
    assert browser.find_element(By.ID, "translation").get_attribute("lang") == info["target"]
    assert browser.find_element(By.CSS_SELECTOR, "label[for=source]").text

    # the keyboard: the first Tab reaches the text (no key is needed here), and its focus is visible
    browser.execute_script("document.activeElement.blur()")
    ActionChains(browser).send_keys(Keys.TAB).perform()
    focused = browser.switch_to.active_element
    assert focused.get_attribute("id") == "source"
    assert browser.execute_script("return getComputedStyle(document.activeElement).outlineStyle") != "none"

    text = LINES[0]
    focused.send_keys(text)  # key by key: each one restarts the 300 ms pause
    expected = api(server, info, text).json()["translations"][0]
    wait_for_translation(browser, expected["text"])
    time.sleep(0.6)  # long enough for a second debounced request to start, if there were one
    sent = requests(browser)
    assert len(sent) == 1, [r["body"] for r in sent]
    assert sent[0]["body"] == {"texts": [text], "nbest": min(4, info["max_nbest"]), "scores": True, "attention": True,
                               "source": "en", "target": "de"}  # fmt: skip

    # the alternatives: the other candidates of the answer the page got, with their scores, none repeating the best
    # (a direct request may differ here: a barely trained model's candidates tie, and batches break ties apart)
    items = browser.find_elements(By.CSS_SELECTOR, "#alternatives li")
    alternatives = []
    expected = WebDriverWait(browser, 10).until(lambda d: requests(d)[0].get("response"))["translations"][0]
    for candidate in expected["nbest"][1:]:
        if candidate["text"] not in [expected["text"], *(c["text"] for c in alternatives)]:
            alternatives.append(candidate)
    assert alternatives, "the model gave no distinct alternative to show"
    assert [item.find_element(By.CSS_SELECTOR, ".alternative").get_property("textContent") for item in items] == \
        [candidate["text"] for candidate in alternatives]  # fmt: skip
    for item, candidate in zip(items, alternatives, strict=True):
        assert f"{candidate['score']:.2f}" in item.text
    assert severe(browser) == []


def test_ctrl_enter_translates_at_once_and_the_heat_maps_have_the_attention_s_shapes(server, browser):
    browser.set_window_size(390, 900)  # a phone: the heat maps scroll inside their box, the page does not
    try:
        info = open_page(browser, server)
        browser.execute_script("""document.addEventListener('keydown', (event) => {
            if (event.key === 'Enter' && event.ctrlKey) window.__ctrlEnterAt = performance.now(); }, true);""")
        text = f"{LINES[1]}\n\n{LINES[2]} , {LINES[3]}"  # an empty line among them
        source = browser.find_element(By.ID, "source")
        source.click()
        # all but the last key without events (typing it all could outlast the 300 ms pause on a slow machine); the
        # last key then starts the pause, which Ctrl+Enter must cut short: one request, at once
        browser.execute_script("arguments[0].value = arguments[1]", source, text[:-1])
        source.send_keys(text[-1])
        ActionChains(browser).key_down(Keys.CONTROL).send_keys(Keys.ENTER).key_up(Keys.CONTROL).perform()
        expected = api(server, info, text).json()["translations"][0]
        wait_for_translation(browser, expected["text"])
        time.sleep(0.6)
        sent = requests(browser)
        assert len(sent) == 1 and sent[0]["body"]["texts"] == [text], [r["body"] for r in sent]
        assert sent[0]["at"] - browser.execute_script("return window.__ctrlEnterAt") < 150  # not after the pause

        # a table a line (none for the empty one), (target tokens) rows x (source tokens) columns, each cell's
        # weight to 2 decimals
        assert len(expected["attention"]) == 3
        attention = [line for line in expected["attention"] if line["target_tokens"] and line["source_tokens"]]
        assert len(attention) == 2
        tables = browser.find_elements(By.CSS_SELECTOR, "#attention table")
        assert len(tables) == len(attention)
        assert "Line 2 is empty" in browser.find_element(By.ID, "attention").text
        for table, line in zip(tables, attention, strict=True):
            assert table.find_element(By.TAG_NAME, "caption").text
            columns = table.find_elements(By.CSS_SELECTOR, "thead th[scope=col]")
            rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
            assert (len(rows), len(columns)) == (len(line["target_tokens"]), len(line["source_tokens"]))
            assert len(rows) == len(line["weights"]) and len(columns) == len(line["weights"][0])
            assert all(len(row.find_elements(By.CSS_SELECTOR, "th[scope=row]")) == 1 for row in rows)
            assert all(len(row.find_elements(By.TAG_NAME, "td")) == len(columns) for row in rows)
            last = rows[-1].find_elements(By.TAG_NAME, "td")[-1]
            weight = f"{line['weights'][-1][-1]:.2f}"
            assert last.get_attribute("title").endswith(weight) and last.get_property("textContent") == weight
            assert "▁" not in table.get_property("textContent")
        overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a phone's screen"
        assert severe(browser) == []
    finally:
        browser.set_window_size(1280, 1000)


def test_a_request_overtaken_by_typing_is_aborted_and_its_answer_never_shown(server, browser):
    info = open_page(browser, server)
    # the first request's answer comes 1.5 s late, whatever happens to it meanwhile (as an answer already on its
    # way would): the page must abort that request and, when its answer comes anyway, ignore it
    browser.execute_script("""window.__fake = (n, url, options) => {
        if (n > 0) return window.__realFetch(url, options);
        const stale = {translations: [{text: 'STALE', score: -1, nbest: [{text: 'STALE', score: -1}],
                                       attention: []}], model: 'stale'};
        return new Promise((resolve) => setTimeout(() => {
          window.__staleDelivered = true;
          resolve(new Response(JSON.stringify(stale), {headers: {'Content-Type': 'application/json'}}));
        }, 1500));
      };""")
    source = browser.find_element(By.ID, "source")
    source.send_keys(LINES[3])
    WebDriverWait(browser, 10).until(lambda d: len(requests(d)) == 1)
    assert browser.find_element(By.ID, "translation").get_attribute("aria-busy") == "true"
    source.send_keys(" , " + LINES[4])
    final = f"{LINES[3]} , {LINES[4]}"
    expected = api(server, info, final).json()["translations"][0]["text"]
    wait_for_translation(browser, expected)
    WebDriverWait(browser, 10).until(lambda d: d.execute_script("return window.__staleDelivered === true"))
    time.sleep(0.3)
    assert text_of(browser, "translation") == expected  # the late answer did not replace it
    sent = requests(browser)  # (a pause in the typing could add a request between the two, aborted in turn)
    assert sent[0]["body"]["texts"] == [LINES[3]] and sent[-1]["body"]["texts"] == [final]
    assert all(r["aborted"] for r in sent[:-1]) and not sent[-1]["aborted"]
    assert text_of(browser, "error") == ""
    assert severe(browser) == []


def test_errors_are_shown_in_the_alert_and_an_empty_text_clears_the_output(server, browser):
    info = open_page(browser, server)
    error = browser.find_element(By.ID, "error")
    assert error.get_attribute("role") == "alert"
    source = browser.find_element(By.ID, "source")

    # over the limit: said on the page, nothing sent
    limit = info["char_limit"]
    browser.execute_script("arguments[0].value = 'a'.repeat(arguments[1]);"
                           "arguments[0].dispatchEvent(new Event('input'))", source, limit + 1)  # fmt: skip
    WebDriverWait(browser, 5).until(lambda d: str(limit) in d.find_element(By.ID, "error").text)
    time.sleep(0.6)
    assert requests(browser) == []

    # 429 with Retry-After, then the network failing: the server's message with when to retry, then a readable one
    browser.execute_script("""window.__fake = () => Promise.resolve(new Response(
        JSON.stringify({error: 'the queue is full'}),
        {status: 429, headers: {'Content-Type': 'application/json', 'Retry-After': '7'}}));""")
    source.clear()
    source.send_keys(LINES[5])
    WebDriverWait(browser, 5).until(lambda d: "the queue is full" in d.find_element(By.ID, "error").text)
    assert "retry in 7 seconds" in error.text
    browser.execute_script("window.__fake = () => Promise.reject(new TypeError('Failed to fetch'))")
    source.send_keys(Keys.CONTROL, Keys.ENTER)
    WebDriverWait(browser, 5).until(lambda d: "Could not reach" in d.find_element(By.ID, "error").text)

    # the server back: the translation, and the error gone
    browser.execute_script("window.__fake = null")
    source.send_keys(Keys.CONTROL, Keys.ENTER)
    wait_for_translation(browser, api(server, info, LINES[5]).json()["translations"][0]["text"])
    assert error.text == ""

    # an empty text: the output cleared, no request
    count = len(requests(browser))
    source.send_keys(Keys.CONTROL, "a")
    source.send_keys(Keys.DELETE)
    wait_for_translation(browser, "")
    time.sleep(0.6)
    assert len(requests(browser)) == count
    assert browser.find_elements(By.CSS_SELECTOR, "#alternatives li, #attention table") == []


def test_a_server_with_keys_asks_for_one_and_shows_its_403(model, browser, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("right-key\n")
    keyed = Server(model, "--api_keys", str(keys))
    try:
        info = open_page(browser, keyed)
        assert info["key_required"] is True
        key = browser.find_element(By.ID, "api-key")
        assert key.is_displayed() and key.get_attribute("type") == "password"
        assert browser.find_element(By.CSS_SELECTOR, "label[for=api-key]").text
        browser.execute_script("document.activeElement.blur()")
        ActionChains(browser).send_keys(Keys.TAB).perform()
        assert browser.switch_to.active_element.get_attribute("id") == "api-key"  # the key, then the text
        ActionChains(browser).send_keys("wrong-key", Keys.TAB).perform()
        assert browser.switch_to.active_element.get_attribute("id") == "source"
        browser.switch_to.active_element.send_keys(LINES[6])
        refusal = api(keyed, info, LINES[6], headers={"Authorization": "Bearer wrong-key"})
        assert refusal.status_code == 403
        message = refusal.json()["error"]
        WebDriverWait(browser, 10).until(lambda d: message in d.find_element(By.ID, "error").text)
        assert requests(browser)[-1]["authorization"] == "Bearer wrong-key"

        key.clear()
        key.send_keys("right-key")  # a new key translates the same text again
        expected = api(keyed, info, LINES[6], headers={"Authorization": "Bearer right-key"}).json()
        wait_for_translation(browser, expected["translations"][0]["text"])
        assert text_of(browser, "error") == ""
        assert browser.execute_script("return sessionStorage.getItem('vaswani-serve-api-key')") == "right-key"
        browser.refresh()  # the key is kept for the session
        kept = browser.find_element(By.ID, "api-key")
        WebDriverWait(browser, 20).until(lambda d: kept.get_property("value") == "right-key")
    finally:
        browser.execute_script("sessionStorage.clear()")
        assert keyed.stop()[0] == 0


def test_a_server_of_several_models_offers_its_pairs_and_translates_the_chosen_one(model, browser, tmp_path):
    """Two models (en->de, and a copy serving de->en): the page lists en->de, de->en and nothing composed (no
    third language); choosing de->en fetches that model's facts, and typing sends the chosen pair."""
    import json

    copy = tmp_path / "de-en"
    shutil.copytree(model, copy, ignore=shutil.ignore_patterns("checkpoint-*"))
    facts = json.loads((copy / "training_facts.json").read_text())
    (copy / "training_facts.json").write_text(json.dumps({**facts, "data": {**facts["data"], "src": "de",
                                                                             "tgt": "en"}}))  # fmt: skip
    running = Server([model, copy])
    try:
        open_page(browser, running)
        WebDriverWait(browser, 20).until(lambda d: d.find_element(By.ID, "pair-field").is_displayed())
        options = [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#pair-choice option")]
        assert options == ["English → German", "German → English"]
        browser.find_element(By.CSS_SELECTOR, "#pair-choice option[value='1']").click()
        WebDriverWait(browser, 20).until(lambda d: text_of(d, "pair") == "German → English")
        assert text_of(browser, "model-name") == "de-en"
        browser.execute_script(RECORD_REQUESTS)
        browser.find_element(By.ID, "source").send_keys(LINES[0])
        expected = running.post("/v1/translate", json={"texts": [LINES[0]], "source": "de", "target": "en"})
        wait_for_translation(browser, expected.json()["translations"][0]["text"])
        assert requests(browser)[-1]["body"]["source"] == "de" and requests(browser)[-1]["body"]["target"] == "en"
        assert not severe(browser)
    finally:
        assert running.stop()[0] == 0
