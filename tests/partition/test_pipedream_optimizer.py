"""PipeDream's optimizer (``pipedream``) against an independent brute force on a small profile
written in PipeDream's format, and its sequence variant (``pipedream-sequence``)."""

from __future__ import annotations

import itertools
import json
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.errors import ShardplanError
from shardplan.generate import layered, random_dag
from shardplan.importers import load_pipedream
from shardplan.ir import Graph, load_plan, save
from shardplan.objectives import evaluate
from shardplan.partition._pipeline_common import bottleneck_split, sequence_dp
from shardplan.partition.pipedream_sequence import PipeDreamSequence
from shardplan.topology import build
from tests.helpers import run_cli

PROFILE = Path(__file__).parent / "data" / "pipedream_small.txt"


# ------------------------------------------------------------------ the brute force
def _profile_nodes(text: str) -> tuple[dict, dict]:
    """The profile read independently of the importer: ``{id: (desc, ms, act, params)}``
    and ``{id: successors}``, with PipeDream's Input sources and __getitem__ sinks removed."""
    nodes, succ = {}, {}
    for line in text.splitlines():
        if line.startswith("\t"):
            a, b = line.strip().split(" -- ")
            succ.setdefault(a, []).append(b)
        elif line.strip():
            nid, desc, fields = line.split(" -- ")[:3]
            kv = dict(f.split("=") for f in fields.split(", "))
            nodes[nid] = (desc, float(kv["forward_compute_time"])
                          + float(kv["backward_compute_time"]),
                          float(kv["activation_size"]), float(kv["parameter_size"]))
    has_pred = {b for bs in succ.values() for b in bs}
    for nid in [v for v in nodes if v not in has_pred and nodes[v][0].startswith("Input")]:
        del nodes[nid]
        succ.pop(nid, None)
    for nid in [v for v in nodes if not [w for w in succ.get(v, []) if w in nodes]
                and nodes[v][0].startswith("__getitem__")]:
        del nodes[nid]
    succ = {a: [b for b in bs if b in nodes] for a, bs in succ.items() if a in nodes}
    return nodes, succ


def _ideals(nodes: dict, succ: dict) -> list[frozenset]:
    """Every down-closed subset, by checking all 2^n subsets."""
    ids = sorted(nodes)
    preds = {v: {a for a, bs in succ.items() if v in bs} for v in ids}
    out = []
    for bits in itertools.product((0, 1), repeat=len(ids)):
        s = frozenset(v for v, b in zip(ids, bits, strict=True) if b)
        if all(preds[v] <= s for v in s):
            out.append(s)
    return sorted(out, key=len)


def brute_force(text: str, levels: list[tuple[int, float]], transfers: bool = True,
                compression: float = 1.0, fixed: int | None = None) -> float:
    """PipeDream's objective minimised by enumerating every chain of down-closed sets and
    every replica split (PipeDream's formulas, written out again here)."""
    nodes, succ = _profile_nodes(text)
    ideals = _ideals(nodes, succ)
    full = ideals[-1]

    def T(s):  # noqa: N802 - PipeDream's letters
        return sum(nodes[v][1] for v in s) / 1000.0

    def P(s):  # noqa: N802
        return sum(nodes[v][3] for v in s)

    def X(s):  # noqa: N802 - bytes of the outputs that leave s
        return sum(nodes[v][2] for v in s if any(w not in s for w in succ.get(v, [])))

    def t_stage(a, b, r, bw, first, within=1.0, inner=None):
        comp = T(b - a) if inner is None else inner
        t = (comp + 4 * (r - 1) * P(b - a) / (bw * r) / within) / r
        if transfers and not first:
            out = 0.0 if b == full else X(b)
            t = max(t, 2 * X(a) / (bw * r * compression), 2 * out / (bw * r * compression))
        return t

    def chains(a, b):
        """Every increasing chain of sets from a to b (strict inclusions)."""
        if a == b:
            yield [a]
            return
        for c in ideals:
            if a < c <= b:
                for rest in chains(c, b):
                    yield [a, *rest]

    def compositions(total, k):
        for cut in itertools.combinations(range(1, total), k - 1):
            bounds = (0, *cut, total)
            yield [bounds[i + 1] - bounds[i] for i in range(k)]

    @cache
    def best_pipeline(a, b, workers, bw):
        best = math.inf
        for ch in chains(a, b):
            k = len(ch) - 1
            if k > workers:
                continue
            for reps in compositions(workers, k):
                if fixed is not None and any(r != fixed for r in reps):
                    continue
                v = max(t_stage(ch[i], ch[i + 1], reps[i], bw, first=i == 0)
                        for i in range(k))
                best = min(best, v)
        return best

    empty = ideals[0]
    if len(levels) == 1:
        (d, bw), = levels
        return best_pipeline(empty, full, d, bw)
    (n1, b1), (n2, b2) = levels
    best = math.inf
    for ch in chains(empty, full):
        q = len(ch) - 1
        if q > n2:
            continue
        for gs in compositions(n2, q):
            v = max(t_stage(ch[i], ch[i + 1], gs[i], b2, first=i == 0,
                            within=n1 if i == 0 else 1.0,
                            inner=best_pipeline(ch[i], ch[i + 1], n1, b1))
                    for i in range(q))
            best = min(best, v)
    return best


