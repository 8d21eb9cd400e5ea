"""Schedules as data: generators, the text form, validation; interleaved vs torch's order."""

from __future__ import annotations

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
    again = Schedule.from_text(sch.to_text())
    assert again == sch
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
    assert Schedule.from_text(sch.to_text()) == sch


def test_known_orders() -> None:
    assert [str(a) for a in one_f_one_b(3, 4).ranks[0]] == [
        "0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3", "0REDUCE_GRAD"]
    assert [str(a) for a in gpipe(2, 2).ranks[1]] == ["1F0", "1F1", "1B0", "1B1",
                                                       "1REDUCE_GRAD"]


def test_text_without_header() -> None:
    sch = Schedule.from_text("0F0,0B0,0REDUCE_GRAD\n1F0,1B0,1REDUCE_GRAD\n")
    assert sch.num_stages == 2 and sch.num_microbatches == 1 and sch.stage_rank == (0, 1)


@pytest.mark.parametrize("text, match", [
    ("0F0,0B0\n", "never runs|REDUCE"),
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
