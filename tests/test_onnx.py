"""ONNX export (issue 34): the graphs, run by onnxruntime inside our greedy and beam search, give PyTorch's
sequences on a trained built-in model, a converted Marian and every architecture option; int8 keeps BLEU."""

import shutil

import pytest
import torch
from transformers import GenerationConfig

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.data.number_words import builtin_splits
from vaswani_hf.translation.ensemble import Ensemble
from vaswani_hf.translation.inference import evaluate, load_for_inference

from .helpers import vaswani
from .test_decoding_parity import padded_batch, random_pair

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
from vaswani_hf.interop.onnx import GRAPHS, OnnxSeq2Seq, export_onnx, is_onnx_folder, quantize_onnx_folder  # noqa: E402

SOURCES = [source for source, _ in builtin_splits()["test"][:64]]


@pytest.fixture(scope="module")
def exported(translator, tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx")
    (root / "model").symlink_to(translator)
    # the int8 graphs are the float32 export's, quantized (one trace, as docs/deployment.md shows it)
    for source, name, extra in (("model", "onnx", []), ("onnx", "onnx-int8", ["--quantize", "int8"])):
        result = vaswani("export", str(root / source), "--format", "onnx", "--output_dir", str(root / name), *extra)
        assert result.returncode == 0, result.stderr[-3000:]
    assert "quantized into" in result.stdout
    return root


def assert_same_decoding(model, runner, input_ids, attention_mask, **kwargs):
    for num_beams in (1, 4):
        beam = num_beams > 1
        ours = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams,
                              num_return_sequences=2 if beam else 1, output_scores=beam, return_dict_in_generate=True,
                              **kwargs)  # fmt: skip
        theirs = runner.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams,
                                 num_return_sequences=2 if beam else 1, output_scores=beam,
                                 return_dict_in_generate=True, **kwargs)  # fmt: skip
        assert torch.equal(theirs.sequences, ours.sequences), f"num_beams={num_beams}"
        if beam:
            torch.testing.assert_close(theirs.sequences_scores, ours.sequences_scores, atol=1e-4, rtol=1e-4)


def test_folder_has_optimum_layout(exported):
    folder = exported / "onnx"
    for name in (*GRAPHS, "config.json", "generation_config.json", "tokenizer.json"):
        assert (folder / name).is_file(), name
    runner = OnnxSeq2Seq(folder)
    decoder = runner.sessions["decoder_with_past_model.onnx"]
    inputs = [i.name for i in decoder.get_inputs()]
    assert inputs[:3] == ["input_ids", "encoder_attention_mask", "past_key_values.0.decoder.key"]
    assert [o.name for o in decoder.get_outputs()][:2] == ["logits", "present.0.decoder.key"]
    assert decoder.get_inputs()[0].shape[0] == "batch_size"


def test_builtin_task_decodes_as_pytorch(exported):
    model, tokenizer = load_for_inference(exported / "model", device="cpu")
    runner = OnnxSeq2Seq(exported / "onnx")
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    greedy = tokenizer.batch_decode(model.generate(**batch, num_beams=1), skip_special_tokens=True)
    assert len(set(greedy)) > 10, "the test model should produce varied translations"
    assert_same_decoding(model, runner, batch["input_ids"], batch["attention_mask"])  # the paper's decoding


def test_onnx_folders_ensemble_with_a_pytorch_model(exported):
    """Ensemble members may be any decoding engine: the PyTorch model with its own export equals the model, as
    one model twice does (each member's log-probabilities are the same to 1e-4)."""
    model, tokenizer = load_for_inference(exported / "model", device="cpu")
    batch = tokenizer(SOURCES[:16], return_tensors="pt", padding=True)
    assert_same_decoding(model, Ensemble([model, OnnxSeq2Seq(exported / "onnx")]), batch["input_ids"],
                         batch["attention_mask"])  # fmt: skip


