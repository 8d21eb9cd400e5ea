"""Measured topologies: the fit, option checks, and real gloo runs (marked multiprocess)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.ir import load_topology, save
from shardplan.measure import fit_link, measure, reshard_overhead
from shardplan.topology import build

SMALL = (4, 1 << 16, 1 << 20, 1 << 22)
COLL = (1 << 12, 1 << 16, 1 << 20)


def test_fit_link_recovers_a_linear_model() -> None:
    sizes = np.array([4, 1 << 16, 1 << 20, 1 << 24], dtype=float)
    t = 5e-5 + sizes / 2e9
    bw, lat = fit_link(sizes, t)
    assert bw == pytest.approx(2e9, rel=1e-9)
    assert lat == pytest.approx(5e-5 + 4 / 2e9)


def test_fit_link_falls_back_on_a_flat_curve() -> None:
    bw, lat = fit_link([4, 1 << 20, 1 << 24], [2e-3, 2.1e-3, 1.9e-3])
    assert bw == pytest.approx((1 << 24) / 1.9e-3) and lat == 2e-3
    with pytest.raises(ShardplanError, match="two or more sizes"):
        fit_link([4], [1e-3])


def test_reshard_overhead_is_what_the_model_does_not_charge_for_the_bytes() -> None:
    """A redistribution's measured cost, less what PaSE's default cost model charges a
    re-shard direction itself: the received bytes over the slowest link (absent links,
    bandwidth 0, and the diagonal left out) and the largest latency; never below 0."""
    bw = np.array([[0.0, 4e9, 0.0], [1e9, 0.0, 2e9], [0.0, 8e9, 0.0]])
    lat = np.array([[0.0, 1e-5, 0.0], [3e-5, 0.0, 2e-5], [0.0, 1e-5, 0.0]])
    assert reshard_overhead([2e-3, 1e6], bw, lat) == pytest.approx(2e-3 - 1e-3 - 3e-5)
    assert reshard_overhead([0.5e-3, 1e6], bw, lat) == 0.0  # less than the bytes take
    assert reshard_overhead([2e-3, 0.0], bw, lat) == pytest.approx(2e-3 - 3e-5)
    assert reshard_overhead([2e-3], bw, lat) == 0.0 and reshard_overhead(None, bw, lat) == 0.0


@pytest.mark.parametrize("kwargs, match", [
    ({"nproc": 1}, "nproc"),
    ({"nproc": 2, "backend": "mpi"}, "unknown backend"),
    ({"nproc": 2, "sizes": (8, 8)}, "two distinct"),
    ({"nproc": 2, "sizes": (0, 8)}, "message size"),
    ({"nproc": 2, "timeout": 0}, "timeout"),
    ({"nproc": 2, "repeats": 0}, "repeats"),
    ({"nproc": 2, "device": "tpu"}, "unknown device type"),
    ({"nproc": 2, "flops": -1.0}, "flops"),
])
def test_measure_rejects_bad_options_without_starting_processes(
        kwargs, match, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardplan.measure import _measure

    started = []
    monkeypatch.setattr(_measure, "_run", lambda *a, **k: started.append(a) or [])
    with pytest.raises(ShardplanError, match=match):
        build("measure", **kwargs)
    assert started == []


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_measure_two_processes(tmp_path) -> None:
    topo = measure(2, backend="gloo", sizes=SMALL, repeats=3, timeout=40,
                   collective_sizes=COLL)
    assert topo.num_devices == 2
    assert topo.bandwidth[0, 1] > 1e6 and topo.bandwidth[1, 0] > 1e6
    assert 0 < topo.latency[0, 1] < 1.0 and 0 < topo.latency[1, 0] < 1.0
    assert [d.name for d in topo.devices] == ["rank0", "rank1"]
    assert topo.devices[0].flops == 1e11 and topo.devices[0].memory_bytes > 0
    m = topo.meta["measurement"]
    assert m["backend"] == "gloo" and m["sizes"] == list(SMALL)
    assert np.array(m["one_way_seconds"]).shape == (len(SMALL), 2, 2)
    save(topo, tmp_path / "m.json")
    back = load_topology(tmp_path / "m.json")
    assert back.to_dict() == topo.to_dict()
    # collectives over the 2 ranks, at every size, and the cost model reads them
    for kind in ("allreduce", "allgather", "reducescatter"):
        b, t = back.collective_curve(kind, 2)
        assert b.tolist() == [float(s) for s in COLL] and np.all(t > 0)
    from shardplan.cost import allreduce_seconds

    b, t = back.collective_curve("allreduce", 2)
    assert allreduce_seconds(back, [0, 1], b[-1]) == pytest.approx(t[-1])
    # the measured overheads, in every device entry, and read back by the cost model
    from shardplan.cost._overheads import busy_slowdown, dtensor_op_overhead, op_overhead

    for d in back.devices:
        f, b_ = d.extra["op_overhead_seconds"]
        assert 0 < f < 1e-2 and 0 < b_ < 1e-2  # a tiny operator: microseconds, not seconds
        assert all(0 <= x < 1e-2 for x in d.extra["dtensor_op_overhead_seconds"])
        assert all(0 <= x < 1e-6 for x in d.extra["dtensor_op_seconds_per_byte"])
        assert 0 <= d.extra["fsdp_gather_overhead_seconds"] < 1.0
        assert 0 <= d.extra["dtensor_step_overhead_seconds"] < 1.0
        # a redistribution of the DTensor program: its 64 KiB (half of 128 KiB) each rank
        # receives, and its cost beyond what the model charges for them (reshard_overhead)
        seconds, received = d.extra["dtensor_reshard_seconds"]
        assert 0 <= seconds < 1.0 and received == 8 * 32 * 128 * 4 / 2
        assert d.extra["dtensor_collective_overhead_seconds"] == pytest.approx(
            reshard_overhead([seconds, received], back.bandwidth, back.latency))
        assert 0 <= d.extra["fsdp_gather_seconds_per_byte"] < 1e-6  # GB/s, not bytes/s
        assert 0 <= d.extra["fsdp_reduce_overhead_seconds"] < 1.0
        assert 0 <= d.extra["fsdp_reduce_seconds_per_byte"] < 1e-6
        assert 0 <= d.extra["pipeline_action_overhead_seconds"] < 1.0
        one, many = d.extra["gradient_seconds_per_byte"]
        assert 0 < one < 1e-6 and 0 < many < 1e-6  # seconds per byte: GB/s, not bytes/s
        steps = d.extra["optimizer_seconds_per_byte"]
        assert set(steps) == {"sgd", "sgd-momentum", "momentum", "adam", "adamw"}
        assert all(0 < x < 1e-6 for x in steps.values())
        assert steps["adam"] > steps["sgd"]  # Adam passes over its two moments too
        per_tensor = d.extra["optimizer_seconds_per_tensor"]
        assert set(per_tensor) == set(steps)
        assert all(0 <= x < 1e-2 for x in per_tensor.values())  # microseconds per tensor
        assert 0 < d.extra["comm_cpu_share"] < 8  # CPU seconds per second in flight
        # a CPU rank's collective after computing: three lengths, shortest first (the
        # small blocks' forward, their forward and backward, the larger blocks')
        sync = np.array(d.extra["host_sync_seconds"])
        assert sync.shape == (3, 2) and 0 < sync[0, 0] < sync[1, 0] < sync[2, 0] < 1.0
        assert np.all((sync[:, 1] >= 0) & (sync[:, 1] < 1.0))
        assert set(d.extra["busy_slowdown"]) == {"1", "2"}
        assert d.extra["busy_slowdown"]["1"] == 1.0 and d.extra["busy_slowdown"]["2"] > 0
    assert op_overhead(back)[0] > 0 and dtensor_op_overhead(back)[0] >= 0
    assert busy_slowdown(back, [0, 1]) >= 1.0 and busy_slowdown(back, [0]) == 1.0
    quiet = measure(2, backend="gloo", sizes=SMALL[:2], repeats=1, timeout=40,
                    collectives=False, overheads=False)
    assert "op_overhead_seconds" not in quiet.devices[0].extra


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_measure_failing_rank_raises_quickly() -> None:
    # The failure ends the run, not the timeout: well before it even on a loaded machine.
    t0 = time.monotonic()
    with pytest.raises(ShardplanError, match="rank 1: RuntimeError: injected failure"):
        measure(2, sizes=SMALL, repeats=2, timeout=200, _fault=("raise", 1, "measure"))
    assert time.monotonic() - t0 < 100


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_measure_dead_rank_is_named() -> None:
    with pytest.raises(ShardplanError, match="rank 0 exited with code 3"):
        measure(2, sizes=SMALL, repeats=2, timeout=40, _fault=("exit", 0, "measure"))


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_measure_hanging_rank_hits_the_hard_timeout() -> None:
    t0 = time.monotonic()
    with pytest.raises(ShardplanError, match="timed out after 6 s"):
        measure(2, sizes=SMALL, repeats=2, timeout=6, _fault=("hang", 1, "measure"))
    assert time.monotonic() - t0 < 12


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_measure_nccl_without_gpus_fails_cleanly() -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ShardplanError, match="nccl backend needs 2 CUDA devices"):
        measure(2, backend="nccl", timeout=40)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_measure_four_processes_with_the_defaults() -> None:
    """Every pair of four processes measured with the defaults (its speed is a benchmark's
    business, not a timed test's: the pytest timeout only guards against a hang)."""
    topo = measure(4)  # the defaults, as `shardplan topology measure --nproc 4` runs them
    off = ~np.eye(4, dtype=bool)
    assert np.all(topo.bandwidth[off] > 0) and np.all(topo.latency[off] > 0)
    assert topo.summary()["unreachable_pairs"] == 0


def test_typical_seconds_is_a_trimmed_mean_not_a_median() -> None:
    """A step pays the mean of its transfers: with a slow mode in a quarter of the calls
    (gloo's small all-reduces here) the median reads the fast mode alone; of ten
    timings, the slowest (a preempted call) and the fastest are dropped; fewer than ten
    keep every timing."""
    from shardplan.measure._timing import COMM_SAMPLES, typical_seconds

    bimodal = [0.3e-3] * 6 + [1.8e-3] * 2
    assert typical_seconds(bimodal) == pytest.approx(0.675e-3)
    assert typical_seconds(bimodal) > float(np.median(bimodal)) * 2
    ten = [1e-3] * 8 + [0.9e-3, 50e-3]
    assert typical_seconds(ten) == pytest.approx(1e-3)
    assert typical_seconds([1e-3, 2e-3, 6e-3]) == pytest.approx(3e-3)
    assert COMM_SAMPLES >= 10  # enough to drop one at each end
    with pytest.raises(ValueError):
        typical_seconds([])


def test_busy_slowdown_compares_timings_of_the_same_round() -> None:
    """Other processes' load that comes and goes between rounds cancels out of the busy
    slowdown: every round times g = 1 and g = 2 back to back. Medians of whole series taken
    one g after another (the old measurement) read a load that arrived while g = 2 was
    timed as a 2x slowdown."""
    from shardplan.measure._overheads import slowdown_ratios

    load = [1.0, 1.0, 2.0, 2.0, 2.0]  # another session starts computing after round 2
    rounds = [{1: 0.03 * f, 2: 0.033 * f, 3: 0.06 * f} for f in load]
    got = slowdown_ratios(rounds)
    assert got == {"1": 1.0, "2": pytest.approx(1.1), "3": pytest.approx(2.0)}
    assert slowdown_ratios([{1: 0.0, 2: 1.0}]) == {"1": 1.0, "2": 1.0}  # nothing to divide


def _dtensor_program_child(out: str) -> None:
    """In a spawned process: a one-rank gloo group, the measurement with the program's
    ``forward`` spied on, the result written to ``out``; then ``os._exit`` (a gloo group
    torn down by the interpreter can abort the process at exit, and in the test process
    itself that took a pytest worker down)."""
    import json
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from shardplan.measure import _programs
    from shardplan.runtime import _dtensor

    calls = []
    real = _dtensor.ShardedProgram.forward

    def spy(self, *args):
        calls.append(len([n for n in self.program.graph.nodes if n.op == "call_function"]))
        return real(self, *args)

    _dtensor.ShardedProgram.forward = spy
    import torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        got = _programs._dtensor_program(torch, dist, torch.device("cpu"),
                                         lambda: None, mesh, repeats=2, warmup=1)
    finally:
        dist.destroy_process_group()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"calls": calls, "got": got}, fh)
    os._exit(0)


