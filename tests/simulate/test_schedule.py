"""Schedules as data: generators, the text form, validation; interleaved vs torch's order."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan.errors import ShardplanError
from shardplan.simulate import Action, Schedule, gpipe, interleaved_1f1b, make_schedule, one_f_one_b


def _in_flight(actions: tuple[Action, ...], stage: int) -> int:
    """Most micro-batches of ``stage`` whose forward ran and backward did not, in list order."""
    live = peak = 0
    for a in actions:
        if a.stage != stage:
            continue
        live += a.op == "F"
        live -= a.op == "B"
        peak = max(peak, live)
    return peak


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.sampled_from(["gpipe", "1f1b"]))
def test_text_round_trip_and_in_flight(s: int, m: int, name: str) -> None:
    sch = make_schedule(name, s, m)
    again = Schedule.from_text(sch.to_text(), sch.meta())
    assert again == sch
    assert Schedule.from_text(sch.to_text()) == dataclasses.replace(sch, name="custom")
    for r in range(s):
        want = m if name == "gpipe" else min(s - r, m)
        assert _in_flight(sch.ranks[r], r) == want
        assert str(sch.ranks[r][-1]) == f"{r}REDUCE_GRAD"


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 8))
def test_interleaved_valid_and_round_trips(p: int, v: int, m: int) -> None:
    rounds = max(1, m // p)
    if m % rounds:
        with pytest.raises(ShardplanError, match="multiple of the rounds"):
            interleaved_1f1b(p, v, m)
        return
    sch = interleaved_1f1b(p, v, m)
    assert sch.num_stages == p * v and sch.num_ranks == p
    assert sch.stage_rank == tuple(s % p for s in range(p * v))
    assert Schedule.from_text(sch.to_text(), sch.meta()) == sch


def test_known_orders() -> None:
    assert [str(a) for a in one_f_one_b(3, 4).ranks[0]] == [
        "0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3", "0REDUCE_GRAD"]
    assert [str(a) for a in gpipe(2, 2).ranks[1]] == ["1F0", "1F1", "1B0", "1B1",
                                                       "1REDUCE_GRAD"]


def test_text_without_header() -> None:
    sch = Schedule.from_text("0F0,0B0,0REDUCE_GRAD\n1F0,1B0,1REDUCE_GRAD\n")
    assert sch.num_stages == 2 and sch.num_microbatches == 1 and sch.stage_rank == (0, 1)


@pytest.mark.parametrize("text, match", [
    ("0F0\n", "never runs 0B0"),
    ("0F0,0I0\n", "never runs 0W0"),
    ("0F0,0W0\n", "weight gradient before its input"),
    ("0F0,0I0,0B0\n", "backward ran already"),
    ("0F0,0RECV_B0,0B0\n", "communication or FSDP action"),
    ("0B0,0F0,0REDUCE_GRAD\n", "backward before its forward"),
    ("0F0,0F0,0B0,0REDUCE_GRAD\n", "twice"),
    ("0F0,0REDUCE_GRAD,0B0\n", "before the stage's last backward"),
    ("0X0\n", "cannot read"),
    ("\n", "no rank lines"),
])
def test_invalid_schedules(text: str, match: str) -> None:
    with pytest.raises(ShardplanError, match=match):
        Schedule.from_text(text)


def test_action_text() -> None:
    assert Action.from_str("12B3") == Action(12, "B", 3)
    with pytest.raises(ShardplanError):
        Action(0, "F")
    with pytest.raises(ShardplanError):
        make_schedule("zero-bubble", 2, 2)
    with pytest.raises(ShardplanError, match="multiple of the virtual"):
        make_schedule("interleaved-1f1b", 3, 2)


@pytest.mark.torch
def test_interleaved_matches_torch() -> None:
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    for p in (1, 2, 3, 4):
        for v in (1, 2, 3):
            for m in (1, 2, 4, 6, 8):
                rounds = max(1, m // p)
                if m % rounds:
                    continue
                per = m // rounds
                mine = interleaved_1f1b(p, v, m)
                for r in range(p):
                    w = sched._get_warmup_ops(r, v, per, p, m, 2)

                    def fwd(step: int, r: int = r, per: int = per, v: int = v,
                            p: int = p) -> int:
                        return ((step // per) % v) * p + r

                    def bwd(step: int, r: int = r, w: int = w, per: int = per, v: int = v,
                            p: int = p) -> int:
                        return (v - 1 - ((step - w) // per) % v) * p + r

                    ops = sched._get_1f1b_rank_ops(v, p, w, v * m - w, w, r, fwd, bwd)
                    theirs = [str(a) for a in ops if a is not None]
                    assert theirs == [str(a) for a in mine.ranks[r] if a.op != "REDUCE_GRAD"]


def test_missing_reduce_grad_added_where_torch_puts_it() -> None:
    sch = Schedule.from_text("0F0,0F1,0I0,0I1,0W1,,0W0\n")
    assert [str(a) for a in sch.ranks[0]] == ["0F0", "0F1", "0I0", "0I1", "0W1", "0W0",
                                              "0REDUCE_GRAD"]
    assert sch.split_backward and sch.in_flight() == (2,)
    over = Schedule.from_text("0F0,(0F1;0B0)OVERLAP_F_B,0B1\n")
    assert str(over.ranks[0][1]) == "(0F1;0B0)OVERLAP_F_B"
    assert str(over.ranks[0][-1]) == "0REDUCE_GRAD" and not over.split_backward


def test_sidecar_files(tmp_path) -> None:
    from shardplan.simulate import load_schedule, save_schedule

    sch = interleaved_1f1b(2, 2, 4)
    path = tmp_path / "s.csv"
    side = save_schedule(sch, path)
    assert not path.read_text().startswith("#")
    assert load_schedule(path) == sch
    (tmp_path / "s.csv.meta.json").write_text("[1]")
    with pytest.raises(ShardplanError, match="JSON object"):
        load_schedule(path)
    assert side.endswith("s.csv.meta.json")


# Every schedule torch 2.14 generates (get_schedule_ops), for a few shapes:
# (name, stages per rank). Single-stage classes get 1.
_TORCH_SCHEDULES = [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 3),
                    ("LoopedBFS", 2), ("InterleavedZeroBubble", 2), ("ZBVZeroBubble", 2),
                    ("DualPipeV", 2)]


@pytest.mark.torch
@pytest.mark.parametrize("name, per_rank", _TORCH_SCHEDULES)
@pytest.mark.parametrize("ranks, microbatches", [(2, 4), (3, 6), (4, 8)])
def test_reads_every_torch_schedule(name: str, per_rank: int, ranks: int,
                                    microbatches: int) -> None:
    """Every torch schedule's actions read (or, 1F1B's rows from the visualizer, are refused
    in one line: it lists them with every rank at group rank 0), and the CSV we write is
    read back by torch's own loader into the same actions."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    if name == "DualPipeV" and microbatches < 2 * ranks:
        pytest.skip("DualPipeV needs at least 2 x ranks micro-batches")
    ops = get_schedule_ops(name, ranks, microbatches, num_stages_per_rank=per_rank)
    text = "".join(",".join("" if a is None else str(a) for a in row) + "\n" for row in ops)
    if name == "1F1B" and ranks > 1:
        # torch's visualizer mocks every stage at group rank 0: rank 1's row is shifted by one
        # micro-batch (1F1 .. 1F{M}); a real 1F1B run never lists that
        with pytest.raises(ShardplanError) as err:
            Schedule.from_text(text)
        assert "\n" not in str(err.value)
        return
    sch = Schedule.from_text(text)
    assert sch.num_stages == ranks * per_rank and sch.num_microbatches == microbatches
    assert sch.num_ranks == ranks
    assert sch.split_backward == (name in ("InterleavedZeroBubble", "ZBVZeroBubble",
                                           "DualPipeV"))
    for r, row in enumerate(ops):  # same actions in the same order, REDUCE_GRAD added
        mine = [str(a) for a in sch.ranks[r] if a.op != "REDUCE_GRAD"]
        assert mine == [str(a) for a in row if a is not None and "REDUCE" not in str(a)]
    _torch_loads(sch, per_rank)


