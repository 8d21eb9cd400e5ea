"""The expected goodput of a run whose devices fail (issue 48, item 4): the formula's limits
and the terms of a failure with and without re-planning."""

from __future__ import annotations

import math

import pytest

from shardplan.errors import ShardplanError
from shardplan.simulate._failures import (
    LLAMA3_RATE,
    FailureModel,
    Recovery,
    goodput,
    parse_rate,
    replan_loss,
)

M = FailureModel(rate=2e-5, devices=16384, checkpoint_interval=1800.0, checkpoint_write=20.0,
                 restart=600.0, repair=600.0)


def test_no_failures_is_all_goodput() -> None:
    m = FailureModel(rate=0.0, devices=16384, checkpoint_interval=1800.0,
                     checkpoint_write=30.0, restart=600.0, repair=3600.0)
    g = goodput(5.0, m, Recovery(step_seconds=6.0, reshard_seconds=10.0))
    assert g.without_replan == g.with_replan == 1.0
    assert g.failures_per_hour == 0 and g.nodes_down == 0


def test_the_llama3_rate_is_the_published_count() -> None:
    assert pytest.approx(419 / (54 * 24 * 16384)) == LLAMA3_RATE
    assert parse_rate("llama3") == parse_rate("LLaMA3") == LLAMA3_RATE
    # 419 interruptions in 54 days on 16,384 GPUs: 7.76 a day
    assert pytest.approx(419 / 54) == LLAMA3_RATE * 16384 * 24
    for bad in ("often", "-1", "inf", "nan"):
        with pytest.raises(ShardplanError):
            parse_rate(bad)


def test_restart_loses_half_an_interval_the_write_and_the_restart() -> None:
    g = goodput(5.0, M)
    assert g.restart_loss == 900.0 + 20.0 + 600.0
    lam = 2e-5 * 16384 / 3600
    assert g.without_replan == pytest.approx(1 / (1 + lam * 1520.0))
    assert g.with_replan == g.without_replan and not g.replans  # no recovery given


def test_replan_terms_by_hand() -> None:
    rec = Recovery(step_seconds=6.0, reshard_seconds=4.0, reshard_back_seconds=3.0,
                   plan_seconds=8.0)
    # half a step, the search, both reshards, and 600 s at 5/6 of the speed
    assert replan_loss(5.0, M, rec) == pytest.approx(2.5 + 8.0 + 4.0 + 3.0 + 100.0)
    lost = Recovery(step_seconds=6.0, reshard_seconds=4.0, rollback=True)
    assert replan_loss(5.0, M, lost) == pytest.approx(2.5 + 4.0 + 100.0 + 900.0 + 20.0)
    assert math.isinf(replan_loss(5.0, M, Recovery(step_seconds=math.inf)))
    # a faster layout after the failure loses no speed
    assert replan_loss(5.0, M, Recovery(step_seconds=4.0)) == pytest.approx(2.5)


def test_replanning_never_loses_more_than_restarting() -> None:
    slow = Recovery(step_seconds=1e6, reshard_seconds=1e5)
    g = goodput(5.0, M, slow)
    assert g.with_replan == g.without_replan and not g.replans
    fast = Recovery(step_seconds=5.5, reshard_seconds=2.0)
    g = goodput(5.0, M, fast)
    assert g.with_replan > g.without_replan and g.replans


def test_goodput_falls_as_failures_rise() -> None:
    rates = [0.0, 1e-6, 1e-5, 1e-4, 1e-3]
    values = [goodput(5.0, FailureModel(r, 1024, 1800.0, restart=600.0)).without_replan
              for r in rates]
    assert values == sorted(values, reverse=True) and values[0] == 1.0


def test_bad_models() -> None:
    with pytest.raises(ShardplanError, match="checkpoint interval"):
        FailureModel(1e-5, 8, 0.0)
    with pytest.raises(ShardplanError, match="restart"):
        FailureModel(1e-5, 8, 60.0, restart=-1.0)
    with pytest.raises(ShardplanError, match="device"):
        FailureModel(1e-5, 0, 60.0)
