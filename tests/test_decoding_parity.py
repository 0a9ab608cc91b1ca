"""The searches of search_vaswani.py (with and without the CPU fast products) against Transformers' beam search and
greedy search on the same weights.

Random paper-style Marian models (converted with `marian_to_vaswani`) over many seeds: with
`length_penalty_type="hf"` and `max_length_offset=None` our sequences must equal Marian's `generate()` and the
scores must match. The output bias on EOS varies per seed so that hypotheses end at many different lengths, which
is what exercises the finished-hypothesis bookkeeping, early stopping and sentences leaving the batch.
"""

import pytest
import torch
from transformers import MarianMTModel

from vaswani_hf.interop.convert.marian import convert_marian_checkpoint, marian_to_vaswani
from vaswani_hf.model.decoding_state_vaswani import DecodingState

from .helpers import forget_measured_ways, paper_marian_config

PAD, EOS = 1499, 0  # a vocabulary of 1,500: enough chunks for the two-stage top-k (search_vaswani.py)


def random_pair(seed: int, paper_decoding: bool = False, biases: bool = False):
    torch.manual_seed(seed)
    # init_std 0.4, not Marian's 0.02: with tiny weights every source gives the same logits, and the output bias
    # alone would decide where hypotheses end
    config = paper_marian_config(vocab_size=1500, d_model=16, encoder_attention_heads=2, decoder_attention_heads=2,
                                 pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=EOS,
                                 init_std=0.4)  # fmt: skip
    marian = MarianMTModel(config).eval()
    with torch.no_grad():
        marian.final_logits_bias.normal_(std=0.5)
        marian.final_logits_bias[0, EOS] = 4.0 + seed % 4  # some seeds end at once, some midway, some at the limit
        for name, parameter in marian.named_parameters():
            if biases and name.endswith(("proj.bias", "fc1.bias", "fc2.bias")):
                parameter.normal_(std=0.4)  # Marian starts them at zero: a way that drops them would go unseen
    return marian, marian_to_vaswani(marian, paper_decoding=paper_decoding).eval()


def padded_batch(seed: int, batch: int = 4):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (batch,), generator=generator)
    input_ids = torch.randint(1, PAD, (batch, int(lengths.max())), generator=generator)
    for row, length in enumerate(lengths.tolist()):
        input_ids[row, length - 1] = EOS
        input_ids[row, length:] = PAD
    return input_ids, input_ids.ne(PAD).long()


def assert_same(ours, theirs, scores: bool):
    assert torch.equal(ours.sequences, theirs.sequences)
    if scores:
        torch.testing.assert_close(ours.sequences_scores, theirs.sequences_scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(24))
def test_beam_search_equals_transformers(seed, device):
    marian, vaswani = (model.to(device) for model in random_pair(seed))
    input_ids, attention_mask = (x.to(device) for x in padded_batch(seed))
    num_beams = 2 + seed % 7  # 2..8
    early_stopping = [True, False, "never"][seed % 3]
    kwargs = dict(
        input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams,
        num_return_sequences=1 + seed % num_beams, max_new_tokens=5 + seed % 11,
        length_penalty=[1.0, 0.6, -0.5][seed % 3],
        early_stopping=early_stopping, output_scores=True, return_dict_in_generate=True,
    )  # fmt: skip
    theirs = marian.generate(**kwargs)
    ours = vaswani.generate(length_penalty_type="hf", max_length_offset=None, **kwargs)
    assert_same(ours, theirs, scores=True)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_equals_transformers(seed, device):
    marian, vaswani = (model.to(device) for model in random_pair(seed))
    input_ids, attention_mask = (x.to(device) for x in padded_batch(seed, batch=5))
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=4 + 3 * seed,
                  return_dict_in_generate=True)  # fmt: skip
    assert_same(vaswani.generate(max_length_offset=None, **kwargs), marian.generate(**kwargs), scores=False)


