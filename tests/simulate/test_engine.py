"""The simulator against closed forms, the cost model and hand-computed contention."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan.cost import CostModel, allreduce_seconds, in_flight_microbatches
from shardplan.errors import ShardplanError
from shardplan.ir import Device, Graph, Objective, Plan, Stage, Topology
from shardplan.simulate import Schedule, simulate
from shardplan.topology import build


def _flat(num: int, *, bandwidth: float = 1e30, latency: float = 0.0) -> Topology:
    bw = np.full((num, num), bandwidth)
    lat = np.full((num, num), latency)
    np.fill_diagonal(bw, 0)
    np.fill_diagonal(lat, 0)
    return Topology(name="flat", devices=tuple(Device(f"d{i}", 1e15, 1e12) for i in range(num)),
                    bandwidth=bw, latency=lat)


def _chain(num: int, f: float, b: float, *, out_bytes: int = 0, params: int = 0) -> Graph:
    return Graph.from_arrays(name="chain", fwd_flops=np.zeros(num), src=np.arange(num - 1),
                             dst=np.arange(1, num), fwd_seconds=np.full(num, f),
                             bwd_seconds=np.full(num, b), output_bytes=np.full(num, out_bytes),
                             param_bytes=np.full(num, params))


def _plan(stages: list[list[int]], devices: list[list[int]], lb: float | None = None) -> Plan:
    return Plan("g", "t", "hand", tuple(Stage(tuple(n), tuple(d))
                                        for n, d in zip(stages, devices, strict=True)),
                Objective("max_stage_seconds", 0.0, lb))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.floats(0.01, 5.0), st.floats(0.01, 5.0),
       st.sampled_from(["gpipe", "1f1b"]))
def test_closed_form_equal_stages(s: int, m: int, f: float, b: float, name: str) -> None:
    """S equal stages with free transfers: (M + S - 1)(f + b), bubble (S-1)/(M+S-1)."""
    g = _chain(s, f, b)
    res = simulate(_plan([[i] for i in range(s)], [[i] for i in range(s)]), g, _flat(s),
                   schedule=name, num_microbatches=m, optimizer="sgd")
    assert res.pipeline_seconds == pytest.approx((m + s - 1) * (f + b), rel=1e-9)
    assert res.iteration_seconds == pytest.approx((m + s - 1) * (f + b), rel=1e-9)
    assert res.bubble_fraction == pytest.approx((s - 1) / (m + s - 1), rel=1e-9, abs=1e-12)
    assert res.busy_seconds == pytest.approx([m * (f + b)] * s, rel=1e-9)
    assert res.throughput == pytest.approx(m / res.iteration_seconds)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 5), st.integers(1, 9), st.booleans())
def test_peak_memory_gpipe_vs_1f1b(s: int, m: int, recompute: bool) -> None:
    """Peak memory = the cost model's memory at its in-flight micro-batches: M for GPipe,
    min(S - s, M) for 1F1B, so 1F1B never needs more."""
    g = _chain(s, 1.0, 2.0, out_bytes=1000, params=64)
    plan = _plan([[i] for i in range(s)], [[i] for i in range(s)])
    topo = _flat(s)
    cm = CostModel(g, topo, recompute=recompute)
    peaks = {}
    for name in ("gpipe", "1f1b"):
        res = simulate(plan, g, topo, schedule=name, num_microbatches=m, recompute=recompute)
        want = cm.partition_memory_bytes(np.arange(s), s,
                                         in_flight=in_flight_microbatches(s, m, name))
        assert res.peak_memory_bytes == pytest.approx(want.tolist())
        peaks[name] = np.array(res.peak_memory_bytes)
    assert np.all(peaks["1f1b"] <= peaks["gpipe"])
    if m > s and not recompute:
        assert peaks["1f1b"][0] < peaks["gpipe"][0]


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_one_stage_replicas_add_the_allreduce(replicas: int) -> None:
    g = _chain(3, 0.5, 1.0, params=8_000_000)
    topo = build("dgx1", boxes=1)
    devs = [0, 3, 6, 1][:replicas]
    res = simulate(_plan([[0, 1, 2]], [devs]), g, topo, schedule="1f1b", num_microbatches=4,
                   optimizer="sgd")
    ar = allreduce_seconds(topo, devs, 3 * 8_000_000)
    assert ar > 0
    assert res.allreduce_seconds[0] == pytest.approx(ar, rel=1e-9)
    # each replica computes its share of the micro-batch, but reads every weight (once in
    # a node's forward, twice in its backward) and accumulates all its gradients (3 of 4
    # backwards read two and write one), at the V100's 900 GB/s
    read = 3 * 3 * 8_000_000 / 900e9
    accumulate = 3 * 3 * 8_000_000 * (3 / 4) / 900e9
    per_mb = 4.5 / replicas + read * (1 - 1 / replicas) + accumulate
    assert res.iteration_seconds == pytest.approx(4 * per_mb + ar + res.optimizer_seconds,
                                                  rel=1e-9)


def test_lone_transfer_is_the_cost_model_time() -> None:
    """One micro-batch through 2 stages: f + (lat + bytes/bw) + f + b + (lat + bytes/bw) + b."""
    g = _chain(2, 1e-3, 2e-3, out_bytes=4_000_000)
    topo = build("dgx1", boxes=2)
    res = simulate(_plan([[0], [1]], [[0], [9]]), g, topo, schedule="gpipe",
                   num_microbatches=1, optimizer="sgd")
    hop = topo.transfer_seconds(0, 9, 4_000_000)
    assert res.pipeline_seconds == pytest.approx(2 * 3e-3 + 2 * hop, rel=1e-9)


def test_shared_link_halves_the_rate() -> None:
    """Two transfers crossing the same mesh link at once each get half its bandwidth."""
    # chains 0 -> 1 and 2 -> 3; stages on a 1x4 line so that 0->2 and 1->3 share link 1->2
    g = Graph.from_arrays(name="two", fwd_flops=np.zeros(4), src=[0, 2], dst=[1, 3],
                          fwd_seconds=np.full(4, 1.0), bwd_seconds=np.full(4, 0.5),
                          output_bytes=[1e9, 0, 1e9, 0])
    topo = build("mesh2d", shape=(1, 4), link_bandwidth=1e9, hop_latency=0.0)
    res = simulate(_plan([[0], [1], [2], [3]], [[0], [2], [1], [3]]), g, topo,
                   schedule="gpipe", num_microbatches=1, optimizer="sgd")
    # forward sends share link 1->2 (2 s each); gradients 2->0 and 3->1 share 2->1 too
    assert res.pipeline_seconds == pytest.approx(1.0 + 2.0 + 1.0 + 0.5 + 2.0 + 0.5, rel=1e-9)
    sends = [iv for iv in res.intervals if iv.kind == "activation"]
    assert [(iv.start, iv.end) for iv in sends] == [(1.0, 3.0), (1.0, 3.0)]


def test_a_device_sends_one_message_at_a_time() -> None:
    g = Graph.from_arrays(name="fork", fwd_flops=np.zeros(3), src=[0, 0], dst=[1, 2],
                          fwd_seconds=np.ones(3), bwd_seconds=np.ones(3),
                          output_bytes=[1e9, 0, 0])
    topo = _flat(3, bandwidth=1e9, latency=0.5)
    res = simulate(_plan([[0], [1], [2]], [[0], [1], [2]]), g, topo, schedule="gpipe",
                   num_microbatches=1, optimizer="sgd")
    sends = sorted((iv.start, iv.end, iv.peer) for iv in res.intervals
                   if iv.kind == "activation")
    assert sends == [(1.0, 2.5, 1), (2.5, 4.0, 2)]


def _random_plan(rng: np.random.Generator, n: int, s: int, r: int, topo: Topology):
    src = np.arange(n - 1)
    dst = np.arange(1, n)
    extra = rng.integers(0, n, size=(n // 3, 2))
    extra = extra[extra[:, 0] < extra[:, 1]]
    g = Graph.from_arrays(name="rand", fwd_flops=rng.uniform(1e9, 5e11, n),
                          src=np.concatenate([src, extra[:, 0]]),
                          dst=np.concatenate([dst, extra[:, 1]]),
                          output_bytes=rng.integers(1, 50_000_000, n),
                          param_bytes=rng.integers(0, 20_000_000, n))
    cuts = np.sort(rng.choice(np.arange(1, n), size=s - 1, replace=False))
    parts = np.split(np.arange(n), cuts)
    devs = rng.permutation(topo.num_devices)[: s * r].reshape(s, r)
    return g, _plan([p.tolist() for p in parts], devs.tolist())


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([(4, 1), (2, 2), (8, 1), (4, 4), (2, 8)]),
       st.integers(1, 6), st.sampled_from(["gpipe", "1f1b"]), st.booleans())
def test_never_below_the_lower_bounds(seed: int, sr: tuple[int, int], m: int, name: str,
                                      recompute: bool) -> None:
    s, r = sr
    topo = build("dgx1", boxes=2)
    g, plan = _random_plan(np.random.default_rng(seed), 40, s, r, topo)
    res = simulate(plan, g, topo, schedule=name, num_microbatches=m, recompute=recompute)
    cm = CostModel(g, topo, recompute=recompute)
    d = s * r
    fwd, bwd = cm.node_seconds(0)
    assert res.iteration_seconds >= res.ideal_seconds * (1 - 1e-12)
    assert res.iteration_seconds >= m * (fwd + bwd).sum() / d * (1 - 1e-12)
    if r == 1:
        assert res.iteration_seconds >= m * cm.lower_bound_seconds(d) * (1 - 1e-12)
    # the pipeline can never beat one micro-batch's trip through every stage and back
    comp = cm.compute_matrix(plan.assignment(g.num_nodes), s)
    per_stage = np.array([comp[st_, plan.stages[st_].devices[0]] for st_ in range(s)]) / r
    assert res.pipeline_seconds >= per_stage.sum() * (1 - 1e-12)
    assert 0.0 <= res.bubble_fraction < 1.0


def test_interleaved_runs_on_fewer_devices() -> None:
    g = _chain(4, 1.0, 2.0)
    plan = _plan([[i] for i in range(4)], [[i] for i in range(4)])
    res = simulate(plan, g, _flat(4), schedule="interleaved-1f1b", num_microbatches=4,
                   optimizer="sgd")
    assert res.devices == (0, 1)
    assert res.busy_seconds == pytest.approx([2 * 4 * 3.0] * 2)
    # one stage per rank would take (M + S - 1)(f + b) = 7 * 3 on 4 devices
    assert res.iteration_seconds < 2 * 4 * 3.0 * 1.5


def test_stage_order_follows_the_stage_graph() -> None:
    g = _chain(3, 1.0, 1.0)
    res = simulate(_plan([[2], [0], [1]], [[0], [1], [2]]), g, _flat(3), schedule="gpipe",
                   num_microbatches=2, optimizer="sgd")
    assert res.stage_order == (1, 2, 0)
    assert res.iteration_seconds == pytest.approx(4 * 2.0)


def test_errors() -> None:
    g = _chain(2, 1.0, 1.0)
    topo = _flat(4)
    cyc = Graph.from_arrays(name="c", fwd_flops=np.zeros(3), src=[0, 1], dst=[1, 2])
    with pytest.raises(ShardplanError, match="cycle"):
        simulate(_plan([[0, 2], [1]], [[0], [1]]), cyc, topo)
    with pytest.raises(ShardplanError, match="microbatches must be an integer >= 1"):
        simulate(_plan([[0], [1]], [[0], [1]]), g, topo, num_microbatches=0)
    bad = Schedule.from_text("0F0,0F1,0B0,0B1,0REDUCE_GRAD\n1F1,1B1,1F0,1B0,1REDUCE_GRAD\n")
    # rank 1 starts with micro-batch 1 and rank 0 sends it only after micro-batch 0: fine
    simulate(_plan([[0], [1]], [[0], [1]]), g, topo, schedule=bad)
    dead = Schedule.from_text("0F0,0B0,0F1,0B1,0REDUCE_GRAD\n1F1,1B1,1F0,1B0,1REDUCE_GRAD\n")
    with pytest.raises(ShardplanError, match="deadlocks: rank"):
        simulate(_plan([[0], [1]], [[0], [1]]), g, topo, schedule=dead)
    unreachable = Topology(name="u", devices=(Device("a", 1e9, 1e12), Device("b", 1e9, 1e12)),
                           bandwidth=[[0, 0], [0, 0]], latency=[[0, 0], [0, 0]])
    g2 = _chain(2, 1.0, 1.0, out_bytes=8)
    with pytest.raises(ShardplanError, match="cannot be reached"):
        simulate(_plan([[0], [1]], [[0], [1]]), g2, unreachable)


@pytest.mark.parametrize("m", [1, 3, 5])
def test_stages_with_different_replica_counts(m: int) -> None:
    """Stage 0 on one device (1 s forward, 1 s backward per micro-batch), stage 1 split over
    two replicas (0.5 s each), free transfers, GPipe: stage 0's forwards end at M, stage 1's
    backwards run from M + 0.5 every 0.5 s, stage 0's backward m waits for them: 2M + 1."""
    g = _chain(2, 1.0, 1.0, out_bytes=1000)
    plan = _plan([[0], [1]], [[0], [1, 2]])
    res = simulate(plan, g, _flat(3), schedule="gpipe", num_microbatches=m, optimizer="sgd")
    assert res.iteration_seconds == pytest.approx(2 * m + 1, rel=1e-9)
    # replica 0 of stage 0 sends half of its output to each replica of stage 1
    sent = [iv for iv in res.intervals if iv.kind == "activation" and iv.microbatch == 0]
    assert sorted(iv.peer for iv in sent) == [1, 2]


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 4), st.integers(1, 6), st.floats(0.1, 2.0),
       st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0]), st.sampled_from(["gpipe", "1f1b"]))
