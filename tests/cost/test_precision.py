"""Training settings in the cost model: the precision's matrix-product rate and bytes per
parameter, the distributed optimizer's memory, and recompute's three values."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.cost import CostModel, matmul_peak_flops, partition_memory_breakdown
from shardplan.cost._gpu import GPU_MODELS
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph
from shardplan.topology import build


def _graph() -> Graph:
    # a 200 GFLOP linear layer (compute-bound on every preset) and a ReLU
    return Graph.from_arrays(name="g", fwd_flops=[2e11, 2.5e5], src=[0], dst=[1],
                             bwd_flops=[4e11, 2.5e5], output_bytes=[1e6, 1e6],
                             param_bytes=[4e6, 0], ops=["linear", "relu_"])


@pytest.mark.parametrize("precision, rate", [("fp32", 67e12), ("bf16", 989e12),
                                             ("fp16", 989e12), ("fp8", 1979e12)])
def test_matrix_products_run_at_the_precisions_peak(precision, rate) -> None:
    """At the precision's peak times what kernels reach of it on this GPU (the GPU model
    every plan kind prices with: tensor-core products at MAMF, streaming at the HBM
    fraction; fp32 products at their peak)."""
    topo = build("dgx-h100", nodes=1)
    assert matmul_peak_flops(topo, precision)[0] == rate
    hw = GPU_MODELS["h100"]
    achieved = rate * (hw.matmul_fraction(precision) if precision != "fp32" else 1.0)
    if precision == "fp8":  # fp8 products reach their own, lower fraction of their peak
        assert hw.matmul_fraction(precision) == pytest.approx(1402.6 / 1979)
    cm = CostModel.from_settings(_graph(), topo, ExecutionSettings(precision=precision))
    fwd, bwd = cm.node_seconds(0)
    assert fwd[0] == pytest.approx(2e11 / achieved) and bwd[0] == pytest.approx(4e11 / achieved)
    # the ReLU is memory-bound whatever the precision
    assert fwd[1] == pytest.approx(2e6 / (3.35e12 * hw.memory_efficiency))
    # an explicit efficiency replaces the model: the datasheet peak times it
    if precision in ("bf16", "fp16"):
        peak = CostModel.from_settings(_graph(), topo, ExecutionSettings(precision=precision,
                                                                          efficiency=1.0))
        assert peak.node_seconds(0)[0][0] == pytest.approx(2e11 / rate)


def test_fp8_with_an_efficiency_runs_at_the_fp8_peak() -> None:
    topo = build("dgx-h100", nodes=1)
    s = ExecutionSettings(precision="fp8", efficiency=0.5)
    fwd, _ = CostModel.from_settings(_graph(), topo, s).node_seconds(0)
    assert fwd[0] == pytest.approx(2e11 / (0.5 * 1979e12))


@pytest.mark.parametrize("kind", ["dgx-a100", "dgx2-v100"])
def test_fp8_is_refused_on_gpus_without_it(kind) -> None:
    topo = build(kind, nodes=1)
    with pytest.raises(ShardplanError, match="fp8") as err:
        CostModel.from_settings(_graph(), topo, ExecutionSettings(precision="fp8"))
    assert "\n" not in str(err.value) and "use bf16" in str(err.value)


def test_bytes_per_parameter_by_precision() -> None:
    """Adam: fp32 4 + 4 + 8 = 16 bytes per stored byte-width-4 parameter; half and fp8
    (bf16 weights) the ZeRO paper's 2 + 2 + 4 master + 8 moments per 2-byte parameter."""
    def per_param(settings: ExecutionSettings, width: float) -> float:
        one = Graph.from_arrays(name="one", fwd_flops=[0.0], src=[], dst=[],
                                param_bytes=[width], output_bytes=[0])
        b = CostModel.from_settings(one, None, settings).memory_breakdown([0], 1, in_flight=0)
        return float(sum(b[k][0] for k in ("params", "gradients", "master", "optimizer")))

    assert per_param(ExecutionSettings(), 4) == 16  # one fp32 parameter
    for p in ("bf16", "fp16", "fp8"):  # one 2-byte parameter
        assert per_param(ExecutionSettings(precision=p), 2) == 16


def test_zero1_shards_master_weights_and_optimizer_state_only() -> None:
    g = Graph.from_arrays(name="g", fwd_flops=[0.0], src=[], dst=[], param_bytes=[2e9],
                          output_bytes=[0])
    kw = {"optimizer": "adam", "in_flight": 0, "mixed_precision": True,
          "param_dtype_bytes": 2, "replicas": 8}
    ddp = partition_memory_breakdown(g, [0], 1, **kw)
    z1 = partition_memory_breakdown(g, [0], 1, optimizer_sharded=True, **kw)
    z3 = partition_memory_breakdown(g, [0], 1, sharded=True, **kw)
    assert (ddp["params"][0], ddp["master"][0], ddp["optimizer"][0]) == (2e9, 4e9, 8e9)
    assert (z1["params"][0], z1["gradients"][0]) == (2e9, 2e9)
    assert (z1["master"][0], z1["optimizer"][0]) == (4e9 / 8, 8e9 / 8)
    assert z3["params"][0] == 2e9 / 8 and z3["total"][0] < z1["total"][0] < ddp["total"][0]
    # the cost model reads it from the settings
    cm = CostModel.from_settings(g, None, ExecutionSettings(precision="bf16",
                                                            gradient_sync="zero1"))
    got = cm.memory_breakdown([0], 1, in_flight=0, replicas=8)
    assert got["optimizer"][0] == pytest.approx(1e9)


def test_selective_recompute_prices_as_none_and_full_adds_a_forward() -> None:
    g, topo = _graph(), build("flat", num_devices=2)
    none, sel, full = (CostModel.from_settings(g, topo, ExecutionSettings(recompute=r))
                       for r in ("none", "selective", "full"))
    f0, b0 = none.node_seconds(0)
    assert np.array_equal(sel.node_seconds(0)[1], b0)
    assert np.allclose(full.node_seconds(0)[1], b0 + f0)
    assert sel.recompute is False and full.recompute is True


def test_the_llm_cost_model_runs_fp8_products_at_the_fp8_peak() -> None:
    from shardplan.cost import llm_costs
    from shardplan.ir import ParallelConfig
    from tests.cost.llm_graph import gpt_graph

    g = gpt_graph(hidden=2048, layers=2, seq=512, batch=4)
    h100 = build("dgx-h100", nodes=1)
    bf16, fp8 = (llm_costs(g, h100, ParallelConfig(),
                           ExecutionSettings(microbatch_size=4, microbatches=1, precision=p))
                 for p in ("bf16", "fp8"))
    assert fp8.forward.sum() < bf16.forward.sum()
    with pytest.raises(ShardplanError, match="fp8"):
        llm_costs(g, build("dgx-a100", nodes=1), ParallelConfig(),
                  ExecutionSettings(microbatch_size=4, microbatches=1, precision="fp8"))
