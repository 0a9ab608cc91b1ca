"""The parser's search kept to trees on its fast paths gives the trees and scores of the plain eager search: inside
the static-shape search (`speed.graph_search`, run on the CPU with `ReplayedStep`, which is how a CUDA graph's
step is covered here), for several batch shapes, greedy and beam search, a kept graph replayed for a later batch,
and a sentence at its length limit. Nothing here times anything."""

import pytest
import torch

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.data.tokenization import train_shared_bpe
from vaswani_hf.model.speed import graph_search
from vaswani_hf.model.speed.graph_search import fits
from vaswani_hf.parsing.builtin_treebank import builtin_treebank
from vaswani_hf.parsing.constraint import TreeConstraint, tree_constraint_factory
from vaswani_hf.parsing.linearization import to_tree
from vaswani_hf.parsing.task import make_parser
from vaswani_hf.parsing.treebank import sentence_pairs


@pytest.fixture(scope="module")
def parser():
    """A random tiny parse model of the built-in treebank's labels, its tokenizer (tree symbols whole, as
    `vaswani train --task parse` makes it) and held-out sentences. Untrained, it keeps opening constituents up to the
    constraint's limit, which grows with the sentence's words: sentences end at many lengths."""
    splits = builtin_treebank(train_size=100, test_size=16)
    labels = {"phrase_labels": set(), "tags": set()}
    train = list(sentence_pairs(splits["train"], "tags", labels))
    symbols = {symbol for _, target in train for symbol in target.split()}
    tokenizer = train_shared_bpe((words for words, _ in train), 200, split_punctuation=False, whole_words=symbols)
    ids = {f"{name}_token_id": tokenizer.convert_tokens_to_ids(token) for name, token in
           (("pad", "<pad>"), ("bos", "<s>"), ("eos", "</s>"), ("unk", "<unk>"), ("decoder_start", "<s>"))}  # fmt: skip
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=len(tokenizer), **ids)).eval()
    make_parser(model, {"form": "tags", **{name: sorted(values) for name, values in labels.items()}})
    sentences = sorted((words.split() for words, _ in sentence_pairs(splits["test"])), key=len)
    return model, tokenizer, sentences


def decode(model, tokenizer, sentences, graph: bool, **kwargs):
    batch = tokenizer([" ".join(words) for words in sentences], return_tensors="pt", padding=True)
    processors = tree_constraint_factory(tokenizer, model.config.parsing)(batch.input_ids)
    beams = kwargs.get("num_beams", 1)
    return model.generate(**batch, logits_processor=processors, graph_decoding=graph, return_dict_in_generate=True,
                          output_sequence_scores=beams > 1, **kwargs)  # fmt: skip


def assert_same(eager, graphed, beams):
    assert torch.equal(graphed.sequences, eager.sequences)
    if beams > 1:
        torch.testing.assert_close(graphed.sequences_scores, eager.sequences_scores, atol=1e-5, rtol=1e-5)


def test_the_tree_constraint_runs_inside_the_static_search(parser, monkeypatch):
    """The constraint declares static shapes, so the search that captures its step admits it; `graph_decoding=False`
    keeps the eager search."""
    model, tokenizer, sentences = parser
    ran = []
    graphed = graph_search.graphed_search

    def watched(*args):
        ran.append(1)
        return graphed(*args)

    monkeypatch.setattr(graph_search, "graphed_search", watched)
    decode(model, tokenizer, sentences[:2], graph=True, num_beams=4, max_new_tokens=20)
    assert ran == [1]
    decode(model, tokenizer, sentences[:2], graph=False, num_beams=4, max_new_tokens=20)
    assert ran == [1]
    assert TreeConstraint.static_shapes


