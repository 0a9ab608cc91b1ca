"""`vaswani translate`'s light start (translation/light_translator.py): an input translated on torch alone gives
the strings the Transformers model gives with its own products, or hands over."""

import json
import os
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from vaswani_hf.translation.inference import load_for_inference, translate_nbest
from vaswani_hf.translation.light_translator import LightTranslator
from vaswani_hf.translation.source_lines import LineReport

from .helpers import LETTER_WORDS, paper_model_folder

ARCHITECTURES = [{}, {"norm_position": "pre"}, {"d_kv": 4, "decoder_layers": 1}, {"scale_embedding": False},
                 {"encoder_attention_heads": 2, "decoder_attention_heads": 8, "encoder_layers": 1}]  # fmt: skip
_FOLDERS: dict = {}


def folder(tmp_path_factory, architecture: int, model_max_length: int = 64):
    """One saved model per architecture, shared by the draws (saving one takes longer than translating)."""
    key = (architecture, model_max_length)
    if key not in _FOLDERS:
        path = tmp_path_factory.mktemp(f"light{architecture}")
        _FOLDERS[key] = paper_model_folder(path, seed=architecture, model_max_length=model_max_length,
                                           **ARCHITECTURES[architecture])  # fmt: skip
    return _FOLDERS[key]


