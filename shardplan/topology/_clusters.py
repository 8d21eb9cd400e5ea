"""GPU cluster presets: NVIDIA DGX A100, H100, H200, B200 and DGX-2 (V100) nodes, PCIe H100
servers and GB200 NVL72 racks, joined by InfiniBand; and clusters of a custom GPU.

Each preset is the node as NVIDIA's datasheets describe it: its GPUs (a device preset of
:data:`~shardplan.topology.DEVICE_PRESETS`), the NVLink bandwidth each GPU has to every other
GPU of its node through NVSwitch, and the node's InfiniBand NICs. Every figure carries its
source (:attr:`ClusterPreset.sources`; the table in ``docs/hardware.md``).

The topology is two levels (nodes, then the GPUs of a node) of a
:class:`~shardplan.ir._pairs.LevelPairs` model: any pair's bandwidth and latency are computed
from the two device ids on demand, so ``dgx-a100,nodes=384`` (3,072 GPUs) builds in a second or
two and holds some 30 MB (its 3,072 device objects), not the 150 MB of dense matrices. Its one
level, ``box``, groups the GPUs of each node, so a planner tells intra-node from inter-node
pairs by it (as for :func:`~shardplan.topology.dgx1`). A GB200 NVL72 rack is one such node
of 72 GPUs: its NVLink domain (:func:`gb200_nvl72`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir._pairs import LevelPairs
from shardplan.ir.topology import Level, Topology
from shardplan.topology._custom import custom_gpu, merge_file
from shardplan.topology._devices import (
    DEVICE_PRESETS,
    DevicePreset,
    check_bytes,
    check_count,
    check_device_count,
    check_nonnegative,
    check_positive,
    generator_meta,
    make_devices,
)

__all__ = ["CLUSTER_KINDS", "CLUSTER_PRESETS", "ClusterPreset", "custom_cluster", "dgx2_v100",
           "dgx_a100", "dgx_b200", "dgx_cluster", "dgx_h100", "dgx_h200", "gb200_nvl72",
           "pcie_h100"]

#: NVLink latency between two GPUs of a node, seconds: the same 2 us as :func:`dgx1` and the
#: ``gpu`` tier of :func:`hierarchical` (ours, not a datasheet figure).
NVLINK_LATENCY = 2e-6
#: InfiniBand latency between GPUs of two nodes, seconds: the ``box`` tier of
#: :func:`hierarchical` (ours: a switch hop plus GPUDirect RDMA, a few microseconds).
IB_LATENCY = 5e-6
#: PCIe latency between two GPUs of a node without an NVLink bridge, seconds: the PCIe pairs
#: of :func:`dgx1` (ours).
PCIE_LATENCY = 1e-5


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
    nvlink_pairs : tuple of (int, int)
        GPUs (local indices) joined by an NVLink bridge, when NVLink does not join every
        pair (PCIe cards): those pairs get ``nvlink_bandwidth``, the others
        ``pcie_bandwidth``. Empty: NVSwitch joins every pair.
    pcie_bandwidth : float
        Bytes/s per direction between GPUs of a node without a bridge.
    """

    name: str
    device: str
    gpus_per_node: int
    nvlink_bandwidth: float
    nics_per_node: int
    nic_gbps: float
    sources: Mapping[str, str] = field(default_factory=dict)
    nvlink_pairs: tuple[tuple[int, int], ...] = ()
    pcie_bandwidth: float = 0.0


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
    "dgx-h200": ClusterPreset(
        "dgx-h200", "h200", 8, 450e9, 8, 400.0, {
            "gpus_per_node": "NVIDIA DGX H200 datasheet: 8x NVIDIA H200 Tensor Core GPUs, "
                             "1,128 GB total GPU memory",
            "nvlink_bandwidth": "NVIDIA H200 datasheet (SXM): NVLink 900 GB/s per GPU (both "
                                "directions); DGX H200: 4 NVSwitch chips, every GPU pair at "
                                "full rate",
            "nics": "NVIDIA DGX BasePOD reference architecture (DGX H200 and H100): four OSFP "
                    "ports serving eight single-port ConnectX-7 VPI for the compute fabric",
            "nic_gbps": "ConnectX-7 up to 400 Gb/s InfiniBand/Ethernet (DGX H200 datasheet)",
        }),
    "dgx-b200": ClusterPreset(
        "dgx-b200", "b200", 8, 900e9, 8, 400.0, {
            "gpus_per_node": "NVIDIA DGX B200 datasheet: 8x NVIDIA Blackwell GPUs, 1,440 GB "
                             "total GPU memory",
            "nvlink_bandwidth": "NVIDIA DGX B200 datasheet: fifth-generation NVLink, 2 "
                                "NVSwitch chips, 14.4 TB/s aggregate: 1.8 TB/s per GPU both "
                                "directions, every GPU pair at full rate",
            "nics": "NVIDIA DGX B200 datasheet / DGX BasePOD reference architecture: 4x OSFP "
                    "ports serving 8x single-port ConnectX-7 VPI for the compute fabric",
            "nic_gbps": "ConnectX-7 up to 400 Gb/s InfiniBand/Ethernet (DGX B200 datasheet)",
        }),
    "pcie-h100": ClusterPreset(
        "pcie-h100", "h100-pcie", 8, 300e9, 4, 400.0, {
            "gpus_per_node": "ours: an 8-GPU PCIe server as NVIDIA's Enterprise Reference "
                             "Architecture's 'PCIe Optimized 2-8-5' configuration (2 CPUs, "
                             "8 GPUs, 5 network adapters; GPUs balanced across sockets), "
                             "with H100 PCIe cards",
            "nvlink_bandwidth": "NVIDIA H100 datasheet (PCIe): NVLink bridge 600 GB/s both "
                                "directions, joining two cards: pairs (0,1) (2,3) (4,5) (6,7)",
            "pcie_bandwidth": "NVIDIA H100 datasheet (PCIe): PCIe Gen5 128 GB/s (x16, both "
                              "directions): 64 GB/s each way between unbridged GPUs, the "
                              "theoretical rate (peer-to-peer through a PCIe switch or the "
                              "CPUs achieves less; not modelled)",
            "nics": "NVIDIA Enterprise Reference Architecture, PCIe Optimized 2-8-5-200: 4 of "
                    "the 5 adapters carry east-west (GPU) traffic, 200 Gb/s per GPU",
            "nic_gbps": "ConnectX-7 / BlueField-3 SuperNIC 400 Gb/s (the same reference "
                        "architecture)",
        }, nvlink_pairs=((0, 1), (2, 3), (4, 5), (6, 7)), pcie_bandwidth=64e9),
    "gb200-nvl72": ClusterPreset(
        "gb200-nvl72", "gb200", 72, 900e9, 72, 400.0, {
            "gpus_per_node": "NVIDIA DGX GB200 user guide: a 72-GPU NVLink domain per rack, "
                             "18 compute trays of 2 Grace CPUs and 4 Blackwell GPUs, 9 NVLink "
                             "switch trays",
            "nvlink_bandwidth": "NVIDIA GB200 NVL72 datasheet: fifth-generation NVLink, 1.8 "
                                "TB/s per GPU both directions, 130 TB/s per rack, every GPU "
                                "pair of the rack at full rate",
            "nics": "NVIDIA DGX GB200 user guide: each compute tray has 4x ConnectX-7 "
                    "single-port 400G OSFP for the cluster network: one per GPU",
            "nic_gbps": "ConnectX-7 400 Gb/s InfiniBand (DGX GB200 user guide; GB300 NVL72 "
                        "racks use ConnectX-8 at 800 Gb/s: nic_gbps=800)",
        }),
}

