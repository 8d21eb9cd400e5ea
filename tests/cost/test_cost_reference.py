"""The vectorised cost model against a plain-Python reference on random graphs (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan.cost import (
    CostModel,
    lower_bound_seconds,
    partition_compute_seconds,
    partition_memory_bytes,
    stage_memory_bytes,
    stage_traffic,
)
from shardplan.ir import Device, Graph, Topology

FACTOR = {"sgd": 0, "sgd-momentum": 1, "adam": 2}


# ---------------------------------------------------------------------- the reference
def ref_node_time(g: Graph, v: int, rate: float, speed: float, recompute: bool):
    def one(seconds, flops):
        if seconds is not None and not math.isnan(seconds[v]):
            return seconds[v] / speed
        return flops[v] / rate

    f = one(g.fwd_seconds, g.fwd_flops)
    b = one(g.bwd_seconds, g.bwd_flops)
    return f, (b + f if recompute else b)


def ref_tensors(g: Graph, a: list[int]) -> dict[tuple[int, int], float]:
    """(producer, consuming stage) -> bytes, for edges that cross stages with bytes > 0."""
    out: dict[tuple[int, int], float] = {}
    for s, d, b in zip(g.src.tolist(), g.dst.tolist(), g.edge_bytes.tolist(), strict=True):
        if a[s] != a[d] and b > 0:
            out[(s, a[d])] = max(out.get((s, a[d]), 0.0), float(b))
    return out


def ref_transfer(topo: Topology, i: int, j: int, nbytes: float) -> float:
    if i == j or nbytes <= 0:
        return 0.0
    bw = topo.bandwidth[i][j]
    return math.inf if bw <= 0 else topo.latency[i][j] + nbytes / bw


def ref_stage_seconds(g, topo, a, devices, *, efficiency, recompute, profile_flops):
    k, r = len(devices), len(devices[0])
    tensors = ref_tensors(g, a)
    result = []
    for s in range(k):
        worst = 0.0
        for i in range(r):
            d = devices[s][i]
            rate = topo.devices[d].flops * efficiency
            speed = 1.0 if profile_flops is None else topo.devices[d].flops / profile_flops
            comp = 0.0
            for v in range(g.num_nodes):
                if a[v] == s:
                    f, b = ref_node_time(g, v, rate, speed, recompute)
                    comp += f + b
            comm = 0.0
            for (u, t), nbytes in tensors.items():
                src_stage = a[u]
                if s not in (src_stage, t):
                    continue
                p, q = devices[src_stage][i], devices[t][i]
                comm += ref_transfer(topo, p, q, nbytes / r) + ref_transfer(topo, q, p, nbytes / r)
            worst = max(worst, comp / r + comm)
        result.append(worst)
    return result


def ref_memory(g, a, k, *, optimizer, in_flight, recompute, mixed, width, replicas):
    tensors = ref_tensors(g, a)
    indeg = [0] * g.num_nodes
    for d in g.dst.tolist():
        indeg[d] += 1
    out = []
    for s in range(k):
        params = sum(float(g.param_bytes[v]) for v in range(g.num_nodes) if a[v] == s)
        outputs = sum(float(g.output_bytes[v]) for v in range(g.num_nodes) if a[v] == s)
        inputs = sum(float(g.output_bytes[v]) for v in range(g.num_nodes)
                     if a[v] == s and indeg[v] == 0)
        received = sum(b for (_, t), b in tensors.items() if t == s)
        if mixed:
            state = params * 4 / width * (1 + FACTOR[optimizer])
        else:
            state = params * FACTOR[optimizer]
        if recompute:
            acts = in_flight[s] * (received + inputs) + outputs - inputs
        else:
            acts = in_flight[s] * (outputs + received)
        extra = 0.0
        if g.memory_bytes is not None:
            extra = sum(float(g.memory_bytes[v]) for v in range(g.num_nodes)
                        if a[v] == s and not math.isnan(g.memory_bytes[v]))
        # the optimizer step's temporaries: Adam holds two copies of the largest parameter
        # tensor (a node's parameters here), fp32 under mixed precision
        largest = max((float(g.param_bytes[v]) for v in range(g.num_nodes) if a[v] == s),
                      default=0.0)
        temp = (2.0 if optimizer in ("adam", "adamw") else 0.0) * largest
        if mixed:
            temp *= 4 / width
        out.append(2 * params + state + max(acts / replicas, temp) + extra)
    return out


# ---------------------------------------------------------------------- random inputs
@st.composite
def problems(draw):
    n = draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    iu = np.triu_indices(n, 1)
    keep = rng.random(iu[0].size) < draw(st.floats(0, 1))
    src, dst = iu[0][keep], iu[1][keep]
    perm = rng.permutation(n)  # ids not topological
    measured = draw(st.sampled_from(["none", "some", "all"]))

    def seconds():
        if measured == "none":
            return None
        x = rng.random(n)
        if measured == "some":
            x[rng.random(n) < 0.5] = np.nan
        return x

    g = Graph.from_arrays(
        name="r", fwd_flops=rng.integers(0, 50, n).astype(float),
        bwd_flops=rng.integers(0, 100, n).astype(float), src=perm[src], dst=perm[dst],
        edge_bytes=rng.integers(0, 30, src.size), param_bytes=rng.integers(0, 100, n),
        output_bytes=rng.integers(0, 40, n), fwd_seconds=seconds(), bwd_seconds=seconds(),
        memory_bytes=None if rng.random() < 0.5 else np.where(rng.random(n) < 0.5, np.nan,
                                                              rng.random(n) * 10),
    )
    k = draw(st.integers(1, 4))
    r = draw(st.integers(1, 2))
    num_dev = k * r + draw(st.integers(0, 2))
    bw = rng.integers(1, 20, (num_dev, num_dev)).astype(float)
    bw[rng.random((num_dev, num_dev)) < 0.1] = 0.0  # a few unreachable pairs
    topo = Topology(name="t",
                    devices=tuple(Device(f"d{i}", 1e6, float(rng.integers(1, 5)))
                                  for i in range(num_dev)),
                    bandwidth=bw, latency=rng.random((num_dev, num_dev)))
    a = rng.integers(0, k, n)
    devices = rng.permutation(num_dev)[:k * r].reshape(k, r)
    return g, topo, a, devices


@settings(max_examples=150, deadline=None)
@given(prob=problems(), efficiency=st.sampled_from([1.0, 0.4]), recompute=st.booleans(),
       profile=st.sampled_from([None, 2.0]))
def test_stage_seconds_match_the_reference(prob, efficiency, recompute, profile) -> None:
    g, topo, a, devices = prob
    cm = CostModel(g, topo, efficiency=efficiency, recompute=recompute, profile_flops=profile)
    k = devices.shape[0]
    got = cm.stage_seconds(a, devices, k)
    want = ref_stage_seconds(g, topo, a.tolist(), devices.tolist(), efficiency=efficiency,
                             recompute=recompute, profile_flops=profile)
    assert got.tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(prob=problems(), optimizer=st.sampled_from(sorted(FACTOR)), recompute=st.booleans(),
       mixed=st.booleans(), replicas=st.integers(1, 3), data=st.data())
def test_memory_matches_the_reference(prob, optimizer, recompute, mixed, replicas,
                                      data) -> None:
    g, _, a, devices = prob
    k = devices.shape[0]
    in_flight = data.draw(st.lists(st.integers(0, 5), min_size=k, max_size=k))
    got = partition_memory_bytes(g, a, k, optimizer=optimizer, in_flight=in_flight,
                                 recompute=recompute, mixed_precision=mixed,
                                 param_dtype_bytes=2, replicas=replicas)
    want = ref_memory(g, a.tolist(), k, optimizer=optimizer, in_flight=in_flight,
                      recompute=recompute, mixed=mixed, width=2, replicas=replicas)
    assert got.tolist() == pytest.approx(want)
    s = int(a[0])
    one = stage_memory_bytes(g, np.flatnonzero(a == s), optimizer=optimizer,
                             in_flight=in_flight[s], recompute=recompute,
                             mixed_precision=mixed, replicas=replicas)
    assert one == pytest.approx(want[s])


@settings(max_examples=100, deadline=None)
@given(prob=problems())
def test_traffic_compute_and_bound_match_the_reference(prob) -> None:
    g, topo, a, devices = prob
    k = devices.shape[0]
    b, t = stage_traffic(g, a, k)
    want_b, want_t = np.zeros((k, k)), np.zeros((k, k))
    for (u, s), nbytes in ref_tensors(g, a.tolist()).items():
        want_b[a[u], s] += nbytes
        want_t[a[u], s] += 1
    assert np.array_equal(b, want_b) and np.array_equal(t, want_t)
    rates = topo.device_flops[devices[:, 0]]
    fwd, bwd = partition_compute_seconds(g, a, rates, num_stages=k)
    for s in range(k):
        times = [ref_node_time(g, v, rates[s], 1.0, False) for v in np.flatnonzero(a == s)]
        assert fwd[s] == pytest.approx(sum(x[0] for x in times))
        assert bwd[s] == pytest.approx(sum(x[1] for x in times))
    # the bound is below the best stage time of this (arbitrary) partition's slowest stage
    best = CostModel(g, topo).stage_seconds(a, devices[:, 0], k).max()
    assert lower_bound_seconds(g, topo, k) <= best + 1e-12
