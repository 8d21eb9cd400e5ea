"""The cluster as it is now: devices removed or added since a plan was made (issue 48).

A :class:`ClusterChange` keeps one numbering of the physical devices for both sides of a
change -- the *base*: the old cluster's devices (the removed ones marked dead) followed by the
added ones, or the new cluster file's devices -- so that where the old plan's state lives and
where the new plan runs can be compared device by device (:mod:`shardplan.planner._reshard`).

The new plan's topology is a part of the base in the order its ranks run
(:func:`sub_topology`): an LLM plan's rank r runs on its topology's device r, so choosing the
order of the surviving nodes is choosing which node takes which ranks. On a cluster of
identical nodes (a cluster preset's two-level pair model) any order of whole nodes prices the
same; the order only decides how much state stays in place.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Level, Topology
from shardplan.ir._pairs import LevelPairs

__all__ = ["ClusterChange", "change_by_flags", "change_to", "sub_topology"]

#: Most devices a part of a topology without a pair model is cut from (its dense matrices).
MAX_DENSE_DEVICES = 4096


@dataclass(frozen=True, eq=False)
class ClusterChange:
    """The old cluster, the physical devices now, and what changed.

    Attributes
    ----------
    old : Topology
        The cluster the old plan was made for (its rank r on device r).
    base : Topology
        The physical devices in one numbering (module docstring).
    alive : ndarray of bool
        Per base device: it is there now.
    old_devices : ndarray of int
        The base id of each old device (``-1``: not in the base).
    removed, added : tuple of str
        Device names.
    """

    old: Topology
    base: Topology
    alive: np.ndarray
    old_devices: np.ndarray
    removed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()

    @property
    def num_alive(self) -> int:
        return int(self.alive.sum())

    def node_of(self) -> np.ndarray:
        """The node (innermost level group) of every base device; every device its own
        node without levels. O(devices)."""
        from shardplan.cost._gpu import node_ids

        return node_ids(self.base)

    def usable_nodes(self) -> np.ndarray:
        """The nodes a new plan may run on, as rows of base device ids in slot order: the
        nodes of the most common size all of whose devices are alive; when there are none,
        the surviving devices of the fullest node (one row). O(devices)."""
        from shardplan.planner._reshard import _members

        members = _members(self.node_of())
        full = (members >= 0).sum(axis=1)
        size = int(np.bincount(full).argmax())
        ok = (full == size) & np.all((members[:, :size] >= 0)
                                     & self.alive[np.maximum(members[:, :size], 0)], axis=1)
        if ok.any():
            return members[ok, :size]
        alive_counts = [(int(self.alive[r[r >= 0]].sum()), i) for i, r in enumerate(members)]
        best = max(alive_counts)[1]
        row = members[best]
        row = row[(row >= 0)]
        row = row[self.alive[row]]
        if row.size == 0:
            raise ShardplanError("no device of the cluster survives")
        return row[None, :]

    def topology_of(self, devices: np.ndarray, name: str | None = None) -> Topology:
        """The base restricted to ``devices`` in that order (:func:`sub_topology`)."""
        return sub_topology(self.base, devices, name=name)


def _node_names(topology: Topology) -> dict[str, list[int]]:
    """Devices by the node part of their name (``node3`` of ``node3/gpu0``)."""
    out: dict[str, list[int]] = {}
    for i, d in enumerate(topology.devices):
        if "/" in d.name:
            out.setdefault(d.name.rsplit("/", 1)[0], []).append(i)
    return out


def _removed_ids(old: Topology, names: Sequence[str], nodes: int, gpus: int) -> list[int]:
    """Device ids named (a device's name, or a node's: every device under it), then the
    last ``nodes`` nodes and the last ``gpus`` devices still there. O(devices)."""
    from shardplan.cost._gpu import node_ids

    by_name = {d.name: i for i, d in enumerate(old.devices)}
    by_node = _node_names(old)
    out: list[int] = []
    for name in names:
        if name in by_name:
            out.append(by_name[name])
        elif name in by_node:
            out.extend(by_node[name])
        else:
            raise ShardplanError(f"--remove {name!r}: no device or node of that name in "
                                 f"cluster {old.name!r} (names look like "
                                 f"{old.devices[-1].name!r})")
    gone = set(out)
    node = node_ids(old)
    if nodes:
        order = [int(x) for x in dict.fromkeys(node[::-1].tolist())]
        left = [n for n in order if not all(int(d) in gone for d in np.flatnonzero(node == n))]
        if nodes > len(left):
            raise ShardplanError(f"--remove-nodes {nodes}: the cluster has {len(left)} nodes "
                                 f"left to remove")
        for n in left[:nodes]:
            out.extend(int(d) for d in np.flatnonzero(node == n))
    gone = set(out)
    if gpus:
        left_dev = [i for i in range(old.num_devices - 1, -1, -1) if i not in gone]
        if gpus > len(left_dev):
            raise ShardplanError(f"--remove-gpus {gpus}: the cluster has {len(left_dev)} "
                                 f"devices left to remove")
        out.extend(left_dev[:gpus])
    return sorted(set(out))


def change_by_flags(old: Topology, *, remove: Sequence[str] = (), remove_nodes: int = 0,
                    remove_gpus: int = 0, add_nodes: int = 0, add_gpus: int = 0
                    ) -> ClusterChange:
    """The old cluster less the devices removed (by name: a device or a node; by count:
    the last nodes or devices) and with nodes added (like its last node,
    :func:`_grown`). O(devices).

    Raises
    ------
    ShardplanError
        An unknown name, more removed than there are, nothing left, or devices added to a
        cluster that is not made of identical nodes.
    """
    gone = _removed_ids(old, remove, remove_nodes, remove_gpus)
    if len(gone) >= old.num_devices:
        raise ShardplanError(f"removing {len(gone)} devices leaves none of the "
                             f"{old.num_devices} of cluster {old.name!r}")
    base = old
    if add_gpus:
        grid = _grid(old)
        g = grid[1] if grid else 0
        if not g or add_gpus % g:
            raise ShardplanError(f"--add-gpus {add_gpus}: a cluster grows by whole nodes of "
                                 f"{g or '?'} GPUs (or give the new cluster with --cluster)")
        add_nodes += add_gpus // g
    if add_nodes:
        base = _grown(old, add_nodes)
    alive = np.ones(base.num_devices, dtype=bool)
    alive[gone] = False
    return ClusterChange(old=old, base=base, alive=alive,
                         old_devices=np.arange(old.num_devices, dtype=np.int64),
                         removed=tuple(old.devices[i].name for i in gone),
                         added=tuple(d.name for d in base.devices[old.num_devices:]))


def change_to(old: Topology, new: Topology) -> ClusterChange:
    """The change from ``old`` to the cluster ``new`` (a topology file or spec): devices
    matched by name; the base is ``new``. O(devices).

    Raises
    ------
    ShardplanError
        No device of ``old`` is in ``new`` (they share no names).
    """
    where = {d.name: i for i, d in enumerate(new.devices)}
    old_devices = np.array([where.get(d.name, -1) for d in old.devices], dtype=np.int64)
    if (old_devices < 0).all():
        raise ShardplanError(f"cluster {new.name!r} has none of the devices of "
                             f"{old.name!r} (devices are matched by name)")
    names = {d.name for d in old.devices}
    return ClusterChange(old=old, base=new, alive=np.ones(new.num_devices, dtype=bool),
                         old_devices=old_devices,
                         removed=tuple(d.name for d, i in zip(old.devices, old_devices,
                                                              strict=True) if i < 0),
                         added=tuple(d.name for d in new.devices if d.name not in names))


def _grid(topology: Topology) -> tuple[int, int] | None:
    """``(nodes, gpus per node)`` of a two-level pair model, else None."""
    model = topology.pair_model
    if isinstance(model, LevelPairs) and len(model.shape) == 2:
        return int(model.shape[0]), int(model.shape[1])
    return None


def _values(model: LevelPairs, which: str, rows: np.ndarray | None = None) -> list[Any]:
    """The per-level values of a two-level model (its node table restricted to ``rows``)."""
    per_level, inner = model.tables[which]
    if inner is None:
        return [float(per_level[0]), float(per_level[1])]
    return [float(per_level[0]), inner if rows is None else inner[np.ix_(rows, rows)]]


_NODE_NAME = re.compile(r"^(.*?)(\d+)/(.*)$")


def _grown(old: Topology, nodes: int) -> Topology:
    """``old`` with ``nodes`` more nodes like its last one, named after it (``node2048/gpu0``
    after ``node2047/gpu7``). O(devices)."""
    grid = _grid(old)
    if grid is None:
        raise ShardplanError(f"devices can be added to a cluster of identical nodes (a "
                             f"cluster preset like dgx-h100,nodes=N); cluster {old.name!r} is "
                             f"not one: give the new cluster with --cluster")
    count, g = grid
    model = old.pair_model
    assert isinstance(model, LevelPairs)
    last = old.devices[-g:]
    m = _NODE_NAME.match(last[0].name)
    start = int(m.group(2)) + 1 if m else count
    prefix = m.group(1) if m else "added"
    taken = {d.name for d in old.devices}
    added = []
    for k in range(nodes):
        for d in last:
            m2 = _NODE_NAME.match(d.name)
            added.append(replace(d, name=f"{prefix}{start + k}/{m2.group(3) if m2 else d.name}"))
    if taken & {d.name for d in added}:
        raise ShardplanError(f"cannot name the added nodes of cluster {old.name!r}: give the "
                             f"new cluster with --cluster")
    total = count + nodes
    grown = LevelPairs((total, g), _values(model, "bandwidth"), _values(model, "latency"))
    return Topology(name=f"{old.name}+{nodes * g}", devices=(*old.devices, *added),
                    bandwidth=grown.matrix("bandwidth"), latency=grown.matrix("latency"),
                    levels=(Level(name=old.levels[0].name if old.levels else "box",
                                  groups=tuple(tuple(range(n * g, (n + 1) * g))
                                               for n in range(total))),),
                    meta=_meta_nodes(old.meta, total))


def _meta_nodes(meta: Any, nodes: int) -> dict[str, Any]:
    """A topology's meta with its generator's ``nodes`` set (and no ``gpus_of``)."""
    out = dict(meta)
    gen = out.get("generator")
    if isinstance(gen, dict):
        options = {k: v for k, v in (gen.get("options") or {}).items() if k != "gpus_of"}
        if "nodes" in options:
            options["nodes"] = nodes
        out["generator"] = {**gen, "options": options}
    return out


def sub_topology(base: Topology, devices: Sequence[int] | np.ndarray, *,
                 name: str | None = None) -> Topology:
    """``base`` restricted to ``devices``, in that order: device i of the result is base
    device ``devices[i]``. A two-level pair model (a cluster preset) stays one when the
    devices are whole nodes each in slot order, or part of one node; a topology with dense
    matrices (at most :data:`MAX_DENSE_DEVICES` devices) is cut from them. Levels keep
    their groups (renumbered), links between kept devices stay. O(len(devices)) for a pair
    model, O(len(devices)^2) dense.

    Raises
    ------
    ShardplanError
        A device twice or out of range, or a part no form above can express.

    Examples
    --------
    >>> from shardplan.topology import build_spec
    >>> t = sub_topology(build_spec("dgx-h100,nodes=3"), list(range(16, 24)) + list(range(8)))
    >>> t.num_devices, t.devices[0].name, t.levels[0].groups[1][:2], t.pair_model.shape
    (16, 'node2/gpu0', (8, 9), (2, 8))
    """
    order = np.asarray(devices, dtype=np.int64).reshape(-1)
    n = base.num_devices
    if order.size == 0 or order.min() < 0 or order.max() >= n or \
            np.unique(order).size != order.size:
        raise ShardplanError("a part of a topology needs distinct devices of it")
    bw, lat = _part_matrices(base, order)
    position = np.full(n, -1, dtype=np.int64)
    position[order] = np.arange(order.size)
    levels = []
    for lv in base.levels:
        groups = [tuple(sorted(int(position[d]) for d in grp if position[d] >= 0))
                  for grp in lv.groups]
        levels.append(Level(name=lv.name, groups=tuple(sorted(g for g in groups if g))))
    links = tuple(replace(lk, src=int(position[lk.src]), dst=int(position[lk.dst]))
                  for lk in base.links if position[lk.src] >= 0 and position[lk.dst] >= 0)
    cost = None if base.cost is None else np.asarray(base.cost)[np.ix_(order, order)]
    nodes = len(levels[-1].groups) if levels else order.size
    return Topology(name=name or f"{base.name}-{order.size}of{n}",
                    devices=tuple(base.devices[int(i)] for i in order), bandwidth=bw,
                    latency=lat, cost=cost, levels=tuple(levels), links=links,
                    meta=_meta_nodes(base.meta, nodes))


def _part_matrices(base: Topology, order: np.ndarray) -> tuple[Any, Any]:
    """The bandwidth and latency of ``base`` over ``order`` (:func:`sub_topology`)."""
    model = base.pair_model
    grid = _grid(base)
    if grid is not None and isinstance(model, LevelPairs):
        g = grid[1]
        if order.size % g == 0:
            blocks = order.reshape(-1, g)
            if np.all(blocks == blocks[:, :1] + np.arange(g)) and np.all(blocks[:, 0] % g == 0):
                part = LevelPairs((order.size // g, g), _values(model, "bandwidth"),
                                  _values(model, "latency"))
                return part.matrix("bandwidth"), part.matrix("latency")
        if order.size <= g and np.unique(order // g).size == 1:
            rows = order % g
            part = LevelPairs((1, order.size), _values(model, "bandwidth", rows),
                              _values(model, "latency", rows))
            return part.matrix("bandwidth"), part.matrix("latency")
    if isinstance(model, LevelPairs) and len(model.shape) == 1 and model.tables[
            "bandwidth"][1] is None and model.tables["latency"][1] is None:
        part = LevelPairs((order.size,), [float(model.tables["bandwidth"][0][0])],
                          [float(model.tables["latency"][0][0])])
        return part.matrix("bandwidth"), part.matrix("latency")
    if base.num_devices > MAX_DENSE_DEVICES:
        raise ShardplanError(f"cluster {base.name!r} ({base.num_devices} devices) can be cut "
                             f"into whole nodes only")
    ix = np.ix_(order, order)
    return np.array(np.asarray(base.bandwidth)[ix]), np.array(np.asarray(base.latency)[ix])