@pytest.mark.parametrize(
    "way", ["_product_by_rows", "_product_by_columns", "_product_by_doubled_row", "_product_by_packed_weight"]
)
@pytest.mark.parametrize("seed", range(3))
def test_every_output_projection_way_decodes_as_transformers(seed, way, monkeypatch):
    # `output_logits` keeps whichever way measured fastest on this machine: each must give Transformers' results,
    # whatever memory layout it hands to the searches (batch 1 exercises the one-row ways, 3 the others)
    from vaswani_hf.model.speed import fast_products as fp

    forced = getattr(fp, way)
    monkeypatch.setattr(fp, "_FASTEST_PRODUCT", {})
    monkeypatch.setattr(fp, "_fastest", lambda ways, *args: forced if forced in ways else ways[1])
    monkeypatch.setattr(fp, "_output_phase", lambda *args: None)  # no timing on steps either
    marian, vaswani = random_pair(seed)
    for batch in (1, 3):
        input_ids, attention_mask = padded_batch(seed, batch=batch)
        for num_beams in (1, 3):
            kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=6,
                          output_scores=True, return_dict_in_generate=True)  # fmt: skip
            ours = vaswani.generate(length_penalty_type="hf", max_length_offset=None, **kwargs)
            assert_same(ours, marian.generate(**kwargs), scores=num_beams > 1)
    assert set(fp._FASTEST_PRODUCT.values()) <= {forced, fp._product_by_columns}


def test_the_packed_output_weight_follows_the_weights_and_is_dropped_where_unused(monkeypatch):
    # a model evaluated between training steps (Seq2SeqTrainer's predict_with_generate) must decode with its
    # current weights, not with the layout reordered before the optimizer changed them in place
    from vaswani_hf.model.speed import fast_products as fp

    _, vaswani = random_pair(0)
    weight, hidden = vaswani.get_output_embeddings().weight, torch.randn(4, vaswani.config.d_model)
    for _ in range(2):
        packed = fp._product_by_packed_weight(vaswani, weight, hidden)
        torch.testing.assert_close(packed, fp._product_by_rows(vaswani, weight, hidden))
        with torch.no_grad():
            weight.mul_(-2.0)  # an optimizer's in-place step
    with torch.inference_mode():  # weights made there have no version counter: never cached, still right
        frozen = weight.clone()
        expected = fp._product_by_rows(vaswani, frozen, hidden)
        torch.testing.assert_close(fp._product_by_packed_weight(vaswani, frozen, hidden), expected)
        assert frozen not in fp._PACKED_WEIGHTS
    # the reordered copy is as large as the weight: kept only while some number of rows decodes with it
    for chosen, kept in ((fp._product_by_rows, False), (fp._product_by_packed_weight, True)):
        monkeypatch.setattr(fp, "_FASTEST_PRODUCT", {})
        monkeypatch.setattr(
            fp, "_fastest", lambda ways, *args, chosen=chosen: (ways[-1](*args), chosen)[1]
        )  # packs, then picks
        fp.output_logits(vaswani, hidden)
        assert (weight in fp._PACKED_WEIGHTS) is kept


@pytest.mark.parametrize(
    "way", ["_linear_by_columns", "_linear_by_onednn_pack", "_linear_by_mkl_pack", "_linear_by_halves", "measured"]
)
def test_every_decoder_linear_way_decodes_as_transformers_and_the_layers_get_their_forward_back(way, monkeypatch):
    # `decoder_linears_for` binds the decoder's linear layers to whichever way measured fastest for a search's rows
    # on this machine (and the output projection may read MKL's pack, offered last): each way, forced, must keep
    # Transformers' tokens and scores, and the layers must be plain modules again afterwards
    from vaswani_hf.model.speed import fast_products as fp

    forced = getattr(fp, way, None)
    if forced is not None and forced not in fp._linear_ways():
        pytest.skip(f"{way} needs a torch built with {way.split('_')[-2]}")
    if forced is not None:
        monkeypatch.setattr(fp, "_fastest_linear_way", lambda *args: forced)
        monkeypatch.setattr(fp, "_FASTEST_PRODUCT", {})
        monkeypatch.setattr(fp, "_fastest", lambda ways, *args: ways[-1])
    marian, vaswani = random_pair(3, biases=True)
    linears = fp._step_linears(vaswani)
    # per layer: self-attention's fused input and its output, cross-attention's query and output, the FFN's two
    assert len(linears) == 6 * vaswani.config.decoder_layers
    packed_rows = []
    real_pack = fp.mkl_packed_weight
    monkeypatch.setattr(fp, "mkl_packed_weight", lambda w, rows: (packed_rows.append(rows), real_pack(w, rows))[1])
    for batch in (1, 3):
        input_ids, attention_mask = padded_batch(3, batch=batch)
        for num_beams in (1, 3):
            kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=6,
                          output_scores=True, return_dict_in_generate=True)  # fmt: skip
            ours = vaswani.generate(length_penalty_type="hf", max_length_offset=None, **kwargs)
            assert_same(ours, marian.generate(**kwargs), scores=num_beams > 1)
            assert not any("forward" in vars(m) for m in linears)
    if forced is fp._linear_by_mkl_pack:
        assert {3, 9} <= set(packed_rows)  # each search packed for its own rows: sentences x beams
    if forced is not None:
        with fp.decoder_linears_for(vaswani, 2):  # a training step inside a search's lifetime still has gradients
            assert all("forward" in vars(m) for m in linears)
            vaswani(input_ids=input_ids, labels=input_ids).loss.backward()
        assert all(m.weight.grad is not None for m in linears)