def test_no_overlap_is_never_faster(s: int, m: int, f: float, x: float, name: str) -> None:
    """A device that cannot compute while it communicates never finishes sooner; without
    bytes to send, or with one micro-batch on a chain (nothing to overlap), both agree."""
    g = _chain(s, f, 2 * f, out_bytes=1_000_000)
    topo = _flat(s, bandwidth=1e6 / x if x > 0 else 1e30)
    plan = _plan([[i] for i in range(s)], [[i] for i in range(s)])
    on = simulate(plan, g, topo, schedule=name, num_microbatches=m, optimizer="sgd")
    off = simulate(plan, g, topo, schedule=name, num_microbatches=m, optimizer="sgd",
                   overlap=False)
    assert off.iteration_seconds >= on.iteration_seconds * (1 - 1e-9)
    if m == 1 or x == 0.0:
        assert off.iteration_seconds == pytest.approx(on.iteration_seconds, rel=1e-9)


def test_settings_come_from_the_plan_and_flags_override_them() -> None:
    from shardplan.ir import ExecutionSettings

    g = _chain(2, 1.0, 1.0)
    plan = _plan([[0], [1]], [[0], [1]]).with_settings(
        ExecutionSettings(microbatches=3, schedule="gpipe", optimizer="sgd"))
    res = simulate(plan, g, _flat(2))
    assert res.num_microbatches == 3 and res.schedule.name == "gpipe"
    assert res.iteration_seconds == pytest.approx((3 + 1) * 2.0)
    assert simulate(plan, g, _flat(2), num_microbatches=5).num_microbatches == 5
    # a micro-batch of twice the graph's batch doubles every compute time
    big = simulate(plan, g, _flat(2), microbatch_size=2 * g.batch_size)
    assert big.iteration_seconds == pytest.approx(2 * res.iteration_seconds)
    assert big.samples_per_iteration == 2 * res.samples_per_iteration == 6 * g.batch_size