# ------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def small() -> tuple[Graph, str]:
    return load_pipedream(PROFILE), PROFILE.read_text()


@pytest.mark.parametrize("devices, bandwidth, transfers, fixed", [
    (4, 1e9, True, None), (4, 1e10, True, None), (3, 2e9, False, None), (4, 1e8, True, None),
    (4, 1e9, True, 2), (4, 1e9, True, 1), (1, 1e9, True, None)])
def test_one_level_equals_brute_force(small, devices, bandwidth, transfers, fixed) -> None:
    g, text = small
    topo = build("flat", num_devices=devices)
    opts = {"bandwidths": [bandwidth], "transfers": transfers, "levels": 1}
    if fixed is not None:
        opts["replicas"] = fixed
    plan = registry.run("partition", "pipedream", g, topo, **opts).plan
    want = brute_force(text, [(devices, bandwidth)], transfers, fixed=fixed)
    assert plan.objective.value == pytest.approx(want, rel=1e-12)
    assert plan.status == "optimal" and plan.objective.name == "pipedream_seconds"
    assert sum(len(s.devices) for s in plan.stages) == devices
    if fixed is not None:
        assert {len(s.devices) for s in plan.stages} == {fixed}
    name, value, _ = evaluate(plan, g, topo, "pipedream")
    assert name == "pipedream_seconds" and value == pytest.approx(plan.objective.value,
                                                                  rel=1e-12)
    assert plan.objective.lower_bound <= value


def test_per_stage_replication_is_used(small) -> None:
    # The Linear layer holds 132 MB of parameters: on a slow network its synchronisation
    # makes replicating it a loss, while the convolutions gain from replicas.
    g, text = small
    topo = build("flat", num_devices=4)
    plan = registry.run("partition", "pipedream", g, topo, bandwidths=[1e9]).plan
    reps = [len(s.devices) for s in plan.stages]
    assert len(set(reps)) > 1, reps
    fc = g.names.index("node9")
    assert [len(s.devices) for s in plan.stages if fc in s.nodes] == [1]
    assert plan.objective.value < registry.run("partition", "pipedream", g, topo,
                                               bandwidths=[1e9], replicas=1).plan.objective.value