@pytest.mark.parametrize("slowed", [0, 1])
def test_the_linear_trial_keeps_the_way_whose_steps_were_fastest(slowed, monkeypatch):
    # until real decoding steps have timed every way (`_StepTrial`), the decoder's linears change way at every
    # step; the way kept must be the one whose steps were fastest (here the one not slowed by a sleep in each
    # product), and the tokens stay Transformers' while the ways change
    import time

    from vaswani_hf.model.speed import fast_products as fp

    def slowed_down(way):
        def bind(module, rows):
            forward = way(module, rows) or type(module).forward.__get__(module)
            return lambda hidden: (time.sleep(2e-3), forward(hidden))[1]

        return bind

    ways = [fp._plain_linear, fp._linear_by_columns]
    ways[slowed] = slowed_down(ways[slowed])
    monkeypatch.setattr(fp, "_linear_ways", lambda rows=1: tuple(ways))
    forget_measured_ways(monkeypatch)
    marian, vaswani = random_pair(4, biases=True)
    input_ids, attention_mask = padded_batch(4, batch=1)
    key = fp._linear_key(fp._step_linears(vaswani), 1)
    for _ in range(2 * fp.LINEAR_TRIAL_STEPS + 2):  # sentences may end early: step times add up across searches
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=8)
        assert torch.equal(vaswani.generate(max_length_offset=None, **kwargs), marian.generate(**kwargs))
        if key in fp._FASTEST_LINEAR:
            break
    assert fp._FASTEST_LINEAR[key] is ways[1 - slowed]
    assert key not in fp._LINEAR_TRIALS


@pytest.mark.parametrize("slowed", [0, 1])
def test_the_output_projection_trial_keeps_the_way_whose_steps_were_fastest(slowed, monkeypatch):
    # once the decoder's linears are decided, beam search's steps time the output projection's ways the same way
    # (`_OutputWays`); the way kept must be the one not slowed, beam search must keep Transformers' results while
    # the ways change, and no trial may outlive its search
    import time

    from vaswani_hf.model.speed import fast_products as fp

    def slowed_down(way):
        return lambda *args: (time.sleep(60e-3), way(*args))[1]  # far above a step, on a busy machine too

    ways = [fp._product_by_rows, fp._product_by_columns]
    ways[slowed] = slowed_down(ways[slowed])
    monkeypatch.setattr(fp, "_output_ways", lambda weight, rows: tuple(ways))
    monkeypatch.setattr(fp, "_fastest_linear_way", lambda *args: fp._plain_linear)
    forget_measured_ways(monkeypatch)
    marian, vaswani = random_pair(5)
    input_ids, attention_mask = padded_batch(5, batch=1)
    key = fp._output_key(vaswani.get_output_embeddings().weight, 3)
    for _ in range(2 * fp.LINEAR_TRIAL_STEPS + 2):  # sentences may end early: step times add up across searches
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=8,
                      output_scores=True, return_dict_in_generate=True)  # fmt: skip
        ours = vaswani.generate(length_penalty_type="hf", max_length_offset=None, **kwargs)
        assert_same(ours, marian.generate(**kwargs), scores=True)
        assert vaswani not in fp._OUTPUT_UNDER_TRIAL
        if key in fp._OUTPUT_TIMED_ON_STEPS:
            break
    assert fp._FASTEST_PRODUCT[key] is ways[1 - slowed]
    assert key not in fp._OUTPUT_TRIALS