def _torch_loads(sch: Schedule, per_rank: int) -> None:
    """torch's _PipelineScheduleRuntime._load_csv reads our CSV as it is and lowers it."""
    import tempfile
    from pathlib import Path
    from unittest import mock

    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod = 0, sch.num_ranks, None
    stage.num_stages = sch.num_stages
    runtime = _PipelineScheduleRuntime([stage] * max(per_rank, 1), sch.num_microbatches)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.csv"
        path.write_text(sch.to_text())
        runtime._load_csv(str(path))
    for r in range(sch.num_ranks):
        ours = [str(a) for a in sch.ranks[r]]
        assert [str(a) for a in runtime.pipeline_order[r]] == \
            [a for a in ours if "REDUCE" not in a]
        # lowered with sends and receives; torch's REDUCE_GRAD lands where ours is
        lowered = [str(a) for a in runtime.pipeline_order_with_comms[r]
                   if a.is_compute_op or a.computation_type.value == "REDUCE_GRAD"]
        assert lowered == ours


@pytest.mark.torch
def test_our_schedules_load_in_torch() -> None:
    pytest.importorskip("torch")
    for sch, per in ((gpipe(3, 4), 1), (one_f_one_b(2, 3), 1), (interleaved_1f1b(2, 2, 4), 2)):
        _torch_loads(sch, per)