def test_int8_graphs_keep_bleu(exported):
    pairs = builtin_splits()["test"][:200]
    fp32, tokenizer = OnnxSeq2Seq.with_tokenizer(exported / "onnx")
    int8 = OnnxSeq2Seq(exported / "onnx-int8")
    bleu_fp32 = evaluate(fp32, tokenizer, pairs, batch_size=50)[0]["bleu"]
    bleu_int8 = evaluate(int8, tokenizer, pairs, batch_size=50)[0]["bleu"]
    assert bleu_fp32 > 60, "the test model should translate"
    # one-sided: int8 must not lose BLEU, and may gain some. Over 200 sentences one flipped sentence moves BLEU by
    # about half a point: an AMX Xeon saw int8 0.51 ahead, so the bound is two flipped sentences, not a tie
    assert bleu_int8 >= bleu_fp32 - 1.0, (bleu_fp32, bleu_int8)
    size = sum((exported / "onnx" / name).stat().st_size for name in GRAPHS)
    assert sum((exported / "onnx-int8" / name).stat().st_size for name in GRAPHS) < size


@pytest.mark.slow
def test_an_int8_export_of_the_model_decodes_as_its_float32_export_quantized(exported, tmp_path):
    """`vaswani export MODEL --quantize int8` traces and quantizes in one go; the fixture quantized the float32
    export instead: both give the same graphs' decoding (another trace: slow tier)."""
    result = vaswani("export", str(exported / "model"), "--format", "onnx", "--output_dir", str(tmp_path / "int8"),
                     "--quantize", "int8")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    _, tokenizer = load_for_inference(exported / "model", device="cpu")
    batch = tokenizer(SOURCES[:16], return_tensors="pt", padding=True)
    direct, quantized = OnnxSeq2Seq(tmp_path / "int8"), OnnxSeq2Seq(exported / "onnx-int8")
    assert direct.weights == quantized.weights == "int8"
    for num_beams in (1, 4):
        ours, theirs = (runner.generate(**batch, num_beams=num_beams, output_scores=True, return_dict_in_generate=True)
                        for runner in (direct, quantized))  # fmt: skip
        assert torch.equal(ours.sequences, theirs.sequences), f"num_beams={num_beams}"


def test_cli_translates_with_onnxruntime_as_with_torch(exported):
    stdin = "\n".join(SOURCES[:12]) + "\n"
    torch_run = vaswani("translate", str(exported / "model"), "--precision", "fp32", "--nbest", "2", stdin=stdin)
    onnx_run = vaswani("translate", str(exported / "onnx"), "--engine", "onnxruntime", "--nbest", "2", stdin=stdin)
    assert torch_run.returncode == 0 and onnx_run.returncode == 0, onnx_run.stderr[-2000:]
    for ours, theirs in zip(onnx_run.stdout.splitlines(), torch_run.stdout.splitlines(), strict=True):
        index, text, value = ours.split(" ||| ")
        assert (index, text) == tuple(theirs.split(" ||| ")[:2])
        assert float(value) == pytest.approx(float(theirs.split(" ||| ")[2]), abs=1e-4)
    assert "engine: onnxruntime (float32)" in onnx_run.stderr


def test_the_onnx_engine_leaves_blank_lines_empty(exported):
    result = vaswani("translate", str(exported / "onnx"), "--engine", "onnxruntime", stdin="three\n \n\nfive\n")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.split("\n")[:-1]
    assert len(lines) == 4 and lines[1] == lines[2] == "" and lines[0] and lines[3]
    assert "2 empty (left empty)" in result.stderr


@pytest.fixture(scope="module")
def marian_graphs(tmp_path_factory):
    """A converted Marian model's graphs, exported once (about 50 s): the two decodings below convert the same
    weights and config, and differ only in the folder's generation_config.json, which each writes there."""
    folder = tmp_path_factory.mktemp("marian-onnx")
    model = random_pair(4)[1]  # Transformers' decoding (the paper's is every other export's)
    export_onnx(model, None, folder)
    written = GenerationConfig.from_pretrained(folder).to_diff_dict()
    assert written == model.generation_config.to_diff_dict() and written["length_penalty_type"] == "hf"
    return folder


