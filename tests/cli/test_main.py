"""The command line's entry: time limits that count the whole command."""

from __future__ import annotations

import importlib
import json
import sys
import time

import pytest

from shardplan.cli import _common
from shardplan.generate import layered
from shardplan.ir import save
from shardplan.topology import build

cli_main = importlib.import_module("shardplan.cli.main")  # the module (shardplan.cli.main is
# also the name of the function the package re-exports)


def test_time_left_counts_from_the_command_start() -> None:
    try:
        _common.set_command_start(time.monotonic() - 4.0)
        full = 10.0 * (1 - _common._WRITE_SHARE)
        assert full - 4.5 < _common.time_left(10.0) < full - 4.0
        _common.set_command_start(time.monotonic() - 60.0)
        assert _common.time_left(10.0) == pytest.approx(1e-3)  # out of time: still a plan
        assert _common.time_left(None) is None
    finally:
        _common.set_command_start(None)


def test_process_age_is_known_on_linux() -> None:
    age = cli_main._process_age()
    assert 0.0 <= age <= 60.0
    if sys.platform.startswith("linux"):
        assert age > 0.0


def test_time_spent_before_the_search_counts(tmp_path, monkeypatch, capsys) -> None:
    """A command whose start-up and loading used up its limit still writes a plan, marked
    timed_out, instead of searching for the whole limit again."""
    save(layered(60, seed=0), tmp_path / "g.json")
    save(build("flat", num_devices=4), tmp_path / "t.json")
    monkeypatch.setattr(cli_main, "_process_age", lambda: 30.0)  # as if started 30 s ago
    monkeypatch.setattr(sys, "argv", ["shardplan", "partition", str(tmp_path / "g.json"),
                                      str(tmp_path / "t.json"), "--algorithm", "heuristic",
                                      "--workers", "1", "--restarts", "50", "--time-limit",
                                      "20", "--json"])
    t0 = time.monotonic()
    assert cli_main.main() == 0
    assert time.monotonic() - t0 < 15.0
    plan = json.loads(capsys.readouterr().out)
    assert plan["status"] == "timed_out"
