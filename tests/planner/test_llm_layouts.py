"""The LLM family's layouts (issue 38): every layout the search offers, checked against the
rules a Megatron-LM or torchtitan user follows (an independent enumeration of the whole grid),
what the search records of each, and the knobs a comparison names."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from shardplan.ir import ExecutionSettings, ParallelConfig
from shardplan.ir.settings import RECOMPUTES
from shardplan.planner._llm import (
    LLM_ROWS,
    baseline_comparison,
    candidates,
    family_rows,
    knobs,
    llm_plan,
    llm_search,
    moved_knobs,
    wide_space,
)
from shardplan.simulate import simulate
from shardplan.strategy.llm import layout_plan
from shardplan.topology import build
from tests.cost.llm_graph import gpt_graph


@pytest.fixture(scope="module")
def g():
    return gpt_graph(layers=4, hidden=32, seq=16, vocab=64)


@pytest.fixture(scope="module")
def topo():
    return build("dgx1")  # 8 devices in one node


def _grid(n, node, heads, kv, blocks, batch, max_mb, settings):
    """Every layout by the rules, from the full grid (no pruning)."""
    out = set()
    for tp, pp, mb, vp, rc, sp in itertools.product(
            range(1, n + 1), range(1, n + 1), (1, 2, 4, 8, 16), (1, 2, 3, 4), RECOMPUTES,
            (False, True)):
        if node % tp or n % tp or any(h is not None and h % tp for h in (heads, kv)):
            continue  # TP divides the node and the heads
        if (n // tp) % pp or blocks % pp:
            continue  # PP divides the blocks
        dp = n // (tp * pp)
        if batch % dp or mb > max_mb or (batch // dp) % mb:
            continue  # DP the rest, dividing the batch; whole micro-batches per replica
        m = batch // dp // mb
        if pp > 1 and m < pp:
            continue  # at least one micro-batch per pipeline rank
        if vp > 1 and (pp == 1 or blocks % (pp * vp) or m % pp):
            continue  # virtual stages: a pipeline, even blocks, whole rounds
        if sp and tp == 1:
            continue
        out.add((tp, pp, dp, vp, mb * dp, m, rc, sp,
                 "interleaved-1f1b" if vp > 1 else "1f1b",
                 vp if vp > 1 else settings.virtual_stages))
    return out


def _offered(g, topo, settings, **kw):
    got = []
    for par, st in candidates(g, topo, settings, **kw):
        assert (par.dp_shard, par.cp, par.stage_layers) == (1, 1, None)
        got.append((par.tp, par.pp, par.dp, par.vp, st.microbatch_size, st.microbatches,
                    st.recompute, st.sequence_parallel, st.schedule, st.virtual_stages))
    assert len(got) == len(set(got))  # each once
    return set(got)


@pytest.mark.parametrize("meta, batch, max_mb", [
    (None, 16, 8), (None, 32, 4), (None, 8, 16),
    ({"transformer": {"heads": 6, "kv_heads": 2}}, 16, 8),   # TP 1 or 2 only
    ({"transformer": {"heads": 4, "kv_heads": 1}}, 16, 8),   # TP 1 only
    ({"transformer": "not a dict"}, 16, 2),                  # no heads known: TP up to 8
    ({}, 24, 8),
    ({"transformer": {"heads": 2}}, 16, 8),                  # the heads alone limit TP
    (None, 128, 16),                                         # 16 samples per micro-batch
])
def test_candidates_are_exactly_the_layouts_the_rules_allow(g, topo, meta, batch, max_mb):
    graph = g if meta is None else g.replace(meta=meta)
    dims = graph.meta.get("transformer") if isinstance(graph.meta, dict) else None
    dims = dims if isinstance(dims, dict) else {}
    settings = ExecutionSettings(virtual_stages=3)
    want = _grid(8, 8, dims.get("heads"), dims.get("kv_heads"), 4, batch, max_mb, settings)
    got = _offered(graph, topo, settings, global_batch=batch, max_microbatch=max_mb)
    assert got == want
    assert want  # something to compare


def test_candidates_default_to_micro_batches_of_up_to_8_and_all_devices(g, topo):
    s = ExecutionSettings()
    assert _offered(g, topo, s, global_batch=256) == _grid(8, 8, 4, 4, 4, 256, 8, s)
    # on fewer devices than the cluster's
    assert _offered(g, topo, s, global_batch=16, devices=4) == _grid(4, 8, 4, 4, 4, 16, 8, s)


def test_knobs_name_what_a_user_sets():
    par = ParallelConfig(tp=2, pp=2, dp=2, dp_shard=1, cp=1, vp=2)
    st = ExecutionSettings(microbatch_size=8, microbatches=4, schedule="interleaved-1f1b",
                           recompute="selective", sequence_parallel=True,
                           gradient_sync="bucketed")
    assert knobs(par, st) == {"TP": 2, "PP": 2, "DP": 2, "FSDP": 1, "CP": 1, "VP": 2,
                              "micro-batch": 4, "micro-batches": 4,
                              "schedule": "interleaved-1f1b", "recompute": "selective",
                              "sequence parallel": True, "gradient sync": "bucketed"}
    flat = knobs(ParallelConfig(dp_shard=4, cp=2), ExecutionSettings(microbatch_size=7))
    assert flat["schedule"] == "none" and flat["micro-batch"] == 1  # 7 // 4: whole samples
    assert (flat["FSDP"], flat["CP"], flat["DP"]) == (4, 2, 1)
    assert knobs(ParallelConfig(), ExecutionSettings())["micro-batch"] == 0  # unset
    assert moved_knobs((par, st), (ParallelConfig(tp=4, pp=2, vp=2), st)) == [
        "TP 2 -> 4", "DP 2 -> 1", "micro-batch 4 -> 8"]


def test_llm_plan_records_the_layout_and_its_simulated_iteration(g, topo):
    st = ExecutionSettings(microbatches=4, microbatch_size=8)
    plan, res = llm_plan(g, topo, ParallelConfig(tp=2, pp=2, dp=2), st)
    assert plan.algorithm == "llm" and plan.search_seconds == 0.0
    assert plan.objective.name == "iteration_seconds"
    assert plan.objective.value == res.iteration_seconds
    assert res.intervals == ()  # priced without a timeline
    other, _ = llm_plan(g, topo, ParallelConfig(tp=2, pp=2, dp=2), st, algorithm="import",
                        search_seconds=2.5)
    assert other.algorithm == "import" and other.search_seconds == 2.5


def test_search_records_every_layout_it_priced(g):
    from shardplan.cost._reserved import CUDA_CONTEXT_BYTES

    # the GPUs' own holdings (CUDA context, NCCL buffers) beside 0.6 MB of tensors
    limit = 6e5 + CUDA_CONTEXT_BYTES["lazy"] + 300 * 2**20
    topo = build("flat", num_devices=4, memory_bytes=limit)
    found = llm_search(g, topo, ExecutionSettings(), global_batch=8, time_limit=600)
    offered = list(candidates(g, topo, ExecutionSettings(), global_batch=8))
    assert found.considered == len(offered) and not found.timed_out
    assert 0 <= found.seconds < 600
    fits = [c for c in found.ranked if c.fits]
    over = [c for c in found.ranked if not c.fits]
    assert fits and over
    # those that fit first, fastest first; those over the memory after, at infinity
    assert found.ranked[:len(fits)] == tuple(fits)
    times = [c.iteration_seconds for c in fits]
    assert times == sorted(times) and all(math.isfinite(t) for t in times)
    for c in over:
        assert c.fits is False
        assert c.iteration_seconds == math.inf and c.peak_memory_bytes > limit
        assert (c.parallel, c.settings) in offered
    for c in fits:
        assert c.peak_memory_bytes <= limit
        plan = layout_plan(g, topo, c.parallel, c.settings)
        assert simulate(plan, g, topo).iteration_seconds == pytest.approx(c.iteration_seconds)
    assert found.best == fits[0]


def test_search_defaults(g, topo):
    found = llm_search(g, topo, ExecutionSettings(), global_batch=256)
    assert not found.timed_out  # the default limit (60 s) is plenty here
    assert max(c.settings.microbatch_size // c.parallel.data_parallel
               for c in found.ranked) <= 8
    assert found.considered == len(list(candidates(g, topo, ExecutionSettings(),
                                                   global_batch=256)))


def test_an_included_layout_is_simulated_first_and_once(g, topo):
    # not one of the candidates (they keep the settings' end-of-step gradient sync)
    own = (ParallelConfig(tp=2, pp=2, dp=2), ExecutionSettings(microbatch_size=8,
                                                                microbatches=2,
                                                                recompute="full",
                                                                gradient_sync="bucketed"))
    offered = list(candidates(g, topo, ExecutionSettings(), global_batch=16))
    assert own not in offered
    found = llm_search(g, topo, ExecutionSettings(), global_batch=16, time_limit=600,
                       include=[own, own])
    mine = [c for c in found.ranked if (c.parallel, c.settings) == own]
    assert len(mine) == 1 and mine[0].fits
    assert found.considered == len(offered) + 1  # the duplicate is skipped, not the rest
    best_other = min(c.iteration_seconds for c in found.ranked if c is not mine[0])
    assert mine[0].iteration_seconds > best_other  # simulated although it could not win
    rows = family_rows(g, topo, ExecutionSettings(), global_batch=16, time_limit=600,
                       include=[own])
    fitting = [c for c in found.ranked if c.fits]
    assert len(rows) == min(LLM_ROWS, len(fitting)) + (own not in
                                                       [(c.parallel, c.settings)
                                                        for c in fitting[:LLM_ROWS]])
    assert len(rows) > 1
    # the family searches the wide space (every sharding, context parallelism, uneven
    # pipelines)
    again = llm_search(g, topo, ExecutionSettings(), global_batch=16, time_limit=600,
                       include=[own], space=wide_space(ExecutionSettings()))
    first = [c for c in again.ranked if c.fits][0]
    assert {k: v for k, v in rows[0].items() if k not in ("search_seconds", "plan")} == {
        "stages": first.parallel.num_stages, "replicas": first.parallel.devices_per_rank,
        "schedule": first.settings.schedule, "microbatches": first.settings.microbatches,
        "mapping": first.parallel.label(), "gradient_sync": first.settings.gradient_sync,
        "iteration_seconds": first.iteration_seconds,
        "throughput": 16 / first.iteration_seconds,
        "peak_memory_bytes": first.peak_memory_bytes, "fits": True,
        "note": first.parallel.label() + (" (your configuration)"
                                          if (first.parallel, first.settings) == own else ""),
        "objective_value": first.iteration_seconds, "timed_out": False}
    assert 0 <= rows[0]["search_seconds"] < 600
    assert rows[0]["plan"]["algorithm"] == "llm"
    assert rows[0]["plan"]["search_seconds"] == rows[0]["search_seconds"] > 0
    assert rows[0]["plan"]["objective"]["name"] == "iteration_seconds"
    notes = [r["note"] for r in rows]
    assert notes.count(own[0].label() + " (your configuration)") == 1
    assert all(n.endswith(" (your configuration)") or n in {c.parallel.label() for c in
                                                            found.ranked} for n in notes)
    for r in rows:
        assert r["throughput"] == pytest.approx(16 / r["iteration_seconds"])
        assert r["objective_value"] == r["iteration_seconds"] and r["fits"]
        assert r["plan"]["objective"]["value"] == r["iteration_seconds"]
        assert r["timed_out"] is False
    times = [r["iteration_seconds"] for r in rows
             if not r["note"].endswith("(your configuration)")]
    assert times == sorted(times)


def test_baseline_comparison_fields(g, topo):
    own_par = ParallelConfig(tp=2, pp=2, dp=2)
    baseline = layout_plan(g, topo, own_par, ExecutionSettings(microbatch_size=8,
                                                               microbatches=2))
    found = llm_search(g, topo, ExecutionSettings(), global_batch=16, time_limit=600,
                       include=[(own_par, baseline.settings)])
    cmp_ = baseline_comparison(baseline, g, topo, found)
    base = simulate(baseline, g, topo)
    best = found.best
    assert cmp_ == {"baseline": own_par.label(), "baseline_seconds": base.iteration_seconds,
                    "baseline_fits": base.fits_memory, "winner": best.parallel.label(),
                    "winner_seconds": best.iteration_seconds,
                    "speedup": base.iteration_seconds / best.iteration_seconds,
                    "moved": moved_knobs((own_par, baseline.settings),
                                         (best.parallel, best.settings))}


def test_a_candidate_as_a_row():
    from shardplan.planner._llm import LLMCandidate

    par = ParallelConfig(tp=2, pp=2, dp=2)
    st = ExecutionSettings(microbatch_size=8, microbatches=4, recompute="full",
                           sequence_parallel=True)
    row = LLMCandidate(par, st, 0.5, 3 * 2**30, True).row()
    assert row == {"parallel": par.label(), "layout": par.to_dict(), "microbatch_size": 8,
                   "microbatches": 4, "schedule": "1f1b", "recompute": "full",
                   "sequence_parallel": True, "iteration_seconds": 0.5,
                   "peak_memory_gib": 3.0, "fits": True}


def test_a_baseline_must_be_an_llm_plan(g, topo):
    import dataclasses

    from shardplan.errors import ShardplanError

    plan = layout_plan(g, topo, ParallelConfig(tp=2, pp=2, dp=2),
                       ExecutionSettings(microbatch_size=8, microbatches=2))
    found = llm_search(g, topo, ExecutionSettings(), global_batch=16, time_limit=600)
    with pytest.raises(ShardplanError, match=r"^--baseline must be an LLM plan \(a plan with "
                                             r"a 'parallel' layout, as 'shardplan import' "
                                             r"writes\)$"):
        baseline_comparison(dataclasses.replace(plan, parallel=None), g, topo, found)


def test_search_on_fewer_devices_and_smaller_micro_batches(g, topo):
    found = llm_search(g, topo, ExecutionSettings(), global_batch=64, time_limit=600,
                       devices=4, max_microbatch=2)
    assert found.ranked and {c.parallel.world_size for c in found.ranked} == {4}
    assert found.considered == len(list(candidates(g, topo, ExecutionSettings(),
                                                   global_batch=64, devices=4,
                                                   max_microbatch=2)))
    assert max(c.settings.microbatch_size // c.parallel.data_parallel
               for c in found.ranked) <= 2


def test_candidates_on_other_shapes():
    """A node of 12 devices (TP 3 refused by 4 heads, TP 4 allowed after it), 6 and 8 blocks
    (3 and 4 virtual stages)."""
    g4 = gpt_graph(layers=4, hidden=32, seq=16, vocab=64)
    flat12 = build("flat", num_devices=12)
    for batch in (6, 18, 24):
        s = ExecutionSettings()
        assert _offered(g4, flat12, s, global_batch=batch) == _grid(12, 12, 4, 4, 4, batch, 8,
                                                                    s)
    for layers in (6, 8):
        g = gpt_graph(layers=layers, hidden=32, seq=16, vocab=64)
        s = ExecutionSettings()
        dgx = build("dgx1")
        assert _offered(g, dgx, s, global_batch=64) == _grid(8, 8, 4, 4, layers, 64, 8, s)


def test_every_included_layout_is_simulated(g, topo):
    """Two layouts of the user's own: both simulated, the slower too, although the faster
    one's time is below its bound."""
    fast = (ParallelConfig(tp=1, pp=1, dp=8), ExecutionSettings(microbatch_size=16,
                                                                 microbatches=1,
                                                                 gradient_sync="bucketed"))
    slow = (ParallelConfig(tp=2, pp=2, dp=2), ExecutionSettings(microbatch_size=2,
                                                                 microbatches=8,
                                                                 recompute="full",
                                                                 gradient_sync="bucketed"))
    found = llm_search(g, topo, ExecutionSettings(), global_batch=16, time_limit=600,
                       include=[fast, slow])
    got = {(c.parallel, c.settings): c for c in found.ranked}
    assert fast in got and slow in got
    assert got[slow].iteration_seconds > got[fast].iteration_seconds


