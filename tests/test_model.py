"""Behaviour of the model itself: config, caches, masks, loss, save/load and remote code."""

import json
import sys

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel
from vaswani_hf.model.modeling_vaswani import CACHE_FIELD  # `cache` from Transformers 5.24, `past_key_values` before

from .helpers import remote_code_outputs

PAD = 0


def tiny_model(**overrides) -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(VaswaniConfig.tiny(**overrides)).eval()


def batch(rows=3, src_len=8, tgt_len=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 99, (rows, src_len), generator=generator)
    src[1, 5:] = PAD
    tgt = torch.randint(4, 99, (rows, tgt_len), generator=generator)
    return src, src.ne(PAD).long(), tgt


# --- configuration -------------------------------------------------------------------------------------------


def test_presets_and_parameter_counts():
    """Table 3 with the paper's 37,000-token shared vocabulary: 63.1M (base) and 214.2M (big) parameters."""
    base, big = VaswaniConfig.base(), VaswaniConfig.big()
    assert (base.d_model, base.encoder_layers, base.encoder_ffn_dim, base.encoder_attention_heads) == (512, 6, 2048, 8)
    assert (big.d_model, big.encoder_ffn_dim, big.decoder_attention_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert base.attention_head_size(8) == 64 and big.attention_head_size(16) == 64
    with torch.device("meta"):
        counts = [sum(p.numel() for p in VaswaniForConditionalGeneration(c).parameters()) for c in (base, big)]
    assert round(counts[0] / 1e6, 1) == 63.1
    assert round(counts[1] / 1e6, 1) == 214.2
    small = VaswaniConfig.small(encoder_layers=4)
    assert (small.d_model, small.encoder_layers, small.decoder_layers, small.encoder_ffn_dim) == (256, 4, 3, 1024)


def test_paper_aliases_and_hf_names():
    config = VaswaniConfig(N=2, h=4, d_model=64, d_ff=128, d_k=8, P_drop=0.2)
    assert (config.encoder_layers, config.decoder_layers) == (2, 2)
    assert (config.encoder_attention_heads, config.decoder_ffn_dim, config.d_kv, config.dropout) == (4, 128, 8, 0.2)
    assert config.hidden_size == 64 and config.num_hidden_layers == 2 and config.num_attention_heads == 4
    assert VaswaniConfig(share_embeddings=False).tie_word_embeddings is False
    # Table 3 rows (B): d_k varies alone
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(d_kv=4))
    assert model.model.encoder.layers[0].self_attn.qkv_proj.out_features == 3 * 4 * 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"d_model": 30, "h": 4}, "not divisible by encoder_attention_heads"),
        ({"d_model": 0}, "`d_model` must be a positive integer"),
        ({"dropout": 1.0}, "`dropout` must be a number in [0, 1)"),
        ({"attention_dropout": -0.1}, "`attention_dropout`"),
        ({"position_embedding_type": "rotary"}, "unknown `position_embedding_type`"),
        ({"activation_function": "nope"}, "unknown `activation_function`"),
        ({"norm_position": "middle"}, "unknown `norm_position`"),
        ({"pad_token_id": 500}, "outside the vocabulary"),
        ({"d_model": "512"}, "expected int, got str"),  # @strict's type check
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(StrictDataclassError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        VaswaniConfig.tiny(**kwargs)


def test_hand_edited_config_is_validated_on_load(tmp_path):
    VaswaniConfig.tiny().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["dropout"] = 1.5
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(StrictDataclassError, match="`dropout` must be a number in"):
        AutoConfig.from_pretrained(tmp_path)


# --- architecture --------------------------------------------------------------------------------------------


def test_post_norm_has_no_final_stack_norm_and_pre_norm_has_one():
    post, pre = tiny_model(), tiny_model(norm_position="pre")
    assert post.model.encoder.layer_norm is None and post.model.decoder.layer_norm is None
    assert pre.model.encoder.layer_norm is not None and pre.model.decoder.layer_norm is not None
    src, mask, tgt = batch()
    with torch.no_grad():
        assert torch.isfinite(pre(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits).all()


def test_three_way_sharing():
    model = tiny_model()
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared and model.model.decoder.embed_tokens.weight is shared
    untied = tiny_model(tie_word_embeddings=False)
    assert untied.lm_head.weight is not untied.model.shared.weight
    assert untied.model.decoder.embed_tokens.weight is not untied.model.shared.weight


def test_initialisation_follows_reference_code():
    model = tiny_model()
    assert model.model.shared.weight[1:].std().item() == pytest.approx(32**-0.5, rel=0.1)
    assert torch.all(model.model.shared.weight[PAD] == 0)
    qkv = model.model.encoder.layers[0].self_attn.qkv_proj.weight
    bound = (6 / (32 + 32)) ** 0.5  # Xavier per projection block, not for the fused 3x matrix
    assert qkv.abs().max().item() <= bound and qkv.abs().max().item() > 0.9 * bound


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_cache_matches_full_forward(attn, device):
    """Incremental decoding with EncoderDecoderCache gives the logits of one full forward pass."""
    model = tiny_model().to(device)
    model.set_attn_implementation(attn)
    src, mask, tgt = (x.to(device) for x in batch())
    with torch.no_grad():
        full = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        past, steps = None, []
        for t in range(tgt.shape[1]):
            out = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt[:, t : t + 1],
                        use_cache=True, **{CACHE_FIELD: past})  # fmt: skip
            past = getattr(out, CACHE_FIELD)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # cross-attention keys/values were projected once, not once per step
    assert all(past.is_updated[i] for i in range(model.config.decoder_layers))


def test_eager_and_sdpa_agree(device):
    model = tiny_model().to(device)
    src, mask, tgt = (x.to(device) for x in batch())
    with torch.no_grad():
        model.set_attn_implementation("eager")
        eager = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        model.set_attn_implementation("sdpa")
        sdpa = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(eager, sdpa, atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_outputs():
    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 8, 2]])
    tgt = torch.tensor([[1, 9, 10, 11]])
    padded = torch.cat([src, torch.full((1, 4), PAD)], dim=1)
    with torch.no_grad():
        alone = model(input_ids=src, decoder_input_ids=tgt).logits
        with_pad = model(input_ids=padded, attention_mask=padded.ne(PAD).long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(with_pad, alone, atol=1e-5, rtol=1e-5)


def test_future_target_tokens_never_change_earlier_logits():
    model = tiny_model()
    src, mask, tgt = batch()
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 7) % 95 + 4
    with torch.no_grad():
        a = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        b = model(input_ids=src, attention_mask=mask, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_learned_positions_refuse_too_long_input_and_sinusoids_extend():
    src = torch.randint(4, 99, (1, 80))  # tiny preset: max_position_embeddings=64
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        tiny_model(position_embedding_type="learned")(input_ids=src, decoder_input_ids=src[:, :3])
    with torch.no_grad():
        assert tiny_model()(input_ids=src, decoder_input_ids=src[:, :3]).logits.shape == (1, 3, 99)


def test_gradient_checkpointing_gives_same_gradients():
    src, mask, tgt = batch()
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(dropout=0.0).train()
        if checkpointing:  # the name since Transformers 5.23; gradient_checkpointing_enable before
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        model(input_ids=src, attention_mask=mask, labels=tgt).loss.backward()
        grads.append(model.model.encoder.layers[0].self_attn.qkv_proj.weight.grad)
    torch.testing.assert_close(grads[0], grads[1])


# --- loss ----------------------------------------------------------------------------------------------------


def test_loss_is_cross_entropy_ignoring_minus_100_and_does_not_shift_twice():
    model = tiny_model()
    src, mask, tgt = batch()
    labels = tgt.clone()
    labels[2, 3:] = -100
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=mask, labels=labels)
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
        assert decoder_input_ids[0, 0] == model.config.decoder_start_token_id
        assert torch.equal(decoder_input_ids[:, 1:], labels[:, :-1].masked_fill(labels[:, :-1] == -100, PAD))
        logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=decoder_input_ids).logits
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 99), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(out.logits, logits)


