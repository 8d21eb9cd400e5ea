"""Pair values of generated topologies, computed on demand from their structure.

A topology of D devices is D x D bandwidths and latencies; a dense float64 pair of matrices
needs 16 D^2 bytes (74.5 GiB at D = 10^5). The builders' topologies have structure that
gives any pair's values in O(1) from the two device ids:

- :class:`LevelPairs` (kind ``levels``): devices numbered row-major over a ``shape``
  (outermost level first); a pair's values are those of the outermost level where the two
  devices' coordinates differ, the innermost level optionally a table indexed by the
  innermost coordinates (the NVLink / PCIe classes inside a DGX-1 box). Flat topologies are
  one level, hierarchical ones one per entry of their shape, DGX-1 clusters ``(boxes, 8)``.
- :class:`GridPairs` (kind ``grid``): meshes and tori; a pair's latency is its hop count
  times the per-hop latency (summed hop by hop, as routing accumulates it), its bandwidth
  the link bandwidth; routes are dimension-ordered (:meth:`GridPairs.next_hop`).

:class:`PairMatrix` is a read-only D x D matrix backed by such a model: indexing it (``m[i,
j]``, ``m[rows, cols]``, ``m[np.ix_(a, b)]``, slices) computes only the entries asked for,
with NumPy's indexing semantics, so code that takes the sub-matrices of the devices it uses
works at any D. Whole-matrix uses (``np.asarray(m)``, arithmetic, comparisons) build the
dense matrix: at once and kept for D <= :data:`EAGER_DEVICES` (where it is cheap and makes
every later lookup a plain array lookup), on demand and kept up to :data:`CACHE_BYTES`,
refused with one line above :data:`MAX_DENSE_BYTES`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from shardplan.errors import InvalidFileError, ShardplanError

__all__ = ["CACHE_BYTES", "EAGER_DEVICES", "MAX_DENSE_BYTES", "GridPairs", "LevelPairs",
           "PairMatrix", "PairModel", "pair_model_from_dict"]

#: Up to this many devices the dense matrices are built on first use and kept (8 MiB each).
EAGER_DEVICES = 1024
#: A dense matrix built for a whole-matrix use is kept up to this size (4096 devices).
CACHE_BYTES = 128 * 2**20
#: Largest dense matrix built at all (16384 devices); beyond it only indexing works.
MAX_DENSE_BYTES = 2 * 2**30

_WHICH = ("bandwidth", "latency", "next_hop", "hops", "inverse_bandwidth")


class PairModel:
    """The structure that gives every device pair its values (see the module docstring).

    Subclasses set ``kind`` and ``num_devices`` and implement :meth:`values`,
    :meth:`classes` and :meth:`to_dict`. Every model here connects every pair of devices.
    """

    kind = ""
    num_devices = 0
    symmetric = True

    def values(self, which: str, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """``which`` (``bandwidth`` or ``latency``) of the pairs ``(rows, cols)`` (int arrays
        that broadcast together); 0 on the diagonal."""
        raise NotImplementedError

    def classes(self, which: str) -> list[tuple[float, int]]:
        """The distinct off-diagonal values of ``which`` with how many ordered pairs have
        each, largest value first. O(levels) or O(grid axes x size)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def matrix(self, which: str) -> np.ndarray:
        """The read-only D x D matrix ``which`` (``bandwidth``, ``latency``,
        ``inverse_bandwidth``) as a :class:`PairMatrix`, typed as the ndarray whose
        read-only interface it provides (topologies hold either)."""
        return cast(np.ndarray, PairMatrix(self, which))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and _plain(self.to_dict()) == _plain(other.to_dict())

    def __hash__(self) -> int:
        return hash((self.kind, self.num_devices))


