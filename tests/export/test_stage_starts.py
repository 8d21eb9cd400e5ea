"""Where a format can start a stage (shardplan/export/_layers.py, issue 38): a plan's stage
that starts inside a module moves to the nearest module start (ties: the earlier), every
stage keeps a node, the notes name the nodes moved, and a plan the model has too few starts
for, or whose stages are not pieces of the program, is refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.export import ExportOptions, export
from shardplan.export._layers import layer_key
from shardplan.ir import Graph, Objective, Plan, Stage
from shardplan.topology import build


def _graph(mods: list[str]) -> Graph:
    n = len(mods)
    return Graph.from_arrays(name="g", fwd_flops=np.full(n, 1e9), src=np.arange(n - 1),
                             dst=np.arange(1, n), output_bytes=np.full(n, 4096),
                             param_bytes=np.full(n, 1024), names=[f"n{i}" for i in range(n)],
                             ops=["linear"] * n, modules=mods, batch_size=4)


def _plan(n: int, cuts: list[int], order: list[int] | None = None) -> Plan:
    bounds = [0, *cuts, n]
    k = len(bounds) - 1
    nodes = [tuple(range(bounds[s], bounds[s + 1])) for s in range(k)]
    if order is not None:
        nodes = [nodes[i] for i in order]
    plan = Plan("g", "flat", "hand", tuple(Stage(nodes[s], (s,)) for s in range(k)),
                Objective("x", 0.0))
    return plan.with_settings(plan.settings.override(microbatches=k)[0])


def _torch(mods: list[str], cuts: list[int], **kw) -> tuple[dict, tuple[str, ...]]:
    k = len(cuts) + 1
    exp = export(_plan(len(mods), cuts), _graph(mods), build("flat", num_devices=k), "torch",
                 **kw)
    return json.loads(exp.text), exp.notes


@pytest.mark.parametrize("mods, cuts, starts, notes", [
    # places 1 (b), 2 (c), 4 (d): the first cut stays, the second (inside c) goes to the
    # earlier of two equally near starts, right after the first piece
    (["a", "b", "c", "c", "d"], [1, 3], ["b", "c"],
     ["torch splits at module starts: nodes 'n2' move from pipeline stage 1 to 2"]),
    # the second start is nearer: the cut moves forward, to the last node it can take
    (["a", "a", "b", "b", "b", "c"], [4], ["c"],
     ["torch splits at module starts: nodes 'n4' move from pipeline stage 1 to 0"]),
    # the nearest start for the second cut is taken by the first: the next one
    (["a", "a", "b", "b", "c", "c"], [1, 3], ["b", "c"],
     ["torch splits at module starts: nodes 'n1' move from pipeline stage 1 to 0",
      "torch splits at module starts: nodes 'n3' move from pipeline stage 2 to 1"]),
])
def test_cuts_move_to_the_nearest_module_start(mods, cuts, starts, notes) -> None:
    out, got = _torch(mods, cuts)
    assert list(out["split_spec"]) == starts
    assert list(got) == notes == out["moved"]


def test_the_notes_name_six_nodes_and_count_the_rest() -> None:
    mods = ["a"] + ["b"] * 16 + ["c"]
    out, notes = _torch(mods, [9])  # 8 nodes after b's start, 9 before c's: back to b
    assert notes == ("torch splits at module starts: nodes 'n1', 'n2', 'n3', 'n4', 'n5', "
                     "'n6' and 2 more move from pipeline stage 0 to 1",)
    _, notes = _torch(["a"] + ["b"] * 14 + ["c"], [7])  # exactly 6 nodes move
    assert notes == ("torch splits at module starts: nodes 'n1', 'n2', 'n3', 'n4', 'n5', "
                     "'n6' move from pipeline stage 0 to 1",)


def test_exact_refuses_instead_of_moving() -> None:
    with pytest.raises(ShardplanError, match=r"^torch splits at module starts, and pipeline "
                                             r"stage 2 starts inside one, at node 'n3' \(c\)$"):
        _torch(["a", "b", "c", "c", "d"], [1, 3], options=ExportOptions(exact=True))
    out, notes = _torch(["a", "b", "c", "c", "d"], [1, 2], options=ExportOptions(exact=True))
    assert notes == () and list(out["split_spec"]) == ["b", "c"]


def test_too_few_starts_for_the_stages() -> None:
    with pytest.raises(ShardplanError, match=r"^torch splits at module starts, and the model has "
                                             r"too few of them for the plan's 3 stages$"):
        _torch(["a", "a", "b", "b"], [1, 3])


def test_stages_that_are_not_pieces_of_the_program() -> None:
    # two branches of node 0 joining at node 3: stage 0 = {0, 2}, stage 1 = {1, 3} has no
    # cycle, but program order runs node 1 (stage 1) before node 2 (stage 0)
    g = Graph.from_arrays(name="g", fwd_flops=np.full(4, 1e9), src=np.array([0, 0, 1, 2]),
                          dst=np.array([1, 2, 3, 3]), output_bytes=np.full(4, 4096),
                          param_bytes=np.full(4, 1024), names=[f"n{i}" for i in range(4)],
                          ops=["linear"] * 4, modules=["a", "b", "c", "d"], batch_size=4)
    plan = Plan("g", "flat", "hand", (Stage((0, 2), (0,)), Stage((1, 3), (1,))),
                Objective("x", 0.0))
    with pytest.raises(ShardplanError, match=r"^torch cuts the program into consecutive "
                                             r"pieces, and the plan's stages are not: node "
                                             r"'n2' \(c\) runs after a node of a later stage$"):
        export(plan, g, build("flat", num_devices=2), "torch")


def test_a_stage_of_module_less_operators_only() -> None:
    mods = ["a", "b", "", "", "c"]
    plan = Plan("g", "flat", "hand", (Stage((0, 1), (0,)), Stage((2, 3), (1,)),
                                      Stage((4,), (2,))), Objective("x", 0.0))
    with pytest.raises(ShardplanError, match=r"^torch needs modules in every stage, and "
                                             r"pipeline stage 1 holds only module-less "
                                             r"operators$"):
        export(plan, _graph(mods), build("flat", num_devices=3), "torch")
    with pytest.raises(ShardplanError, match=r"^torch splits a model by module paths, and no "
                                             r"node of the graph names its module \(a generated "
                                             r"or imported graph\)$"):
        export(_plan(3, [1]), _graph(["", "", ""]), build("flat", num_devices=2), "torch")


@pytest.mark.parametrize("module, depth, key", [
    ("blocks.3.attn", 1, "blocks.3"), ("transformer.h.2.mlp", 2, "transformer.h.2"),
    ("transformer.wte", 2, "transformer.wte"), ("transformer.ln_f.x", 2, "transformer.ln_f"),
    ("head", 2, "head"), ("tok_emb.w", None, "tok_emb"), ("tok_emb.w", 0, "tok_emb"),
    ("blocks", 1, "blocks"), ("a.b.c", 1, "a"),
])
def test_layer_keys(module: str, depth: int | None, key: str) -> None:
    assert layer_key(module, depth) == key


def test_the_block_list_is_found_at_its_shallowest_depth() -> None:
    from shardplan.export._layers import pipeline_parts

    mods = ["emb", "x.0.a", "x.1.a", "y.z.5", "head"]
    parts = pipeline_parts(_plan(5, [2]), _graph(mods), "torch", unit="layer")
    assert parts.block_depth == 1
    assert parts.layers == ("emb", "x.0", "x.1", "y", "head")
    parts = pipeline_parts(_plan(3, [2]), _graph(["", "a.b", "c"]), "torch")
    assert parts.block_depth is None and parts.layers == ("a", "c")


def _parts(mods: list[str], cuts: list[int], **kw):
    from shardplan.export._layers import pipeline_parts

    return pipeline_parts(_plan(len(mods), cuts), _graph(mods), "torch", **kw)


def test_a_cut_keeps_a_node_for_every_later_stage() -> None:
    # b starts at 1, c at 4; the first cut (inside b) is nearer c's start, which the second
    # stage needs: it goes back to b's
    out, notes = _torch(["a", "b", "b", "b", "c"], [3, 4])
    assert list(out["split_spec"]) == ["b", "c"]
    assert notes == ("torch splits at module starts: nodes 'n1', 'n2' move from pipeline "
                     "stage 0 to 1",)


@pytest.mark.parametrize("mods, cuts, moved", [
    (["a.x", "a.y", "b"], [1], True),           # inside layer a: moves to b
    (["a", "b", "c", "b"], [1], False),         # b starts at 1 (and comes back at the end)
    (["t", "blocks.0.x", "blocks.1.x", "blocks.0.y", "h"], [3], True),  # blocks.0 again
])
def test_layer_boundaries(mods, cuts, moved) -> None:
    parts = _parts(mods, cuts, unit="layer")
    assert bool(parts.moved) is moved


def test_the_parts_in_pipeline_order() -> None:
    parts = _parts(["a", "b", "c", "d"], [2])
    assert parts.order == (0, 1) and parts.nodes == ((0, 1), (2, 3))
    assert parts.stage_layers == (("a", "b"), ("c", "d")) and parts.starts == ("c",)
    # by default a stage inside a module moves (exact=False)
    assert _parts(["a", "b", "b", "c"], [2]).moved


def test_a_last_stage_of_module_less_operators_only() -> None:
    plan = Plan("g", "flat", "hand", (Stage((0,), (0,)), Stage((1,), (1,)), Stage((2,), (2,))),
                Objective("x", 0.0))
    with pytest.raises(ShardplanError, match=r"^torch needs modules in every stage, and "
                                             r"pipeline stage 2 holds only module-less"):
        export(plan, _graph(["a", "b", ""]), build("flat", num_devices=3), "torch")


def test_the_first_node_out_of_order_is_named() -> None:
    # 0 -> 1 -> {2, 3} -> 4; stage 0 = {0, 1, 3}, stage 1 = {2, 4}: program order 0 0 1 0 1
    g = Graph.from_arrays(name="g", fwd_flops=np.full(5, 1e9), src=np.array([0, 1, 1, 2, 3]),
                          dst=np.array([1, 2, 3, 4, 4]), output_bytes=np.full(5, 4096),
                          param_bytes=np.full(5, 1024), names=[f"n{i}" for i in range(5)],
                          ops=["linear"] * 5, modules=["a", "b", "c", "d", "e"], batch_size=4)
    plan = Plan("g", "flat", "hand", (Stage((0, 1, 3), (0,)), Stage((2, 4), (1,))),
                Objective("x", 0.0))
    with pytest.raises(ShardplanError, match=r"node 'n3' \(d\) runs after a node of a later"):
        export(plan, g, build("flat", num_devices=2), "torch")


def test_a_strategy_plan_goes_to_chrome_trace() -> None:
    from shardplan import registry

    g, t = _graph(["a", "b", "c", "d"]), build("flat", num_devices=2)
    plan = registry.run("strategy", "data-parallel", g, t, cutoff=1).plan
    with pytest.raises(ShardplanError, match=r"^torch takes a pipeline split, and this plan "
                                             r"shards layers \(a strategy plan\); export it as "
                                             r"chrome-trace$"):
        export(plan, g, t, "torch")