words = st.lists(st.sampled_from([*LETTER_WORDS, ".", ",", "zz", "Ünï"]), max_size=12).map(" ".join)
# any text a line may hold (a line never holds "\n": the command splits there), the vocabulary's words more often
texts = st.text(st.characters(exclude_characters="\n"), max_size=30)
lines = st.lists(st.one_of(words, texts, st.sampled_from(["", "   ", "ba . ca . da ."])), min_size=1, max_size=9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(architecture=st.integers(0, len(ARCHITECTURES) - 1), texts=lines, beams=st.sampled_from([None, 1, 2, 4]),
       penalty=st.sampled_from([None, 0.0, 0.6, 1.0]), batch_size=st.integers(1, 9),
       max_tokens=st.sampled_from([None, 12, 4096]), precision=st.sampled_from(["fp32", "bf16", "int8"]),
       long_lines=st.sampled_from(["cut", "split"]), short=st.booleans(),
       workers=st.sampled_from([None, "1", "2"]))  # fmt: skip
def test_light_start_writes_the_model_s_strings(tmp_path_factory, architecture, texts, beams, penalty, batch_size,
                                                 max_tokens, precision, long_lines, short, workers):  # fmt: skip
    """Also with the batches searched side by side (`VASWANI_DECODING_WORKERS`, both paths: the draws' models are
    narrower than the rule's width, so unset is one batch at a time)."""
    with mock.patch.dict(os.environ):  # the environment as it was after each draw
        os.environ.pop("VASWANI_DECODING_WORKERS", None)
        if workers is not None:
            os.environ["VASWANI_DECODING_WORKERS"] = workers
        _light_and_model(tmp_path_factory, architecture, texts, beams, penalty, batch_size, max_tokens, precision,
                         long_lines, short)  # fmt: skip


def _light_and_model(tmp_path_factory, architecture, texts, beams, penalty, batch_size, max_tokens, precision,
                     long_lines, short):  # fmt: skip
    path = folder(tmp_path_factory, architecture, model_max_length=8 if short else 64)
    light = LightTranslator.of(path, precision)
    assert light is not None
    asked = {name: value for name, value in (("num_beams", beams), ("length_penalty", penalty)) if value is not None}
    assume(light.takes(asked))  # a greedy search given a length penalty goes to the model (the test below)
    report, light_report = LineReport(), LineReport()
    got = light.translate_lines(texts, batch_size=batch_size, max_tokens=max_tokens, long_lines=long_lines,
                                report=light_report, **asked)  # fmt: skip
    model, tokenizer = load_for_inference(path, device="cpu", precision=precision)
    expected = translate_nbest(model, tokenizer, texts, 1, batch_size, False, max_tokens, long_lines=long_lines,
                               report=report, cpu_fast_paths=False, **asked)  # fmt: skip
    assert got == [candidates[0][0] for candidates in expected]
    assert light_report == report


def test_a_wide_model_s_strings(tmp_path_factory):
    """A wider model than the draws' (256: the fast products' and batch workers' width), fp32, bf16 and int8, in
    one batch and in several searched side by side (`batch_workers.workers_for`)."""
    path = paper_model_folder(tmp_path_factory.mktemp("wide"), d_model=256, encoder_ffn_dim=512, decoder_ffn_dim=512)
    texts = [" ".join(LETTER_WORDS[(i * 5 + k) % 40] for k in range(3 + i % 7)) + " ." for i in range(12)]
    for precision in ("fp32", "bf16", "int8"):
        model, tokenizer = load_for_inference(path, device="cpu", precision=precision)
        # one batch, and three of four sentences each: searched side by side by the rule at this width, both paths
        for batch_size, beams in ((32, 4), (4, 1)):
            expected = translate_nbest(model, tokenizer, texts, 1, batch_size, False, 4096, cpu_fast_paths=False,
                                       num_beams=beams)  # fmt: skip
            got = LightTranslator.of(path, precision).translate_lines(texts, batch_size=batch_size, num_beams=beams)
            assert got == [c[0][0] for c in expected], (precision, batch_size)


def _added(path, change) -> None:
    """tokenizer.json with its added tokens changed by `change(list of added tokens)`."""
    spec = json.loads((path / "tokenizer.json").read_text())
    change(spec["added_tokens"])
    (path / "tokenizer.json").write_text(json.dumps(spec))


def _not_special(tokens, content="<pad>"):
    next(t for t in tokens if t["content"] == content)["special"] = False


DROP = object()  # the key removed

# what the Transformers model reads otherwise than `tokenizers` alone would, or refuses with its own clear error
HANDED_OVER = {
    "learned positions (a table in the weights)": ("config.json", {"position_embedding_type": "learned"}),
    "another activation": ("config.json", {"activation_function": "gelu"}),
    "an output bias": ("config.json", {"output_bias": True}),
    "untied embeddings": ("config.json", {"tie_word_embeddings": False}),
    "another attention": ("config.json", {"attn_implementation": "eager"}),
    "a dropout the model refuses": ("config.json", {"dropout": 1.5}),
    "a zero epsilon": ("config.json", {"layer_norm_eps": 0}),
    "an epsilon as text": ("config.json", {"layer_norm_eps": "1e-6"}),
    "a width as a float": ("config.json", {"d_model": 32.0}),
    "heads that do not divide the width": ("config.json", {"encoder_attention_heads": 3}),
    "a feed-forward width the weights do not have": ("config.json", {"encoder_ffn_dim": 128}),
    "an alignment layer the model lacks": ("config.json", {"alignment_layer": 9}),
    "an id outside the vocabulary": ("config.json", {"unk_token_id": 999}),
    "a negative init_std": ("config.json", {"init_std": -1}),
    "no vocabulary size (VaswaniConfig's default is the base model's)": ("config.json", {"vocab_size": DROP}),
    "no model type": ("config.json", {"model_type": DROP}),
    "another generation setting": ("generation_config.json", {"no_repeat_ngram_size": 3}),
    "a greedy generation config with a beam's length penalty": ("generation_config.json", {"num_beams": 1}),
    "no source + offset": ("generation_config.json", {"max_length_offset": None}),
    "beams as text": ("generation_config.json", {"num_beams": "4"}),
    "beams as a bool": ("generation_config.json", {"num_beams": True}),
    "a list of EOS ids": ("generation_config.json", {"eos_token_id": [2]}),
    "no EOS in the generation config": ("generation_config.json", {"eos_token_id": DROP}),
    "a list of start ids": ("generation_config.json", {"decoder_start_token_id": [1]}),
    "no start id in the generation config": ("generation_config.json", {"decoder_start_token_id": DROP}),
    "a tokenizer that cleans up spaces": ("tokenizer_config.json", {"clean_up_tokenization_spaces": True}),
    "another tokenizer class": ("tokenizer_config.json", {"tokenizer_class": "MosesBPETokenizer"}),
    "no padding token": ("tokenizer_config.json", {"pad_token": DROP}),
    "a null padding token": ("tokenizer_config.json", {"pad_token": None}),
    "a padding token as an object": ("tokenizer_config.json", {"pad_token": {"content": "<pad>"}}),
    "no length": ("tokenizer_config.json", {"model_max_length": None}),
    "an unknown token tokenizer.json does not mark": ("tokenizer_config.json", {"unk_token": "a"}),
    "tokenizer.json's own padding": ("tokenizer.json", {"padding": {"strategy": "BatchLongest", "direction": "Left",
                                                                    "pad_id": 0, "pad_type_id": 0, "pad_token": "<pad>",
                                                                    "pad_to_multiple_of": None}}),
    "tokenizer.json's own truncation": ("tokenizer.json", {"truncation": {"direction": "Left", "max_length": 8,
                                                                         "strategy": "LongestFirst", "stride": 0}}),
    "a padding token tokenizer.json does not mark special": ("tokenizer.json", _not_special),
    "an EOS tokenizer.json does not add": ("tokenizer.json", lambda tokens: tokens.pop(2)),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HANDED_OVER))
def test_a_folder_it_does_not_read_as_the_model_is_handed_over(tmp_path, case):
    path = paper_model_folder(tmp_path)
    assert LightTranslator.of(path, "fp32") is not None
    name, change = HANDED_OVER[case]
    if callable(change):
        _added(path, change)
    else:
        values = json.loads((path / name).read_text())
        values.update(change)
        (path / name).write_text(json.dumps({k: v for k, v in values.items() if v is not DROP}))
    assert LightTranslator.of(path, "fp32") is None


