"""The ``torch`` export of an interleaved plan runs on torch's own pipelining runtime: gloo
processes, one per exported rank, each building its stages from the exported ``split_spec``
and ``stage_rank`` with ``pipeline()``, stepping the exported schedule class; the losses
equal one process's."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]

torch = pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.export import export  # noqa: E402
from shardplan.registry import run as run_algorithm  # noqa: E402
from shardplan.topology import build as build_topology  # noqa: E402
from shardplan.workload import batch_for_step, build, loss_fn_for  # noqa: E402

SPEC, MICRO, M = "transformer,num_layers=4", 2, 4


def _data() -> tuple[object, object, int]:
    torch.manual_seed(0)
    model, inputs, _ = build(SPEC, batch_size=MICRO)
    classes = int(model(*inputs).shape[-1])
    (x,), y = batch_for_step(inputs, classes, batch_size=MICRO * M, seed=0, step=0)
    return x, y, classes


def _rank(rank: int, port: int, exported: dict, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, SplitPoint, pipeline
    from torch.distributed.pipelining.schedules import get_schedule_class

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=exported["num_ranks"])
    try:
        x, y, _ = _data()
        torch.manual_seed(0)
        model, inputs, _ = build(SPEC, batch_size=MICRO)
        spec = {p: getattr(SplitPoint, w) for p, w in exported["split_spec"].items()}
        pipe = pipeline(model, mb_args=tuple(inputs), split_spec=spec)
        mine = [i for i, r in enumerate(exported["stage_rank"]) if r == rank]
        stages = [PipelineStage(pipe.get_stage_module(i), i, exported["num_stages"],
                                torch.device("cpu")) for i in mine]
        loss_fn = loss_fn_for(SPEC)
        schedule = get_schedule_class(exported["schedule"])(
            stages, n_microbatches=exported["microbatches"], loss_fn=loss_fn)
        losses: list = []
        last = exported["num_stages"] - 1
        if 0 in mine and last in mine:
            schedule.step(x, target=y, losses=losses)
        elif 0 in mine:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        if losses:
            Path(out).write_text(json.dumps([float(v) for v in losses]))
    finally:
        dist.destroy_process_group()
    os._exit(0)  # done: no interpreter teardown of gloo (it can abort at exit)


def test_interleaved_export_runs_on_torch_pipelining(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    graph = capture_spec(SPEC, batch_size=MICRO)
    topo = build_topology("flat", num_devices=4)
    plan = run_algorithm("partition", "uniform", graph, topo, stages=4).plan
    plan = plan.with_settings(plan.settings.override(
        schedule="interleaved-1f1b", virtual_stages=2, microbatches=M,
        microbatch_size=MICRO)[0])
    exported = json.loads(export(plan, graph, topo, "torch").text)
    # the plan's 4 stages are on 4 devices: 4 ranks of one stage each, in torch's order
    assert exported["num_ranks"] == 4 and exported["stage_rank"] == [0, 1, 2, 3]
    assert exported["schedule"] == "Interleaved1F1B"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "losses.json"
    mp.spawn(_rank, args=(port, exported, str(out)), nprocs=exported["num_ranks"], join=True)
    theirs = json.loads(out.read_text())
    x, y, _ = _data()
    torch.manual_seed(0)
    model, _, _ = build(SPEC, batch_size=MICRO)
    loss_fn = loss_fn_for(SPEC)
    ours = [float(loss_fn(model(xs), ys)) for xs, ys in zip(x.chunk(M), y.chunk(M),
                                                              strict=True)]
    assert theirs == pytest.approx(ours, rel=1e-5)
