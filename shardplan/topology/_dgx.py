"""The NVIDIA DGX-1 (V100) hybrid cube-mesh, one or more boxes joined by Ethernet."""

from __future__ import annotations

import numpy as np

from shardplan.ir._pairs import LevelPairs
from shardplan.ir.topology import Level, Topology
from shardplan.topology._devices import (
    check_count,
    check_device_count,
    check_nonnegative,
    check_positive,
    generator_meta,
    make_devices,
)

__all__ = ["DGX1_NVLINKS", "dgx1", "dgx1_link_counts"]

#: NVLink bricks between the 8 V100s of a DGX-1V, ``(gpu, gpu): links``: 2 is "NV2" (a double
#: link), 1 is "NV1". Every GPU uses its 6 NVLink2 bricks; the 12 other pairs have none and go
#: over PCIe and the inter-socket link ("SYS" in ``nvidia-smi topo -m``). Checked against
#: ``nvidia-smi topo -m`` of DGX-1-class V100 machines printed in pytorch/pytorch
#: benchmarks/distributed/ddp/README.md ("8 DGX machines with V100 GPUs") and in OneFlow's
#: DLPerf reports, and the NCCL topology dump of a DGX1-V100 in NVIDIA/nccl issue #671.
DGX1_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}
GPUS_PER_BOX = 8


def dgx1_link_counts() -> np.ndarray:
    """The 8x8 symmetric matrix of NVLink counts inside one DGX-1V (0 = PCIe only)."""
    m = np.zeros((GPUS_PER_BOX, GPUS_PER_BOX), dtype=np.int64)
    for (a, b), c in DGX1_NVLINKS.items():
        m[a, b] = m[b, a] = c
    return m


def dgx1(boxes: int = 1, *, nvlink_bandwidth: float = 25e9, nvlink_latency: float = 2e-6,
         pcie_bandwidth: float = 1e10, pcie_latency: float = 1e-5,
         inter_bandwidth: float = 12.5e9, inter_latency: float = 2.5e-5, device: str = "v100",
         memory_bytes: float | None = None, flops: float | None = None,
         name: str | None = None) -> Topology:
    """DGX-1 V100 boxes: double NVLink, single NVLink and PCIe inside a box, Ethernet between.

    Parameters
    ----------
    boxes : int
        Number of DGX-1 boxes (8 GPUs each), >= 1.
    nvlink_bandwidth : float
        Bytes/s per direction of one NVLink2 brick (default 25e9): "NV1" pairs get this,
        "NV2" pairs twice this (50e9).
    nvlink_latency : float
        Seconds between NVLink neighbours, single or double (default 2e-6).
    pcie_bandwidth, pcie_latency : float
        Pairs of a box without NVLink (default 1e10 B/s, 1e-5 s).
    inter_bandwidth, inter_latency : float
        Pairs in different boxes (default 12.5e9 B/s = 100 Gb/s Ethernet, 2.5e-5 s).
    device, memory_bytes, flops, name
        As in :func:`flat` (default V100, 32 GiB, 125e12 FLOP/s).

    Returns
    -------
    Topology
        ``8 * boxes`` devices named ``box0/gpu0`` (box-major), one level ``box``, no links.

    Notes
    -----
    Paper 002 section 7 runs on DGX-1 V100 boxes and names "three types of intra-DGX-1
    connections, namely double NVLinks, single NVLink, and PCI-e" with Ethernet between boxes;
    its appendix I with the numbers is not in our text, so the values are ours:

    * NVLink2: 25 GB/s per direction per brick (V100: 6 bricks, 300 GB/s bidirectional).
      The brick layout (:data:`DGX1_NVLINKS`) is the hybrid cube-mesh as ``nvidia-smi
      topo -m`` reports it.
    * PCIe: the non-NVLink pairs are "SYS" pairs: PCIe 3.0 x16 (15.75 GB/s theoretical)
      *and* the QPI link between the two CPU sockets, where peer-to-peer is not available and
      copies are staged through host memory. 10 GB/s is a typical achieved rate for such
      copies (and under the 12-13 GB/s PCIe 3.0 x16 delivers in practice).
    * Ethernet: one 100 Gb/s link's rate for every cross-box pair; NIC sharing between the
      8 GPUs of a box is not modelled (it is contention, a simulator's business).

    Like the paper, every pair uses its own class directly: a non-NVLink pair is *not* routed
    over two NVLink hops (NCCL would do that; the paper's model does not), so the topology has
    no ``links``. The matrices are a two-level pair model (boxes, then the 8 x 8 table of a
    box; :class:`~shardplan.ir._pairs.LevelPairs`) computed on demand, so clusters of
    thousands of boxes fit. O(boxes).
    """
    nb = check_count("boxes", boxes)
    check_device_count("dgx1", GPUS_PER_BOX * nb)
    nv_bw = check_positive("nvlink_bandwidth", nvlink_bandwidth)
    nv_lat = check_nonnegative("nvlink_latency", nvlink_latency)
    pc_bw = check_positive("pcie_bandwidth", pcie_bandwidth)
    pc_lat = check_nonnegative("pcie_latency", pcie_latency)
    in_bw = check_positive("inter_bandwidth", inter_bandwidth)
    in_lat = check_nonnegative("inter_latency", inter_latency)

    counts = dgx1_link_counts()
    box_bw = np.where(counts > 0, counts * nv_bw, pc_bw)
    box_lat = np.where(counts > 0, nv_lat, pc_lat)
    np.fill_diagonal(box_bw, 0.0)
    np.fill_diagonal(box_lat, 0.0)
    model = LevelPairs((nb, GPUS_PER_BOX), (in_bw, box_bw), (in_lat, box_lat))
    names = [f"box{b}/gpu{g}" for b in range(nb) for g in range(GPUS_PER_BOX)]
    level = Level(name="box", groups=tuple(
        tuple(range(b * GPUS_PER_BOX, (b + 1) * GPUS_PER_BOX)) for b in range(nb)))
    return Topology(
        name=name or (f"dgx1-x{nb}" if nb > 1 else "dgx1"),
        devices=make_devices(names, device, memory_bytes, flops),
        bandwidth=model.matrix("bandwidth"), latency=model.matrix("latency"),
        levels=(level,),
        meta=generator_meta("dgx1", boxes=nb, nvlink_bandwidth=nv_bw, nvlink_latency=nv_lat,
                            pcie_bandwidth=pc_bw, pcie_latency=pc_lat, inter_bandwidth=in_bw,
                            inter_latency=in_lat),
    )
