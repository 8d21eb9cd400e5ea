"""The device topology value object (``shardplan.topology/1``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from shardplan._limits import check_size
from shardplan.errors import InvalidFileError, ShardplanError
from shardplan.ir._pairs import GridPairs, PairMatrix, PairModel, pair_model_from_dict

__all__ = ["DENSE_JSON_DEVICES", "TOPOLOGY_FORMAT", "Device", "Level", "Link", "Topology"]

TOPOLOGY_FORMAT = "shardplan.topology/1"

#: Up to this many devices a topology file lists its ``bandwidth`` and ``latency`` matrices
#: by default, as the contract's ``shardplan.topology/1`` says (every size the builders could
#: make before topologies had pair models). ``to_dict(dense=False)`` (``topology
#: --compact``) writes a topology with a pair model in its generator form (``pairs``) only,
#: a few KB, and one without (measured, random) with its matrices compactly encoded (see
#: :func:`encode_matrix`); above this size that is the default.
DENSE_JSON_DEVICES = 16384


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator: its memory (bytes) and peak rate (FLOP/s)."""

    name: str
    memory_bytes: float
    flops: float
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "memory_bytes": self.memory_bytes,
                             "flops": self.flops}
        for k, v in self.extra.items():
            d.setdefault(k, v)
        return d


@dataclass(frozen=True, slots=True)
class Level:
    """One level of the natural hierarchy (``"box"``): a partition of the devices into groups."""

    name: str
    groups: tuple[tuple[int, ...], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "groups": [list(g) for g in self.groups]}


@dataclass(frozen=True, slots=True)
class Link:
    """A physical link ``src -> dst`` (optional ``links`` field, used to route and to model
    contention). Pairs without a link communicate over routes of links."""

    src: int
    dst: int
    bandwidth: float
    latency: float
    kind: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"src": self.src, "dst": self.dst, "bandwidth": self.bandwidth,
                             "latency": self.latency}
        if self.kind:
            d["kind"] = self.kind
        return d


