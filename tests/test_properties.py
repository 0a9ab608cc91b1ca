"""Property tests (hypothesis) over random small configurations and inputs: padding invariance, batch invariance of
greedy decoding, cache versus no cache, and causal masking."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.model.modeling_vaswani import CACHE_FIELD  # `cache` from Transformers 5.24, `past_key_values` before

VOCAB = 40
POSITIONS = ["sinusoidal", "sinusoidal_split", "sinusoidal_fairseq", "learned"]
PROPERTY = settings(max_examples=12, deadline=None)


@st.composite
def models(draw):
    heads = draw(st.sampled_from([1, 2, 4]))
    config = VaswaniConfig(
        vocab_size=VOCAB, d_model=8 * heads, encoder_layers=draw(st.integers(1, 2)),
        decoder_layers=draw(st.integers(1, 2)), encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        position_embedding_type=draw(st.sampled_from(POSITIONS)),
        norm_position=draw(st.sampled_from(["post", "pre"])),
    )  # fmt: skip
    torch.manual_seed(draw(st.integers(0, 2**16)))
    return VaswaniForConditionalGeneration(config).eval()


def tokens(draw, length: int) -> list[int]:
    return draw(st.lists(st.integers(4, VOCAB - 1), min_size=length, max_size=length))  # no special ids


@given(data=st.data(), model=models())
@PROPERTY
def test_padding_the_source_changes_nothing(data, model):
    length, pad = data.draw(st.integers(1, 10)), data.draw(st.integers(1, 6))
    source = torch.tensor([tokens(data.draw, length)])
    target = torch.tensor([[1, *tokens(data.draw, 4)]])
    padded = torch.cat([source, torch.zeros(1, pad, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, length), torch.zeros(1, pad)], dim=1).long()
    with torch.no_grad():
        plain = model(input_ids=source, decoder_input_ids=target).logits
        masked = model(input_ids=padded, attention_mask=mask, decoder_input_ids=target).logits
    torch.testing.assert_close(masked, plain, atol=1e-5, rtol=1e-4)


@given(data=st.data(), model=models())
@PROPERTY
def test_greedy_decoding_does_not_depend_on_the_batch(data, model):
    sources = [tokens(data.draw, data.draw(st.integers(1, 8))) for _ in range(3)]
    longest = max(map(len, sources))
    ids = torch.tensor([s + [0] * (longest - len(s)) for s in sources])
    mask = torch.tensor([[1] * len(s) + [0] * (longest - len(s)) for s in sources])
    with torch.no_grad():
        batched = model.generate(input_ids=ids, attention_mask=mask, num_beams=1, max_new_tokens=6, do_sample=False)
        for row, source in enumerate(sources):
            alone = model.generate(input_ids=torch.tensor([source]), num_beams=1, max_new_tokens=6, do_sample=False)
            got = batched[row, : alone.shape[1]]
            assert got.tolist() == alone[0].tolist()


@given(data=st.data(), model=models())
@PROPERTY
def test_cached_decoding_equals_the_full_forward(data, model):
    source = torch.tensor([tokens(data.draw, data.draw(st.integers(1, 8)))])
    target = torch.tensor([[1, *tokens(data.draw, data.draw(st.integers(1, 6)))]])
    with torch.no_grad():
        full = model(input_ids=source, decoder_input_ids=target, use_cache=False).logits
        encoder_outputs = model.get_encoder()(input_ids=source)
        past, steps = None, []
        for t in range(target.shape[1]):
            out = model(encoder_outputs=encoder_outputs, decoder_input_ids=target[:, t : t + 1],
                        use_cache=True, **{CACHE_FIELD: past})  # fmt: skip
            past = getattr(out, CACHE_FIELD)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


@given(data=st.data(), model=models())
@PROPERTY
def test_a_future_target_token_never_changes_earlier_logits(data, model):
    source = torch.tensor([tokens(data.draw, data.draw(st.integers(1, 8)))])
    target = [1, *tokens(data.draw, data.draw(st.integers(2, 7)))]
    position = data.draw(st.integers(1, len(target) - 1))
    changed = list(target)
    changed[position] = 4 + (changed[position] - 4 + 1) % (VOCAB - 4)
    with torch.no_grad():
        before = model(input_ids=source, decoder_input_ids=torch.tensor([target])).logits
        after = model(input_ids=source, decoder_input_ids=torch.tensor([changed])).logits
    torch.testing.assert_close(after[:, :position], before[:, :position], atol=1e-6, rtol=0)
    assert not torch.allclose(after[:, position:], before[:, position:])
