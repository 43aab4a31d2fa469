"""Our Llama forward vs transformers' LlamaForCausalLM: same logits in fp32."""

from __future__ import annotations

import pytest
import torch

from engine.model_runner import ModelRunner, SeqChunk
from tests.conftest import TARGET, make_runner

CPU = torch.device("cpu")


def hf_logits(path, ids: list[int]) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def prefill_then_decode(runner: ModelRunner, rid: str, ids: list[int], split: int) -> torch.Tensor:
    """Prefill ids[:split] in one chunk, then feed the rest one token at a time; logits of every position."""
    runner.cache.allocate(rid)
    runner.cache.reserve(rid, split)
    out = [runner.execute([SeqChunk(rid, ids[:split], 0, split)])[0]]
    for pos in range(split, len(ids)):
        runner.cache.reserve(rid, pos + 1)
        out.append(runner.execute([SeqChunk(rid, [ids[pos]], pos, 1)])[0])
    return torch.cat(out)


@pytest.mark.parametrize("kind", ["paged", "slotted"])
def test_random_llama32_features_match_transformers(random_llama_dir, kind):
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    expected = hf_logits(random_llama_dir, ids)
    got = prefill_then_decode(make_runner(random_llama_dir, kind), "r", ids, 25)
    assert (got - expected).abs().max().item() <= 1e-4


def test_bundled_target_matches_transformers():
    if not (TARGET / "model.safetensors").exists():
        pytest.skip("bundled model not trained yet")
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(TARGET)("def fibonacci(n):\n    if n < 2:\n        return n\n")["input_ids"]
    expected = hf_logits(TARGET, ids)
    got = prefill_then_decode(make_runner(TARGET, "paged"), "r", ids, len(ids) - 6)
    assert (got - expected).abs().max().item() <= 1e-4


@pytest.mark.parametrize("merge_decodes", [False, True])
def test_ragged_batch_equals_requests_alone(random_llama_dir, merge_decodes):
    """A prefill chunk, a decode and a 4-token verification in one pass give the same logits as alone, with the
    decode in a group of its own (CPU) or padded into the verification's (GPU)."""
    runner = make_runner(random_llama_dir, "paged")
    runner.merge_decodes = merge_decodes
    gen = torch.Generator().manual_seed(2)
    seqs = {r: torch.randint(0, 512, (n,), generator=gen).tolist() for r, n in (("a", 30), ("b", 12), ("c", 20))}
    alone = {r: prefill_then_decode(make_runner(random_llama_dir, "paged"), r, ids, len(ids))
             for r, ids in seqs.items()}
    for r, _ids in seqs.items():
        runner.cache.allocate(r)
    # a: full prefill; b: prefill 11 then decode 1; c: prefill 16 then verify 4
    runner.cache.reserve("b", 11)
    runner.cache.reserve("c", 16)
    runner.execute([SeqChunk("b", seqs["b"][:11], 0, 0), SeqChunk("c", seqs["c"][:16], 0, 0)])
    runner.cache.reserve("a", 30)
    runner.cache.reserve("b", 12)
    runner.cache.reserve("c", 20)
    a, b, c = runner.execute([
        SeqChunk("a", seqs["a"], 0, 30), SeqChunk("b", seqs["b"][11:], 11, 1), SeqChunk("c", seqs["c"][16:], 16, 4),
    ])
    assert torch.allclose(a, alone["a"], atol=1e-5)
    assert torch.allclose(b, alone["b"][-1:], atol=1e-5)
    assert torch.allclose(c, alone["c"][-4:], atol=1e-5)


def test_cpu_models_run_prepacked_linears_that_match_f_linear(random_llama_dir):
    from engine.models.llama import PackedLinear

    runner = make_runner(random_llama_dir, "paged")
    packed = [m for m in runner.model.modules() if isinstance(m, PackedLinear)]
    assert packed and not any(isinstance(m, torch.nn.Linear) for m in runner.model.modules())
    linear = torch.nn.Linear(64, 96)
    x = torch.randn(5, 64)
    assert torch.allclose(PackedLinear(linear)(x), linear(x), atol=1e-5)


def test_prepacking_falls_back_to_plain_linears_when_onednn_cannot(monkeypatch):
    from engine.models import llama

    def unavailable(*_args):
        raise RuntimeError("no oneDNN in this build")

    monkeypatch.setattr(llama.PackedLinear, "__init__", lambda self, linear: unavailable())
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    assert llama.pack_linears_for_cpu(model) is False
    assert isinstance(model[0], torch.nn.Linear)


