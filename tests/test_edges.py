"""Every architecture option of VaswaniConfig end to end, and the edges a Transformers user reaches: untied
embeddings, the output bias, learned positions under the source + 50 limit, resizing, the translation pipeline
(n-best, truncation, model objects, remote-code re-saves), label smoothing as a training setting, LoRA."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, pipeline

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniTranslationPipeline

from .helpers import remote_code_outputs

OPTIONS = {
    "paper": {},
    "untied": {"tie_word_embeddings": False},
    "output_bias": {"output_bias": True},
    "split_sinusoid": {"position_embedding_type": "sinusoidal_split"},
    "fairseq_sinusoid": {"position_embedding_type": "sinusoidal_fairseq"},
    "learned": {"position_embedding_type": "learned"},
    "pre_norm": {"norm_position": "pre"},
    "d_k_16": {"d_kv": 16},
    "dropouts": {"dropout": 0.2, "attention_dropout": 0.1, "activation_dropout": 0.1},
    "everything_else": {"tie_word_embeddings": False, "output_bias": True, "position_embedding_type": "learned",
                        "norm_position": "pre", "d_kv": 4, "init_std": 0.05},
}  # fmt: skip


def word_tokenizer():
    """A word-level tokenizer over the tiny preset's 99 ids: `<pad> <s> </s> <unk> w4 ... w98`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, 99)])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=64)  # fmt: skip


def tiny(**overrides) -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(VaswaniConfig.tiny(**overrides))


def batch(rows=3, length=7, high=99, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, high, (rows, length), generator=generator)
    ids[:, -1] = 2
    mask = torch.ones_like(ids)
    ids[0, -2:], mask[0, -2:] = 0, 0  # a padded row
    return ids, mask


def logits(model, ids, mask):
    with torch.no_grad():
        return model.eval()(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :5]).logits


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_trains_saves_loads_generates_translates_and_resizes(name, tmp_path):
    model = tiny(**OPTIONS[name])
    ids, mask = batch()

    # a training step changes every trainable tensor of the model that the loss reaches
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = model(input_ids=ids, attention_mask=mask, labels=ids[:, :5], label_smoothing=0.1).loss
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, unchanged
    model.zero_grad()

    # save and load, with the package and as remote code without it
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    torch.testing.assert_close(logits(loaded, ids, mask), logits(model, ids, mask))
    remote = remote_code_outputs(tmp_path, {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, :5]})
    torch.testing.assert_close(remote["logits"], logits(model, ids, mask))
    assert torch.equal(remote["beam"], model.generate(input_ids=ids, attention_mask=mask))
    assert torch.equal(remote["greedy"], model.generate(input_ids=ids, attention_mask=mask, num_beams=1))

    # the input embedding is the one the encoder reads
    with torch.no_grad():
        embedded = model.get_input_embeddings()(ids)
        torch.testing.assert_close(
            model(inputs_embeds=embedded, attention_mask=mask, decoder_input_ids=ids[:, :5]).logits,
            logits(model, ids, mask),
        )

    # greedy and beam search, the paper's source + 50 limit included
    long_source = torch.randint(4, 99, (2, 30))
    for num_beams in (1, 4):
        out = model.generate(input_ids=long_source, num_beams=num_beams)
        assert out.shape[0] == 2 and out.shape[1] <= 1 + 30 + 50

    # the translation pipeline, on what generate() gives
    tokenizer = word_tokenizer()
    sentences = ["w5 w6 w7", "w40 w41 w42 w43 w44"]
    translated = pipeline("translation", model=model, tokenizer=tokenizer)(sentences)
    encoded = [tokenizer(text, return_tensors="pt").to(model.device) for text in sentences]  # the pipeline may move it
    expected = [tokenizer.decode(model.generate(**source)[0], skip_special_tokens=True) for source in encoded]
    assert [r["translation_text"] for r in translated] == [text.strip() for text in expected]
    model.to("cpu")  # where there is a GPU the pipeline moved the model there; the batches below are on CPU

    # resize up: new rows everywhere a token id is looked up or predicted; then down again
    for size in (110, 90):
        model.resize_token_embeddings(size)
        high_ids, high_mask = batch(high=size)
        out = model(input_ids=high_ids, attention_mask=high_mask, labels=high_ids[:, :5])
        assert out.logits.shape[-1] == size and torch.isfinite(out.loss)
        assert model.model.get_decoder_input_embeddings().num_embeddings == size
        model.save_pretrained(tmp_path / f"resized-{size}")
        reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / f"resized-{size}")
        torch.testing.assert_close(logits(reloaded, high_ids, high_mask), logits(model, high_ids, high_mask))


