"""Every topology builder: validity, JSON round trip, determinism, and the kinds' structure."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.ir import Topology, dumps, load_topology, save
from shardplan.topology import (
    BUILDERS,
    DEVICE_PRESETS,
    DGX1_NVLINKS,
    build,
    build_spec,
    dgx1,
    dgx1_link_counts,
    flat,
    hierarchical,
    kinds,
    random_blk_1,
    random_blk_2,
    uniform_dist,
)

# Small instances of every builder kind (measure is in test_measure.py).
CASES: dict[str, dict] = {
    "flat": {"num_devices": 5},
    "hierarchical": {"shape": (2, 3, 2)},
    "dgx1": {"boxes": 2},
    "dgx-a100": {"nodes": 2},
    "dgx-h100": {"nodes": 2},
    "dgx2-v100": {"nodes": 2},
    "dgx-h200": {"nodes": 2},
    "dgx-b200": {"nodes": 2},
    "pcie-h100": {"nodes": 2},
    "gb200-nvl72": {"racks": 1},
    "custom": {"nodes": 2, "gpus_per_node": 4, "flops": 1e15, "fp32_flops": 5e13,
               "memory_bandwidth": 4e12, "gpu_memory": "96GiB", "nvlink_bandwidth": 4e11,
               "nic_gbps": 400},
    "mesh2d": {"shape": (3, 4)},
    "torus2d": {"shape": (3, 4)},
    "mesh3d": {"shape": (2, 3, 2)},
    "torus3d": {"shape": (3, 3, 3)},
    "random-blk-1": {"num_devices": 16},
    "random-blk-2": {"num_devices": 32, "block_size": 4, "super_block_size": 8},
    "uniform-dist": {"num_devices": 12},
}
RANDOM = ("random-blk-1", "random-blk-2", "uniform-dist")


def test_registry_covers_the_contract_kinds() -> None:
    import shardplan.measure  # noqa: F401 - registers "measure" (built above the runtime)

    assert set(CASES) | {"measure"} == set(BUILDERS) == set(kinds())


@pytest.mark.parametrize("kind", sorted(CASES))
def test_every_kind_is_valid_and_round_trips(kind: str, tmp_path) -> None:
    topo = build(kind, **CASES[kind])
    n = topo.num_devices
    off = ~np.eye(n, dtype=bool)
    # routed end-to-end matrices: every pair reachable, with a finite positive bandwidth
    assert np.all(topo.bandwidth[off] > 0) and np.all(np.isfinite(topo.bandwidth))
    assert np.all(topo.latency[off] >= 0)
    assert np.allclose(topo.bandwidth, topo.bandwidth.T)
    assert np.allclose(topo.latency, topo.latency.T)
    assert topo.summary()["unreachable_pairs"] == 0
    assert topo.meta["generator"]["kind"] == kind
    path = tmp_path / f"{kind}.json"
    save(topo, path)
    again = load_topology(path)
    assert again.to_dict() == topo.to_dict()
    assert json.loads(path.read_text())["format"] == "shardplan.topology/1"
    # a second save of the reloaded object is byte-identical
    save(again, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == path.read_text()


@pytest.mark.parametrize("kind", RANDOM)
def test_random_kinds_depend_on_the_seed_only(kind: str) -> None:
    a = dumps(build(kind, **CASES[kind], seed=7))
    b = dumps(build(kind, **CASES[kind], seed=7))
    c = dumps(build(kind, **CASES[kind], seed=8))
    assert a == b
    assert a != c


@pytest.mark.parametrize("kind", RANDOM)
def test_random_kinds_default_seed_is_zero(kind: str) -> None:
    assert dumps(build(kind, **CASES[kind])) == dumps(build(kind, **CASES[kind], seed=0))
    assert dumps(build(kind, **CASES[kind], seed=None)) == dumps(build(kind, **CASES[kind]))


# --------------------------------------------------------------------------- flat
def test_flat_is_constant() -> None:
    t = flat(4, bandwidth=2e9, latency=3e-6, device="a100")
    off = ~np.eye(4, dtype=bool)
    assert np.all(t.bandwidth[off] == 2e9) and np.all(t.latency[off] == 3e-6)
    assert t.bandwidth[1, 1] == 0.0
    assert all(d.memory_bytes == 80 * 2**30 and d.flops == 312e12 for d in t.devices)
    assert t.levels == () and t.links == ()


def test_flat_single_device() -> None:
    t = flat(1)
    assert t.num_devices == 1 and t.bandwidth.shape == (1, 1)


# --------------------------------------------------------------------------- hierarchical
def test_hierarchical_2x4x3x4() -> None:
    bws = (1e9, 1e10, 2e10, 1e11)
    lats = (1e-3, 1e-4, 1e-5, 1e-6)
    t = hierarchical((2, 4, 3, 4), level_names=("region", "rack", "box", "gpu"),
                     bandwidth=bws, latency=lats)
    assert t.num_devices == 96
    assert [lv.name for lv in t.levels] == ["region", "rack", "box"]
    assert [len(lv.groups) for lv in t.levels] == [2, 8, 24]
    assert [len(lv.groups[0]) for lv in t.levels] == [48, 12, 4]
    assert t.levels[2].groups[5] == (20, 21, 22, 23)
    assert t.devices[0].name == "region0/rack0/box0/gpu0"
    assert t.devices[95].name == "region1/rack3/box2/gpu3"
    # pair values by the outermost level where the two devices differ, by hand
    coords = [tuple(int(x) for x in np.unravel_index(i, (2, 4, 3, 4))) for i in range(96)]
    for i in range(0, 96, 7):
        for j in range(96):
            if i == j:
                continue
            k = next(k for k in range(4) if coords[i][k] != coords[j][k])
            assert t.bandwidth[i, j] == bws[k]
            assert t.latency[i, j] == lats[k]
    # counts: each device has 3 box mates, 8 rack mates in other boxes, 36 region mates in
    # other racks, 48 devices in the other region
    counts = {b: int(np.sum(t.bandwidth[0] == b)) for b in bws}
    assert counts == {1e11: 3, 2e10: 8, 1e10: 36, 1e9: 48}


def test_hierarchical_defaults() -> None:
    t = hierarchical((2, 4))
    assert [lv.name for lv in t.levels] == ["box"]
    assert t.devices[5].name == "box1/gpu1"
    assert t.bandwidth[0, 1] == 1.5e11 and t.bandwidth[0, 4] == 2.5e10
    one = hierarchical((3,))
    assert one.levels == () and one.num_devices == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"shape": (2, 4), "bandwidth": (1e9,)}, "bandwidth needs 2 values"),
    ({"shape": (2, 4), "latency": (1e-6, 1e-6, 1e-6)}, "latency needs 2 values"),
    ({"shape": (2, 4), "level_names": ("a",)}, "2 levels but 1 level names"),
    ({"shape": (2, 4), "level_names": ("a", "a")}, "distinct"),
    ({"shape": (2, 2, 2, 2, 2)}, "no default bandwidths"),
    ({"shape": (2, 0)}, "integers >= 1"),
    ({"shape": ()}, "needs a shape"),
    ({"shape": (2, 4), "bandwidth": (1e9, -1.0)}, "positive"),
])
def test_hierarchical_rejects(kwargs, match) -> None:
    with pytest.raises(ShardplanError, match=match):
        hierarchical(**kwargs)


# --------------------------------------------------------------------------- dgx1
def test_dgx1_link_matrix_is_the_hybrid_cube_mesh() -> None:
    counts = dgx1_link_counts()
    assert np.array_equal(counts, counts.T)
    assert np.all(counts.sum(axis=1) == 6)  # 6 NVLink2 bricks per V100
    assert sum(v == 2 for v in DGX1_NVLINKS.values()) == 8
    assert sum(v == 1 for v in DGX1_NVLINKS.values()) == 8
    # every GPU: two double links, two single links, three PCIe-only peers
    for g in range(8):
        row = np.delete(counts[g], g)
        assert sorted(row.tolist()) == [0, 0, 0, 1, 1, 2, 2]
    # the two quads (0-3, 4-7) are fully NVLink-connected; across them only i <-> i+4
    assert np.all(counts[:4, :4][~np.eye(4, dtype=bool)] > 0)
    assert np.all(counts[4:, 4:][~np.eye(4, dtype=bool)] > 0)
    assert np.array_equal(np.nonzero(counts[:4, 4:]), (np.arange(4), np.arange(4)))


def test_dgx1_two_boxes() -> None:
    t = build("dgx1", boxes=2)
    assert t.num_devices == 16
    assert t.devices[9].name == "box1/gpu1"
    assert t.levels[0].name == "box"
    assert t.levels[0].groups == (tuple(range(8)), tuple(range(8, 16)))
    for b in range(2):
        box = t.bandwidth[8 * b:8 * b + 8, 8 * b:8 * b + 8]
        off = box[~np.eye(8, dtype=bool)]
        assert sorted(set(off.tolist())) == [1e10, 25e9, 50e9]
        # ordered pairs: 8 double and 8 single NVLink pairs, 12 PCIe pairs per box
        assert int(np.sum(off == 50e9)) == 16
        assert int(np.sum(off == 25e9)) == 16
        assert int(np.sum(off == 1e10)) == 24
        # NVLink bricks per GPU from the bandwidths: 6 each
        bricks = np.where(box >= 25e9, np.round(box / 25e9), 0)
        assert np.all(bricks.sum(axis=1) == 6)
    assert np.all(t.bandwidth[:8, 8:] == 12.5e9) and np.all(t.latency[:8, 8:] == 2.5e-5)
    assert t.bandwidth[0, 3] == 50e9 and t.bandwidth[0, 1] == 25e9 and t.bandwidth[0, 5] == 1e10
    assert t.latency[0, 5] > t.latency[0, 3]
    assert [c[0] for c in t.bandwidth_classes()] == [50e9, 25e9, 12.5e9, 1e10]


def test_dgx1_options() -> None:
    t = dgx1(1, inter_bandwidth=1e9, nvlink_bandwidth=20e9, pcie_bandwidth=8e9, device="v100",
             memory_bytes=16 * 2**30)
    assert t.num_devices == 8 and t.bandwidth[0, 3] == 40e9 and t.bandwidth[0, 6] == 8e9
    assert t.devices[0].memory_bytes == 16 * 2**30 and t.devices[0].flops == 125e12
    with pytest.raises(ShardplanError, match="boxes"):
        dgx1(0)
    with pytest.raises(ShardplanError, match="inter_bandwidth"):
        dgx1(2, inter_bandwidth=0)


# --------------------------------------------------------------------------- presets
def test_dgx_a100_of_2020_has_the_40gb_part() -> None:
    """``gpu=a100-40gb``: the same peaks, 40 GB of HBM2 at 1,555 GB/s (the A100 datasheet's
    40GB column), priced by the A100's kernel fractions; an unknown GPU is one clear error."""
    from shardplan.cost._gpu import gpu_model

    old = build_spec("dgx-a100,nodes=2,gpu=a100-40gb")
    new = build_spec("dgx-a100,nodes=2")
    assert old.devices[0].memory_bytes == 40 * 2**30 and new.devices[0].memory_bytes == \
        80 * 2**30
    assert old.devices[0].flops == new.devices[0].flops == 312e12
    assert old.devices[0].extra["memory_bandwidth"] == 1555e9
    assert new.devices[0].extra["memory_bandwidth"] == 2039e9
    assert old.meta["generator"]["options"]["gpu"] == "a100-40gb"
    assert np.array_equal(old.bandwidth, new.bandwidth)  # the same NVLink and NICs
    a, b = gpu_model(old), gpu_model(new)
    assert (a.matmul_efficiency, a.memory_efficiency, a.sms) == \
        (b.matmul_efficiency, b.memory_efficiency, b.sms)
    with pytest.raises(ShardplanError, match="unknown gpu 'a300'"):
        build_spec("dgx-a100,gpu=a300")


