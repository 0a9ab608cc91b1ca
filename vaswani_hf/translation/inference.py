"""Inference with a trained model: loading a checkpoint safely, batched translation (also n-best), forced
decoding (the log-probability of given translations, for filtering and reranking), and BLEU/chrF (section 6.1)."""

from __future__ import annotations

import bisect
import inspect
import itertools
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerBase

from ..model.configuration_vaswani import VaswaniConfig
from ..model.modeling_vaswani import VaswaniForConditionalGeneration
from ..model.precision import Precision, resolve_precision
from .batch_workers import decoding_workers, in_order
from .source_lines import (
    SCORE_LONG_LINES,
    LineReport,
    batch_indices,
    long_pairs,
    pieces_of,
    rejoined,
    source_limit,
)

logger = logging.getLogger("vaswani")


def is_local(name_or_path: str | Path) -> bool:
    """A local folder, not a Hub id (which is exactly "owner/name")."""
    text = str(name_or_path)
    return Path(name_or_path).exists() or text.startswith(("/", ".", "~")) or text.count("/") != 1


def check_model_folder(path: str | Path, tokenizer: bool = True, weights: bool = True) -> None:
    """One clear error naming the first missing piece of a saved model folder: the folder, `config.json` (valid
    JSON, this model type), the weights, the tokenizer. Every command that loads a model checks it first."""
    path = Path(path)
    config_file = path / "config.json"
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such folder; give a model folder saved by `vaswani train`.")
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json); train one with `vaswani train`")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_file} is not valid JSON ({err.msg}, line {err.lineno}).") from None
    if model_type != VaswaniConfig.model_type:
        raise ValueError(
            f"{path} holds a {model_type!r} model, not a {VaswaniConfig.model_type!r} one; a Marian checkpoint "
            "converts with `vaswani convert marian MARIAN_DIR OUT_DIR`."
        )
    if weights and not any((path / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        raise FileNotFoundError(
            f"{path} has config.json but no model.safetensors: the save did not finish. Use the last complete "
            "checkpoint-N folder of the run (`vaswani train ... --resume` continues from it)."
        )
    if tokenizer and not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(
            f"{path} has no tokenizer (tokenizer.json missing): save the tokenizer the model was trained with beside "
            f'it (`tokenizer.save_pretrained("{path}")`); `vaswani train` writes it there.'
        )


def load_model(name_or_path: str | Path, tokenizer: bool = False) -> VaswaniForConditionalGeneration:
    """A vaswani checkpoint from a local folder (checked first, for clear errors; with `tokenizer`, its tokenizer
    too) or a Hub id; safetensors only, so loading never unpickles a file (convert `pytorch_model.bin` checkpoints
    in Python first)."""
    path = Path(name_or_path)
    if is_local(name_or_path):
        check_model_folder(path, tokenizer=tokenizer)
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
    `precision` (fp32, bf16, int8 or auto; see `model.precision`) casts or quantizes the model for serving."""
    model = load_model(model_dir, tokenizer=True)
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
    """`batch_indices`, under a progress bar."""
    batches = batch_indices(lengths, batch_size, max_tokens)
    yield from tqdm(batches, desc=desc, disable=not progress, unit="batch")


def translate_nbest(
    model: VaswaniForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    nbest: int = 1,
    batch_size: int = 32,
    progress: bool = True,
    max_tokens: int | None = None,
    constraints: list[list[str]] | None = None,
    prefixes: list[str] | None = None,
    alignments: bool = False,
    shortlist=None,
    long_lines: str = "cut",
    first_line: int = 1,
    report: LineReport | None = None,
    **generate_kwargs,
) -> list[list[tuple]]:
    """Batched translation with the model's generation defaults (paper: beam 4, GNMT alpha 0.6, source + 50):
    for each sentence, in input order, its `nbest` best translations as (text, score) pairs, best first. The score
    is the length-penalised log-probability beam search ranks by (None for greedy decoding). The beam is widened
    to `nbest` when the model's is narrower. Sentences are sorted by token length and batched by at most
    `batch_size` sentences and `max_tokens` padded source tokens.

    An empty sentence (or one of white space only) is not translated: its one candidate is ("", None). A sentence
    longer than the model reads is handled as `long_lines` says (`source_lines`: "cut" with a warning,
    "split" at sentence ends and rejoined, or "error"), naming it by its number (`first_line` numbers the first);
    `report` counts what happened. A split sentence's constraints are refused (which piece would hold them?); its
    prefix starts its first piece.

    `constraints`: per sentence, phrases every translation must contain (lexically constrained beam search);
    `prefixes`: per sentence, the text its translations start with ("" for none); `alignments`: (text, score,
    alignment) triples, the alignment in Moses' "i-j" format (source word i, translation word j, 0-based, words
    split at whitespace; `word_alignment`); `shortlist`: a `shortlist.Shortlist`, each batch scoring
    only its allowed target tokens; `batch_processors`: a function of a batch's source ids giving logits processors
    for its search (a parser's `TreeConstraint`). `model` may be an `Ensemble` or an ONNX runner (not for
    alignments)."""
    limit = source_limit(model, tokenizer)
    pieces = pieces_of(list(sentences), tokenizer, limit, long_lines, first_line, report)
    texts = [piece for line in pieces for piece in line]
    lexical: dict = {}
    if constraints is not None:
        split = [first_line + i for i, line in enumerate(pieces) if len(line) > 1 and constraints[i]]
        if split:
            raise ValueError(
                f"line {split[0]} is split at sentence ends (--long-lines split) and has constraints: "
                "a split line's phrases belong to no one piece. Shorten it, or use --long-lines cut."
            )
        lexical["constraints"] = [constraints[i] for i, line in enumerate(pieces) for _ in line]
    if prefixes is not None:
        lexical["prefixes"] = [prefixes[i] if k == 0 else "" for i, line in enumerate(pieces) for k in range(len(line))]
    translated = (_translate_texts(model, tokenizer, texts, nbest, batch_size, progress, max_tokens, limit,
                                   alignments=alignments, shortlist=shortlist, **lexical, **generate_kwargs)
                  if texts else [])  # fmt: skip
    results, start = [], 0
    for line in pieces:
        results.append(rejoined(line, translated[start : start + len(line)], nbest, alignments))
        start += len(line)
    return results


def search_settings(model, nbest: int, generate_kwargs: dict) -> tuple[int, bool]:
    """(beams, sampling) of `translate_nbest`'s searches: the call's `num_beams` and `do_sample`, else its
    `generation_config`'s, else the model's; the beam widened to `nbest`."""
    config = generate_kwargs.get("generation_config") or model.generation_config
    beams = max(generate_kwargs.get("num_beams") or config.num_beams or 1, nbest)
    return beams, bool(generate_kwargs.get("do_sample", getattr(config, "do_sample", False)))


def _translate_texts(
    model: VaswaniForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    nbest: int,
    batch_size: int,
    progress: bool,
    max_tokens: int | None,
    limit: int,
    constraints: list[list[str]] | None = None,
    prefixes: list[str] | None = None,
    alignments: bool = False,
    shortlist=None,
    batch_processors=None,
    **generate_kwargs,
) -> list[list[tuple]]:
    """`translate_nbest` for non-empty texts of at most `limit` tokens (a longer one is cut there)."""
    model.eval()
    beams, sampling = search_settings(model, nbest, generate_kwargs)
    generate_kwargs["num_beams"] = beams
    beam = beams > 1
    outputs: list[list[tuple]] = [[] for _ in sentences]
    offsets = alignments and tokenizer.is_fast
    encoding = tokenizer(list(sentences), truncation=True, max_length=limit, return_offsets_mapping=offsets)
    encoded = encoding["input_ids"]
    phrases = lexical_ids(tokenizer, constraints, "constraint", len(sentences)) if constraints is not None else None
    starts = lexical_ids(tokenizer, prefixes, "prefix", len(sentences)) if prefixes is not None else None
    starting = word_start_ids(tokenizer) if constraints is not None else None

    def prepared(index: list[int]) -> tuple[list[int], dict]:
        """A batch's generate() arguments (on the calling thread: the tokenizer is not shared with the workers)."""
        batch = tokenizer.pad({"input_ids": [encoded[i] for i in index]}, return_tensors="pt")
        lexical = {}
        if phrases is not None:
            lexical["force_words"] = [phrases[i] for i in index]
            lexical["word_start_ids"] = starting
        if starts is not None:
            lexical["target_prefix"] = [starts[i][0] if starts[i] else [] for i in index]
        if shortlist is not None:
            lexical["vocabulary_shortlist"] = shortlist.allowed(batch["input_ids"])
        if batch_processors is not None:
            lexical["logits_processor"] = batch_processors(batch["input_ids"])
        return index, {**batch.to(model.device), **lexical}

    def searched(job: tuple[list[int], dict]):
        index, arguments = job
        with torch.no_grad():
            # the hypotheses' scores only: Transformers' `output_scores` would also keep every step's scores
            return index, model.generate(**arguments, num_return_sequences=nbest, output_sequence_scores=beam,
                                         return_dict_in_generate=True, output_cache=False,
                                         return_alignments=alignments, **generate_kwargs)  # fmt: skip

    batches = batch_indices([len(ids) for ids in encoded], batch_size, max_tokens)
    rows = max(map(len, batches), default=0) * beams
    workers = decoding_workers(model, len(batches), rows, alignments=alignments, sampling=sampling)
    searches = in_order(searched, map(prepared, batches), workers)
    for index, generated in tqdm(searches, desc="translating", disable=not progress, unit="batch", total=len(batches)):
        texts = tokenizer.batch_decode(generated.sequences, skip_special_tokens=True)
        scores = generated.sequences_scores.tolist() if beam else [None] * len(texts)
        for row, (text, value) in enumerate(zip(texts, scores, strict=True)):
            i = index[row // nbest]
            if not alignments:
                outputs[i].append((text.strip(), value))
                continue
            source_words = (_words_by_offsets(sentences[i], encoding["offset_mapping"][i]) if offsets
                            else _words_by_decoding(tokenizer, encoded[i]))  # fmt: skip
            output_ids = generated.sequences[row, 1:].tolist()
            if tokenizer.eos_token_id in output_ids:  # the padding after EOS has no words to find
                output_ids = output_ids[: output_ids.index(tokenizer.eos_token_id)]
            target_words = _words_by_decoding(tokenizer, output_ids)
            pairs = word_alignment(generated.alignments[row].tolist(), source_words, target_words)
            outputs[i].append((text.strip(), value, pairs))
    return outputs


def lexical_ids(tokenizer: PreTrainedTokenizerBase, texts: list, kind: str, count: int,
                first_line: int = 1) -> list[list[list[int]]]:  # fmt: skip
    """Token ids of each sentence's constraint phrases (`texts[i]` a list of phrases) or target prefix (`texts[i]`
    a string, "" for none; returned as a one-phrase list): a phrase the vocabulary cannot spell (<unk>) or that
    is blank stops with the line it is on (`first_line` numbers the first sentence)."""
    if len(texts) != count:
        raise ValueError(f"{count} sentences but {len(texts)} {kind} lines: give one per sentence (an empty one for "
                         "none).")  # fmt: skip
    unknown = tokenizer.unk_token_id
    result = []
    for line, entry in enumerate(texts, first_line):
        phrases = ([entry] if entry else []) if kind == "prefix" else entry
        ids = []
        for phrase in phrases:
            tokens = tokenizer(phrase, add_special_tokens=False)["input_ids"] if phrase.strip() else []
            if not tokens:
                raise ValueError(f"{kind} line {line}: a blank {kind} ({phrase!r}); leave the line empty for none.")
            if unknown is not None and unknown in tokens:
                raise ValueError(f"{kind} line {line}: {phrase!r} has characters the vocabulary cannot spell (it "
                                 "becomes <unk>), so no translation can contain it.")  # fmt: skip
            ids.append(tokens)
        result.append(ids)
    return result


def word_start_ids(tokenizer: PreTrainedTokenizerBase) -> list[int] | None:
    """The ids of the tokens that begin a word, so that a constraint "sieben" is not met by the first piece of
    "siebenundzwanzig": tokens marked as word-initial ("▁" of SentencePiece and Metaspace, "Ġ" of byte-level
    BPE) or not starting with a letter or digit (punctuation), or with WordPiece every token not marked "##";
    special tokens too. None when the vocabulary marks neither (phrases then match on tokens alone)."""
    vocabulary = tokenizer.get_vocab()
    if any(token.startswith(("▁", "Ġ")) for token in vocabulary):
        starts = [i for token, i in vocabulary.items() if token.startswith(("▁", "Ġ")) or not token[:1].isalnum()]
    elif any(token.startswith("##") for token in vocabulary):
        starts = [i for token, i in vocabulary.items() if not token.startswith("##")]
    else:
        return None
    return sorted(set(starts) | set(tokenizer.all_special_ids))


def word_alignment(pairs: list[list[int]], source_words: list[int | None], target_words: list[int | None]) -> str:
    """Token-level (source, target) position pairs (`generate(return_alignments=True)`) as Moses word alignment:
    "i-j" for every word pair linked by a pair of their subword pieces, sorted, each once."""
    links = {(source_words[s], target_words[t]) for s, t in pairs if s < len(source_words) and t < len(target_words)}
    return " ".join(f"{i}-{j}" for i, j in sorted(link for link in links if None not in link))


def _words_by_offsets(text: str, offsets: list[tuple[int, int]]) -> list[int | None]:
    """Each token's whitespace-separated word in `text`, from the tokenizer's character offsets (exact even where
    the vocabulary lacks characters); None for tokens without text (EOS)."""
    starts = [match.start() for match in re.finditer(r"\S+", text)]
    return [bisect.bisect_right(starts, end - 1) - 1 if end > start else None for start, end in offsets]


def _words_by_decoding(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[int | None]:
    """Each token's whitespace-separated word in the decoded text, found by decoding every prefix of `ids` (for
    outputs, and for tokenizers without offsets); None for special tokens."""
    special = set(tokenizer.all_special_ids)
    texts = tokenizer.batch_decode([ids[: i + 1] for i in range(len(ids))], skip_special_tokens=True)
    return [None if token in special else max(len(text.split()) - 1, 0) for token, text in zip(ids, texts, strict=True)]


def translate_stream(
    model: VaswaniForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    lines: Iterable[str],
    window: int = 10_000,
    progress: bool = False,
    total: int | None = None,
    constraints: Iterable[list[str]] | None = None,
    prefixes: Iterable[str] | None = None,
    **translate_kwargs,
) -> Iterator[list[tuple]]:
    """`translate_nbest` (which takes `translate_kwargs`) for inputs of any size: reads `window` lines at a time
    (with their `constraints` and `prefixes`, read in step), translates them (sorted by length, batched by tokens)
    and yields each line's n-best in input order before reading on, so memory holds one window whatever the
    input's length. `progress` shows a bar over the lines (`total` of them, if known).

    A whole input of one batch (`one_search`) is decoded with the model's own products: the CPU fast products
    choose their way by stopwatch on a process's first searches, which cannot pay for itself within one search."""
    lexical = {name: value for name, value in (("constraints", constraints), ("prefixes", prefixes))
               if value is not None}  # fmt: skip
    rows = _side_by_side(lines, *lexical.values(), names=["input", *lexical])
    first_line = 1
    with tqdm(total=total, desc="translating", unit="line", disable=not progress) as bar:
        while chunk := list(itertools.islice(rows, window)):
            if first_line == 1 and one_search(model, len(chunk), window, translate_kwargs):
                translate_kwargs = {"cpu_fast_paths": False, **translate_kwargs}
            columns = [list(column) for column in zip(*chunk, strict=True)]
            extra = dict(zip(lexical, columns[1:], strict=True))
            yield from translate_nbest(model, tokenizer, columns[0], progress=False, first_line=first_line, **extra,
                                       **translate_kwargs)  # fmt: skip
            first_line += len(chunk)
            bar.update(len(chunk))


def one_search(model, lines: int, window: int, translate_kwargs: dict) -> bool:
    """Whether a stream whose first window read `lines` lines is one batch of one search: the window ended before
    it was full (the input ended) and holds no more lines than a batch. Such a job is decoded with the model's own
    products (`cpu_fast_paths=False`, the same tokens), unless the caller chose: the fast products time their ways
    on a process's first searches (`speed/fast_products.py`), 12 steps per way of the decoder's linears (4, 5 at
    1-3 rows) and then of the output projection (4 to 5) before one is kept, building a packed copy of every weight
    for it, and its first step times the output projection's ways apart (`_fastest`), so a job of one search pays
    the trial and ends before or soon after a way is kept. A choice kept in a file for later processes would let
    one timed while a neighbour ran hold for every later run, so none is kept. A user who set `VASWANI_CPU_FAST_PATHS`
    chose too: their setting holds."""
    from ..model.generation_vaswani import VaswaniGenerationMixin

    batch = translate_kwargs.get("batch_size", inspect.signature(translate_nbest).parameters["batch_size"].default)
    chosen = "cpu_fast_paths" in translate_kwargs or os.environ.get("VASWANI_CPU_FAST_PATHS", "").strip()
    return isinstance(model, VaswaniGenerationMixin) and not chosen and lines < window and lines <= batch


def _side_by_side(*streams: Iterable, names: list[str]) -> Iterator[tuple]:
    """The streams' items in step; streams of different lengths stop with an error naming them."""
    end = object()
    for number, row in enumerate(itertools.zip_longest(*streams, fillvalue=end), 1):
        if any(item is end for item in row):
            short = [name for name, item in zip(names, row, strict=True) if item is end]
            raise ValueError(f"{' and '.join(short)} ended at line {number - 1}, before the other lines: give one "
                             "line per input line (an empty line for none).")  # fmt: skip
        yield row


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
    metrics: Iterable[str] = (),
    **generate_kwargs,
) -> tuple[dict, list[str]]:
    """Translate the sources of `pairs` and score them against the targets (`score`, with the `metrics` asked for
    beside BLEU and chrF): (metrics, translations)."""
    hypotheses = translate(model, tokenizer, [source for source, _ in pairs], batch_size, **generate_kwargs)
    return score(hypotheses, [target for _, target in pairs], metrics), hypotheses


def score_translations(
    model: VaswaniForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    targets: list[str],
    batch_size: int = 32,
    progress: bool = True,
    long_lines: str = "error",
) -> list[dict]:
    """Forced decoding: log p(target | source) under the model, per sentence and per target token (EOS included),
    in natural log, without label smoothing or length penalty: what `fairseq-generate --score-reference` and
    `marian-scorer` compute, for filtering parallel data and reranking n-best lists. A pair with a side longer
    than the model reads is never cut (the score of a cut sentence is not the sentence's): every such pair is
    named in one error, or, with `long_lines="skip"` (fairseq's `--skip-invalid-size-inputs-valid-test`), named
    in a warning and given `{"skipped": why}` in its place."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source lines but {len(targets)} target lines: the files must be aligned.")
    if long_lines not in SCORE_LONG_LINES:
        raise ValueError(f"long lines: choose one of {', '.join(SCORE_LONG_LINES)}, not {long_lines!r}.")
    limit = source_limit(model, tokenizer)
    long = long_pairs(tokenizer, sources, targets, limit)
    if long and long_lines == "error":
        named = "; ".join(f"line {index + 1}: {why}" for index, why in long.items())
        raise ValueError(f"{len(long)} of {len(sources)} pairs are longer than the model reads, and a cut sentence's "
                         f"score is not the sentence's ({named}): shorten or remove them, or skip them "
                         "(--long-lines skip).")  # fmt: skip
    model.eval()
    results: list[dict] = [{} for _ in sources]
    for index, why in long.items():
        logger.warning("line %d: %s: skipped", index + 1, why)
        results[index] = {"skipped": why}
    kept = [i for i in range(len(sources)) if i not in long]
    for chosen in _batches([len(sources[i]) + len(targets[i]) for i in kept], batch_size, progress, "scoring"):
        index = [kept[i] for i in chosen]
        batch = tokenizer([sources[i] for i in index], text_target=[targets[i] for i in index], return_tensors="pt",
                          padding=True, truncation=False)  # fmt: skip
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


def score(hypotheses: list[str], references: list[str], metrics: Iterable[str] = ()) -> dict:
    """Cased, detokenized corpus BLEU and chrF (section 6.1) with their signatures, and the `metrics` asked for
    (`vaswani_hf.translation.metrics`: packaged names, local 🤗 Evaluate modules, Hub ids when online)."""
    from .metrics import load_metrics, score_with  # not at the top: `vaswani translate` scores nothing

    return score_with(load_metrics(metrics), hypotheses, references)