def _dp_plan(r: int) -> Plan:
    return _plan([[0, 1, 2, 3]], [list(range(r))])


def test_gradient_sync_modes() -> None:
    """DDP buckets overlap the last backward (never slower than one all-reduce at the end,
    equal when one bucket holds everything); FSDP with free transfers costs nothing more,
    and needs less memory for parameters."""
    from shardplan.ir import ExecutionSettings

    g = _chain(4, 1.0, 2.0, params=40_000_000)
    slow = _flat(2, bandwidth=1e9, latency=1e-5)
    free = _flat(2)
    base = ExecutionSettings(microbatches=3, schedule="gpipe", optimizer="sgd")
    plan = _dp_plan(2).with_settings(base)
    end = simulate(plan, g, slow)
    ar = allreduce_seconds(slow, [0, 1], 4 * 40_000_000)
    opt = end.optimizer_seconds
    # each replica: 4 nodes x (1 + 2) s / 2 = 6 s per micro-batch, then the all-reduce
    assert end.iteration_seconds == pytest.approx(3 * 6 + ar + opt, rel=1e-9)
    small = simulate(plan, g, slow, gradient_sync="bucketed", bucket_bytes=40_000_000)
    one = simulate(plan, g, slow, gradient_sync="bucketed", bucket_bytes=10**9)
    assert one.iteration_seconds == pytest.approx(end.iteration_seconds, rel=1e-9)
    assert small.iteration_seconds < end.iteration_seconds
    # four buckets of 40 MB, ready every second of the last 4 s backward: each is reduced
    # before the next is ready, so only the last one's all-reduce is exposed
    per = allreduce_seconds(slow, [0, 1], 40_000_000)
    assert small.iteration_seconds == pytest.approx(3 * 6 + per + opt, rel=1e-9)
    fsdp = simulate(plan, g, free, gradient_sync="sharded", bucket_bytes=40_000_000)
    # free transfers: the compute, and each replica steps its half of the parameters
    assert fsdp.iteration_seconds == pytest.approx(3 * 6 + opt / 2, rel=1e-9)
    assert max(fsdp.peak_memory_bytes) < max(end.peak_memory_bytes)
    slow_fsdp = simulate(plan, g, slow, gradient_sync="sharded", bucket_bytes=40_000_000)
    assert slow_fsdp.iteration_seconds > fsdp.iteration_seconds