@pytest.mark.parametrize("rows, num_beams", [(1, 1), (5, 1), (1, 4), (3, 4), (5, 7)])
def test_the_static_search_gives_the_eager_searchs_trees_and_scores(parser, rows, num_beams):
    """Sentences of different lengths in one batch end at different steps (a finished one stays in the static
    batch, its results frozen); a later batch of the same shape replays the kept step with its own words (the
    processor it was captured with is refilled)."""
    model, tokenizer, sentences = parser
    model.__dict__.pop("_decoding_graphs", None)  # no graph kept from another test
    kwargs = dict(num_beams=num_beams, num_return_sequences=min(2, num_beams), max_length_offset=16)
    first = sentences[:rows]  # sorted by length
    # the first batch captures; the same sentences in other rows replay its kept step with their own words; then
    # longer sentences (a longer step bucket grows the position table, which drops the kept steps)
    batches = [first, first[1:] + first[:1], sentences[rows : 2 * rows], sentences[2 * rows : 3 * rows]]
    ends = set()
    for number, batch in enumerate(batches):
        eager = decode(model, tokenizer, batch, graph=False, **kwargs)
        graphed = decode(model, tokenizer, batch, graph=True, **kwargs)
        assert_same(eager, graphed, num_beams)
        if number == 1:
            assert model._decoding_graphs.captures == 1
        per = eager.sequences.shape[0] // len(batch)
        texts = tokenizer.batch_decode(eager.sequences, skip_special_tokens=True)
        for i, text in enumerate(texts):
            tree, repair = to_tree(text, batch[i // per], model.config.parsing["phrase_labels"],
                                   model.config.parsing["tags"])  # fmt: skip
            assert not repair, repair
        ends |= set((eager.sequences == tokenizer.eos_token_id).int().argmax(1).tolist())
    assert len(ends) > 1  # sentences ended at several steps


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize("extra", [0, 3])
def test_a_sentence_at_its_length_limit_gets_the_same_tree_in_both_searches(parser, num_beams, extra):
    """A budget of the sentence's tags, `extra` more symbols and the end: the constraint closes the tree in time
    from each row's tokens left, which the static search hands it as a device tensor."""
    model, tokenizer, sentences = parser
    words = max(sentences, key=len)
    batch = tokenizer([" ".join(words)], return_tensors="pt")
    offset = len(words) + extra + 1 - int(batch.attention_mask.sum())
    kwargs = dict(num_beams=num_beams, max_length_offset=offset)
    eager = decode(model, tokenizer, [words], graph=False, **kwargs)
    graphed = decode(model, tokenizer, [words], graph=True, **kwargs)
    assert_same(eager, graphed, num_beams)
    assert eager.sequences.shape[1] <= len(words) + extra + 2  # the start symbol, then at most the budget
    text = tokenizer.decode(eager.sequences[0], skip_special_tokens=True)
    _, repair = to_tree(text, words, model.config.parsing["phrase_labels"], model.config.parsing["tags"])
    assert not repair, repair


def test_a_processor_that_declares_nothing_still_gets_the_eager_search(parser):
    model, tokenizer, sentences = parser
    batch = tokenizer([" ".join(sentences[0])], return_tensors="pt")
    (constraint,) = tree_constraint_factory(tokenizer, model.config.parsing)(batch.input_ids)
    config = model._resolved_config(None)
    assert fits(model._settings(config, None, "gnmt", [constraint], batch=1), model)

    class Reads(torch.nn.Module):  # any processor that says nothing of its shapes
        def forward(self, input_ids, scores):
            return scores

    assert not fits(model._settings(config, None, "gnmt", [constraint, Reads()], batch=1), model)


def test_the_captured_step_with_the_constraint_reads_nothing_from_the_device(parser, monkeypatch):
    """What a CUDA graph captures, the constraint included, with the model's checks in their capture mode: no op
    may read a device value on the host, or the capture would fail on a GPU."""
    from vaswani_hf.model import validation_vaswani
    from vaswani_hf.model.speed.graph_search import ReplayedStep

    from .test_graph_decoding import HostReads

    model, tokenizer, sentences = parser
    counter, replays = HostReads(), []
    replay = ReplayedStep.replay

    def counted_replay(self):
        replays.append(1)
        with counter:
            replay(self)

    monkeypatch.setattr(ReplayedStep, "replay", counted_replay)
    monkeypatch.setattr(validation_vaswani, "_capturing", lambda: True)
    for num_beams in (1, 4):
        replays.clear()
        decode(model, tokenizer, sentences[:3], graph=True, num_beams=num_beams, max_length_offset=8)
        assert len(replays) >= 4 and counter.count == 0
