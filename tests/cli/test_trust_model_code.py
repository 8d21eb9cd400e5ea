"""A graph or plan file never runs code: a graph whose ``model`` field names a Python file
(``evil.py:build``) is trained only with ``--trust-model-code`` on the command line; a spec
typed on the command line is the user's own choice (issue 34)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers import run_cli  # noqa: E402

from shardplan.ir import ExecutionSettings, load_graph, save  # noqa: E402
from shardplan.runtime import contiguous_plan  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("trust")
    g, t, p = str(d / "g.json"), str(d / "t.json"), str(d / "p.json")
    assert run_cli(["capture", "mlp", "--batch-size", "4", "-o", g]) == 0
    assert run_cli(["topology", "flat", "--devices", "2", "-o", t]) == 0
    evil = d / "evil.py"
    marker = d / "ran"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\n"
                    "def build():\n    raise SystemExit(7)\n")
    graph = load_graph(g)
    spec = f"{evil}:build"
    save(replace(graph, meta={**graph.meta, "model": spec}), g)
    settings = ExecutionSettings(microbatches=2, microbatch_size=2, schedule="gpipe",
                                 optimizer="sgd")
    save(replace(contiguous_plan(load_graph(g), 2, 1), execution=settings), p)
    return {"graph": g, "topo": t, "plan": p, "spec": spec, "marker": str(marker)}


@pytest.fixture
def no_spawn(monkeypatch):
    import shardplan.runtime._launch as launch

    def refuse(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch, "run_ranks", refuse)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("shardplan: error: "), err
    return err


def test_train_refuses_a_graph_naming_code(files, capsys, no_spawn) -> None:
    code = run_cli(["train", files["plan"], files["graph"], files["topo"], "--steps", "1"])
    assert code == 2
    assert "--trust-model-code" in _one_line(capsys)
    assert not Path(files["marker"]).exists()


def test_plan_run_refuses_a_graph_naming_code_before_searching(files, capsys,
                                                                monkeypatch) -> None:
    import shardplan.planner as planner

    def refuse(*args, **kwargs):
        raise AssertionError("searched")

    monkeypatch.setattr(planner, "search", refuse)
    code = run_cli(["plan", files["graph"], "--cluster", files["topo"], "--run",
                    "--families", "data-parallel"])
    assert code == 2
    assert "--trust-model-code" in _one_line(capsys)
    assert not Path(files["marker"]).exists()


@pytest.mark.parametrize("extra", [["--trust-model-code"], ["--model", "{spec}"]])
def test_the_command_line_may_allow_it(files, no_spawn, extra) -> None:
    extra = [a.format(**files) for a in extra]
    with pytest.raises(AssertionError, match="a process was started"):  # past every check
        run_cli(["train", files["plan"], files["graph"], files["topo"], "--steps", "1",
                 *extra])