#: Topology kinds whose collectives follow NCCL's rule (:func:`~shardplan.cost._gpu.
#: cluster_collective_seconds`): the presets and ``custom``.
CLUSTER_KINDS = frozenset(CLUSTER_PRESETS) | {"custom"}


def dgx_cluster(preset: str | ClusterPreset, nodes: int = 1, *,
                gpu_memory: float | str | None = None, nic_gbps: float | None = None,
                nics: int | None = None, nvlink_bandwidth: float | None = None,
                nvlink_latency: float = NVLINK_LATENCY, ib_latency: float = IB_LATENCY,
                flops: float | None = None, name: str | None = None,
                gpu: str | DevicePreset | None = None) -> Topology:
    """``nodes`` GPU nodes of a :data:`CLUSTER_PRESETS` model joined by InfiniBand.

    Parameters
    ----------
    preset : str or ClusterPreset
        A key of :data:`CLUSTER_PRESETS` (``dgx-a100``, ``dgx-h100``, ``dgx-h200``,
        ``dgx-b200``, ``pcie-h100``, ``gb200-nvl72``, ``dgx2-v100``) or a preset of one's
        own.
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
    gpu : str or DevicePreset, optional
        The GPU of every node, a :data:`~shardplan.topology.DEVICE_PRESETS` key (the
        preset's: ``a100``, ``h100``, ``v100``): ``a100-40gb`` is the DGX A100 of 2020 (40 GB
        of HBM2 at 1,555 GB/s instead of 80 GB of HBM2e at 2,039 GB/s). Its memory, peaks and
        memory bandwidth replace the preset's; ``gpu_memory`` and ``flops`` still override.
        ``h100-96gb`` on ``dgx-h100`` is the 500 W H100 with 96 GB of HBM2e of torchtitan's
        benchmarks. ``@FILE.json``: a GPU of one's own (:mod:`~shardplan.topology._custom`:
        ``flops``, ``fp32_flops``, ``memory_bandwidth``, ``gpu_memory``, optional
        ``fp8_flops``, ``sms``, ``arch``, ``name``; ``flops`` and ``gpu_memory`` may be given
        as options instead); the generator meta records it under ``custom_gpu``, with the
        architecture whose fractions it takes.

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
    A preset with ``nvlink_pairs`` (PCIe cards with NVLink bridges) gives the bridged pairs
    the NVLink rate and the others ``pcie_bandwidth`` at :data:`PCIE_LATENCY`.
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
    gpu_meta: dict[str, Any] | None = None
    if isinstance(gpu, DevicePreset):
        device: DevicePreset = gpu
    elif isinstance(gpu, str) and gpu.startswith("@"):  # a custom GPU from a JSON file
        merged = merge_file({"flops": flops, "gpu_memory": gpu_memory}, gpu)
        custom, _, arch_given = custom_gpu(merged, node_keys=False,
                                           where=f"{p.name} gpu={gpu}")
        device = custom.preset()
        gpu_meta = custom.meta(arch_given=arch_given)
        gpu_memory = flops = None
    else:
        key = p.device if gpu is None else str(gpu).lower()
        if key not in DEVICE_PRESETS:
            raise ShardplanError(f"unknown gpu {gpu!r} (choose from "
                                 f"{', '.join(DEVICE_PRESETS)}, or @FILE.json for a GPU of "
                                 f"your own)")
        device = DEVICE_PRESETS[key]
    mem = None if gpu_memory is None else check_bytes("gpu_memory", gpu_memory)
    rate = p.nic_gbps if nic_gbps is None else check_positive("nic_gbps", nic_gbps)
    count = p.nics_per_node if nics is None else check_count("nics", nics)
    nv = p.nvlink_bandwidth if nvlink_bandwidth is None else \
        check_positive("nvlink_bandwidth", nvlink_bandwidth)
    nv_lat = check_nonnegative("nvlink_latency", nvlink_latency)
    ib_lat = check_nonnegative("ib_latency", ib_latency)
    inter = count * rate * 1e9 / 8 / g
    intra: float | np.ndarray = nv
    intra_lat: float | np.ndarray = nv_lat
    if p.nvlink_pairs:  # NVLink bridges join some pairs, PCIe the others
        bridged = np.zeros((g, g), dtype=bool)
        for a, b in p.nvlink_pairs:
            bridged[a, b] = bridged[b, a] = True
        intra = np.where(bridged, nv, p.pcie_bandwidth)
        intra_lat = np.where(bridged, nv_lat, PCIE_LATENCY)
        np.fill_diagonal(intra, 0.0)
        np.fill_diagonal(intra_lat, 0.0)
    model = LevelPairs((nn, g), (inter, intra), (ib_lat, intra_lat))
    names = [f"node{n}/gpu{i}" for n in range(nn) for i in range(g)]
    level = Level(name="box", groups=tuple(tuple(range(n * g, (n + 1) * g))
                                           for n in range(nn)))
    figures: dict[str, Any] = dict(
        nodes=nn, gpus_per_node=g, gpu=device.name if gpu_meta is None else gpu,
        gpu_memory=mem if mem is not None else device.memory_bytes, nics=count, nic_gbps=rate,
        nvlink_bandwidth=nv, inter_bandwidth=inter, nvlink_latency=nv_lat, ib_latency=ib_lat)
    if p.nvlink_pairs:
        figures.update(nvlink_pairs=[list(x) for x in p.nvlink_pairs],
                       pcie_bandwidth=p.pcie_bandwidth, pcie_latency=PCIE_LATENCY)
    meta: dict[str, Any] = generator_meta(p.name, **figures)
    if gpu_meta is not None:
        meta["generator"]["custom_gpu"] = gpu_meta
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


def dgx_h200(nodes: int = 1, *, gpu_memory: float | str | None = None,
             nic_gbps: float | None = None, nics: int | None = None,
             nvlink_bandwidth: float | None = None, nvlink_latency: float = NVLINK_LATENCY,
             ib_latency: float = IB_LATENCY, flops: float | None = None,
             name: str | None = None, gpu: str | None = None) -> Topology:
    """DGX H200 nodes: 8 H200 SXM 141 GB, NVLink4 450 GB/s per direction, 8 x 400 Gb/s.

    The arguments are those of :func:`dgx_cluster`.
    """
    return dgx_cluster("dgx-h200", nodes, gpu_memory=gpu_memory, nic_gbps=nic_gbps, nics=nics,
                       nvlink_bandwidth=nvlink_bandwidth, nvlink_latency=nvlink_latency,
                       ib_latency=ib_latency, flops=flops, name=name, gpu=gpu)


def dgx_b200(nodes: int = 1, *, gpu_memory: float | str | None = None,
             nic_gbps: float | None = None, nics: int | None = None,
             nvlink_bandwidth: float | None = None, nvlink_latency: float = NVLINK_LATENCY,
             ib_latency: float = IB_LATENCY, flops: float | None = None,
             name: str | None = None, gpu: str | None = None) -> Topology:
    """DGX B200 nodes: 8 B200 180 GB, NVLink5 900 GB/s per direction, 8 x 400 Gb/s
    ConnectX-7.

    The arguments are those of :func:`dgx_cluster`.

    Examples
    --------
    >>> t = dgx_b200(2)
    >>> float(t.bandwidth[0, 7]), float(t.bandwidth[0, 8])
    (900000000000.0, 50000000000.0)
    """
    return dgx_cluster("dgx-b200", nodes, gpu_memory=gpu_memory, nic_gbps=nic_gbps, nics=nics,
                       nvlink_bandwidth=nvlink_bandwidth, nvlink_latency=nvlink_latency,
                       ib_latency=ib_latency, flops=flops, name=name, gpu=gpu)


def pcie_h100(nodes: int = 1, *, gpu_memory: float | str | None = None,
              nic_gbps: float | None = None, nics: int | None = None,
              nvlink_bandwidth: float | None = None, nvlink_latency: float = NVLINK_LATENCY,
              ib_latency: float = IB_LATENCY, flops: float | None = None,
              name: str | None = None, gpu: str | None = None) -> Topology:
    """Servers of 8 H100 PCIe cards, NVLink bridges joining pairs (0,1) (2,3) (4,5) (6,7)
    at 300 GB/s per direction, PCIe Gen5 x16 (64 GB/s per direction) between the others,
    4 x 400 Gb/s NICs for GPU traffic (NVIDIA's PCIe Optimized 2-8-5-200 configuration).

    The node is ours, not a vendor product; ``nvlink_bandwidth`` is the bridges' rate. The
    other arguments are those of :func:`dgx_cluster`.

    Examples
    --------
    >>> t = pcie_h100(2)
    >>> [float(t.bandwidth[0, j]) for j in (1, 2, 8)]
    [300000000000.0, 64000000000.0, 25000000000.0]
    """
    return dgx_cluster("pcie-h100", nodes, gpu_memory=gpu_memory, nic_gbps=nic_gbps,
                       nics=nics, nvlink_bandwidth=nvlink_bandwidth,
                       nvlink_latency=nvlink_latency, ib_latency=ib_latency, flops=flops,
                       name=name, gpu=gpu)


def gb200_nvl72(racks: int = 1, *, gpu_memory: float | str | None = None,
                nic_gbps: float | None = None, nics: int | None = None,
                nvlink_bandwidth: float | None = None, nvlink_latency: float = NVLINK_LATENCY,
                ib_latency: float = IB_LATENCY, flops: float | None = None,
                name: str | None = None, gpu: str | None = None) -> Topology:
    """GB200 NVL72 racks: 72 Blackwell GPUs (186 GB, 1,200 W) in one NVLink domain (NVLink5
    through NVLink switch trays, 900 GB/s per direction between any two GPUs of a rack), one
    400 Gb/s ConnectX-7 per GPU between racks.

    Parameters
    ----------
    racks : int
        NVL72 racks, >= 1 (72 GPUs each).
    nics : int, optional
        NICs per rack for GPU traffic (default 72: 4 per compute tray).
    nic_gbps : float, optional
        Gb/s per NIC (default 400; 800 for ConnectX-8).

    The other arguments are those of :func:`dgx_cluster`.

    Returns
    -------
    Topology
        ``72 * racks`` devices named ``node{r}/gpu{i}`` (``r`` the rack); the level ``box``
        groups the GPUs of each rack (its NVLink domain, what the cost model takes as a
        node). The 18 compute trays of 4 GPUs are not a level: NVLink joins every pair of
        the rack at the same rate, whichever tray each is in (the meta records
        ``gpus_per_tray``).

    Examples
    --------
    >>> t = gb200_nvl72(2)
    >>> t.num_devices, float(t.bandwidth[0, 71]), float(t.bandwidth[0, 72])
    (144, 900000000000.0, 50000000000.0)
    """
    if isinstance(racks, bool) or not isinstance(racks, int) or racks < 1:
        raise ShardplanError(f"racks must be an integer >= 1, got {racks!r}")
    t = dgx_cluster("gb200-nvl72", racks, gpu_memory=gpu_memory, nic_gbps=nic_gbps, nics=nics,
                    nvlink_bandwidth=nvlink_bandwidth, nvlink_latency=nvlink_latency,
                    ib_latency=ib_latency, flops=flops, name=name, gpu=gpu)
    gen = dict(t.meta["generator"])
    opts = {("racks" if k == "nodes" else k): v for k, v in gen["options"].items()}
    opts["gpus_per_tray"] = 4
    gen["options"] = opts
    return t.replace(meta={**t.meta, "generator": gen})


def custom_cluster(nodes: int = 1, *, gpu: str | None = None, gpus_per_node: int | None = None,
                   flops: float | None = None, fp8_flops: float | None = None,
                   fp32_flops: float | None = None, memory_bandwidth: float | None = None,
                   gpu_memory: float | str | None = None, sms: int | None = None,
                   arch: str | None = None, nvlink_bandwidth: float | None = None,
                   nic_gbps: float | None = None, nics: int | None = None,
                   nvlink_latency: float = NVLINK_LATENCY, ib_latency: float = IB_LATENCY,
                   name: str | None = None, gpu_name: str | None = None) -> Topology:
    """``nodes`` nodes of a GPU no preset describes, joined by InfiniBand.

    Parameters
    ----------
    nodes : int
        Nodes, >= 1.
    gpu : str, optional
        ``@FILE.json``: a JSON object holding any of the other figures below (by the same
        names; ``name`` for ``gpu_name``). A figure in the file and among the options is an
        error.
    gpus_per_node : int
        GPUs of a node, all joined by NVLink (its NVLink domain: 8 for an HGX board, 72 for
        an NVL72 rack). Required.
    flops, fp32_flops : float
        Peak dense bf16/fp16 tensor-core and fp32 FLOP/s of one GPU. Required.
    fp8_flops : float, optional
        Peak dense fp8 FLOP/s; none: the GPU has no fp8 (plans in fp8 are refused).
    memory_bandwidth : float
        HBM bytes/s. Required.
    gpu_memory : float or str
        HBM size: bytes or with a unit (``"192GB"``, ``"141GiB"``). Required.
    sms : int, optional
        Streaming multiprocessors (the wave model of matrix products); default the
        reference GPU's of ``arch``.
    arch : str, optional
        ``volta``, ``ampere``, ``hopper`` (default) or ``blackwell``: the architecture whose
        measured kernel and NCCL fractions the GPU takes (``docs/gpu-model.md``).
    nvlink_bandwidth : float
        Bytes/s per direction between two GPUs of a node (half NVIDIA's "per GPU"
        bidirectional figure). Required.
    nic_gbps : float
        Line rate of one NIC, Gb/s. Required.
    nics : int, optional
        NICs per node for GPU traffic (default one per GPU).
    nvlink_latency, ib_latency, name
        As in :func:`dgx_cluster`.
    gpu_name : str, optional
        A label for the GPU.

    Returns
    -------
    Topology
        As :func:`dgx_cluster`; devices of type ``custom`` carrying ``arch`` and ``sms``;
        the generator meta's ``custom_gpu`` records the figures and what was assumed
        (``arch_given``, ``kernel_fractions_of``, ``sms_given``).

    Raises
    ------
    ShardplanError
        A missing or unknown figure, one that is not a finite positive number or is above
        its ceiling (:data:`~shardplan.topology._custom._CEILINGS`), an unknown ``arch``, an
        unreadable file.

    Examples
    --------
    >>> t = custom_cluster(2, gpus_per_node=4, flops=1e15, fp32_flops=5e13,
    ...                    memory_bandwidth=4e12, gpu_memory="128GiB", nvlink_bandwidth=4e11,
    ...                    nic_gbps=400)
    >>> t.num_devices, t.meta["generator"]["custom_gpu"]["kernel_fractions_of"]
    (8, 'h100')
    """
    given: dict[str, Any] = {
        "gpus_per_node": gpus_per_node, "flops": flops, "fp8_flops": fp8_flops,
        "fp32_flops": fp32_flops, "memory_bandwidth": memory_bandwidth,
        "gpu_memory": gpu_memory, "sms": sms, "arch": arch,
        "nvlink_bandwidth": nvlink_bandwidth, "nic_gbps": nic_gbps, "nics": nics,
        "name": gpu_name}
    if gpu is not None:
        if not str(gpu).startswith("@"):
            raise ShardplanError(f"custom takes gpu=@FILE.json (a GPU of your own), got "
                                 f"gpu={gpu}; for a preset GPU use its cluster kind")
        given = merge_file(given, gpu)
    else:
        given = {k: v for k, v in given.items() if v is not None}
    custom, node, arch_given = custom_gpu(given, node_keys=True, where="custom")
    missing = [k for k in ("gpus_per_node", "nvlink_bandwidth", "nic_gbps") if k not in node]
    if missing:
        raise ShardplanError(f"custom needs {', '.join(missing)} (GPUs per NVLink domain, "
                             f"NVLink bytes/s per direction, Gb/s per NIC)")
    g = int(node["gpus_per_node"])
    preset = ClusterPreset("custom", "custom", g, float(node["nvlink_bandwidth"]),
                           int(node.get("nics", g)), float(node["nic_gbps"]),
                           {"gpus_per_node": "user-given", "nvlink_bandwidth": "user-given",
                            "nics": "user-given", "nic_gbps": "user-given"})
    t = dgx_cluster(preset, nodes, nvlink_latency=nvlink_latency, ib_latency=ib_latency,
                    name=name, gpu=custom.preset())
    gen = dict(t.meta["generator"])
    gen["options"] = {**gen["options"], "gpu": gpu if gpu is not None else "custom"}
    gen["custom_gpu"] = custom.meta(arch_given=arch_given)
    return t.replace(meta={**t.meta, "generator": gen})