def test_label_smoothing_is_a_forward_argument_not_a_model_property():
    model = tiny_model(label_smoothing=0.1)  # an older config's key: kept as an attribute, ignored
    src, mask, tgt = batch()
    with torch.no_grad():
        plain = model(input_ids=src, attention_mask=mask, labels=tgt)
        out = model(input_ids=src, attention_mask=mask, labels=tgt, label_smoothing=0.1)
    ce = torch.nn.functional.cross_entropy(plain.logits.reshape(-1, 99), tgt.reshape(-1))
    torch.testing.assert_close(plain.loss, ce)
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 99), tgt.reshape(-1), label_smoothing=0.1)
    torch.testing.assert_close(out.loss, expected)


def test_loss_under_gradient_accumulation_matches_one_big_batch(device):
    """Two half batches with Trainer's num_items_in_batch add up to the full batch's loss, even with padding."""
    model = tiny_model(dropout=0.0).to(device)
    src, mask, tgt = (x.to(device) for x in batch(rows=4))
    labels = tgt.clone()
    labels[0, 2:] = -100  # halves with different token counts: averaging per half would be wrong
    with torch.no_grad():
        full = model(input_ids=src, attention_mask=mask, labels=labels, label_smoothing=0.1).loss
        n = (labels != -100).sum()
        halves = sum(
            model(
                input_ids=src[s], attention_mask=mask[s], labels=labels[s], num_items_in_batch=n, label_smoothing=0.1
            ).loss
            for s in (slice(0, 2), slice(2, 4))
        )
    torch.testing.assert_close(halves, full, atol=1e-5, rtol=1e-5)