def test_fsdp_on_cpu_ranks_waits_for_every_collective_and_reduces_the_root() -> None:
    """FSDP2 calls its collectives synchronously: on CPU ranks (devices noted ``device:
    cpu``, as ``topology measure`` writes them) every unit's all-gather is waited for in
    full where it is issued (nothing prefetched), and so is every reduce-scatter of the
    last backward; the root's gradients (its parameters gathered in the forward only) are
    reduced when the backward ends. Elsewhere the next unit's gather overlaps this unit's
    compute."""
    from shardplan.ir import ExecutionSettings

    g = Graph.from_arrays(name="g", fwd_flops=np.zeros(4), src=[0, 1, 2], dst=[1, 2, 3],
                          fwd_seconds=np.full(4, 1.0), bwd_seconds=np.full(4, 2.0),
                          param_bytes=np.full(4, 1000),
                          modules=["emb", "blocks.0.fc", "blocks.1.fc", "head"])
    base = _flat(2)

    def topo(seconds: float, extra: dict) -> Topology:
        curve = [[1.0, seconds], [1e6, seconds]]
        return Topology(name="t", devices=tuple(Device(d.name, d.memory_bytes, d.flops, extra)
                                                for d in base.devices),
                        bandwidth=base.bandwidth, latency=base.latency,
                        meta={"collectives": {k: {"2": curve} for k in
                                              ("allgather", "reducescatter", "allreduce")}})

    m = 3
    plan = _dp_plan(2).with_settings(ExecutionSettings(microbatches=m, schedule="gpipe",
                                                       optimizer="sgd",
                                                       gradient_sync="sharded"))
    cpu = simulate(plan, g, topo(0.25, {"device": "cpu"}), timeline=True)
    free = simulate(plan, g, topo(1e-12, {"device": "cpu"}))
    # per micro-batch: 3 gathers forward (root, blocks.0, blocks.1), 2 backward (the
    # root kept); the last backward reduces blocks.1, blocks.0 and the root: all in line
    assert cpu.iteration_seconds - free.iteration_seconds == pytest.approx(
        (m * (3 + 2) + 3) * 0.25, rel=1e-6)
    kinds = [iv.kind for iv in cpu.intervals if iv.device == 0]
    assert kinds.count("reducescatter") == 3 and kinds.count("allgather") == m * 5
    gpu = simulate(plan, g, topo(0.25, {}))
    assert gpu.iteration_seconds < cpu.iteration_seconds - 0.25  # prefetched gathers
    # a root without parameters: nothing of it gathered, nothing reduced
    bare = Graph.from_arrays(name="g", fwd_flops=np.zeros(4), src=[0, 1, 2], dst=[1, 2, 3],
                             fwd_seconds=np.full(4, 1.0), bwd_seconds=np.full(4, 2.0),
                             param_bytes=[0, 1000, 1000, 0],
                             modules=["emb", "blocks.0.fc", "blocks.1.fc", "head"])
    cpu = simulate(plan, bare, topo(0.25, {"device": "cpu"}), timeline=True)
    free = simulate(plan, bare, topo(1e-12, {"device": "cpu"}))
    assert cpu.iteration_seconds - free.iteration_seconds == pytest.approx(
        (m * (2 + 2) + 2) * 0.25, rel=1e-6)
    assert [iv.kind for iv in cpu.intervals if iv.device == 0].count("reducescatter") == 2


