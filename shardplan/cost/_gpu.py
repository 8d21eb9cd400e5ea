"""What NVIDIA GPUs and NCCL reach of their datasheet figures: the hardware model of LLM plans.

A datasheet gives peaks; kernels and collectives reach a fraction of them that depends on the
hardware and the library, not on the model being trained. Every constant below is one such
fraction or latency with the published measurement it comes from (``docs/gpu-model.md``
lists them with their sources and which rows, if any, informed them: none did). They apply to
every plan on a GPU of that type, and to nothing else: a topology whose devices are not a
known GPU type (the CPU topologies ``topology measure`` writes, hand-made ones) is priced at
its own figures, as before.

- **Matrix products** reach the *maximum achievable matmul FLOP/s* (MAMF) of the GPU: the best
  large bf16 ``matmul`` measured by a brute-force search over shapes (Bekman, *Machine Learning
  Engineering*, "Maximum Achievable Matmul FLOPS comparison table", mamf-finder.py): A100 SXM
  267.9 of 312 TFLOP/s (0.859), H100 SXM 792.1 of 989 (0.801); from a later revision of the
  same table (stas00/ml-engineering 744d01e) H200 794.5 of 989 (the H100 row, "H200 is the
  same"), B200 1745.0 of 2250 (0.776), GB200 1822.0 of 2500 (0.729): the rate each sustains
  under its power limit. fp8 products reach their own, lower fraction of the fp8 peak, from
  the same table's ``float8_e4m3fn`` rows (744d01e): H100 SXM 1402.6 of 1979 (0.709), H200
  1453.4 of 1979, B200 3432.5 of 4500, GB200 3615.6 of 5000. No V100, H100 PCIe or 500 W H100
  figure is published there; they take A100's and H100 SXM's fractions (assumptions, said
  so in ``docs/gpu-model.md``). A ``custom`` GPU takes the fractions of the architecture it
  names.
- **Wave quantization of matrix products.** A GEMM runs as output tiles, one thread block
  per tile, at most one large tile per SM at a time, in waves over the SMs; the last wave
  runs partly empty, so a product whose tile count is just above a multiple of the SM count
  takes a whole extra wave (NVIDIA, *Matrix Multiplication Background User's Guide*, sections
  2.3 "Typical tile dimensions in cuBLAS" and 3.2 "Wave quantization", whose worked example is
  A100's 108 SMs with 256 x 128 tiles). :func:`wave_efficiency` is that ratio with the
  guide's 256 x 128 tile; SM counts are the datasheets' (A100 108, H100 SXM 132, V100 80,
  H100 PCIe 114; B200 148 as its SKU reads, Bekman, *Machine Learning Engineering*).
  MAMF is measured at its best shape, whole waves; wave efficiency scales it for the shapes
  a plan runs. An output of fewer tiles than SMs (a chunk of an overlapped tensor-parallel
  product) splits its reduction dimension over the idle SMs, as cuBLAS's split-K kernels do.
- **Memory-bound operators** (normalisation, activations, residual additions, softmax, the
  optimizer step) reach 0.88 of the HBM bandwidth: an A100 80 GB SXM read kernel measured at
  1.80 of 2.04 TB/s, Nsight Compute agreeing (NVIDIA developer forum, "Trouble to reach peak
  bandwidth of A100", 2025; the GTC 2025 talk it cites puts the best kernels near 90%).
- **NCCL collectives** (ring algorithm, *Simple* protocol, the one large messages use): a
  latency of ``8.4 us`` plus ``3.4 us`` per ring step over NVLink and ``14 us`` per step over
  the network (NCCL's own tuning model, ``src/graph/tuning.cc``, ``baseLat`` and ``hwLat`` for
  Ring/Simple; as there, a ring over ``n`` GPUs of ``m`` nodes takes ``n - 1`` steps (twice
  for an all-reduce), ``m - 1`` of them over the network), and a bus bandwidth of 0.81 of
  the link's per-direction bandwidth (nccl-tests
  ``all_reduce_perf`` ring on 8 x H200 over NVLink 4: 365.6 GB/s bus bandwidth of 450 GB/s,
  Bekman, *Machine Learning Engineering*, network benchmarks).
- **Scope.** A group inside one node is one ring over NVLink. A group across ``M`` nodes with
  ``G`` of its GPUs in each is NCCL's hierarchical pattern: a ring inside each node over NVLink
  while each GPU exchanges its ``1/G`` share with the other nodes over its own NIC (a ring per
  rail); the two phases pipeline, so the slower sets the time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from shardplan.ir import Topology

__all__ = ["GEMM_TILE", "GPU_MODELS", "SPLIT_K_DEPTH", "GPUModel", "cluster_collective_seconds",
           "custom_gpu_model", "gpu_model",
           "group_collective_seconds", "nccl_terms", "node_ids", "p2p_seconds",
           "wave_efficiency"]

#: The output tile (rows, columns) of a large half-precision GEMM in cuBLAS (NVIDIA, Matrix
#: Multiplication Background User's Guide, section 2.3; its wave example uses it on A100).
GEMM_TILE = (256, 128)
#: The thinnest slice of a GEMM's reduction dimension a split-K kernel gives one SM: two
#: 64-deep main-loop steps of the tile (an assumption; splits only fill a wave's idle SMs).
SPLIT_K_DEPTH = 128


@dataclass(frozen=True, slots=True)
class GPUModel:
    """What one GPU type reaches of its datasheet (module docstring for the sources).

    Attributes
    ----------
    name : str
    matmul_efficiency : float
        Achieved / peak tensor-core FLOP/s of large half-precision matrix products (bf16
        MAMF / peak).
    fp8_matmul_efficiency : float or None
        The same of fp8 products (fp8 MAMF / fp8 peak); None: the half-precision fraction
        (no fp8 measurement published). :meth:`matmul_fraction` reads it.
    memory_efficiency : float
        Achieved / peak HBM bandwidth of streaming kernels.
    nccl_efficiency : float
        NCCL ring bus bandwidth / link bandwidth per direction, large messages.
    nccl_base_latency, nccl_nvlink_step, nccl_net_step : float
        Seconds: a collective's fixed latency and each ring step's over NVLink and over the
        network (NCCL tuning model, Ring/Simple).
    sms : int
        Streaming multiprocessors (datasheet): the width of a GEMM's wave.
    source : str
    """

    name: str
    matmul_efficiency: float
    memory_efficiency: float
    nccl_efficiency: float = 365.6 / 450.0
    nccl_base_latency: float = 8.4e-6
    nccl_nvlink_step: float = 3.4e-6
    nccl_net_step: float = 14.0e-6
    sms: int = 108
    source: str = ""
    fp8_matmul_efficiency: float | None = None

    def matmul_fraction(self, precision: str) -> float:
        """What matrix products reach of the tensor cores' peak at ``precision``."""
        if precision == "fp8" and self.fp8_matmul_efficiency is not None:
            return self.fp8_matmul_efficiency
        return self.matmul_efficiency