def test_decoding_ways_settle_once_beam_search_has_timed_both_phases(monkeypatch):
    # what `precision.measure_bf16_speedup` warms up on: not settled while either phase of the step trial still
    # has ways to time at these rows; settled once both are decided, and for a model whose searches time nothing
    from vaswani_hf.model.speed import fast_products as fp

    forget_measured_ways(monkeypatch)
    _, vaswani = random_pair(6)
    input_ids, attention_mask = padded_batch(6, batch=2)
    linears, weight = fp._step_linears(vaswani), vaswani.get_output_embeddings().weight
    phases_seen = set()
    for _ in range(40):
        settled = fp.decoding_ways_settled(vaswani, rows=6)
        phases_seen.add((fp._fastest_linear_way(linears, 6) is not None, fp._output_key(weight, 6) in
                         fp._OUTPUT_TIMED_ON_STEPS))  # fmt: skip
        assert settled == ((True, True) in phases_seen)
        if settled:
            break
        vaswani.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=3, min_new_tokens=8,
                         max_new_tokens=8)  # fmt: skip
    assert phases_seen == {(False, False), (True, False), (True, True)}  # the linears first, then the output
    assert not fp.decoding_ways_settled(vaswani, rows=12)  # another number of rows has its own trial
    assert fp.decoding_ways_settled(vaswani.to(torch.bfloat16), rows=12)  # bf16 searches time no ways


def bf16_kernels() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@pytest.mark.parametrize("copy", ["bf16", "int8"])
@pytest.mark.parametrize("held_exactly", [False, True])
def test_the_screen_computes_exactly_every_token_that_can_be_the_argmax(copy, held_exactly):
    # greedy's screened output projection: any token whose float32 logit reaches its row's floor must come back
    # exact, so that the argmax is the float32 one; near-duplicate rows put the runners-up within the copy's error.
    # `held_exactly`: weights and hidden states the copy holds exactly, so the kernel's rounding alone separates
    # the estimates from the logits
    from types import SimpleNamespace

    from vaswani_hf.model.speed import fast_products as fp

    if copy == "bf16" and not bf16_kernels():
        pytest.skip("oneDNN has no bf16 kernels on this CPU: greedy decoding never uses the bf16 copy here")
    torch.manual_seed(0)
    output = torch.nn.Linear(64, 3000, bias=False)
    with torch.no_grad():
        output.weight.mul_(torch.rand(3000, 1) * 4)
        output.weight[1::2] = output.weight[::2] + 1e-3 * torch.randn(1500, 64)
        if held_exactly:
            output.weight.copy_(_held(copy, output.weight))
    model = SimpleNamespace(final_logits_bias=torch.randn(1, 3000))
    hidden = torch.randn(32, 64) * torch.rand(1, 64) * 10
    hidden[::2] = 3 * output.weight[:32:2].detach() + 0.1 * hidden[::2]  # large logits: rounding them counts
    if held_exactly:
        hidden = hidden.bfloat16().float()
    with torch.no_grad():
        screen = fp.bf16_screen if copy == "bf16" else fp.int8_screen
        scores, floor = fp.screened_logits(model, output.weight, hidden, screen)
    assert held_exactly is (_screen_residual(fp, screen, output.weight) == 0)
    exact = torch.addmm(model.final_logits_bias, hidden, output.weight.detach().t())
    reach = exact >= floor
    assert bool((exact.amax(dim=1, keepdim=True) >= floor).all())
    torch.testing.assert_close(scores[reach], exact[reach])
    assert bool((scores[~reach] < floor.expand_as(scores)[~reach]).all())
    assert torch.equal(scores.argmax(dim=1), exact.argmax(dim=1))