@pytest.mark.filterwarnings("ignore:for .*meta parameter")
def test_models_loaded_off_the_cpu_keep_attention_off_cudnn(random_llama_dir, monkeypatch):
    """cuDNN attention builds a plan per new shape (~50 ms on an H100), and a server's shapes are new every step."""
    from engine.models import loader

    calls = []
    monkeypatch.setattr(loader, "avoid_cudnn_attention", lambda: calls.append(True))
    loader.load_model(random_llama_dir, torch.float32, torch.device("cpu"))
    assert not calls
    loader.load_model(random_llama_dir, torch.float32, torch.device("meta"))  # stands in for a GPU: not the CPU
    assert calls


def test_avoiding_cudnn_attention_keeps_the_other_backends():
    from engine.models.llama import avoid_cudnn_attention

    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        avoid_cudnn_attention()
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(enabled)


def test_decodes_attend_apart_from_multi_token_requests():
    """Padding every decode to a verification's k + 1 query rows multiplied the batch's attention work."""
    from engine.models.llama import build_attention_metadata

    contexts = [torch.arange(10), torch.arange(20, 27), torch.arange(40, 52)]
    meta = build_attention_metadata(contexts, [1, 3, 1], CPU)
    decodes, others = meta.groups
    assert (decodes.batch_size, decodes.max_new, decodes.token_index.tolist()) == (2, 1, [0, 4])
    assert (others.batch_size, others.max_new, others.token_index.tolist()) == (1, 3, [1, 2, 3])
    assert meta.write_index.tolist() == [9, 24, 25, 26, 51]


@pytest.fixture
def one_short_group(monkeypatch):
    """Short runs in one group padded to the longest (``EXACT_SHORT_RUNS`` off; a GPU's merged groups pad likewise)."""
    from engine.models import llama

    monkeypatch.setattr(llama, "EXACT_SHORT_RUNS", False)


