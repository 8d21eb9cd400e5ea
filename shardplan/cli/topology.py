"""``shardplan topology KIND``: build or measure a device topology file."""

from __future__ import annotations

import argparse
from typing import Any

from shardplan._argtypes import byte_size
from shardplan.cli._common import (
    add_output,
    declare_files,
    emit,
    nonnegative_float,
    nonnegative_int,
    note,
    parse_float_list,
    parse_int_list,
    parse_nonnegative_float_list,
    positive_float,
    positive_int,
    split_names,
)
from shardplan.errors import ShardplanError
from shardplan.ir.topology import DENSE_JSON_DEVICES

__all__ = ["register", "run"]

CLUSTERS = ("dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "dgx2-v100", "pcie-h100",
            "gb200-nvl72", "custom")
#: The device presets (``shardplan.topology.DEVICE_PRESETS``, kept here so that parsing the
#: command line does not import the builders; a test holds the two equal).
DEVICE_TYPES = ("v100", "a100", "a100-40gb", "h100", "h100-96gb", "h100-pcie", "h200",
                "b200", "gb200")
KINDS = ("flat", "hierarchical", "dgx1", *CLUSTERS, "mesh2d", "torus2d", "mesh3d", "torus3d",
         "random-blk-1", "random-blk-2", "uniform-dist", "measure")
_RANDOM = ("random-blk-1", "random-blk-2", "uniform-dist")
_GRIDS = ("mesh2d", "torus2d", "mesh3d", "torus3d")
_DEVICE_OPTS = ("device_type", "memory_bytes", "flops", "name")

#: Which command-line options each kind takes (``dest`` names); any other option given is an
#: error rather than silently ignored.
ALLOWED: dict[str, tuple[str, ...]] = {
    "flat": ("devices", "bandwidth", "latency"),
    "hierarchical": ("shape", "level_names", "bandwidth", "latency"),
    "dgx1": ("boxes", "inter_bandwidth", "inter_latency", "nvlink_bandwidth",
             "pcie_bandwidth"),
    **{k: ("shape", "bandwidth", "latency") for k in _GRIDS},
    "random-blk-1": ("devices", "bandwidth", "latency", "seed", "block_size"),
    "random-blk-2": ("devices", "bandwidth", "latency", "seed", "block_size",
                     "super_block_size"),
    "uniform-dist": ("devices", "bandwidth", "latency", "seed"),
    **{k: ("nodes", "gpu", "gpu_memory", "nic_gbps", "nics") for k in CLUSTERS},
    "gb200-nvl72": ("gpu", "gpu_memory", "nic_gbps", "nics"),  # racks=N after the kind
    "measure": ("nproc", "backend", "timeout", "sizes", "repeats", "collectives",
                "collective_sizes"),
}
_DEFAULT_SHAPES = {"mesh2d": (4, 4), "torus2d": (4, 4), "mesh3d": (4, 4, 4),
                   "torus3d": (4, 4, 4), "hierarchical": (2, 4, 3, 4)}
