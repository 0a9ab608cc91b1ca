"""The static-shape searches of speed/graph_search.py (the whole search step a CUDA graph on CUDA, kept across
calls) against the eager searches: the same tokens and scores, on the first call and on later calls that replay,
no device value read on the host per step, the kept graphs' keys, buckets, bound and lifetime, and the eager search
wherever a feature needs it.

On CPU the captured step is `ReplayedStep` (the step run again on the same buffers, which it checks did not move),
so every line of the graphed search runs; where CUDA is visible the `device` fixture also runs the parity tests on
CUDA, where the step is captured and replayed.
"""

import copy
import gc
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.model import validation_vaswani
from vaswani_hf.model.speed import graph_search
from vaswani_hf.model.speed.graph_search import (
    DONE_CHECK_EVERY,
    GraphedBeamSearch,
    GraphedGreedySearch,
    ReplayedStep,
    StaticBeamCacheLayer,
    bucket,
    graph_decoding,
)

from .test_decoding_parity import EOS, padded_batch, random_pair

# the ops that hand a device value to the host (`bool(t)`, `t.item()`, `int(t)`, `t.nonzero()`): each is a wait for
# the GPU, and none can be captured in a CUDA graph
HOST_READS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::item", "aten::is_nonzero")


class HostReads(TorchDispatchMode):
    """Counts the ops that read a device value on the host, except while `paused`."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and func._schema.name in HOST_READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def settings_for(seed: int) -> dict:
    num_beams = [1, 2, 4, 5][seed % 4]
    return dict(
        num_beams=num_beams, num_return_sequences=1 + seed % num_beams,
        early_stopping=[True, False, "never"][seed % 3], length_penalty=[0.6, 1.0, -0.5][seed % 3],
        length_penalty_type=["gnmt", "hf"][seed // 4 % 2], min_new_tokens=seed % 3,
        return_dict_in_generate=True, output_sequence_scores=num_beams > 1,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(16))
def test_the_static_search_gives_the_eager_searchs_tokens_and_scores(seed, device):
    _, model = random_pair(seed, paper_decoding=seed % 2 == 0)  # the paper's source + 50, or max_new_tokens
    model.to(device)
    input_ids, attention_mask = (x.to(device) for x in padded_batch(seed, batch=5))
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, **settings_for(seed))
    if seed % 2:
        kwargs.update(max_length_offset=None, max_new_tokens=4 + 2 * seed)
    eager = model.generate(graph_decoding=False, cpu_fast_paths=False, **kwargs)
    for _ in range(2):  # the first call captures its step, the second replays the kept one
        static = model.generate(graph_decoding=True, **kwargs)
        assert torch.equal(static.sequences, eager.sequences)
        if kwargs["num_beams"] > 1:
            torch.testing.assert_close(static.sequences_scores, eager.sequences_scores, atol=1e-5, rtol=1e-5)
    assert model._decoding_graphs.captures <= 1  # none where the search ended before its third step


@pytest.mark.parametrize("positions", ["sinusoidal", "sinusoidal_fairseq"])
@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_static_search_runs_past_the_sinusoid_table(num_beams, positions, device):
    """Source + 50 reaches past `max_position_embeddings` (64 in the tiny preset): the eager search grows the
    sinusoid table as it goes, the static search's gather cannot, so the decoder grows it to the static cache's end
    first. Without that, CUDA asserted 'index out of bounds' in `vaswani train`'s evaluation and CPU raised an
    IndexError."""
    torch.manual_seed(0)
    config = VaswaniConfig.tiny(eos_token_id=98, position_embedding_type=positions)
    model = VaswaniForConditionalGeneration(config).eval().to(device)
    input_ids = torch.randint(4, 90, (2, 30), device=device)
    kwargs = dict(input_ids=input_ids, num_beams=num_beams, max_length_offset=50, return_dict_in_generate=True)
    eager = model.generate(graph_decoding=False, cpu_fast_paths=False, **kwargs)
    static = model.generate(graph_decoding=True, **kwargs)
    assert eager.sequences.shape[1] > model.config.max_position_embeddings  # the case this test is about
    assert torch.equal(static.sequences, eager.sequences)


def test_the_parity_seeds_finish_sentences_at_many_lengths():
    """The parity test above means something only where sentences end at different steps, so that finished
    sentences' results stay frozen while others go on: random_pair's EOS bias makes most seeds do so."""
    ending_early = 0
    for seed in range(16):
        _, model = random_pair(seed, paper_decoding=seed % 2 == 0)
        input_ids, attention_mask = padded_batch(seed, batch=5)
        sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask, graph_decoding=True,
                                   **settings_for(seed)).sequences  # fmt: skip
        ends = (sequences == EOS).int().argmax(dim=1)
        ending_early += bool(((ends > 0) & (ends < sequences.shape[1] - 1)).any() and len(set(ends.tolist())) > 1)
    assert ending_early >= 8


def test_the_static_search_reads_the_device_only_every_few_steps(monkeypatch):
    """The steps themselves (a graph's replay on CUDA) are left out; what is counted is the search's bookkeeping.
    The eager search, which drops finished sentences, reads at every step: the counter can tell."""
    _, model = random_pair(1)
    input_ids, attention_mask = padded_batch(1)
    counter = HostReads()
    for search in (GraphedGreedySearch, GraphedBeamSearch):

        def uncounted_step(self, advance=search.advance):
            counter.paused = True
            try:
                return advance(self)
            finally:
                counter.paused = False

        monkeypatch.setattr(search, "advance", uncounted_step)

    def reads(new_tokens: int, num_beams: int, graphs: bool) -> int:
        counter.count = 0
        with counter:
            model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams,
                           max_length_offset=None, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           graph_decoding=graphs, cpu_fast_paths=False)  # fmt: skip
        return counter.count

    for num_beams in (1, 4):
        # 32 more steps: one read per DONE_CHECK_EVERY steps
        assert reads(64, num_beams, True) - reads(32, num_beams, True) == 32 // DONE_CHECK_EVERY
        assert reads(64, num_beams, False) - reads(32, num_beams, False) >= 32


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_captured_step_reads_nothing_from_the_device(num_beams, monkeypatch):
    """What a CUDA graph captures (the whole step: cache reordering, decoder, output projection, log-softmax, every
    step-dependent logits rule, top-k, the beam update) with the model's checks in their capture mode: no op may
    read a device value, or the capture would fail on a GPU."""
    _, model = random_pair(2)
    model.generation_config.update(forced_bos_token_id=7, forced_eos_token_id=EOS, suppress_tokens=[5])
    input_ids, attention_mask = padded_batch(2)
    counter, replays = HostReads(), []
    replay = ReplayedStep.replay

    def counted_replay(self):
        replays.append(1)
        with counter:
            replay(self)

    monkeypatch.setattr(ReplayedStep, "replay", counted_replay)
    monkeypatch.setattr(validation_vaswani, "_capturing", lambda: True)
    model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams, min_new_tokens=3,
                   renormalize_logits=True, graph_decoding=True)  # fmt: skip
    assert len(replays) >= 4 and counter.count == 0


def new_tokens(model, input_ids, **kwargs) -> torch.Tensor:
    return model.generate(input_ids=input_ids, max_length_offset=None, max_new_tokens=10, cpu_fast_paths=False,
                          **kwargs)  # fmt: skip


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_call_of_a_kept_shape_replays_its_graph_with_its_own_inputs(num_beams, device):
    """Another batch of the same rows whose sources fall in the same length bucket: no capture, and the eager
    search's tokens for its own inputs (not the first call's)."""
    _, model = random_pair(4)
    model.to(device)
    first, second = torch.randint(4, 90, (3, 9), device=device), torch.randint(4, 90, (3, 12), device=device)
    assert bucket(9 + 1) == bucket(12 + 1)
    new_tokens(model, first, num_beams=num_beams, graph_decoding=True)
    again = new_tokens(model, second, num_beams=num_beams, graph_decoding=True)
    assert model._decoding_graphs.captures == 1
    assert torch.equal(again, new_tokens(model, second, num_beams=num_beams, graph_decoding=False))


def test_buckets_hold_nearby_lengths_with_little_padding():
    assert [bucket(n) for n in (1, 15, 16, 17, 64, 65, 128, 129, 200, 1000)] == [
        16, 16, 16, 32, 64, 80, 128, 144, 208, 1024
    ]  # fmt: skip
    assert all(n <= bucket(n) <= n + max(15, n // 8) for n in range(1, 3000))


def test_kept_graphs_are_bounded_least_recently_used_first(monkeypatch):
    monkeypatch.setenv("VASWANI_GRAPH_CACHE", "2")
    _, model = random_pair(5)
    batches = [torch.randint(4, 90, (rows, 6)) for rows in (1, 2, 3)]
    for ids in batches:  # three shapes, two kept: the first is dropped
        new_tokens(model, ids, num_beams=4, graph_decoding=True)
    graphs = model._decoding_graphs
    assert (graphs.captures, len(graphs.searches)) == (3, 2)
    new_tokens(model, batches[2], num_beams=4, graph_decoding=True)  # kept: replayed
    assert graphs.captures == 3
    new_tokens(model, batches[0], num_beams=4, graph_decoding=True)  # dropped: captured again
    assert graphs.captures == 4
    assert [key.rows for key in graphs.searches] == [3, 1]


def test_kept_graphs_follow_the_weights_and_go_with_the_model():
    """Resized embeddings are new tensors (a kept graph would read the old ones): every kept graph is dropped and
    the next call captures anew. A copied model keeps none; a deleted model frees its graphs."""
    _, model = random_pair(6)
    ids = torch.randint(4, 90, (2, 7))
    new_tokens(model, ids, num_beams=4, graph_decoding=True)
    model.resize_token_embeddings(model.config.vocab_size + 8)
    resized = new_tokens(model, ids, num_beams=4, graph_decoding=True)
    assert model._decoding_graphs.captures == 2
    assert torch.equal(resized, new_tokens(model, ids, num_beams=4, graph_decoding=False))
    twin = copy.deepcopy(model)
    assert not twin._decoding_graphs.searches and torch.equal(new_tokens(twin, ids, num_beams=4), resized)
    kept = weakref.ref(next(iter(model._decoding_graphs.searches.values())))
    del model, twin
    gc.collect()
    assert kept() is None


def test_a_replay_refuses_a_buffer_that_moved():
    """A graph reads the addresses it captured: a step that rebinds a buffer instead of writing into it would
    replay on stale memory on a GPU, so the CPU's stand-in fails."""
    _, model = random_pair(7)
    ids = torch.randint(4, 90, (2, 7))
    new_tokens(model, ids, num_beams=4, graph_decoding=True)
    search = next(iter(model._decoding_graphs.searches.values()))
    search.tokens = search.tokens.clone()
    with pytest.raises(RuntimeError, match="moved"):
        new_tokens(model, ids, num_beams=4, graph_decoding=True)


