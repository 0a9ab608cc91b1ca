"""A parser's tree-constrained search (`parsing.constraint`) on sentences of Penn-Treebank-style trees (the built-in
treebank's, raw files' function tags and traces cleaned away): in Transformers' own generation loop (sampling,
repetition_penalty, attention outputs), at a tight length limit, and refused for a vocabulary without the tree
symbols. The model is tiny and untrained: whatever it prefers, every output must be a tree of the sentence."""

import pytest
import torch
from transformers import AutoTokenizer, LogitsProcessor

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.data.tokenization import train_shared_bpe
from vaswani_hf.parsing.builtin_treebank import builtin_treebank
from vaswani_hf.parsing.constraint import tree_constraint_factory
from vaswani_hf.parsing.linearization import to_tree
from vaswani_hf.parsing.task import make_parser
from vaswani_hf.parsing.treebank import sentence_pairs


@pytest.fixture(scope="module")
def parser():
    """A random tiny parse model of the built-in treebank's labels, its tokenizer (tree symbols whole, as
    `vaswani train --task parse` makes it), and held-out sentences as word lists."""
    splits = builtin_treebank(train_size=300, test_size=12)
    labels = {"phrase_labels": set(), "tags": set()}
    train = list(sentence_pairs(splits["train"], "tags", labels))
    symbols = {symbol for _, target in train for symbol in target.split()}
    tokenizer = train_shared_bpe((words for words, _ in train), 200, split_punctuation=False, whole_words=symbols)
    ids = {f"{name}_token_id": tokenizer.convert_tokens_to_ids(token) for name, token in
           (("pad", "<pad>"), ("bos", "<s>"), ("eos", "</s>"), ("unk", "<unk>"), ("decoder_start", "<s>"))}  # fmt: skip
    torch.manual_seed(0)
    config = VaswaniConfig.tiny(vocab_size=len(tokenizer), **ids)
    model = VaswaniForConditionalGeneration(config).eval()
    make_parser(model, {"form": "tags", **{name: sorted(values) for name, values in labels.items()}})
    sentences = [words.split() for words, _ in sentence_pairs(splits["test"])]
    return model, tokenizer, sentences


