"""The GPUs of issue 44 part 3: device presets typed from their datasheets, the cluster kinds
built on them (DGX H200 and B200, PCIe H100 servers, GB200 NVL72 racks) and custom GPUs."""

from __future__ import annotations

import json

import pytest

from shardplan.cli.topology import DEVICE_TYPES
from shardplan.errors import ShardplanError
from shardplan.ir import Topology
from shardplan.topology import DEVICE_PRESETS, build, build_spec, custom_cluster
from tests.helpers import run_cli

GIB = 2**30


# (memory, dense bf16, dense fp8, fp32, HBM bytes/s), typed from the sources in the docstrings
@pytest.mark.parametrize("key, memory, half, fp8, fp32, hbm", [
    ("h100", 80 * GIB, 989e12, 1979e12, 67e12, 3.35e12),        # H100 SXM datasheet, 700 W
    ("h100-96gb", 96 * GIB, 989e12, 1979e12, 67e12, 2.4e12),    # torchtitan's Grand Teton H100
    ("h100-pcie", 80 * GIB, 756e12, 1513e12, 51e12, 2.0e12),    # H100 datasheet, PCIe column
    ("h200", 141 * GIB, 989e12, 1979e12, 67e12, 4.8e12),        # H200 datasheet
    ("b200", 180 * GIB, 2250e12, 4500e12, 80e12, 8e12),         # DGX B200 datasheet / 8
    ("gb200", 186 * GIB, 2500e12, 5000e12, 80e12, 8e12),        # GB200 NVL72 datasheet / 72
])
def test_device_presets_are_the_datasheets(key, memory, half, fp8, fp32, hbm) -> None:
    p = DEVICE_PRESETS[key]
    assert (p.memory_bytes, p.flops, p.fp8_flops, p.fp32_flops, p.memory_bandwidth) == \
        (memory, half, fp8, fp32, hbm)
    assert len(p.source) > 80


def test_the_command_line_offers_every_device_preset() -> None:
    assert set(DEVICE_TYPES) == set(DEVICE_PRESETS)


# kind, options, GPUs per NVLink domain, GPU type, NVLink each way, NIC share per GPU
@pytest.mark.parametrize("spec, per_node, gpu, nvlink, nic", [
    ("dgx-h200,nodes=2", 8, "h200", 450e9, 50e9),
    ("dgx-b200,nodes=2", 8, "b200", 900e9, 50e9),
    ("dgx-h100,nodes=2,gpu=h100-96gb", 8, "h100-96gb", 450e9, 50e9),
    ("gb200-nvl72,racks=2", 72, "gb200", 900e9, 50e9),
])
def test_cluster_kinds(spec, per_node, gpu, nvlink, nic) -> None:
    t = build_spec(spec)
    assert t.num_devices == 2 * per_node
    assert {d.extra["type"] for d in t.devices} == {gpu}
    assert t.device_memory[0] == DEVICE_PRESETS[gpu].memory_bytes
    assert t.device_memory_bandwidth[0] == DEVICE_PRESETS[gpu].memory_bandwidth
    # every pair of a node (of a rack's NVLink domain) at NVLink's rate, across at the NICs'
    assert float(t.bandwidth[0, per_node - 1]) == float(t.bandwidth[1, 2]) == nvlink
    assert float(t.bandwidth[0, per_node]) == float(t.bandwidth[per_node - 1, 2 * per_node - 1]) \
        == nic
    (box,) = t.levels
    assert box.groups == (tuple(range(per_node)), tuple(range(per_node, 2 * per_node)))


def test_gb200_nvl72_is_one_nvlink_domain_per_rack() -> None:
    t = build_spec("gb200-nvl72,racks=2")
    opts = t.meta["generator"]["options"]
    assert opts["racks"] == 2 and "nodes" not in opts and opts["gpus_per_tray"] == 4
    assert opts["gpus_per_node"] == 72 and opts["nics"] == 72
    # trays are no boundary: GPU 0 (tray 0) and GPU 71 (tray 17) are NVLink neighbours
    assert float(t.latency[0, 71]) == float(t.latency[0, 1]) < float(t.latency[0, 72])
    assert build_spec("gb200-nvl72,racks=1,nic_gbps=800").bandwidth[0, 1] == 900e9
    assert float(build_spec("gb200-nvl72,racks=2,nic_gbps=800").bandwidth[0, 72]) == 100e9
    with pytest.raises(ShardplanError, match="does not take"):
        build_spec("gb200-nvl72,nodes=2")


