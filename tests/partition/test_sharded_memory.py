"""The pipeline partitioners' memory check under sharded data parallelism: a model that fits
only with its state split over the replicas (FSDP ``sharded``; the distributed optimizer
``zero1``) is planned, not refused."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan import registry
from shardplan.cost import CostModel
from shardplan.errors import InfeasibleError
from shardplan.ir import ExecutionSettings, Graph
from shardplan.partition._pipeline_dp import StageContext
from shardplan.topology import flat


def _chain(n: int, param_bytes: float) -> Graph:
    return Graph.from_arrays(name="g", fwd_flops=np.full(n, 1e9), src=list(range(n - 1)),
                             dst=list(range(1, n)), param_bytes=np.full(n, param_bytes),
                             output_bytes=np.full(n, 1e6))


@pytest.mark.parametrize("sync, factor", [("end", 4.0), ("bucketed", 4.0),
                                          ("sharded", 4.0 / 4), ("zero1", 2.0 + 2.0 / 4)])
def test_state_bytes_per_parameter_byte_are_split_over_the_replicas(sync, factor) -> None:
    """fp32 Adam: parameters, gradients and two moments, 4 bytes per parameter byte; FSDP
    splits all four over the 4 replicas, the distributed optimizer the moments only."""
    g, topo = _chain(4, 1e6), flat(8)
    s = ExecutionSettings(gradient_sync=sync)
    ctx = StageContext.build(CostModel.from_settings(g, topo, s), topo, s, 2, 4)
    assert ctx.state_factor == pytest.approx(factor)


@pytest.mark.parametrize("algorithm", ["parmesan", "uniform"])
def test_a_model_that_fits_only_sharded_is_planned(algorithm) -> None:
    # 120 nodes of 100 MB: 6 GB of parameters per stage of two; fp32 Adam needs 24 GB per
    # device replicated, 16 GB under zero1 (moments split in two), 12 GB sharded: 14 GB fit
    # only sharded
    g, topo = _chain(120, 1e8), flat(4, memory_bytes=14e9)
    kw = {"stages": 2, "replicas": 2, "time_limit": 30}
    for sync in ("end", "zero1"):
        with pytest.raises(InfeasibleError, match="GiB"):
            registry.run("partition", algorithm, g, topo, gradient_sync=sync, **kw)
    res = registry.run("partition", algorithm, g, topo, gradient_sync="sharded", **kw)
    assert res.plan.settings.gradient_sync == "sharded" and res.plan.num_stages == 2
    assert np.isfinite(res.plan.objective.value)


def test_a_model_that_fits_only_with_the_distributed_optimizer_is_planned() -> None:
    g, topo = _chain(120, 1e8), flat(4, memory_bytes=19e9)
    kw = {"stages": 2, "replicas": 2, "time_limit": 30}
    with pytest.raises(InfeasibleError):
        registry.run("partition", "parmesan", g, topo, gradient_sync="end", **kw)
    res = registry.run("partition", "parmesan", g, topo, gradient_sync="zero1", **kw)
    assert res.plan.settings.gradient_sync == "zero1"