def _plain(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _plain(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_plain(v) for v in d]
    return d


def _number(name: str, v: Any, *, zero_ok: bool) -> float:
    """``v`` as a finite float, positive (or >= 0 with ``zero_ok``), else one line."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InvalidFileError(f"topology pairs {name} must be a number, got {v!r}") from None
    if not ((x >= 0 if zero_ok else x > 0) and math.isfinite(x)):
        what = ">= 0" if zero_ok else "positive"
        raise InvalidFileError(f"topology pairs {name} must be {what} and finite, got {v!r}")
    return x


def _shape(data: Any, num_devices: int | None) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in data)
        ok = bool(dims) and all(float(x) == int(x) for x in data)
    except (TypeError, ValueError):
        raise InvalidFileError(f"topology pairs shape must be a list of positive integers, "
                               f"got {data!r}") from None
    if not ok or any(d < 1 for d in dims):
        raise InvalidFileError(f"topology pairs shape must be a list of positive integers, "
                               f"got {data!r}")
    if num_devices is not None and math.prod(dims) != num_devices:
        raise InvalidFileError(f"topology pairs shape {'x'.join(map(str, dims))} has "
                               f"{math.prod(dims)} devices, the topology {num_devices}")
    return dims


def _merge_classes(pairs: Sequence[tuple[float, int]], rel_tol: float = 0.0
                   ) -> list[tuple[float, int]]:
    """Sum the counts of equal values; largest value first; zero counts dropped."""
    acc: dict[float, int] = {}
    for v, c in pairs:
        if c > 0:
            acc[float(v)] = acc.get(float(v), 0) + int(c)
    return sorted(acc.items(), key=lambda vc: -vc[0])


class LevelPairs(PairModel):
    """Devices in nested groups, one link class per level (kind ``levels``).

    Parameters
    ----------
    shape : sequence of int
        Group sizes, outermost first; devices are numbered row-major (the last coordinate
        varies fastest), so the devices of an innermost group are consecutive.
    bandwidth, latency : sequence
        One entry per level: a number for the pairs whose coordinates first differ at that
        level; the last entry may instead be a ``shape[-1] x shape[-1]`` table indexed by
        the two innermost coordinates (its diagonal is unused).

    Notes
    -----
    A pair's level is found with one integer division per level: O(L) NumPy work per query
    array. The dense matrix (:meth:`dense`) is the same lookup on every pair.
    """

    kind = "levels"

    def __init__(self, shape: Sequence[int], bandwidth: Sequence[Any],
                 latency: Sequence[Any]) -> None:
        self.shape = _shape(shape, None)
        depth = len(self.shape)
        self.num_devices = math.prod(self.shape)
        self.strides = tuple(math.prod(self.shape[k + 1:]) for k in range(depth))
        self.tables: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for which, vals, zero_ok in (("bandwidth", bandwidth, False),
                                     ("latency", latency, True)):
            vals = list(vals) if isinstance(vals, (list, tuple, np.ndarray)) else [vals]
            if len(vals) != depth:
                raise InvalidFileError(f"topology pairs {which} needs {depth} entries (one "
                                       f"per level of the shape), got {len(vals)}")
            inner = None
            last = vals[-1]
            if isinstance(last, (list, tuple, np.ndarray)):
                b = self.shape[-1]
                try:
                    inner = np.array(last, dtype=np.float64)
                except (TypeError, ValueError):
                    raise InvalidFileError(f"topology pairs {which} table must be numeric") \
                        from None
                if inner.shape != (b, b):
                    raise InvalidFileError(f"topology pairs {which} table must be {b} x {b}, "
                                           f"got shape {inner.shape}")
                off = ~np.eye(b, dtype=bool)
                for x in inner[off].tolist():
                    _number(which, x, zero_ok=zero_ok)
                inner = inner.copy()
                np.fill_diagonal(inner, 0.0)
                inner.setflags(write=False)
                level_vals = [_number(which, v, zero_ok=zero_ok) for v in vals[:-1]] + [0.0]
            else:
                level_vals = [_number(which, v, zero_ok=zero_ok) for v in vals]
            self.tables[which] = (np.array(level_vals, dtype=np.float64), inner)

    def values(self, which: str, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        per_level, inner = self.tables[which]
        i, j = np.broadcast_arrays(np.asarray(rows, dtype=np.int64),
                                   np.asarray(cols, dtype=np.int64))
        depth = len(self.shape)
        level = np.full(i.shape, depth - 1, dtype=np.int64)
        for k in range(depth - 2, -1, -1):
            s = self.strides[k]
            level[(i // s) != (j // s)] = k
        out = per_level[level]
        if inner is not None:
            b = self.shape[-1]
            innermost = level == depth - 1
            out = np.where(innermost, inner[i % b, j % b], out)
        return np.where(i == j, 0.0, out)

    def classes(self, which: str) -> list[tuple[float, int]]:
        per_level, inner = self.tables[which]
        d = self.num_devices
        depth = len(self.shape)
        pairs: list[tuple[float, int]] = []
        for k in range(depth):
            outer = d if k == 0 else self.strides[k - 1]
            count = d * (outer - self.strides[k])  # ordered pairs first differing at k
            if k == depth - 1 and inner is not None:
                b = self.shape[-1]
                off = ~np.eye(b, dtype=bool)
                groups = d // b
                pairs += [(v, groups) for v in inner[off].tolist()]
            else:
                pairs.append((float(per_level[k]), count))
        return _merge_classes(pairs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "shape": list(self.shape)}
        for which in ("bandwidth", "latency"):
            per_level, inner = self.tables[which]
            vals: list[Any] = per_level.tolist()
            if inner is not None:
                vals[-1] = inner.tolist()
            out[which] = vals
        return out


class GridPairs(PairModel):
    """A mesh or torus of equal links (kind ``grid``).

    Parameters
    ----------
    shape : sequence of int
        Sizes of the axes; devices are numbered row-major.
    wrap : bool or sequence of bool
        Per axis (or for all): a ring (torus) rather than a line (mesh).
    link_bandwidth : float
        Bytes/s of every link; a pair's bottleneck bandwidth.
    hop_latency : float
        Seconds per link crossed.

    Notes
    -----
    Hops between two devices: the sum over axes of ``|a - b|`` (line) or ``min(|a - b|,
    n - |a - b|)`` (ring). Latency: ``hop_latency`` added once per hop in the order a route
    accumulates it (so it equals, to the bit, the latency :func:`shardplan.topology.route`
    sums over the links). Routes are dimension-ordered: along axis 0 first, then 1, ...; on
    a ring the shorter way round, forwards on a tie.
    """

    kind = "grid"

    def __init__(self, shape: Sequence[int], wrap: bool | Sequence[bool],
                 link_bandwidth: float, hop_latency: float) -> None:
        self.shape = _shape(shape, None)
        if isinstance(wrap, (bool, np.bool_)):
            wraps = (bool(wrap),) * len(self.shape)
        else:
            try:
                wraps = tuple(bool(w) for w in wrap)
            except TypeError:
                raise InvalidFileError("topology pairs wrap must be true, false or one per "
                                       "axis") from None
            if len(wraps) != len(self.shape) or not all(isinstance(w, (bool, np.bool_))
                                                        for w in wrap):
                raise InvalidFileError("topology pairs wrap must be true, false or one per "
                                       "axis")
        self.wrap = wraps
        self.link_bandwidth = _number("link_bandwidth", link_bandwidth, zero_ok=False)
        self.hop_latency = _number("hop_latency", hop_latency, zero_ok=True)
        self.num_devices = math.prod(self.shape)
        self.strides = tuple(math.prod(self.shape[k + 1:]) for k in range(len(self.shape)))
        most = sum((n // 2) if w else (n - 1) for n, w in zip(self.shape, self.wrap,
                                                                 strict=True))
        acc = [0.0]
        for _ in range(most):
            acc.append(self.hop_latency + acc[-1])  # h + (h + ...): a route's own sum
        self._lat_of_hops = np.array(acc, dtype=np.float64)

    def _axis_delta(self, i: np.ndarray, j: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
        n = self.shape[k]
        ci = (i // self.strides[k]) % n
        cj = (j // self.strides[k]) % n
        d = cj - ci
        if self.wrap[k]:
            fwd = d % n
            dist = np.minimum(fwd, n - fwd)
            step = np.where(fwd == 0, 0, np.where(fwd <= n - fwd, 1, -1))
        else:
            dist = np.abs(d)
            step = np.sign(d)
        return ci, dist, step

    def hops(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        i, j = np.broadcast_arrays(np.asarray(rows, dtype=np.int64),
                                   np.asarray(cols, dtype=np.int64))
        total = np.zeros(i.shape, dtype=np.int64)
        for k in range(len(self.shape)):
            total += self._axis_delta(i, j, k)[1]
        return total

    def next_hop(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """The device after ``rows`` on the dimension-ordered route to ``cols`` (-1 on the
        diagonal)."""
        i, j = np.broadcast_arrays(np.asarray(rows, dtype=np.int64),
                                   np.asarray(cols, dtype=np.int64))
        out = np.full(i.shape, -1, dtype=np.int64)
        todo = i != j
        for k in range(len(self.shape)):
            ci, _, step = self._axis_delta(i, j, k)
            here = todo & (step != 0)
            n = self.shape[k]
            moved = i + (((ci + step) % n) - ci) * self.strides[k]
            out = np.where(here, moved, out)
            todo = todo & ~here
        return out

    def link_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` of both directions of every link between grid neighbours: per axis
        the forward neighbours, then (rings) the wrap-around links, each as ``(a, b)`` then
        ``(b, a)``. A ring of 2 would duplicate its mesh link, so it has none. O(D x axes)."""
        ids = np.arange(self.num_devices).reshape(self.shape)
        pairs_a: list[np.ndarray] = []
        pairs_b: list[np.ndarray] = []
        for axis, size in enumerate(self.shape):
            if size < 2:
                continue
            pairs_a.append(ids.take(np.arange(size - 1), axis=axis).ravel())
            pairs_b.append(ids.take(np.arange(1, size), axis=axis).ravel())
            if self.wrap[axis] and size > 2:
                pairs_a.append(ids.take([size - 1], axis=axis).ravel())
                pairs_b.append(ids.take([0], axis=axis).ravel())
        if not pairs_a:
            e = np.zeros(0, dtype=np.int64)
            return e, e
        a, b = np.concatenate(pairs_a), np.concatenate(pairs_b)
        src = np.stack((a, b), axis=1).ravel()
        dst = np.stack((b, a), axis=1).ravel()
        return src, dst

    def path(self, i: int, j: int) -> list[int]:
        """Devices on the dimension-ordered route from i to j (both included). O(hops)."""
        out = [int(i)]
        cur = int(i)
        for k, n in enumerate(self.shape):
            s = self.strides[k]
            ci, cj = (cur // s) % n, (int(j) // s) % n
            if ci == cj:
                continue
            fwd = (cj - ci) % n
            if self.wrap[k]:
                step, count = (1, fwd) if fwd <= n - fwd else (-1, n - fwd)
            else:
                step, count = (1, cj - ci) if cj > ci else (-1, ci - cj)
            for _ in range(count):
                c = (cur // s) % n
                cur += (((c + step) % n) - c) * s
                out.append(cur)
        return out

    def values(self, which: str, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        i, j = np.broadcast_arrays(np.asarray(rows, dtype=np.int64),
                                   np.asarray(cols, dtype=np.int64))
        if which == "next_hop":
            return self.next_hop(i, j)
        h = self.hops(i, j)
        if which == "hops":
            return h
        if which == "latency":
            return self._lat_of_hops[h]
        return np.where(i == j, 0.0, self.link_bandwidth)

    def _hop_counts(self) -> np.ndarray:
        """How many ordered pairs are h hops apart, for h = 0.. (a convolution over axes)."""
        counts = np.ones(1, dtype=np.int64)
        for n, w in zip(self.shape, self.wrap, strict=True):
            axis = np.zeros(n, dtype=np.int64)  # ordered pairs on this axis at distance t
            a = np.arange(n)
            dist = np.abs(a[:, None] - a[None, :])
            if w:
                dist = np.minimum(dist, n - dist)
            np.add.at(axis, dist.ravel(), 1)
            counts = np.convolve(counts, axis)
        return counts

    def classes(self, which: str) -> list[tuple[float, int]]:
        counts = self._hop_counts()
        if which == "bandwidth":
            return _merge_classes([(self.link_bandwidth, int(counts[1:].sum()))])
        return _merge_classes([(float(self._lat_of_hops[h]), int(c))
                               for h, c in enumerate(counts.tolist()) if h > 0 and c > 0])

    def to_dict(self) -> dict[str, Any]:
        wrap: Any = self.wrap[0] if len(set(self.wrap)) == 1 else list(self.wrap)
        return {"kind": self.kind, "shape": list(self.shape), "wrap": wrap,
                "link_bandwidth": self.link_bandwidth, "hop_latency": self.hop_latency}


def pair_model_from_dict(data: Any, num_devices: int) -> PairModel:
    """The model of a topology file's ``pairs`` field; :class:`InvalidFileError` when it is
    malformed or does not describe ``num_devices`` devices."""
    if not isinstance(data, Mapping):
        raise InvalidFileError("topology 'pairs' must be an object")
    kind = data.get("kind")
    shape = _shape(data.get("shape"), num_devices)
    if kind == "levels":
        for key in ("bandwidth", "latency"):
            if not isinstance(data.get(key), list):
                raise InvalidFileError(f"topology pairs of kind levels need a {key!r} list")
        return LevelPairs(shape, data["bandwidth"], data["latency"])
    if kind == "grid":
        for key in ("link_bandwidth", "hop_latency", "wrap"):
            if key not in data:
                raise InvalidFileError(f"topology pairs of kind grid need {key!r}")
        return GridPairs(shape, data["wrap"], data["link_bandwidth"], data["hop_latency"])
    raise InvalidFileError(f"unknown topology pairs kind {kind!r} (levels or grid)")


# ---------------------------------------------------------------------- the matrix
def _component(c: Any, n: int) -> tuple[str, Any]:
    if isinstance(c, slice):
        return "slice", np.arange(n)[c]
    if isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)):
        x = int(c)
        if not -n <= x < n:
            raise IndexError(f"index {x} is out of bounds for axis of size {n}")
        return "int", x + n if x < 0 else x
    arr = np.asarray(c)
    if arr.dtype == bool:
        if arr.ndim != 1 or arr.size != n:
            raise IndexError(f"boolean index of shape {arr.shape} does not match {n}")
        return "array", np.flatnonzero(arr)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise IndexError("only integers, slices and integer or boolean arrays are valid "
                         "indices")
    arr = arr.astype(np.int64)
    if arr.size and (int(arr.min()) < -n or int(arr.max()) >= n):
        raise IndexError(f"index out of bounds for axis of size {n}")
    return "array", np.where(arr < 0, arr + n, arr)


class PairMatrix(NDArrayOperatorsMixin):
    """A read-only ``D x D`` matrix of one quantity of a :class:`PairModel` (see the module
    docstring): indexing computes what it asks for, whole-matrix uses build the dense
    matrix (kept when small enough)."""

    __array_priority__ = 20.0

    def __init__(self, model: PairModel, which: str) -> None:
        if which not in _WHICH:
            raise ValueError(f"unknown pair quantity {which!r}")
        self.model = model
        self.which = which
        self._dense: np.ndarray | None = None

    def __reduce__(self) -> tuple[Any, ...]:  # pickles without the dense cache
        return (PairMatrix, (self.model, self.which))

    # -- array protocol
    @property
    def shape(self) -> tuple[int, int]:
        n = self.model.num_devices
        return (n, n)

    ndim = 2

    @property
    def size(self) -> int:
        return self.model.num_devices ** 2

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int64 if self.which in ("next_hop", "hops") else np.float64)

    def __len__(self) -> int:
        return self.model.num_devices

    def __repr__(self) -> str:
        n = self.model.num_devices
        return f"PairMatrix({self.which}, {self.model.kind}, {n}x{n})"

    def _values(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        if self.which != "inverse_bandwidth":
            return self.model.values(self.which, rows, cols)
        bw = self.model.values("bandwidth", rows, cols)  # every pair connected: > 0 off it
        with np.errstate(divide="ignore"):
            return np.where(bw > 0, 1.0 / np.where(bw > 0, bw, 1.0), 0.0)

    def _cached(self) -> np.ndarray | None:
        if self._dense is None and self.model.num_devices <= EAGER_DEVICES:
            self._dense = self._build()
        return self._dense

    def _build(self) -> np.ndarray:
        n = self.model.num_devices
        need = n * n * self.dtype.itemsize
        if need > MAX_DENSE_BYTES:
            raise ShardplanError(
                f"this needs the whole {n} x {n} {self.which} matrix ({need / 2**30:.3g} GiB); "
                f"a topology of more than {int(math.isqrt(MAX_DENSE_BYTES // 8))} devices is "
                f"kept in its generator form: plan on a part of it")
        ids = np.arange(n, dtype=np.int64)
        out = np.empty((n, n), dtype=self.dtype)
        block = max(1, (1 << 22) // max(n, 1))  # rows at a time: bounded temporaries
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            out[lo:hi] = self._values(ids[lo:hi, None], ids[None, :])
        out.setflags(write=False)
        return out

    def dense(self) -> np.ndarray:
        """The whole matrix as a read-only ndarray (kept when at most :data:`CACHE_BYTES`);
        :class:`ShardplanError` above :data:`MAX_DENSE_BYTES`. O(D^2)."""
        cached = self._cached()
        if cached is not None:
            return cached
        out = self._build()
        if out.nbytes <= CACHE_BYTES:
            self._dense = out
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.dense()
        if dtype is not None and np.dtype(dtype) != out.dtype:
            return out.astype(dtype)
        return out.copy() if copy else out

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        args = [np.asarray(x) if isinstance(x, PairMatrix) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(x) if isinstance(x, PairMatrix) else x
                                  for x in kwargs["out"])
        return getattr(ufunc, method)(*args, **kwargs)

    # -- indexing
    def __getitem__(self, key: Any) -> Any:
        cached = self._cached()
        if cached is not None:
            return cached[key]
        n = self.model.num_devices
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) == 1:
            k0 = np.asarray(key[0]) if not isinstance(key[0], slice) else None
            if k0 is not None and k0.dtype == bool and k0.ndim == 2:
                return self.dense()[k0]
            key = (key[0], slice(None))
        if len(key) != 2:
            raise IndexError(f"too many indices for a 2-dimensional matrix: {len(key)}")
        (kr, r), (kc, c) = _component(key[0], n), _component(key[1], n)
        if kr != "slice" and kc != "slice":
            out = self._values(np.asarray(r), np.asarray(c))
            return out[()] if kr == "int" and kc == "int" else out
        if kr == "slice" and kc == "slice":
            return self._values(r[:, None], c[None, :])
        if kr == "slice":  # rows a slice, columns an int or array
            c = np.asarray(c)
            return self._values(r.reshape((-1,) + (1,) * c.ndim), c[None])
        r = np.asarray(r)
        return self._values(r[..., None], c)

    # -- the few ndarray methods the planners call on topology matrices
    @property
    def T(self) -> Any:  # noqa: N802 - the ndarray name
        return self if self.model.symmetric else self.dense().T

    def copy(self) -> np.ndarray:
        return np.array(self.dense())

    def tolist(self) -> list[Any]:
        return self.dense().tolist()

    def astype(self, dtype: Any, copy: bool = True) -> np.ndarray:
        return self.dense().astype(dtype, copy=copy)

    def _extreme(self, largest: bool, axis: Any, kwargs: Mapping[str, Any]) -> Any:
        if axis is not None or kwargs.get("out") is not None or self.which not in (
                "bandwidth", "latency"):
            arr = self.dense()
            return arr.max(axis=axis, **kwargs) if largest else arr.min(axis=axis, **kwargs)
        vals = [v for v, _ in self.model.classes(self.which)]
        if self.model.num_devices > 0:
            vals.append(0.0)  # the diagonal
        if "initial" in kwargs:
            vals.append(float(kwargs["initial"]))
        return np.float64(max(vals) if largest else min(vals))

    def max(self, axis: Any = None, **kwargs: Any) -> Any:
        return self._extreme(True, axis, kwargs)

    def min(self, axis: Any = None, **kwargs: Any) -> Any:
        return self._extreme(False, axis, kwargs)