def test_the_static_cache_reorders_beams_in_place():
    layer = StaticBeamCacheLayer(max_cache_len=4)
    keys = torch.arange(3 * 2 * 1 * 2, dtype=torch.float).view(3, 2, 1, 2)
    layer.update(keys, -keys)
    address = layer.keys.data_ptr()
    layer.reorder_cache(torch.tensor([2, 0, 0]))
    assert layer.keys.data_ptr() == address
    assert torch.equal(layer.keys[:, :, 0], keys[[2, 0, 0], :, 0])
    assert torch.equal(layer.values[:, :, 0], -keys[[2, 0, 0], :, 0])


@pytest.mark.parametrize(
    "feature",
    [
        dict(target_prefix=[[5, 6]]),
        dict(force_words_ids=[[7]]),
        dict(vocabulary_shortlist=list(range(200))),
        dict(bad_words_ids=[[9]]),
        dict(output_scores=True, return_dict_in_generate=True),
    ],
    ids=["prefix", "constraints", "shortlist", "bad_words", "per_step_scores"],
)
def test_features_that_need_the_eager_search_get_it(feature, monkeypatch):
    _, model = random_pair(3)
    input_ids, attention_mask = padded_batch(3, batch=1)
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=4, max_new_tokens=6,
                  max_length_offset=None, cpu_fast_paths=False, **feature)  # fmt: skip
    eager = model.generate(graph_decoding=False, **kwargs)

    def refuse(*args):
        raise AssertionError("the static search ran")

    monkeypatch.setattr(graph_search, "graphed_search", refuse)
    same = model.generate(graph_decoding=True, **kwargs)
    sequences = same.sequences if hasattr(same, "sequences") else same
    assert torch.equal(sequences, eager.sequences if hasattr(eager, "sequences") else eager)