@pytest.mark.parametrize("copy", ["bf16", "int8"])
def test_the_screen_holds_where_the_hidden_state_points_along_what_the_copy_lost(copy):
    # the worst case of the copy's error: a hidden state along what the copy removed from row 0 (and orthogonal to
    # the copy, so the estimate is near 0), and a bias that puts the estimate of row 1 (the same copy) above row 0's
    # while its logit stays below: row 0 is the argmax, and the screen must not lose it
    from types import SimpleNamespace

    from vaswani_hf.model.speed import fast_products as fp

    if copy == "bf16" and not bf16_kernels():
        pytest.skip("oneDNN has no bf16 kernels on this CPU: greedy decoding never uses the bf16 copy here")
    screen = fp.bf16_screen if copy == "bf16" else fp.int8_screen
    torch.manual_seed(0)
    row = torch.randn(1, 64)
    kept = _held(copy, row)
    lost = row - kept
    along = lost - (lost @ kept.t()) / (kept @ kept.t()) * kept
    hidden = (along / along.norm() * 100).bfloat16().float()
    gap = float(hidden @ lost.t())
    weight = torch.nn.Parameter(torch.cat([row, kept]))
    model = SimpleNamespace(final_logits_bias=torch.tensor([[0.0, 0.8 * gap]]))
    exact = torch.addmm(model.final_logits_bias, hidden, weight.detach().t())
    assert int(exact.argmax()) == 0 and float(exact[0, 0] - exact[0, 1]) > 0.1 * gap > 0
    with torch.no_grad():
        scores, floor = fp.screened_logits(model, weight, hidden, screen)
    assert int(scores.argmax()) == 0 and float(scores[0, 0]) == pytest.approx(float(exact[0, 0]), rel=1e-4)


def _held(copy: str, weight: torch.Tensor) -> torch.Tensor:
    """What the copy holds of each row: bf16 values, or int8 values times a bf16 scale per row (`int8_screen`)."""
    if copy == "bf16":
        return weight.bfloat16().float()
    scale = (weight.abs().amax(dim=1, keepdim=True) / 127).bfloat16().float()
    return torch.round(weight / scale) * scale


def _screen_residual(fp, screen, weight) -> float:
    return fp._derived(fp._SCREENS[screen], weight, screen).residual


@pytest.mark.parametrize("way", ["_screened_in_bf16", "_screened_in_int8"])
def test_greedy_reading_a_low_precision_output_weight_decodes_as_transformers(way, monkeypatch):
    # `greedy_output_logits` reads a bf16 or int8 copy of the weight where that measured faster; the tokens must
    # stay Marian's, also where a logits processor removes the tokens it computed exactly (the step is then decided
    # on exact logits)
    from vaswani_hf.model.speed import fast_products as fp

    if way == "_screened_in_bf16" and not bf16_kernels():
        pytest.skip("oneDNN has no bf16 kernels on this CPU: greedy decoding never uses the bf16 copy here")
    forced = getattr(fp, way)
    monkeypatch.setattr(fp, "_FASTEST_GREEDY", {})
    monkeypatch.setattr(fp, "_fastest", lambda ways, *args: forced if forced in ways else ways[0])
    decided_exactly = []
    exact_logits = DecodingState.exact_logits
    monkeypatch.setattr(DecodingState, "exact_logits", lambda state: decided_exactly.append(1) or exact_logits(state))
    for seed in range(4):
        marian, vaswani = random_pair(seed)
        input_ids, attention_mask = padded_batch(seed, batch=5)
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=8,
                      return_dict_in_generate=True)  # fmt: skip
        plain = marian.generate(**kwargs)
        assert_same(vaswani.generate(max_length_offset=None, **kwargs), plain, scores=False)
        chosen = [token for token in plain.sequences[:, 1:4].unique().tolist() if token not in (EOS, PAD)]
        masked = dict(kwargs, suppress_tokens=chosen, min_new_tokens=6)
        assert_same(vaswani.generate(max_length_offset=None, **masked), marian.generate(**masked), scores=False)
    assert set(fp._FASTEST_GREEDY.values()) == {forced} and decided_exactly
    # a copy (half or a quarter of the weight's memory) is kept only while some number of rows decodes with it
    weight = vaswani.get_output_embeddings().weight
    copy = fp.bf16_screen if forced is fp._screened_in_bf16 else fp.int8_screen
    assert weight in fp._SCREENS[copy]
    monkeypatch.setattr(fp, "_FASTEST_GREEDY", {})
    monkeypatch.setattr(fp, "_fastest", lambda ways, *args: (forced(*args), ways[0])[1])  # screens, then picks
    vaswani.generate(max_length_offset=None, **kwargs)
    assert weight not in fp._SCREENS[copy]