def test_untied_embeddings_are_three_matrices_and_resize_together():
    model = tiny(tie_word_embeddings=False)
    inner = model.model
    assert inner.encoder.embed_tokens is inner.shared  # the source embedding is `shared`
    assert inner.decoder.embed_tokens.weight is not inner.shared.weight
    assert model.lm_head.weight is not inner.shared.weight
    model.resize_token_embeddings(110)
    sizes = {inner.shared.num_embeddings, inner.decoder.embed_tokens.num_embeddings, model.lm_head.out_features}
    assert sizes == {110} and model.config.vocab_size == 110


def test_output_bias_resizes_and_keeps_its_values():
    model = tiny(output_bias=True)
    with torch.no_grad():
        model.final_logits_bias.normal_()
    kept = model.final_logits_bias.detach().clone()
    model.resize_token_embeddings(110)
    assert model.final_logits_bias.shape == (110,)
    assert torch.equal(model.final_logits_bias[:99], kept) and not model.final_logits_bias[99:].any()
    model.resize_token_embeddings(50)
    assert torch.equal(model.final_logits_bias, kept[:50])


def test_learned_positions_cut_the_source_plus_50_limit_at_the_table():
    model = tiny(position_embedding_type="learned").eval()  # 64 positions
    source = torch.randint(4, 99, (2, 30))
    for kwargs in ({}, {"num_beams": 1}, {"do_sample": True, "num_beams": 1}):  # ours, and the hand-over
        assert model.generate(source, **kwargs).shape[1] <= 1 + 64
    with pytest.raises(ValueError, match="max_position_embeddings=64: ask for at most max_new_tokens=64"):
        model.generate(source, max_new_tokens=70)


# --- the translation pipeline --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def translator(trained):
    from vaswani_hf.translation.inference import load_for_inference

    model, tokenizer = load_for_inference(trained[0])
    return model, tokenizer


def test_pipeline_from_a_model_object_by_task_name(translator):
    model, tokenizer = translator
    for kwargs in ({}, {"pipeline_class": VaswaniTranslationPipeline}):
        pipe = pipeline("translation", model=model, tokenizer=tokenizer, **kwargs)
        assert isinstance(pipe, VaswaniTranslationPipeline)
        assert [r["translation_text"] for r in pipe(["three", "five"])] == [
            pipe("three")[0]["translation_text"],
            pipe("five")[0]["translation_text"],
        ]


@pytest.mark.parametrize("saved_by", ["vaswani train", "save_pretrained"])
def test_pipeline_from_a_folder_needs_no_remote_code_with_the_package_imported(saved_by, trained, translator, tmp_path):
    # the saved config declares the pipeline for users without the package (`custom_pipelines`), which made
    # Transformers ask for trust_remote_code even where `import vaswani_hf` serves the task itself
    folder = trained[0]
    if saved_by == "save_pretrained":
        folder = tmp_path / "by-hand"
        translator[0].save_pretrained(folder)
        translator[1].save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["custom_pipelines"]["translation"]  # for remote users
    pipe = pipeline("translation", model=str(folder))
    assert isinstance(pipe, VaswaniTranslationPipeline)
    inputs = pipe.tokenizer(["three"], return_tensors="pt").to(pipe.model.device)  # a GPU, where there is one
    expected = translator[1].batch_decode(pipe.model.generate(**inputs), skip_special_tokens=True)
    assert pipe("three") == [{"translation_text": expected[0].strip()}]
    resaved = tmp_path / f"resaved-{saved_by.split()[0]}"
    pipe.model.save_pretrained(resaved)  # loaded without the declaration, saved with it again
    assert json.loads((resaved / "config.json").read_text())["custom_pipelines"]["translation"]


def test_pipeline_returns_every_candidate_of_every_sentence(translator):
    pipe = pipeline("translation", model=translator[0], tokenizer=translator[1])
    result = pipe(["three", "twenty-one , five"], num_beams=4, num_return_sequences=2)
    assert len(result) == 2 and all(len(candidates) == 2 for candidates in result)
    assert result[1] == pipe("twenty-one , five", num_beams=4, num_return_sequences=2)