_DEFAULT_DEVICES = {"flat": 8, "random-blk-1": 64, "random-blk-2": 64, "uniform-dist": 64}
_OPTION_FLAGS = {
    "devices": "--devices", "shape": "--shape", "level_names": "--level-names",
    "bandwidth": "--bandwidth", "latency": "--latency", "boxes": "--boxes",
    "inter_bandwidth": "--inter-bandwidth", "inter_latency": "--inter-latency",
    "nvlink_bandwidth": "--nvlink-bandwidth", "pcie_bandwidth": "--pcie-bandwidth",
    "seed": "--seed", "block_size": "--block-size", "super_block_size": "--super-block-size",
    "nproc": "--nproc", "backend": "--backend", "timeout": "--timeout", "sizes": "--sizes",
    "repeats": "--repeats", "nodes": "--nodes", "gpu": "--gpu", "gpu_memory": "--gpu-memory",
    "nic_gbps": "--nic-gbps", "nics": "--nics",
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``topology`` command to a subparsers object."""
    p = sub.add_parser(
        "topology", help="build a device topology (flat, hierarchical, dgx1, meshes, tori, "
                         "random) or measure one with torch.distributed",
        description="Write a shardplan.topology/1 file. Builders are instant; 'measure' "
                    "starts --nproc local processes and times ping-pongs between every "
                    "ordered pair (gloo on CPU, NCCL with CUDA).",
        epilog="Lists are outermost level first. hierarchical: --shape 2x4x3x4 "
               "--level-names region,rack,box,gpu --bandwidth 1.25e9,1.25e10,2.5e10,1.5e11 "
               "--latency 1e-3,2e-5,5e-6,2e-6. random kinds: --bandwidth lo,hi per class "
               "(uniform-dist: 1 class; random-blk-1: inter-block, intra-block; random-blk-2: "
               "inter-super-block, inter-block, intra-block).",
    )
    p.add_argument("kind", metavar="KIND[,KEY=VALUE...]",
                   help=" | ".join(KINDS) + "; options may follow the kind, comma-separated, "
                        "by the builder's names (dgx-a100,nodes=4,gpu_memory=40GiB)")
    g = p.add_argument_group("shape")
    g.add_argument("--devices", type=positive_int, metavar="N",
                   help="number of devices (flat: 8, random kinds: 64 by default)")
    g.add_argument("--shape", type=parse_int_list, metavar="AxB[xC...]",
                   help="grid shape (mesh2d 4x4, mesh3d 4x4x4) or hierarchy (2x4x3x4)")
    g.add_argument("--level-names", type=split_names, metavar="A,B,...",
                   help="hierarchical: one name per level (default region,rack,box,gpu)")
    g.add_argument("--boxes", type=positive_int, metavar="N", help="dgx1: boxes of 8 GPUs")
    g.add_argument("--nodes", type=positive_int, metavar="N",
                   help="dgx-a100, dgx-h100, dgx-h200, dgx-b200, pcie-h100 (8 GPUs each), "
                        "dgx2-v100 (16), custom: nodes (default 1); gb200-nvl72 takes "
                        "racks=N after the kind")
    g.add_argument("--gpu", metavar="TYPE",
                   help="dgx-*: the GPU of every node, a device preset (dgx-a100: a100, or "
                        "a100-40gb for the 40 GB A100 of 2020; dgx-h100: h100-96gb for the "
                        "500 W H100 with 96 GB HBM2e), or @FILE.json for a GPU of your own "
                        "(docs/hardware.md)")
    g.add_argument("--gpu-memory", type=byte_size, metavar="BYTES",
                   help="dgx-*: memory of every GPU, bytes or with a unit (40GiB)")
    g.add_argument("--nic-gbps", type=positive_float, metavar="GBPS",
                   help="dgx-*: line rate of one InfiniBand NIC, Gb/s (200, 400, 100)")
    g.add_argument("--nics", type=positive_int, metavar="N",
                   help="dgx-*: InfiniBand NICs per node (default 8)")
    g.add_argument("--block-size", type=positive_int, metavar="B",
                   help="random-blk-1/2: devices per block (default 4)")
    g.add_argument("--super-block-size", type=positive_int, metavar="S",
                   help="random-blk-2: devices per super-block (default 16)")
    g.add_argument("--seed", type=nonnegative_int, metavar="S", help="random kinds (default 0)")
    g = p.add_argument_group("links")
    g.add_argument("--bandwidth", type=parse_float_list, metavar="B[,B...]",
                   help="bytes/s: flat one value; hierarchical one per level; mesh/torus per "
                        "link; random kinds lo,hi per class")
    g.add_argument("--latency", type=parse_nonnegative_float_list, metavar="S[,S...]",
                   help="seconds, shaped like --bandwidth (mesh/torus: per hop)")
    g.add_argument("--inter-bandwidth", type=positive_float, metavar="B",
                   help="dgx1: bytes/s between boxes (default 12.5e9 = 100 Gb/s)")
    g.add_argument("--inter-latency", type=nonnegative_float, metavar="S",
                   help="dgx1: seconds between boxes (default 2.5e-5)")
    g.add_argument("--nvlink-bandwidth", type=positive_float, metavar="B",
                   help="dgx1: bytes/s per NVLink brick per direction (default 25e9)")
    g.add_argument("--pcie-bandwidth", type=positive_float, metavar="B",
                   help="dgx1: bytes/s of the non-NVLink pairs of a box (default 1e10)")
    g = p.add_argument_group("devices")
    g.add_argument("--device-type", choices=DEVICE_TYPES,
                   help="device preset (default v100; measure: this machine's CPUs)")
    g.add_argument("--memory-bytes", type=byte_size, metavar="BYTES",
                   help="memory of every device, bytes or with a unit as --gpu-memory takes "
                        "them (16GiB, 1.5e10; overrides the preset)")
    g.add_argument("--flops", type=positive_float, metavar="FLOP/S",
                   help="peak FLOP/s of every device (overrides the preset)")
    g.add_argument("--name", help="topology name (default from the kind and its options)")
    g = p.add_argument_group("measure")
    g.add_argument("--nproc", type=positive_int, metavar="N", help="number of processes")
    g.add_argument("--backend", choices=("auto", "gloo", "nccl"),
                   help="torch.distributed backend (default auto: nccl with CUDA, else gloo)")
    g.add_argument("--timeout", type=positive_float, metavar="SEC",
                   help="hard limit on the whole measurement (default 120)")
    g.add_argument("--sizes", type=parse_int_list, metavar="BYTES,...",
                   help="message sizes (default 4,65536,1048576,4194304,16777216)")
    g.add_argument("--repeats", type=positive_int, metavar="N",
                   help="timed round trips per size and pair (default 10)")
    g.add_argument("--no-collectives", dest="collectives", action="store_const", const=False,
                   default=None, help="skip timing all-reduce, all-gather and reduce-scatter "
                                      "per group size")
    g.add_argument("--collective-sizes", type=parse_int_list, metavar="BYTES,...",
                   help="collective tensor sizes (default 65536,1048576,4194304,16777216)")
    g = p.add_argument_group("file")
    form = g.add_mutually_exclusive_group()
    form.add_argument("--dense", action="store_true",
                      help="list the bandwidth and latency matrices whatever the size (the "
                           "contract's form; the default up to 16384 devices)")
    form.add_argument("--compact", action="store_true",
                      help="store a generated topology by its generator ('pairs', a few KB, "
                           "loads in milliseconds; shardplan reads it, tools that read only "
                           "the matrices do not) and other matrices compactly encoded")
    add_output(p)
    declare_files(p, outputs=("output",))
    p.set_defaults(handler=run)


def _one(key: str, values: tuple[float, ...] | None, kind: str) -> float | None:
    if values is None:
        return None
    if len(values) != 1:
        raise ShardplanError(f"{kind} takes one value for {_OPTION_FLAGS[key]}, got "
                             f"{len(values)}")
    return values[0]


def options_for(args: argparse.Namespace) -> dict[str, Any]:
    """The builder keyword arguments for the parsed command line (checks what applies)."""
    kind = args.kind
    allowed = set(ALLOWED[kind])
    given = [k for k in _OPTION_FLAGS if getattr(args, k, None) is not None]
    wrong = [_OPTION_FLAGS[k] for k in given if k not in allowed]
    if wrong:
        raise ShardplanError(f"option{'s' if len(wrong) > 1 else ''} {', '.join(wrong)} "
                             f"do{'' if len(wrong) > 1 else 'es'} not apply to topology {kind}")
    if kind == "measure" and args.nproc is None:
        raise ShardplanError("topology measure needs --nproc N")
    opts: dict[str, Any] = {}
    if args.device_type is not None:
        if kind in CLUSTERS:
            raise ShardplanError(f"topology {kind} sets its GPU type; --device-type does not "
                                 f"apply (--gpu chooses another part of its kind)")
        opts["device"] = args.device_type
    for key in ("memory_bytes", "flops", "name"):
        if getattr(args, key) is not None:
            opts["gpu_memory" if kind in CLUSTERS and key == "memory_bytes" else key] = \
                getattr(args, key)

    if kind in _DEFAULT_DEVICES:
        opts["num_devices"] = args.devices if args.devices is not None \
            else _DEFAULT_DEVICES[kind]
    if kind in _DEFAULT_SHAPES:
        opts["shape"] = args.shape if args.shape is not None else _DEFAULT_SHAPES[kind]
    if kind == "flat":
        for key in ("bandwidth", "latency"):
            v = _one(key, getattr(args, key), kind)
            if v is not None:
                opts[key] = v
    elif kind == "hierarchical":
        for key in ("level_names", "bandwidth", "latency"):
            if getattr(args, key) is not None:
                opts[key] = getattr(args, key)
    elif kind in _GRIDS:
        bw = _one("bandwidth", args.bandwidth, kind)
        lat = _one("latency", args.latency, kind)
        if bw is not None:
            opts["link_bandwidth"] = bw
        if lat is not None:
            opts["hop_latency"] = lat
    elif kind == "dgx1":
        for key in ("boxes", "inter_bandwidth", "inter_latency", "nvlink_bandwidth",
                    "pcie_bandwidth"):
            if getattr(args, key) is not None:
                opts[key] = getattr(args, key)
    elif kind in CLUSTERS:
        for key in ALLOWED[kind]:
            if getattr(args, key) is not None:
                opts[key] = getattr(args, key)
    elif kind in _RANDOM:
        for key in ("bandwidth", "latency", "seed", "block_size", "super_block_size"):
            if getattr(args, key) is not None:
                opts[key] = getattr(args, key)
    elif kind == "measure":
        opts["nproc"] = args.nproc
        for key in ("backend", "timeout", "sizes", "repeats", "collectives",
                    "collective_sizes"):
            if getattr(args, key) is not None:
                opts[key] = getattr(args, key)
    return opts


def run(args: argparse.Namespace) -> int:
    """Handler of ``shardplan topology``."""
    import shardplan.measure  # noqa: F401 - registers the topology kind 'measure'
    from shardplan.topology import build

    if not args.output and not args.json:
        raise ShardplanError("say where the topology goes: -o FILE or --json")
    from shardplan.topology import parse_spec

    kind, spec = parse_spec(args.kind)
    if kind not in KINDS:
        raise ShardplanError(f"argument KIND: invalid choice: {kind!r} (choose from "
                             f"{', '.join(KINDS)})")
    args.kind = kind
    opts = options_for(args)
    twice = sorted(set(spec) & set(opts))
    if twice:
        raise ShardplanError(f"topology option {twice[0]!r} is given both after the kind and "
                             f"as a flag")
    topo = build(kind, **opts, **spec)
    dense = True if args.dense else False if args.compact else None
    n = topo.num_devices
    if dense is None and 1024 < n <= DENSE_JSON_DEVICES:
        note(f"{n} devices written with their dense matrices (the contract's form, about "
             f"{21 * n * n / 1e6:.0f} MB); --compact stores the topology by its generator")
    emit(args, topo.to_dict(dense=dense), what="topology")
    return 0