def test_device_presets() -> None:
    assert DEVICE_PRESETS["v100"].memory_bytes == 32 * 2**30
    assert DEVICE_PRESETS["v100"].flops == 125e12
    assert DEVICE_PRESETS["a100"].memory_bytes == 80 * 2**30
    assert DEVICE_PRESETS["a100"].flops == 312e12
    assert DEVICE_PRESETS["h100"].memory_bytes == 80 * 2**30
    assert DEVICE_PRESETS["h100"].flops == 989e12
    t = build("mesh2d", shape=(2, 2), device="h100", flops=5e14)
    assert t.devices[0].flops == 5e14 and t.devices[0].memory_bytes == 80 * 2**30
    assert t.devices[0].to_dict()["type"] == "h100"
    with pytest.raises(ShardplanError, match="unknown device type"):
        flat(2, device="tpu")
    with pytest.raises(ShardplanError, match="memory_bytes"):
        flat(2, memory_bytes=-1)


# --------------------------------------------------------------------------- random kinds
def _classes(t: Topology, groups) -> None:
    """Pairs inside one group share a value; so do all pairs between two given groups."""
    for a in groups:
        for b in groups:
            block = t.bandwidth[np.ix_(a, b)]
            vals = block[~np.eye(len(a), dtype=bool)] if a == b else block.ravel()
            if vals.size:
                assert np.all(vals == vals[0])


