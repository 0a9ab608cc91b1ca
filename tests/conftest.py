import os
import tempfile

import pytest
import torch

from .helpers import DOCS_PARSER_RUN, RUN, TRANSLATOR_RUN, start_training, stop_started_trainings, trained_once

# Tests never reach the Hub; they build tiny models and data themselves.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# `--precision auto` measures bf16 against fp32 once per machine: keep that out of the user's cache directory
os.environ.setdefault("VASWANI_PRECISION_CACHE", os.path.join(tempfile.mkdtemp(prefix="vaswani-"), "precision.json"))

# and prepared data (`vaswani train --data RAW`) out of the user's 🤗 Datasets cache
os.environ.setdefault("VASWANI_PREPARED_CACHE", tempfile.mkdtemp(prefix="vaswani-prepared-"))

collect_ignore_glob = ["_upstream/*"]

# Two tiers (docs/tests.md): the README's command runs the fast one (-m "not slow and not extended"); the tests
# named in extended_tier.txt are marked `extended`, and .ci/run runs them after it (-m "extended and not slow").
EXTENDED = [line.strip() for line in open(os.path.join(os.path.dirname(__file__), "extended_tier.txt"))
            if line.strip() and not line.startswith("#")]  # fmt: skip


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.nodeid == name or item.nodeid.startswith((name + "[", name + "::")) for name in EXTENDED):
            item.add_marker(pytest.mark.extended)


# Tests that matter on a GPU take the `device` fixture: they run on the CPU everywhere and on CUDA where it is
# visible, those runs marked `gpu` (`python -m pytest -m gpu` runs just them; docs/tests.md).
DEVICES = [pytest.param("cpu")]
if torch.cuda.is_available():
    DEVICES.append(pytest.param("cuda", marks=pytest.mark.gpu))


# The shared trainings, by the fixture that asks for them (its name and the module that defines it): started
# together as soon as the session's tests are collected, longest first (helpers.start_training), where some
# collected test asks for that fixture (not for another module's fixture of the same name, as test_edges.py's
# `translator`). Not under xdist: its workers run tests side by side already, and would each train the same.
EARLY_TRAININGS = {("translator", __name__): ("translator", TRANSLATOR_RUN),
                   ("workspace", "tests.test_docs"): ("parser", DOCS_PARSER_RUN),
                   ("trained", __name__): ("run", RUN)}  # fmt: skip


def early_trainings(items) -> list[tuple[str, list[str]]]:
    """The shared trainings that the tests `items` ask for, in `EARLY_TRAININGS`' order."""
    wanted = set()
    for item in items:
        definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        for name in getattr(item, "fixturenames", ()):
            if definitions.get(name):  # the last definition is the one the test gets
                wanted.add((name, definitions[name][-1].func.__module__))
    return [training for fixture, training in EARLY_TRAININGS.items() if fixture in wanted]


def pytest_collection_finish(session):
    config = session.config
    listing = config.option.collectonly or config.option.setupplan or getattr(config.option, "showfixtures", False)
    if os.environ.get("PYTEST_XDIST_WORKER") or listing:  # xdist's workers, or a session that runs no test
        return
    for name, args in early_trainings(session.items):
        start_training(name, args, config._tmp_path_factory)


def pytest_sessionfinish(session):
    stop_started_trainings()  # those no test took (a session stopped early, by -x or ^C)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A tiny model trained by `vaswani train` on the built-in task (shared by the CLI and Hub tests)."""
    return trained_once("run", RUN, tmp_path_factory)


@pytest.fixture(scope="session")
def translator(tmp_path_factory):
    """A tiny model trained 1,000 steps on the built-in task (about 30 s on 2 cores): it translates (BLEU ~90), so
    int8 BLEU, alignments and constraints can be judged (shared by the ONNX, translation-feature and metric tests,
    and the docs' blocks as their `vaswani-model/`)."""
    return trained_once("translator", TRANSLATOR_RUN, tmp_path_factory)[0]


@pytest.fixture
def two_threads():
    """torch's thread count 2 for the test (the decoding steps' and workers' thread rules have something to split),
    set back after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


# --- vaswani serve (tests/test_serve*.py) ---


@pytest.fixture(scope="module")
def model(trained):
    return trained[0]


@pytest.fixture(scope="module")
def service(model):
    from vaswani_hf.serving.service import Service, Settings
    from vaswani_hf.translation.inference import load_for_inference

    loaded, tokenizer = load_for_inference(model, device="cpu", precision="fp32")
    service = Service(loaded, tokenizer, Settings(request_timeout=60), str(model), "cpu", "fp32", ("en", "de"))
    service.warm_up()
    yield service
    service.batcher.stop()
