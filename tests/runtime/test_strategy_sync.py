"""A strategy run synchronises and computes as its simulator price says (issue 33): gradients
flattened into buckets (all of them at the end, or DDP's buckets during the last backward),
the loss computed on each device's part of the batch, and a batch split of batch norm with
each device's own statistics, as data parallelism runs it."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from shardplan import registry  # noqa: E402
from shardplan.capture import capture_spec  # noqa: E402
from shardplan.ir import ExecutionSettings, Objective, Plan, Stage  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, train_many  # noqa: E402
from shardplan.runtime._worker import run_single  # noqa: E402
from shardplan.topology import flat  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]

TFM = "transformer,num_layers=2,d_model=32,num_heads=2,vocab_size=64"


def test_bucketed_and_end_sync_equal_one_process_and_batch_norm_equals_ddp() -> None:
    """The transformer split on the batch over 2 processes, with DDP-style buckets of 4 KiB
    (several per backward) and with one bucket at the end, trains like one process: the loss
    of each device's half of the batch, reduced, is the batch's. ResNet-18 split on the batch
    trains like DDP (each device's batch norm statistics its own), not like one process."""
    tfm = capture_spec(TFM, batch_size=8, seq_len=8)
    common = dict(model=TFM, steps=3, seq_len=8, optimizer="sgd", lr=0.1)
    cfgs = []
    for sync in ("bucketed", "end"):
        s = ExecutionSettings(microbatch_size=8, microbatches=2, schedule="gpipe",
                              gradient_sync=sync, bucket_bytes=4096)
        plan = registry.run("strategy", "data-parallel", tfm, flat(2), devices=2, cutoff=1,
                            cost_model="default", execution=s.to_dict()).plan
        cfg = config_for_plan(plan.with_settings(s), tfm, **common)
        assert (cfg.kind, cfg.gradient_sync) == ("strategy", sync)
        cfgs.append(cfg)
    res = "torchvision:resnet18"
    r18 = capture_spec(res, batch_size=4, image_size=32)
    both = dict(model=res, steps=2, image_size=32, optimizer="sgd", lr=0.1)
    s = ExecutionSettings(microbatch_size=4, microbatches=1, schedule="gpipe",
                          gradient_sync="bucketed")
    dp = registry.run("strategy", "data-parallel", r18, flat(2), devices=2, cutoff=1,
                      cost_model="default", execution=s.to_dict()).plan
    assert all(f[0] == 2 for v, f in dp.strategy.items() if "batch_norm" in r18.ops[int(v)])
    cfgs.append(config_for_plan(dp.with_settings(s), r18, **both))
    ddp = Plan(r18.name, "flat", "data-parallel", (Stage(tuple(range(r18.num_nodes)), (0, 1)),),
               Objective("x", 0.0)).with_settings(s)
    cfgs.append(config_for_plan(ddp, r18, **both))
    assert cfgs[-1].kind == "ddp"
    got = train_many(cfgs)
    single = run_single(TrainConfig(kind="single", microbatch_size=8, microbatches=2,
                                    **common))
    for r in got[:2]:
        assert r.losses == pytest.approx(single.losses, rel=1e-6, abs=0)
    assert got[2].losses == pytest.approx(got[3].losses, rel=1e-5, abs=0)
    whole = run_single(TrainConfig(kind="single", microbatch_size=4, microbatches=1, **both))
    assert got[2].losses[1] != pytest.approx(whole.losses[1], rel=1e-5, abs=0)
