"""GPU models of the new presets and custom GPUs, NCCL over bridged PCIe pairs and NVL72
racks, and an LLM plan simulated end to end on them."""

from __future__ import annotations

import pytest

from shardplan.cost._gpu import (
    GPU_MODELS,
    cluster_collective_seconds,
    gpu_model,
    group_collective_seconds,
    node_ids,
)
from shardplan.ir import ExecutionSettings, ParallelConfig
from shardplan.planner._llm import llm_plan
from shardplan.topology import build_spec
from tests.cost.llm_graph import gpt_graph

CUSTOM = ("custom,nodes=2,gpus_per_node=8,flops=1.3e15,fp32_flops=1.6e14,"
          "memory_bandwidth=5.3e12,gpu_memory=192GB,nvlink_bandwidth=4.5e11,nic_gbps=400")


# the GPU model each kind's devices get: matmul fraction (MAMF / peak) and SMs
@pytest.mark.parametrize("spec, model, mamf, sms", [
    ("dgx-h100", "h100", 792.1 / 989, 132),
    # H100 SXM's fraction x the middle of torchtitan's "between SXM and NVL" bracket
    ("dgx-h100,gpu=h100-96gb", "h100-96gb", 792.1 / 989 * (835 + 989) / 2 / 989, 132),
    ("pcie-h100", "h100-pcie", 792.1 / 989, 114),               # assumed: H100 SXM's
    ("dgx-h200", "h200", 794.5 / 989, 132),                     # "H200 is the same"
    ("dgx-b200", "b200", 1745.0 / 2250, 148),
    ("gb200-nvl72", "gb200", 1822.0 / 2500, 148),
])
def test_each_preset_has_its_gpu_model(spec, model, mamf, sms) -> None:
    m = gpu_model(build_spec(spec))
    assert m is GPU_MODELS[model]
    assert m.matmul_efficiency == pytest.approx(mamf, rel=1e-12) and m.sms == sms
    assert m.source


@pytest.mark.parametrize("arch, ref", [("volta", "v100"), ("ampere", "a100"),
                                       ("hopper", "h100"), ("blackwell", "b200")])
def test_a_custom_gpu_takes_its_architectures_fractions(arch, ref) -> None:
    m = gpu_model(build_spec(f"{CUSTOM},arch={arch}"))
    base = GPU_MODELS[ref]
    assert m is not None and m.name == "custom"
    assert (m.matmul_efficiency, m.memory_efficiency, m.nccl_efficiency, m.sms) == \
        (base.matmul_efficiency, base.memory_efficiency, base.nccl_efficiency, base.sms)
    assert f"arch={arch}" in m.source
    own = gpu_model(build_spec(f"{CUSTOM},arch={arch},sms=100"))
    assert own is not None and own.sms == 100
    # unspecified: hopper, as the meta says
    assert gpu_model(build_spec(CUSTOM)).matmul_efficiency == GPU_MODELS["h100"].matmul_efficiency


def test_a_ring_inside_a_pcie_node_runs_at_pcie() -> None:
    t = build_spec("pcie-h100,nodes=2")
    m = gpu_model(t)
    s = 1e9
    ids = node_ids(t)
    bridged = group_collective_seconds(t, m, "allreduce", [0, 1], s, ids)
    assert bridged == pytest.approx(m.nccl_base_latency + 2 * m.nccl_nvlink_step +
                                    s / (m.nccl_efficiency * 300e9))
    four = group_collective_seconds(t, m, "allreduce", [0, 1, 2, 3], s, ids)
    assert four == pytest.approx(m.nccl_base_latency + 6 * m.nccl_nvlink_step +
                                 2 * 3 / 4 * s / (m.nccl_efficiency * 64e9))
    assert cluster_collective_seconds(t, "allreduce", 4, s) == pytest.approx(four)


def test_an_nvl72_rack_is_one_nvlink_ring() -> None:
    t = build_spec("gb200-nvl72,racks=2")
    m = gpu_model(t)
    s = 1e9
    rack = cluster_collective_seconds(t, "allgather", 72, s)
    assert rack == pytest.approx(m.nccl_base_latency + 71 * m.nccl_nvlink_step +
                                 71 / 72 * s / (m.nccl_efficiency * 900e9))
    both = cluster_collective_seconds(t, "allgather", 144, s)
    out = 1 / 2 * (s / 72) / (m.nccl_efficiency * 50e9)  # each GPU's 1/72 over its own NIC
    inside = 71 / 72 * s / (m.nccl_efficiency * 900e9)
    assert both == pytest.approx(m.nccl_base_latency + 142 * m.nccl_nvlink_step +
                                 m.nccl_net_step + max(out, inside))
    # a custom cluster is priced by the same rule
    c = build_spec(CUSTOM)
    assert cluster_collective_seconds(c, "allreduce", 16, s) is not None


@pytest.mark.parametrize("spec, parallel, micro", [
    ("gb200-nvl72,racks=2", ParallelConfig(tp=8, dp=18), 18),
    ("pcie-h100", ParallelConfig(tp=2, dp=4), 4),
    ("dgx-h100,gpu=h100-96gb", ParallelConfig(tp=8), 1),
    (CUSTOM + ",arch=blackwell", ParallelConfig(tp=8, dp=2), 2),
])
def test_an_llm_plan_simulates_on_the_new_clusters(spec, parallel, micro) -> None:
    g = gpt_graph(hidden=2048, layers=4, heads=16, seq=1024, batch=1)
    settings = ExecutionSettings(microbatch_size=micro, microbatches=1, precision="bf16")
    _, result = llm_plan(g, build_spec(spec), parallel, settings)
    assert 0 < result.iteration_seconds < 1
    assert 0 < max(result.peak_memory_bytes) < 2**34


def test_faster_gpus_train_faster_and_the_500_w_part_reads_slower_hbm() -> None:
    g = gpt_graph(hidden=2048, layers=4, heads=16, seq=1024, batch=1)
    settings = ExecutionSettings(microbatch_size=1, microbatches=1, precision="bf16")

    def seconds(spec: str) -> float:
        return llm_plan(g, build_spec(spec), ParallelConfig(tp=8), settings)[1]\
            .iteration_seconds

    h100, h200, b200 = seconds("dgx-h100"), seconds("dgx-h200"), seconds("dgx-b200")
    assert b200 < h200 <= h100
    # the same peaks and fraction as the 700 W part (assumed), 2.4 TB/s of HBM instead of 3.35
    assert seconds("dgx-h100,gpu=h100-96gb") > h100
