"""``shardplan inspect GRAPH --json``: the parameter count and the model's dimensions."""

from __future__ import annotations

import json

from shardplan.ir import Graph, save
from tests.helpers import run_cli


def _graph(meta: dict) -> Graph:
    # node 1 owns 30 parameters, node 2 reads the same tensor (tied) and owns none
    return Graph.from_arrays(name="g", fwd_flops=[1.0, 2.0, 3.0], src=[0, 1], dst=[1, 2],
                             param_bytes=[40, 120, 0], weight=[10, 30, 0], meta=meta)


def _inspect(tmp_path, capsys, graph: Graph) -> dict:
    path = tmp_path / "g.json"
    save(graph, path)
    assert run_cli(["inspect", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_parameters_from_the_nodes_when_capture_recorded_none(tmp_path, capsys) -> None:
    out = _inspect(tmp_path, capsys, _graph({}))
    assert out["parameters"] == 40 and "transformer" not in out


def test_parameters_and_dimensions_capture_recorded(tmp_path, capsys) -> None:
    dims = {"family": "gpt", "hidden": 8, "layers": 1, "heads": 2, "kv_heads": 2, "ffn": 32,
            "vocab": 16, "seq": 4, "tied": True, "parameters": 41}
    out = _inspect(tmp_path, capsys, _graph({"parameters": 41, "transformer": dims}))
    assert out["parameters"] == 41 and out["transformer"] == dims
