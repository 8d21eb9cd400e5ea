from __future__ import annotations

import json

import numpy as np
import pytest

from shardplan.errors import InvalidFileError
from shardplan.ir import (
    Device,
    Graph,
    Level,
    Objective,
    Plan,
    Stage,
    Topology,
    load,
    load_graph,
    load_plan,
    save,
)


def _topo(n: int = 4, **kw) -> Topology:
    bw = np.full((n, n), 1e10)
    lat = np.full((n, n), 1e-5)
    args = {"name": "t", "devices": tuple(Device(f"d{i}", 3.2e10, 1e14) for i in range(n)),
            "bandwidth": bw, "latency": lat}
    args.update(kw)
    return Topology(**args)


def test_topology_round_trip_and_queries(tmp_path) -> None:
    t = _topo(4, levels=(Level("box", ((0, 1), (2, 3))),), cost=np.ones((4, 4)))
    save(t, tmp_path / "t.json")
    t2 = load(tmp_path / "t.json")
    assert isinstance(t2, Topology) and t2.to_dict() == t.to_dict()
    assert t2.cost_matrix[0, 1] == 1.0
    assert t.transfer_seconds(0, 1, 1e10) == pytest.approx(1.0 + 1e-5)
    assert t.transfer_seconds(2, 2, 1e10) == 0.0
    assert t.bandwidth_classes() == [(1e10, 12)]
    assert t.summary()["devices"] == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bandwidth": np.ones((4, 3))}, "not square"),
        ({"latency": np.ones((3, 3))}, "3 devices|4 devices"),
        ({"bandwidth": -np.ones((4, 4))}, "negative"),
        ({"levels": (Level("box", ((0, 1), (1, 2, 3))),)}, "partition"),
        ({"levels": (Level("box", ((0, 1), (2, 9))),)}, "outside"),
        ({"devices": tuple(Device("d", 1.0, 1.0) for _ in range(4))}, "unique"),
        ({"devices": tuple(Device(f"d{i}", -1.0, 1.0) for i in range(4))}, "memory_bytes"),
    ],
)
def test_invalid_topologies(change: dict, message: str) -> None:
    with pytest.raises(InvalidFileError, match=message):
        _topo(4, **change)


def test_nested_levels_must_nest() -> None:
    with pytest.raises(InvalidFileError, match="straddles"):
        _topo(4, levels=(Level("rack", ((0, 1), (2, 3))), Level("box", ((0, 2), (1, 3)))))


def test_plan_round_trip_and_validation(tmp_path, diamond: Graph) -> None:
    plan = Plan(graph="diamond", topology="t", algorithm="manual",
                stages=(Stage((0, 1), (0, 2)), Stage((2, 3), (1, 3))),
                objective=Objective("max_stage_seconds", 1.5, 1.0), status="optimal",
                strategy={"0": (1, 2)}, meta={"schedule": "1f1b"})
    save(plan, tmp_path / "p.json")
    p2 = load_plan(tmp_path / "p.json")
    assert p2.to_dict() == plan.to_dict()
    assert p2.num_replicas == 2 and p2.assignment(4).tolist() == [0, 0, 1, 1]
    p2.validate(diamond, _topo(4))
    with pytest.raises(InvalidFileError, match="outside"):
        p2.validate(diamond, _topo(3))
    partial = Plan(graph="d", topology="t", algorithm="m", stages=(Stage((0, 1), (0,)),),
                   objective=Objective("x", 0.0))
    with pytest.raises(InvalidFileError, match="in no stage"):
        partial.validate(diamond)


@pytest.mark.parametrize(
    ("stages", "status", "message"),
    [
        ((Stage((0,), (0,)), Stage((0,), (1,))), "optimal", "node 0 is in stages"),
        ((Stage((0,), (0,)), Stage((1,), (0,))), "optimal", "device 0 is used"),
        ((Stage((0,), ()),), "optimal", "no device"),
        ((Stage((0,), (0,)),), "great", "status"),
    ],
)
def test_invalid_plans(stages, status: str, message: str) -> None:
    with pytest.raises(InvalidFileError, match=message):
        Plan(graph="g", topology="t", algorithm="a", stages=stages,
             objective=Objective("x", 1.0), status=status)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"format": "other/1"}', "unknown format"),
        ('[1, 2]', "unknown format"),
        ('{"format": "shardplan.graph/1", "nodes": 3}', "must be lists"),
        ('{"format": "shardplan.graph/1", "nodes": [{"id": 1}]}', "ids must equal"),
        ('{"format": "shardplan.graph/1", "nodes": [{"fwd_flops": "x"}]}', "non-numeric"),
        ('{"format": "shardplan.graph/1", "nodes": [{}], "edges": [{"src": 0}]}', "'dst'"),
        ('{"format": "shardplan.topology/1", "devices": []}', "non-empty"),
        ('{"format": "shardplan.plan/1", "stages": [], "objective": 3}', "objective"),
    ],
)
def test_malformed_files(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InvalidFileError, match=message):
        load(path)


def test_missing_file_and_wrong_kind(tmp_path, diamond: Graph) -> None:
    with pytest.raises(InvalidFileError, match="no such file"):
        load(tmp_path / "nope.json")
    save(_topo(2), tmp_path / "t.json")
    with pytest.raises(InvalidFileError, match="expected a graph"):
        load_graph(tmp_path / "t.json")


def test_atomic_write_leaves_old_file_on_failure(tmp_path, diamond: Graph) -> None:
    path = tmp_path / "g.json"
    save(diamond, path)
    before = path.read_text()

    class Boom:
        def to_dict(self):
            return {"x": object()}  # not serialisable

    with pytest.raises(TypeError):
        save(Boom(), path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"]  # no temp file left behind
    assert json.loads(before)["format"] == "shardplan.graph/1"


def test_non_finite_values_are_written_as_null(tmp_path) -> None:
    plan = Plan(graph="g", topology="t", algorithm="a", stages=(Stage((0,), (0,)),),
                objective=Objective("x", float("inf")))
    save(plan, tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["objective"]["value"] is None