def test_fsdp_on_cpu_ranks_pays_the_wait_after_each_units_computing() -> None:
    """On CPU ranks every FSDP unit's computing ends in a collective both ranks wait for:
    each pays ``host_sync_seconds``'s extra for its length (flat beyond its one point
    here: 0.1 s after any computing); GPU ranks (no ``device: cpu``) pay nothing."""
    from shardplan.ir import ExecutionSettings

    g = Graph.from_arrays(name="g", fwd_flops=np.zeros(4), src=[0, 1, 2], dst=[1, 2, 3],
                          fwd_seconds=np.full(4, 1.0), bwd_seconds=np.full(4, 2.0),
                          param_bytes=np.full(4, 1000),
                          modules=["emb", "blocks.0.fc", "blocks.1.fc", "head"])
    base = _flat(2)

    def topo(extra: dict) -> Topology:
        return Topology(name="t", devices=tuple(Device(d.name, d.memory_bytes, d.flops, extra)
                                                for d in base.devices),
                        bandwidth=base.bandwidth, latency=base.latency)

    m = 3
    plan = _dp_plan(2).with_settings(ExecutionSettings(microbatches=m, schedule="gpipe",
                                                       optimizer="sgd",
                                                       gradient_sync="sharded"))
    sync = {"host_sync_seconds": [[1e-9, 0.1]]}
    plain = simulate(plan, g, topo({"device": "cpu"})).iteration_seconds
    # per micro-batch 3 units' computing in the forward (root, blocks.0, blocks.1) and 2
    # in the backward (blocks.1, blocks.0), each ending in a gather or a reduction
    waits = simulate(plan, g, topo({"device": "cpu", **sync})).iteration_seconds
    assert waits - plain == pytest.approx(m * (3 + 2) * 0.1, rel=1e-9)
    assert simulate(plan, g, topo(sync)).iteration_seconds == pytest.approx(
        simulate(plan, g, topo({})).iteration_seconds, rel=1e-12)
    # data parallel without FSDP's units: no collective between computings
    ddp = plan.with_settings(ExecutionSettings(microbatches=m, schedule="gpipe",
                                               optimizer="sgd", gradient_sync="bucketed"))
    assert simulate(ddp, g, topo({"device": "cpu", **sync})).iteration_seconds == \
        pytest.approx(simulate(ddp, g, topo({"device": "cpu"})).iteration_seconds, rel=1e-12)


def test_measured_collective_curve_replaces_the_ring() -> None:
    """A topology with a measured all-reduce curve for 2 devices: the stage's all-reduce
    takes the curve's time, interpolated in the bytes."""
    g = _chain(2, 1.0, 1.0, params=1_000_000)
    topo = _flat(2, bandwidth=1e12)
    curve = {"allreduce": {"2": [[1e6, 0.5], [4e6, 2.0]]}}
    measured = Topology(name="m", devices=topo.devices, bandwidth=topo.bandwidth,
                        latency=topo.latency, meta={"collectives": curve})
    plan = _plan([[0, 1]], [[0, 1]])
    res = simulate(plan, g, measured, schedule="gpipe", num_microbatches=1, optimizer="sgd")
    # 2 MB of gradients: halfway between 1 MB (0.5 s) and 4 MB (2.0 s) is 1.0 s
    assert res.allreduce_seconds[0] == pytest.approx(1.0, rel=1e-9)
    assert res.iteration_seconds == pytest.approx(1.0 + 1.0 + 1.0 + res.optimizer_seconds,
                                                  rel=1e-9)
    assert allreduce_seconds(measured, [0, 1], 2e6) == pytest.approx(1.0)


def _zb_chain(num: int, f: float, b: float) -> Graph:
    """Measured f / b seconds per node; FLOPs make each W half of a backward of 2 f."""
    return Graph.from_arrays(name="chain", fwd_flops=np.full(num, 1e9),
                             bwd_flops=np.full(num, 2e9), src=np.arange(num - 1),
                             dst=np.arange(1, num), fwd_seconds=np.full(num, f),
                             bwd_seconds=np.full(num, b), param_bytes=np.full(num, 64))