@pytest.mark.parametrize("hf_decoding", [False, True])
def test_converted_marian_decodes_as_pytorch(marian_graphs, hf_decoding):
    _, model = random_pair(4, paper_decoding=not hf_decoding)
    model.generation_config.save_pretrained(marian_graphs)  # as export_onnx writes it for this model
    input_ids, attention_mask = padded_batch(4, batch=5)
    extra = dict(length_penalty_type="hf", max_length_offset=None, max_new_tokens=12) if hf_decoding else {}
    assert_same_decoding(model, OnnxSeq2Seq(marian_graphs), input_ids, attention_mask, **extra)


# Each architecture option's graphs, exported once (35-45 s each on 2 AMD EPYC cores) for the decoding and the
# position tests. The sinusoidal layouts hold a table of 16 positions: the graphs keep the exported rows alone.
OPTIONS = {
    "untied, learned positions, pre-norm, output bias": dict(
        tie_word_embeddings=False, position_embedding_type="learned", norm_position="pre", output_bias=True
    ),
    "d_k 16 x 4 heads, split sinusoids, gelu, 3+1 layers": dict(
        d_kv=16, position_embedding_type="sinusoidal_split", activation_function="gelu", encoder_layers=3,
        decoder_layers=1, max_position_embeddings=16,
    ),
    "fairseq's sinusoids, pad 1": dict(
        position_embedding_type="sinusoidal_fairseq", pad_token_id=1, bos_token_id=0, max_position_embeddings=16
    ),
}  # fmt: skip
SINUSOIDS = [name for name, options in OPTIONS.items() if "sinusoidal" in options["position_embedding_type"]]


@pytest.fixture(scope="module", params=list(OPTIONS))
def option_graphs(request, tmp_path_factory):
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(init_std=0.3, **OPTIONS[request.param])).eval()
    if model.final_logits_bias is not None:
        torch.nn.init.normal_(model.final_logits_bias)
    folder = tmp_path_factory.mktemp("options-onnx")
    export_onnx(model, None, folder)
    return model, folder


def test_every_config_option_exports(option_graphs):
    model, folder = option_graphs
    source = torch.randint(4, model.config.vocab_size, (4, 9))
    mask = torch.ones_like(source)
    mask[1, 5:] = 0
    # within the 16 positions of the sinusoidal graphs (the start token and 15 more)
    assert_same_decoding(model, OnnxSeq2Seq(folder), source, mask, max_new_tokens=15)


