"""PaSE strategies: the dynamic program against exhaustive enumeration, the cost formulas by
hand, the paper's AlexNet result, the baselines and the command line."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.generate import alexnet, rnnlm, transformer
from shardplan.strategy import Space, Tables, build_tables, configurations, solve
from shardplan.strategy._cost_pase import PaseCostModel
from shardplan.strategy._dp import TableTooLargeError, prune_dominated
from shardplan.topology import flat
from tests.helpers import run_cli


# ---------------------------------------------------------------- exactness vs enumeration
@st.composite
def random_tables(draw: st.DrawFn) -> Tables:
    n = draw(st.integers(1, 6))
    ks = [draw(st.integers(1, 4)) for _ in range(n)]
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
    chosen = [p for p in pairs if draw(st.booleans())]
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    # Small integers make ties (and the dedup/pruning paths) likely.
    node = tuple(rng.integers(0, 6, size=k).astype(float) for k in ks)
    edges = tuple((u, v, rng.integers(0, 6, size=(ks[u], ks[v])).astype(float))
                  for u, v in chosen)
    return Tables(graph="g", devices=4, cost_model="test", objective="pase_cost",
                  names=tuple(f"n{i}" for i in range(n)), dims=tuple(("x",) for _ in ks),
                  configs=tuple(np.arange(1, k + 1)[:, None] for k in ks), node_cost=node,
                  edges=edges)


def _enumerate(t: dict) -> float:
    """Independent exhaustive minimum over the JSON form of the tables."""
    costs = [nd["cost"] for nd in t["nodes"]]
    best = math.inf
    for combo in itertools.product(*(range(len(c)) for c in costs)):
        total = sum(costs[v][combo[v]] for v in range(len(costs)))
        total += sum(e["cost"][combo[e["src"]]][combo[e["dst"]]] for e in t["edges"])
        best = min(best, total)
    return best


@settings(max_examples=60, deadline=None)
@given(random_tables(), st.sampled_from(["generate-seq", "bfs"]), st.booleans())
def test_dp_equals_exhaustive_enumeration(tables: Tables, ordering: str, prune: bool) -> None:
    exported = json.loads(json.dumps(tables.to_dict()))
    again = Tables.from_dict(exported)
    res = solve(again, ordering=ordering, prune=prune)
    assert res.status == "optimal"
    assert res.value == pytest.approx(_enumerate(exported))
    assert again.evaluate(res.choice) == pytest.approx(res.value)


def test_prune_keeps_the_optimum_on_a_real_graph() -> None:
    tables = build_tables(transformer(num_layers=1), 8)
    reduced, keep = prune_dominated(tables)
    assert sum(len(k) for k in keep) < sum(len(c) for c in tables.configs)
    assert solve(tables, prune=False).value == pytest.approx(solve(tables, prune=True).value)


# ---------------------------------------------------------------- configurations and costs
def test_configurations_match_the_definition() -> None:
    space = Space(kind="gemm", dims=("b", "n", "k", "h"), sizes=(128, 12, 7, 64),
                  fixed=("h",), output=(("b",), ("n",)), output_shape=(128, 12),
                  attrs={"m": ["b"], "n": ["n"], "k": ["k"]})
    got = {tuple(int(x) for x in r) for r in configurations(space, 16, cutoff=4)}

    def allowed(d: int) -> list[int]:
        a = [e for e in range(1, d + 1) if d % e == 0 and d // e >= 4]
        return a or [1]

    want = {c for c in itertools.product(allowed(128), allowed(12), allowed(7), [1])
            if math.prod(c) <= 16}
    assert got == want
    assert all(r[1] in (1, 2, 3) for r in got)  # 12 / 4 = 3 is the last allowed split


def test_output_parts_multiply_the_factors_of_the_output_dimensions() -> None:
    """The output (b, n h) of a space split over b, n, k, h: its parts are b's factor
    times n's and h's; the reduced k splits no output. One row or many."""
    space = Space(kind="gemm", dims=("b", "n", "k", "h"), sizes=(8, 12, 6, 4),
                  output=(("b",), ("n", "h")), output_shape=(8, 48),
                  attrs={"m": ["b"], "n": ["n", "h"], "k": ["k"]})
    rows = np.array([[1, 1, 1, 1], [2, 3, 5, 1], [1, 2, 3, 4], [4, 1, 6, 2]])
    assert space.output_parts(rows).tolist() == [1.0, 6.0, 8.0, 8.0]
    assert space.output_parts(rows[1]).tolist() == [6.0]
    scalar = Space(kind="elementwise", dims=("b",), sizes=(8,), output=((),),
                   output_shape=(1,))
    assert scalar.output_parts(np.array([[4]])).tolist() == [1.0]


def test_gemm_cost_by_hand() -> None:
    space = Space(kind="gemm", dims=("b", "n", "k"), sizes=(8, 16, 32),
                  output=(("b",), ("n",)), output_shape=(8, 16),
                  attrs={"m": ["b"], "n": ["n"], "k": ["k"], "pw": 1})
    model = PaseCostModel()
    r = model.r
    assert r == 5000.0
    cost = model.node_cost(space, np.array([[2, 1, 4]]))[0]
    m, n, k = 4, 16, 8

    def ar(w: float, p: int) -> float:
        return 2 * r * w * (p - 1) / p

    want = 3 * m * n * k + 3 * m * n + ar(m * n, 4) + ar(m * k, 1) + ar(n * k, 2)
    assert cost == pytest.approx(want)


def test_edge_cost_by_hand_and_alternating_fc_is_free() -> None:
    model = PaseCostModel()
    fc = dict(kind="gemm", dims=("b", "n", "k"), output=(("b",), ("n",)),
              attrs={"m": ["b"], "n": ["n"], "k": ["k"]})
    a = Space(sizes=(8, 64, 64), output_shape=(8, 64), **fc)
    b = Space(sizes=(8, 64, 64), output_shape=(8, 64), inputs={"0": (("b",), ("k",))}, **fc)
    m = model.edge_cost(a, b, 0, np.array([[1, 4, 8], [2, 1, 1]]),
                        np.array([[1, 8, 4], [1, 1, 4]]), 0)
    assert m[0, 0] == 0.0  # (1,4,8) -> (1,8,4): the output split 4 ways is read 4 ways
    # (2,1,1) -> (1,1,4): S = (4, 64), Q = (8, 16); prod c_tgt 4 > 2, so all of Q moves.
    assert m[1, 1] == pytest.approx(2 * 5000 * 8 * 16)
    # (1,4,8) -> (1,1,4): same product, overlap min(8,8) * min(16,16).
    assert m[0, 1] == pytest.approx(0.0)


# ---------------------------------------------------------------- the paper's results
def test_alexnet_fc_layers_alternate_at_32_devices() -> None:
    g = alexnet()
    res = registry.run("strategy", "pase", g, flat(32))
    by_name = {g.names[int(k)]: v for k, v in res.plan.strategy.items()}
    assert by_name["fc1"] == (1, 4, 8)
    assert by_name["fc2"] == (1, 8, 4)
    assert by_name["fc3"] == (1, 4, 8)
    assert by_name["conv1"][0] == 32  # data parallel first convolution
    assert res.plan.status == "optimal"


def test_pase_beats_the_baselines_and_reports_recomputable_objectives() -> None:
    g, topo = rnnlm(), flat(16)
    values = {}
    for name in ("pase", "data-parallel", "expert"):
        res = registry.run("strategy", name, g, topo)
        tables = build_tables(g, 16)
        choice = [tables.index_of(v, res.plan.strategy[str(v)]) for v in range(g.num_nodes)]
        assert tables.evaluate(choice) == pytest.approx(res.plan.objective.value)
        assert res.plan.stages[0].devices == tuple(range(16))
        values[name] = res.plan.objective.value
    assert values["pase"] <= values["data-parallel"] and values["pase"] <= values["expert"]


def test_baseline_strategies_split_as_described() -> None:
    g = transformer(num_layers=1)
    dp = registry.run("strategy", "data-parallel", g, flat(16)).plan.strategy
    assert all(f[0] == 16 and math.prod(f) == 16 for f in dp.values())
    ex = registry.run("strategy", "expert", g, flat(16), model_parallel=8).plan.strategy
    i = g.names.index("encoder.0.attn.qk")  # dims (b, h, q, t, e)
    assert ex[str(i)] == (2, 8, 1, 1, 1)
    j = g.names.index("encoder.0.ffn2")  # dims (b, s, d, f): row split
    assert ex[str(j)] == (2, 1, 1, 8)


@pytest.mark.parametrize("devices", [4, 8, 16])
def test_expert_picks_its_model_parallel_degree_per_device_count(devices: int) -> None:
    g = transformer(num_layers=1)
    res = registry.run("strategy", "expert", g, flat(devices))
    meta = res.plan.meta
    tried = {int(k): v for k, v in meta["candidates"].items()}
    assert sorted(tried) == [m for m in (1, 2, 4, 8, 16) if devices % m == 0]
    for m, v in tried.items():  # each candidate is the fixed-degree expert's cost
        fixed = registry.run("strategy", "expert", g, flat(devices), model_parallel=m).plan
        assert fixed.objective.value == pytest.approx(v)
    assert meta["choice"] == min(tried, key=lambda m: (tried[m], m))
    assert res.plan.objective.value == pytest.approx(min(tried.values()))
    dp = registry.run("strategy", "data-parallel", g, flat(devices)).plan.objective.value
    assert res.plan.objective.value <= dp * (1 + 1e-12)  # m = 1 is data parallelism here


def test_data_parallel_says_when_the_batch_does_not_split_over_every_device() -> None:
    g = alexnet()  # batch 128, cutoff 4: at most 32-way batch splits
    plan = registry.run("strategy", "data-parallel", g, flat(64)).plan
    assert plan.meta["devices_used"] == 32 and "uses 32 of the 64 devices" in plan.meta["note"]
    plan = registry.run("strategy", "data-parallel", g, flat(32)).plan
    assert plan.meta["devices_used"] == 32 and "note" not in plan.meta


def test_bfs_runs_out_of_table_memory_and_time_limit_times_out() -> None:
    g = transformer(num_layers=1)
    with pytest.raises(TableTooLargeError, match="bfs ordering needs"):
        registry.run("strategy", "pase", g, flat(8), ordering="bfs", max_table_bytes=1e6)
    res = registry.run("strategy", "pase", g, flat(8), time_limit=1e-6)
    assert res.plan.status == "timed_out"
    assert math.isfinite(res.plan.objective.value)


def test_default_cost_model_memory_limit_rules_configurations_out() -> None:
    g = rnnlm()
    free = registry.run("strategy", "pase", g, flat(8), cost_model="default").plan
    assert free.objective.name == "iteration_seconds"
    # The embedding table (100000 x 2048 floats, x4 with gradient and optimizer state) is
    # 3.3 GB: 3 GB per device forces it to be split.
    tight = registry.run("strategy", "pase", g, flat(8), cost_model="default",
                         memory_limit=3e9).plan
    emb = tight.strategy["0"]  # (b, s, d, v)
    assert emb[2] * emb[3] >= 2
    assert tight.objective.value >= free.objective.value
    with pytest.raises(Exception, match="fits the memory limit"):
        registry.run("strategy", "pase", g, flat(8), cost_model="default", memory_limit=1e3)


# ---------------------------------------------------------------- command line
def test_cli_export_import_and_table(tmp_path: Path, capsys) -> None:
    graph = tmp_path / "g.json"
    assert run_cli(["generate", "alexnet", "-o", str(graph)]) == 0
    plan, tabs = tmp_path / "p.json", tmp_path / "t.json"
    assert run_cli(["strategy", str(graph), "--devices", "32", "-o", str(plan),
                    "--export-tables", str(tabs)]) == 0
    out = capsys.readouterr().out
    assert "fc2" in out and "(1,8,4)" in out and "optimal" in out
    data = json.loads(tabs.read_text())
    assert data["format"] == "shardplan.pase-tables/1" and len(data["nodes"]) == 13
    assert run_cli(["strategy", str(graph), "--devices", "32", "--import-tables", str(tabs),
                    "--json"]) == 0
    imported = json.loads(capsys.readouterr().out)
    first = json.loads(plan.read_text())
    assert imported["objective"]["value"] == pytest.approx(first["objective"]["value"])
    assert imported["strategy"] == first["strategy"]


@pytest.mark.parametrize("argv, match", [
    (["--algorithm", "pase", "-o", "X"], "give --devices N"),
    (["--devices", "4", "--algorithm", "magic", "-o", "X"], "unknown strategy algorithm"),
    (["--devices", "4"], "-o FILE or --json"),
    (["--devices", "4", "--algorithm", "expert", "--ordering", "bfs", "--json"],
     "--ordering applies"),
])
def test_cli_errors_are_one_line(argv: list[str], match: str, tmp_path: Path,
                                 capsys) -> None:
    graph = tmp_path / "g.json"
    assert run_cli(["generate", "rnnlm", "-o", str(graph)]) == 0
    capsys.readouterr()
    argv = [str(tmp_path / "o.json") if a == "X" else a for a in argv]
    assert run_cli(["strategy", str(graph), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardplan: error: ") and match in err


# ---------------------------------------------------------------- time limits and incumbents
def _chain_tables() -> Tables:
    """Two nodes whose own cheapest configurations (0, 0) re-shard expensively: per-node
    argmin costs 0 + 1 + 100, the greedy pass that prices the edge (0, 1) 0 + 2 + 2, the
    optimum (1, 1) 1 + 2 + 0."""
    return Tables(graph="g", devices=2, cost_model="test", objective="pase_cost",
                  names=("a", "b"), dims=(("x",), ("x",)),
                  configs=(np.array([[1], [2]]), np.array([[1], [2]])),
                  node_cost=(np.array([0.0, 1.0]), np.array([1.0, 2.0])),
                  edges=((0, 1, np.array([[100.0, 2.0], [1.0, 0.0]])),))


def test_a_search_out_of_time_returns_a_greedy_pass_that_prices_edges() -> None:
    from shardplan.strategy._dp import greedy_choice, lower_bound

    t = _chain_tables()
    assert t.evaluate([0, 0]) == 101.0
    assert greedy_choice(t).tolist() == [0, 1] and t.evaluate([0, 1]) == 4.0
    res = solve(t, deadline=0.0)  # already expired: before pruning
    assert res.status == "timed_out" and res.choice.tolist() == [0, 1] and res.value == 4.0
    res = solve(t, deadline=0.0, incumbent=np.array([1, 1]))
    assert res.choice.tolist() == [1, 1] and res.value == 3.0
    assert solve(t).value == 3.0 and lower_bound(t) == 0.0 + 1.0 + 0.0


def test_time_limit_counts_table_building_and_returns_data_parallelism() -> None:
    g = transformer(num_layers=2)
    res = registry.run("strategy", "pase", g, flat(64), time_limit=1e-4)
    plan = res.plan
    assert plan.status == "timed_out" and plan.meta["incumbent"] == "data-parallel"
    dp = registry.run("strategy", "data-parallel", g, flat(64)).plan
    assert plan.strategy == dp.strategy
    assert plan.objective.value == pytest.approx(dp.objective.value)


def test_a_huge_dimension_costs_no_more_than_a_small_one() -> None:
    from shardplan.strategy.spaces import allowed_factors

    assert allowed_factors(10**15, 64, 4) == [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64]
    assert allowed_factors(7, 64, 4) == [1] and allowed_factors(12, 8, 4) == [1, 2, 3]
    space = Space(kind="elementwise", dims=("b", "n"), sizes=(2**52, 3),
                  output=(("b",), ("n",)), output_shape=(2**52, 3))
    # b splits 1, 2, 4, 8, 16 ways; with n split 3 ways only b in 1, 2, 4 fit in 16 devices
    assert configurations(space, 16, 1).shape == (5 + 3, 2)


def test_cli_import_tables_without_a_graph(tmp_path: Path, capsys) -> None:
    graph = tmp_path / "g.json"
    assert run_cli(["generate", "alexnet", "-o", str(graph)]) == 0
    tabs = tmp_path / "t.json"
    assert run_cli(["strategy", str(graph), "--devices", "8", "--export-tables", str(tabs)]) == 0
    capsys.readouterr()
    assert run_cli(["strategy", "--import-tables", str(tabs), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["status"] == "optimal" and len(plan["strategy"]) == 13
    assert plan["stages"][0]["devices"] == list(range(8))
    assert run_cli(["strategy", "--import-tables", str(tabs), "-o", str(tmp_path / "p.json")]) \
        == 0
    assert "conv1" in capsys.readouterr().out
    for argv, match in ((["--devices", "4"], "tables are for 8 devices"),
                        (["--cutoff", "2"], "--cutoff does not apply"),
                        (["--export-tables", str(tmp_path / "u.json")], "do not go together")):
        assert run_cli(["strategy", "--import-tables", str(tabs), "--json", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and match in err
    assert run_cli(["strategy", "--devices", "4", "--json"]) == 2
    assert "give GRAPH" in capsys.readouterr().err


def test_default_cost_prices_allreduce_by_the_measured_curve() -> None:
    """A topology with a measured all-reduce curve for 2 devices: PaSE's default cost model
    (the search and the simulator's strategy stages) takes the curve's time for groups of 2,
    interpolated in the whole tensor's bytes, and keeps the ring formula for other sizes."""
    import numpy as np

    from shardplan.ir import Topology
    from shardplan.strategy._cost_default import DefaultCostModel
    from shardplan.strategy.spaces import Space
    from shardplan.topology import build

    flat = build("flat", num_devices=4, bandwidth=1e10, latency=1e-6)
    curve = {"allreduce": {"2": [[1e3, 1e-3], [1e6, 3e-3]]}}
    measured = Topology(name="m", devices=flat.devices, bandwidth=flat.bandwidth,
                        latency=flat.latency, meta={"collectives": curve})
    space = Space("elementwise", ("b", "n"), (8, 16))
    ring = DefaultCostModel(flat, 4).units.allreduce
    meas = DefaultCostModel(measured, 4).units.allreduce
    w = np.array([250.0, 250_000.0, 1000.0, 1000.0])
    p = np.array([2.0, 2.0, 4.0, 1.0])
    got = meas(w, p, space)
    whole = w[:2] * space.dtype_bytes
    expected = np.interp(whole, [1e3, 1e6], [1e-3, 3e-3])
    assert got[:2] == pytest.approx(expected, rel=1e-12)
    assert got[2:] == pytest.approx(ring(w, p, space)[2:], rel=1e-12)
    assert got[3] == 0.0
    assert not np.allclose(ring(w, p, space)[:2], got[:2])


def test_default_cost_charges_the_measured_dtensor_collective_overhead() -> None:
    """Devices that carry ``dtensor_collective_overhead_seconds`` (busy slowdown divided
    out, the largest of the devices used): every all-reduce over more than one device
    and each direction of a re-shard pay it once more; nothing else changes, and without
    the field nothing does."""
    import dataclasses

    import numpy as np

    from shardplan.ir import Topology
    from shardplan.strategy._cost_default import DefaultCostModel
    from shardplan.strategy.spaces import Space
    from shardplan.topology import build

    flat = build("flat", num_devices=4, bandwidth=1e10, latency=1e-6)
    extras = [{"dtensor_collective_overhead_seconds": v, "busy_slowdown": {"1": 1.0, "4": 2.0}}
              for v in (1e-3, 3e-3, 2e-3, 9.0)]  # the fourth device is not used
    devices = tuple(dataclasses.replace(d, extra={**d.extra, **x})
                    for d, x in zip(flat.devices, extras, strict=True))
    taxed = Topology(name="t", devices=devices, bandwidth=flat.bandwidth,
                     latency=flat.latency)
    plain, cm = DefaultCostModel(flat, 3), DefaultCostModel(taxed, 3)
    assert cm.collective_overhead == pytest.approx(3e-3 / 2.0)
    space = Space("elementwise", ("b", "n"), (8, 16))
    w, p = np.array([100.0, 100.0, 100.0]), np.array([1.0, 2.0, 3.0])
    assert (cm.units.allreduce(w, p, space) - plain.units.allreduce(w, p, space)
            ) == pytest.approx([0.0, 1.5e-3, 1.5e-3])
    fs = np.array([[2, 1], [1, 1]])
    ft = np.array([[1, 2], [2, 1]])
    base = plain.edge_cost(space, space, 0, fs, ft, 512.0)
    got = cm.edge_cost(space, space, 0, fs, ft, 512.0)
    assert (base > 0).any() and (base == 0).any()
    assert got == pytest.approx(np.where(base > 0, base + 3e-3, 0.0))


def test_default_cost_fallback_edge_gathers_a_split_the_consumer_does_not_describe() -> None:
    """A producer splitting its output on a dimension other than the batch, read by a
    consumer that does not describe the tensor (an opaque attention reading split heads):
    the consumer reads it whole, so the edge pays for the other part (both directions);
    a batch split read with the same batch split stays free, a replicated producer read
    whole too, and a consumer splitting the batch of a replicated producer pays for its
    part (PaSE's formula, unchanged). The search split every attention's heads for free
    before (a transformer's plan measured 2.5 times its prediction)."""
    import numpy as np

    from shardplan.strategy._cost_default import DefaultCostModel
    from shardplan.strategy.spaces import Space
    from shardplan.topology import build

    cm = DefaultCostModel(build("flat", num_devices=2, bandwidth=1e9, latency=0.0), 2)
    heads = Space(kind="transpose", dims=("b", "h", "s", "d"), sizes=(4, 4, 8, 16),
                  output=(("b",), ("h",), ("s",), ("d",)), output_shape=(4, 4, 8, 16))
    opaque = Space(kind="opaque", dims=("batch",), sizes=(4,))
    nbytes = 4.0 * 4 * 4 * 8 * 16
    fs = np.array([[1, 1, 1, 1], [1, 1, 1, 2], [2, 1, 1, 1], [2, 1, 1, 2]])
    ft = np.array([[1], [2]])
    got = cm.edge_cost(heads, opaque, 0, fs, ft, nbytes)
    word = 4.0 / 1e9
    words = nbytes / 4.0
    assert got[0].tolist() == [0.0, pytest.approx(2 * word * words / 2)]  # replicated
    assert got[1, 0] == pytest.approx(2 * word * words / 2)  # the other half of d
    assert got[2, 1] == 0.0  # batch split read by the batch: free
    assert got[3, 1] == pytest.approx(2 * word * words / 4)  # the batch's half of d
    # an output without the batch dimension (the batch reduced): the split of n alone is
    # the rest's, not divided by the batch's factor; the tensor is still read as
    # (batch 4, rest 16) words, each device holding a quarter of it: 3/4 to fetch
    reduced = Space(kind="elementwise", dims=("b", "n"), sizes=(4, 16),
                    output=(("n",),), output_shape=(16,))
    m = cm.edge_cost(reduced, opaque, 0, np.array([[2, 2]]), np.array([[1]]), 256.0)
    assert m[0, 0] == pytest.approx(2 * word * (64 - 16))