def encode_matrix(arr: np.ndarray) -> dict[str, Any]:
    """A D x D float matrix as a JSON object: its distinct values and, per entry, the index
    of its value (``uint8``/``uint16``, row-major, zlib-compressed, base64), or, with more
    distinct values than that pays for, the float64 entries themselves (little-endian,
    compressed). Matrices of a few link classes (most topologies) take a few bytes per row;
    random ones 8 bytes an entry (plus base64's third), not the 20 of decimal JSON."""
    import base64
    import zlib

    a = np.ascontiguousarray(arr, dtype=np.float64)
    flat = a.reshape(-1)
    sample = flat[::max(1, flat.size // 2**16)]
    codes = None
    if np.unique(sample).size * 4 < sample.size:  # else too many distinct values: no sort
        values, codes = np.unique(a, return_inverse=True)
    for dt in ("<u1", "<u2") if codes is not None else ():
        # codes while the value list (about 24 bytes of JSON each) costs less than it saves
        if values.size <= np.iinfo(np.dtype(dt)).max + 1 and \
                values.size * 24 < a.size * (8 - np.dtype(dt).itemsize):
            raw = np.asarray(codes).astype(dt).tobytes()
            return {"encoding": "codes", "shape": list(a.shape), "values": values.tolist(),
                    "dtype": dt, "data": base64.b64encode(zlib.compress(raw, 1)).decode()}
    return {"encoding": "float64", "shape": list(a.shape), "dtype": "<f8",
            "data": base64.b64encode(zlib.compress(a.astype("<f8").tobytes(), 1)).decode()}


def decode_matrix(name: str, data: Mapping[str, Any]) -> np.ndarray:
    """The matrix of :func:`encode_matrix`'s object; :class:`InvalidFileError` if it is not
    one."""
    import base64
    import binascii
    import zlib

    try:
        shape = tuple(int(x) for x in data["shape"])
        raw = zlib.decompress(base64.b64decode(data["data"], validate=True))
        dt = np.dtype(str(data["dtype"]))
        if data.get("encoding") == "codes" and dt.kind == "u":
            values = np.asarray(data["values"], dtype=np.float64)
            codes = np.frombuffer(raw, dtype=dt)
            if codes.size and int(codes.max()) >= values.size:
                raise ValueError("code beyond the values")
            return values[codes].reshape(shape)
        if data.get("encoding") == "float64" and dt == np.dtype("<f8"):
            return np.frombuffer(raw, dtype=dt).astype(np.float64).reshape(shape)
        raise ValueError("unknown encoding")
    except (KeyError, TypeError, ValueError, binascii.Error, zlib.error):
        raise InvalidFileError(f"topology {name!r} is neither a matrix nor an encoded one "
                               f"(encoding codes or float64, shape, dtype, data)") from None


def model_links(model: GridPairs, kind: str | None = None) -> tuple[Link, ...]:
    """The physical links of a grid model, both directions (see
    :meth:`~shardplan.ir._pairs.GridPairs.link_pairs`), kind ``torus`` when any axis wraps,
    else ``mesh``. O(links)."""
    src, dst = model.link_pairs()
    kind = kind or ("torus" if any(model.wrap) else "mesh")
    bw, lat = model.link_bandwidth, model.hop_latency
    return tuple(Link(s, d, bw, lat, kind) for s, d in zip(src.tolist(), dst.tolist(),
                                                           strict=True))


def _matrix(name: str, value: Any, n: int) -> np.ndarray | PairMatrix:
    if isinstance(value, PairMatrix):
        if value.shape != (n, n):
            raise InvalidFileError(f"topology {name!r} matrix is {value.shape[0]}x"
                                   f"{value.shape[1]} but there are {n} devices")
        return value
    if isinstance(value, Mapping):
        value = decode_matrix(name, value)
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidFileError(f"topology {name!r} must be a numeric matrix") from None
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise InvalidFileError(f"topology {name!r} matrix is not square: shape {arr.shape}")
    if arr.shape[0] != n:
        raise InvalidFileError(f"topology {name!r} matrix is {arr.shape[0]}x{arr.shape[1]} but "
                               f"there are {n} devices")
    off = ~np.eye(n, dtype=bool)
    if not np.all(np.isfinite(arr[off])) or np.any(arr[off] < 0):
        raise InvalidFileError(f"topology {name!r} matrix has a negative or non-finite entry")
    arr = arr.copy()
    np.fill_diagonal(arr, 0.0)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class Topology:
    """Devices and the pairwise bandwidth (bytes/s) and latency (s) between them.

    ``bandwidth[i, j] == 0`` means no usable connection from i to j. Builders in
    :mod:`shardplan.topology` write *routed* matrices (every reachable pair has its end-to-end
    latency and bottleneck bandwidth) and, for multi-hop networks, the physical ``links``.

    Attributes
    ----------
    name : str
    devices : tuple of Device
    bandwidth, latency : ndarray or PairMatrix, shape (D, D)
        Dense matrices, or (builders' topologies) :class:`~shardplan.ir._pairs.PairMatrix`
        views of one pair model that compute the entries they are asked for: index them
        with the devices you use (``topology.latency[np.ix_(used, used)]``); whole-matrix
        uses build the dense matrix (see :mod:`shardplan.ir._pairs`).
    cost : ndarray, shape (D, D), or None
        The sharding-cost matrix M of paper 000 section 2.1; ``latency`` when absent.
    levels : tuple of Level
        Natural hierarchy, outermost first; each level's groups partition the devices.
    links : tuple of Link
        Physical links, when the network is multi-hop (empty otherwise).
    """

    name: str
    devices: tuple[Device, ...]
    bandwidth: np.ndarray
    latency: np.ndarray
    cost: np.ndarray | None = None
    levels: tuple[Level, ...] = ()
    links: tuple[Link, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.devices)
        if n == 0:
            raise InvalidFileError("a topology needs at least one device")
        object.__setattr__(self, "devices", tuple(self.devices))
        for i, d in enumerate(self.devices):
            for attr, kind in (("memory_bytes", "memory"), ("flops", "flops")):
                v = getattr(d, attr)
                try:  # a Python int beyond float64 (1e30 written as an integer) is no number
                    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and \
                        float(v) > 0 and math.isfinite(float(v))
                except OverflowError:
                    ok = False
                if not ok:
                    raise InvalidFileError(f"device {i} ({d.name!r}) needs a positive "
                                           f"{attr}, got {v!r}")
                try:
                    check_size(f"device {i} ({d.name!r}) {attr}", v, kind)
                except ShardplanError as exc:
                    raise InvalidFileError(str(exc)) from None
        names = [d.name for d in self.devices]
        if len(set(names)) != n:
            raise InvalidFileError("device names must be unique")
        object.__setattr__(self, "bandwidth", _matrix("bandwidth", self.bandwidth, n))
        object.__setattr__(self, "latency", _matrix("latency", self.latency, n))
        if self.cost is not None:
            object.__setattr__(self, "cost", _matrix("cost", self.cost, n))
        levels = tuple(self.levels)
        owners = []
        for lv in levels:
            flat = [d for g in lv.groups for d in g]
            if any(not isinstance(d, (int, np.integer)) or d < 0 or d >= n for d in flat):
                raise InvalidFileError(f"level {lv.name!r} names a device outside 0..{n - 1}")
            ids = np.fromiter(flat, dtype=np.int64, count=len(flat))
            if ids.size != n or np.bincount(ids, minlength=n).max(initial=0) != 1:
                raise InvalidFileError(f"level {lv.name!r} groups must partition the {n} "
                                       f"devices, each exactly once")
            owner = np.empty(n, dtype=np.int64)
            owner[ids] = np.repeat(np.arange(len(lv.groups)), [len(g) for g in lv.groups])
            owners.append(owner)
        for k in range(1, len(levels)):
            # every inner group lies in one outer group: its members' outer owners agree
            outer, inner = owners[k - 1], owners[k]
            lo = np.full(len(levels[k].groups), np.iinfo(np.int64).max)
            hi = np.full(len(levels[k].groups), -1)
            np.minimum.at(lo, inner, outer)
            np.maximum.at(hi, inner, outer)
            if np.any(lo != hi):
                raise InvalidFileError(f"level {levels[k].name!r} has a group that straddles "
                                       f"groups of level {levels[k - 1].name!r}")
        object.__setattr__(self, "levels", levels)
        links = tuple(self.links)
        for lk in links:
            if not (0 <= lk.src < n and 0 <= lk.dst < n) or lk.src == lk.dst:
                raise InvalidFileError(f"link {lk.src} -> {lk.dst} is not between two "
                                       f"distinct devices")
            if not lk.bandwidth > 0 or lk.latency < 0:
                raise InvalidFileError(f"link {lk.src} -> {lk.dst} needs positive bandwidth "
                                       f"and non-negative latency")
        object.__setattr__(self, "links", links)

    # ------------------------------------------------------------------ queries
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def __len__(self) -> int:
        return self.num_devices

    @property
    def pair_model(self) -> PairModel | None:
        """The model behind ``bandwidth`` and ``latency`` when both are computed on demand
        from one (builders' topologies), else None (dense matrices)."""
        bw, lat = self.bandwidth, self.latency
        if isinstance(bw, PairMatrix) and isinstance(lat, PairMatrix) and bw.model is lat.model:
            return bw.model
        return None

    @property
    def all_pairs_reachable(self) -> bool:
        """Whether every ordered pair of distinct devices has a positive bandwidth. O(1)
        for a pair model (they connect every pair), O(D^2) for dense matrices."""
        if self.pair_model is not None:
            return True
        n = self.num_devices
        return bool(n < 2 or (self.bandwidth + np.eye(n) > 0).all())

    def dense(self) -> Topology:
        """This topology with dense ``bandwidth`` and ``latency`` matrices (itself when they
        are dense already): the reference a pair model is tested against. O(D^2)."""
        if not isinstance(self.bandwidth, PairMatrix) and \
                not isinstance(self.latency, PairMatrix):
            return self
        return self.replace(bandwidth=np.array(self.bandwidth), latency=np.array(self.latency))

    @property
    def cost_matrix(self) -> np.ndarray:
        """The sharding-cost matrix M: ``cost`` if given, else ``latency``."""
        return self.latency if self.cost is None else self.cost

    @property
    def device_flops(self) -> np.ndarray:
        return np.array([d.flops for d in self.devices], dtype=np.float64)

    @property
    def device_memory(self) -> np.ndarray:
        return np.array([d.memory_bytes for d in self.devices], dtype=np.float64)

    @property
    def device_fp32_flops(self) -> np.ndarray:
        """Every device's fp32 rate without tensor cores (optional field ``fp32_flops``),
        its ``flops`` where absent, FLOP/s."""
        return np.array([float(d.extra.get("fp32_flops") or d.flops) for d in self.devices],
                        dtype=np.float64)

    @property
    def device_fp8_flops(self) -> np.ndarray:
        """Every device's dense fp8 tensor-core rate (optional field ``fp8_flops``), 0 where
        absent (no fp8), FLOP/s."""
        return np.array([float(d.extra.get("fp8_flops") or 0.0) for d in self.devices],
                        dtype=np.float64)

    @property
    def device_memory_bandwidth(self) -> np.ndarray:
        """Every device's memory bandwidth (optional field ``memory_bandwidth``), ``inf``
        where absent (no memory roof), bytes/s."""
        return np.array([float(d.extra.get("memory_bandwidth") or np.inf)
                         for d in self.devices], dtype=np.float64)

    def collective_curve(self, kind: str, group_size: int
                         ) -> tuple[np.ndarray, np.ndarray] | None:
        """A measured collective's ``(bytes, seconds)`` for a group of ``group_size``
        devices, from the optional ``collectives`` field (``{"allreduce": {"2": [[bytes,
        seconds], ...], ...}, "allgather": ...}``, written by ``topology measure``), sorted by
        bytes; None when not measured. ``bytes`` is the whole tensor (an all-gather's
        output, a reduce-scatter's input)."""
        table = self.meta.get("collectives")
        if not isinstance(table, Mapping):
            return None
        rows = (table.get(kind) or {}).get(str(int(group_size))) if isinstance(
            table.get(kind), Mapping) else None
        if not rows:
            return None
        try:
            arr = np.asarray(rows, dtype=np.float64).reshape(-1, 2)
        except (TypeError, ValueError):
            raise InvalidFileError(f"topology collectives {kind!r} for {group_size} devices "
                                   "must be [bytes, seconds] pairs") from None
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise InvalidFileError(f"topology collectives {kind!r} for {group_size} devices "
                                   "must be positive finite [bytes, seconds] pairs")
        arr = arr[np.argsort(arr[:, 0])]
        return arr[:, 0], arr[:, 1]

    def transfer_seconds(self, i: int, j: int, nbytes: float) -> float:
        """Seconds to send ``nbytes`` from device i to device j: latency + bytes / bandwidth.

        Zero on the same device; ``inf`` when j is unreachable from i.
        """
        if i == j or nbytes <= 0:
            return 0.0
        bw = self.bandwidth[i, j]
        if bw <= 0:
            return float("inf")
        return float(self.latency[i, j] + nbytes / bw)

    def connected_parts(self) -> list[np.ndarray]:
        """The devices grouped into parts that can exchange data: connected components of
        the graph that joins i and j when ``bandwidth`` is positive both ways (pipelines send
        activations one way and gradients back). The matrices are routed, so in a topology
        written by the builders every two devices of one part reach each other directly.

        Returns the parts, largest first (ties: the part with the lowest device id first),
        each an ascending array of device ids; one part when every device reaches every
        other. O(D^2).
        """
        n = self.num_devices
        if self.pair_model is not None:
            return [np.arange(n, dtype=np.int64)]
        ok = (self.bandwidth > 0) & (self.bandwidth.T > 0)
        np.fill_diagonal(ok, True)
        if ok.all():
            return [np.arange(n, dtype=np.int64)]
        import scipy.sparse as sp
        from scipy.sparse.csgraph import connected_components

        _, labels = connected_components(sp.csr_matrix(ok), directed=False)
        parts = [np.flatnonzero(labels == c) for c in np.unique(labels)]
        return sorted(parts, key=lambda p: (-p.size, int(p[0])))

    def bandwidth_classes(self, *, rel_tol: float = 1e-6) -> list[tuple[float, int]]:
        """Distinct off-diagonal bandwidths (ordered pairs counted), fastest first. O(D^2),
        O(levels) or O(grid size) with a pair model."""
        n = self.num_devices
        model = self.pair_model
        if model is not None:
            counted = model.classes("bandwidth")
        else:
            vals, counts = np.unique(self.bandwidth[~np.eye(n, dtype=bool)],
                                     return_counts=True)
            counted = list(zip(vals[::-1].tolist(), counts[::-1].tolist(), strict=True))
        classes: list[tuple[float, int]] = []
        for v, c in counted:
            if classes and abs(classes[-1][0] - v) <= rel_tol * max(abs(v), 1.0):
                classes[-1] = (classes[-1][0], classes[-1][1] + int(c))
            else:
                classes.append((v, int(c)))
        return classes

    def _latency_range(self) -> list[float]:
        n = self.num_devices
        if n < 2:
            return [0.0, 0.0]
        model = self.pair_model
        if model is not None:
            vals = [v for v, _ in model.classes("latency")]
            return [float(min(vals)), float(max(vals))]
        off = ~np.eye(n, dtype=bool)
        return [float(self.latency[off].min()), float(self.latency[off].max())]

    def __repr__(self) -> str:
        """One short line (the default dataclass repr prints the matrices)."""
        return (f"Topology(name={self.name!r}, devices={self.num_devices}, "
                f"levels={[lv.name for lv in self.levels]}, links={len(self.links)})")

    def summary(self) -> dict[str, Any]:
        n = self.num_devices
        model = self.pair_model
        unreachable = 0 if model is not None else int(
            np.sum(self.bandwidth[~np.eye(n, dtype=bool)] <= 0))
        out = {
            "kind": "topology",
            "name": self.name,
            "devices": n,
            "total_memory_bytes": float(self.device_memory.sum()),
            "total_flops": float(self.device_flops.sum()),
            "bandwidth_classes": [{"bandwidth": b, "pairs": c}
                                  for b, c in self.bandwidth_classes()],
            "latency_range": self._latency_range(),
            "levels": [{"name": lv.name, "groups": len(lv.groups)} for lv in self.levels],
            "links": len(self.links),
            "unreachable_pairs": unreachable,
        }
        if model is not None:
            out["pairs"] = model.kind
        return out

    # ------------------------------------------------------------------ JSON
    def to_dict(self, *, dense: bool | None = None) -> dict[str, Any]:
        """The file's JSON object. ``dense``: list the ``bandwidth`` and ``latency``
        matrices (True, the contract's form), or not (False: the generator form or compact
        matrices); default: lists up to :data:`DENSE_JSON_DEVICES` devices.
        A topology with a pair model always writes it (``pairs``); without the lists, a
        grid's ``links`` are left out too (``pairs`` implies them). Other matrices beyond
        the dense size are written compactly (:func:`encode_matrix`)."""
        n = self.num_devices
        lists = n <= DENSE_JSON_DEVICES if dense is None else bool(dense)
        model = self.pair_model
        out: dict[str, Any] = {
            "format": TOPOLOGY_FORMAT, "name": self.name,
            "devices": [d.to_dict() for d in self.devices],
        }
        if lists:
            out["bandwidth"] = np.asarray(self.bandwidth).tolist()
            out["latency"] = np.asarray(self.latency).tolist()
        elif model is None:
            out["bandwidth"] = encode_matrix(np.asarray(self.bandwidth))
            out["latency"] = encode_matrix(np.asarray(self.latency))
        if model is not None:
            out["pairs"] = model.to_dict()
        if self.cost is not None:
            out["cost"] = self.cost.tolist() if lists else encode_matrix(self.cost)
        if self.levels:
            out["levels"] = [lv.to_dict() for lv in self.levels]
        if self.links and (lists or not isinstance(model, GridPairs)):
            out["links"] = [lk.to_dict() for lk in self.links]
        for k, v in self.meta.items():
            out.setdefault(k, v)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        if not isinstance(data, Mapping):
            raise InvalidFileError("a topology must be a JSON object")
        if data.get("format") != TOPOLOGY_FORMAT:
            raise InvalidFileError(f"expected format {TOPOLOGY_FORMAT!r}, got "
                                   f"{data.get('format')!r}")
        raw = data.get("devices")
        if not isinstance(raw, list) or not raw:
            raise InvalidFileError("topology 'devices' must be a non-empty list")
        devices = []
        for i, d in enumerate(raw):
            if not isinstance(d, Mapping):
                raise InvalidFileError(f"device {i} is not an object")
            devices.append(Device(
                name=str(d.get("name", f"dev{i}")),
                memory_bytes=d.get("memory_bytes"),  # type: ignore[arg-type]  # Topology checks it
                flops=d.get("flops"),  # type: ignore[arg-type]  # Topology checks it
                extra={k: v for k, v in d.items() if k not in ("name", "memory_bytes", "flops")},
            ))
        n = len(devices)
        model = None
        if data.get("pairs") is not None:
            model = pair_model_from_dict(data["pairs"], n)
        for key in ("bandwidth", "latency"):
            if key not in data and model is None:
                raise InvalidFileError(f"topology lacks its {key!r} matrix")
        bw: Any = data.get("bandwidth")
        lat: Any = data.get("latency")
        if model is not None:
            mbw, mlat = model.matrix("bandwidth"), model.matrix("latency")
            if bw is None or lat is None:
                bw, lat = mbw, mlat
            else:  # both: the matrices are the contract; the model only if it agrees
                bw, lat = _matrix("bandwidth", bw, n), _matrix("latency", lat, n)
                if n <= DENSE_JSON_DEVICES and np.array_equal(cast(Any, mbw).dense(), bw) and \
                        np.array_equal(cast(Any, mlat).dense(), lat):
                    bw, lat = mbw, mlat
                else:
                    model = None
        levels = []
        for lv in data.get("levels", []) or []:
            if not isinstance(lv, Mapping) or not isinstance(lv.get("groups"), list):
                raise InvalidFileError("each topology level needs a 'groups' list")
            try:
                groups = tuple(tuple(int(x) for x in g) for g in lv["groups"])
            except (TypeError, ValueError):
                raise InvalidFileError(f"level {lv.get('name')!r} groups must be lists of "
                                       f"device ids") from None
            levels.append(Level(name=str(lv.get("name", "level")), groups=groups))
        links = []
        if isinstance(model, GridPairs) and "links" not in data:
            links = list(model_links(model))
        for lk in data.get("links", []) or []:
            try:
                links.append(Link(int(lk["src"]), int(lk["dst"]), float(lk["bandwidth"]),
                                  float(lk.get("latency", 0.0)), str(lk.get("kind", ""))))
            except (KeyError, TypeError, ValueError):
                raise InvalidFileError("each topology link needs src, dst and bandwidth") \
                    from None
        known = {"format", "name", "devices", "bandwidth", "latency", "cost", "levels", "links",
                 "pairs"}
        return cls(name=str(data.get("name", "topology")), devices=tuple(devices),
                   bandwidth=bw, latency=lat, cost=data.get("cost"),
                   levels=tuple(levels), links=tuple(links),
                   meta={k: v for k, v in data.items() if k not in known})

    def replace(self, **changes: Any) -> Topology:
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        fields.update(changes)
        return Topology(**fields)