_HBM = 1.80 / 2.04  # A100 80 GB read kernel, NVIDIA developer forum (module docstring)
_MAMF_A100 = 267.9 / 312.0
#: H100 SXM's fp8 (``float8_e4m3fn``) MAMF: 1402.6 of 1979 TFLOP/s (Bekman's table,
#: stas00/ml-engineering 744d01e), below its bf16 fraction (0.80)
_FP8_H100 = 1402.6 / 1979.0
GPU_MODELS: dict[str, GPUModel] = {
    "a100": GPUModel("a100", _MAMF_A100, _HBM,
                     source="MAMF 267.9 / 312 TFLOP/s (Bekman, ML Engineering); HBM 1.80 / "
                            "2.04 TB/s (NVIDIA forum); NCCL tuning.cc; 8 x H200 ring busbw"),
    # the 40 GB A100 of 2020 is the same chip: its memory is slower, the fraction the same
    "a100-40gb": GPUModel("a100-40gb", _MAMF_A100, _HBM,
                          source="as a100 (the same GA100 chip); HBM fraction measured on the "
                                 "80 GB part, assumed for its 40 GB HBM2"),
    "h100": GPUModel("h100", 792.1 / 989.0, _HBM, sms=132,
                     fp8_matmul_efficiency=_FP8_H100,
                     source="MAMF 792.1 / 989 TFLOP/s, fp8 1402.6 / 1979 (Bekman, ML "
                            "Engineering); HBM as A100; NCCL tuning.cc; 8 x H200 ring busbw"),
    "v100": GPUModel("v100", _MAMF_A100, _HBM, sms=80,
                     source="no published MAMF: A100's fraction assumed; HBM as A100; NCCL "
                            "tuning.cc; 8 x H200 ring busbw"),
    # Bekman's table (stas00/ml-engineering 744d01e, 2026-08): "H100 SXM 794.5 of 989 ...
    # H200 is the same" (bf16; its fp8 row: H200 1453.4 of 1979)
    "h200": GPUModel("h200", 794.5 / 989.0, _HBM, sms=132,
                     fp8_matmul_efficiency=1453.4 / 1979.0,
                     source="MAMF 794.5 / 989 TFLOP/s, the H100 SXM row noted 'H200 is the "
                            "same', fp8 1453.4 / 1979 (Bekman, ML Engineering); HBM as A100; "
                            "NCCL tuning.cc; 8 x H200 ring busbw"),
    # torchtitan (benchmarks/llama3_h100_202412_torchtitan.md): at its 500 W limit "the
    # actual peak TFLOPs number is between SXM and NVL": H100 NVL's datasheet 835 and H100
    # SXM's 989 dense bf16 TFLOP/s bound the clock it sustains; the bracket's middle
    # (912 / 989) scales H100 SXM's MAMF fraction
    "h100-96gb": GPUModel("h100-96gb", 792.1 / 989.0 * (835.0 + 989.0) / 2.0 / 989.0, _HBM,
                          sms=132,
                          fp8_matmul_efficiency=_FP8_H100 * (835.0 + 989.0) / 2.0 / 989.0,
                          source="no published MAMF at 500 W: H100 SXM's fraction x the middle "
                                 "of the clock bracket torchtitan states (between H100 NVL's "
                                 "835 and SXM's 989 TFLOP/s); HBM as A100; NCCL tuning.cc; "
                                 "8 x H200 ring busbw"),
    "h100-pcie": GPUModel("h100-pcie", 792.1 / 989.0, _HBM, sms=114,
                          fp8_matmul_efficiency=_FP8_H100,
                          source="no published MAMF: H100 SXM's fraction assumed (of the "
                                 "PCIe card's own 756 TFLOP/s peak); HBM as A100; NCCL "
                                 "tuning.cc; 8 x H200 ring busbw"),
    "b200": GPUModel("b200", 1745.0 / 2250.0, _HBM, sms=148,
                     fp8_matmul_efficiency=3432.5 / 4500.0,
                     source="MAMF 1745.0 / 2250 TFLOP/s, fp8 3432.5 / 4500, B200 SXM (Bekman, "
                            "ML Engineering); "
                            "HBM as A100; NCCL tuning.cc and 8 x H200 busbw assumed for "
                            "NVLink 5"),
    "gb200": GPUModel("gb200", 1822.0 / 2500.0, _HBM, sms=148,
                      fp8_matmul_efficiency=3615.6 / 5000.0,
                      source="MAMF 1822.0 / 2500 TFLOP/s, fp8 3615.6 / 5000, GB200 SXM "
                             "(Bekman, ML Engineering); SMs as B200 (assumed); HBM as A100; NCCL "
                             "tuning.cc and 8 x H200 busbw assumed for NVLink 5"),
}


