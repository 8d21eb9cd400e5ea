"""Device presets and the checks every topology builder shares."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir.topology import Device

__all__ = ["DEVICE_PRESETS", "DevicePreset", "MAX_DEVICES", "MAX_MATRIX_BYTES",
           "check_bytes", "check_dense_size", "check_device_count",
           "generator_meta", "make_devices", "resolve_device"]

GIB = 2**30


@dataclass(frozen=True, slots=True)
class DevicePreset:
    """Memory (bytes) and peak rate (FLOP/s) of one accelerator model.

    Attributes
    ----------
    name : str
        Preset key (``"v100"``).
    memory_bytes : int
        Device memory, the nominal capacity in binary units (NVIDIA's "32 GB" HBM2 is 32 GiB).
    flops : float
        Peak dense tensor-core rate at the training precision (fp16 or bf16), FLOP/s.
    source : str
        Where the numbers come from.
    fp32_flops : float
        Peak fp32 rate without tensor cores (CUDA cores), FLOP/s: what matrix products reach
        in full precision, and every other operator's compute roof.
    memory_bandwidth : float
        Peak device-memory bandwidth, bytes/s: the roof of memory-bound operators.
    fp8_flops : float
        Peak dense fp8 tensor-core rate, FLOP/s; 0: the device has no fp8 (V100, A100).
    arch : str
        Only for a custom GPU (:mod:`shardplan.topology._custom`): the architecture whose
        kernel and NCCL fractions it takes (``hopper``); empty for the presets, which have
        their own.
    sms : int
        Only for a custom GPU: its streaming multiprocessors (0: its architecture's).
    """

    name: str
    memory_bytes: int
    flops: float
    source: str
    fp32_flops: float = 0.0
    memory_bandwidth: float = 0.0
    fp8_flops: float = 0.0
    arch: str = ""
    sms: int = 0


#: Published peak numbers of the accelerators the papers use. Each ``flops`` is the *dense*
#: tensor-core rate in half precision (fp16 on V100, which has no bf16; bf16 on A100/H100);
#: NVIDIA's headline figures with 2:4 structured sparsity are twice these.
DEVICE_PRESETS: dict[str, DevicePreset] = {
    "v100": DevicePreset(
        "v100", 32 * GIB, 125e12,
        "NVIDIA Tesla V100 SXM2 32 GB (the DGX-1V GPU): 125 TFLOP/s fp16 tensor core "
        "(NVIDIA V100 datasheet; 'up to 125 Tensor TFLOPS', NVIDIA developer blog on CUDA 9 "
        "tensor cores), 15.7 TFLOP/s fp32, 900 GB/s HBM2 (V100 datasheet, SXM2)",
        fp32_flops=15.7e12, memory_bandwidth=900e9,
    ),
    "a100": DevicePreset(
        "a100", 80 * GIB, 312e12,
        "NVIDIA A100 SXM4 80 GB: 312 TFLOP/s dense bf16/fp16 tensor core (A100 datasheet; "
        "624 with sparsity), 19.5 TFLOP/s fp32, 2,039 GB/s HBM2e (A100 80GB SXM datasheet)",
        fp32_flops=19.5e12, memory_bandwidth=2039e9,
    ),
    "a100-40gb": DevicePreset(
        "a100-40gb", 40 * GIB, 312e12,
        "NVIDIA A100 SXM4 40 GB (the DGX A100 320GB GPU, the A100 of 2020): 312 TFLOP/s "
        "dense bf16/fp16 tensor core, 19.5 TFLOP/s fp32, 1,555 GB/s HBM2 (A100 datasheet, "
        "40GB SXM column; the same GA100 chip and clocks as the 80 GB part, slower memory)",
        fp32_flops=19.5e12, memory_bandwidth=1555e9,
    ),
    "h100": DevicePreset(
        "h100", 80 * GIB, 989e12,
        "NVIDIA H100 SXM5 80 GB: 989 TFLOP/s dense bf16 tensor core (H100 datasheet lists "
        "1,979 with sparsity; the Hopper whitepaper gives 989.4 dense), 1,979 TFLOP/s dense "
        "fp8 (datasheet: 3,958 with sparsity), 67 TFLOP/s fp32, 3.35 TB/s HBM3 (H100 SXM "
        "datasheet)",
        fp32_flops=67e12, memory_bandwidth=3.35e12, fp8_flops=1979e12,
    ),
    "h100-96gb": DevicePreset(
        "h100-96gb", 96 * GIB, 989e12,
        "H100 with 96 GB HBM2e at 2.4 TB/s under a 500 W power limit: the GPU of Meta's Grand "
        "Teton hosts as torchtitan's published H100 benchmarks describe them "
        "(benchmarks/llama3_h100_202412_torchtitan.md, "
        "benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md: 'default 500W power limit'). "
        "NVIDIA publishes no datasheet for this part; its peaks are the GH100's (H100 SXM "
        "datasheet: 989 dense bf16, 1,979 dense fp8, 67 fp32), the rates torchtitan's MFU "
        "counts against; what 500 W sustains of them is not published (docs/gpu-model.md). "
        "Not the Llama 3 GPUs: arXiv 2407.21783 section 3.3.1 trained on H100 at 700 W "
        "with 80 GB HBM3 (the h100 preset)",
        fp32_flops=67e12, memory_bandwidth=2.4e12, fp8_flops=1979e12,
    ),
    "h100-pcie": DevicePreset(
        "h100-pcie", 80 * GIB, 756e12,
        "NVIDIA H100 PCIe 80 GB (350 W): 756 TFLOP/s dense bf16 tensor core (H100 datasheet, "
        "PCIe column: 1,513 with sparsity), 1,513 dense fp8 (3,026 with sparsity), 51 "
        "TFLOP/s fp32, 2 TB/s HBM2e (H100 datasheet; H100 PCIe product brief PB-11133: 350 W "
        "maximum TDP); 114 SMs (Hopper whitepaper)",
        fp32_flops=51e12, memory_bandwidth=2.0e12, fp8_flops=1513e12,
    ),
    "h200": DevicePreset(
        "h200", 141 * GIB, 989e12,
        "NVIDIA H200 SXM 141 GB (700 W): the H100 SXM's peaks, 989 TFLOP/s dense bf16 "
        "(datasheet 1,979 with sparsity), 1,979 dense fp8 (3,958 with sparsity), 67 fp32, "
        "and 4.8 TB/s HBM3e (H200 datasheet)",
        fp32_flops=67e12, memory_bandwidth=4.8e12, fp8_flops=1979e12,
    ),
    "b200": DevicePreset(
        "b200", 180 * GIB, 2250e12,
        "NVIDIA B200 as in DGX B200 / HGX B200 (1,000 W): 2,250 TFLOP/s dense bf16, 4,500 "
        "dense fp8 (DGX B200 datasheet: 72 PFLOPS fp8 with sparsity for 8 GPUs), 80 fp32, "
        "180 GB HBM3e at 8 TB/s (DGX B200 datasheet: 1,440 GB and 64 TB/s for 8 GPUs); "
        "per-GPU peaks as tabulated in Bekman, Machine Learning Engineering, 'Theoretical "
        "accelerator TFLOPS' (B200 SXM row, citing the DGX B200 datasheet)",
        fp32_flops=80e12, memory_bandwidth=8e12, fp8_flops=4500e12,
    ),
    "gb200": DevicePreset(
        "gb200", 186 * GIB, 2500e12,
        "NVIDIA Blackwell GPU of a GB200 superchip (1,200 W): 2,500 TFLOP/s dense bf16, "
        "5,000 dense fp8, 80 fp32 (GB200 NVL72 datasheet: 360 PFLOPS bf16 and 720 fp8 with "
        "sparsity, 5,760 TFLOPS fp32, for 72 GPUs), 186 GB HBM3e at 8 TB/s (13.4 TB and 576 "
        "TB/s for 72 GPUs); per GPU as in Bekman, Machine Learning Engineering (GB200 SXM "
        "rows)",
        fp32_flops=80e12, memory_bandwidth=8e12, fp8_flops=5000e12,
    ),
}


# ---------------------------------------------------------------------- checks
def check_positive(name: str, value: Any) -> float:
    """``value`` as a positive finite float, else a one-line :class:`ShardplanError`."""
    if isinstance(value, bool):
        raise ShardplanError(f"{name} must be a positive number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ShardplanError(f"{name} must be a positive number, got {value!r}") from None
    if not v > 0 or not math.isfinite(v):
        raise ShardplanError(f"{name} must be a positive number, got {value!r}")
    return v


def check_nonnegative(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ShardplanError(f"{name} must be a number >= 0, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ShardplanError(f"{name} must be a number >= 0, got {value!r}") from None
    if not v >= 0 or not math.isfinite(v):
        raise ShardplanError(f"{name} must be a number >= 0, got {value!r}")
    return v


def check_count(name: str, value: Any, *, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum`` (bools and floats with a fraction are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            not math.isfinite(value) or not float(value).is_integer():
        raise ShardplanError(f"{name} must be an integer >= {minimum}, got {value!r}")
    v = int(value) if isinstance(value, int) else int(float(value))
    if v < minimum:
        raise ShardplanError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return v


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def check_bytes(name: str, value: Any) -> float:
    """A memory size: a positive number of bytes, or a string with a unit (``"40GiB"``,
    ``"80 GB"``, ``"1.5e9"``; KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024).

    Examples
    --------
    >>> check_bytes("gpu_memory", "40GiB") == 40 * 2**30
    True
    """
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        num = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(num):]
        if unit not in _BYTE_UNITS or not num:
            raise ShardplanError(f"{name} must be bytes like 40GiB or 8e10, got {value!r}")
        return check_positive(name, float(num) * _BYTE_UNITS[unit]) if _is_number(num) \
            else check_positive(name, value)
    return check_positive(name, value)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


MAX_MATRIX_BYTES = 4 * 2**30
"""Largest size of a topology's two dense D x D float64 matrices (bandwidth and latency) a
builder makes: 4 GiB, i.e. 16384 devices."""


def check_dense_size(kind: str, num_devices: int) -> None:
    """Refuse, before allocating anything, a topology whose dense matrices would exceed
    :data:`MAX_MATRIX_BYTES`; the message says how much memory it would need. O(1)."""
    need = 2 * 8 * float(num_devices) ** 2
    if need > MAX_MATRIX_BYTES:
        most = int((MAX_MATRIX_BYTES / 16) ** 0.5)
        raise ShardplanError(f"a {kind} topology of {num_devices} devices needs "
                             f"{need / 2**30:.3g} GiB for its dense bandwidth and latency "
                             f"matrices (2 x {num_devices}^2 float64); at most {most} devices "
                             f"({MAX_MATRIX_BYTES / 2**30:g} GiB) are supported")


MAX_DEVICES = 2**20
"""Most devices a generated topology may have (1,048,576: a 1000 x 1000 hierarchy). Its
matrices are computed on demand, but every device is an object and a line of the file (about
1 KB of memory each)."""


def check_device_count(kind: str, num_devices: int) -> None:
    """Refuse, before building anything, a topology of more than :data:`MAX_DEVICES`. O(1)."""
    if num_devices > MAX_DEVICES:
        raise ShardplanError(f"a {kind} topology of {num_devices} devices is more than the "
                             f"{MAX_DEVICES} shardplan builds (every device is listed in the "
                             f"file, about 1 KB of memory each)")


def check_shape(kind: str, shape: Any, ndim: int | None = None, *, minimum: int = 1,
                example: str = "4x4") -> tuple[int, ...]:
    """A grid shape: a tuple of integers >= ``minimum``, of length ``ndim`` when given."""
    if isinstance(shape, str):  # "4x4" or "4,4", as on the command line
        shape = tuple(p.strip() for p in shape.replace(",", "x").split("x"))
        try:
            shape = tuple(int(p) for p in shape)
        except ValueError:
            raise ShardplanError(f"{kind} shape must be integers like {example}, got "
                                 f"{'x'.join(shape)}") from None
    if isinstance(shape, numbers.Real) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShardplanError(f"{kind} shape must be a sequence of integers like {example}, got "
                             f"{shape!r}") from None
    text = "x".join(str(d) for d in dims)
    if ndim is not None and len(dims) != ndim:
        raise ShardplanError(f"{kind} needs a {ndim}-dimensional shape like {example}, got "
                             f"{text or 'nothing'}")
    if not dims:
        raise ShardplanError(f"{kind} needs a shape like {example}")
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Real) or not math.isfinite(d) \
                or not float(d).is_integer() or d < minimum:
            raise ShardplanError(f"{kind} shape sizes must be integers >= {minimum}, got {text}")
        out.append(int(d) if isinstance(d, int) else int(float(d)))
    return tuple(out)


def check_range(name: str, value: Any) -> tuple[float, float]:
    """A ``(lo, hi)`` pair with ``0 < lo <= hi``."""
    try:
        lo, hi = value
    except (TypeError, ValueError):
        raise ShardplanError(f"{name} must be a (low, high) pair, got {value!r}") from None
    lo = check_positive(f"{name} low end", lo)
    hi = check_positive(f"{name} high end", hi)
    if lo > hi:
        raise ShardplanError(f"{name} low end {lo:g} is above its high end {hi:g}")
    return lo, hi


def check_list(name: str, values: Any, length: int, *, what: str, positive: bool = True
               ) -> tuple[float, ...]:
    """A sequence of ``length`` positive (or non-negative) numbers."""
    if isinstance(values, (int, float)) and not isinstance(values, bool):
        values = (values,)
    try:
        vals = tuple(values)
    except TypeError:
        raise ShardplanError(f"{name} must be a list of {length} numbers, got {values!r}") \
            from None
    if len(vals) != length:
        raise ShardplanError(f"{name} needs {length} value{'s' if length != 1 else ''} ({what}), "
                             f"got {len(vals)}")
    check = check_positive if positive else check_nonnegative
    return tuple(check(name, v) for v in vals)


# ---------------------------------------------------------------------- metadata
def generator_meta(kind: str, **options: Any) -> dict[str, Any]:
    """The ``generator`` field builders add to their topology (kind and options used)."""
    def plain(v: Any) -> Any:
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, np.generic):
            return v.item()
        return v

    return {"generator": {"kind": kind, "options": {k: plain(v) for k, v in options.items()}}}


# ---------------------------------------------------------------------- devices
def resolve_device(device: str | DevicePreset, memory_bytes: float | None,
                   flops: float | None) -> tuple[str, float, float]:
    """``(type name, memory bytes, FLOP/s)`` from a preset and optional overrides."""
    if isinstance(device, DevicePreset):
        preset = device
    else:
        key = str(device).lower()
        if key not in DEVICE_PRESETS:
            raise ShardplanError(f"unknown device type {device!r} (choose from "
                                 f"{', '.join(DEVICE_PRESETS)})")
        preset = DEVICE_PRESETS[key]
    mem = preset.memory_bytes if memory_bytes is None else check_positive("memory_bytes",
                                                                          memory_bytes)
    fl = preset.flops if flops is None else check_positive("flops", flops)
    if float(mem).is_integer():
        mem = int(mem)
    return preset.name, mem, fl


def make_devices(names: Sequence[str], device: str | DevicePreset = "v100",
                 memory_bytes: float | None = None, flops: float | None = None
                 ) -> tuple[Device, ...]:
    """Identical devices named ``names``, from a preset with optional overrides. The preset's
    fp32 rate and memory bandwidth (the roofline of :mod:`shardplan.cost._compute`) go with
    it unless ``flops`` overrides its peak: a device given only a FLOP rate is priced at
    that rate."""
    kind, mem, fl = resolve_device(device, memory_bytes, flops)
    extra: dict[str, Any] = {"type": kind}
    preset = device if isinstance(device, DevicePreset) else DEVICE_PRESETS[kind]
    if flops is None and preset.memory_bandwidth > 0:
        extra["fp32_flops"] = preset.fp32_flops
        extra["memory_bandwidth"] = preset.memory_bandwidth
    if flops is None and preset.fp8_flops > 0:
        extra["fp8_flops"] = preset.fp8_flops
    if preset.arch:
        extra["arch"] = preset.arch
    if preset.sms:
        extra["sms"] = preset.sms
    return tuple(Device(name=n, memory_bytes=mem, flops=fl, extra=dict(extra)) for n in names)