def test_graph_decoding_is_on_for_cuda_unless_switched_off(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("VASWANI_GRAPH_DECODING", raising=False)
    assert (graph_decoding(None, cpu), graph_decoding(None, cuda)) == (False, True)
    assert graph_decoding(False, cuda) is False and graph_decoding(True, cpu) is True
    monkeypatch.setenv("VASWANI_GRAPH_DECODING", "0")
    assert graph_decoding(None, cuda) is False
    monkeypatch.setenv("VASWANI_GRAPH_DECODING", "1")
    assert graph_decoding(None, cpu) is True


def test_the_gpu_benchmark_runs_and_its_checks_hold(tmp_path):
    """benchmarks/gpu.py's smoke run (tiny sizes, CPU): every case is timed, and the graphed search's outputs are
    checked against the eager search's before any timing."""
    out = tmp_path / "gpu.md"
    script = Path(__file__).parents[1] / "benchmarks" / "gpu.py"
    subprocess.run([sys.executable, str(script), "--quick", "--device", "cpu", "--out", str(out)], check=True,
                   capture_output=True)  # fmt: skip
    text = out.read_text()
    assert text.count("graphed tokens equal") == 2 and "DIFFER" not in text
    for case in ("train", "greedy-b1", "beam4-b1", "beam4-b64", "beam4-b64-bf16", "greedy-b256-bf16"):
        assert f"## {case}\n" in text
