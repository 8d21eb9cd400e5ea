"""The PaSE benchmark graphs under the ``pase`` cost model against an independent statement of
them (:mod:`tests.strategy.pase_reference`): the optimum and the data-parallel total agree to
the unit, one benchmark per test at one device count (all of 4-64 in the slow test)."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan import registry
from shardplan.generate import generate
from shardplan.strategy import build_tables, solve
from shardplan.topology import flat
from tests.strategy import pase_reference as ref


def _compare(kind: str, devices: int) -> None:
    net = ref.BENCHMARKS[kind]()
    tables = net.tables(devices)
    want = solve(tables).value
    want_dp = tables.evaluate(net.data_parallel(tables))
    g = generate(kind)
    assert g.num_nodes == len(net.nodes)
    # Layer by layer, in the same order: the same configurations, costs and edge matrices.
    ours = build_tables(g, devices)
    for v in range(g.num_nodes):
        assert np.array_equal(ours.configs[v], tables.configs[v]), (kind, v)
        np.testing.assert_allclose(ours.node_cost[v], tables.node_cost[v], rtol=1e-12,
                                   err_msg=f"{kind} node {v} {g.names[v]}")
    assert [(u, v) for u, v, _ in ours.edges] == [(u, v) for u, v, _ in tables.edges]
    for (u, v, m), (_, _, m_ref) in zip(ours.edges, tables.edges, strict=True):
        np.testing.assert_allclose(m, m_ref, rtol=1e-12, err_msg=f"{kind} edge {u}->{v}")
    got = registry.run("strategy", "pase", g, flat(devices)).plan
    got_dp = registry.run("strategy", "data-parallel", g, flat(devices)).plan
    assert got.status == "optimal"
    assert abs(got.objective.value - want) < 1.0, (kind, devices, got.objective.value, want)
    assert abs(got_dp.objective.value - want_dp) < 1.0, (kind, devices, got_dp.objective.value,
                                                         want_dp)


@pytest.mark.parametrize("kind, devices", [("alexnet", 32), ("inception-v3", 16),
                                           ("rnnlm", 64), ("transformer", 8)])
def test_benchmark_totals_match_the_reference(kind: str, devices: int) -> None:
    _compare(kind, devices)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [4, 8, 16, 32, 64])
@pytest.mark.parametrize("kind", sorted(ref.BENCHMARKS))
def test_benchmark_totals_match_the_reference_at_4_to_64(kind: str, devices: int) -> None:
    _compare(kind, devices)


def test_the_structure_the_prototype_builds() -> None:
    t = generate("transformer")
    pos = [i for i, n in enumerate(t.names) if n.endswith(".positional")]
    assert [t.names[i] for i in pos] == ["encoder.positional", "decoder.positional"]
    for i in pos:  # right after its embedding, an elementwise node
        assert t.spaces[i]["kind"] == "elementwise" and t.names[i - 1].endswith("embedding")
    assert {t.spaces[i]["pw"] for i, n in enumerate(t.names) if n.endswith(".ffn1")} == {2}
    inc = generate("inception-v3")
    convs = [sp for sp, op in zip(inc.spaces, inc.ops, strict=True) if op == "conv2d"]
    assert len(convs) == 94 and {sp["pw"] for sp in convs} == {0}
    a = generate("alexnet")
    assert {sp["pw"] for sp, op in zip(a.spaces, a.ops, strict=True) if op == "conv2d"} == {1}
    pools = [sp for sp in a.spaces if sp["kind"] == "pool"]
    assert [sp["input_hw"] for sp in pools] == [[55, 55], [27, 27], [13, 13]]
    assert np.all([sp["dims"][2][1] < sp["input_hw"][0] for sp in pools])
