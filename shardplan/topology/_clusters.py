"""GPU cluster presets: NVIDIA DGX A100, DGX H100 and DGX-2 (V100) nodes joined by InfiniBand.

Each preset is the node as NVIDIA's datasheets describe it: its GPUs (a device preset of
:data:`~shardplan.topology.DEVICE_PRESETS`), the NVLink bandwidth each GPU has to every other
GPU of its node through NVSwitch, and the node's InfiniBand NICs. Every figure carries its
source (:attr:`ClusterPreset.sources`; the table in ``docs/hardware.md``).

The topology is two levels (nodes, then the GPUs of a node) of a
:class:`~shardplan.ir._pairs.LevelPairs` model: any pair's bandwidth and latency are computed
from the two device ids on demand, so ``dgx-a100,nodes=384`` (3,072 GPUs) builds in a second or
two and holds some 30 MB (its 3,072 device objects), not the 150 MB of dense matrices. Its one
level, ``box``, groups the GPUs of each node, so a planner tells intra-node from inter-node
pairs by it (as for :func:`~shardplan.topology.dgx1`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir._pairs import LevelPairs
from shardplan.ir.topology import Level, Topology
from shardplan.topology._devices import (
    DEVICE_PRESETS,
    check_bytes,
    check_count,
    check_device_count,
    check_nonnegative,
    check_positive,
    generator_meta,
    make_devices,
)

__all__ = ["CLUSTER_PRESETS", "ClusterPreset", "dgx2_v100", "dgx_a100", "dgx_cluster",
           "dgx_h100"]

#: NVLink latency between two GPUs of a node, seconds: the same 2 us as :func:`dgx1` and the
#: ``gpu`` tier of :func:`hierarchical` (ours, not a datasheet figure).
NVLINK_LATENCY = 2e-6
#: InfiniBand latency between GPUs of two nodes, seconds: the ``box`` tier of
#: :func:`hierarchical` (ours: a switch hop plus GPUDirect RDMA, a few microseconds).
IB_LATENCY = 5e-6


@dataclass(frozen=True, slots=True)
class ClusterPreset:
    """One GPU node model and its network, with the source of every figure.

    Attributes
    ----------
    name : str
        The topology kind (``"dgx-a100"``).
    device : str
        Key of :data:`~shardplan.topology.DEVICE_PRESETS` (memory and peak rates).
    gpus_per_node : int
    nvlink_bandwidth : float
        Bytes/s each GPU sends to the others of its node through NVSwitch, per direction
        (half the "per GPU" bidirectional figure NVIDIA quotes).
    nics_per_node : int
        InfiniBand NICs (ports) of a node for GPU traffic.
    nic_gbps : float
        Line rate of one NIC, Gb/s (per direction).
    sources : mapping of str to str
        Figure name -> datasheet or publication.
    """

    name: str
    device: str
    gpus_per_node: int
    nvlink_bandwidth: float
    nics_per_node: int
    nic_gbps: float
    sources: Mapping[str, str] = field(default_factory=dict)


#: The cluster presets by kind. Their device presets give memory, tensor-core, fp8, fp32 and
#: memory-bandwidth figures (with their own ``source``).
CLUSTER_PRESETS: dict[str, ClusterPreset] = {
    "dgx-a100": ClusterPreset(
        "dgx-a100", "a100", 8, 300e9, 8, 200.0, {
            "gpus_per_node": "NVIDIA DGX A100 datasheet: 8x NVIDIA A100 80GB Tensor Core GPUs",
            "nvlink_bandwidth": "NVIDIA A100 datasheet: NVLink 600 GB/s per GPU (third "
                                "generation, 12 links, both directions); DGX A100 datasheet: "
                                "6 NVSwitches, every GPU pair at full NVLink rate",
            "nics": "NVIDIA DGX A100 datasheet: 8x single-port ConnectX-6 VPI 200 Gb/s HDR "
                    "InfiniBand for the compute fabric (one per GPU)",
            "nic_gbps": "HDR InfiniBand 200 Gb/s (DGX A100 datasheet)",
        }),
    "dgx-h100": ClusterPreset(
        "dgx-h100", "h100", 8, 450e9, 8, 400.0, {
            "gpus_per_node": "NVIDIA DGX H100 datasheet: 8x NVIDIA H100 Tensor Core GPUs, "
                             "640 GB total GPU memory",
            "nvlink_bandwidth": "NVIDIA H100 datasheet (SXM): NVLink 900 GB/s per GPU (fourth "
                                "generation, 18 links, both directions); DGX H100: 4 NVSwitch "
                                "chips, 7.2 TB/s bidirectional GPU-to-GPU",
            "nics": "NVIDIA DGX H100 datasheet: 8x single-port ConnectX-7 400 Gb/s "
                    "InfiniBand/Ethernet (OSFP, one per GPU)",
            "nic_gbps": "NDR InfiniBand 400 Gb/s (DGX H100 datasheet)",
        }),
    "dgx2-v100": ClusterPreset(
        "dgx2-v100", "v100", 16, 150e9, 8, 100.0, {
            "gpus_per_node": "NVIDIA DGX-2 datasheet: 16x NVIDIA Tesla V100 32 GB, 512 GB "
                             "total GPU memory",
            "nvlink_bandwidth": "NVIDIA V100 datasheet (SXM2/SXM3): NVLink 300 GB/s per GPU "
                                "(second generation, 6 links, both directions); DGX-2: 12 "
                                "NVSwitches, 2.4 TB/s bisection, every GPU pair at full rate",
            "nics": "NVIDIA DGX-2 datasheet: 8x 100 Gb/s InfiniBand EDR / 100 GigE "
                    "(ConnectX-5) for the cluster network",
            "nic_gbps": "EDR InfiniBand 100 Gb/s (DGX-2 datasheet)",
        }),
}


def dgx_cluster(preset: str | ClusterPreset, nodes: int = 1, *,
                gpu_memory: float | str | None = None, nic_gbps: float | None = None,
                nics: int | None = None, nvlink_bandwidth: float | None = None,
                nvlink_latency: float = NVLINK_LATENCY, ib_latency: float = IB_LATENCY,
                flops: float | None = None, name: str | None = None,
                gpu: str | None = None) -> Topology:
    """``nodes`` GPU nodes of a :data:`CLUSTER_PRESETS` model joined by InfiniBand.

    Parameters
    ----------
    preset : str or ClusterPreset
        ``dgx-a100``, ``dgx-h100``, ``dgx2-v100`` (or a preset of one's own).
    nodes : int
        Nodes, >= 1.
    gpu_memory : float or str, optional
        Memory of every GPU: bytes, or a size with a unit (``"40GiB"``, the A100 40 GB).
    nic_gbps : float, optional
        Line rate of one NIC, Gb/s (the preset's: 200, 400, 100).
    nics : int, optional
        NICs per node for GPU traffic (the preset's: 8).
    nvlink_bandwidth : float, optional
        Bytes/s per direction between two GPUs of a node (the preset's: 300e9, 450e9,
        150e9).
    nvlink_latency, ib_latency : float
        Seconds inside a node and between nodes (defaults :data:`NVLINK_LATENCY`,
        :data:`IB_LATENCY`).
    flops : float, optional
        Peak FLOP/s of every GPU, overriding the device preset (and dropping its fp32,
        fp8 and memory-bandwidth figures, as :func:`make_devices` does).
    name : str, optional
        Default ``dgx-a100-x4`` (``dgx-a100`` for one node).
    gpu : str, optional
        The GPU of every node, a :data:`~shardplan.topology.DEVICE_PRESETS` key (the
        preset's: ``a100``, ``h100``, ``v100``): ``a100-40gb`` is the DGX A100 of 2020 (40 GB
        of HBM2 at 1,555 GB/s instead of 80 GB of HBM2e at 2,039 GB/s). Its memory, peaks and
        memory bandwidth replace the preset's; ``gpu_memory`` and ``flops`` still override.

    Returns
    -------
    Topology
        ``nodes * gpus_per_node`` devices named ``node0/gpu0`` (node-major), one level
        ``box`` (the GPUs of each node), no links; the matrices are a two-level pair model.
        Its ``generator`` meta records the figures used (``gpus_per_node``, ``nics``,
        ``nic_gbps``, ``nvlink_bandwidth``, ``inter_bandwidth``).

    Notes
    -----
    Inside a node every GPU pair gets the full per-GPU NVLink rate: NVSwitch is
    non-blocking, and a GPU's NVLink bandwidth is shared by its own transfers, which is the
    simulator's business (as for every pair model). Between nodes a GPU's pair bandwidth is
    its share of the node's NICs, ``nics * nic_gbps / 8 / gpus_per_node`` bytes/s: one NIC
    per GPU on DGX A100 and H100 (25 and 50 GB/s, GPUDirect RDMA on the GPU's own rail),
    half an EDR NIC per GPU on the DGX-2 (6.25 GB/s: 8 NICs for 16 GPUs, so when all GPUs
    of a node talk off-node at once, as data-parallel rings do, each gets half). The fabric
    between nodes is taken as non-blocking (the DGX SuperPOD's rail-optimised fat tree).
    O(nodes x gpus_per_node).
    """
    if isinstance(preset, ClusterPreset):
        p = preset
    else:
        if preset not in CLUSTER_PRESETS:
            raise ShardplanError(f"unknown cluster preset {preset!r} (choose from "
                                 f"{', '.join(CLUSTER_PRESETS)})")
        p = CLUSTER_PRESETS[preset]
    nn = check_count("nodes", nodes)
    g = p.gpus_per_node
    check_device_count(p.name, nn * g)
    mem = None if gpu_memory is None else check_bytes("gpu_memory", gpu_memory)
    rate = p.nic_gbps if nic_gbps is None else check_positive("nic_gbps", nic_gbps)
    count = p.nics_per_node if nics is None else check_count("nics", nics)
    nv = p.nvlink_bandwidth if nvlink_bandwidth is None else \
        check_positive("nvlink_bandwidth", nvlink_bandwidth)
    nv_lat = check_nonnegative("nvlink_latency", nvlink_latency)
    ib_lat = check_nonnegative("ib_latency", ib_latency)
    inter = count * rate * 1e9 / 8 / g
    model = LevelPairs((nn, g), (inter, nv), (ib_lat, nv_lat))
    names = [f"node{n}/gpu{i}" for n in range(nn) for i in range(g)]
    level = Level(name="box", groups=tuple(tuple(range(n * g, (n + 1) * g))
                                           for n in range(nn)))
    key = p.device if gpu is None else str(gpu).lower()
    if key not in DEVICE_PRESETS:
        raise ShardplanError(f"unknown gpu {gpu!r} (choose from {', '.join(DEVICE_PRESETS)})")
    device = DEVICE_PRESETS[key]
    meta: dict[str, Any] = generator_meta(
        p.name, nodes=nn, gpus_per_node=g, gpu=device.name, gpu_memory=mem if mem is not None
        else device.memory_bytes, nics=count, nic_gbps=rate, nvlink_bandwidth=nv,
        inter_bandwidth=inter, nvlink_latency=nv_lat, ib_latency=ib_lat)
    return Topology(
        name=name or (f"{p.name}-x{nn}" if nn > 1 else p.name),
        devices=make_devices(names, device, mem, flops),
        bandwidth=model.matrix("bandwidth"), latency=model.matrix("latency"),
        levels=(level,), meta=meta,
    )


def dgx_a100(nodes: int = 1, *, gpu_memory: float | str | None = None,
             nic_gbps: float | None = None, nics: int | None = None,
             nvlink_bandwidth: float | None = None, nvlink_latency: float = NVLINK_LATENCY,
             ib_latency: float = IB_LATENCY, flops: float | None = None,
             name: str | None = None, gpu: str | None = None) -> Topology:
    """DGX A100 nodes: 8 A100 SXM 80 GB, NVLink3 300 GB/s per direction, 8 x 200 Gb/s HDR.

    The arguments are those of :func:`dgx_cluster` (``gpu="a100-40gb"`` for the A100
    40 GB of 2020; ``nic_gbps=400`` for NDR NICs).

    Examples
    --------
    >>> t = dgx_a100(2)
    >>> t.num_devices, float(t.bandwidth[0, 1]), float(t.bandwidth[0, 8])
    (16, 300000000000.0, 25000000000.0)
    """
    return dgx_cluster("dgx-a100", nodes, gpu_memory=gpu_memory, nic_gbps=nic_gbps, nics=nics,
                       nvlink_bandwidth=nvlink_bandwidth, nvlink_latency=nvlink_latency,
                       ib_latency=ib_latency, flops=flops, name=name, gpu=gpu)


def dgx_h100(nodes: int = 1, *, gpu_memory: float | str | None = None,
             nic_gbps: float | None = None, nics: int | None = None,
             nvlink_bandwidth: float | None = None, nvlink_latency: float = NVLINK_LATENCY,
             ib_latency: float = IB_LATENCY, flops: float | None = None,
             name: str | None = None, gpu: str | None = None) -> Topology:
    """DGX H100 nodes: 8 H100 SXM 80 GB, NVLink4 450 GB/s per direction, 8 x 400 Gb/s NDR.

    The arguments are those of :func:`dgx_cluster`.
    """
    return dgx_cluster("dgx-h100", nodes, gpu_memory=gpu_memory, nic_gbps=nic_gbps, nics=nics,
                       nvlink_bandwidth=nvlink_bandwidth, nvlink_latency=nvlink_latency,
                       ib_latency=ib_latency, flops=flops, name=name, gpu=gpu)


def dgx2_v100(nodes: int = 1, *, gpu_memory: float | str | None = None,
              nic_gbps: float | None = None, nics: int | None = None,
              nvlink_bandwidth: float | None = None, nvlink_latency: float = NVLINK_LATENCY,
              ib_latency: float = IB_LATENCY, flops: float | None = None,
              name: str | None = None, gpu: str | None = None) -> Topology:
    """DGX-2 nodes: 16 V100 SXM3 32 GB through NVSwitch (NVLink2 150 GB/s per direction),
    8 x 100 Gb/s EDR InfiniBand.

    The arguments are those of :func:`dgx_cluster`.
    """
    return dgx_cluster("dgx2-v100", nodes, gpu_memory=gpu_memory, nic_gbps=nic_gbps,
                       nics=nics, nvlink_bandwidth=nvlink_bandwidth,
                       nvlink_latency=nvlink_latency, ib_latency=ib_latency, flops=flops,
                       name=name, gpu=gpu)