def test_random_blk_1_definition() -> None:
    t = random_blk_1(32, seed=3, block_size=4)
    (lv,) = t.levels
    assert lv.name == "block" and len(lv.groups) == 8
    assert sorted(d for g in lv.groups for d in g) == list(range(32))
    # blocks are scattered over device ids (the permutation is not the identity)
    assert any(g != tuple(range(g[0], g[0] + 4)) for g in lv.groups)
    _classes(t, [list(g) for g in lv.groups])
    block_of = {d: k for k, g in enumerate(lv.groups) for d in g}
    same = np.array([[block_of[i] == block_of[j] for j in range(32)] for i in range(32)])
    off = ~np.eye(32, dtype=bool)
    intra, inter = t.bandwidth[same & off], t.bandwidth[~same]
    assert intra.min() >= 5e10 and intra.max() <= 1e11
    assert inter.min() >= 1e9 and inter.max() <= 1e10
    lat_intra, lat_inter = t.latency[same & off], t.latency[~same]
    assert lat_intra.min() >= 1e-6 and lat_intra.max() <= 5e-6
    assert lat_inter.min() >= 1e-5 and lat_inter.max() <= 5e-5
    # one value per block and per block pair
    assert len(set(intra.tolist())) == 8
    assert len(set(inter.tolist())) == 8 * 7 // 2