@pytest.mark.parametrize("runs", [[3, 3, 3], [3, 2, 4]])
def test_short_runs_fold_query_heads_per_kv_head_and_attend_as_each_head_alone(runs, one_short_group):
    """On a CPU a short run's query heads attend folded by kv head (one call per kv head, a mask per pass); each
    query head still sees exactly its kv head's keys, under its own causal mask, padded queries or not."""
    from engine.models.llama import Attention, LlamaArgs, build_attention_metadata

    args = LlamaArgs(vocab_size=8, hidden_size=96, intermediate_size=8, num_layers=1, num_heads=6, num_kv_heads=2,
                     head_dim=16, rms_norm_eps=1e-5, rope_theta=1e4, rope_scaling=None, max_position_embeddings=64,
                     tie_word_embeddings=False)
    attention = Attention(args)
    gen = torch.Generator().manual_seed(0)
    contexts = [torch.arange(start, start + length) for start, length in ((0, 9), (20, 14), (40, 6))]
    (group,) = build_attention_metadata(contexts, runs, CPU).groups
    k_cache, v_cache = (torch.randn(64, 2, 16, generator=gen) for _ in range(2))
    q = torch.randn(sum(runs), 6, 16, generator=gen)
    out = attention._attend(q, k_cache, v_cache, group).view(sum(runs), 6, 16)
    row = 0
    for context, run in zip(contexts, runs, strict=True):
        for i in range(run):
            visible = context[: len(context) - run + i + 1]  # keys up to the query's own position
            for head in range(6):
                keys, values = k_cache[visible, head // 3], v_cache[visible, head // 3]
                weights = torch.softmax(keys @ q[row, head] / 4.0, dim=0)
                assert torch.allclose(out[row, head], weights @ values, atol=1e-5)
            row += 1


def test_short_runs_attend_one_group_per_length(monkeypatch):
    """On a CPU (``EXACT_SHORT_RUNS``) no short run is padded to another's length: a step then costs what the cost
    model, linear in fed tokens, predicts. Merged (a GPU's groups) or with the rule off, one group pads them all."""
    from engine.models import llama

    contexts = [torch.arange(10), torch.arange(20, 27), torch.arange(40, 52), torch.arange(60, 66)]
    groups = llama.build_attention_metadata(contexts, [2, 3, 4, 3], CPU).groups
    assert [(g.batch_size, g.max_new, g.uniform) for g in groups] == [(1, 2, True), (2, 3, True), (1, 4, True)]
    assert [g.token_index.tolist() for g in groups] == [[0, 1], [2, 3, 4, 9, 10, 11], [5, 6, 7, 8]]
    (only,) = llama.build_attention_metadata(contexts, [2, 3, 4, 3], CPU, merge_decodes=True).groups
    assert only.max_new == 4 and not only.uniform
    monkeypatch.setattr(llama, "EXACT_SHORT_RUNS", False)
    (only,) = llama.build_attention_metadata(contexts, [2, 3, 4, 3], CPU).groups
    assert only.token_index is None and only.max_new == 4 and not only.uniform


def test_merged_decodes_attend_with_short_runs_only():
    """On a GPU decodes join the verifying requests' group (one attention call fewer per layer), never a prefill
    chunk's; a batch of decodes alone keeps its unmasked decode group."""
    from engine.models.llama import SHORT_RUN, build_attention_metadata

    long = SHORT_RUN + 8
    contexts = [torch.arange(10), torch.arange(20, 20 + long), torch.arange(100, 112), torch.arange(200, 205)]
    short, prefills = build_attention_metadata(contexts, [1, long, 5, 1], CPU, merge_decodes=True).groups
    assert (short.batch_size, short.max_new, short.uniform) == (3, 5, False)
    assert short.token_index.tolist() == [0, *range(1 + long, 1 + long + 6)]
    assert (prefills.batch_size, prefills.max_new) == (1, long)
    (decodes,) = build_attention_metadata(contexts, [1, 1, 1, 1], CPU, merge_decodes=True).groups
    assert decodes.max_new == 1 and decodes.uniform


def test_verification_attends_apart_from_prefill_chunks(one_short_group):
    """Padding verifying requests to a prefill chunk's length beside them made shared steps 50% slower."""
    from engine.models.llama import SHORT_RUN, build_attention_metadata

    long = SHORT_RUN + 8
    contexts = [torch.arange(10), torch.arange(20, 20 + long), torch.arange(100, 112), torch.arange(200, 205)]
    decodes, verifies, prefills = build_attention_metadata(contexts, [1, long, 5, 3], CPU).groups
    assert (decodes.batch_size, decodes.max_new, decodes.token_index.tolist()) == (1, 1, [0])
    assert (verifies.batch_size, verifies.max_new) == (2, 5)
    assert verifies.token_index.tolist() == list(range(1 + long, 1 + long + 8))
    assert (prefills.batch_size, prefills.max_new, prefills.token_index.tolist()) == (1, long, list(range(1, 1 + long)))


def test_a_short_prompt_does_not_pad_verification(one_short_group):
    """Any run longer than the longest verification is a prefill chunk and attends apart, however short: 32 requests
    verifying k = 2 padded to a 28-token prompt's length beside them made the target's pass 1.5x slower."""
    from engine.models.llama import SHORT_RUN, build_attention_metadata
    from policies.settings import K_LIMIT

    assert SHORT_RUN == K_LIMIT + 1
    contexts = [torch.arange(0, 40), torch.arange(50, 90), torch.arange(100, 124), torch.arange(200, 217)]
    verifies, prompts = build_attention_metadata(contexts, [3, 3, 24, K_LIMIT + 1], CPU).groups
    assert (verifies.batch_size, verifies.max_new, verifies.token_index.tolist()) == (
        3, K_LIMIT + 1, [0, 1, 2, 3, 4, 5, *range(30, 30 + K_LIMIT + 1)])
    assert (prompts.batch_size, prompts.max_new, prompts.token_index.tolist()) == (1, 24, list(range(6, 30)))


def test_a_prompt_shorter_than_short_run_pads_no_verification(one_short_group):
    """Told which runs are verifications (scored at every token), a prompt over twice as long as all of them attends
    apart even under SHORT_RUN; without verifications, or merging groups (a GPU), short runs keep one group."""
    from engine.models.llama import build_attention_metadata

    contexts = [torch.arange(0, 40), torch.arange(50, 90), torch.arange(100, 110), torch.arange(200, 212)]
    verifies, prompts = build_attention_metadata(contexts, [3, 3, 10, 12], CPU, num_logits=[3, 3, 1, 1]).groups
    assert (verifies.batch_size, verifies.max_new, verifies.uniform) == (2, 3, True)
    assert verifies.token_index.tolist() == list(range(6))
    assert (prompts.batch_size, prompts.max_new, prompts.token_index.tolist()) == (2, 12, list(range(6, 28)))
    joined, _ = build_attention_metadata(contexts, [3, 3, 6, 12], CPU, num_logits=[3, 3, 1, 1]).groups
    assert (joined.batch_size, joined.max_new) == (3, 6)  # up to twice a verification's length, a prompt joins it
    for merged, num_logits in ((True, [3, 3, 1, 1]), (False, [1, 1, 1, 1])):
        (short,) = build_attention_metadata(contexts, [3, 3, 10, 12], CPU, merged, num_logits).groups
        assert (short.batch_size, short.max_new) == (4, 12)


def test_prefill_chunks_attend_with_others_of_about_their_length():
    """Prompts of lengths apart by over 2x attend apart; a 50-token prompt padded to a 200-token one beside it made a
    verifying step 18% slower."""
    from engine.models.llama import build_attention_metadata

    contexts = [torch.arange(0, 50), torch.arange(100, 300), torch.arange(300, 450), torch.arange(500, 503)]
    verifies, short, long = build_attention_metadata(contexts, [50, 200, 150, 3], CPU).groups
    assert (verifies.batch_size, verifies.max_new, verifies.token_index.tolist()) == (1, 3, [400, 401, 402])
    assert (short.batch_size, short.max_new, short.token_index.tolist()) == (1, 50, list(range(50)))
    assert (long.batch_size, long.max_new, long.token_index.tolist()) == (2, 200, list(range(50, 400)))


def test_packed_linears_pad_rows_to_a_bounded_set_of_sizes():
    """oneDNN builds a kernel per row count and keeps 1024: the sizes it sees must stay few (the bundled target has
    5 linear shapes), and a verifying batch's few dozen rows must not pay many more (80 rows at 96 had cost 1.3x)."""
    from engine.models.llama import PackedLinear, padded_rows

    assert [padded_rows(n) for n in (1, 16, 17, 64, 65, 80, 256, 257, 512, 513)] == [
        1, 16, 20, 64, 72, 80, 256, 288, 512, 768]
    assert len({padded_rows(n) for n in range(1, 4097)}) <= 80
    assert all(padded_rows(n) - n < 8 for n in range(17, 257))
    linear = torch.nn.Linear(32, 48)
    x = torch.randn(19, 32)
    out = PackedLinear(linear)(x)
    assert out.shape == (19, 48) and torch.allclose(out, linear(x), atol=1e-5)


def test_a_packed_linears_rows_come_out_the_same_at_every_row_count_it_is_padded_to():
    """Float32 greedy speculation is exact only if a request's logits do not depend on what shares its pass: each row
    must come out bitwise as it does alone, at the counts of every band (`ROW_BANDS`) and padded to them."""
    from engine.models.llama import PackedLinear, padded_rows

    torch.manual_seed(0)
    linear = PackedLinear(torch.nn.Linear(384, 1024, bias=False))
    x = torch.randn(300, 384)
    alone = torch.cat([linear.multiply(x[i : i + 1]) for i in range(300)])
    for rows in (17, 33, 64, 65, 80, 96, 200, 257, 300):
        assert torch.equal(linear(x[:rows]), alone[:rows]), (rows, padded_rows(rows))


def test_packed_linears_are_touched_once_per_row_count_in_a_process(monkeypatch):
    """Warm-up has oneDNN build its kernels for every row count a step can feed, and a second engine of the
    process, whose shapes are the same, builds none again."""
    from engine.models import llama

    monkeypatch.setattr(llama, "_TOUCHED_SHAPES", set())
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Linear(40, 24))
    assert llama.pack_linears_for_cpu(model)
    calls: list[int] = []
    original = llama.PackedLinear.forward
    monkeypatch.setattr(llama.PackedLinear, "forward", lambda self, x: calls.append(x.shape[0]) or original(self, x))
    llama.touch_linears(model, 20)
    counts = [*range(1, 17), 20]
    assert sorted(calls) == sorted(counts * 2)  # each row count oneDNN sees up to 20, for both linears
    assert {("cpu", 24, 40, torch.float32, True, rows) for rows in counts} <= llama._TOUCHED_SHAPES
    calls.clear()
    llama.touch_linears(model, 20)
    assert calls == []
    before = set(llama._TOUCHED_SHAPES)
    llama.touch_linears(torch.nn.Sequential(torch.nn.Linear(24, 40)), 20)  # CPU, no packed linears: nothing to do
    assert calls == [] and len(llama._TOUCHED_SHAPES) == len(before)