def test_export_of_a_folder_that_is_not_a_model_names_it(tmp_path):
    result = vaswani("export", str(tmp_path), "--format", "onnx", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2 and "no config.json" in result.stderr and "Traceback" not in result.stderr


def test_missing_graph_and_wrong_options_are_named(exported, tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in (exported / "onnx").iterdir():
        if path.name != "decoder_with_past_model.onnx":
            (broken / path.name).write_bytes(path.read_bytes())
    result = vaswani("translate", str(broken), "--engine", "onnxruntime", stdin="one\n")
    assert result.returncode == 2 and "lacks decoder_with_past_model.onnx" in result.stderr
    assert "Traceback" not in result.stderr
    result = vaswani("translate", str(exported / "onnx"), "--engine", "onnxruntime", "--precision", "int8",
                     stdin="one\n")  # fmt: skip
    assert result.returncode == 2 and "--quantize int8" in result.stderr
    result = vaswani("export", str(exported / "model"), "--format", "onnx", "--output_dir", str(tmp_path / "q"),
                     "--quantize", "int4")  # fmt: skip
    assert result.returncode == 2 and "int8 only" in result.stderr
    # an export given to `vaswani export` again: its graphs quantized to int8, nothing else (a usage error and a
    # refusal through the command, the other refusals in this process)
    for folder, options, named in (
        (exported / "onnx", ["--quantize", "int4"], "give it --format onnx --quantize int8"),
        (exported / "onnx-int8", ["--quantize", "int8"], "holds int8 graphs already"),
    ):
        result = vaswani("export", str(folder), str(tmp_path / "int8"), "--format", "onnx", *options)
        assert result.returncode == 2 and named in result.stderr, (options, result.stderr[-2000:])
        assert "Traceback" not in result.stderr
    with pytest.raises(ValueError, match="is the export itself: give a folder outside it"):
        quantize_onnx_folder(exported / "onnx", exported / "onnx")
    with pytest.raises(FileNotFoundError, match="lacks decoder_with_past_model.onnx"):
        quantize_onnx_folder(broken, tmp_path / "int8")
    unrecorded = tmp_path / "unrecorded"  # an int8 export that lost its record: its graphs say what they hold
    shutil.copytree(exported / "onnx-int8", unrecorded)
    (unrecorded / "vaswani_export.json").unlink()
    with pytest.raises(ValueError, match="holds int8 graphs already"):
        quantize_onnx_folder(unrecorded, tmp_path / "int8")
    # stopped halfway (an error, Ctrl-C): no half-quantized folder is left to be taken for an export
    from vaswani_hf.interop import onnx as onnx_module

    def stopped_after_the_encoder(folder):
        (folder / GRAPHS[0]).write_bytes(b"quantized")
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx_module, "_quantize_graphs", stopped_after_the_encoder)
    with pytest.raises(KeyboardInterrupt):
        quantize_onnx_folder(exported / "onnx", tmp_path / "int8")
    assert not (tmp_path / "int8").exists() and not list(tmp_path.glob(".int8.*"))
    runner = OnnxSeq2Seq(exported / "onnx")
    with pytest.raises(ValueError, match="greedy and beam search only: the beam_sample mode"):
        runner.generate(input_ids=torch.tensor([[5, 6, 2]]), do_sample=True)


def test_quantizing_an_export_takes_one_float32_export_into_a_new_folder_and_names_anything_else(tmp_path):
    """What `vaswani export ONNX_FOLDER --quantize int8` refuses before it quantizes anything (no graph is read)."""
    export = tmp_path / "export"
    export.mkdir()
    for name in (*GRAPHS, "config.json"):
        (export / name).write_text("{}")
    record = export / "vaswani_export.json"
    assert is_onnx_folder(export)
    model = tmp_path / "model"  # a model folder that also holds graphs is a model folder
    shutil.copytree(export, model)
    (model / "model.safetensors").write_bytes(b"")
    assert not is_onnx_folder(model)
    refusals = [
        ('{"format": "onnx", "weights": "float32"', "is not an export's record"),  # cut short
        ("[1, 2]", "is not an ONNX export's record"),
        ('{"source": "vaswani-hf", "quantization": "int8"}', "is not an ONNX export's record"),  # CTranslate2's
        ('{"format": "onnx", "weights": "int8"}', "holds int8 graphs already"),
    ]
    for text, named in refusals:
        record.write_text(text)
        with pytest.raises(ValueError, match=named):
            quantize_onnx_folder(export, tmp_path / "int8")
    record.write_text('{"format": "onnx", "weights": "float32"}')
    with pytest.raises(ValueError, match="is inside the export: give a folder outside it"):
        quantize_onnx_folder(export, export / "int8")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "tokenizer.json").write_text("{}")  # another model's
    with pytest.raises(FileExistsError, match="already holds something: give a new or empty folder"):
        quantize_onnx_folder(export, tmp_path / "taken")
    (export / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        quantize_onnx_folder(export, tmp_path / "int8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "model", "taken"]


@pytest.mark.parametrize("option_graphs", SINUSOIDS, indirect=True)
def test_the_graphs_positions_end_where_they_were_exported(option_graphs):
    """The PyTorch model computes sinusoids for any position; its graphs hold the exported table alone (16 rows
    here): the source + offset limit is cut there, with the PyTorch model's tokens up to it, and a longer explicit
    request is refused by name, where onnxruntime had stopped on a broadcast error in its MatMul."""
    model, folder = option_graphs
    runner = OnnxSeq2Seq(folder)
    torch.manual_seed(0)
    source = torch.randint(4, model.config.vocab_size, (2, 9))
    kwargs = dict(input_ids=source, attention_mask=torch.ones_like(source), num_beams=1, max_length_offset=50)
    theirs, ours = runner.generate(**kwargs), model.generate(**kwargs)
    assert theirs.shape[1] == 17 and ours.shape[1] > 17  # start token + 16 positions; the model itself goes on
    assert torch.equal(theirs[:, :16], ours[:, :16])
    with pytest.raises(ValueError, match="position table has max_position_embeddings=16: ask for at most"):
        runner.generate(input_ids=source, max_new_tokens=40)