@pytest.mark.torch
def test_dtensor_overhead_is_measured_on_the_runtimes_sharded_program(tmp_path) -> None:
    """What DTensor adds per operator is measured running a program as the runtime does
    (its ShardedProgram over an exported, split program of transformer blocks), per graph
    operator of that program, not bare DTensor operators in a loop (a third of it); and
    per byte of the operators' outputs, from the same blocks at a second size. Runs in a
    spawned process (:func:`_dtensor_program_child`)."""
    import json
    import multiprocessing as mp

    pytest.importorskip("torch")
    from shardplan.measure import _timing

    out = tmp_path / "got.json"
    proc = mp.get_context("spawn").Process(target=_dtensor_program_child, args=(str(out),))
    proc.start()
    proc.join(timeout=300)
    assert proc.exitcode == 0, f"the measuring process exited with {proc.exitcode}"
    data = json.loads(out.read_text())
    calls, got = data["calls"], data["got"]
    # each of the two sizes: a warm-up round and at least 5 timed ones
    assert len(calls) == 2 * (1 + 5) and calls[0] > 10 * _timing.BLOCKS // 2
    assert set(got) == {"per_op", "per_byte"}
    assert len(got["per_op"]) == 2 and all(0 < x < 1e-2 for x in got["per_op"])
    assert len(got["per_byte"]) == 2 and all(0 <= x < 1e-6 for x in got["per_byte"])