# --- saving and loading --------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    model = tiny_model()
    model.generation_config.num_beams = 5
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert not any("embed_positions" in k for k in keys), "the sinusoid table must not be saved"
    assert "lm_head.weight" not in keys and "model.shared.weight" in keys
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    assert {"modeling_vaswani.py", "configuration_vaswani.py"} <= {p.name for p in tmp_path.iterdir()}

    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, VaswaniForConditionalGeneration)
    assert loaded.lm_head.weight is loaded.model.shared.weight
    assert loaded.generation_config.num_beams == 5 and loaded.generation_config.length_penalty_type == "gnmt"
    torch.testing.assert_close(loaded.model.encoder.embed_positions.table, model.model.encoder.embed_positions.table)
    src, mask, tgt = batch()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits,
            model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits,
        )
    assert isinstance(AutoModel.from_pretrained(tmp_path), VaswaniModel)


def test_remote_code_loading_without_the_package(tmp_path):
    """A saved model ships the configuration, the model and the paper's search, nothing of the package's speed
    paths, and decodes as the package does (its fast products on) where the package is absent."""
    model = tiny_model()
    model.save_pretrained(tmp_path)
    shipped = {path.name for path in tmp_path.glob("*.py")}
    assert shipped == {"configuration_vaswani.py", "modeling_vaswani.py", "generation_vaswani.py", "search_vaswani.py",
                       "lexical_vaswani.py", "beam_history_vaswani.py", "decoding_state_vaswani.py",
                       "alignment_vaswani.py", "validation_vaswani.py", "remote_code_vaswani.py",
                       "pipeline_vaswani.py"}, shipped  # fmt: skip
    src, mask, tgt = batch()
    force_words = [[[11, 12]], [[30]], [[40], [41, 42]]]
    remote = remote_code_outputs(tmp_path, {"input_ids": src, "attention_mask": mask, "decoder_input_ids": tgt,
                                            "force_words": force_words})  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(
            remote["logits"], model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        )
    assert torch.equal(remote["beam"], model.generate(input_ids=src, attention_mask=mask))
    assert torch.equal(remote["greedy"], model.generate(input_ids=src, attention_mask=mask, num_beams=1))
    for name, extra in (("nbest", {}), ("constrained", {"force_words": force_words})):
        out = model.generate(input_ids=src, attention_mask=mask, num_return_sequences=2, output_sequence_scores=True,
                             **extra)  # fmt: skip
        assert torch.equal(remote[name], out.sequences), name
        torch.testing.assert_close(remote[name + "_scores"], out.sequences_scores)


def test_modeling_files_import_only_torch_transformers_and_each_other():
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "vaswani_hf" / "model"

    # every file named *_vaswani.py ships as remote code (`hub.PUSHED_FILES`, the files `save_pretrained` copies)
    remote_code = tuple(path.stem for path in package.glob("*_vaswani.py"))
    assert {"modeling_vaswani", "generation_vaswani", "search_vaswani", "lexical_vaswani"} <= set(remote_code)
    # the speed paths are the installed package's (model/speed/), never remote code
    assert not any("fast_products" in name or "graph_search" in name for name in remote_code)
    for name in (f"{module}.py" for module in remote_code):
        tree = ast.parse((package / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.module in remote_code, f"{name}: imports {node.module}"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                roots = (
                    [a.name.split(".")[0] for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module.split(".")[0]]
                )
                # huggingface_hub: Transformers requires it, and its own configs take `@strict` from it too
                allowed = {"torch", "transformers", "huggingface_hub"} | sys.stdlib_module_names
                for root in roots:
                    assert root in allowed, f"{name}: {root}"
