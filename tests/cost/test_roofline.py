"""The roofline compute model: device presets with fp32 rate and memory bandwidth, operator
classes, and what execution settings choose."""

from __future__ import annotations

import pytest

from shardplan.cost import CostModel, roofline_seconds
from shardplan.cost._compute import is_matmul
from shardplan.cost._gpu import GPU_MODELS
from shardplan.ir import ExecutionSettings, Graph
from shardplan.topology import build


def _graph() -> Graph:
    # a 2 GFLOP linear layer (1 MB in, 1 MB out, 4 MB weights) and a ReLU on its output
    return Graph.from_arrays(name="g", fwd_flops=[2e9, 2.5e5], src=[0], dst=[1],
                             bwd_flops=[4e9, 2.5e5], output_bytes=[1e6, 1e6],
                             param_bytes=[4e6, 0], ops=["linear", "relu_"])


@pytest.mark.parametrize("op, mm", [("conv2d", True), ("linear", True), ("addmm", True),
                                    ("scaled_dot_product_attention", True), ("bmm", True),
                                    ("relu_", False), ("batch_norm", False), ("add", False),
                                    ("max_pool2d", False), ("layer_norm", False)])
def test_operator_classes(op, mm):
    assert is_matmul(op) == mm


def test_v100_roofline_by_hand():
    g = _graph()
    topo = build("flat", num_devices=2)  # V100 preset: 125 TF tensor, 15.7 TF fp32, 900 GB/s
    fp32 = CostModel.from_settings(g, topo, ExecutionSettings())
    fwd, bwd = fp32.node_seconds(0)
    # linear: fp32 units, compute-bound (2e9 / 15.7e12 > 5e6 / 9e11)
    assert fwd[0] == pytest.approx(2e9 / 15.7e12)
    assert bwd[0] == pytest.approx(4e9 / 15.7e12)
    # relu: memory-bound: in 1 MB + out 1 MB forward; out + 2 in backward, at what streaming
    # kernels reach of the HBM (the GPU model, shardplan.cost._gpu)
    hbm = 900e9 * GPU_MODELS["v100"].memory_efficiency
    assert fwd[1] == pytest.approx(2e6 / hbm)
    assert bwd[1] == pytest.approx(3e6 / hbm)
    # mixed precision: the linear layer reaches the tensor cores (at the GPU model's
    # fraction), memory-bound at 6 MB
    mixed = CostModel.from_settings(g, topo, ExecutionSettings(precision="bf16"))
    fwd, _ = mixed.node_seconds(0)
    tensor = 125e12 * GPU_MODELS["v100"].matmul_efficiency
    assert fwd[0] == pytest.approx(max(2e9 / tensor, 6e6 / hbm))
    # an efficiency given in the settings prices FLOPs at that fraction of the peak, as before
    plain = CostModel.from_settings(g, topo, ExecutionSettings(efficiency=0.5))
    fwd, _ = plain.node_seconds(0)
    assert fwd.tolist() == pytest.approx([2e9 / 62.5e12, 2.5e5 / 62.5e12])


def test_devices_given_only_a_rate_keep_flops_over_peak():
    g = _graph()
    topo = build("flat", num_devices=2, flops=1e12)
    fwd, bwd = CostModel.from_settings(g, topo, ExecutionSettings()).node_seconds(1)
    assert fwd.tolist() == pytest.approx([2e-3, 2.5e-7])
    assert "memory_bandwidth" not in topo.devices[0].extra


def test_roofline_matches_the_function_and_scales_with_the_peak():
    g = _graph()
    a100 = build("flat", num_devices=2, device="a100")
    cm = CostModel.from_settings(g, a100, ExecutionSettings())
    tf, tb = roofline_seconds(g, 312e12, 19.5e12, 2039e9 * GPU_MODELS["a100"].memory_efficiency)
    fwd, bwd = cm.node_seconds(1)
    assert fwd.tolist() == pytest.approx(tf.tolist()) and bwd.tolist() == pytest.approx(
        tb.tolist())
    # measured seconds win over the roofline
    measured = g.replace(fwd_seconds=[1.0, float("nan")])
    fwd, _ = CostModel.from_settings(measured, a100, ExecutionSettings()).node_seconds(0)
    assert fwd[0] == 1.0 and fwd[1] == pytest.approx(tf[1])