@pytest.mark.gpu
def test_cuda_linears_are_touched_at_every_row_count_once_per_shape(monkeypatch):
    """On a GPU cuBLAS picks a kernel per row count on first use: warm-up calls each distinct linear shape at every
    count up to the bound, once in a process."""
    from engine.models import llama

    monkeypatch.setattr(llama, "_TOUCHED_SHAPES", set())
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Linear(40, 24), torch.nn.Linear(24, 40)).cuda()
    calls: list[tuple[int, int]] = []
    original = torch.nn.Linear.forward
    monkeypatch.setattr(torch.nn.Linear, "forward",
                        lambda self, x: calls.append((self.in_features, x.shape[0])) or original(self, x))
    llama.touch_linears(model, 12)
    assert sorted(calls) == sorted([(24, rows) for rows in range(1, 13)] + [(40, rows) for rows in range(1, 13)])
    calls.clear()
    llama.touch_linears(model, 12)
    assert calls == []


def test_row_padding_takes_a_larger_row_count_only_where_it_ran_clearly_faster():
    """Measured on a Zen 4 VM: the target's linears ran 1-2 rows slower than 4-6 (weights streamed from memory)."""
    from engine.models.row_padding import padding_table

    seconds = {1: 3.6, 2: 3.7, 3: 3.1, 4: 2.85, 5: 2.8, 6: 2.9, 7: 3.7, 8: 3.8}
    assert padding_table(seconds) == (0, 4, 4, 3, 4, 5, 6, 7, 8)  # 3: 4 is only 8% faster
    assert padding_table({1: 1.0, 2: 1.1, 3: 1.2}) == (0, 1, 2, 3)  # cached weights: time grows with the rows


