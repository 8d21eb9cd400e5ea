"""Megatron-Core's overlaps of the distributed optimizer in the LLM simulator
(shardplan.simulate._llm: megatron_bucket, overlap_grad_reduce, overlap_param_gather), held
to their closed forms on one pipeline rank."""

import pytest

from shardplan.cost import llm_costs
from shardplan.ir import ExecutionSettings, ParallelConfig
from shardplan.simulate import simulate
from shardplan.simulate._llm import MEGATRON_BUCKET_PARAMS, megatron_bucket
from shardplan.strategy.llm import layout_plan
from shardplan.topology import build_spec
from tests.cost.llm_graph import gpt_graph

PAR = ParallelConfig(dp=16)


@pytest.fixture(scope="module")
def g():
    return gpt_graph(layers=8, hidden=1024)  # 100 M parameters: buckets of 40 M split them


@pytest.fixture(scope="module")
def topo():
    return build_spec("dgx-h100,nodes=2")


def run(g, topo, **kw):
    st = ExecutionSettings(precision="bf16", microbatches=4, microbatch_size=2 * 16,
                           gradient_sync="zero1", **kw)
    plan = layout_plan(g, topo, PAR, st)
    return simulate(plan, g, topo), llm_costs(g, topo, PAR, plan.settings)


def test_buckets_are_megatrons_default(g, topo):
    _, c = run(g, topo, overlap_grad_reduce=True)
    st = ExecutionSettings(precision="bf16", gradient_sync="zero1", overlap_grad_reduce=True)
    params = c.grad_bytes[0] / 2
    want = min(1.0, max(MEGATRON_BUCKET_PARAMS, 1_000_000 * 16) / params)
    assert megatron_bucket(c, PAR, st)[0] == pytest.approx(want)
    ddp = ExecutionSettings(precision="bf16", gradient_sync="bucketed")
    assert megatron_bucket(c, PAR, ddp)[0] == 1.0  # not the distributed optimizer's


def test_gradient_reduction_overlaps_the_last_backward(g, topo):
    """One stage: without the overlap its reduce-scatter follows the last backward; with it,
    the buckets start as the last backward makes them ready, and the reduction ends no
    sooner than the last bucket's share after that backward."""
    plain, c = run(g, topo)
    over, _ = run(g, topo, overlap_grad_reduce=True)
    sync, gather = float(c.grad_sync_seconds[0]), float(c.param_gather_seconds[0])
    end = plain.pipeline_seconds
    assert plain.iteration_seconds == pytest.approx(end + sync + c.optimizer_seconds[0]
                                                    + gather)
    st = ExecutionSettings(precision="bf16", gradient_sync="zero1", overlap_grad_reduce=True)
    f = float(megatron_bucket(c, PAR, st)[0])
    last = float(c.backward[0])
    done = max(end - last * (1 - f) + sync, end + f * sync)
    assert over.iteration_seconds == pytest.approx(done + c.optimizer_seconds[0] + gather)
    assert f < 1 and over.iteration_seconds < plain.iteration_seconds


def test_parameter_gather_hides_under_the_next_forward(g, topo):
    plain, c = run(g, topo)
    over, _ = run(g, topo, overlap_param_gather=True)
    gather, fwd = float(c.param_gather_seconds[0]), float(c.forward[0])
    assert gather > 0
    # the first bucket's gather and what the first forward leaves uncovered stay exposed
    f = float(megatron_bucket(c, PAR, ExecutionSettings(precision="bf16",
                                                        gradient_sync="zero1"))[0])
    assert 0 < f < 1
    exposed = gather * f + max(0.0, gather - gather * f - fwd)
    assert over.iteration_seconds == pytest.approx(plain.iteration_seconds - gather + exposed)
    assert over.iteration_seconds < plain.iteration_seconds


def test_unpaired_passes_are_a_pipelines_warmup_and_cooldown():
    """Megatron-Core's expert-parallel overlap merges each steady-state forward with the
    backward after it; the warm-up forwards and the cool-down backwards run alone."""
    from shardplan.ir.schedule import BACKWARD, FORWARD
    from shardplan.simulate._llm import _unpaired, llm_schedule

    for pp, vp, m, name in ((4, 1, 8, "1f1b"), (4, 2, 8, "interleaved_1f1b"),
                            (1, 1, 4, "1f1b")):
        sch = llm_schedule(pp, vp, m, name)
        for acts in sch.ranks:
            alone = _unpaired(acts)
            passes = [i for i, a in enumerate(acts) if a.op in (FORWARD, BACKWARD)]
            first_b = next(i for i in passes if acts[i].op == BACKWARD)
            last_f = max(i for i in passes if acts[i].op == FORWARD)
            f_before = [i for i in passes if i < first_b]
            b_after = [i for i in passes if i > last_f]
            # every forward before the one the first backward follows, and every backward
            # after the one the last forward precedes
            assert alone == frozenset(f_before[:-1] + b_after[1:]), (pp, vp, name)


def test_moe_passes_alone_pay_their_whole_dispatch(topo):
    """Under the a2a overlap the simulated iteration adds each lone pass's exposed
    dispatch and combine: slower than every pass paired, faster than none hidden."""
    import dataclasses

    from shardplan.capture import capture_spec
    from shardplan.simulate._llm import simulate_llm

    g = capture_spec("mixtral:debug,seq=64", batch_size=1, meta=True)
    par = ParallelConfig(pp=2, dp=8, ep=4)
    st = ExecutionSettings(precision="bf16", microbatches=8, microbatch_size=8,
                           moe_a2a_overlap=True)
    plan = layout_plan(g, topo, par, st)
    c = llm_costs(g, topo, par, plan.settings)
    assert c.alone_forward is not None and (c.alone_forward > 0).all()
    over = simulate_llm(plan, g, topo, plan.settings, costs=c)
    paired = simulate_llm(plan, g, topo, plan.settings, costs=dataclasses.replace(
        c, alone_forward=None, alone_backward=None))
    plain_plan = layout_plan(g, topo, par, dataclasses.replace(st, moe_a2a_overlap=False))
    plain = simulate_llm(plain_plan, g, topo, plain_plan.settings)
    assert paired.iteration_seconds < over.iteration_seconds < plain.iteration_seconds
