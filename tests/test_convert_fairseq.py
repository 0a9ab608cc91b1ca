"""`vaswani convert fairseq|fsmt`: the paper's model as fairseq trained it, against references the project did not
write. Transformers' FSMT (its port of fairseq's models) is the reference for the numerics: on random weights of
each shape the converted model's log-probabilities equal FSMT's within 1e-4, padding included, and greedy and beam-4
outputs are the same tokens. The fairseq archives are written here from those weights as fairseq writes them: 2018's
(torch's legacy serialization, an `argparse.Namespace`, `in_proj_weight`, `layer_norms.N`, an object of a fairseq
class that cannot be imported here) and today's (`cfg`, q/k/v projections). sacremoses + subword-nmt are the
reference for the tokenizer, on Multi30k and newstest2014 (../shared/data)."""

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, FSMTConfig, FSMTForConditionalGeneration

from vaswani_hf import MosesBPETokenizer
from vaswani_hf.interop.convert import FairseqArchiveError, convert_fairseq_checkpoint, fsmt_to_vaswani

from .helpers import remote_code_outputs, vaswani

sacremoses = pytest.importorskip("sacremoses")
apply_bpe = pytest.importorskip("subword_nmt.apply_bpe")
learn_bpe = pytest.importorskip("subword_nmt.learn_bpe")

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MULTI30K, NEWSTEST = DATA / "multi30k_en_de", DATA / "wmt14_newstest2014"
SHAPES = {  # (d_model, layers, heads, ffn, decoder ffn): the big model's proportions, and unequal stacks
    "big-like": (32, 2, 4, 128, 128),
    "uneven": (24, 3, 2, 40, 56),
}


def read_lines(path: Path, count: int) -> list[str]:
    if not path.is_file():
        pytest.skip(f"{path} is not here (../shared/data sits beside the checkout)")
    with open(path, encoding="utf-8") as handle:
        return [next(handle).rstrip("\n") for _ in range(count)]