@pytest.mark.parametrize("bw", [(1e10, 1e9), (2e9, 5e8), (1e11, 1e10)])
def test_two_levels_equal_brute_force(small, bw) -> None:
    g, text = small
    topo = build("hierarchical", shape=(2, 2), level_names=("box", "gpu"),
                 bandwidth=(bw[1], bw[0]), latency=(1e-5, 1e-6))
    res = registry.run("partition", "pipedream", g, topo)
    plan = res.plan
    assert res.stats["levels"] == 2 and plan.options["bandwidths"] == [bw[0], bw[1]]
    want = brute_force(PROFILE.read_text(), [(2, bw[0]), (2, bw[1])])
    assert plan.objective.value == pytest.approx(want, rel=1e-12)
    ranges = plan.meta["pipedream_ranges"]
    assert ranges[-1][1] == plan.num_stages and sum(r[2] for r in ranges) == 2
    for stage in plan.stages:  # every stage spans its range's boxes evenly
        boxes = [d // 2 for d in stage.devices]
        assert len(set(boxes.count(b) for b in set(boxes))) == 1
    assert evaluate(plan, g, topo, "pipedream")[1] == pytest.approx(plan.objective.value,
                                                                    rel=1e-12)
    flat = registry.run("partition", "pipedream", g, topo, levels=1).plan
    assert "pipedream_ranges" not in flat.meta and flat.options["levels"] == 1


def test_compression_and_no_transfers(small) -> None:
    g, text = small
    topo = build("flat", num_devices=4)
    values = []
    for opts in ({"compression": 1.0}, {"compression": 4.0}, {"transfers": False}):
        plan = registry.run("partition", "pipedream", g, topo, bandwidths=[1e8], **opts).plan
        want = brute_force(text, [(4, 1e8)], opts.get("transfers", True),
                           opts.get("compression", 1.0))
        assert plan.objective.value == pytest.approx(want, rel=1e-12)
        values.append(plan.objective.value)
    assert values[0] >= values[1] >= values[2]


def test_thinned_states_and_the_time_limit() -> None:
    g = layered(num_nodes=120, width=8, seed=4)
    topo = build("flat", num_devices=4)
    res = registry.run("partition", "pipedream", g, topo, max_states=50)
    assert res.stats["state_mode"] == "thinned prefixes" and res.plan.status == "feasible"
    assert res.stats["states"] <= 50
    a = res.plan.assignment(g.num_nodes)
    assert np.all(a[g.src] <= a[g.dst])
    assert evaluate(res.plan, g, topo, "pipedream")[1] == pytest.approx(
        res.plan.objective.value, rel=1e-12)
    late = registry.run("partition", "pipedream", g, topo, time_limit=1e-6)
    assert late.plan.status == "timed_out"
    assert evaluate(late.plan, g, topo, "pipedream")[1] == pytest.approx(
        late.plan.objective.value, rel=1e-12)
    fixed = registry.run("partition", "pipedream", g, topo, stages=4, replicas=1,
                         time_limit=1e-6).plan
    assert fixed.status == "timed_out" and fixed.num_stages == 4


@pytest.mark.parametrize("opts, match", [
    ({"levels": 3}, "levels must be 1 or 2"), ({"levels": 2}, "two levels need"),
    ({"bandwidths": [1e9, 1e9]}, "bandwidths must be 1"), ({"compression": 0}, "compression"),
    ({"transfers": "yes"}, "transfers"), ({"stages": 9}, "devices"),
    ({"replicas": 3, "devices": 4}, "not a multiple"), ({"bogus": 1}, "bogus")])
def test_bad_options(small, opts, match) -> None:
    g, _ = small
    with pytest.raises(ShardplanError, match=match):
        registry.run("partition", "pipedream", g, build("flat", num_devices=4), **opts)


def test_cli_partition_then_cost(small, tmp_path, capsys) -> None:
    g, _ = small
    gp, tp, pp = tmp_path / "g.json", tmp_path / "t.json", tmp_path / "p.json"
    save(g, gp)
    save(build("dgx1", boxes=2), tp)
    assert run_cli(["partition", str(gp), str(tp), "--algorithm", "pipedream", "-o",
                    str(pp)]) == 0
    plan = load_plan(pp)
    assert plan.execution is not None and plan.settings.microbatches == 8
    capsys.readouterr()
    assert run_cli(["cost", str(pp), str(gp), str(tp), "--objective", "pipedream",
                    "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objective"] == "pipedream_seconds"
    assert out["value"] == pytest.approx(plan.objective.value, rel=1e-12)
    assert run_cli(["cost", str(pp), str(gp), str(tp), "--objective", "pipedream",
                    "--option", "colour=1"]) == 2


# ------------------------------------------------------------------ the sequence variant
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.integers(0, 2**31 - 1),
       st.sampled_from([0.0, 1.0, 3.0]))
def test_bisection_equals_the_dp(n, stages, seed, cut_scale) -> None:
    if stages > n:
        stages = n
    rng = np.random.default_rng(seed)
    w = np.concatenate(([0.0], np.cumsum(rng.integers(0, 5, n).astype(float))))
    p = np.concatenate(([0.0], np.cumsum(rng.integers(0, 5, n).astype(float))))
    cut = np.concatenate(([0.0], rng.integers(0, 8, n - 1) * cut_scale, [0.0]))
    a, b = 1.0 / 3.0, 0.7

    def cost(i, j, _s):
        c = np.maximum(a * (w[j] - w[i]), b * (p[j] - p[i]))
        return np.where(i > 0, np.maximum(c, cut[i]), c)

    fast = bottleneck_split([w, p], [a, b], cut, stages)
    slow = sequence_dp(cost, n, stages)
    assert fast[0] == pytest.approx(slow[0], rel=1e-12, abs=1e-12)
    seg = fast[1]
    assert seg[0] == 0 and seg[-1] == stages - 1 and np.all(np.diff(seg) >= 0)
    assert len(set(seg.tolist())) == stages


@pytest.mark.parametrize("seed", range(3))
def test_sequence_forms_agree_on_graphs(seed) -> None:
    from shardplan.cost import CostModel
    from shardplan.ir import ExecutionSettings

    topo = build("dgx1", boxes=1)
    for g in (layered(num_nodes=61, width=6, seed=seed), random_dag(num_nodes=40, seed=seed)):
        model = CostModel.from_settings(g, topo, ExecutionSettings())
        seq = PipeDreamSequence.build(g, topo, model, 8)
        for s, r in ((4, 2), (8, 1), (2, 4), (1, 8)):
            fast, slow = seq.solve(s, r), seq.solve(s, r, method="dp")
            assert fast[0] == pytest.approx(slow[0], rel=1e-12)
        assert seq.solve(4, 2, check=lambda: True) is None
        assert seq.solve(4, 2, check=lambda: True, method="dp") is None