def test_dtensor_rates_solve_per_operator_and_per_byte() -> None:
    """Two programs' extras give both rates exactly; noise that makes the per-byte rate
    negative leaves the small program pricing operators alone, and a negative per-operator
    rate leaves the large program's bytes carrying all of it."""
    from shardplan.measure._programs import dtensor_rates

    op, byte = 40e-6, 0.06e-9
    small, large = (28.0, 65e3), (28.0, 17.7e6)
    got = dtensor_rates((small[0] * op + small[1] * byte, *small),
                        (large[0] * op + large[1] * byte, *large))
    assert got == pytest.approx((op, byte), rel=1e-9)
    # different operator counts: still the pair of equations
    got = dtensor_rates((10 * op + 1e3 * byte, 10.0, 1e3), (30 * op + 1e6 * byte, 30.0, 1e6))
    assert got == pytest.approx((op, byte), rel=1e-9)
    assert dtensor_rates((1e-3, 10.0, 1e3), (0.9e-3, 10.0, 1e6)) == (1e-4, 0.0)
    assert dtensor_rates((-1e-3, 10.0, 1e3), (-2e-3, 10.0, 1e6)) == (0.0, 0.0)
    assert dtensor_rates((0.0, 10.0, 1e3), (2e-3, 10.0, 1e6)) == (0.0, pytest.approx(2e-9))
    assert dtensor_rates((-1e-3, 10.0, 1e3), (2e-3, 10.0, 1e6)) == (0.0, pytest.approx(2e-9))