def learn_codes_and_dictionary(folder: Path, aggressive: bool = True, escape: bool = True, version: bool = True):
    """subword-nmt codes learned on Moses-tokenized Multi30k (English and German; Moses `-a` and escaping as asked)
    and fairseq's joined dictionary of the BPE'd text (counts, most frequent first), as `fairseq-preprocess
    --joined-dictionary` writes it. `version=False` writes the codes without their `#version` header: subword-nmt's
    v0.1, which segments (and so builds the dictionary) by v0.1's rules."""
    folder.mkdir(parents=True, exist_ok=True)
    moses = {lang: sacremoses.MosesTokenizer(lang=lang) for lang in ("en", "de")}
    text = [moses[lang].tokenize(line, aggressive_dash_splits=aggressive, escape=escape, return_str=True)
            for lang in ("en", "de") for line in read_lines(MULTI30K / f"train.{lang}", 3000)]  # fmt: skip
    codes = folder / "bpecodes"
    with open(codes, "w", encoding="utf-8") as out:
        learn_bpe.learn_bpe(text, out, num_symbols=400)
    if not version:
        codes.write_text("".join(codes.read_text(encoding="utf-8").splitlines(keepends=True)[1:]), encoding="utf-8")
    with open(codes, encoding="utf-8") as handle:
        segmenter = apply_bpe.BPE(handle)
    counts = {}
    for line in text:
        for piece in segmenter.process_line(line).split():
            counts[piece] = counts.get(piece, 0) + 1
    dictionary = folder / "dict.txt"
    entries = [f"{p} {c}\n" for p, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    padding = -(4 + len(entries)) % 8  # fairseq-preprocess pads to a multiple of 8 (the specials counted)
    dictionary.write_text("".join(entries + [f"madeupword{i:04d} 0\n" for i in range(padding)]))
    return types.SimpleNamespace(codes=codes, dictionary=dictionary, vocab_size=4 + len(counts), segmenter=segmenter)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """Codes and dictionary of Moses `-a` with escaping (fairseq's hub defaults)."""
    return learn_codes_and_dictionary(tmp_path_factory.mktemp("bpe"))


def random_fsmt(shape: str, vocab: int, tied: bool = True, seed: int = 0) -> FSMTForConditionalGeneration:
    d_model, layers, heads, ffn, decoder_ffn = SHAPES[shape]
    config = FSMTConfig(langs=["en", "de"], src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d_model,
                        encoder_layers=layers, decoder_layers=layers - 1 if shape == "uneven" else layers,
                        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                        decoder_ffn_dim=decoder_ffn, max_position_embeddings=128, dropout=0.0)  # fmt: skip
    torch.manual_seed(seed)
    model = FSMTForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" not in name:  # the sinusoids are fixed: they are what the conversion must match
                parameter.normal_(0, 0.3)
    if tied:  # fairseq's --share-all-embeddings: one matrix for source, target and output
        shared = model.model.encoder.embed_tokens.weight
        model.model.decoder.embed_tokens.weight = shared
        model.model.decoder.output_projection.weight = shared
    return model


def padded_batch(vocab: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sources ending in </s> (2), right-padded with <pad> (1) as the tokenizer pads them, and decoder inputs
    starting from </s> as fairseq's decoder does."""
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(4, vocab, (4, 11), generator=generator)
    for row, length in enumerate((11, 7, 3, 9)):
        source[row, length - 1] = 2
        source[row, length:] = 1
    target = torch.randint(4, vocab, (4, 8), generator=generator)
    target[:, 0] = 2
    return source, source.ne(1).long(), target


def log_probs(model, source, mask, target, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=source, attention_mask=mask, decoder_input_ids=target, **kwargs).logits
    return logits.float().log_softmax(-1)


def assert_same_as_fsmt(fsmt, converted, vocab: int) -> None:
    source, mask, target = padded_batch(vocab)
    # FSMT builds its causal mask only without a cache (with one it expects one token a step): use_cache=False
    expected = log_probs(fsmt, source, mask, target, use_cache=False)
    torch.testing.assert_close(log_probs(converted, source, mask, target), expected, atol=1e-4, rtol=0)
    for beams in (1, 4):
        settings = dict(num_beams=beams, max_new_tokens=15, length_penalty=1.0, early_stopping=False)
        theirs = fsmt.generate(input_ids=source, attention_mask=mask, **settings)
        ours = converted.generate(input_ids=source, attention_mask=mask, **settings)
        assert ours.tolist() == theirs.tolist(), f"beam {beams}"


@pytest.mark.parametrize("tied", [True, False], ids=["shared-embeddings", "separate-embeddings"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_converted_fsmt_gives_fsmt_s_log_probabilities_and_outputs(shape, tied):
    fsmt = random_fsmt(shape, vocab=61, tied=tied)
    converted = fsmt_to_vaswani(fsmt)
    assert converted.config.tie_word_embeddings is tied
    assert converted.config.position_embedding_type == "sinusoidal_fairseq"
    assert_same_as_fsmt(fsmt, converted, vocab=61)


def fairseq_state(fsmt) -> dict:
    """FSMT's weights under fairseq's own names (FSMT stores them under `model.`, positions aside)."""
    state = {k.removeprefix("model."): v.clone() for k, v in fsmt.state_dict().items() if "embed_positions" not in k}
    state["encoder.embed_positions._float_tensor"] = torch.FloatTensor(1)
    state["decoder.embed_positions._float_tensor"] = torch.FloatTensor(1)
    state["encoder.version"] = state["decoder.version"] = torch.Tensor([3])
    return state


def as_2018(state: dict) -> dict:
    """Today's names back to 2018's: q, k, v stacked in `in_proj_*`, the layer norms numbered."""
    old = {}
    norms = {"self_attn_layer_norm": 0, "encoder_attn_layer_norm": 1, "final_layer_norm": 2}
    for name, tensor in state.items():
        if ".k_proj." in name or ".v_proj." in name:
            continue
        if ".q_proj." in name:
            kind = name.rsplit(".", 1)[1]
            stacked = torch.cat([state[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")])
            old[name.replace(f"q_proj.{kind}", f"in_proj_{kind}")] = stacked
            continue
        for norm, index in norms.items():
            if f".{norm}." in name:
                index = 1 if name.startswith("encoder") and norm == "final_layer_norm" else index
                name = name.replace(norm, f"layer_norms.{index}")
        old[name] = tensor
    return old


def architecture(fsmt, **changes) -> dict:
    config = fsmt.config
    args = dict(arch="transformer_vaswani_wmt_en_de_big", task="translation", source_lang="en", target_lang="de",
                encoder_embed_dim=config.d_model, decoder_embed_dim=config.d_model,
                encoder_ffn_embed_dim=config.encoder_ffn_dim, decoder_ffn_embed_dim=config.decoder_ffn_dim,
                encoder_layers=config.encoder_layers, decoder_layers=config.decoder_layers,
                encoder_attention_heads=config.encoder_attention_heads,
                decoder_attention_heads=config.decoder_attention_heads, encoder_normalize_before=False,
                decoder_normalize_before=False, encoder_learned_pos=False, decoder_learned_pos=False,
                share_all_embeddings=True, share_decoder_input_output_embed=True, dropout=0.3, attention_dropout=0.1,
                relu_dropout=0.0, max_source_positions=1024, max_target_positions=1024, adaptive_softmax_cutoff=None,
                no_token_positional_embeddings=False)  # fmt: skip
    return {**args, **changes}


class StopwatchMeter:
    """Stands for fairseq's meters, which a training checkpoint's `extra_state` holds: importing or running this
    class while reading a checkpoint would be executing code the file names."""

    def __setstate__(self, state):
        raise AssertionError("a class named by the checkpoint was run")


def write_archive(folder: Path, fsmt, bpe, form: str, drop: tuple[str, ...] = (), segmenter: str = "subword_nmt",
                  **changes) -> Path:  # fmt: skip
    """An extracted fairseq archive: model.pt as fairseq of 2018 (form '2018') or today ('current') saves it, the
    joined dictionary as dict.en.txt and dict.de.txt, and the BPE codes; `segmenter` is the checkpoint's `bpe`."""
    folder.mkdir(parents=True, exist_ok=True)
    state, args = fairseq_state(fsmt), architecture(fsmt, **changes)
    package, module = types.ModuleType("fairseq"), types.ModuleType("fairseq.meters")  # importable while saving,
    package.meters, module.StopwatchMeter = module, StopwatchMeter  # gone when reading
    StopwatchMeter.__module__ = "fairseq.meters"
    sys.modules.update({"fairseq": package, "fairseq.meters": module})
    try:
        extra = {"train_meters": {"wall": StopwatchMeter()}, "epoch": 3}
        if form == "2018":
            args = {**args, "bpe": segmenter} if segmenter != "subword_nmt" else args
            checkpoint = {"args": argparse.Namespace(**args), "model": as_2018(state), "extra_state": extra,
                          "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                                 "optimizer_name": "FairseqAdam", "lr_scheduler_state": {"best": 3.9},
                                                 "num_updates": 30000}], "last_optimizer_state": {}}  # fmt: skip
            torch.save(checkpoint, folder / "model.pt", _use_new_zipfile_serialization=False)
        else:
            model_cfg = {"_name": args.pop("arch"), **{k: v for k, v in args.items() if k not in
                                                       ("task", "source_lang", "target_lang")}}  # fmt: skip
            cfg = {"_name": None, "common": {"fp16": True}, "model": model_cfg,
                   "task": {"_name": "translation", "source_lang": "en", "target_lang": "de"},
                   "tokenizer": {"_name": "moses", "moses_no_dash_splits": True, "moses_no_escape": False},
                   "bpe": {"_name": segmenter, "bpe_codes": "bpecodes", "bpe_separator": "@@"}}  # fmt: skip
            torch.save({"args": None, "cfg": cfg, "model": state, "extra_state": extra}, folder / "model.pt")
    finally:
        del sys.modules["fairseq.meters"], sys.modules["fairseq"]
        StopwatchMeter.__module__ = __name__
    for lang in ("en", "de"):
        if f"dict.{lang}.txt" not in drop:
            (folder / f"dict.{lang}.txt").write_text(bpe.dictionary.read_text())
    if "bpecodes" not in drop:
        (folder / "bpecodes").write_bytes(bpe.codes.read_bytes())
    return folder


def padded_vocab(bpe) -> int:
    return (bpe.vocab_size + 7) // 8 * 8  # fairseq pads its dictionary to a multiple of 8 with madeupwords


@pytest.fixture(scope="module")
def archives(bpe, tmp_path_factory):
    """Both formats written from one random model, and each converted."""
    root = tmp_path_factory.mktemp("archives")
    fsmt = random_fsmt("big-like", vocab=padded_vocab(bpe))
    converted = {}
    for form in ("2018", "current"):
        archive = write_archive(root / form, fsmt, bpe, form)
        converted[form] = convert_fairseq_checkpoint(archive, root / f"{form}-vaswani")
    return types.SimpleNamespace(fsmt=fsmt, root=root, converted=converted)


def test_a_half_precision_checkpoint_converts_to_float32(bpe, tmp_path):
    fsmt = random_fsmt("big-like", vocab=padded_vocab(bpe))
    archive = write_archive(tmp_path / "fp16", fsmt.half(), bpe, "current")
    model = AutoModelForSeq2SeqLM.from_pretrained(convert_fairseq_checkpoint(archive, tmp_path / "out"))
    assert model.dtype == torch.float32
    torch.testing.assert_close(model.model.shared.weight, fsmt.model.encoder.embed_tokens.weight.float())


def test_both_fairseq_formats_convert_to_fsmt_s_model(archives, bpe):
    models = {form: AutoModelForSeq2SeqLM.from_pretrained(path).eval() for form, path in archives.converted.items()}
    first, second = (m.state_dict() for m in models.values())
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert_same_as_fsmt(archives.fsmt, models["2018"], vocab=padded_vocab(bpe))
    assert models["2018"].config.tie_word_embeddings and models["2018"].config.dropout == 0.3


def test_the_decoding_settings_are_fairseq_s_or_the_paper_s(archives, bpe, tmp_path):
    fairseq = AutoModelForSeq2SeqLM.from_pretrained(archives.converted["current"]).generation_config
    assert (fairseq.num_beams, fairseq.length_penalty, fairseq.length_penalty_type) == (5, 1.0, "hf")
    assert fairseq.suppress_tokens == [1] and fairseq.forced_eos_token_id == 2
    vaswani("convert", "fairseq", str(archives.root / "2018"), str(tmp_path / "paper"), "--paper-decoding")
    paper = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "paper").generation_config
    assert (paper.num_beams, paper.length_penalty, paper.length_penalty_type, paper.max_length_offset) == (
        4, 0.6, "gnmt", 50)  # fmt: skip

    # and one flag away when decoding: --decoding paper on fairseq's settings is the paper-decoding model's default
    lines = "\n".join(read_lines(MULTI30K / "test2016.en", 4)) + "\n"
    outputs = {}
    for name, folder, flags in (("paper", tmp_path / "paper", []),
                                ("flag", archives.converted["2018"], ["--decoding", "paper"]),
                                ("fairseq", archives.converted["2018"], []),
                                ("fairseq-flag", tmp_path / "paper", ["--decoding", "fairseq"])):  # fmt: skip
        result = vaswani("translate", str(folder), "--precision", "fp32", *flags, stdin=lines)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs[name] = result.stdout
    assert outputs["paper"] == outputs["flag"] and outputs["fairseq"] == outputs["fairseq-flag"]


def test_the_tokenizer_loads_with_autotokenizer_and_keeps_the_checkpoint_s_moses_options(archives):
    new = AutoTokenizer.from_pretrained(archives.converted["current"])  # cfg: moses_no_dash_splits=True
    old = AutoTokenizer.from_pretrained(archives.converted["2018"])  # no Moses options: fairseq's defaults
    assert isinstance(new, MosesBPETokenizer) and isinstance(old, MosesBPETokenizer)
    assert (new.aggressive_dash_splits, old.aggressive_dash_splits, new.escape) == (False, True, True)
    assert "@-@" not in new.tokenize("self-evident") and "@-@" in old.tokenize("self-evident")
    ids = new("A man in a blue shirt .")["input_ids"]
    assert ids[-1] == 2 and 0 not in ids  # </s> at the end, no <s>, as fairseq's sources
    assert (new.pad_token_id, new.bos_token_id, new.eos_token_id, new.unk_token_id) == (1, 0, 2, 3)


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalized"])
@pytest.mark.parametrize("aggressive", [True, False], ids=["dash-splits", "no-dash-splits"])
def test_pieces_equal_sacremoses_and_subword_nmt_on_real_text(bpe, tmp_path, aggressive, normalize):
    vocab = tmp_path / "vocab.json"
    symbols = ["<s>", "<pad>", "</s>", "<unk>"] + [line.split()[0] for line in bpe.dictionary.read_text().splitlines()]
    vocab.write_text(json.dumps({s: i for i, s in enumerate(symbols)}))
    tokenizer = MosesBPETokenizer(str(vocab), str(bpe.codes), "en", "de", aggressive_dash_splits=aggressive,
                                  normalize_punctuation=normalize)  # fmt: skip
    with open(bpe.codes, encoding="utf-8") as handle:
        segmenter = apply_bpe.BPE(handle)
    files = {"en": [MULTI30K / "test2016.en", NEWSTEST / "newstest2014.en-de.en"],
             "de": [MULTI30K / "test2016.de", NEWSTEST / "newstest2014.en-de.de"]}  # fmt: skip
    checked = 0
    for lang, paths in files.items():
        moses = sacremoses.MosesTokenizer(lang=lang)
        normalizer = sacremoses.MosesPunctNormalizer(lang=lang)
        detokenizer = sacremoses.MosesDetokenizer(lang="de")
        for path in paths:
            for line in read_lines(path, 400):
                text = normalizer.normalize(line) if normalize else line
                words = moses.tokenize(text, aggressive_dash_splits=aggressive, escape=True)
                expected = segmenter.segment_tokens(words)
                pieces = tokenizer(text_target=line) if lang == "de" else tokenizer(line)
                got = tokenizer.convert_ids_to_tokens(pieces["input_ids"])
                assert got[-1] == "</s>"
                known = [p if p in tokenizer.encoder else "<unk>" for p in expected]
                assert got[:-1] == known, (path.name, line)
                if lang == "de" and "<unk>" not in known:
                    assert tokenizer.decode(pieces["input_ids"], skip_special_tokens=True) == \
                        detokenizer.detokenize(words, unescape=True)  # fmt: skip
                checked += 1
    assert checked == 1600


def test_the_target_side_is_tokenized_in_the_target_language(bpe, tmp_path):
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}))
    tokenizer = MosesBPETokenizer(str(vocab), str(bpe.codes), "en", "fr")
    english, french = sacremoses.MosesTokenizer(lang="en"), sacremoses.MosesTokenizer(lang="fr")
    text = "l'homme d'affaires"
    assert english.tokenize(text) != french.tokenize(text)  # the case this test is about
    with open(bpe.codes, encoding="utf-8") as handle:
        segmenter = apply_bpe.BPE(handle)
    encoded = tokenizer(text, text_target=text)
    for ids, moses in ((encoded["input_ids"], english), (encoded["labels"], french)):
        assert tokenizer.convert_ids_to_tokens(ids)[:-1] == ["<unk>"] * len(segmenter.segment_tokens(moses.tokenize(
            text, escape=True)))  # fmt: skip
    assert tokenizer.tokenize(text) == segmenter.segment_tokens(english.tokenize(text, escape=True))
    assert tokenizer.lang == "en"  # back to the source side after the labels


def test_a_converted_model_reloads_as_remote_code_fine_tunes_exports_and_serves(archives, bpe, tmp_path):
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    path = archives.converted["2018"]
    model = AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)

    # remote code, without the package
    source, mask, target = padded_batch(padded_vocab(bpe))
    remote = remote_code_outputs(path, {"input_ids": source, "attention_mask": mask, "decoder_input_ids": target})
    with torch.no_grad():
        expected = model(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
    torch.testing.assert_close(remote["logits"], expected)
    assert torch.equal(remote["beam"], model.generate(input_ids=source, attention_mask=mask))

    # a few steps of Seq2SeqTrainer on real pairs, with the converted tokenizer; the three embeddings stay one
    pairs = list(zip(read_lines(MULTI30K / "train.en", 16), read_lines(MULTI30K / "train.de", 16), strict=True))
    rows = [tokenizer(en, text_target=de) for en, de in pairs]
    before = model.model.shared.weight.detach().clone()
    arguments = Seq2SeqTrainingArguments(str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=4,
                                         learning_rate=1e-3, report_to=[], save_strategy="no")  # fmt: skip
    trainer = Seq2SeqTrainer(model=model.train(), args=arguments, train_dataset=rows,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))  # fmt: skip
    assert trainer.train().training_loss > 0
    assert not torch.equal(model.model.shared.weight, before)
    assert model.lm_head.weight is model.model.shared.weight or torch.equal(model.lm_head.weight,
                                                                           model.model.shared.weight)  # fmt: skip
    assert model.config.pad_token_id == 1 and model.config.decoder_start_token_id == 2

    # CTranslate2: the same greedy tokens as the model
    from benchmarks.ctranslate2_runner import CTranslate2Runner

    model.eval()
    runner = CTranslate2Runner.from_model(model, tmp_path / "ct2", threads=1)
    ours = model.generate(
        input_ids=source[:1, :-1],
        num_beams=1,
        min_new_tokens=8,
        max_new_tokens=8,
        suppress_tokens=None,
        forced_eos_token_id=None,
    )  # CTranslate2 forces no </s> at the end
    assert torch.equal(ours[:, 1:], runner.generate_ids(source[:1, :-1], 1, 8))
    result = vaswani("export", str(path), str(tmp_path / "exported"), "--to", "ctranslate2")
    assert result.returncode == 0, result.stderr[-2000:]
    vocabulary = (tmp_path / "exported" / "shared_vocabulary.json").read_text()
    assert json.loads(vocabulary)[:4] == ["<s>", "<pad>", "</s>", "<unk>"]


