"""GPU cluster presets: the datasheet figures, overrides, levels, sources, and scale."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.ir import Topology
from shardplan.topology import (
    CLUSTER_PRESETS,
    build,
    build_spec,
    dgx2_v100,
    dgx_a100,
    dgx_h100,
    parse_spec,
)
from shardplan.topology._devices import check_bytes

GIB = 2**30


@pytest.mark.parametrize("builder, gpus, nvlink, nic, mem, half, fp8", [
    (dgx_a100, 8, 300e9, 25e9, 80 * GIB, 312e12, 0.0),
    (dgx_h100, 8, 450e9, 50e9, 80 * GIB, 989e12, 1979e12),
    (dgx2_v100, 16, 150e9, 6.25e9, 32 * GIB, 125e12, 0.0),
])
def test_presets_give_the_datasheet_figures(builder, gpus, nvlink, nic, mem, half, fp8) -> None:
    t = builder(3)
    assert t.num_devices == 3 * gpus
    assert float(t.bandwidth[0, gpus - 1]) == nvlink  # same node: NVLink through NVSwitch
    assert float(t.bandwidth[gpus - 1, gpus]) == nic  # next node: its share of the NICs
    assert float(t.latency[0, 1]) < float(t.latency[0, gpus])
    assert t.device_memory[0] == mem and t.device_flops[0] == half
    assert t.device_fp8_flops[0] == fp8
    assert t.device_fp32_flops[0] < half and np.isfinite(t.device_memory_bandwidth[0])
    # the level tells intra-node from inter-node
    (box,) = t.levels
    assert box.name == "box" and box.groups[1] == tuple(range(gpus, 2 * gpus))
    assert t.devices[gpus].name == "node1/gpu0"


def test_every_preset_records_the_source_of_every_figure() -> None:
    for p in CLUSTER_PRESETS.values():
        pcie = {"pcie_bandwidth"} if p.nvlink_pairs else set()
        assert set(p.sources) == {"gpus_per_node", "nvlink_bandwidth", "nics", "nic_gbps"} | pcie
        assert all(len(v) > 20 for v in p.sources.values())


def test_overrides_and_the_comma_spec() -> None:
    t = build_spec("dgx-a100,nodes=2,gpu_memory=40GiB,nic_gbps=400")
    assert t.device_memory[0] == 40 * GIB
    assert float(t.bandwidth[0, 8]) == 50e9
    assert t.meta["generator"]["options"]["nic_gbps"] == 400
    assert build("dgx2-v100", nodes=2, nics=16).bandwidth[0, 16] == 12.5e9
    assert parse_spec("dgx-h100") == ("dgx-h100", {})
    assert check_bytes("m", "80 GB") == 80e9 and check_bytes("m", 1e9) == 1e9
    # flops replaces the preset's peaks, and with them its fp32, fp8 and bandwidth figures
    f = dgx_h100(1, flops=1e15)
    assert f.device_flops[0] == 1e15 and f.device_fp8_flops[0] == 0.0


@pytest.mark.parametrize("spec, match", [
    ("dgx-a100,nodes=0", "nodes"), ("dgx-a100,gpu_memory=lots", "gpu_memory"),
    ("dgx-a100,nic_gbps=-1", "nic_gbps"), ("dgx-a100,boxes=2", "does not take"),
    ("dgx-a100,nodes", "KEY=VALUE"), ("dgx-a100,nodes=1,nodes=2", "twice"),
    ("dgx-b300,nodes=2", "unknown topology kind"),
])
def test_bad_specs_are_one_line_errors(spec: str, match: str) -> None:
    with pytest.raises(ShardplanError, match=match) as err:
        build_spec(spec)
    assert "\n" not in str(err.value)


def test_3072_gpus_build_fast_and_small() -> None:
    tracemalloc.start()
    t0 = time.perf_counter()
    t = dgx_a100(384)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert t.num_devices == 3072 and len(t.levels[0].groups) == 384
    assert seconds < 10 and peak < 64 * 2**20  # dense matrices alone would be 150 MB
    assert float(t.bandwidth[0, 3071]) == 25e9 and float(t.bandwidth[3064, 3071]) == 300e9
    assert t.pair_model is not None
    d = t.to_dict(dense=False)
    assert "pairs" in d and Topology.from_dict(d).num_devices == 3072
