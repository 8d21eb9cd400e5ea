"""The package's top level: lazy imports, and the API functions that share a subpackage's name."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

import shardplan
from shardplan.generate import layered
from shardplan.topology import build


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)


def test_import_loads_no_numpy_and_sets_no_environment() -> None:
    proc = _run("import os, sys, shardplan, shardplan.cli.main\n"
                "assert 'numpy' not in sys.modules, 'numpy loaded'\n"
                "assert 'OMP_NUM_THREADS' not in os.environ\n"
                "g = shardplan.Graph\n"
                "assert 'numpy' in sys.modules and 'OMP_NUM_THREADS' not in os.environ\n"
                "print(shardplan.ir.__name__, g.__name__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["shardplan.ir", "Graph"]


def test_command_line_limits_threads_before_numpy_loads(tmp_path) -> None:
    shardplan.save(layered(5, seed=0), tmp_path / "g.json")
    proc = _run("import os, sys\n"
                "from shardplan.cli.main import main\n"
                "assert 'numpy' not in sys.modules\n"
                f"rc = main(['inspect', {str(tmp_path / 'g.json')!r}, '--json'])\n"
                "assert rc == 0 and os.environ['OMP_NUM_THREADS'] == '1'\n")
    assert proc.returncode == 0, proc.stderr


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        shardplan.no_such_name  # noqa: B018


def test_partition_function_survives_its_subpackage_import() -> None:
    g, t = layered(30, seed=0), build("flat", num_devices=4)
    first = shardplan.partition(g, t, algorithm="heuristic", workers=1)
    importlib.import_module("shardplan.partition.heuristic")  # binds it on the parent
    second = shardplan.partition(g, t, algorithm="heuristic", workers=1)
    assert first.objective.value == second.objective.value
    # Every import form still reaches the subpackage.
    import shardplan.partition as package
    import shardplan.partition._sharding_problem as search
    from shardplan.partition import heuristic

    assert package.heuristic is heuristic and search.Problem.__name__ == "Problem"
