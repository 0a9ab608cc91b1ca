import os
import tempfile

import pytest
import torch

from .helpers import TINY_RUN, TRAINED_RUN, trained_once

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


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A tiny model trained by `vaswani train` on the built-in task (shared by the CLI and Hub tests)."""
    # fp32 whatever the CPU: `--precision auto` trains in bf16 where it is fast, and a 4-step model's words (which
    # the serve and CLI tests compare) then depend on the CPU kind
    return trained_once("run", [*TINY_RUN, "--precision", "fp32"], tmp_path_factory)


@pytest.fixture(scope="session")
def translator(tmp_path_factory):
    """A tiny model trained 1,000 steps on the built-in task (about 30 s on 2 cores): it translates (BLEU ~90), so
    int8 BLEU, alignments and constraints can be judged (shared by the ONNX, translation-feature and metric tests,
    and the docs' blocks as their `vaswani-model/`)."""
    # checkpoints: the docs' `vaswani average` blocks use them
    args = [*TRAINED_RUN, "--max_steps", "1000", "--warmup_steps", "100", "--save_steps", "200"]
    return trained_once("translator", args, tmp_path_factory)[0]


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