def trees_of(model, tokenizer, sentences, sequences):
    """Each output (num_return_sequences rows a sentence) as a tree over its sentence, and what had to be mended."""
    texts = tokenizer.batch_decode(sequences, skip_special_tokens=True)
    per = len(texts) // len(sentences)
    parsing = model.config.parsing
    return [to_tree(text, sentences[i // per], parsing["phrase_labels"], parsing["tags"]) for i, text in
            enumerate(texts)]  # fmt: skip


def constrained(model, tokenizer, sentences):
    batch = tokenizer([" ".join(words) for words in sentences], return_tensors="pt", padding=True)
    (constraint,) = tree_constraint_factory(tokenizer, model.config.parsing)(batch.input_ids)
    return batch, constraint


class EveryRowKeepsACandidate(LogitsProcessor):
    """Placed after the constraint: records whether any row was left with no finite score (the search would then
    pick an impossible token, and sampling would fail on a probability row of NaN)."""

    def __init__(self):
        self.steps, self.rows_without = 0, 0

    def __call__(self, input_ids, scores):
        self.steps += 1
        self.rows_without += int((~torch.isfinite(scores).any(1)).sum())
        return scores


@pytest.mark.parametrize(
    "how",
    [
        {"do_sample": True, "num_beams": 1, "num_return_sequences": 2},
        {"repetition_penalty": 1.2, "num_beams": 3},
        {"output_attentions": True, "return_dict_in_generate": True, "num_beams": 1},
    ],
    ids=["sampling", "repetition_penalty", "output_attentions"],
)
def test_the_constraint_runs_in_transformers_own_loop(parser, how):
    # these settings hand generate() to Transformers' loop, which calls each processor as processor(ids, scores)
    model, tokenizer, sentences = parser
    sentences = sentences[:3]
    batch, constraint = constrained(model, tokenizer, sentences)
    torch.manual_seed(0)
    output = model.generate(**batch, logits_processor=[constraint], **how)
    sequences = output.sequences if how.get("return_dict_in_generate") else output
    assert sequences.shape[0] == len(sentences) * how.get("num_return_sequences", 1)
    for tree, repair in trees_of(model, tokenizer, sentences, sequences):
        assert not repair, repair  # the constraint kept every output a tree of its sentence: nothing to mend
        assert tree.label == "TOP" and tree.words() in sentences


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize("limit_by", ["max_new_tokens", "max_length_offset"])
@pytest.mark.parametrize("extra", [0, 2, 5])
def test_a_sentence_at_the_length_limit_gets_a_tree_of_all_its_words(parser, num_beams, limit_by, extra):
    # room for the sentence's tags, `extra` more symbols and the end: the constraint must stop opening
    # constituents in time and close what is open, whether the search stops at max_new_tokens or forces EOS at
    # the per-example limit (source length + max_length_offset)
    model, tokenizer, sentences = parser
    for words in sentences[3:6]:
        batch, constraint = constrained(model, tokenizer, [words])
        budget = len(words) + extra + 1
        if limit_by == "max_new_tokens":
            limit = {"max_new_tokens": budget}
        else:
            limit = {"max_length_offset": budget - int(batch.attention_mask.sum())}
        watch = EveryRowKeepsACandidate()
        sequences = model.generate(**batch, logits_processor=[constraint, watch], num_beams=num_beams,
                                   num_return_sequences=num_beams, **limit)  # fmt: skip
        assert watch.steps and watch.rows_without == 0
        assert sequences.shape[1] <= budget + 1  # the start symbol, then at most the budget
        for tree, repair in trees_of(model, tokenizer, [words], sequences):
            assert not repair, repair  # every word tagged in place, every constituent closed: not mended
            assert tree.words() == words


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_limit_shorter_than_the_sentence_still_gives_a_tree_of_its_words(parser, num_beams):
    # no tree fits: the constraint tags what it can and ends at the limit; never a row of nothing but -inf
    model, tokenizer, sentences = parser
    words = max(sentences, key=len)
    batch, constraint = constrained(model, tokenizer, [words])
    watch = EveryRowKeepsACandidate()
    offset = len(words) - 2 - int(batch.attention_mask.sum())  # a limit of two tokens fewer than the words
    sequences = model.generate(**batch, logits_processor=[constraint, watch], num_beams=num_beams,
                               max_length_offset=offset)  # fmt: skip
    assert watch.steps == len(words) - 2 and watch.rows_without == 0
    ((tree, repair),) = trees_of(model, tokenizer, [words], sequences)
    assert tree.words() == words
    # the words it had room for have tags of the treebank (not an empty output repaired into a flat tree)
    assert repair.missing_tags <= 3 and repair.unknown_tokens == 0


def test_the_constraint_stops_opening_when_only_the_closings_fit(parser):
    model, tokenizer, sentences = parser
    words = "The company said .".split()
    batch, constraint = constrained(model, tokenizer, [words])
    vocabulary = tokenizer.get_vocab()
    parsing = model.config.parsing

    def allowed(prefix: str, remaining: int) -> set[str]:
        ids = [model.config.decoder_start_token_id] + [vocabulary["\u2581" + s] for s in prefix.split()]
        constraint.search_rows(torch.zeros(1, dtype=torch.long), torch.tensor([remaining]))
        scores = constraint(torch.tensor([ids]), torch.zeros(1, len(tokenizer)))
        names = tokenizer.convert_ids_to_tokens(torch.isfinite(scores[0]).nonzero().flatten().tolist())
        return {name.removeprefix("\u2581") for name in names}

    tags, labels = set(parsing["tags"]), set(parsing["phrase_labels"])
    # two tags, one open constituent: 2 tags + /S + the end = 4 tokens at least
    assert allowed("S NP DT NN /NP", 6) == tags | labels | {"/S"}  # an opening still fits with its closing
    assert allowed("S NP DT NN /NP", 5) == tags | {"/S"}
    assert allowed("S NP DT NN /NP", 4) == tags | {"/S"}
    assert allowed("S NP DT NN /NP VBD .", 2) == {"/S"}
    assert allowed("S NP DT NN /NP VBD . /S", 1) == {"</s>"}
    assert allowed("S NP DT", 3) == tags | {"/NP"}  # too short for a tree: tags and closings, never an opening
    assert allowed("S NP DT", 1) == {"</s>"}  # the last step ends, whatever is left open (to_tree mends it)
    # without a budget (Transformers' loop), the opening rule alone
    scores = constraint(torch.tensor([[model.config.decoder_start_token_id, vocabulary["\u2581S"]]]),
                        torch.zeros(1, len(tokenizer)))  # fmt: skip
    assert torch.isfinite(scores[0, vocabulary["\u2581NP"]])


def test_a_vocabulary_without_the_tree_symbols_is_refused_naming_them(parser, tmp_path):
    model, _, _ = parser
    # a translation checkpoint's vocabulary: words, no tree symbols
    texts = ["the dog saw a cat", "ein Hund sah eine Katze"] * 20
    translation = train_shared_bpe(texts, 60)
    translation.save_pretrained(tmp_path / "tok")
    translation = AutoTokenizer.from_pretrained(tmp_path / "tok")
    parsing = model.config.parsing
    needed = 2 * len(parsing["phrase_labels"]) + len(parsing["tags"])
    with pytest.raises(ValueError) as raised:
        tree_constraint_factory(translation, parsing)
    message = str(raised.value)
    assert f"{needed} of the {needed} tree symbols" in message
    assert "'/NP'" in message and "--task parse" in message and "--tokenizer" in message
    # the xx form needs the labels and XX only
    xx = {**parsing, "form": "xx"}
    with pytest.raises(ValueError, match=f"lacks {2 * len(parsing['phrase_labels']) + 1} of the"):
        tree_constraint_factory(translation, xx)
    # one symbol short is refused too: the search could never write that label
    tokenizer = parser[1]
    vocabulary = tokenizer.get_vocab()
    short = {**parsing, "tags": [*parsing["tags"], "NNPS"]}
    assert "\u2581NNPS" not in vocabulary
    with pytest.raises(ValueError, match=r"lacks 1 of the \d+ tree symbols .* as entries of their own \('NNPS'\)"):
        tree_constraint_factory(tokenizer, short)
