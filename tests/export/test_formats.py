"""``shardplan export``: every format on small plans, and the plans each one refuses."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.export import FORMATS, ExportOptions, export
from shardplan.export._frameworks import _uniform_parts
from shardplan.ir import Graph, Objective, Plan, Stage, save
from shardplan.simulate import Schedule, simulate
from shardplan.topology import build
from tests.helpers import hand_plan, run_cli

# A GPT-like module structure: embeddings, blocks.0..3 (attention inside), ln_f, head.
_MODULES = (["tok_emb", "pos_emb", ""]
            + [f"blocks.{i}.{m}" for i in range(4) for m in ("ln1", "attn", "attn.proj", "mlp")]
            + ["ln_f", "head"])
_OPS = ["embedding", "embedding", "add"] + ["layer_norm", "scaled_dot_product_attention",
                                             "linear", "linear"] * 4 + ["layer_norm", "linear"]


def _graph() -> Graph:
    n = len(_MODULES)
    return Graph.from_arrays(name="gpt", fwd_flops=np.full(n, 1e9), src=np.arange(n - 1),
                             dst=np.arange(1, n), output_bytes=np.full(n, 4096),
                             param_bytes=np.full(n, 1024), names=[f"n{i}" for i in range(n)],
                             ops=_OPS, modules=_MODULES, batch_size=4,
                             meta={"input_shapes": [[4, 16]], "input_dtypes": ["int64"]})


def _plan(cuts: list[int], replicas: int = 1, **execution: object) -> Plan:
    return hand_plan(cuts, len(_MODULES), replicas, **execution)


def test_torch_split_points_and_schedule() -> None:
    g = _graph()
    topo = build("flat", num_devices=4)
    plan = _plan([3 + 4 * 2], replicas=2, microbatches=4, schedule="gpipe")
    out = json.loads(export(plan, g, topo, "torch").text)
    assert out["split_spec"] == {"blocks.2": "BEGINNING"}
    assert out["stage_modules"] == [["tok_emb", "pos_emb", "blocks.0", "blocks.1"],
                                    ["blocks.2", "blocks.3", "ln_f", "head"]]
    assert out["schedule"] == "GPipe" and out["data_parallel"] == 2
    assert Schedule.from_text(out["schedule_csv"]).num_microbatches == 4
    # a cut inside a block starts at the innermost module that begins there
    mid = json.loads(export(_plan([3 + 1]), g, topo, "torch").text)
    assert mid["split_spec"] == {"blocks.0.attn": "BEGINNING"}


def test_torchtitan_megatron_deepspeed() -> None:
    g = _graph()
    topo = build("flat", num_devices=4)
    plan = _plan([3 + 4], replicas=2, microbatches=4)
    tt = export(plan, g, topo, "torchtitan", schedule_csv="x.csv",
                options=ExportOptions(torchtitan_version="0.2"))
    conf = tomllib.loads(tt.text)["parallelism"]
    assert conf["module_fqns_per_model_part"] == [
        ["tok_emb", "pos_emb", "blocks.0"], ["blocks.1", "blocks.2", "blocks.3", "ln_f", "head"]]
    assert conf["pipeline_parallel_degree"] == 2 and conf["data_parallel_replicate_degree"] == 2
    assert conf["pipeline_parallel_schedule_csv"] == "x.csv"
    assert conf["pipeline_parallel_microbatch_size"] == 2  # 4 samples over 2 replicas
    assert tt.beside[".schedule.csv"].splitlines()[1].startswith("1F0,1B0")
    mg = json.loads(export(plan, g, topo, "megatron").text)
    assert mg["pipeline_model_parallel_layout"] == "Et|tttL"
    assert (mg["tensor_model_parallel_size"], mg["pipeline_model_parallel_size"],
            mg["data_parallel_size"], mg["num_layers"]) == (1, 2, 2, 4)
    assert mg["global_batch_size"] == 16
    with pytest.raises(ShardplanError, match=r"boundaries \[0, 3, 8\] are not uniform's "
                                             r"\[0, 4, 8\]"):
        export(plan, g, topo, "deepspeed")
    even = json.loads(export(_plan([3 + 4 * 2]), g, topo, "deepspeed").text)
    assert even["parts"] == [0, 4, 8] and even["partition_method"] == "uniform"


def test_uniform_parts_spread_the_remainder_from_the_first() -> None:
    assert _uniform_parts(10, 4) == [0, 3, 6, 8, 10]
    assert _uniform_parts(8, 2) == [0, 4, 8]


@pytest.mark.parametrize("plan_cuts, fmt, match", [
    ([3 + 1], "megatron", "megatron splits at layer boundaries, and pipeline stage 1 starts "
                          "inside one, at node 'n4'"),
    ([3 + 1], "deepspeed", "at layer boundaries.*'n4'"),
    ([3 + 1], "torchtitan", "at layer boundaries.*'n4'"),
    ([1], "megatron", "embedding on the first"),
])
def test_refusals(plan_cuts: list[int], fmt: str, match: str) -> None:
    with pytest.raises(ShardplanError, match=match):
        export(_plan(plan_cuts), _graph(), build("flat", num_devices=2), fmt,
               options=ExportOptions(exact=True))


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan"])
def test_a_cut_inside_a_layer_moves_to_the_nearest_boundary(fmt: str) -> None:
    """blocks.0 is nodes 3..6; a cut before node 4 (1 node into it) moves back to node 3
    (1 node away; node 7 is 3 away), and the note names the node that changed stage."""
    out = export(_plan([3 + 1]), _graph(), build("flat", num_devices=2), fmt,
                 options=ExportOptions(torchtitan_version="0.2"))
    assert out.notes == (f"{fmt} splits at layer boundaries: nodes 'n3' move from pipeline "
                         "stage 0 to 1",)
    if fmt == "megatron":
        assert json.loads(out.text)["pipeline_model_parallel_layout"] == "E|ttttL"


def test_refuses_non_consecutive_and_uneven() -> None:
    g = _graph()
    # a diamond 0 -> {1, 2} -> 3: stages {0, 2} and {1, 3} run acyclically, but are not
    # consecutive pieces of the program order 0, 1, 2, 3
    dia = Graph.from_arrays(name="d", fwd_flops=np.ones(4), src=[0, 0, 1, 2], dst=[1, 2, 3, 3],
                            modules=["a", "b", "c", "d"])
    mixed = Plan("d", "flat", "hand", (Stage((0, 2), (0,)), Stage((1, 3), (1,))),
                 Objective("x", 0.0))
    with pytest.raises(ShardplanError, match="runs after a node of a later stage"):
        export(mixed, dia, build("flat", num_devices=2), "torch")
    n = g.num_nodes
    uneven = Plan("gpt", "flat", "hand", (Stage(tuple(range(7)), (0,)),
                                          Stage(tuple(range(7, n)), (1, 2))),
                  Objective("x", 0.0))
    with pytest.raises(ShardplanError, match="same data-parallel degree"):
        export(uneven, g, build("flat", num_devices=3), "deepspeed")


def test_chrome_trace_events() -> None:
    """One X event per simulated interval: per device its stage actions (F and B of every
    micro-batch), the optimizer step, messages on the send track, the all-reduce on the
    collective track; times in microseconds."""
    g = _graph()
    topo = build("flat", num_devices=4)
    plan = _plan([3 + 4 * 2], replicas=2, microbatches=3, schedule="1f1b")
    trace = json.loads(export(plan, g, topo, "chrome-trace").text)
    ev = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    res = simulate(plan, g, topo)
    assert len(ev) == len(res.intervals)
    compute = [e for e in ev if e["tid"] == 0]
    assert len(compute) == 4 * (2 * 3 + 1)  # 4 devices x (3 F + 3 B + the optimizer step)
    assert sorted(e["name"] for e in compute if e["pid"] == 1 and e["cat"] == "F") == \
        ["1F0", "1F1", "1F2"]
    sends = [e for e in ev if e["tid"] == 1]
    assert {e["cat"] for e in sends} == {"activation", "gradient"}
    assert {e["cat"] for e in ev if e["tid"] == 2} == {"allreduce"}
    end = max(e["ts"] + e["dur"] for e in ev)
    assert end == pytest.approx(res.iteration_seconds * 1e6)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"compute", "send", "collective"}


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = _graph()
    topo = build("flat", num_devices=2)
    files = [tmp_path / f for f in ("plan.json", "graph.json", "topo.json")]
    for obj, f in zip((_plan([3 + 4 * 2]), g, topo), files, strict=True):
        save(obj, f)
    args = [str(f) for f in files]
    for fmt in FORMATS:
        out = tmp_path / f"out.{fmt}"
        assert run_cli(["export", *args, "--to", fmt, "-o", str(out)]) == 0
        assert out.stat().st_size > 0
    assert (tmp_path / "out.torchtitan.schedule.csv").exists()
    capsys.readouterr()
    save(_plan([3 + 1]), files[0])  # a stage starting inside blocks.0
    assert run_cli(["export", *args, "--to", "megatron", "-o", str(tmp_path / "m")]) == 0
    assert capsys.readouterr().err == ("shardplan: note: megatron splits at layer boundaries: "
                                       "nodes 'n3' move from pipeline stage 0 to 1\n")
    assert run_cli(["export", *args, "--to", "deepspeed", "--exact-split", "-o",
                    str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "starts inside one, at node 'n4'" in err
    save(_plan([1]), files[0])  # the embedding off the first stage
    assert run_cli(["export", *args, "--to", "megatron", "-o", str(tmp_path / "m2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardplan: error: megatron")
    assert not (tmp_path / "m2").exists()
