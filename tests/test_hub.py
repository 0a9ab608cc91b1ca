"""Hub sharing end to end against a local Hub-compatible endpoint: `vaswani push`, `push_to_hub`, loading with
`trust_remote_code` where vaswani_hf is not importable, `pipeline("translation")`, model cards, attention maps."""

import json
import os
import struct
import subprocess
import sys
import zlib

import pytest
from transformers import pipeline

from vaswani_hf import VaswaniTranslationPipeline
from vaswani_hf.translation.inference import load_for_inference, translate

from .fake_hub import FakeHub
from .helpers import vaswani

SENTENCES = ["seven hundred twenty-one", "twenty-one , five , ninety-nine", "three"]


@pytest.fixture
def hub(tmp_path):
    with FakeHub() as server:
        server.env = {**os.environ, "HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "hf-home"),
                      "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_test_token",
                      "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # fmt: skip
        yield server


def python(script: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                          stdin=subprocess.DEVNULL)  # fmt: skip


# Where the package is absent: block the import, load from the Hub with remote code, translate.
REMOTE_LOAD = """
import json, sys
sys.modules["vaswani_hf"] = None  # `import vaswani_hf` now fails: only the repository's code can be used
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
repo = sys.argv[1] if len(sys.argv) > 1 else {repo!r}
model = AutoModelForSeq2SeqLM.from_pretrained(repo, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(repo)
batch = tokenizer({sentences!r}, return_tensors="pt", padding=True)
out = tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)
pipe = pipeline("translation", model=repo, trust_remote_code=True)
print(json.dumps({{"module": type(model).__module__, "generate": out,
                  "pipeline": [r["translation_text"] for r in pipe({sentences!r})],
                  "pipeline_class": type(pipe).__module__}}))
"""


def test_push_then_load_anywhere_with_remote_code(trained, hub, tmp_path):
    out, _ = trained
    repo = "someone/number-words"
    result = vaswani("push", str(out), repo, env=hub.env)
    assert result.returncode == 0, result.stderr[-4000:]
    files = hub.repos[repo].branches["main"]
    expected = {"model.safetensors", "config.json", "generation_config.json", "configuration_vaswani.py",
                "modeling_vaswani.py", "tokenizer.json", "tokenizer_config.json", "README.md",
                "training_facts.json", "attention-cross.png", "pipeline_vaswani.py", "generation_vaswani.py",
                "search_vaswani.py", "beam_history_vaswani.py", "lexical_vaswani.py", "decoding_state_vaswani.py",
                "alignment_vaswani.py", "remote_code_vaswani.py"}  # fmt: skip
    assert expected <= set(files), set(files)
    assert not any("fast_products" in name or "graph_search" in name for name in files)  # the package's alone
    assert not any(name.startswith(("checkpoint-", "test.hyp", "trainer_state")) for name in files)
    assert len(hub.commits) == 2  # the repository's initial commit, then everything in one commit
    assert hub.repos[repo].lfs_paths >= {"model.safetensors"}
    auto_map = json.loads(files["config.json"])["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    card = files["README.md"].decode()
    assert f'from_pretrained("{repo}"' in card and "model-index" in card and "nrefs:1|case:mixed" in card

    # A second push of unchanged files uploads nothing and makes no commit.
    uploads, commits = len(hub.lfs_uploads), len(hub.commits)
    result = vaswani("push", str(out), repo, env=hub.env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (len(hub.lfs_uploads), len(hub.commits)) == (uploads, commits)

    # Loaded in a fresh process that cannot import vaswani_hf, it translates exactly as the original.
    remote = python(REMOTE_LOAD.format(repo=repo, sentences=SENTENCES), hub.env)
    assert remote.returncode == 0, remote.stderr[-4000:]
    last = remote.stdout.strip().splitlines()[-1]  # after Transformers' remote-code question, if it asked
    loaded = json.loads(last[last.index("{") :])
    assert loaded["module"].startswith("transformers_modules.")
    assert loaded["pipeline_class"].startswith("transformers_modules.")
    model, tokenizer = load_for_inference(out)
    original = translate(model, tokenizer, SENTENCES, progress=False)
    assert [t.strip() for t in loaded["generate"]] == original
    assert [t.strip() for t in loaded["pipeline"]] == original


def test_push_private_to_a_branch_and_push_to_hub_method(trained, hub):
    out, _ = trained
    result = vaswani("push", str(out), "someone/private-model", "--private", "--revision", "dev", env=hub.env)
    assert result.returncode == 0, result.stderr[-4000:]
    repo = hub.repos["someone/private-model"]
    assert repo.private and "model.safetensors" in repo.branches["dev"]
    assert "model.safetensors" not in repo.branches["main"]
    script = (f"import vaswani_hf\nfrom transformers import AutoModelForSeq2SeqLM\n"
              f"AutoModelForSeq2SeqLM.from_pretrained({str(out)!r}).push_to_hub('someone/via-method')")  # fmt: skip
    result = python(script, hub.env)
    assert result.returncode == 0, result.stderr[-4000:]
    files = hub.repos["someone/via-method"].branches["main"]
    assert {"model.safetensors", "modeling_vaswani.py", "configuration_vaswani.py"} <= set(files)


def test_pipeline_translation_matches_translate(trained):
    out, _ = trained
    model, tokenizer = load_for_inference(out)
    translator = pipeline("translation", model=str(out), pipeline_class=VaswaniTranslationPipeline)
    assert [r["translation_text"].strip() for r in translator(SENTENCES)] == translate(
        model, tokenizer, SENTENCES, progress=False
    )


def test_generated_card_has_the_facts_and_no_placeholders(trained):
    out, _ = trained
    card = (out / "README.md").read_text()
    facts = json.loads((out / "training_facts.json").read_text())
    for text in ("{{", "}}", "{%", "More Information Needed", "TODO", "| None |", "None%"):
        assert text not in card
    for expected in (f"{facts['model']['parameters'] / 1e6:.2f}M", "Adam(beta1=0.9, beta2=0.98, eps=1e-09)",
                     "label smoothing | 0.1", "nrefs:1|case:mixed|eff:no|tok:13a",
                     "pipeline_tag: translation", "arxiv:1706.03762", "@inproceedings{vaswani2017attention",
                     facts["training"]["hardware"], "![attention](attention-cross.png)"):  # fmt: skip
        assert expected in card, expected
    metadata = card.split("---")[1]
    assert "model-index" in metadata and "value: " + str(facts["evaluation"]["bleu"]) in metadata


# --- attention maps ------------------------------------------------------------------------------------------


def png_chunks(data: bytes) -> dict[bytes, list[bytes]]:
    """Parse a PNG, checking the signature and every chunk's CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, offset = {}, 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, body = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.setdefault(kind, []).append(body)
        offset += 12 + length
    assert b"IHDR" in chunks and b"IEND" in chunks
    return chunks


def test_attention_command_writes_one_panel_per_layer_and_head(trained, tmp_path):
    out, _ = trained
    config = json.loads((out / "config.json").read_text())
    result = vaswani("attention", str(out), "twenty-one , five", "--output", str(tmp_path / "maps"))
    assert result.returncode == 0, result.stderr[-3000:]
    layers = {"encoder": config["encoder_layers"], "decoder": config["decoder_layers"],
              "cross": config["decoder_layers"]}  # fmt: skip
    for kind, count in layers.items():
        path = tmp_path / f"maps-{kind}.png"
        assert str(path) in result.stdout
        chunks = png_chunks(path.read_bytes())
        texts = dict(chunk.split(b"\0", 1) for chunk in chunks.get(b"tEXt", []))
        heads = config["encoder_attention_heads"] if kind == "encoder" else config["decoder_attention_heads"]
        assert texts[b"Description"] == f"layers={count} heads={heads}".encode()
        width, height = struct.unpack(">II", chunks[b"IHDR"][0][:8])
        assert width > height * heads / count / 2  # a grid: heads across, layers down


@pytest.mark.parametrize("layers, heads", [(2, 4), (6, 16)])
def test_an_attention_map_of_a_long_output_stays_a_readable_size(tmp_path, layers, heads):
    """An untrained model's output runs to its length limit (a parser's: hundreds of tokens); the panels grew with
    it, and a training card's maps came out 23,302 x 11,651 pixels, a minute each to draw. Past 40 tokens a panel
    is small and unlabelled, and a whole map stays within 48 inches (3,840 pixels) whatever its heads and layers;
    its title keeps the kind's name and cuts the translation to the width."""
    import torch

    from vaswani_hf.translation.attention import FIGURE_INCHES, plot_attention, title

    length = 300
    weights = {"source_tokens": [f"s{i}" for i in range(12)], "target_tokens": [f"t{i}" for i in range(length)],
               "translation": "t " * length, "cross": torch.rand(layers, heads, length, 12).softmax(-1)}  # fmt: skip
    chunks = png_chunks(plot_attention(weights, "cross", tmp_path / "cross.png").read_bytes())
    width, height = struct.unpack(">II", chunks[b"IHDR"][0][:8])
    assert max(width, height) <= FIGURE_INCHES * 80 + 1 and width > height, (width, height)  # still heads across
    for inches in (3.5, 20, 120):
        line = title("cross", "a long translation " * 40, inches)
        assert line.startswith("cross-attention: a long") and len(line) <= max(13 * inches, 25), line
    assert title("cross", "kurz", 3.5) == "cross-attention: kurz"
