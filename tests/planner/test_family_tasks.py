"""The tasks ``plan``'s search hands out (issue 38): one per family and shape, exactly, so
no shape of the cluster is left unsearched and none is searched twice."""

from __future__ import annotations

import pytest

from shardplan.errors import ShardplanError
from shardplan.generate import layered
from shardplan.ir import ExecutionSettings
from shardplan.planner._families import Context, Evaluated, Task, shape_label, tasks_for
from shardplan.topology import build


def _ctx(nodes: int, devices: int, batch: int = 8) -> Context:
    g = layered(num_nodes=nodes, width=1, seed=0)
    return Context(g, build("flat", num_devices=devices), batch,
                   ExecutionSettings().resolve(g))


def test_tasks_of_every_family_on_four_devices() -> None:
    ctx = _ctx(nodes=4, devices=4)  # as many nodes as devices: the 4 x 1 shape too
    got = tasks_for(ctx, ["data-parallel", "uniform", "hybrid", "pipedream", "sharding",
                          "llm", "pase"])
    assert got[:6] == [Task("data-parallel", 1, 4), Task("uniform", 2, 2),
                       Task("uniform", 4, 1), Task("hybrid", 2, 2), Task("pipedream", 0, 0),
                       Task("sharding", 0, 0)]
    assert got[6] == Task("llm", 0, 0)
    pase = got[7:]
    # one per micro-batch count (1, 2, 4 of 8 samples) and gradient sync
    assert [(t.family, t.stages, t.replicas, t.microbatches, t.gradient_sync)
            for t in pase] == [("pase", 0, 0, m, s) for m in (1, 2, 4)
                               for s in ("end", "bucketed")]
    assert [t.label for t in got[:2]] == ["data-parallel 1x4", "uniform 2x2"]
    assert pase[1].label == "pase 0x0 M=1 bucketed"


def test_no_more_stages_than_nodes() -> None:
    ctx = _ctx(nodes=3, devices=4)
    assert tasks_for(ctx, ["params"]) == [Task("params", 2, 2)]


def test_an_unknown_family_is_refused() -> None:
    with pytest.raises(ShardplanError, match=r"^unknown plan family 'magic' \(choose from "
                                             r"data-parallel, parmesan, pipedream, "):
        tasks_for(_ctx(4, 4), ["magic"])


def test_a_row_without_a_plan() -> None:
    """A variant the simulator refused has no plan: its row says no replicas per stage."""
    row = Evaluated("uniform", "uniform", 2, 2, "1f1b", 4, "consecutive", "end", float("inf"),
                    0.0, float("inf"), False, 0.1, {}, note="refused")
    assert row.row()["replicas_per_stage"] == [] and shape_label(row) == "2 x 2"


def _runs(ctx: Context, stages: int) -> list[tuple[int, int, str, str]]:
    from shardplan.planner._families import _strategy_runs

    return [(s.microbatches, s.microbatch_size, s.schedule, s.gradient_sync)
            for s in _strategy_runs(ctx, stages)]


def test_strategy_variants() -> None:
    """What a strategy search (PaSE's, a hybrid's stages) is priced at: every micro-batch
    count under the end-of-step all-reduce and, on one stage over several devices, DDP's
    bucketed one; one stage runs GPipe's order (no pipeline), more 1F1B."""
    ctx = _ctx(4, 4, batch=8)
    assert _runs(ctx, 1) == [(m, 8 // m, "gpipe", s) for m in (1, 2, 4)
                             for s in ("end", "bucketed")]
    assert _runs(ctx, 2) == [(m, 8 // m, "1f1b", "end") for m in (2, 4, 8)]
    two = _ctx(4, 2, batch=8)
    assert [r[3] for r in _runs(two, 1)] == ["end", "bucketed"] * 3
    one = _ctx(4, 1, batch=8)
    assert _runs(one, 1) == [(m, 8 // m, "gpipe", "end") for m in (1, 2, 4)]


@pytest.mark.parametrize("fixed, want", [
    ({"gradient_sync": "bucketed"}, [(2, 4, "gpipe", "bucketed")]),
    ({"gradient_sync": "end"}, [(2, 4, "gpipe", "end")]),
    ({"gradient_sync": "sharded"}, [(2, 4, "gpipe", "end"), (2, 4, "gpipe", "bucketed")]),
])
def test_strategy_variants_keep_what_the_user_fixed(fixed, want) -> None:
    ctx = _ctx(4, 4, batch=8)
    ctx.fixed = {"microbatches": 2, **fixed}
    assert _runs(ctx, 1) == want
