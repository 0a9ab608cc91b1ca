"""A speed trick for tokenizing a corpus: each distinct word is run through the tokenizer once per shard, and the
sentences are assembled from their words' ids with numpy.

Why it is exact: the shared BPE (`tokenization.train_shared_bpe`) has no normalizer, its pre-tokenizer splits at
spaces first (Metaspace, "▁" before every word) and then only inside a word (punctuation), and BPE merges never
cross a pre-token. So a sentence's ids are its space-separated words' ids, each word tokenized alone, followed by
</s>. The trick applies only to tokenizers built exactly so (`applies`), and only to sentences where that argument
holds word by word (`simple_rows`: no empty text, no space at either end, no two spaces in a row, no "▁", no
special token written out); every other sentence goes through the tokenizer whole. On a WMT-shaped corpus a word
occurs about eight times per 100,000 sentences, so most of the tokenizer's work is skipped.

Off with `VASWANI_WORD_TOKENIZING=0`; `tests/test_preparation.py` checks that both paths give the same ids.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

METASPACE = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
PUNCTUATION = {"type": "Punctuation", "behavior": "Isolated"}


def applies(tokenizer: Tokenizer) -> bool:
    """Whether the trick is on (`VASWANI_WORD_TOKENIZING`) and `tokenizer` is built as `train_shared_bpe` builds
    one, the only kind it is exact for. (Parses the tokenizer's JSON: ask once per split, not per batch.)"""
    if os.environ.get("VASWANI_WORD_TOKENIZING", "1") == "0" or not isinstance(tokenizer, Tokenizer):
        return False
    spec = json.loads(tokenizer.to_str())
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    template = (spec.get("post_processor") or {}).get("single") or []
    ends_with_eos = [list(step) for step in template] == [["Sequence"], ["SpecialToken"]]
    return (spec.get("normalizer") is None and steps in ([METASPACE], [METASPACE, PUNCTUATION])
            and spec["model"].get("type") == "BPE" and not spec["model"].get("dropout")
            and ends_with_eos and template[1]["SpecialToken"]["id"] == "</s>")  # fmt: skip


def simple_rows(texts: pa.Array, tokenizer: Tokenizer) -> np.ndarray:
    """Which texts are the concatenation of their words' tokenizations (see the module's docstring)."""
    # one pass of one regular expression: the special tokens written out are alternatives beside the spaces
    specials = [re.escape(token.content) for token in tokenizer.get_added_tokens_decoder().values()]
    pattern = "|".join([r"^ | $|  |▁", *specials])
    tricky = pc.or_(pc.equal(pc.utf8_length(texts), 0), pc.match_substring_regex(texts, pattern))
    return ~tricky.to_numpy(zero_copy_only=False)


CACHED_WORDS = 2_000_000  # a worker forgets its words past this many (about 300 MB)


def encode_words(tokenizer: Tokenizer, texts: pa.Array, cache: dict[str, list[int]]) -> pa.ListArray:
    """The ids of simple `texts` with </s>, as `tokenizer.encode_batch` would give them, from one tokenization of
    each distinct word; `cache` keeps the words' ids from one call to the next (one tokenizer per cache)."""
    words = pc.split_pattern(texts, " ")
    distinct = pc.dictionary_encode(words.flatten())
    vocabulary = distinct.dictionary.to_pylist()
    encoded = list(map(cache.get, vocabulary))
    new = [i for i, ids in enumerate(encoded) if ids is None]
    if len(cache) + len(new) > CACHED_WORDS:
        cache.clear()
    for i, encoding in zip(new, tokenizer.encode_batch_fast([vocabulary[i] for i in new], add_special_tokens=False),
                           strict=True):  # fmt: skip
        encoded[i] = cache[vocabulary[i]] = encoding.ids
    word_lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    word_ids = np.fromiter((i for ids in encoded for i in ids), np.int32, int(word_lengths.sum()))
    word_starts = np.concatenate([[0], np.cumsum(word_lengths)[:-1]])
    codes = distinct.indices.to_numpy(zero_copy_only=False)
    lengths = word_lengths[codes]  # tokens of each word as it occurs
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    tokens = word_ids[np.repeat(word_starts[codes] - (ends - lengths), lengths) + np.arange(total)]
    # each sentence's tokens, then its </s>
    sentence_ends = np.concatenate([[0], ends])[words.offsets.to_numpy()[1:]]
    offsets = np.concatenate([[0], sentence_ends + np.arange(1, len(texts) + 1)])
    flat = np.empty(offsets[-1], np.int32)
    eos = np.zeros(offsets[-1], bool)
    eos[offsets[1:] - 1] = True
    flat[eos] = tokenizer.token_to_id("</s>")
    flat[~eos] = tokens
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat))


def encode_texts(tokenizer: Tokenizer, texts: pa.Array, slow, cache: dict[str, list[int]]) -> pa.ListArray:
    """`encode_words` for the simple texts, `slow(list of texts)` (the tokenizer whole) for the others, in order."""
    simple = simple_rows(texts, tokenizer)
    if simple.all():
        return encode_words(tokenizer, texts, cache)
    fast_rows, slow_rows = np.flatnonzero(simple), np.flatnonzero(~simple)
    parts = [encode_words(tokenizer, texts.take(fast_rows), cache), slow(texts.take(slow_rows).to_pylist())]
    return pa.concat_arrays(parts).take(np.argsort(np.concatenate([fast_rows, slow_rows]), kind="stable"))