@pytest.mark.parametrize("seed", range(6))
def test_a_converted_model_decodes_as_marian_with_the_same_call(seed, tmp_path):
    # An Opus-MT generation config: beams, a length limit with EOS forced there, the padding (= start) token
    # forbidden, log-probabilities renormalised after those processors.
    marian, _ = random_pair(seed)
    with torch.no_grad():
        marian.final_logits_bias[0, PAD] = 7.0  # forbidding it removes much of the mass: renormalising matters
    marian.generation_config.update(num_beams=[1, 4, 5, 2, 3, 6][seed], max_length=6 + seed, bad_words_ids=[[PAD]],
                                    forced_eos_token_id=EOS, renormalize_logits=True)  # fmt: skip
    marian.save_pretrained(tmp_path / "marian")

    vaswani = type(random_pair(seed)[1]).from_pretrained(
        convert_marian_checkpoint(tmp_path / "marian", tmp_path / "vaswani")
    )
    input_ids, attention_mask = padded_batch(seed)
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask)
    assert torch.equal(vaswani.generate(**kwargs), marian.generate(**kwargs))
    kwargs.update(output_scores=True, return_dict_in_generate=True)
    assert_same(vaswani.generate(**kwargs), marian.generate(**kwargs), scores=marian.generation_config.num_beams > 1)
    paper = marian_to_vaswani(marian, paper_decoding=True).generation_config
    assert (paper.num_beams, paper.length_penalty_type, paper.max_length_offset) == (4, "gnmt", 50)
    assert paper.forced_eos_token_id == EOS and paper.bad_words_ids == [[PAD]]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_sentence_decodes_the_same_alone_and_in_a_batch(num_beams):
    # the paper's decoding (GNMT penalty, source + 50, sentences leaving the batch when done)
    _, vaswani = random_pair(3, paper_decoding=True)
    input_ids, attention_mask = padded_batch(7, batch=6)
    batched = vaswani.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams,
                               output_scores=True, return_dict_in_generate=True)  # fmt: skip
    for row in range(input_ids.shape[0]):
        length = int(attention_mask[row].sum())
        alone = vaswani.generate(input_ids=input_ids[row : row + 1, :length], num_beams=num_beams,
                                 output_scores=True, return_dict_in_generate=True)  # fmt: skip
        tokens = alone.sequences[0]
        assert batched.sequences[row, : tokens.shape[0]].tolist() == tokens.tolist()
        assert (batched.sequences[row, tokens.shape[0] :] == PAD).all()
        if num_beams > 1:
            torch.testing.assert_close(batched.sequences_scores[row], alone.sequences_scores[0])


@pytest.mark.parametrize("vocab", [640, 1000, 1500])
@pytest.mark.parametrize("k", [2, 8, 16])
@pytest.mark.parametrize("layout", ["columns", "rows"])
def test_two_stage_top_k_equals_torch_top_k(vocab, k, layout):
    from vaswani_hf.model.search_vaswani import top_k_per_row

    generator = torch.Generator().manual_seed(vocab + k)
    columns = torch.randn(vocab, 12, generator=generator)
    columns[-1, 3] = 10.0  # the best entry of a row in the ragged tail
    columns[:, 5] = -float("inf")
    columns[7, 5] = 0.0  # a forced row: one finite entry
    # the (rows, vocabulary) view the searches pass, of either layout `output_logits` writes
    scores = columns.t() if layout == "columns" else columns.t().contiguous()
    values, index = top_k_per_row(scores, k)
    expected_values, expected_index = torch.topk(scores, k)
    assert torch.equal(values, expected_values)
    finite = torch.isfinite(expected_values)
    assert torch.equal(index[finite], expected_index[finite])
    assert index[3, 0] == vocab - 1 and index[5, 0] == 7


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize("shortlist", [False, True])
def test_the_cpu_fast_paths_switch_gives_the_same_tokens_and_scores(num_beams, shortlist, monkeypatch):
    # the switch's promise (speed/fast_products.py): off, the searches call the model's own layers and nothing of
    # that file runs; on or off, the same tokens and the same scores up to float rounding
    from vaswani_hf.model.speed import fast_products as fp

    forget_measured_ways(monkeypatch)
    monkeypatch.setattr(fp, "_FASTEST_GREEDY", {})
    marian, vaswani = random_pair(5, paper_decoding=True, biases=True)
    input_ids, attention_mask = padded_batch(5, batch=6)
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=8,
                  return_dict_in_generate=True, output_sequence_scores=num_beams > 1)  # fmt: skip
    if shortlist:
        kwargs["vocabulary_shortlist"] = torch.arange(0, 1500, 3)
    for forbid in ("output_logits", "greedy_output_logits", "decoder_linears_for"):
        monkeypatch.setattr(fp.FastCpuProducts, _seam_name(forbid), _forbidden(forbid))
    plain = vaswani.generate(cpu_fast_paths=False, **kwargs)
    monkeypatch.setenv("VASWANI_CPU_FAST_PATHS", "0")  # the environment's spelling of the same switch
    assert torch.equal(vaswani.generate(**kwargs).sequences, plain.sequences)
    monkeypatch.undo()
    forget_measured_ways(monkeypatch)
    for _ in range(3):  # the first searches time each way in turn: every one must decode the same
        fast = vaswani.generate(cpu_fast_paths=True, **kwargs)
        assert torch.equal(fast.sequences, plain.sequences)
        if num_beams > 1:
            torch.testing.assert_close(fast.sequences_scores, plain.sequences_scores, atol=1e-5, rtol=1e-5)
    assert fp._LINEAR_TRIALS or fp._FASTEST_LINEAR, "the fast paths did not run: the test compared nothing"