def test_split_backward_hand_computed() -> None:
    """Two stages, one micro-batch, f = 1, b = 2 split into I = W = 1: the first stage's
    backward starts after the second's I (at 3), so the pipeline ends at 5, not 6."""
    g = _zb_chain(2, 1.0, 2.0)
    plan = _plan([[0], [1]], [[0], [1]])
    zb = Schedule.from_text("0F0,0I0,0W0\n1F0,1I0,1W0\n")
    res = simulate(plan, g, _flat(2), schedule=zb, optimizer="sgd")
    assert res.pipeline_seconds == pytest.approx(5.0)
    whole = simulate(plan, g, _flat(2), schedule="1f1b", num_microbatches=1, optimizer="sgd")
    assert whole.pipeline_seconds == pytest.approx(6.0)
    kinds = sorted((iv.kind, iv.stage, round(iv.start, 9), round(iv.end, 9))
                   for iv in res.intervals if iv.kind in "FIW")
    assert kinds == [("F", 0, 0, 1), ("F", 1, 1, 2), ("I", 0, 3, 4), ("I", 1, 2, 3),
                     ("W", 0, 4, 5), ("W", 1, 3, 4)]
    assert res.busy_seconds == pytest.approx(whole.busy_seconds)


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 5), st.integers(1, 8))
def test_split_backward_never_slower_than_1f1b(s: int, m: int) -> None:
    """1F1B with every B written as I then W at once: the gradient leaves earlier, the
    same work is done, so never slower; memory is held to the W (same peak)."""
    from shardplan.simulate import one_f_one_b

    g = _zb_chain(s, 1.0, 2.0)
    plan = _plan([[i] for i in range(s)], [[i] for i in range(s)])
    base = one_f_one_b(s, m)
    text = "\n".join(",".join(f"{a.stage}I{a.microbatch},{a.stage}W{a.microbatch}"
                              if a.op == "B" else str(a) for a in row) for row in base.ranks)
    zb = Schedule.from_text(text)
    a = simulate(plan, g, _flat(s), schedule=base, optimizer="sgd")
    b = simulate(plan, g, _flat(s), schedule=zb, optimizer="sgd")
    assert b.pipeline_seconds <= a.pipeline_seconds * (1 + 1e-9)
    assert b.busy_seconds == pytest.approx(a.busy_seconds)
    assert b.peak_memory_bytes == pytest.approx(a.peak_memory_bytes)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                  "ZBVZeroBubble", "DualPipeV"])
def test_simulates_torch_schedules(name: str) -> None:
    """torch's multi-stage schedules (2 ranks x 2 stages, 4 micro-batches) run on a 4-stage
    chain: every rank's work is done once, and the stages its rank does not run stay idle."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    ops = get_schedule_ops(name, 2, 4, num_stages_per_rank=2)
    sch = Schedule.from_text("".join(",".join("" if a is None else str(a) for a in row) + "\n"
                                     for row in ops))
    g = _zb_chain(4, 1.0, 2.0)
    plan = _plan([[i] for i in range(4)], [[i] for i in range(4)])
    res = simulate(plan, g, _flat(4), schedule=sch, optimizer="sgd")
    busy = dict(zip(res.devices, res.busy_seconds, strict=True))
    assert busy[0] == pytest.approx(2 * 4 * 3.0) and busy[1] == pytest.approx(2 * 4 * 3.0)
    assert res.pipeline_seconds >= 2 * 4 * 3.0


def test_optimizer_step_temporaries_are_the_peak_of_weight_heavy_stages() -> None:
    """Large parameters, small activations: the device peaks during its Adam step (two
    copies of its largest parameter tensor), at the cost model's memory, and not with SGD."""
    g = _chain(2, 1.0, 2.0, out_bytes=10, params=1000)
    plan = _plan([[0], [1]], [[0], [1]])
    topo = _flat(2)
    for opt, temp in (("adam", 2000.0), ("sgd", 0.0)):
        res = simulate(plan, g, topo, schedule="1f1b", num_microbatches=2, optimizer=opt)
        cm = CostModel(g, topo, optimizer=opt)
        want = cm.partition_memory_bytes(np.arange(2), 2,
                                         in_flight=in_flight_microbatches(2, 2, "1f1b"))
        assert res.peak_memory_bytes == pytest.approx(want.tolist())
        static = 1000 * 2 + 1000 * (2 if opt == "adam" else 0)  # params, grads, state
        opt_start = min(iv.start for iv in res.intervals if iv.kind == "OPT" and iv.device == 0)
        during = [m for t, m in res.memory_timeline[0] if t == opt_start]
        assert max(during) == pytest.approx(static + temp)
        assert res.peak_memory_bytes[0] == pytest.approx(static + max(temp, 2 * 10.0))


