"""Numerical parity with the two peers: Transformers' MarianMTModel and torch.nn.Transformer."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel

from vaswani_hf import VaswaniConfig
from vaswani_hf.interop.convert import torch_transformer_to_vaswani
from vaswani_hf.model.modeling_vaswani import VaswaniSinusoidalPositionalEncoding

from .helpers import paper_marian_config

ROOT = Path(__file__).resolve().parents[1]
PAD, EOS = 98, 0


@pytest.fixture(scope="module")
def marian_pair(tmp_path_factory):
    """A random paper-style Marian (post-norm, relu, sinusoidal, shared embeddings), converted by `vaswani convert`."""
    torch.manual_seed(0)
    config = paper_marian_config(pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=EOS)
    marian = MarianMTModel(config).eval()
    with torch.no_grad():
        marian.final_logits_bias.normal_()  # Opus-MT checkpoints have a non-zero output bias
    src, dst = tmp_path_factory.mktemp("marian"), tmp_path_factory.mktemp("vaswani")
    marian.save_pretrained(src)
    subprocess.run([sys.executable, "-m", "vaswani_hf.cli", "convert", "marian", str(src), str(dst)], check=True,
                   capture_output=True)  # fmt: skip
    return marian, AutoModelForSeq2SeqLM.from_pretrained(dst).eval()


def padded_batch():
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, PAD, (3, 9), generator=generator)
    input_ids[:, -1] = EOS
    input_ids[1, 6:] = PAD
    input_ids[2, 4:] = PAD
    return input_ids, input_ids.ne(PAD).long()


def test_marian_logits_match(marian_pair):
    marian, vaswani = marian_pair
    assert vaswani.config.position_embedding_type == "sinusoidal_split"
    input_ids, attention_mask = padded_batch()
    decoder_input_ids = torch.randint(1, PAD, (3, 7), generator=torch.Generator().manual_seed(2))
    decoder_input_ids[:, 0] = PAD
    with torch.no_grad():
        expected = marian(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        got = vaswani(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_marian_generation_matches(marian_pair, num_beams):
    marian, vaswani = marian_pair
    input_ids, attention_mask = padded_batch()
    common = dict(num_beams=num_beams, max_new_tokens=12, length_penalty=1.0)
    expected = marian.generate(input_ids=input_ids, attention_mask=attention_mask, early_stopping=True, **common)
    got = vaswani.generate(
        input_ids=input_ids, attention_mask=attention_mask, length_penalty_type="hf", max_length_offset=None, **common
    )
    assert torch.equal(got, expected)


def test_marian_converter_refuses_unshared_vocabularies(tmp_path):
    config = MarianConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=8, decoder_ffn_dim=8,
                          share_encoder_decoder_embeddings=False, decoder_vocab_size=50, pad_token_id=49,
                          decoder_start_token_id=49)  # fmt: skip
    MarianMTModel(config).save_pretrained(tmp_path / "m")
    result = subprocess.run([sys.executable, "-m", "vaswani_hf.cli", "convert", "marian", str(tmp_path / "m"),
                             str(tmp_path / "out")], capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 2
    assert "shared vocabulary" in result.stderr and "Traceback" not in result.stderr


def test_torch_transformer_parity():
    """nn.Transformer(norm_first=False) without its extra final norms, fed our embeddings, gives our logits."""
    torch.manual_seed(0)
    d_model, heads, layers, ffn, vocab, pad = 32, 4, 2, 64, 50, 0
    encoder_layer = nn.TransformerEncoderLayer(d_model, heads, ffn, dropout=0.1, batch_first=True)
    decoder_layer = nn.TransformerDecoderLayer(d_model, heads, ffn, dropout=0.1, batch_first=True)
    reference = nn.Transformer(
        d_model, heads, batch_first=True,
        custom_encoder=nn.TransformerEncoder(encoder_layer, layers, norm=None, enable_nested_tensor=False),
        custom_decoder=nn.TransformerDecoder(decoder_layer, layers, norm=None),
    ).eval()  # fmt: skip
    for p in reference.parameters():  # non-trivial norms and biases, so a swapped weight cannot hide
        nn.init.normal_(p, std=0.3)
    embedding = torch.randn(vocab, d_model) * d_model**-0.5
    model = torch_transformer_to_vaswani(
        reference, embedding, pad_token_id=pad, bos_token_id=1, eos_token_id=2, unk_token_id=3
    ).eval()
    assert model.config.layer_norm_eps == 1e-5 and model.config.encoder_layers == layers

    src = torch.randint(4, vocab, (2, 8))
    src[1, 5:] = pad
    tgt = torch.randint(4, vocab, (2, 6))
    src_mask = src.eq(pad)
    positions = VaswaniSinusoidalPositionalEncoding(model.config)

    def embed(ids):
        return nn.functional.embedding(ids, embedding) * d_model**0.5 + positions.encodings(0, ids.shape[1])

    with torch.no_grad():
        hidden = reference(
            embed(src), embed(tgt), src_key_padding_mask=src_mask, memory_key_padding_mask=src_mask,
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.shape[1]), tgt_is_causal=True,
        )  # fmt: skip
        expected = hidden @ embedding.T
        got = model(input_ids=src, attention_mask=src.ne(pad).long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_torch_transformer_with_final_norm_is_refused():
    with pytest.raises(ValueError, match="final LayerNorm"):
        torch_transformer_to_vaswani(nn.Transformer(32, 4, 1, 1, 64), torch.randn(10, 32))


def test_sinusoid_layouts():
    """Paper layout interleaves sin/cos; the split layout (Marian) puts all sines first."""
    config = VaswaniConfig.tiny()
    table = VaswaniSinusoidalPositionalEncoding(config).encodings(0, 5)
    pos, i = 3, 2
    angle = pos / 10000 ** (2 * i / config.d_model)
    assert table[pos, 2 * i].item() == pytest.approx(torch.tensor(angle).sin().item(), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(torch.tensor(angle).cos().item(), abs=1e-6)
    split = VaswaniSinusoidalPositionalEncoding(VaswaniConfig.tiny(position_embedding_type="sinusoidal_split"))
    half = config.d_model // 2
    assert torch.allclose(split.encodings(0, 5)[:, :half], table[:, 0::2])
    assert torch.allclose(split.encodings(0, 5)[:, half:], table[:, 1::2])
    # beyond the precomputed table the sinusoids extend instead of failing
    long = VaswaniSinusoidalPositionalEncoding(config).encodings(60, 10)
    assert torch.allclose(long[0], VaswaniSinusoidalPositionalEncoding(config).table[60], atol=1e-6)


def test_convert_names_a_folder_without_a_model(tmp_path):
    """A folder that is not a saved Marian model stops before anything is written, naming the folder and the fix."""
    result = subprocess.run([sys.executable, "-m", "vaswani_hf.cli", "convert", "marian", str(tmp_path),
                             str(tmp_path / "out")], capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{tmp_path} has no config.json" in result.stderr and not (tmp_path / "out").exists()
