"""``shardplan topology`` through a local parser (the main parser may not import every command
module yet): outputs, and one-line errors with exit status 2."""

from __future__ import annotations

import json

import pytest

from shardplan.ir import dumps, load_topology
from shardplan.topology import build
from tests.helpers import run_cli


def _run(argv: list[str]) -> int:
    return run_cli(argv)


@pytest.mark.parametrize("argv, kind, options", [
    (["flat", "--devices", "4", "--bandwidth", "2e9", "--latency", "1e-6"], "flat",
     {"num_devices": 4, "bandwidth": 2e9, "latency": 1e-6}),
    (["hierarchical", "--shape", "2x2x3", "--level-names", "rack,box,gpu", "--bandwidth",
      "1e9,1e10,1e11", "--latency", "1e-4,1e-5,0"], "hierarchical",
     {"shape": (2, 2, 3), "level_names": ("rack", "box", "gpu"),
      "bandwidth": (1e9, 1e10, 1e11), "latency": (1e-4, 1e-5, 0.0)}),
    (["dgx1", "--boxes", "2", "--inter-bandwidth", "1e9", "--device-type", "a100"], "dgx1",
     {"boxes": 2, "inter_bandwidth": 1e9, "device": "a100"}),
    (["mesh2d", "--shape", "3x5", "--bandwidth", "5e10", "--latency", "2e-6"], "mesh2d",
     {"shape": (3, 5), "link_bandwidth": 5e10, "hop_latency": 2e-6}),
    (["torus3d", "--shape", "3x3x4", "--flops", "1e14"], "torus3d",
     {"shape": (3, 3, 4), "flops": 1e14}),
    (["random-blk-2", "--devices", "32", "--super-block-size", "8", "--seed", "4"],
     "random-blk-2", {"num_devices": 32, "super_block_size": 8, "seed": 4}),
    (["uniform-dist", "--devices", "6", "--bandwidth", "1e9,2e9", "--name", "u"],
     "uniform-dist", {"num_devices": 6, "bandwidth": (1e9, 2e9), "name": "u"}),
    (["random-blk-1", "--devices", "8", "--bandwidth", "1e9,2e9,3e10,4e10", "--latency",
      "1e-5,2e-5,1e-6,2e-6", "--block-size", "2"], "random-blk-1",
     {"num_devices": 8, "bandwidth": (1e9, 2e9, 3e10, 4e10),
      "latency": (1e-5, 2e-5, 1e-6, 2e-6), "block_size": 2}),
])
def test_cli_writes_what_the_api_builds(argv, kind, options, tmp_path, capsys) -> None:
    out = tmp_path / "t.json"
    assert _run(["topology", *argv, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote topology to {out}"
    assert dumps(load_topology(out)) == dumps(build(kind, **options))


def test_cli_defaults_and_json(capsys) -> None:
    assert _run(["topology", "dgx1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "shardplan.topology/1" and len(data["devices"]) == 8
    assert _run(["topology", "mesh3d", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["devices"]) == 64
    assert _run(["topology", "hierarchical", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["devices"]) == 96
    assert _run(["topology", "random-blk-1", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["devices"]) == 64


@pytest.mark.parametrize("argv, message", [
    (["mesh3d", "--shape", "3x3"], "mesh3d needs a 3-dimensional shape"),
    (["torus2d", "--shape", "2x4"], "torus2d sizes must be >= 3"),
    (["dgx1", "--boxes", "0"], "expected a positive integer"),
    (["hierarchical", "--shape", "2x4", "--bandwidth", "1e9"], "bandwidth needs 2 values"),
    (["hierarchical", "--shape", "2x4", "--level-names", "a,b,c"], "3 level names"),
    (["mesh2d", "--boxes", "2"], "--boxes does not apply to topology mesh2d"),
    (["flat", "--shape", "2x2", "--seed", "1"], "--shape, --seed do not apply"),
    (["flat", "--bandwidth", "1e9,2e9"], "flat takes one value for --bandwidth"),
    (["random-blk-1", "--devices", "10"], "multiple of block_size"),
    (["uniform-dist", "--bandwidth", "1e9,2e9,3e9"], "2 numbers, got 3"),
    (["measure"], "measure needs --nproc"),
    (["measure", "--nproc", "2", "--backend", "mpi"], "invalid choice"),
    (["ring"], "invalid choice"),
    (["flat", "--latency", "-1"], "expected a number >= 0"),
    (["flat"], "-o FILE or --json"),
    (["flat", "--devices", "100000", "--dense"], "kept in its generator form"),
])
def test_cli_errors_are_one_line(argv, message, capsys, tmp_path) -> None:
    extra = [] if argv == ["flat"] else ["-o", str(tmp_path / "t.json")]
    assert _run(["topology", *argv, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardplan: error: ") and err.count("\n") == 1
    assert message in err
    assert not (tmp_path / "t.json").exists()


def test_cli_large_topologies_are_stored_by_generator_and_every_command_reads_them(
        tmp_path, capsys) -> None:
    gen, dense = tmp_path / "gen.json", tmp_path / "dense.json"
    assert _run(["topology", "torus2d", "--shape", "32x40", "--compact", "-o", str(gen)]) == 0
    assert _run(["topology", "torus2d", "--shape", "32x40", "-o", str(dense)]) == 0
    assert "--compact stores" in capsys.readouterr().err  # the contract's form by default
    g, d = json.loads(gen.read_text()), json.loads(dense.read_text())
    assert "bandwidth" not in g and g["pairs"]["kind"] == "grid"
    assert len(d["bandwidth"]) == 1280 and d["pairs"] == g["pairs"]
    assert gen.stat().st_size * 20 < dense.stat().st_size
    a, b = load_topology(gen), load_topology(dense)
    assert a.pair_model == b.pair_model and a.links == b.links
    graph = tmp_path / "g.json"
    assert _run(["generate", "layered", "--nodes", "61", "--width", "6", "-o",
                 str(graph)]) == 0
    plans = {}
    for name, topo in (("gen", gen), ("dense", dense)):
        plans[name] = tmp_path / f"p-{name}.json"
        assert _run(["partition", str(graph), str(topo), "--algorithm", "parmesan",
                     "--stages", "3", "--replicas", "2", "-o", str(plans[name])]) == 0
        capsys.readouterr()
        assert _run(["simulate", str(plans[name]), str(graph), str(topo), "--json"]) == 0
        sim = json.loads(capsys.readouterr().out)
        assert sim["iteration_seconds"] > 0
        plans[name] = (json.loads(plans[name].read_text()), sim)
    (pa, sa), (pb, sb) = plans["gen"], plans["dense"]
    assert pa["stages"] == pb["stages"] and pa["objective"] == pb["objective"]
    assert sa["iteration_seconds"] == sb["iteration_seconds"]


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_cli_measure(tmp_path, capsys) -> None:
    # a generous hard timeout: on 2 cores beside another worker's 4-process runs the
    # measurement took over 40 s (speed is a benchmark's business, not this test's)
    out = tmp_path / "m.json"
    assert _run(["topology", "measure", "--nproc", "2", "--backend", "gloo", "--sizes",
                 "4,65536,1048576", "--repeats", "2", "--timeout", "180", "-o",
                 str(out)]) == 0
    topo = load_topology(out)
    assert topo.num_devices == 2 and topo.bandwidth[0, 1] > 0
    assert capsys.readouterr().err == ""


def test_cluster_kinds_by_comma_spec_and_flags(tmp_path) -> None:
    from shardplan.ir import load_topology

    out = tmp_path / "a.json"
    assert _run(["topology", "dgx-a100,nodes=2,gpu_memory=40GiB", "--nic-gbps", "400",
                 "-o", str(out)]) == 0
    t = load_topology(out)
    assert t.num_devices == 16 and t.device_memory[0] == 40 * 2**30
    assert float(t.bandwidth[0, 8]) == 50e9 and t.levels[0].name == "box"
    assert _run(["topology", "dgx2-v100", "--nodes", "2", "--memory-bytes", str(16 * 2**30),
                 "-o", str(out)]) == 0
    assert load_topology(out).device_memory[0] == 16 * 2**30
    for argv in (["dgx-a100", "--gpu", "a100-40gb"], ["dgx-a100,gpu=a100-40gb"]):
        assert _run(["topology", *argv, "-o", str(out)]) == 0
        d = load_topology(out).devices[0]
        assert d.extra["type"] == "a100-40gb" and d.memory_bytes == 40 * 2**30
        assert d.extra["memory_bandwidth"] == 1555e9


@pytest.mark.parametrize("argv, message", [
    (["dgx-h100", "--boxes", "2"], "does not apply"),
    (["dgx-h100", "--device-type", "a100"], "sets its GPU type"),
    (["dgx-h100,nodes=2", "--nodes", "2"], "given both"),
])
def test_cluster_kind_errors(argv, message, capsys, tmp_path) -> None:
    assert _run(["topology", *argv, "-o", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