def test_a_converted_model_serves(archives):
    from .test_serve import Server

    lines = read_lines(MULTI30K / "test2016.en", 3)
    expected = vaswani("translate", str(archives.converted["2018"]), "--precision", "fp32",
                       stdin="\n".join(lines) + "\n")  # fmt: skip
    assert expected.returncode == 0, expected.stderr[-2000:]
    running = Server(archives.converted["2018"])
    try:
        answer = running.post("/translate", json={"q": lines, "source": "en", "target": "de"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["translatedText"] == expected.stdout.split("\n")[:3]
    finally:
        assert running.stop()[0] == 0


def broken(archive: Path, fsmt, bpe, how: str) -> Path:
    if how == "missing dictionary":
        return write_archive(archive, fsmt, bpe, "2018", drop=("dict.de.txt",))
    if how == "pre-norm encoder":
        return write_archive(archive, fsmt, bpe, "current", encoder_normalize_before=True)
    if how == "learned positions":
        return write_archive(archive, fsmt, bpe, "2018", decoder_learned_pos=True)
    write_archive(archive, fsmt, bpe, "current")
    if how == "truncated checkpoint":
        data = (archive / "model.pt").read_bytes()
        (archive / "model.pt").write_bytes(data[: len(data) // 2])
    elif how == "codes of another model":
        merges = [line for line in bpe.codes.read_text().splitlines() if not line.startswith("#")]
        (archive / "bpecodes").write_text("".join(f"{b} {a}\n" for a, b in (m.split() for m in merges)))
    elif how == "no codes":
        (archive / "bpecodes").unlink()
    return archive


@pytest.mark.parametrize(
    "how, message",
    [
        ("missing dictionary", "dict.de.txt: missing"),
        ("codes of another model", "does not match"),
        ("pre-norm encoder", "`encoder_normalize_before`=True"),
        ("learned positions", "`decoder_learned_pos`=True"),
        ("truncated checkpoint", "truncated: download the archive again"),
        ("no codes", "no BPE codes (bpecodes or code"),
    ],
)
def test_a_malformed_archive_stops_naming_the_file_and_the_fix_and_writes_nothing(bpe, tmp_path, how, message):
    fsmt = random_fsmt("big-like", vocab=padded_vocab(bpe))
    archive = broken(tmp_path / "archive", fsmt, bpe, how)
    result = vaswani("convert", "fairseq", str(archive), str(tmp_path / "out"))
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and str(archive) in result.stderr
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["archive"]


def test_a_vocabulary_the_config_cannot_share_is_refused_by_name():
    fsmt = random_fsmt("big-like", vocab=40, tied=False)
    fsmt.model.decoder.output_projection.weight = fsmt.model.decoder.embed_tokens.weight  # two of three shared
    with pytest.raises(FairseqArchiveError, match="share_decoder_input_output_embed"):
        fsmt_to_vaswani(fsmt)
    config = FSMTConfig(langs=["en", "de"], src_vocab_size=40, tgt_vocab_size=48, d_model=16, encoder_layers=1,
                        decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2)  # fmt: skip
    with pytest.raises(FairseqArchiveError, match="`src_vocab_size`=40 and `tgt_vocab_size`=48"):
        fsmt_to_vaswani(FSMTForConditionalGeneration(config))


def test_vaswani_convert_fsmt_writes_a_model_that_translates_as_fsmt(tmp_path):
    random_fsmt("uneven", vocab=40, tied=False).save_pretrained(tmp_path / "fsmt")
    result = vaswani("convert", "fsmt", str(tmp_path / "fsmt"), str(tmp_path / "vaswani"))
    assert result.returncode == 0, result.stderr[-2000:]
    converted = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "vaswani").eval()
    assert_same_as_fsmt(FSMTForConditionalGeneration.from_pretrained(tmp_path / "fsmt").eval(), converted, vocab=40)
    assert json.loads((tmp_path / "vaswani" / "training_facts.json").read_text())["data"] == {"src": "en", "tgt": "de"}


def test_tokenized_bleu_is_multi_bleu_of_moses_tokens_with_compounds_split(archives, tmp_path):
    from sacrebleu.metrics import BLEU

    from vaswani_hf.translation.metrics import load_metrics, score_with

    hypotheses, references = ["Ein Zwei-Wege-Test, sagte er."], ["Ein Zwei-Wege-Test, sagt er."]
    # Moses (de) then perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g', written out by hand
    split = "Ein Zwei ##AT##-##AT## Wege ##AT##-##AT## Test ,"
    tokens = [f"{split} sagte er .", f"{split} sagt er ."]
    expected = BLEU(tokenize="none").corpus_score(tokens[:1], [tokens[1:]]).score
    scores = score_with(load_metrics(["tokenized_bleu:de"]), hypotheses, references)
    assert scores["tokenized_bleu"] == round(expected, 2) and scores["bleu"] != scores["tokenized_bleu"]
    assert scores["tokenized_bleu_signature"].startswith("moses-de+compound-split|")

    # `vaswani evaluate` of a converted model on newstest2014 lines reports it beside sacreBLEU
    data = tmp_path / "wmt14"
    data.mkdir()
    for lang in ("en", "de"):
        lines = read_lines(NEWSTEST / f"newstest2014.en-de.{lang}", 6)
        (data / f"newstest2014.en-de.{lang}").write_text("\n".join(lines) + "\n")
    result = vaswani("evaluate", str(archives.converted["2018"]), "--data", str(data), "--split", "newstest2014.en-de",
                     "--metric", "tokenized_bleu:de", "--num-beams", "1", "--precision", "fp32")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tokenized_bleu" in result.stdout + result.stderr


def test_a_folder_that_holds_something_is_never_written_into(archives, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    for fmt, source in (("fairseq", archives.root / "2018"), ("marian", archives.root / "2018")):
        result = vaswani("convert", fmt, str(source), str(taken))
        assert result.returncode == 2 and f"{taken}: exists and is not empty; give a new folder." in result.stderr
    assert [p.name for p in taken.iterdir()] == ["notes.txt"] and (taken / "notes.txt").read_text() == "mine"


# --- the paper's figures from the paper's checkpoints: fairseq's decoding, tokenizer and metric ---

ORACLE_SETTINGS = {  # name: (fairseq hub translate()'s arguments, vaswani translate's flags)
    "fairseq-generate": ({}, ["--decoding", "fairseq"]),  # beam 5, lenpen 1, max_len_b 200, min_len 1
    "fairseq-beam1": ({"beam": 1}, ["--decoding", "fairseq", "--num-beams", "1"]),
    "fairseq-beam4": ({"beam": 4}, ["--decoding", "fairseq", "--num-beams", "4"]),
    "ott": ({"beam": 4, "lenpen": 0.6}, ["--decoding", "ott"]),  # Ott et al. (2018)'s newstest2014 settings
}


@pytest.fixture(scope="module")
def trained_archive(archives, bpe, tmp_path_factory):
    """A 2018-format archive of a model trained 200 steps on Multi30k (about 15 s): random weights loop on one
    subword to the length limit, where beams of near-equal scores would make the comparison one of float noise;
    a barely trained model ends its sentences at many lengths and still loops in some."""
    tokenizer = AutoTokenizer.from_pretrained(archives.converted["2018"])
    english, german = read_lines(MULTI30K / "train.en", 3000), read_lines(MULTI30K / "train.de", 3000)
    pairs = [tokenizer(en, text_target=de) for en, de in zip(english, german, strict=True)]
    fsmt = random_fsmt("big-like", vocab=padded_vocab(bpe)).train()
    with torch.no_grad():  # back to FSMT's own initialisation: the LayerNorms at 1 and 0, the rest small
        fsmt.apply(fsmt._init_weights)
        for name, parameter in fsmt.named_parameters():
            if "layer_norm" in name:
                parameter.fill_(1.0 if name.endswith("weight") else 0.0)
    optimizer = torch.optim.Adam(fsmt.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)

    def padded(rows):
        width = max(map(len, rows))
        return torch.tensor([row + [1] * (width - len(row)) for row in rows])

    for _ in range(200):
        rows = [pairs[i] for i in torch.randint(0, len(pairs), (32,), generator=generator).tolist()]
        source, labels = padded([r["input_ids"] for r in rows]), padded([r["labels"] for r in rows])
        decoder_input = torch.cat([torch.full((len(rows), 1), 2), labels[:, :-1]], 1)  # fairseq's: from </s>
        logits = fsmt(input_ids=source, attention_mask=source.ne(1), decoder_input_ids=decoder_input,
                      use_cache=False).logits  # fmt: skip
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    root = tmp_path_factory.mktemp("trained")
    archive = write_archive(root / "2018", fsmt.eval(), bpe, "2018")
    converted = convert_fairseq_checkpoint(archive, root / "vaswani")
    return types.SimpleNamespace(archive=archive, converted=converted, fsmt=fsmt)


def test_fairseq_itself_translates_as_vaswani_translate(trained_archive, tmp_path):
    """fairseq 0.12 (PyPI's fairseq-fixed, in an environment of its own built once: tests/fairseq_venv.py) loads the
    2018-format archive with its hub interface (its Moses tokenizer, subword-nmt, SequenceGenerator) and translates
    60 Multi30k sentences with fairseq-generate's defaults (beam 5, and beams 1 and 4) and Ott et al.'s settings
    (beam 4, lenpen 0.6), in one process; the converted model gives the same strings through `vaswani translate`.
    Some sentences run to fairseq's 200-token limit, which is held to fairseq's too."""
    from .fairseq_venv import fairseq_python

    python = fairseq_python()  # a build that fails raises here: the test fails, it does not skip
    lines = read_lines(MULTI30K / "test2016.en", 60)
    sources = tmp_path / "sources.en"
    sources.write_text("\n".join(lines) + "\n", encoding="utf-8")
    settings = json.dumps({name: kwargs for name, (kwargs, _) in ORACLE_SETTINGS.items()})
    out = tmp_path / "fairseq.json"
    oracle = Path(__file__).with_name("fairseq_oracle.py")
    log = open(tmp_path / "fairseq.log", "w+", encoding="utf-8")  # a file, not a pipe: fairseq logs as it goes
    fairseq = subprocess.Popen([str(python), str(oracle), str(trained_archive.archive), str(sources), settings,
                                str(out)], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    ours = {}  # while fairseq translates
    for name, (_, flags) in ORACLE_SETTINGS.items():
        result = vaswani("translate", str(trained_archive.converted), "--precision", "fp32", *flags,
                         stdin=sources.read_text())  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        ours[name] = result.stdout.splitlines()
    fairseq.wait(timeout=600)
    log.close()
    assert fairseq.returncode == 0, (tmp_path / "fairseq.log").read_text(encoding="utf-8")[-4000:]
    theirs = json.loads(out.read_text(encoding="utf-8"))
    assert theirs["generation"] == {"max_len_a": 0, "max_len_b": 200, "min_len": 1, "lenpen": 1}
    lengths, tokenizer = set(), AutoTokenizer.from_pretrained(trained_archive.converted)
    for name in ORACLE_SETTINGS:
        assert ours[name] == theirs[name], name
        lengths.update(len(tokenizer.tokenize(line)) for line in theirs[name])
    assert max(lengths) == 200 and min(lengths) < 20  # ended sentences, and some at fairseq's limit


@pytest.fixture
def end_first(archives):
    """The converted model rigged so that `</s>` is its first choice at every step: the last decoder layer's output
    LayerNorm gives one constant vector, and `</s>`'s (shared) embedding points along it."""
    model = AutoModelForSeq2SeqLM.from_pretrained(archives.converted["2018"]).eval()
    norm = model.model.decoder.layers[-1].final_layer_norm
    with torch.no_grad():
        direction = torch.randn(model.config.d_model, generator=torch.Generator().manual_seed(0))
        norm.weight.zero_()
        norm.bias.copy_(direction)
        model.lm_head.weight[2] = 5 * direction
    return model


def test_the_first_token_is_never_end_of_sentence_as_fairseq_s_min_len(end_first, archives):
    tokenizer = AutoTokenizer.from_pretrained(archives.converted["2018"])
    batch = tokenizer(["A man in a blue shirt ."], return_tensors="pt")
    generation = end_first.generation_config
    assert generation.min_new_tokens == 1  # saved by the conversion
    for beams in (1, 5):
        with torch.no_grad():
            out = end_first.generate(**batch, num_beams=beams)
        assert out[0, 0].item() == 2 and out[0, 1].item() != 2 and out[0, 2].item() == 2, out  # one word, then </s>
    # and `--decoding fairseq` / `ott` give it to a model whose own settings do not
    from vaswani_hf.interop.convert.fairseq import FAIRSEQ_DECODING, OTT_DECODING

    generation.min_new_tokens = 0
    with torch.no_grad():
        assert end_first.generate(**batch).tolist() == [[2, 2]]
        for preset in (FAIRSEQ_DECODING, OTT_DECODING):
            assert end_first.generate(**batch, **preset)[0, 1].item() != 2


def test_ott_decoding_is_a_flag_away():
    from vaswani_hf.cli_decoding import _decoding

    settings = _decoding(argparse.Namespace(decoding="ott", num_beams=None, length_penalty=None))
    assert {k: settings[k] for k in ("num_beams", "length_penalty", "length_penalty_type", "max_length",
                                     "max_length_offset", "min_new_tokens")} == {
        "num_beams": 4, "length_penalty": 0.6, "length_penalty_type": "hf", "max_length": 202,
        "max_length_offset": None, "min_new_tokens": 1}  # fmt: skip


def test_unk_is_printed_as_fairseq_prints_it(archives):
    """fairseq's hypotheses print `<unk>` (and tokenized BLEU counts it); skipping special tokens keeps it."""
    tokenizer = AutoTokenizer.from_pretrained(archives.converted["2018"])
    ids = tokenizer("A man in a blue shirt .")["input_ids"]
    with_unk = [2, *ids[:2], 3, *ids[2:]]
    assert tokenizer.decode(with_unk, skip_special_tokens=True) == "A man <unk> in a blue shirt."
    assert tokenizer.batch_decode([[2, 3, 2, 1, 1]], skip_special_tokens=True) == ["<unk>"]


def test_moses_options_are_read_from_the_dictionary(tmp_path):
    """Google's WMT16 en-de data was tokenized without `-a` (and the 2018 checkpoint says nothing of Moses): the
    dictionary shows it (no `@-@`, hyphens inside subwords), so `well-known` is not split into pieces it lacks."""
    plain = learn_codes_and_dictionary(tmp_path / "bpe", aggressive=False, escape=False)
    fsmt = random_fsmt("big-like", vocab=padded_vocab(plain))
    archive = write_archive(tmp_path / "archive", fsmt, plain, "2018")
    result = vaswani("convert", "fairseq", str(archive), str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Moses aggressive_dash_splits: no (the dictionary; no `@-@` in the dictionary" in result.stdout
    assert "Moses escape: no (the dictionary; the dictionary holds bare quotes" in result.stdout
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert (tokenizer.aggressive_dash_splits, tokenizer.escape) == (False, False)
    for line in read_lines(MULTI30K / "test2016.en", 1000):
        if "-" in line or '"' in line:
            assert 3 not in tokenizer(line)["input_ids"] or any(  # no <unk> but for characters never seen
                p not in tokenizer.encoder for w in line.split() for p in w)  # fmt: skip
    assert "@-@" not in tokenizer.tokenize("a well-known man")
    facts = json.loads((tmp_path / "out" / "training_facts.json").read_text())["converted_from"]["moses"]
    assert facts["aggressive_dash_splits"]["from"] == "the dictionary"


def test_an_explicit_moses_flag_wins_over_the_checkpoint_and_the_dictionary_with_a_warning(tmp_path):
    plain = learn_codes_and_dictionary(tmp_path / "bpe", aggressive=False, escape=False)
    fsmt = random_fsmt("big-like", vocab=padded_vocab(plain))
    archive = write_archive(tmp_path / "archive", fsmt, plain, "2018")
    with pytest.warns(UserWarning, match="--aggressive-dash-splits yes is used, but the dictionary"):
        convert_fairseq_checkpoint(archive, tmp_path / "flag", aggressive_dash_splits=True)
    assert AutoTokenizer.from_pretrained(tmp_path / "flag").aggressive_dash_splits is True
    current = write_archive(tmp_path / "current", fsmt, plain, "current")  # cfg: moses_no_dash_splits=True
    with pytest.warns(UserWarning, match="the checkpoint's `moses_no_dash_splits` says no"):
        convert_fairseq_checkpoint(current, tmp_path / "flag2", aggressive_dash_splits=True)
    assert AutoTokenizer.from_pretrained(tmp_path / "flag2").aggressive_dash_splits is True


def test_codes_without_a_version_header_are_subword_nmt_v0_1_and_convert(tmp_path):
    old = learn_codes_and_dictionary(tmp_path / "bpe", version=False)
    assert not old.codes.read_text().startswith("#version")
    archive = write_archive(tmp_path / "archive", random_fsmt("big-like", vocab=padded_vocab(old)), old, "2018")
    convert_fairseq_checkpoint(archive, tmp_path / "out")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    moses = sacremoses.MosesTokenizer(lang="en")
    for line in read_lines(MULTI30K / "test2016.en", 50):
        words = moses.tokenize(line, aggressive_dash_splits=True, escape=True)
        assert tokenizer.tokenize(line) == old.segmenter.segment_tokens(words)


def test_tokenized_bleu_counts_the_references_as_fairseq_s_scripts_did():
    """newstest2014's references as Ott et al. scored them: German by compound_split_bleu.sh (64,496 tokens), French
    by prepare-wmt14en2fr.sh (`’` -> `'`, Moses `-a`: 82,787, the reference length fairseq's README prints)."""
    from vaswani_hf.translation.metrics import load_metrics, score_with

    for pair, lang, tokens in (("en-de", "de", 64496), ("en-fr", "fr", 82787)):
        references = read_lines(NEWSTEST / f"newstest2014.{pair}.{lang}", 3003)
        scores = score_with(load_metrics([f"tokenized_bleu:{lang}"]), references, references)
        assert (scores["tokenized_bleu_ref_len"], scores["tokenized_bleu"]) == (tokens, 100.0), lang
    # fairseq prints `<unk>` and scores it as one token
    scores = score_with(load_metrics(["tokenized_bleu:de"]), ["ein <unk> Haus ."], ["ein gutes Haus ."])
    assert scores["tokenized_bleu_sys_len"] == 4


def test_an_fsmt_folder_as_the_hub_has_it_keeps_its_tokenizer(tmp_path):
    from transformers import FSMTTokenizer

    random_fsmt("uneven", vocab=40, tied=False).save_pretrained(tmp_path / "fsmt")
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}</w>": i for i in range(4, 40)}}
    for name in ("vocab-src.json", "vocab-tgt.json"):
        (tmp_path / "fsmt" / name).write_text(json.dumps(vocab))
    (tmp_path / "fsmt" / "merges.txt").write_text("w 1</w> 100\n")
    # as Transformers' convert_fsmt_original_pytorch_checkpoint_to_pytorch.py writes it: no tokenizer_class
    (tmp_path / "fsmt" / "tokenizer_config.json").write_text(json.dumps(
        {"langs": ["en", "de"], "model_max_length": 1024, "do_lower_case": False}))  # fmt: skip
    result = vaswani("convert", "fsmt", str(tmp_path / "fsmt"), str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert isinstance(AutoTokenizer.from_pretrained(tmp_path / "out"), FSMTTokenizer)


def test_a_converted_fsmt_model_keeps_fairseq_s_length_limit_and_min_len():
    fsmt = random_fsmt("uneven", vocab=40, tied=False)
    fsmt.generation_config.max_length = 200  # as the allenai/wmt16-* and facebook/wmt19-* configs have it
    generation = fsmt_to_vaswani(fsmt).generation_config
    # fairseq's max_len_b 200: 200 tokens then </s>, where Transformers' max_length counts the decoder's start too
    assert (generation.max_length, generation.min_new_tokens) == (202, 1)


def test_the_documented_commands_for_ott_s_figures_run_on_converted_archives(archives, tmp_path):
    """docs/trained-models.md's commands for 29.3 / 43.2 as written, on the random archive converted as en-de and as
    en-fr, with the first lines of ../shared/data/wmt14_newstest2014."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "trained-models.md").read_text(encoding="utf-8")
    block = text[text.index("```bash", text.index("Ott et al.'s figures, as they were measured")) :]
    block = block[len("```bash") : block.index("```", len("```bash"))]
    commands = [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    assert len(commands) == 2 and all("--decoding ott --precision fp32 --metric tokenized_bleu:" in c for c in commands)
    french = tmp_path / "wmt14.en-fr"  # the archive as an en-fr one: its dictionaries named for the pair
    french.mkdir()
    for name in ("model.pt", "bpecodes", "dict.en.txt"):
        (french / name).symlink_to(archives.root / "2018" / name)
    (french / "dict.fr.txt").symlink_to(archives.root / "2018" / "dict.de.txt")
    convert_fairseq_checkpoint(french, tmp_path / "wmt14-en-fr", source_lang="en", target_lang="fr")
    (tmp_path / "wmt16-en-de").symlink_to(archives.converted["2018"])
    data = tmp_path / "data"
    data.mkdir()
    for pair in ("en-de", "en-fr"):
        for lang in pair.split("-"):
            lines = read_lines(NEWSTEST / f"newstest2014.{pair}.{lang}", 4)
            (data / f"newstest2014.{pair}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for command in commands:
        words = command.replace("../shared/data/wmt14_newstest2014", str(data)).split()
        assert words[:2] == ["vaswani", "evaluate"]
        result = vaswani(*words[1:2], str(tmp_path / words[2]), *words[3:])
        assert result.returncode == 0, result.stderr[-2000:]
        assert "tokenized_bleu" in result.stdout + result.stderr and "fp32" in result.stdout + result.stderr


def test_unk_stays_glued_to_its_letters_in_tokenized_bleu_as_in_fairseq_s_output():
    """fairseq prints `Bü<unk>t` (one token after BPE removal) and splits `<unk>-Haus` as a compound."""
    from vaswani_hf.translation.metrics import load_metrics, score_with

    metrics = load_metrics(["tokenized_bleu:de"])
    lengths = [score_with(metrics, [hypothesis], ["ein gutes Haus ."])["tokenized_bleu_sys_len"]
               for hypothesis in ("ein Bü<unk>t Haus .", "ein <unk>-Haus .")]  # fmt: skip
    assert lengths == [4, 5]  # ein Bü<unk>t Haus . | ein <unk> ##AT##-##AT## Haus .


def test_a_lone_hyphen_piece_is_no_evidence_against_aggressive_dash_splits():
    from vaswani_hf.interop.convert.fairseq import moses_evidence

    # what -a text gives where BPE leaves `@-@` in single characters: `@@@ -@@ @`
    found = moses_evidence(["<s>", "<pad>", "</s>", "<unk>", "@@@", "-@@", "@", "well", "known"])
    assert found["aggressive_dash_splits"][0] is not False


# --- text fairseq reads as text, its output cap, its detokenizer, and archives it trained otherwise ---

SPECIAL_TEXT = ["A man </s> walks .", "<pad> Two dogs <unk> play in the snow .", "<s> A girl & a boy < > | [ ] .",
                '"Hello" , she said to the man \'s dog .', "</s>", "<unk>"]  # fmt: skip


def fairseq_oracle(archive: Path, lines: list[str], settings: dict, folder: Path, overrides: dict | None = None):
    """fairseq's hub interface on `lines` (tests/fairseq_oracle.py), started in the background: `.result()` waits
    for its JSON."""
    from .fairseq_venv import fairseq_python

    python = fairseq_python()  # a build that fails raises here: the test fails, it does not skip
    folder.mkdir(parents=True, exist_ok=True)
    sources, out = folder / "sources.en", folder / "fairseq.json"
    sources.write_text("\n".join(lines) + "\n", encoding="utf-8")
    log = open(folder / "fairseq.log", "w+", encoding="utf-8")
    process = subprocess.Popen([str(python), str(Path(__file__).with_name("fairseq_oracle.py")), str(archive),
                                str(sources), json.dumps(settings), str(out), json.dumps(overrides or {})],
                               stdout=log, stderr=subprocess.STDOUT)  # fmt: skip

    def result() -> dict:
        process.wait(timeout=600)
        log.close()
        assert process.returncode == 0, (folder / "fairseq.log").read_text(encoding="utf-8")[-4000:]
        return json.loads(out.read_text(encoding="utf-8"))

    return types.SimpleNamespace(result=result, sources=sources)


def test_fairseq_itself_reads_special_token_text_caps_its_output_and_unescapes(trained_archive, bpe, tmp_path):
    """fairseq 0.12 decides, on the trained model: `</s>`, `<pad>`, `<unk>`, `<s>` inside a line are text (Moses
    escapes them, BPE segments them), with escaping on and off; an archive of 24 target positions stops at
    min(200, 24 - 1) tokens, with its own generation config and with `--decoding fairseq`, each line (those cut at the
    cap too) fairseq's; and a model trained with Moses escaping off (`moses_no_escape`) has its output unescaped by
    fairseq's detokenizer all the same."""
    capped = write_archive(tmp_path / "capped", trained_archive.fsmt, bpe, "2018", max_target_positions=24,
                           moses_no_escape=True)  # fmt: skip
    converted = convert_fairseq_checkpoint(capped, tmp_path / "capped-vaswani")
    lines = SPECIAL_TEXT + read_lines(MULTI30K / "test2016.en", 24)
    escaped = AutoTokenizer.from_pretrained(trained_archive.converted)
    entities = [escaped(text)["input_ids"][:-1] for text in ('"Hallo" , sagte er .', "A & B < C > D | [ x ] 's")]
    assert all(any("&" in t for t in escaped.convert_ids_to_tokens(row)) for row in entities)
    plain = fairseq_oracle(trained_archive.archive, SPECIAL_TEXT, {"encode": True}, tmp_path / "plain")
    capped_oracle = fairseq_oracle(capped, lines, {"encode": True, "fairseq-generate": {}, "decode": entities},
                                   tmp_path / "capped-oracle")  # fmt: skip
    ours = {}  # while fairseq translates
    for name, flags in (("fairseq-generate", ["--decoding", "fairseq"]), ("own config", [])):
        result = vaswani("translate", str(converted), "--precision", "fp32", *flags,
                         stdin=capped_oracle.sources.read_text(encoding="utf-8"))  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        ours[name] = result.stdout.splitlines()
    tokenizer = AutoTokenizer.from_pretrained(converted)
    theirs, theirs_plain = capped_oracle.result(), plain.result()
    assert [escaped(line)["input_ids"] for line in SPECIAL_TEXT] == theirs_plain["encode"]
    assert [tokenizer(line)["input_ids"] for line in lines] == theirs["encode"]
    assert [tokenizer.decode(row) for row in entities] == theirs["decode"]
    assert ours["own config"] == ours["fairseq-generate"]
    length = {line: len(tokenizer.tokenize(line)) for line in ours["fairseq-generate"] + theirs["fairseq-generate"]}
    assert max(length[line] for line in theirs["fairseq-generate"]) == 23  # fairseq's cap, reached by lines that loop
    # every line equal, those that reach the cap too: fairseq scores the </s> forced there with the model's own
    # log-probability (`forced_eos_score="model"`), so a looping hypothesis cut at the cap ranks as in fairseq
    assert ours["fairseq-generate"] == theirs["fairseq-generate"]


def test_special_token_text_is_text_and_the_folder_keeps_it(archives):
    tokenizer = AutoTokenizer.from_pretrained(archives.converted["2018"])
    for line in SPECIAL_TEXT:
        ids = tokenizer(line)["input_ids"]
        assert ids.count(2) == 1 and ids[-1] == 2 and not {0, 1} & set(ids), (line, ids)  # </s> ends it, only
    saved = json.loads((archives.converted["2018"] / "tokenizer_config.json").read_text())
    assert saved["split_special_tokens"] is True


def test_output_is_unescaped_with_moses_escaping_off(archives, tmp_path):
    """fairseq's MosesTokenizer.decode unescapes whatever its `moses_no_escape` (held to fairseq itself in
    test_fairseq_itself_reads_special_token_text_caps_its_output_and_unescapes)."""
    escaped = AutoTokenizer.from_pretrained(archives.converted["2018"])
    ids = escaped('"Hallo" & <b>')["input_ids"]
    off = AutoTokenizer.from_pretrained(archives.converted["2018"], escape=False)
    assert any("&" in token for token in escaped.convert_ids_to_tokens(ids))  # `&quot;`, `&amp;`, `&lt;` pieces
    decoded = off.decode(ids, skip_special_tokens=True)
    assert decoded == escaped.decode(ids, skip_special_tokens=True) and decoded.startswith('"Hallo" & <')
    assert not any(entity in decoded for entity in ("&quot;", "&amp;", "&lt;", "&gt;"))


def test_max_target_positions_caps_the_output_as_fairseq(archives, bpe, tmp_path):
    from vaswani_hf.cli_decoding import _decoding

    archive = write_archive(tmp_path / "capped", archives.fsmt, bpe, "current", max_target_positions=24)
    model = AutoModelForSeq2SeqLM.from_pretrained(convert_fairseq_checkpoint(archive, tmp_path / "out"))
    assert model.config.max_target_positions == 24 and model.generation_config.max_length == 25  # start, 23, </s>
    for preset in ("fairseq", "ott"):
        settings = _decoding(argparse.Namespace(decoding=preset, num_beams=None, length_penalty=None), model)
        assert settings["max_length"] == 25
    uncapped = AutoModelForSeq2SeqLM.from_pretrained(archives.converted["current"])
    assert uncapped.generation_config.max_length == 202
    paper = _decoding(argparse.Namespace(decoding="paper", num_beams=None, length_penalty=None), model)
    assert "max_length" not in paper and paper["max_length_offset"] == 50


@pytest.mark.parametrize("form", ["2018", "current"])
def test_a_layerdrop_archive_converts_with_a_note(archives, bpe, tmp_path, form):
    """LayerDrop skips layers in training only; fairseq's inference runs them all, as the converted model does."""
    archive = write_archive(tmp_path / "layerdrop", archives.fsmt, bpe, form, encoder_layerdrop=0.2,
                            decoder_layerdrop=0.1)  # fmt: skip
    said = []
    converted = convert_fairseq_checkpoint(archive, tmp_path / "out", report=said.append)
    assert any("LayerDrop (encoder_layerdrop=0.2, decoder_layerdrop=0.1)" in line for line in said), said
    # the same model as the archive without LayerDrop (held to FSMT's numerics above)
    paths = (converted, archives.converted[form])
    ours, plain = (AutoModelForSeq2SeqLM.from_pretrained(path).state_dict() for path in paths)
    assert ours.keys() == plain.keys() and all(torch.equal(ours[k], plain[k]) for k in ours)


@pytest.mark.parametrize("codes", [True, False], ids=["stray-bpecodes", "no-codes"])
@pytest.mark.parametrize("form", ["2018", "current"])
def test_a_sentencepiece_archive_is_refused_naming_sentencepiece(archives, bpe, tmp_path, form, codes):
    archive = write_archive(tmp_path / "archive", archives.fsmt, bpe, form, segmenter="sentencepiece",
                            drop=() if codes else ("bpecodes",))  # fmt: skip
    with pytest.raises(FairseqArchiveError, match="`bpe`='sentencepiece': the archive segments") as refused:
        convert_fairseq_checkpoint(archive, tmp_path / "out")
    assert "--bpe-codes" not in str(refused.value) and str(archive) in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_vaswani_serve_s_fairseq_decoding_keeps_the_archive_s_cap(archives, bpe, tmp_path):
    """`vaswani serve --decoding fairseq` decodes a batch as `translate` does: random weights loop to the limit,
    which is min(200, max_target_positions - 1) for fairseq."""
    from vaswani_hf.interop.convert.fairseq import FAIRSEQ_DECODING
    from vaswani_hf.serving.service import Service, Settings
    from vaswani_hf.translation.inference import load_for_inference

    archive = write_archive(tmp_path / "capped", archives.fsmt, bpe, "current", max_target_positions=12)
    loaded, tokenizer = load_for_inference(convert_fairseq_checkpoint(archive, tmp_path / "out"), device="cpu",
                                           precision="fp32")  # fmt: skip
    settings = Settings(decoding={**FAIRSEQ_DECODING, "num_beams": 1})  # as `--decoding fairseq --num-beams 1`
    service = Service(loaded, tokenizer, settings, str(tmp_path / "out"), "cpu", "fp32", ("en", "de"))
    try:
        (translation,) = service.translate_batch(["A man in a blue shirt ."], {})
    finally:
        service.batcher.stop()
    pieces = len(tokenizer.tokenize(translation.nbest[0][0]))
    assert pieces < 20, translation  # fairseq's cap: 11 tokens, then </s> (its text tokenized again: about 11)
