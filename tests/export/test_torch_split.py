"""The ``torch`` export trains with torch's own pipelining API to shardplan's losses.

shardplan runs the plan (2 gloo processes, its own split of the exported program, GPipe);
the test splits the same model with ``torch.distributed.pipelining.pipeline(split_spec=...)``
from the exported file and trains it in this process, stage by stage, on the same data and
micro-batches: the losses of every step agree.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]

torch = pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.export import export  # noqa: E402
from shardplan.ir import Objective, Plan, Stage  # noqa: E402
from shardplan.runtime import config_for_plan, train  # noqa: E402
from shardplan.runtime._data import chunks  # noqa: E402
from shardplan.topology import build as build_topology  # noqa: E402
from shardplan.workload import batch_for_step, build, loss_fn_for  # noqa: E402


def test_exported_split_trains_like_shardplan() -> None:
    from torch.distributed.pipelining import SplitPoint, pipeline

    graph = capture_spec("mlp", batch_size=4)
    # fc1, relu1, fc2 | relu2, fc3, softmax
    plan = Plan("mlp", "flat", "hand", (Stage((0, 1, 2), (0,)), Stage((3, 4, 5), (1,))),
                Objective("x", 0.0))
    topo = build_topology("flat", num_devices=2)
    steps, m, lr = 3, 2, 0.05
    cfg = config_for_plan(plan, graph, model="mlp", steps=steps, microbatches=m,
                          schedule="gpipe", optimizer="sgd", lr=lr)
    ours = train(cfg).losses
    assert len(ours) == steps

    out = json.loads(export(plan, graph, topo, "torch").text)
    assert out["split_spec"] == {"relu2": "BEGINNING"}
    model, inputs, _ = build("mlp", batch_size=cfg.microbatch_size)
    classes = int(model(*inputs).shape[-1])
    spec = {path: getattr(SplitPoint, where) for path, where in out["split_spec"].items()}
    pipe = pipeline(model, mb_args=tuple(inputs), split_spec=spec)
    assert pipe.num_stages == out["num_stages"] == 2
    stages = [pipe.get_stage_module(i) for i in range(pipe.num_stages)]
    # each torch stage holds exactly the parameters of the plan's stage
    for stage, planned in zip(stages, plan.stages, strict=True):
        held = sum(p.numel() * p.element_size() for p in stage.parameters())
        assert held == sum(int(graph.param_bytes[v]) for v in planned.nodes)
    params = [p for s in stages for p in s.parameters()]
    opt = torch.optim.SGD(params, lr=lr)
    loss_fn = loss_fn_for("mlp")
    theirs = []
    for step in range(steps):
        x, y = batch_for_step(inputs, classes, batch_size=cfg.global_batch, seed=cfg.seed,
                              step=step)
        total = 0.0
        for xs, ys in chunks(x, y, m, 1):
            h = xs
            for stage in stages:
                h = stage(*h) if isinstance(h, tuple) else stage(h)
            loss = loss_fn(h, ys)
            (loss / m).backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        theirs.append(total / m)
    assert theirs == pytest.approx(ours, abs=1e-6)
    assert theirs[-1] != pytest.approx(theirs[0], abs=1e-6)  # the steps did train


@pytest.mark.parametrize("algorithm", ["uniform", "params"])
def test_torch_pipeline_builds_the_stages_the_export_names(algorithm: str) -> None:
    """The captured 4-layer transformer's pipeline plans start stages inside a block; the
    export moves each start to a module start (a note) and torch's own ``pipeline`` then
    builds exactly the export's stages, each holding the parameters of the moved stage."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    from shardplan.export._layers import pipeline_parts
    from shardplan.registry import run as run_algorithm

    spec = "transformer,num_layers=4"
    graph = capture_spec(spec, batch_size=2)
    topo = build_topology("flat", num_devices=2)
    plan = run_algorithm("partition", algorithm, graph, topo, stages=2).plan
    out = json.loads(export(plan, graph, topo, "torch").text)
    parts = pipeline_parts(plan, graph, "torch")
    assert parts.moved and out["split_spec"] == {"blocks.1.mlp.proj": "BEGINNING"}
    model, inputs, _ = build(spec, batch_size=2)  # a fresh model: pipeline() marks it
    pipe = pipeline(model, mb_args=tuple(inputs),
                    split_spec={p: getattr(SplitPoint, w) for p, w in out["split_spec"].items()})
    assert pipe.num_stages == out["num_stages"] == 2
    for i, nodes in enumerate(parts.nodes):
        held = sum(p.numel() * p.element_size() for p in pipe.get_stage_module(i).parameters())
        assert held == sum(int(graph.param_bytes[v]) for v in nodes)
