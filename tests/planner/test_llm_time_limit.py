"""The LLM family's time limit (issue 38), on a clock the test moves: the search simulates
until the limit has passed, not once it is reached, says it was cut short, and hands the
limit on from the family's rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import shardplan.simulate._llm as simulate_llm_module
from shardplan.ir import ExecutionSettings
from shardplan.planner import _llm
from shardplan.planner._llm import family_rows, llm_search
from shardplan.topology import build
from tests.cost.llm_graph import gpt_graph


class _Clock:
    """Stands in for the ``time`` module: ``monotonic`` reads ``now``."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def slow_sims(monkeypatch):
    """Every simulation takes ``step`` seconds of the test's clock and 1e9 s of iteration
    (so no bound ever stops the search before its time does); returns (clock, sims)."""
    clock, sims = _Clock(), []

    def make(step: float):
        def simulate(plan, graph, topology, settings, **kw):
            sims.append(plan)
            clock.now += step
            return SimpleNamespace(iteration_seconds=1e9)

        monkeypatch.setattr(_llm, "time", clock)
        monkeypatch.setattr(simulate_llm_module, "simulate_llm", simulate)
        return clock, sims
    return make


@pytest.fixture(scope="module")
def inputs():
    return gpt_graph(layers=4, hidden=32, seq=16, vocab=64), build("dgx1")


def test_the_search_simulates_until_its_limit_has_passed(inputs, slow_sims) -> None:
    """1 s a simulation, a 3 s limit: the 4th starts at 3 s (not past it); the 5th would
    start past it, and the search says it was cut short."""
    _, sims = slow_sims(1.0)
    found = llm_search(*inputs, ExecutionSettings(), global_batch=16, time_limit=3.0)
    assert found.timed_out is True
    assert len(sims) == 4 == sum(c.fits for c in found.ranked)
    assert found.seconds == 4.0


def test_a_search_whose_clock_has_not_passed_a_limit_of_nothing_runs(inputs,
                                                                      slow_sims) -> None:
    """A 0 s limit on a clock that stands still is never passed: every layout is priced and
    simulated."""
    _, sims = slow_sims(0.0)
    found = llm_search(*inputs, ExecutionSettings(), global_batch=16, time_limit=0.0)
    assert not found.timed_out and found.considered > 0
    assert len(sims) == sum(c.fits for c in found.ranked) > 4


def test_the_familys_rows_say_their_search_was_cut_short(inputs, slow_sims) -> None:
    """A quarter of a second a simulation: the 224 layouts that fit take 56 s, more than
    the family's 3 s (the 13th is cut), less than the search's own default of 60 s."""
    _, sims = slow_sims(0.25)
    rows = family_rows(*inputs, ExecutionSettings(), global_batch=16, time_limit=3.0)
    assert rows and all(r["timed_out"] is True for r in rows)
    assert len(sims) == 13
