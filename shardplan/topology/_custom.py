"""A GPU that matches no preset, given by its datasheet figures.

A cluster of such GPUs is the ``custom`` topology kind (:func:`custom_cluster`), or any
cluster preset with ``gpu=@FILE.json`` (:func:`~shardplan.topology.dgx_cluster`). The figures
come from the ``KIND,key=value`` options, from a JSON object in a file (``gpu=@FILE.json``,
the same keys), or both (a key given in both places is an error, not an override).

A custom GPU has no published measurements of its own, so its kernel and NCCL fractions
(:data:`shardplan.cost.GPU_MODELS`) are those of the architecture its ``arch`` names
(:data:`ARCH_REFERENCE`; ``hopper`` when not given), and its SM count, when not given, that
architecture's reference GPU's. Both choices are written into the topology's ``generator``
meta (``arch``, ``arch_given``, ``kernel_fractions_of``, ``sms``, ``sms_given``) so that a
report can say what was assumed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.topology._devices import DevicePreset, check_bytes, check_count, check_positive

__all__ = ["ARCH_REFERENCE", "CUSTOM_GPU_KEYS", "CUSTOM_NODE_KEYS", "CustomGPU",
           "DEFAULT_ARCH", "custom_gpu", "read_gpu_file"]

#: Architecture -> the preset GPU whose measured fractions a custom GPU of it takes.
ARCH_REFERENCE: dict[str, str] = {"volta": "v100", "ampere": "a100", "hopper": "h100",
                                  "blackwell": "b200"}
#: The architecture of a custom GPU that does not name one.
DEFAULT_ARCH = "hopper"
#: SM counts of the reference GPUs (datasheets; the same as their GPU models').
_REFERENCE_SMS = {"v100": 80, "a100": 108, "h100": 132, "b200": 148}

#: Keys that describe the GPU itself (accepted by every cluster kind in a ``gpu=@FILE``).
CUSTOM_GPU_KEYS = ("name", "arch", "flops", "fp8_flops", "fp32_flops", "memory_bandwidth",
                   "gpu_memory", "sms")
#: Keys that describe its node (the ``custom`` kind only; the presets fix their own).
CUSTOM_NODE_KEYS = ("gpus_per_node", "nvlink_bandwidth", "nic_gbps", "nics")

#: Sanity ceilings, each far above any GPU or network announced (2025): a typo of a few
#: orders of magnitude is refused instead of planned with.
_CEILINGS: dict[str, float] = {
    "flops": 1e17,              # 100 PFLOP/s dense per GPU (B200: 2.25e15)
    "fp8_flops": 2e17,
    "fp32_flops": 1e17,
    "memory_bandwidth": 1e14,   # 100 TB/s (B200: 8e12)
    "gpu_memory": 16 * 2**40,   # 16 TiB (B300: 288 GB)
    "sms": 100_000,
    "gpus_per_node": 4096,      # one NVLink domain (NVL576 is 576)
    "nvlink_bandwidth": 1e13,   # 10 TB/s each way (NVLink 5: 9e11)
    "nic_gbps": 100_000.0,      # 100 Tb/s per NIC (ConnectX-8: 800)
    "nics": 4096,
}


def _ceiling(name: str, value: float) -> float:
    top = _CEILINGS[name]
    if value > top:
        raise ShardplanError(f"custom GPU {name} {value:g} is above the {top:g} shardplan "
                             f"accepts (a unit off?)")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class CustomGPU:
    """The figures of one GPU model no preset describes.

    Attributes
    ----------
    flops : float
        Peak dense bf16/fp16 tensor-core FLOP/s.
    fp32_flops : float
        Peak fp32 FLOP/s without tensor cores.
    memory_bandwidth : float
        Peak HBM bandwidth, bytes/s.
    memory_bytes : float
        HBM capacity, bytes.
    fp8_flops : float
        Peak dense fp8 FLOP/s; 0 when the GPU has no fp8.
    sms : int
        Streaming multiprocessors; 0 for the architecture's reference GPU's.
    arch : str
        ``volta``, ``ampere``, ``hopper`` or ``blackwell``: whose measured kernel and NCCL
        fractions it takes (:data:`ARCH_REFERENCE`).
    name : str
        A label (recorded in the meta and on every device as ``gpu_name``).
    """

    flops: float
    fp32_flops: float
    memory_bandwidth: float
    memory_bytes: float
    fp8_flops: float = 0.0
    sms: int = 0
    arch: str = DEFAULT_ARCH
    name: str = "custom"

    def __post_init__(self) -> None:
        for key in ("flops", "fp32_flops", "memory_bandwidth"):
            _ceiling(key, check_positive(f"custom GPU {key}", getattr(self, key)))
        _ceiling("gpu_memory", check_positive("custom GPU gpu_memory", self.memory_bytes))
        if self.fp8_flops:
            _ceiling("fp8_flops", check_positive("custom GPU fp8_flops", self.fp8_flops))
        if self.sms:
            _ceiling("sms", check_count("custom GPU sms", self.sms))
        if self.arch not in ARCH_REFERENCE:
            raise ShardplanError(f"custom GPU arch {self.arch!r} is not one of "
                                 f"{', '.join(ARCH_REFERENCE)}")

    @property
    def reference(self) -> str:
        """The preset GPU whose fractions this one takes."""
        return ARCH_REFERENCE[self.arch]

    @property
    def effective_sms(self) -> int:
        return self.sms or _REFERENCE_SMS[self.reference]

    def preset(self) -> DevicePreset:
        """The device preset of this GPU (type ``custom``; ``arch`` and ``sms`` on every
        device, which :func:`shardplan.cost.gpu_model` reads)."""
        mem = float(self.memory_bytes)
        return DevicePreset(
            "custom", int(mem) if mem.is_integer() else mem,  # type: ignore[arg-type]
            float(self.flops), f"custom GPU {self.name!r} (user-given figures)",
            fp32_flops=float(self.fp32_flops), memory_bandwidth=float(self.memory_bandwidth),
            fp8_flops=float(self.fp8_flops), arch=self.arch, sms=self.effective_sms)

    def meta(self, *, arch_given: bool) -> dict[str, Any]:
        """What the generator meta records of this GPU and of what was assumed for it."""
        d = asdict(self)
        d.update(arch_given=arch_given, kernel_fractions_of=self.reference,
                 sms=self.effective_sms, sms_given=bool(self.sms))
        return d


def read_gpu_file(path: str) -> dict[str, Any]:
    """The JSON object of a ``gpu=@FILE.json`` option (keys of :data:`CUSTOM_GPU_KEYS`
    and, for the ``custom`` kind, :data:`CUSTOM_NODE_KEYS`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ShardplanError(f"cannot read GPU file {path}: {e.strerror or e}") from None
    try:
        data = json.loads(text, parse_constant=lambda c: math.nan)
    except json.JSONDecodeError as e:
        raise ShardplanError(f"GPU file {path} is not JSON: {e.msg} (line {e.lineno})") \
            from None
    if not isinstance(data, dict):
        raise ShardplanError(f"GPU file {path} must hold a JSON object of GPU figures")
    return data


def custom_gpu(options: Mapping[str, Any], *, node_keys: bool,
               where: str = "custom GPU") -> tuple[CustomGPU, dict[str, Any], bool]:
    """``(gpu, node options, arch given)`` from ``options`` (keys of
    :data:`CUSTOM_GPU_KEYS`, and of :data:`CUSTOM_NODE_KEYS` when ``node_keys``).

    Raises
    ------
    ShardplanError
        An unknown key, a missing figure, or a value that is not a finite positive number
        under its ceiling.
    """
    allowed = CUSTOM_GPU_KEYS + (CUSTOM_NODE_KEYS if node_keys else ())
    unknown = sorted(k for k in options if k not in allowed)
    if unknown:
        raise ShardplanError(f"{where} does not take {', '.join(unknown)} (it takes "
                             f"{', '.join(allowed)})")
    missing = [k for k in ("flops", "fp32_flops", "memory_bandwidth", "gpu_memory")
               if options.get(k) is None]
    if missing:
        raise ShardplanError(f"{where} needs {', '.join(missing)} (peak dense bf16 FLOP/s, "
                             f"fp32 FLOP/s, HBM bytes/s, HBM size)")
    arch = options.get("arch")
    sms = options.get("sms")
    gpu = CustomGPU(
        flops=check_positive(f"{where} flops", options["flops"]),
        fp32_flops=check_positive(f"{where} fp32_flops", options["fp32_flops"]),
        memory_bandwidth=check_positive(f"{where} memory_bandwidth",
                                        options["memory_bandwidth"]),
        memory_bytes=check_bytes(f"{where} gpu_memory", options["gpu_memory"]),
        fp8_flops=0.0 if options.get("fp8_flops") is None else
        check_positive(f"{where} fp8_flops", options["fp8_flops"]),
        sms=0 if sms is None else check_count(f"{where} sms", sms),
        arch=DEFAULT_ARCH if arch is None else str(arch).lower(),
        name=str(options.get("name") or "custom"))
    node = {k: options[k] for k in CUSTOM_NODE_KEYS if options.get(k) is not None}
    for key in ("nvlink_bandwidth", "nic_gbps"):
        if key in node:
            node[key] = _ceiling(key, check_positive(f"{where} {key}", node[key]))
    for key in ("gpus_per_node", "nics"):
        if key in node:
            node[key] = int(_ceiling(key, check_count(f"{where} {key}", node[key])))
    return gpu, node, arch is not None


def merge_file(options: Mapping[str, Any], gpu: Any) -> dict[str, Any]:
    """``options`` with the figures of ``gpu`` (``"@FILE.json"``) added; a key in both is
    an error."""
    path = str(gpu)[1:]
    if not path:
        raise ShardplanError("gpu=@FILE needs a file name after '@'")
    data = read_gpu_file(path)
    both = sorted(k for k, v in options.items() if v is not None and k in data)
    if both:
        raise ShardplanError(f"{', '.join(both)} given both in GPU file {path} and as an "
                             f"option: give each figure once")
    return {**{k: v for k, v in options.items() if v is not None}, **data}
