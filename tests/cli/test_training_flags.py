"""The training-setting flags (--precision, --recompute, --gradient-sync,
--sequence-parallel, --tp-comm-overlap): on every command that plans or simulates,
recorded in the plan, overriding it later with a note, bad values in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardplan.generate import chain
from shardplan.ir import load_plan, save
from shardplan.topology import build
from tests.helpers import run_cli

FLAGS = ["--precision", "bf16", "--recompute", "selective", "--gradient-sync", "zero1",
         "--sequence-parallel", "--tp-comm-overlap"]


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str, str, str]:
    g, t, h = tmp_path / "g.json", tmp_path / "t.json", tmp_path / "h.json"
    save(chain(8), g)
    save(build("dgx-a100", nodes=1), t)
    save(build("dgx-h100", nodes=1), h)
    return str(g), str(t), str(h), str(tmp_path / "p.json")


def test_partition_records_the_training_settings(files) -> None:
    g, t, _, p = files
    assert run_cli(["partition", g, t, "--algorithm", "uniform", "--stages", "2",
                    "--replicas", "4", *FLAGS, "-o", p]) == 0
    s = load_plan(p).settings
    assert (s.precision, s.recompute, s.gradient_sync) == ("bf16", "selective", "zero1")
    assert s.sequence_parallel and s.tp_comm_overlap
    execution = json.loads(Path(p).read_text())["execution"]
    assert execution["precision"] == "bf16" and execution["mixed_precision"] is True


def test_later_commands_override_with_a_note(files, capsys) -> None:
    g, t, h, p = files
    assert run_cli(["partition", g, t, "--algorithm", "uniform", "--stages", "2",
                    "--replicas", "4", *FLAGS, "-o", p]) == 0
    capsys.readouterr()
    assert run_cli(["simulate", p, g, t, "--recompute", "--gradient-sync", "end",
                    "--json"]) == 0
    out = capsys.readouterr()
    sim = json.loads(out.out)
    assert sim["options"]["recompute"] == "full" and sim["options"]["gradient_sync"] == "end"
    assert "recompute full overrides the plan's selective" in out.err
    # fp8 runs on H100s, and is refused in one line on A100s
    assert run_cli(["simulate", p, g, h, "--precision", "fp8", "--json"]) == 0
    capsys.readouterr()
    assert run_cli(["simulate", p, g, t, "--precision", "fp8", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("shardplan: error: precision fp8 needs")


@pytest.mark.parametrize("command", ["partition", "map", "simulate", "report", "export",
                                     "plan", "strategy"])
def test_every_planning_or_simulating_command_takes_the_flags(command, capsys) -> None:
    run_cli([command, "--help"])
    text = capsys.readouterr().out
    for flag in ("--precision", "--recompute", "--gradient-sync", "--sequence-parallel",
                 "--tp-comm-overlap"):
        assert flag in text, (command, flag)


@pytest.mark.parametrize("argv, match", [
    (["--precision", "fp4"], "invalid choice"), (["--recompute", "half"], "invalid choice"),
    (["--gradient-sync", "zero2"], "invalid choice"),
])
def test_bad_values_are_one_line(files, argv, match, capsys) -> None:
    g, t, _, p = files
    assert run_cli(["partition", g, t, "--algorithm", "uniform", *argv, "-o", p]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err


def test_config_file_takes_a_recompute_value(files, tmp_path) -> None:
    g, t, _, p = files
    conf = tmp_path / "c.toml"
    conf.write_text('recompute = "selective"\nprecision = "fp16"\n')
    assert run_cli(["--config", str(conf), "partition", g, t, "--algorithm", "uniform",
                    "--stages", "2", "-o", p]) == 0
    s = load_plan(p).settings
    assert (s.recompute, s.precision) == ("selective", "fp16")


def test_strategy_prices_and_records_the_training_settings(files) -> None:
    g, t, _, p = files
    assert run_cli(["strategy", g, "--topology", t, "--algorithm", "data-parallel",
                    "--precision", "bf16", "--recompute", "--quiet", "-o", p]) == 0
    s = load_plan(p).settings
    assert (s.precision, s.recompute, s.microbatches) == ("bf16", "full", 1)
    assert run_cli(["strategy", g, "--topology", t, "--algorithm", "data-parallel",
                    "--quiet", "-o", p]) == 0
    assert load_plan(p).settings.precision == "fp32"


def test_plan_on_a_cluster_preset_keeps_a_fixed_gradient_sync(files, tmp_path, capsys) -> None:
    g, _, _, p = files
    assert run_cli(["plan", g, "--cluster", "dgx-a100,nodes=1", "--families",
                    "data-parallel", "--workers", "1", "--gradient-sync", "zero1",
                    "--precision", "bf16", "-o", p, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["gradient_sync"] for r in data["ranked"]} == {"zero1"}
    s = load_plan(p).settings
    assert (s.gradient_sync, s.precision) == ("zero1", "bf16")
    assert run_cli(["plan", g, "--cluster", "dgx-a100,nodes=600", "-o", p]) == 2
    assert "4800 devices" in capsys.readouterr().err


def test_a_strategy_plan_refuses_zero1_in_one_line(files, capsys) -> None:
    g, t, _, p = files
    assert run_cli(["strategy", g, "--topology", t, "--algorithm", "data-parallel",
                    "--quiet", "-o", p]) == 0
    capsys.readouterr()
    assert run_cli(["simulate", p, g, t, "--gradient-sync", "zero1", "--json"]) == 2
    assert "not 'zero1'" in capsys.readouterr().err