def _seam_name(function: str) -> str:
    return {"output_logits": "logits", "greedy_output_logits": "greedy_logits", "decoder_linears_for": "searching"}[
        function
    ]


def _forbidden(name: str):
    def called(*args, **kwargs):
        raise AssertionError(f"cpu_fast_paths=False still called fast_products.{name}")

    return staticmethod(called)


def test_hooks_on_the_decoders_linears_see_every_step_of_a_fast_search(monkeypatch):
    # the fast products re-bind plain nn.Linear forwards for a search; nn.Module.__call__ still runs, so a forward
    # hook (a profiler, an activation probe) sees the same calls with and without them
    forget_measured_ways(monkeypatch)
    _, vaswani = random_pair(2, paper_decoding=True)
    input_ids, attention_mask = padded_batch(2, batch=3)
    layer = vaswani.get_decoder().layers[0].fc1 if hasattr(vaswani.get_decoder().layers[0], "fc1") else None
    layer = layer or next(m for m in vaswani.get_decoder().modules() if isinstance(m, torch.nn.Linear))
    calls = []
    layer.register_forward_hook(lambda module, inputs, output: calls.append(output.shape))
    counts = []
    for fast in (False, True, True):
        calls.clear()
        vaswani.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6, cpu_fast_paths=fast)
        counts.append(list(calls))
    assert counts[0] and counts[0] == counts[1] == counts[2]
    assert "forward" not in vars(layer)  # its own forward back after the search


def test_searches_whose_rows_share_a_power_of_two_bucket_share_the_measured_way(monkeypatch):
    # a server's batches vary in size: keyed by the exact number of rows, every new size started a trial of its
    # own (the slower ways in turn, every weight packed for it), and a mix of 40 batches of 1-32 sentences at beam
    # 4 stayed under trial for all of its steps; a way measured for 5 rows now serves 4-7 (its own thread count)
    from vaswani_hf.model.speed import fast_products as fp

    forget_measured_ways(monkeypatch)
    _, vaswani = random_pair(3, biases=True)
    linears = fp._step_linears(vaswani)
    assert fp._linear_key(linears, 5) == fp._linear_key(linears, 6) == fp._linear_key(linears, 7)
    assert fp._linear_key(linears, 8) != fp._linear_key(linears, 7) != fp._linear_key(linears, 3)
    # MKL's pack serves one number of rows: not offered where a key spans more than the two packs kept
    assert all(fp._linear_by_mkl_pack not in fp._linear_ways(rows) for rows in range(4, 300))
    if torch.backends.mkl.is_available() and fp.has_ops(*fp.MKL_OPS):
        assert all(fp._linear_by_mkl_pack in fp._linear_ways(rows) for rows in (1, 2, 3))
    fp._FASTEST_LINEAR[fp._linear_key(linears, 5)] = fp._linear_by_columns
    trials = []
    real_trial = fp._StepTrial

    def trial(linears, rows, time_linears, output):
        trials.append((rows, time_linears))
        return real_trial(linears, rows, time_linears, output)

    monkeypatch.setattr(fp, "_StepTrial", trial)
    bound = []
    real_bind = fp._bind
    monkeypatch.setattr(fp, "_bind", lambda ls, forwards: (bound.append(forwards), real_bind(ls, forwards))[1])
    input_ids, attention_mask = padded_batch(3, batch=6)
    vaswani.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=4)
    assert trials and all(rows == 6 and not time_linears for rows, time_linears in trials)
    assert any(f is not None and getattr(f, "fast_product", False) for forwards in bound for f in forwards)


