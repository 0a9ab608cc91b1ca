"""Inference with a trained model: loading a checkpoint safely, batched translation (also n-best), forced
decoding (the log-probability of given translations, for filtering and reranking), and BLEU/chrF (section 6.1)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import sacrebleu
import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerBase

from .configuration_vaswani import VaswaniConfig
from .modeling_vaswani import VaswaniForConditionalGeneration
from .precision import Precision, resolve_precision


def load_model(name_or_path: str | Path) -> VaswaniForConditionalGeneration:
    """A vaswani checkpoint from a local folder (checked first, for clear errors) or a Hub id; safetensors only,
    so loading never unpickles a file (convert `pytorch_model.bin` checkpoints in Python first)."""
    path = Path(name_or_path)
    looks_local = path.exists() or str(name_or_path).startswith(("/", ".", "~")) or str(name_or_path).count("/") != 1
    if looks_local:  # a Hub id is exactly "owner/name"
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"{path} is not a model directory (no config.json); train one with `vaswani train`")
        try:
            model_type = json.loads(config_file.read_text()).get("model_type")
        except json.JSONDecodeError as err:
            raise ValueError(f"{config_file} is not valid JSON ({err.msg}, line {err.lineno}).") from None
        if model_type != VaswaniConfig.model_type:
            raise ValueError(
                f"{path} holds a {model_type!r} model, not a {VaswaniConfig.model_type!r} one; a Marian checkpoint "
                "converts with scripts/convert_marian_to_vaswani.py."
            )
        if not any((path / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
            raise FileNotFoundError(
                f"{path} has config.json but no model.safetensors: the save did not finish. Use the last complete "
                "checkpoint-N folder of the run (`vaswani train ... --resume` continues from it)."
            )
    try:
        return AutoModelForSeq2SeqLM.from_pretrained(name_or_path, use_safetensors=True)
    except SafetensorError as err:
        raise ValueError(f"{path}: cannot read model.safetensors ({err}); the file is truncated or corrupt.") from None
    except RuntimeError as err:
        if "mismatched" not in str(err):
            raise
        raise ValueError(
            f"{path}: the weights do not fit config.json (tensor shapes differ): the config was edited or belongs to "
            "another model."
        ) from None


def default_device(precision: str | Precision = "fp32") -> str:
    """Where inference runs unless told: the GPU when there is one, except for int8, which is CPU serving (torch's
    dynamic quantization has no GPU kernels), so asking for it on a GPU machine runs on the CPU."""
    if str(getattr(precision, "name", precision)) == "int8":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_for_inference(model_dir: str | Path, device: str | None = None, precision: str | Precision = "fp32"):
    """Model (on the GPU when there is one) and tokenizer of a saved model directory; they must match.
    `precision` (fp32, bf16, int8 or auto; see `vaswani_hf.precision`) casts or quantizes the model for serving."""
    model = load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(
            f"{model_dir}: the tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}: "
            "they come from different runs. Save the training run's tokenizer beside the model."
        )
    device = device or default_device(precision)
    choice = precision if isinstance(precision, Precision) else resolve_precision(precision, device)
    return choice.apply(model.to(device).eval()), tokenizer


def _batches(lengths: list[int], batch_size: int, progress: bool, desc: str, max_tokens: int | None = None):
    """Indices of the inputs in batches, longest first (less padding): at most `batch_size` inputs and, with
    `max_tokens`, at most that many padded tokens (inputs x the longest; a longer input goes alone). Callers put
    the results back in order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, start = [], 0
    while start < len(order):
        size = min(batch_size, len(order) - start)
        if max_tokens is not None:  # the first of a batch is its longest
            size = max(1, min(size, max_tokens // max(lengths[order[start]], 1)))
        batches.append(order[start : start + size])
        start += size
    yield from tqdm(batches, desc=desc, disable=not progress, unit="batch")


def translate_nbest(
    model: VaswaniForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    nbest: int = 1,
    batch_size: int = 32,
    progress: bool = True,
    max_tokens: int | None = None,
    **generate_kwargs,
) -> list[list[tuple[str, float | None]]]:
    """Batched translation with the model's generation defaults (paper: beam 4, GNMT alpha 0.6, source + 50):
    for each sentence, in input order, its `nbest` best translations with their beam-search scores (the
    length-penalised log-probability; None for greedy decoding), best first. The beam is widened to `nbest`
    when the model's is narrower. Sentences are sorted by token length and batched by at most `batch_size`
    sentences and `max_tokens` padded source tokens."""
    model.eval()
    beams = max(generate_kwargs.get("num_beams") or model.generation_config.num_beams or 1, nbest)
    generate_kwargs["num_beams"] = beams
    beam = beams > 1
    outputs: list[list[tuple[str, float | None]]] = [[] for _ in sentences]
    encoded = tokenizer(list(sentences), truncation=True)["input_ids"]
    for index in _batches([len(ids) for ids in encoded], batch_size, progress, "translating", max_tokens):
        batch = tokenizer.pad({"input_ids": [encoded[i] for i in index]}, return_tensors="pt")
        with torch.no_grad():
            generated = model.generate(**batch.to(model.device), num_return_sequences=nbest, output_scores=beam,
                                       return_dict_in_generate=True, **generate_kwargs)  # fmt: skip
        texts = tokenizer.batch_decode(generated.sequences, skip_special_tokens=True)
        scores = generated.sequences_scores.tolist() if beam else [None] * len(texts)
        for row, (text, value) in enumerate(zip(texts, scores, strict=True)):
            outputs[index[row // nbest]].append((text.strip(), value))
    return outputs


def translate_stream(
    model: VaswaniForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    lines: Iterable[str],
    window: int = 10_000,
    progress: bool = False,
    total: int | None = None,
    **translate_kwargs,
) -> Iterator[list[tuple[str, float | None]]]:
    """`translate_nbest` (which takes `translate_kwargs`) for inputs of any size: reads `window` lines at a time,
    translates them (sorted by length, batched by tokens) and yields each line's n-best in input order before
    reading on, so memory holds one window whatever the input's length. `progress` shows a bar over the lines
    (`total` of them, if known)."""
    lines = iter(lines)
    with tqdm(total=total, desc="translating", unit="line", disable=not progress) as bar:
        while chunk := list(itertools.islice(lines, window)):
            yield from translate_nbest(model, tokenizer, chunk, progress=False, **translate_kwargs)
            bar.update(len(chunk))


def translate(
    model: VaswaniForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    batch_size: int = 32,
    progress: bool = True,
    **generate_kwargs,
) -> list[str]:
    """The best translation of each sentence, in input order (see `translate_nbest`)."""
    best = translate_nbest(model, tokenizer, sentences, 1, batch_size, progress, **generate_kwargs)
    return [candidates[0][0] for candidates in best]


def evaluate(
    model: VaswaniForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    pairs: list[tuple[str, str]],
    batch_size: int = 32,
    **generate_kwargs,
) -> tuple[dict, list[str]]:
    """Translate the sources of `pairs` and score them against the targets (`score`): (metrics, translations)."""
    hypotheses = translate(model, tokenizer, [source for source, _ in pairs], batch_size, **generate_kwargs)
    return score(hypotheses, [target for _, target in pairs]), hypotheses


def score_translations(
    model: VaswaniForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    targets: list[str],
    batch_size: int = 32,
    progress: bool = True,
) -> list[dict]:
    """Forced decoding: log p(target | source) under the model, per sentence and per target token (EOS included),
    in natural log, without label smoothing or length penalty: what `fairseq-generate --score-reference` and
    `marian-scorer` compute, for filtering parallel data and reranking n-best lists."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source lines but {len(targets)} target lines: the files must be aligned.")
    model.eval()
    results: list[dict] = [{} for _ in sources]
    for index in _batches([len(s) + len(t) for s, t in zip(sources, targets, strict=True)], batch_size, progress,
                          "scoring"):  # fmt: skip
        batch = tokenizer([sources[i] for i in index], text_target=[targets[i] for i in index], return_tensors="pt",
                          padding=True, truncation=True)  # fmt: skip
        labels = batch.pop("labels")
        labels = labels.masked_fill(labels == tokenizer.pad_token_id, -100)
        batch = batch.to(model.device)
        with torch.no_grad():
            logits = model(**batch, decoder_input_ids=model.prepare_decoder_input_ids_from_labels(
                labels.to(model.device))).logits  # fmt: skip
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        token_log_probs = log_probs.gather(-1, labels.clamp(min=0).to(model.device)[..., None])[..., 0].cpu()
        for row, i in enumerate(index):
            keep = labels[row] != -100
            values = token_log_probs[row][keep].tolist()
            ids = labels[row][keep].tolist()
            results[i] = {
                "log_prob": sum(values),
                "tokens": len(values),
                "mean_log_prob": sum(values) / max(len(values), 1),
                "token_log_probs": [round(v, 4) for v in values],
                "token_strings": tokenizer.convert_ids_to_tokens(ids),
            }
    return results


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Cased, detokenized corpus BLEU and chrF with sacrebleu (section 6.1), with their signatures."""
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "brevity_penalty": round(bleu_score.bp, 3),
    }