def test_pcie_h100_bridges_pairs_and_uses_pcie_between_the_others() -> None:
    t = build_spec("pcie-h100,nodes=2")
    assert t.devices[0].extra["type"] == "h100-pcie" and t.device_flops[0] == 756e12
    for a, b in ((0, 1), (2, 3), (4, 5), (6, 7), (9, 8)):
        assert float(t.bandwidth[a, b]) == 300e9 and float(t.latency[a, b]) == 2e-6
    for a, b in ((1, 2), (0, 7), (3, 4), (10, 12)):
        assert float(t.bandwidth[a, b]) == 64e9 and float(t.latency[a, b]) == 1e-5
    assert float(t.bandwidth[0, 8]) == 4 * 400e9 / 8 / 8  # 4 NICs of 400 Gb/s for 8 GPUs
    assert t.meta["generator"]["options"]["nvlink_pairs"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    again = Topology.from_dict(json.loads(json.dumps(t.to_dict(dense=False))))
    assert float(again.bandwidth[1, 2]) == 64e9 and float(again.bandwidth[1, 0]) == 300e9


# ----------------------------------------------------------------------------- custom GPU
FIGURES = {"flops": 1.3e15, "fp8_flops": 2.6e15, "fp32_flops": 1.634e14,
           "memory_bandwidth": 5.3e12, "gpu_memory": "192GB"}
NODE = {"gpus_per_node": 8, "nvlink_bandwidth": 448e9, "nic_gbps": 400}


def _spec(**options) -> str:
    return ",".join(["custom"] + [f"{k}={v}" for k, v in options.items()])


def test_custom_gpu_from_the_command_line_form() -> None:
    t = build_spec(_spec(nodes=2, **FIGURES, **NODE))
    d = t.devices[0]
    assert t.num_devices == 16 and d.extra["type"] == "custom"
    assert (d.flops, d.memory_bytes) == (1.3e15, 192e9)
    assert (t.device_fp8_flops[0], t.device_fp32_flops[0], t.device_memory_bandwidth[0]) == \
        (2.6e15, 1.634e14, 5.3e12)
    assert float(t.bandwidth[0, 7]) == 448e9 and float(t.bandwidth[0, 8]) == 50e9
    gen = t.meta["generator"]
    assert gen["kind"] == "custom" and gen["options"]["nics"] == 8  # one NIC per GPU
    # what was assumed is recorded, for a report to say
    assert {k: gen["custom_gpu"][k] for k in ("arch", "arch_given", "kernel_fractions_of",
                                               "sms", "sms_given")} == \
        {"arch": "hopper", "arch_given": False, "kernel_fractions_of": "h100", "sms": 132,
         "sms_given": False}
    given = build_spec(_spec(**FIGURES, **NODE, arch="blackwell", sms=160, nics=4))
    assert given.meta["generator"]["custom_gpu"]["kernel_fractions_of"] == "b200"
    assert given.devices[0].extra["sms"] == 160 and given.devices[0].extra["arch"] == "blackwell"
    assert float(given.bandwidth[0, 1]) == 448e9
    without_fp8 = build_spec(_spec(**{k: v for k, v in FIGURES.items() if k != "fp8_flops"},
                                   **NODE))
    assert without_fp8.device_fp8_flops[0] == 0.0


def test_custom_gpu_from_a_file(tmp_path) -> None:
    f = tmp_path / "gpu.json"
    f.write_text(json.dumps({"name": "mine", **FIGURES, "arch": "ampere", **NODE}))
    t = build_spec(f"custom,nodes=3,gpu=@{f}")
    assert t.num_devices == 24
    assert t.meta["generator"]["custom_gpu"]["name"] == "mine"
    assert t.meta["generator"]["custom_gpu"]["kernel_fractions_of"] == "a100"
    assert t.meta["generator"]["options"]["gpu"] == f"@{f}"
    # the same figures given as options build the same topology, but for the meta's record
    same = custom_cluster(3, gpu_name="mine", arch="ampere", **FIGURES, **NODE)
    assert same.devices == t.devices
    # a GPU file on a preset kind replaces its GPU, the node stays the preset's
    g = tmp_path / "chip.json"
    g.write_text(json.dumps({**FIGURES, "arch": "blackwell"}))
    d = build_spec(f"dgx-b200,nodes=2,gpu=@{g}")
    assert d.devices[0].extra["type"] == "custom" and d.device_flops[0] == 1.3e15
    assert float(d.bandwidth[0, 1]) == 900e9 and float(d.bandwidth[0, 8]) == 50e9
    assert d.meta["generator"]["custom_gpu"]["sms"] == 148
    # flops / gpu_memory may come from the options when the file leaves them out
    h = tmp_path / "part.json"
    h.write_text(json.dumps({k: v for k, v in FIGURES.items() if k != "flops"}))
    assert build_spec(f"dgx-h100,gpu=@{h},flops=1e15").device_flops[0] == 1e15


@pytest.mark.parametrize("text, match", [
    ("arch=tpu", "arch 'tpu' is not one of volta, ampere, hopper, blackwell"),
    ("flops=inf", "flops must be a positive number"),
    ("flops=-1e15", "flops must be a positive number"),
    ("flops=1e18", "above the 1e.17"),
    ("memory_bandwidth=5.3e15", "above"),
    ("gpu_memory=lots", "gpu_memory must be bytes"),
    ("sms=1.5", "sms must be an integer"),
    ("nvlink_bandwidth=0", "nvlink_bandwidth must be a positive number"),
    ("nics=0", "nics must be an integer"),
    ("gpus_per_node=5000", "above"),
])
def test_bad_custom_figures_are_one_line_errors(text, match) -> None:
    key = text.partition("=")[0]
    spec = _spec(**{k: v for k, v in {**FIGURES, **NODE}.items() if k != key}) + "," + text
    with pytest.raises(ShardplanError, match=match) as err:
        build_spec(spec)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("content, spec, match", [
    (None, "custom,gpu=@{f}", "cannot read GPU file"),
    ("{not json", "custom,gpu=@{f}", "is not JSON"),
    ("[1, 2]", "custom,gpu=@{f}", "must hold a JSON object"),
    (json.dumps({**FIGURES, **NODE, "flops": 1e15}), "custom,gpu=@{f},flops=1e15",
     "given both in GPU file"),
    (json.dumps({**FIGURES, **NODE, "clock": 2}), "custom,gpu=@{f}", "does not take clock"),
    (json.dumps({**FIGURES, **NODE, "flops": None}), "custom,gpu=@{f}", "needs flops"),
    (json.dumps({**FIGURES, "nvlink_bandwidth": 1e11}), "custom,gpu=@{f}",
     "needs gpus_per_node, nic_gbps"),
    (json.dumps({**FIGURES, **NODE}), "dgx-h100,gpu=@{f}", "does not take gpus_per_node"),
    (json.dumps(FIGURES), "custom,gpu=h100", "custom takes gpu=@FILE.json"),
    (json.dumps(FIGURES), "custom,gpu=@", "needs a file name"),
    (json.dumps({**FIGURES, **NODE, "fp32_flops": "NaN"}), "custom,gpu=@{f}",
     "fp32_flops must be a positive number"),
])
def test_bad_gpu_files_are_one_line_errors(content, spec, match, tmp_path) -> None:
    f = tmp_path / "gpu.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(ShardplanError, match=match) as err:
        build_spec(spec.format(f=f))
    assert "\n" not in str(err.value)


def test_custom_on_the_command_line(tmp_path, capsys) -> None:
    out = tmp_path / "t.json"
    assert run_cli(["topology", _spec(nodes=2, **FIGURES, **NODE), "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["devices"]) == 16 and data["devices"][0]["arch"] == "hopper"
    assert data["generator"]["custom_gpu"]["kernel_fractions_of"] == "h100"
    capsys.readouterr()
    assert run_cli(["topology", _spec(**{**FIGURES, "flops": "1e30"}, **NODE), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shardplan: error: ") and "\n" not in err and "Traceback" not in err
    assert run_cli(["topology", "gb200-nvl72,racks=2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["devices"]) == 144
    assert build("custom", **FIGURES, **NODE).num_devices == 8
