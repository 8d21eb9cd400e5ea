"""PipeDream profile import: a hand-written profile, format corners, errors, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardplan.errors import InvalidFileError
from shardplan.importers import load_pipedream, parse_pipedream
from shardplan.ir import Graph, load_graph
from tests.helpers import run_cli

DATA = Path(__file__).parent / "data" / "resnet_block.txt"

# The hand-written profile: a ResNet stem, one basic block with its skip edge
# (node5 -> node11), the head with PipeDream's Size/View pair. No node12; lines shuffled.
IDS = ["node1", "node2", "node3", "node4", "node5", "node6", "node7", "node8", "node9",
       "node10", "node11", "node13", "node14", "node15", "node16", "node17"]
FWD_MS = [0.25, 1.5, 0.21, 0.11, 0.18, 0.9, 0.06, 0.04, 0.9, 0.06, 0.03, 0.04, 0.05, 0, 0,
          0.02]
BWD_MS = [0, 3.1, 0.43, 0.2, 0.35, 1.85, 0.12, 0.07, 1.85, 0.12, 0, 0.07, 0.09, 0, 0, 0.045]


def _line(node: str, desc: str, f: float, b: float, a: str, p: float, tail: str = "") -> str:
    return (f"{node} -- {desc} -- forward_compute_time={f:.3f}, backward_compute_time={b:.3f}, "
            f"activation_size={a}, parameter_size={p:.3f}{tail}")


def test_hand_written_profile() -> None:
    g = load_pipedream(DATA, batch_size=8, keep_inputs=True)
    assert g.name == "resnet_block" and g.batch_size == 8 and g.num_nodes == 16
    assert list(g.names) == IDS  # relabelled 0..15 in topological (and natural) order
    assert g.ops[:6] == ("Input", "Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "Conv2d")
    assert g.ops[10] == "Add" and g.ops[-3:] == ("Size", "View", "Linear")
    assert g.modules[12] == "AdaptiveAvgPool2d(output_size=(1, 1))"
    assert np.allclose(g.fwd_seconds, np.array(FWD_MS) / 1000)
    assert np.allclose(g.bwd_seconds, np.array(BWD_MS) / 1000)
    # forward 4.35 ms + backward 8.295 ms
    assert float(g.fwd_seconds.sum() + g.bwd_seconds.sum()) == pytest.approx(0.012645)
    assert not g.fwd_flops.any() and not g.bwd_flops.any()
    # conv 7x7: 3 * 64 * 49 * 4 bytes; two 3x3 convs 64 * 64 * 9 * 4; 3 BN 512; fc 2600
    assert g.param_bytes[1] == 37632 and int(g.param_bytes.sum()) == 37632 + 2 * 147456 + \
        3 * 512 + 2600
    assert np.allclose(g.weight, g.param_bytes / 4)
    assert g.output_bytes[0] == 4816896 and g.output_bytes[1] == 25690112
    edges = {(e.src, e.dst): e.bytes for e in g.edges}
    assert len(edges) == 17
    assert edges[(4, 10)] == 6422528  # the skip edge, MaxPool output
    assert edges[(0, 1)] == 4816896 and edges[(13, 14)] == 4 and edges[(14, 15)] == 2048
    assert [x["pipedream_stage_id"] for x in g.node_extra] == [0] * 8 + [1] * 8
    assert g.meta["imported_from"] == "pipedream" and "dropped_on_import" not in g.meta
    assert Graph.from_dict(g.to_dict()).names == g.names


def test_input_and_getitem_nodes_are_dropped_as_pipedream_does() -> None:
    g = load_pipedream(DATA, batch_size=8)
    assert g.num_nodes == 15 and list(g.names) == IDS[1:]  # node1 -- Input is gone
    assert g.num_edges == 16 and g.ops[0] == "Conv2d"
    assert np.allclose(g.fwd_seconds, np.array(FWD_MS[1:]) / 1000)
    (d,) = g.meta["dropped_on_import"]
    assert d == {"name": "node1", "description": "Input", "reason": "input",
                 "fwd_seconds": 0.00025, "bwd_seconds": 0.0}
    # A second input, a __getitem__ sink and a __getitem__ node that is not a sink (kept).
    text = "\n".join([
        _line("node1", "Input", 5, 0, "64.000", 0),
        _line("node2", "Input", 5, 0, "64.000", 0),
        _line("node3", "Linear(in_features=4, out_features=4, bias=True)", 1, 2, "16.000", 80),
        _line("node4", "__getitem__(0)", 0, 0, "8.000", 0),
        _line("node5", "__getitem__(1)", 0, 0, "8.000", 0),
        _line("node6", "ReLU()", 0.5, 0.5, "8.000", 0),
        "\tnode1 -- node3", "\tnode2 -- node3", "\tnode3 -- node4", "\tnode3 -- node5",
        "\tnode5 -- node6",
    ])
    g = parse_pipedream(text)
    assert g.names == ("node3", "node5", "node6")
    assert [d["reason"] for d in g.meta["dropped_on_import"]] == ["input", "input",
                                                                   "getitem sink"]
    assert g.src.tolist() == [0, 1] and g.dst.tolist() == [1, 2]
    assert parse_pipedream(text, keep_inputs=True).num_nodes == 6
    with pytest.raises(InvalidFileError, match="every node is an Input"):
        parse_pipedream(_line("node1", "Input", 1, 0, "4.0", 0))


def test_relabels_in_topological_order_when_ids_disagree() -> None:
    text = "\n".join([
        _line("node10", "Input", 1, 0, "100.000", 0),
        _line("node2", "Linear(in_features=5, out_features=5, bias=True)", 2, 4, "40.000", 120),
        _line("node7", "ReLU()", 0.5, 0.5, "40.000", 0),
        "\tnode2 -- node7", "\tnode10 -- node2", "\tnode10 -- node7",
    ])
    g = parse_pipedream(text, keep_inputs=True)
    assert g.names == ("node10", "node2", "node7")
    assert g.src.tolist() == [0, 0, 1] and g.dst.tolist() == [1, 2, 2]
    assert g.edge_bytes.tolist() == [100, 100, 40]
    assert g.node_extra is None


def test_format_corners() -> None:
    text = "\n".join([
        "",
        _line("node1", "Input", 0.5, 0, "64.000", 0),
        # a description containing the separator, and a list of two outputs
        _line("node2", "Split(2) -- chunked", 1, 2, "[32.000; 16.000]", 0, " -- stage_id=3"),
        _line("compressed_node3", "Branch 3", 1, 1, "8.5", 4),
        "   ",
        "\tnode1 -- node2",
        "\tnode1 -- node2",  # repeated edge: kept once
        "    node2 -- compressed_node3",  # spaces instead of a tab
    ]) + "\n"
    g = parse_pipedream(text, name="x", batch_size=4, keep_inputs=True)
    assert g.names == ("node1", "node2", "compressed_node3")
    assert g.modules[1] == "Split(2) -- chunked" and g.ops[1] == "Split"
    assert g.output_bytes.tolist() == [64, 48, 8]  # 8.5 rounds to even
    assert g.num_edges == 2 and g.edge_bytes.tolist() == [64, 48]
    assert g.node_extra == ({}, {"pipedream_stage_id": 3}, {})
    assert g.batch_size == 4 and g.name == "x"


def _ok_node(i: int) -> str:
    return _line(f"node{i}", "ReLU()", 1, 1, "4.0", 0)


BAD = {
    "garbage": ("garbage\n", "line 1: expected 'nodeN -- description"),
    "no times": ("node1 -- ReLU() -- foo=1\n", "line 1"),
    "missing field": (f"{_ok_node(1)}\nnode2 -- ReLU() -- forward_compute_time=1.0, "
                      "backward_compute_time=1.0, activation_size=4.0\n",
                      "line 2: node line lacks parameter_size"),
    "bad number": (_ok_node(1).replace("=4.0", "=four"), "line 1: activation_size is not a "
                                                           "number"),
    "negative": (_ok_node(1).replace("=4.0", "=-4.0"), "must be finite and >= 0"),
    "infinite": (_ok_node(1).replace("=4.0", "=inf"), "must be finite and >= 0"),
    "duplicate node": (f"{_ok_node(1)}\n{_ok_node(1)}\n", "line 2: node 'node1' is defined "
                                                          "twice"),
    "bad stage": (_ok_node(1) + " -- stage_id=x", "stage_id is not an integer"),
    "unknown trailer": (_ok_node(1) + " -- colour=red", "unexpected field"),
    "unknown node": (f"{_ok_node(1)}\n\tnode1 -- node9\n", "line 2: edge node1 -- node9 names "
                                                           "unknown node 'node9'"),
    "bad edge": (f"{_ok_node(1)}\n\tnode1 node2\n", "line 2: expected an edge"),
    "self loop": (f"{_ok_node(1)}\n\tnode1 -- node1\n", "self loop"),
    "cycle": (f"{_ok_node(1)}\n{_ok_node(2)}\n{_ok_node(3)}\n\tnode1 -- node2\n"
              "\tnode2 -- node3\n\tnode3 -- node2\n", "cycle through node2, node3"),
    "empty": ("\n\n", "no node lines"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_errors_are_one_line(case: str) -> None:
    text, match = BAD[case]
    with pytest.raises(InvalidFileError, match=match) as info:
        parse_pipedream(text)
    assert "\n" not in str(info.value)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidFileError, match="no such file"):
        load_pipedream(tmp_path / "missing.txt")
    with pytest.raises(InvalidFileError, match="is a directory"):
        load_pipedream(tmp_path)
    bad = tmp_path / "bin.txt"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InvalidFileError, match="not a UTF-8"):
        load_pipedream(bad)
    with pytest.raises(InvalidFileError, match="batch_size"):
        parse_pipedream(_ok_node(1), batch_size=0)


# ---------------------------------------------------------------------- command line
def run(argv: list[str]) -> int:
    return run_cli(argv)


def test_cli_import(tmp_path: Path, capsys) -> None:
    out = tmp_path / "g.json"
    assert run(["import", "pipedream", str(DATA), "--batch-size", "8", "--name", "rb",
                "-o", str(out)]) == 0
    cap = capsys.readouterr()
    assert "wrote graph to" in cap.out and "dropped 1 node(s)" in cap.err
    g = load_graph(out)
    assert g.name == "rb" and g.batch_size == 8 and g.num_nodes == 15
    assert g.fwd_seconds is not None and g.fwd_seconds[0] == pytest.approx(1.5e-3)
    assert run(["import", "pipedream", str(DATA), "--keep-inputs", "-o", str(out)]) == 0
    assert load_graph(out).num_nodes == 16


@pytest.mark.parametrize("content, match", [
    ("garbage\n", "line 1"),
    (f"{_ok_node(1)}\n{_ok_node(2)}\n\tnode1 -- node2\n\tnode2 -- node1\n", "cycle"),
    (None, "no such file"),
])
def test_cli_bad_input_is_one_line_and_exit_2(content, match, tmp_path: Path, capsys) -> None:
    src = tmp_path / "p.txt"
    if content is not None:
        src.write_text(content)
    out = tmp_path / "out.json"
    assert run(["import", "pipedream", str(src), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shardplan: error: ") and match in err[0]
    assert not out.exists()


def test_cli_usage_errors(capsys) -> None:
    assert run(["import"]) == 2
    assert run(["import", "caffe", "x.txt"]) == 2
    assert run(["import", "pipedream"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("shardplan: error: ") for e in err)
    assert run(["import", "pipedream", "--help"]) == 0
    assert "GRAPH_TXT" in capsys.readouterr().out


def test_inspect_shows_seconds_bounds_and_what_was_dropped(tmp_path: Path, capsys) -> None:
    out = tmp_path / "g.json"
    assert run(["import", "pipedream", str(DATA), "-o", str(out)]) == 0
    capsys.readouterr()
    assert run(["inspect", str(out), "--json", "--devices", "4"]) == 0
    s = json.loads(capsys.readouterr().out)
    # FLOPs are unknown (0) in a profile: the bounds are in measured seconds only.
    assert "lower_bounds_flops" not in s
    total = (sum(FWD_MS) + sum(BWD_MS) - 0.25) / 1000  # the Input node's 0.25 ms dropped
    b = s["lower_bounds_seconds"]["4"]
    assert b["average"] == pytest.approx(total / 4)
    assert b["largest_node"] == pytest.approx((1.5 + 3.1) / 1000)
    assert b["bound"] == pytest.approx(max(total / 4, 4.6e-3))
    assert s["dropped_on_import"] == ["node1 (Input: input, 0.25 ms)"]
    assert run(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "lower_bounds_seconds" in text and "D=4" not in text and "node1 (Input" in text
    topo, plan = tmp_path / "t.json", tmp_path / "p.json"
    assert run(["topology", "flat", "--devices", "2", "-o", str(topo)]) == 0
    assert run(["partition", str(out), str(topo), "--algorithm", "pipedream", "-o",
                str(plan)]) == 0
    capsys.readouterr()
    assert run(["inspect", str(plan), "--graph", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert sum(s["stage_measured_seconds"]) == pytest.approx(total)
