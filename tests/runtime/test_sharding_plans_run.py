"""Paper 000's partitions train (issue #16.3-4): plans of the sharding partitioners (acyclic
by default) run as GPipe pipelines, as the paper ran them, on the operator-level MLP and on
the paper's GNN captured at module level with its graph convolutions atomic; equal to one
process running the same stage modules.

The fast suite runs the two-process configs inside the one launch of
``test_strategy_run.py``; three processes (the paper's GPU count) are marked slow.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from shardplan import registry  # noqa: E402
from shardplan.capture import capture_spec  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, train_many  # noqa: E402
from shardplan.topology import build  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]

GNN = "gnn"


def _gnn(_cache: dict = {}) -> object:  # noqa: B006 - a per-session cache
    if "g" not in _cache:
        _cache["g"] = capture_spec(GNN, batch_size=4, granularity="module",
                                   atomic="GraphConv")
    return _cache["g"]


def _mlp(_cache: dict = {}) -> object:  # noqa: B006
    if "g" not in _cache:
        _cache["g"] = capture_spec("mlp", batch_size=4)
    return _cache["g"]


def sharding_configs(devices: int) -> list[TrainConfig]:
    """The GNN partitioned by brute force and the MLP by the heuristic (and hierarchical
    on two boxes when there are 4 devices), each over ``devices`` single-device stages;
    GPipe, the partitioners' default schedule."""
    flat = build("flat", num_devices=devices)
    out = []
    gnn = registry.run("partition", "brute-force", _gnn(), flat).plan
    assert gnn.status == "optimal" and gnn.num_stages == devices
    assert _gnn().is_acyclic_partition(gnn.assignment(_gnn().num_nodes))
    assert gnn.settings.schedule == "gpipe"
    out.append(config_for_plan(gnn, _gnn(), model=GNN, steps=3, microbatches=4,
                               microbatch_size=4, optimizer="adam", return_params=True))
    mlp = registry.run("partition", "heuristic", _mlp(), flat, workers=1).plan
    out.append(config_for_plan(mlp, _mlp(), model="mlp", steps=3, microbatches=2,
                               microbatch_size=4, optimizer="sgd", lr=0.5,
                               return_params=True))
    return out


def check(cfgs: list[TrainConfig], results: list[object]) -> None:
    from test_strategy_run import check_equal, reference

    for cfg, got in zip(cfgs, results, strict=True):
        assert cfg.kind == "pipeline" and cfg.schedule == "gpipe"
        check_equal(cfg, got, reference(cfg))


@pytest.mark.slow
def test_three_processes_as_the_paper() -> None:
    cfgs = sharding_configs(3)
    check(cfgs, train_many(cfgs))