def test_pipeline_truncates_when_asked(translator):
    model, tokenizer = translator
    pipe = pipeline("translation", model=model, tokenizer=tokenizer)
    long = " ".join(["seven hundred twenty-one"] * 40)
    limit = tokenizer.model_max_length
    tokenizer.model_max_length = 12
    try:
        assert pipe.preprocess(long, truncation=True)["input_ids"].shape[1] == 12
        truncated = tokenizer.decode(tokenizer(long, truncation=True)["input_ids"], skip_special_tokens=True)
        assert pipe(long, truncation=True) == pipe(truncated)
    finally:
        tokenizer.model_max_length = limit


RESAVE = textwrap.dedent(
    """
    import json, sys
    sys.modules["vaswani_hf"] = None
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
    source, target = sys.argv[1], sys.argv[2]
    model = AutoModelForSeq2SeqLM.from_pretrained(source, trust_remote_code=True)
    AutoTokenizer.from_pretrained(source, trust_remote_code=True).save_pretrained(target)
    model.save_pretrained(target)  # the fine-tune-and-push flow, where the package is absent
    pipe = pipeline("translation", model=target, trust_remote_code=True)
    print(json.dumps([r["translation_text"] for r in pipe(["three", "five"])]))
    """
)


def test_a_remote_code_model_saved_again_keeps_its_pipeline(trained, translator, tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    target = tmp_path / "resaved"
    result = subprocess.run([sys.executable, "-c", RESAVE, str(trained[0]), str(target)], capture_output=True,
                            text=True, env=env, stdin=subprocess.DEVNULL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (target / "pipeline_vaswani.py").is_file()
    pipe = pipeline("translation", model=translator[0], tokenizer=translator[1])
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [
        r["translation_text"] for r in pipe(["three", "five"])
    ]


# --- label smoothing is a training setting -------------------------------------------------------------------


def test_a_trained_checkpoint_does_not_smooth_later_losses(trained):
    out = trained[0]
    assert "label_smoothing" not in json.loads((out / "config.json").read_text())
    assert json.loads((out / "training_facts.json").read_text())["training"]["label_smoothing"] == 0.1


def test_trainer_smooths_training_steps_only(tmp_path):
    from vaswani_hf.training.recipe import VaswaniTrainingArguments
    from vaswani_hf.training.trainer import VaswaniTrainer

    model = tiny(dropout=0.0)
    # use_cpu: the inputs below stay on the CPU (where CUDA is visible, Trainer would move the model to it)
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), label_smoothing_factor=0.1, report_to=[], use_cpu=True)
    trainer = VaswaniTrainer(model=model, args=args)
    ids, mask = batch()
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": ids[:, :5]}
    with torch.no_grad():
        plain = model(**inputs).loss
        smoothed = model(**inputs, label_smoothing=0.1).loss
        model.train()
        assert torch.allclose(trainer.compute_loss(model, inputs), smoothed)
        model.eval()
        assert torch.allclose(trainer.compute_loss(model, inputs), plain)
    assert not torch.allclose(plain, smoothed)


# --- PEFT ----------------------------------------------------------------------------------------------------


def peft_misfit() -> str | None:
    """Why the installed peft cannot wrap a seq2seq model under the installed Transformers, or None. (peft 0.17 and
    some later releases read `GenerationMixin._prepare_encoder_decoder_kwargs_for_generation`, which Transformers
    5.24 no longer has: every seq2seq model fails there, ours included.)"""
    import inspect

    import peft
    import transformers

    helper = "_prepare_encoder_decoder_kwargs_for_generation"
    if helper in inspect.getsource(peft.peft_model) and not hasattr(transformers.GenerationMixin, helper):
        return f"peft {peft.__version__} calls {helper}, which Transformers {transformers.__version__} lacks"
    return None