def test_fsdp_gather_overhead_compares_timings_of_the_same_round() -> None:
    """The FSDP step, the plain step and the bare all-gather are timed back to back in each
    round and the overhead is taken per round: a few rounds hit by other processes' load
    are outvoted. The old measurement took the medians of three separate series, timed one
    after the other: load arriving during the FSDP series alone counted wholly as FSDP
    overhead (18 us to 4.4 ms across runs on this machine)."""
    from shardplan.measure._overheads import fsdp_gather_overhead

    true = 1e-3  # per gather, 8 gathers per FSDP step

    def round_(load: float) -> tuple[float, float, float]:
        return 0.01 * load, (0.01 + 8 * (true + 2e-4)) * load, 2e-4 * load

    rounds = [round_(f) for f in (1, 3, 1, 3, 1)]
    assert fsdp_gather_overhead(rounds, 8) == pytest.approx(true)
    old = (0.01 * 1 + 8 * (true + 2e-4) * 3 - 0.01) / 8 - 2e-4  # FSDP series loaded alone
    assert old > 2.5 * true
    assert fsdp_gather_overhead([], 8) == 0.0
    assert fsdp_gather_overhead([(1.0, 0.5, 0.0)], 8) == 0.0  # never negative


def test_host_sync_point_is_each_syncs_cost_beyond_the_one_at_the_end() -> None:
    """Of 4 pieces of 2 ms with an all-gather of 0.5 ms: one sync at the end takes
    8 + 0.5 + w ms (w: the wait for the slower rank, paid by both runs), a sync after every
    piece 8 + 4 x 0.5 + w + 3 x 1.5 ms: 1.5 ms per extra sync, whatever w is in the
    round; a preempted round of ten is dropped; never below 0."""
    from shardplan.measure._overheads import host_sync_point

    def round_(w: float, extra: float = 1.5e-3) -> tuple[float, float, float, float]:
        return 8.5e-3 + w, 10e-3 + w + 3 * extra, 2e-3, 8e-3

    rounds = [round_(w) for w in (0.0, 3e-3, 1e-3, 0.0, 2e-3, 0.0, 1e-3, 0.0, 0.0)]
    rounds.append((8.5e-3, 90e-3, 2e-3, 8e-3))  # preempted while syncing after each piece
    compute, extra = host_sync_point(rounds, 4)
    assert compute == pytest.approx(2e-3) and extra == pytest.approx(1.5e-3)
    assert host_sync_point([round_(0.0, -1e-3)] * 3, 4)[1] == 0.0