def custom_gpu_model(arch: str, sms: int) -> GPUModel | None:
    """The model of a custom GPU (device type ``custom``): the fractions of ``arch``'s
    reference GPU (:data:`~shardplan.topology.ARCH_REFERENCE`) with its own SM count; None
    for an unknown architecture."""
    from shardplan.topology._custom import ARCH_REFERENCE

    ref = ARCH_REFERENCE.get(str(arch).lower())
    if ref is None:
        return None
    base = GPU_MODELS[ref]
    return replace(base, name="custom", sms=int(sms) if sms else base.sms,
                   source=f"custom GPU: {ref}'s fractions (arch={arch}); {base.source}")


def wave_efficiency(rows: Any, cols: Any, sms: int, depth: Any = None) -> np.ndarray:
    """Achieved / full-wave rate of GEMMs with ``rows x cols`` outputs on ``sms`` SMs: tiles
    ``t = ceil(rows / 256) * ceil(cols / 128)`` (:data:`GEMM_TILE`) run in ``ceil(t / sms)``
    waves, so ``t / (sms * ceil(t / sms))`` of the SM-time does work (module docstring).
    Outputs of fewer tiles than SMs split their reduction dimension (``depth``, when given)
    over the idle SMs, ``floor(sms / t)`` ways and no thinner than :data:`SPLIT_K_DEPTH`
    (cuBLAS's split-K kernels; CUTLASS's guidance picks split-K where quantization leaves
    SMs idle). Elementwise over arrays. O(1) each.

    Examples
    --------
    >>> float(wave_efficiency(8192, 2304, 108))  # 32 x 18 = 576 tiles: 5.33 of 6 waves
    0.8888888888888888
    >>> float(wave_efficiency(8192, 128 * 27, 108))  # 864 tiles: exactly 8 waves
    1.0
    >>> float(wave_efficiency(512, 2304, 132, depth=16384))  # 36 tiles, K split 3 ways
    0.8181818181818182
    """
    r = np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
    c = np.maximum(np.asarray(cols, dtype=np.float64), 1.0)
    tiles = np.ceil(r / GEMM_TILE[0]) * np.ceil(c / GEMM_TILE[1])
    if depth is not None:
        most = np.maximum(np.floor(np.asarray(depth, dtype=np.float64) / SPLIT_K_DEPTH), 1.0)
        split = np.where(tiles < sms, np.minimum(np.floor(sms / tiles), most), 1.0)
        tiles = tiles * split
    return tiles / (sms * np.ceil(tiles / sms))