def test_a_deadline_stops_a_long_simulation() -> None:
    """A past deadline stops a simulation of many events with TimeLimitError; none leaves it
    unchanged (the search's --time-limit reaches into one simulation this way)."""
    import time

    from shardplan.errors import TimeLimitError

    g = _chain(4, 1.0, 2.0, out_bytes=8, params=8)
    t = _flat(16, bandwidth=1e9, latency=1e-6)
    plan = _plan([[0, 1], [2, 3]], [list(range(8)), list(range(8, 16))])
    full = simulate(plan, g, t, microbatches=64, timeline=False)
    later = simulate(plan, g, t, microbatches=64, timeline=False,
                     deadline=time.monotonic() + 3600)
    assert later.iteration_seconds == full.iteration_seconds
    with pytest.raises(TimeLimitError, match="deadline"):
        simulate(plan, g, t, microbatches=64, timeline=False, deadline=time.monotonic() - 1)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("m", [1, 3])
def test_sharded_sync_without_overlap_runs(seed: int, m: int) -> None:
    """FSDP units without overlap: a replica waiting for a unit's all-gather is idle, so its
    held messages go (the prefetched unit's ring waited forever: 'the schedule deadlocks'
    on every graph with two units or more); never faster than with overlap."""
    from shardplan import partition
    from shardplan.generate import layered

    g = layered(12, width=2, seed=seed, skip_probability=0.2, params_per_weight=1e4)
    t = _flat(4, bandwidth=1e9, latency=1e-5)
    for s, r in ((1, 4), (2, 2)):
        plan = partition(g, t, algorithm="uniform", stages=s, replicas=r)
        kw = dict(schedule="gpipe", microbatches=m, gradient_sync="sharded",
                  bucket_bytes=100_000, timeline=False)
        apart = simulate(plan, g, t, overlap=False, **kw)
        together = simulate(plan, g, t, overlap=True, **kw)
        assert apart.iteration_seconds >= together.iteration_seconds * (1 - 1e-12)


def _with_share(topo: Topology, shares: list[float]) -> Topology:
    import dataclasses

    return dataclasses.replace(topo, devices=tuple(
        dataclasses.replace(d, extra={**d.extra, "comm_cpu_share": s})
        for d, s in zip(topo.devices, shares, strict=True)))


def test_transfers_take_their_share_of_a_computing_ends_cpu() -> None:
    """GPipe, 2 stages, 2 micro-batches, forward 1 s, backward 2 s, messages 0.5 s. Worked
    by hand: the first activation streams during device 0's second forward (0.25 s owed
    at share 0.5, paid by its next computation, the first backward: 6.5-8.75); the first
    gradient streams during device 1's second backward (its optimizer step, 8-8.25); the
    other two find both ends idle. Owed CPU is only charged where the device's own share
    says so."""
    g = _chain(2, 1.0, 2.0, out_bytes=500_000)
    plan = _plan([[0], [1]], [[0], [1]])
    kw = dict(schedule="gpipe", num_microbatches=2, optimizer="sgd")
    free = simulate(plan, g, _flat(2, bandwidth=1e6), **kw)
    assert free.iteration_seconds == pytest.approx(11.0)

    def spans(res: object) -> dict[tuple[int, str, object], tuple[float, float]]:
        return {(iv.device, iv.kind, iv.microbatch): (iv.start, iv.end)
                for iv in res.intervals}

    both = simulate(plan, g, _with_share(_flat(2, bandwidth=1e6), [0.5, 0.5]), **kw)
    assert both.iteration_seconds == pytest.approx(11.25)
    got = spans(both)
    assert got[(0, "B", 0)] == pytest.approx((6.5, 8.75))
    assert got[(1, "OPT", None)] == pytest.approx((8.0, 8.25))
    assert got[(0, "B", 1)] == pytest.approx((9.25, 11.25))
    one = simulate(plan, g, _with_share(_flat(2, bandwidth=1e6), [0.0, 0.5]), **kw)
    assert one.iteration_seconds == pytest.approx(11.0)
    assert spans(one)[(0, "B", 0)] == pytest.approx((6.5, 8.5))
    assert spans(one)[(1, "OPT", None)] == pytest.approx((8.0, 8.25))


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 4), st.integers(1, 6), st.floats(0.1, 2.0),
       st.sampled_from([0.1, 0.5, 1.0]), st.sampled_from([0.25, 1.0, 3.0]),
       st.sampled_from(["gpipe", "1f1b"]))
def test_a_cpu_share_never_speeds_up(s: int, m: int, f: float, x: float, share: float,
                                     name: str) -> None:
    """Transfers that take CPU from computing ends never finish an iteration sooner; on a
    chain with one micro-batch every message finds its ends idle: nothing changes."""
    g = _chain(s, f, 2 * f, out_bytes=1_000_000)
    plan = _plan([[i] for i in range(s)], [[i] for i in range(s)])
    kw = dict(schedule=name, num_microbatches=m, optimizer="sgd")
    free = simulate(plan, g, _flat(s, bandwidth=1e6 / x), **kw)
    taxed = simulate(plan, g, _with_share(_flat(s, bandwidth=1e6 / x), [share] * s), **kw)
    assert taxed.iteration_seconds >= free.iteration_seconds * (1 - 1e-9)
    if m == 1:
        assert taxed.iteration_seconds == pytest.approx(free.iteration_seconds, rel=1e-9)