def test_random_blk_2_definition() -> None:
    t = random_blk_2(64, seed=1)
    sup, blk = t.levels
    assert (sup.name, blk.name) == ("superblock", "block")
    assert len(sup.groups) == 4 and len(blk.groups) == 16
    sup_of = {d: k for k, g in enumerate(sup.groups) for d in g}
    blk_of = {d: k for k, g in enumerate(blk.groups) for d in g}
    seen: dict[int, set] = {0: set(), 1: set(), 2: set()}
    ranges = {0: (1e9, 1e10), 1: (1e10, 5e10), 2: (5e10, 1e11)}
    for i in range(64):
        for j in range(64):
            if i == j:
                continue
            cls = 0 if sup_of[i] != sup_of[j] else (1 if blk_of[i] != blk_of[j] else 2)
            lo, hi = ranges[cls]
            assert lo <= t.bandwidth[i, j] <= hi
            seen[cls].add(float(t.bandwidth[i, j]))
    # one value per super-block pair, per block pair inside a super-block, per block
    assert len(seen[0]) == 4 * 3 // 2
    assert len(seen[1]) == 4 * (4 * 3 // 2)
    assert len(seen[2]) == 16


def test_uniform_dist_definition() -> None:
    t = uniform_dist(40, seed=5, bandwidth=(2e9, 4e9), latency=[(1e-6, 2e-6)])
    iu = np.triu_indices(40, 1)
    bw = t.bandwidth[iu]
    assert bw.min() >= 2e9 and bw.max() <= 4e9
    assert len(set(bw.tolist())) == bw.size  # i.i.d. continuous draws
    # the exact stream: bandwidths then latencies, upper triangle row-major
    rng = np.random.default_rng(5)
    assert np.array_equal(bw, rng.uniform(2e9, 4e9, size=bw.size))
    assert np.array_equal(t.latency[iu], rng.uniform(1e-6, 2e-6, size=bw.size))
    assert t.levels == ()


@pytest.mark.parametrize("fn, kwargs, match", [
    (random_blk_1, {"num_devices": 10, "block_size": 4}, "multiple of block_size"),
    (random_blk_2, {"num_devices": 32, "super_block_size": 6}, "multiple of block_size"),
    (random_blk_2, {"num_devices": 24}, "multiple of super_block_size"),
    (random_blk_1, {"num_devices": 8, "bandwidth": [(1e9, 2e9)]}, "2 \\(low, high\\) ranges"),
    (random_blk_1, {"num_devices": 8, "bandwidth": (1e9, 2e9, 3e9)}, "4 numbers, got 3"),
    (uniform_dist, {"num_devices": 8, "bandwidth": (5e9, 1e9)}, "above its high end"),
    (uniform_dist, {"num_devices": 8, "seed": -1}, "seed"),
    (uniform_dist, {"num_devices": 0}, "num_devices"),
])
def test_random_kinds_reject(fn, kwargs, match) -> None:
    with pytest.raises(ShardplanError, match=match):
        fn(**kwargs)


# --------------------------------------------------------------------------- build()
def test_build_errors() -> None:
    with pytest.raises(ShardplanError, match="unknown topology kind"):
        build("ring")
    with pytest.raises(ShardplanError, match="does not take option boxes"):
        build("mesh2d", shape=(2, 2), boxes=2)
    with pytest.raises(ShardplanError, match="needs shape"):
        build("torus2d")
    assert build("random_blk_1", num_devices=8).num_devices == 8