def gpu_model(topology: Topology) -> GPUModel | None:
    """The hardware model of a topology's devices (its first device's ``type``), or None
    when they are not a known GPU type. A ``custom`` GPU takes its architecture's
    (:func:`custom_gpu_model`)."""
    if not topology.devices:
        return None
    extra = topology.devices[0].extra
    kind = str(extra.get("type", "")).lower()
    if kind == "custom":
        return custom_gpu_model(str(extra.get("arch", "")), int(extra.get("sms") or 0))
    return GPU_MODELS.get(kind)


def node_ids(topology: Topology) -> np.ndarray:
    """The node (innermost grouping level, e.g. the box) of every device; every device its
    own node when the topology has no levels (read-only; kept per topology: a search prices
    many layouts on one). O(devices) once."""
    return _node_ids(topology)


@lru_cache(maxsize=16)
def _node_ids(topology: Topology) -> np.ndarray:
    out = np.arange(topology.num_devices, dtype=np.int64)
    if topology.levels:
        for g, group in enumerate(topology.levels[-1].groups):
            out[list(group)] = g
    out.setflags(write=False)
    return out


def _pair_bandwidth(topology: Topology, a: int, b: int) -> float:
    return float(topology.bandwidth[a, b])


def _node_links(topology: Topology, dev: np.ndarray, node: np.ndarray
                ) -> tuple[float, float]:
    """``(inside, between)``: the slowest hop of a ring over the first node's devices of the
    group (NVLink; PCIe between the bridged pairs of a ``pcie-h100`` node), and the
    bandwidth from the group's first device to one on another node (its NIC); 0 for a
    group on one node. O(R)."""
    local = dev[node == node[0]]
    inside = float(np.asarray(topology.bandwidth[local, np.roll(local, -1)],
                              dtype=np.float64).min())
    others = dev[node != node[0]]
    between = _pair_bandwidth(topology, int(dev[0]), int(others[0])) if others.size else 0.0
    return inside, between


def nccl_terms(topology: Topology, model: GPUModel, kind: str, devices: Any,
               nodes: np.ndarray) -> tuple[float, float]:
    """``(latency, seconds per byte)`` of NCCL's ``kind`` (``allreduce``, ``allgather``,
    ``reducescatter``; ``alltoall``: :func:`_alltoall_terms`, its bytes the buffer of one
    device) over ``devices`` (module docstring's scope rule): a collective of
    ``S`` bytes (the whole tensor) takes ``latency + S x seconds per byte``. ``(0, 0)`` for
    one device. O(R)."""
    dev = np.asarray(devices, dtype=np.int64).reshape(-1)
    n = dev.size
    if n <= 1:
        return 0.0, 0.0
    if kind == "alltoall":
        return _alltoall_terms(topology, model, dev, nodes)
    f = 2.0 if kind == "allreduce" else 1.0
    node = nodes[dev]
    uniq, counts = np.unique(node, return_counts=True)
    m = uniq.size
    g = int(counts.max())
    eta = model.nccl_efficiency
    k_in = k_out = 0.0
    # NCCL's ring latency (tuning.cc): f (n - 1) steps, of which f (m - 1) cross the network
    # and the others stay inside a node
    steps, inter = f * (n - 1), f * (m - 1)
    lat = model.nccl_base_latency + (steps - inter) * model.nccl_nvlink_step + \
        inter * model.nccl_net_step
    b_in, b_out = _node_links(topology, dev, node)
    if g > 1:
        # the ring inside a node runs at its slowest hop (PCIe between NVLink-bridged pairs;
        # every hop the same through NVSwitch)
        k_in = f * (g - 1) / g / (eta * b_in)
    if m > 1:
        k_out = f * (m - 1) / m / g / (eta * b_out)
    return lat, max(k_in, k_out)