def test_calibrated_row_padding_is_set_on_every_packed_linear_once_per_process(monkeypatch):
    from engine.models import llama, row_padding

    monkeypatch.setattr(row_padding, "_CALIBRATED", {})
    timed: list[int] = []

    def fake_times(linears, counts):
        timed.append(len(counts))
        return {rows: 2.0 if rows < 3 else 1.0 for rows in counts}

    monkeypatch.setattr(row_padding, "time_row_counts", fake_times)
    models = [torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Linear(40, 24)) for _ in range(2)]
    for model in models:
        assert llama.pack_linears_for_cpu(model)
        table = row_padding.calibrate_row_padding(model)
        assert table[:5] == (0, 3, 3, 3, 4)
        assert all(linear.row_padding is table for linear in model)
    # every count, then the padded ones (1, 2) and their target (3) again; the second model reuses the table
    assert timed == [llama.EXACT_ROWS, 3]
    assert llama.padded_rows(2, table) == 3 and llama.padded_rows(17, table) == 20
    assert row_padding.calibrate_row_padding(torch.nn.Sequential(torch.nn.ReLU())) is None  # nothing packed (CUDA)


def test_a_padding_stands_only_where_a_second_timing_confirms_it(monkeypatch):
    """Where row counts cost about alike, one timing's noise may make a larger count look clearly faster."""
    from engine.models import row_padding

    timings = iter([{rows: 2.0 if rows < 3 else 1.0 for rows in range(1, 17)},  # 1-2 rows look slow once
                    {1: 1.0, 2: 2.0, 3: 1.0}])  # again: only 2 rows are
    monkeypatch.setattr(row_padding, "time_row_counts", lambda linears, counts: next(timings))
    assert row_padding.confirmed_padding([])[:4] == (0, 1, 3, 3)


def test_row_padding_times_every_count_and_padded_rows_compute_the_same():
    from engine.models import llama, row_padding

    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Linear(40, 24))
    assert llama.pack_linears_for_cpu(model)
    seconds = row_padding.time_row_counts(list(model), range(1, 5), rounds=2)
    assert sorted(seconds) == [1, 2, 3, 4] and all(0 < s < 1 for s in seconds.values())
    x = torch.randn(2, 24)
    exact = model(x)
    for linear in model:
        linear.row_padding = (0, 4, 4, 4, 4)
    padded = model(x)  # run at 4 rows, cut back to 2
    assert padded.shape == (2, 24) and torch.allclose(padded, exact, atol=1e-5)


def test_a_runner_counts_the_rows_its_linears_run(random_llama_dir):
    """The step-cost fit prices what the packed linears run (policies/cost_model.py): 33 tokens run 36 rows."""
    runner = make_runner(random_llama_dir, "slotted")
    assert runner.pads_rows and [runner.linear_rows(n) for n in (1, 16, 17, 33, 65)] == [1, 16, 20, 36, 72]