# ------------------------------------------------------------------ the wide space (issue 45)
def _wide_grid(n, node, heads, blocks, batch, seq, settings):
    """The wide space by its rules, from the full grid (no pruning): every sharding,
    context parallelism, uneven pipelines by pipeline_split."""
    from shardplan.ir.parallel import pipeline_split

    out = set()
    for tp, pp, cp, mb, vp, rc in itertools.product(
            range(1, n + 1), range(1, n + 1), (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 3, 4),
            ("none", "selective", "full")):
        if node % tp or n % tp or heads % tp or n % (tp * pp) or pp > blocks:
            continue
        if (n // (tp * pp)) % cp or seq % (2 * cp) or (cp > 1 and seq // (2 * cp) < 1024):
            continue
        dp = n // (tp * pp * cp)
        if batch % dp or (batch // dp) % mb:
            continue
        m = batch // dp // mb
        if (pp > 1 and m < pp) or (vp > 1 and (pp == 1 or m % pp)):
            continue
        ok, split = pipeline_split(blocks, pp, vp)
        if not ok:
            continue
        shards = {(dp, 1, "bucketed" if dp > 1 else "end")}
        if dp > 1:
            shards |= {(dp, 1, "zero1"), (1, dp, "sharded")}
            shards |= {(dp // s, s, "sharded") for s in (8, 64) if dp % s == 0 and dp > s}
        for rep, shard, sync in shards:
            out.add((tp, pp, cp, rep, shard, vp, split, mb * dp, m, rc, tp > 1, sync))
    return out


def test_the_wide_space_is_exactly_the_layouts_its_rules_allow():
    g = gpt_graph(layers=6, hidden=32, seq=4096, vocab=64, heads=4)
    topo = build("flat", num_devices=16)
    s = ExecutionSettings()
    got = [(p.tp, p.pp, p.cp, p.dp, p.dp_shard, p.vp, p.stage_layers, st.microbatch_size,
            st.microbatches, st.recompute, st.sequence_parallel, st.gradient_sync)
           for p, st in candidates(g, topo, s, global_batch=32, space=wide_space(s))]
    assert len(got) == len(set(got))
    assert set(got) == _wide_grid(16, 16, 4, 6, 32, 4096, s)
    assert any(x[6] is not None for x in got) and any(x[2] > 1 for x in got)
    assert any(x[4] > 1 and x[3] > 1 for x in got)  # HSDP


def test_a_gradient_sync_the_user_set_is_kept():
    s = ExecutionSettings(gradient_sync="zero1")
    assert wide_space(s).shardings == ("settings",)
    assert "op" in wide_space(ExecutionSettings(stack="torchtitan")).recomputes


@pytest.mark.parametrize("seed", range(3))
def test_the_static_memory_bound_is_below_what_the_cost_model_holds(seed):
    """_static_bytes never exceeds the priced memory, so pruning by it drops only layouts
    that would not fit."""
    import random

    from shardplan.cost import llm_costs
    from shardplan.planner._llm import _static_bytes

    rng = random.Random(seed)
    g = gpt_graph(layers=6, hidden=32, seq=4096, vocab=64, heads=4)
    topo = build("flat", num_devices=16)
    params = float(g.param_bytes.sum()) / 4
    offered = list(candidates(g, topo, ExecutionSettings(), global_batch=32,
                              space=wide_space(ExecutionSettings())))
    for par, st in rng.sample(offered, 40):
        for precision, grad in (("bf16", "fp32"), ("fp32", "param"), ("fp16", "param")):
            st2 = dataclasses.replace(st, precision=precision, grad_reduce=grad)
            mem = llm_costs(g, topo, par, st2).memory
            static = mem["params"] + mem["gradients"] + mem["master"] + mem["optimizer"]
            assert _static_bytes(params, par, st2) <= static.max() * (1 + 1e-9)
