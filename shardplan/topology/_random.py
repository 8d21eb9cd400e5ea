"""Parmesan's random heterogeneous topologies: random_blk_1, random_blk_2, uniform_dist.

Paper 002 (section 7, table 2) evaluates device mapping on three randomly generated "fully
heterogeneous" topologies and defers their definition to its appendix I, which is not in our
text. Its words are: "randomly generate three kinds of fully heterogeneous topologies, named
random_blk_1, random_blk_2 and uniform_dist", used at 64, 256 and 512 devices. We read the names
as *block-structured random bandwidths* with one and two levels of blocks, and *uniformly
distributed bandwidths*, and define them precisely below. All three are symmetric, every pair
is directly connected (no links, no routing), and the whole topology is a function of
``(num_devices, options, seed)`` through :func:`shardplan._rng.make_rng`.

Draw order (part of the definition: same inputs, same file):

1. ``random_blk_*`` only: ``perm = rng.permutation(D)``; position t of ``perm`` holds device
   ``perm[t]``, and positions are cut into consecutive blocks, so device ids do not follow
   blocks.
2. Bandwidths of every class, outermost class first, each drawn as one
   ``rng.uniform(lo, hi, size=count)`` call: for a between-blocks class one value per
   unordered pair of blocks that share their parent block, in row-major upper-triangle order
   of block ids; for the innermost class one value per block, in block order; for
   ``uniform_dist`` one value per unordered device pair, row-major upper triangle.
3. Latencies, in the same order and shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardplan._rng import make_rng
from shardplan.errors import ShardplanError
from shardplan.ir.topology import Level, Topology
from shardplan.topology._devices import (
    check_count,
    check_dense_size,
    check_range,
    generator_meta,
    make_devices,
)

__all__ = ["random_blk_1", "random_blk_2", "uniform_dist"]

Range = tuple[float, float]

#: Default ranges, outermost class first (bytes/s and seconds).
UNIFORM_BANDWIDTH: tuple[Range, ...] = ((1e9, 1e11),)
UNIFORM_LATENCY: tuple[Range, ...] = ((1e-6, 5e-5),)
BLK1_BANDWIDTH: tuple[Range, ...] = ((1e9, 1e10), (5e10, 1e11))
BLK1_LATENCY: tuple[Range, ...] = ((1e-5, 5e-5), (1e-6, 5e-6))
BLK2_BANDWIDTH: tuple[Range, ...] = ((1e9, 1e10), (1e10, 5e10), (5e10, 1e11))
BLK2_LATENCY: tuple[Range, ...] = ((1e-5, 5e-5), (5e-6, 1e-5), (1e-6, 5e-6))


def _ranges(name: str, value: Sequence[Sequence[float]] | Sequence[float], count: int
            ) -> tuple[Range, ...]:
    """``count`` (lo, hi) ranges, from pairs or from a flat ``lo, hi, lo, hi`` list."""
    want = (f"{name} needs {count} (low, high) range{'s' if count > 1 else ''}, outermost "
            f"first")
    try:
        items = tuple(value)
    except TypeError:
        raise ShardplanError(f"{want}, got {value!r}") from None
    if items and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        if len(items) != 2 * count:
            raise ShardplanError(f"{want}: {2 * count} numbers, got {len(items)}")
        items = tuple(zip(items[::2], items[1::2], strict=True))
    if len(items) != count:
        raise ShardplanError(f"{want}, got {len(items)}")
    return tuple(check_range(name, r) for r in items)


def _make_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    try:
        return make_rng(seed)
    except ValueError as exc:
        raise ShardplanError(str(exc)) from None


def _seed_label(seed: int | np.random.Generator | None) -> int | None:
    """The seed as written to the file (``None`` means 0; a Generator is not recorded)."""
    if seed is None:
        return 0
    return None if isinstance(seed, np.random.Generator) else int(seed)


def _symmetric(n: int, upper: np.ndarray) -> np.ndarray:
    m = np.zeros((n, n))
    iu = np.triu_indices(n, 1)
    m[iu] = upper
    return m + m.T


def _nested(rng: np.random.Generator, n: int, sizes: Sequence[int], ranges: Sequence[Range]
            ) -> np.ndarray:
    """Values between *positions* ``0..n-1`` cut into nested blocks of ``sizes``.

    ``sizes`` go from the outermost block size to the innermost, each dividing the one before
    (``(16, 4)``). Class k < len(sizes) holds the pairs in different size-``sizes[k]`` blocks
    of the same size-``sizes[k-1]`` block (the whole set for k = 0); one value is drawn from
    ``ranges[k]`` per unordered pair of such blocks, in row-major upper-triangle order of
    block ids. The last class holds the pairs inside one innermost block; one value per
    innermost block, in block order.
    """
    depth = len(sizes)
    pos = np.arange(n)
    out = np.zeros((n, n))
    assigned = np.eye(n, dtype=bool)
    for k in range(depth):
        blk = pos // sizes[k]
        parent = pos // sizes[k - 1] if k else np.zeros(n, dtype=np.int64)
        nblk = n // sizes[k]
        bi, bj = np.triu_indices(nblk, 1)
        per_parent = (sizes[k - 1] if k else n) // sizes[k]
        keep = bi // per_parent == bj // per_parent
        bi, bj = bi[keep], bj[keep]
        table = np.zeros((nblk, nblk))
        table[bi, bj] = table[bj, bi] = rng.uniform(*ranges[k], size=bi.size)
        sel = (blk[:, None] != blk[None, :]) & (parent[:, None] == parent[None, :])
        out[sel] = table[blk[:, None], blk[None, :]][sel]
        assigned |= sel
    blk = pos // sizes[-1]
    vals = rng.uniform(*ranges[depth], size=n // sizes[-1])
    sel = ~assigned
    assert np.all((blk[:, None] == blk[None, :])[sel])
    out[sel] = np.broadcast_to(vals[blk][:, None], (n, n))[sel]
    np.fill_diagonal(out, 0.0)
    return out


def _place(perm: np.ndarray, by_position: np.ndarray) -> np.ndarray:
    """Device matrix from a position matrix: device ``perm[p]`` sits at position p."""
    out = np.empty_like(by_position)
    out[np.ix_(perm, perm)] = by_position
    return out


def _block_topology(kind: str, num_devices: int, sizes: tuple[int, ...],
                    level_names: tuple[str, ...], bandwidth: Sequence[Range],
                    latency: Sequence[Range], seed: int | None, device: str,
                    memory_bytes: float | None, flops: float | None, name: str | None
                    ) -> Topology:
    n = num_devices
    classes = len(sizes) + 1
    bws = _ranges("bandwidth", bandwidth, classes)
    lats = _ranges("latency", latency, classes)
    rng = _make_rng(seed)
    perm = rng.permutation(n)
    bw = _place(perm, _nested(rng, n, sizes, bws))
    lat = _place(perm, _nested(rng, n, sizes, lats))
    levels = tuple(
        Level(name=lv, groups=tuple(tuple(sorted(perm[b * size:(b + 1) * size].tolist()))
                                    for b in range(n // size)))
        for lv, size in zip(level_names, sizes, strict=True)
    )
    opts = {"num_devices": n, **dict(zip(("block_size", "super_block_size")[:len(sizes)],
                                         reversed(sizes), strict=True))}
    return Topology(
        name=name or f"{kind}-{n}-s{_seed_label(seed)}",
        devices=make_devices([f"gpu{i}" for i in range(n)], device, memory_bytes, flops),
        bandwidth=bw, latency=lat, levels=levels,
        meta=generator_meta(kind, **opts, bandwidth=bws, latency=lats, seed=_seed_label(seed)),
    )


def random_blk_1(num_devices: int, *, seed: int | None = 0, block_size: int = 4,
                 bandwidth: Sequence[Range] = BLK1_BANDWIDTH,
                 latency: Sequence[Range] = BLK1_LATENCY, device: str = "v100",
                 memory_bytes: float | None = None, flops: float | None = None,
                 name: str | None = None) -> Topology:
    """Parmesan's ``random_blk_1``: random blocks of fast devices, slow random links between.

    Definition (ours; paper 002's appendix I is not in our text): the D devices are randomly
    permuted and cut into D / b blocks of ``block_size`` b. Each block draws one bandwidth
    from the intra range (``bandwidth[1]``, default U[5e10, 1e11] B/s) shared by all pairs
    inside it; each unordered pair of blocks draws one bandwidth from the inter range
    (``bandwidth[0]``, default U[1e9, 1e10]) shared by all pairs across them. Latencies are
    drawn the same way (defaults U[1e-5, 5e-5] s across blocks, U[1e-6, 5e-6] s inside). So
    the matrix is block-constant, but in device-id order the blocks are scattered.

    Parameters
    ----------
    num_devices : int
        D, a multiple of ``block_size``.
    seed : int, optional
        Same seed, same topology (see module docstring for the draw order).
    block_size : int
        b >= 1 (default 4).
    bandwidth, latency : sequence of two (low, high) ranges
        Outermost class first: ``[inter-block, intra-block]``.
    device, memory_bytes, flops, name
        As in :func:`flat`.

    Returns
    -------
    Topology
        Devices ``gpu0..``; one level ``block`` with the (sorted) device ids of each block.

    Notes
    -----
    O(D^2). The blocks are written as ``levels`` because they are the truth about the
    machine; a mapper that ignores levels sees a "fully heterogeneous" matrix.
    """
    n = check_count("num_devices", num_devices)
    check_dense_size("random", n)
    b = check_count("block_size", block_size)
    if n % b:
        raise ShardplanError(f"random-blk-1 needs num_devices ({n}) to be a multiple of "
                             f"block_size ({b})")
    return _block_topology("random-blk-1", n, (b,), ("block",), bandwidth, latency, seed,
                           device, memory_bytes, flops, name)


def random_blk_2(num_devices: int, *, seed: int | None = 0, block_size: int = 4,
                 super_block_size: int = 16, bandwidth: Sequence[Range] = BLK2_BANDWIDTH,
                 latency: Sequence[Range] = BLK2_LATENCY, device: str = "v100",
                 memory_bytes: float | None = None, flops: float | None = None,
                 name: str | None = None) -> Topology:
    """Parmesan's ``random_blk_2``: two nested levels of random blocks, three link classes.

    Definition (ours; paper 002's appendix I is not in our text): the D devices are randomly
    permuted and cut into super-blocks of ``super_block_size`` S, each cut into blocks of
    ``block_size`` b. Three classes, outermost first: pairs in different super-blocks share
    one value per unordered pair of super-blocks (default U[1e9, 1e10] B/s, U[1e-5, 5e-5] s);
    pairs in different blocks of the same super-block share one value per unordered pair of
    blocks (default U[1e10, 5e10] B/s, U[5e-6, 1e-5] s); pairs inside a block share one value
    per block (default U[5e10, 1e11] B/s, U[1e-6, 5e-6] s).

    Parameters
    ----------
    num_devices : int
        D, a multiple of ``super_block_size``.
    seed : int, optional
        Same seed, same topology.
    block_size, super_block_size : int
        b and S, with b dividing S (defaults 4 and 16).
    bandwidth, latency : sequence of three (low, high) ranges
        ``[inter-super-block, inter-block, intra-block]``.
    device, memory_bytes, flops, name
        As in :func:`flat`.

    Returns
    -------
    Topology
        Levels ``superblock`` and ``block`` (sorted device ids per group).

    Notes
    -----
    O(D^2).
    """
    n = check_count("num_devices", num_devices)
    check_dense_size("random", n)
    b = check_count("block_size", block_size)
    big = check_count("super_block_size", super_block_size)
    if big % b:
        raise ShardplanError(f"random-blk-2 needs super_block_size ({big}) to be a multiple of "
                             f"block_size ({b})")
    if n % big:
        raise ShardplanError(f"random-blk-2 needs num_devices ({n}) to be a multiple of "
                             f"super_block_size ({big})")
    return _block_topology("random-blk-2", n, (big, b), ("superblock", "block"), bandwidth,
                           latency, seed, device, memory_bytes, flops, name)


def uniform_dist(num_devices: int, *, seed: int | None = 0,
                 bandwidth: Sequence[Range] = UNIFORM_BANDWIDTH,
                 latency: Sequence[Range] = UNIFORM_LATENCY, device: str = "v100",
                 memory_bytes: float | None = None, flops: float | None = None,
                 name: str | None = None) -> Topology:
    """Parmesan's ``uniform_dist``: every pair's bandwidth and latency i.i.d. uniform.

    Definition (ours; paper 002's appendix I is not in our text): for every unordered pair
    {i, j}, the bandwidth is drawn independently from U[lo, hi] (default [1e9, 1e11] B/s),
    then, in a second pass, the latency from its own range (default U[1e-6, 5e-5] s),
    independently of the bandwidth. Both matrices are symmetric; there is no structure at all,
    which is where the paper reports its largest speed-ups over consecutive mapping.

    Parameters
    ----------
    num_devices : int
        D >= 1.
    seed : int, optional
        Same seed, same topology.
    bandwidth, latency : one (low, high) range
        Given as ``[(lo, hi)]`` or ``(lo, hi)``.
    device, memory_bytes, flops, name
        As in :func:`flat`.

    Returns
    -------
    Topology
        Devices ``gpu0..``, no levels, no links.

    Notes
    -----
    O(D^2).
    """
    n = check_count("num_devices", num_devices)
    check_dense_size("random", n)
    bws = _ranges("bandwidth", bandwidth, 1)
    lats = _ranges("latency", latency, 1)
    rng = _make_rng(seed)
    m = n * (n - 1) // 2
    bw = _symmetric(n, rng.uniform(*bws[0], size=m))
    lat = _symmetric(n, rng.uniform(*lats[0], size=m))
    return Topology(
        name=name or f"uniform-dist-{n}-s{_seed_label(seed)}",
        devices=make_devices([f"gpu{i}" for i in range(n)], device, memory_bytes, flops),
        bandwidth=bw, latency=lat,
        meta=generator_meta("uniform-dist", num_devices=n, bandwidth=bws, latency=lats,
                            seed=_seed_label(seed)),
    )