def test_a_transfer_spanning_several_computations_owes_all_of_them() -> None:
    """GPipe, 2 stages, 3 micro-batches, 1 s per forward and backward, 1.5 s messages: the
    first activation (1-2.5) streams through device 0's second and third forwards, 1.5 s
    of its compute at share 1, paid by its first backward (11-13.5, 1 s without); the first
    gradient (9.5-11) streams through device 1's second and third backwards, paid by its
    optimizer step (11.5-13). Messages that find an end idle (the later activations at
    device 1) owe it nothing."""
    g = _chain(2, 1.0, 1.0, out_bytes=1_500_000)
    plan = _plan([[0], [1]], [[0], [1]])
    kw = dict(schedule="gpipe", num_microbatches=3, optimizer="sgd")

    def spans(shares: list[float]) -> tuple[float, dict[tuple[int, str, object], tuple]]:
        res = simulate(plan, g, _with_share(_flat(2, bandwidth=1e6), shares), **kw)
        return res.iteration_seconds, {(iv.device, iv.kind, iv.microbatch):
                                       (iv.start, iv.end) for iv in res.intervals}

    base, free = spans([0.0, 0.0])
    assert base == pytest.approx(17.0) and free[(0, "B", 0)] == pytest.approx((11.0, 12.0))
    sender, got = spans([1.0, 0.0])
    assert sender == pytest.approx(18.5)
    assert got[(0, "B", 0)] == pytest.approx((11.0, 13.5))
    assert got[(1, "F", 1)] == pytest.approx((5.0, 6.0))
    receiver, got = spans([0.0, 1.0])
    assert receiver == pytest.approx(17.0)
    assert got[(1, "F", 1)] == pytest.approx((5.0, 6.0))
    assert got[(1, "F", 2)] == pytest.approx((7.5, 8.5))
    assert got[(1, "OPT", None)] == pytest.approx((11.5, 13.0))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.integers(1, 5), st.floats(0.2, 2.0), st.floats(0.1, 3.0),
       st.lists(st.sampled_from([0.0, 0.3, 1.0]), min_size=4, max_size=4),
       st.sampled_from(["gpipe", "1f1b"]))
def test_owed_cpu_is_the_share_of_each_messages_overlap_with_compute(
        s: int, m: int, f: float, x: float, shares: list[float], name: str) -> None:
    """Read back from the finished timeline: every device computes for its computations'
    own seconds plus its share of the time each message of its was in flight beside its
    computations (messages delivered before its optimizer step starts: what comes later
    has no computation left to be charged to)."""
    g = _chain(s, f, 1.3 * f, out_bytes=1_000_000)
    plan = _plan([[i] for i in range(s)], [[i] for i in range(s)])
    kw = dict(schedule=name, num_microbatches=m, optimizer="sgd")
    free = simulate(plan, g, _flat(s, bandwidth=1e6 / x), **kw)
    res = simulate(plan, g, _with_share(_flat(s, bandwidth=1e6 / x), shares[:s]), **kw)
    compute = ("F", "B", "OPT")
    for d in range(s):
        spans = [(iv.start, iv.end) for iv in res.intervals
                 if iv.device == d and iv.kind in compute]
        extra = sum(e - b for b, e in spans) - sum(
            iv.end - iv.start for iv in free.intervals if iv.device == d and iv.kind in compute)
        opt_start = next(iv.start for iv in res.intervals if iv.device == d and iv.kind == "OPT")
        owed = 0.0
        for iv in res.intervals:
            if iv.kind in compute or d not in (iv.device, iv.peer) or iv.end > opt_start:
                continue
            owed += sum(max(0.0, min(e, iv.end) - max(b, iv.start)) for b, e in spans)
        assert extra == pytest.approx(shares[d] * owed, rel=1e-6, abs=1e-9)


def test_zero1_reduce_scatters_steps_a_shard_and_all_gathers_after_the_step() -> None:
    """The distributed optimizer: one ring reduce-scatter after the last backward, each
    replica steps half the parameters, then one ring all-gather; uncontended the two
    collectives take an all-reduce's time, so the iteration is the all-reduce run's less
    half its optimizer step; memory less than DDP's (master and Adam state sharded)."""
    from shardplan.ir import ExecutionSettings

    g = _chain(4, 1.0, 2.0, params=40_000_000)
    slow = _flat(2, bandwidth=1e9, latency=1e-5)
    plan = _dp_plan(2).with_settings(ExecutionSettings(microbatches=3, schedule="gpipe",
                                                       optimizer="adam",
                                                       precision="bf16"))
    end = simulate(plan, g, slow)
    zero1 = simulate(plan, g, slow, gradient_sync="zero1", timeline=True)
    ar = allreduce_seconds(slow, [0, 1], 4 * 40_000_000)
    opt = end.optimizer_seconds
    assert end.iteration_seconds == pytest.approx(3 * 6 + ar + opt, rel=1e-9)
    assert zero1.iteration_seconds == pytest.approx(3 * 6 + ar + opt / 2, rel=1e-9)
    kinds = [iv.kind for iv in zero1.intervals if iv.device == 0]
    assert kinds.index("reducescatter") < kinds.index("OPT") < kinds.index("allgather")
    assert max(zero1.peak_memory_bytes) < max(end.peak_memory_bytes)