@pytest.mark.parametrize("targets", ["all-linear", ["qkv_proj", "q_proj", "kv_proj", "out_proj", "fc1", "fc2"]])
def test_lora_trains_merges_saves_and_reloads(targets, tmp_path):
    import peft

    if reason := peft_misfit():
        pytest.skip(reason)

    model = tiny(dropout=0.0)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                      task_type="SEQ_2_SEQ_LM", init_lora_weights=False))  # fmt: skip
    adapted = {name.rsplit(".", 1)[0] for name, _ in lora.named_modules() if name.endswith("lora_A")}
    # per encoder layer qkv_proj, out_proj, fc1, fc2; per decoder layer those, and cross-attention's q_proj, kv_proj,
    # out_proj; never the output projection (tied to the embeddings)
    assert len(adapted) == 2 * 4 + 2 * 7, sorted(adapted)
    ids, mask = batch()
    lora.train()
    loss = lora(input_ids=ids, attention_mask=mask, labels=ids[:, :5]).loss
    loss.backward()
    torch.optim.SGD([p for p in lora.parameters() if p.requires_grad], lr=0.1).step()
    lora.eval()
    with torch.no_grad():
        adapted_logits = lora(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :5]).logits
    lora.save_pretrained(tmp_path / "adapter")
    base = tiny(dropout=0.0)
    reloaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    torch.testing.assert_close(logits(reloaded, ids, mask), adapted_logits)
    merged = lora.merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    torch.testing.assert_close(logits(AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "merged"), ids, mask),
                               adapted_logits, atol=1e-5, rtol=1e-5)  # fmt: skip
    assert torch.equal(merged.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5),
                       AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "merged").generate(
                           input_ids=ids, attention_mask=mask, max_new_tokens=5))  # fmt: skip


def test_a_lora_adapters_own_layers_take_the_fast_products_inside_its_sum(monkeypatch):
    # PEFT's LoRA layer is no `nn.Linear`: its base layer, A and B are, and the fast products re-bind them one by one
    # for a search (each the same product), the adapter still adding them; the tokens are the plain products'
    import peft

    from vaswani_hf.model.speed import fast_products

    if reason := peft_misfit():
        pytest.skip(reason)
    model = tiny(dropout=0.0)
    adapter = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["fc1", "out_proj"], task_type="SEQ_2_SEQ_LM",
                              init_lora_weights=False)  # fmt: skip
    lora = peft.get_peft_model(model, adapter).eval()
    names = {id(m): n for n, m in lora.named_modules()}
    rebound: set[str] = set()
    bind = fast_products._bind

    def recorded(linears, forwards):
        rebound.update(names[id(m)] for m, f in zip(linears, forwards, strict=True) if f is not None)
        return bind(linears, forwards)

    monkeypatch.setattr(fast_products, "_bind", recorded)
    # a way that re-binds (the plain product, if measured fastest here, leaves the layers alone)
    monkeypatch.setattr(fast_products, "_fastest_linear_way", lambda *args: fast_products._linear_by_columns)
    ids, mask = batch()
    with torch.no_grad():
        fast = lora.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, cpu_fast_paths=True)
        plain = lora.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, cpu_fast_paths=False)
    assert torch.equal(fast, plain)
    assert any(n.endswith("fc1.base_layer") for n in rebound) and any(n.endswith("fc1.lora_A.default") for n in rebound)
    assert all("forward" not in vars(m) for m in lora.modules() if isinstance(m, torch.nn.Linear))  # given back


def test_the_packages_pipelines_claim_vaswani_models_only():
    """`import vaswani_hf` registers `translation` and `constituency-parsing` for every model; another model's
    translation gets Transformers' own refusal of the removed task, never the Vaswani pipeline (which knows nothing
    of T5's prefixes or NLLB's language tokens)."""
    from transformers import MarianConfig, MarianMTModel

    marian = MarianMTModel(MarianConfig(vocab_size=50, d_model=8, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=1, decoder_attention_heads=1, encoder_ffn_dim=8,
                                        decoder_ffn_dim=8, pad_token_id=0, decoder_start_token_id=0))  # fmt: skip
    tokenizer = word_tokenizer()
    with pytest.raises(KeyError, match="The task translation has been removed from transformers.*MarianMTModel"):
        pipeline("translation", model=marian, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="parses with a Vaswani parse model.*MarianMTModel"):
        pipeline("constituency-parsing", model=marian, tokenizer=tokenizer)
    vaswani = VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=100)).eval()
    assert isinstance(pipeline("translation", model=vaswani, tokenizer=tokenizer), VaswaniTranslationPipeline)