def test_the_ids_are_the_generation_config_s_own(tmp_path):
    """generate() reads the generation config's ids, never config.json's: a folder whose generation config names
    no padding id pads finished rows with EOS there, whatever config.json says."""
    path = paper_model_folder(tmp_path)
    generation = json.loads((path / "generation_config.json").read_text())
    del generation["pad_token_id"]
    (path / "generation_config.json").write_text(json.dumps(generation))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "pad_token_id": 7}))
    texts = ["ba ca da .", "fe", "ga ha ba ca da fe ga ."]
    for beams in (1, 4):
        model, tokenizer = load_for_inference(path, device="cpu", precision="fp32")
        expected = translate_nbest(model, tokenizer, texts, 1, 32, False, cpu_fast_paths=False, num_beams=beams)
        got = LightTranslator.of(path, "fp32").translate_lines(texts, num_beams=beams)
        assert got == [c[0][0] for c in expected]


def test_precisions_switch_and_broken_folders_are_handed_over(tmp_path, monkeypatch):
    path = paper_model_folder(tmp_path)
    assert LightTranslator.of(path, "int8") is not None and LightTranslator.of(path, "auto") is None
    monkeypatch.setenv("VASWANI_LIGHT_START", "0")
    assert LightTranslator.of(path, "fp32") is None
    monkeypatch.delenv("VASWANI_LIGHT_START")
    (path / "config.json").write_text('{"d_model": 32, "d_model": 64}')  # a repeated key: Transformers' reading
    assert LightTranslator.of(path, "fp32") is None
    path = paper_model_folder(tmp_path / "other")
    tensors = load_file(path / "model.safetensors")
    save_file({**tensors, "final_logits_bias": torch.zeros(1, tensors["model.shared.weight"].shape[0])},
              path / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    assert LightTranslator.of(path, "fp32") is None
    (path / "model.safetensors").write_bytes(b"not weights")
    assert LightTranslator.of(path, "fp32") is None


def test_weights_are_read_in_the_dtype_the_config_names(tmp_path):
    """The model loads fp32 weights saved under `dtype: bfloat16` in bf16 (rounded), then takes the precision asked
    for: the light start rounds them too (the encoder's output, bit for bit, and the lines)."""
    path = paper_model_folder(tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    texts = ["ba ca da .", "fe ga ha ba ca", "ga ha ba ca da fe ga ."]
    model, tokenizer = load_for_inference(path, device="cpu", precision="fp32")
    light = LightTranslator.of(path, "fp32")
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.get_encoder()(**batch).last_hidden_state
    assert torch.equal(light.encode(batch["input_ids"], batch["attention_mask"]), hidden)
    expected = translate_nbest(model, tokenizer, texts, 1, 32, False, cpu_fast_paths=False, num_beams=1)
    assert light.translate_lines(texts, num_beams=1) == [c[0][0] for c in expected]


def test_a_greedy_search_given_a_beam_s_settings_goes_to_the_model(tmp_path):
    """Transformers warns of a length penalty or stopping rule given to a greedy search; the light start would not."""
    light = LightTranslator.of(paper_model_folder(tmp_path), "fp32")
    assert light.takes({}) and light.takes({"num_beams": 1}) and light.takes({"num_beams": 2, "length_penalty": 1.0})
    assert not light.takes({"num_beams": 1, "length_penalty": 5.0})
    assert not light.takes({"num_beams": 1, "early_stopping": True, "length_penalty": 0.6, "max_length_offset": 50})
    with pytest.raises(ValueError, match="greedy search's length penalty"):
        light.translate_lines(["ba"], num_beams=1, length_penalty=2.0)


def test_int8_holds_the_packed_weights_alone(tmp_path):
    """In int8 each linear keeps its packed int8 weight, not a float32 copy beside it (the model's int8 path drops
    its float32 model): an int8 run holds less than a float32 one, not more. The input embedding stays float32."""
    light = LightTranslator.of(paper_model_folder(tmp_path), "int8")
    layers = [*light.encoder_layers, *light.decoder_layers]
    attentions = [a for layer in layers for a in (layer.self_attn, layer.cross_attn) if a is not None]
    linears = [light.output, *(x for layer in layers for x in (layer.fc1, layer.fc2)),
               *(x for a in attentions for x in (a.projection, a.query, a.output) if x is not None)]  # fmt: skip
    assert len(linears) == 1 + 2 * len(layers) + 2 * len(attentions) + len(light.decoder_layers)
    assert all(x.quantized is not None and x.weight is None and x.bias is None for x in linears)
    assert light.embedding.dtype == torch.float32