def _alltoall_terms(topology: Topology, model: GPUModel, dev: np.ndarray,
                    nodes: np.ndarray) -> tuple[float, float]:
    """NCCL's all-to-all (a grouped send and receive with every peer) of an ``S``-byte
    buffer per device over ``n`` devices, ``g`` per node: ``S (g - 1) / n`` to the peers
    of its node over NVLink and ``S (n - g) / n`` to the others over its own NIC, at the
    same time, each at NCCL's bus efficiency; the peers' transfers run concurrently, so the
    latency is one step over each kind of link (an assumption: NCCL's tuning model has no
    all-to-all entry). O(R)."""
    n = dev.size
    node = nodes[dev]
    g = int(np.unique(node, return_counts=True)[1].max())
    eta = model.nccl_efficiency
    lat = model.nccl_base_latency + model.nccl_nvlink_step
    k_in = k_out = 0.0
    b_in, b_out = _node_links(topology, dev, node)
    if g > 1:
        k_in = (g - 1) / n / (eta * b_in)
    if n > g:
        lat += model.nccl_net_step
        k_out = (n - g) / n / (eta * b_out)
    return lat, max(k_in, k_out)


def group_collective_seconds(topology: Topology, model: GPUModel, kind: str,
                             devices: Any, nbytes: float, nodes: np.ndarray) -> float:
    """Seconds of NCCL's ``kind`` of ``nbytes`` (the whole tensor) over ``devices``
    (:func:`nccl_terms`); 0 for one device or no bytes. O(R)."""
    if nbytes <= 0:
        return 0.0
    lat, per_byte = nccl_terms(topology, model, kind, devices, nodes)
    return lat + nbytes * per_byte


def cluster_collective_seconds(topology: Topology, kind: str, group_size: int,
                               nbytes: Any) -> Any:
    """The collective of a group of ``group_size`` GPUs of a GPU cluster kind
    (:data:`~shardplan.topology.CLUSTER_KINDS`: the presets and ``custom``) by the NCCL
    rule, the group packed onto whole nodes (its GPUs consecutive: what data parallelism
    and a stage's replicas use); None on any other topology. Elementwise over ``nbytes``
    (0 where there are none).

    The price the plan kinds that do not name their groups' devices (a stage's replicas)
    read, through :func:`~shardplan.cost._collectives.measured_seconds`, in place of one
    ring over the group's slowest link: that ring crosses each node boundary through one
    GPU's NIC, where NCCL stripes a step over every NIC of the node. O(R)."""
    from shardplan.topology._clusters import CLUSTER_KINDS

    gen = topology.meta.get("generator")
    if not isinstance(gen, Mapping) or gen.get("kind") not in CLUSTER_KINDS:
        return None
    model = gpu_model(topology)
    r = int(group_size)
    if model is None or not 1 <= r <= topology.num_devices:
        return None
    lat, per_byte = nccl_terms(topology, model, kind, np.arange(r), node_ids(topology))
    b = np.asarray(nbytes, dtype=np.float64)
    out = np.where((b > 0) & (r > 1), lat + b * per_byte, 0.0)
    return float(out) if out.ndim == 0 else out


def p2p_seconds(topology: Topology, model: GPUModel | None, a: int, b: int,
                nbytes: float) -> float:
    """A point-to-point message (a pipeline send): the link's latency and bandwidth, at
    NCCL's efficiency on a GPU. O(1)."""
    if a == b or nbytes <= 0:
        return 0.0
    if model is None:
        return float(topology.transfer_seconds(a, b, nbytes))
    return float(topology.latency[a, b]) + nbytes / (model.nccl_efficiency *
                                                     _pair_bandwidth(topology, a, b))