@pytest.mark.parametrize("steps", [4, 6, 30])
@pytest.mark.parametrize("offset", [0, 1, 2])
def test_a_bucket_trial_over_searches_of_two_sizes_keeps_the_truly_fastest_way(steps, offset, monkeypatch):
    # a bucket's searches differ in size: with each step given to the way with the fewest samples, lowest first, a
    # search's few timed steps went to the same ways each time, and 6-step searches of 4 and 7 rows in turn kept the
    # plain way over one 15% faster (an attacker's fake-clock run); each search now times the ways in whole cycles
    import itertools
    import types

    from vaswani_hf.model.speed import fast_products as fp

    monkeypatch.setattr(fp, "_TRIALS_STARTED", itertools.count(offset))
    _, vaswani = random_pair(5, biases=True)
    linears = fp._step_linears(vaswani)
    ways = fp._linear_ways(4)
    key = fp._linear_key(linears, 4)
    assert key == fp._linear_key(linears, 7)
    clock = [0.0]
    monkeypatch.setattr(fp, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    for fast in range(len(ways)):
        forget_measured_ways(monkeypatch)
        for search in range(200):
            if key in fp._FASTEST_LINEAR:
                break
            rows = 4 if search % 2 == 0 else 7
            trial = fp._StepTrial(linears, rows, True, None)
            for _ in range(steps):  # a step's time grows with its rows; the fast way's is 15% shorter
                trial.step_begins()
                clock[0] += rows * (0.85 if trial.way == fast else 1.0)
            trial.end()
            fp._bind(linears, [None] * len(linears))
        assert fp._FASTEST_LINEAR[key] is ways[fast], (fast, steps)


def test_a_torch_without_the_private_ops_decodes_with_the_plain_products(monkeypatch):
    """The fast products call private ops (oneDNN's and MKL's packed linears, the int8 kernel): a build that has
    the backend but not an op (or a later torch without it) is offered only the plain ways, and decodes the same."""
    from vaswani_hf.model.speed import fast_products as fp

    assert fp.has_ops("aten.mm") and not fp.has_ops("mkldnn._no_such_op") and not fp.has_ops("no_such_namespace.op")
    _, vaswani = random_pair(3, paper_decoding=True)
    input_ids, attention_mask = padded_batch(3, batch=4)
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6)
    expected = {beams: vaswani.generate(num_beams=beams, cpu_fast_paths=False, **kwargs) for beams in (1, 4)}
    forget_measured_ways(monkeypatch)
    monkeypatch.setattr(fp, "_FASTEST_GREEDY", {})
    monkeypatch.setattr(fp, "has_ops", lambda *names: False)
    assert fp._linear_ways() == (fp._plain_linear, fp._linear_by_columns, fp._linear_by_halves)  # public ops alone
    assert fp._linear_ways(4) == (fp._plain_linear, fp._linear_by_columns)
    weight = vaswani.get_output_embeddings().weight
    assert not {fp._product_by_packed_weight} & set(fp._output_ways(weight, 4)) and not fp._onednn_bf16()
    for beams in (1, 4):
        assert torch.equal(vaswani.generate(num_beams=beams, cpu_fast_paths=True, **kwargs), expected[beams])


def test_deterministic_algorithms_decode_with_the_models_own_products(monkeypatch):
    """The fast products pick their ways by stopwatch: under torch's deterministic mode a call that does not ask for
    them runs the model's own layers, so its last bits never depend on timings."""
    from vaswani_hf.model.speed import fast_products as fp

    _, vaswani = random_pair(4, paper_decoding=True)
    input_ids, attention_mask = padded_batch(4, batch=3)
    for forbid in ("output_logits", "greedy_output_logits", "decoder_linears_for"):
        monkeypatch.setattr(fp.FastCpuProducts, _seam_name(forbid), _forbidden(forbid))
    torch.use_deterministic_algorithms(True)
    try:
        for beams in (1, 4):
            vaswani.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=beams, max_new_tokens=5)
    finally:
        torch.use_deterministic_algorithms(False)
    with pytest.raises(AssertionError, match="still called"):  # asked for, they run (and the forbidden seam shows it)
        vaswani.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=5, cpu_fast_paths=True)
