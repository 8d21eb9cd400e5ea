"""Every command's outputs go through the one writer: an output naming one of the command's
inputs, or a symbolic link out of its folder, is one line and exit 2 before any work, and the
input is left as it was."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

import pytest

from shardplan.cli.main import build_parser, main
from shardplan.generate import generate
from shardplan.ir import save
from shardplan.topology import build


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    from shardplan import registry

    graph = generate("chain", num_nodes=6, seed=0)
    topo = build("flat", num_devices=2)
    plan = registry.run("partition", "uniform", graph, topo, stages=2).plan
    out = {}
    for name, obj in (("g", graph), ("t", topo), ("p", plan)):
        save(obj, tmp_path / f"{name}.json")
        out[name] = str(tmp_path / f"{name}.json")
    (tmp_path / "m.py").write_text("def build():\n    raise SystemExit(9)\n")
    out["m"] = str(tmp_path / "m.py")
    return out


CASES = {
    "export -o PLAN": lambda f: ["export", f["p"], f["g"], f["t"], "--to", "torch",
                                 "-o", f["p"]],
    "plan -o TOPO": lambda f: ["plan", f["g"], "--cluster", f["t"], "-o", f["t"]],
    "plan --report GRAPH": lambda f: ["plan", f["g"], "--cluster", f["t"], "--report", f["g"]],
    "simulate --schedule-out PLAN": lambda f: ["simulate", f["p"], f["g"], f["t"],
                                               "--schedule-out", f["p"]],
    "simulate -o GRAPH": lambda f: ["simulate", f["p"], f["g"], f["t"], "-o", f["g"]],
    "partition -o GRAPH": lambda f: ["partition", f["g"], f["t"], "--algorithm", "uniform",
                                     "--stages", "2", "-o", f["g"]],
    "map -o PLAN": lambda f: ["map", f["p"], f["g"], f["t"], "--algorithm", "consecutive",
                              "-o", f["p"]],
    "train -o PLAN": lambda f: ["train", f["p"], f["g"], f["t"], "--steps", "1", "-o", f["p"]],
    "report -o TOPO": lambda f: ["report", f["p"], f["g"], f["t"], "-o", f["t"]],
    "strategy -o GRAPH": lambda f: ["strategy", f["g"], "--devices", "2", "-o", f["g"]],
    "capture FILE.py -o FILE.py": lambda f: ["capture", f"{f['m']}:build", "-o", f["m"]],
    "import -o PROFILE": lambda f: ["import", "pipedream", f["g"], "-o", f["g"]],
    "output by another spelling": lambda f: [
        "partition", f["g"], f["t"], "--algorithm", "uniform", "--stages", "2",
        "-o", os.path.join(os.path.dirname(f["g"]), ".", "g.json")],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_input_named_as_output_is_refused(case: str, files: dict[str, str],
                                             capsys) -> None:
    before = {k: Path(v).read_bytes() for k, v in files.items()}
    assert main(CASES[case](files)) == 2, case
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shardplan: error: "), err
    assert "one of this command's inputs" in err[0]
    assert {k: Path(v).read_bytes() for k, v in files.items()} == before


def test_a_symlink_out_of_the_folder_is_refused(tmp_path: Path, files: dict[str, str],
                                                capsys) -> None:
    (tmp_path / "out").mkdir()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("keep")
    (tmp_path / "out" / "plan.json").symlink_to(elsewhere)
    argv = ["partition", files["g"], files["t"], "--algorithm", "uniform", "--stages", "2",
            "-o", str(tmp_path / "out" / "plan.json")]
    assert main(argv) == 2
    assert "outside its folder" in capsys.readouterr().err
    assert elsewhere.read_text() == "keep"


def test_a_fifo_output_is_not_replaced(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["generate", "chain", "--nodes", "3", "-o", str(fifo)]) == 2  # no reader
    assert "no reader" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    out = {}
    for name, p in sub.choices.items():
        nested = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            out.update({f"{name} {k}": v for k, v in nested[0].choices.items()})
        else:
            out[name] = p
    return out


_FILE_DESTS = {"output", "report", "schedule_out", "timeline", "export_tables", "plan",
               "graph", "topology", "file", "profile", "schedule_file", "import_tables",
               "model", "cluster"}


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_command_tells_the_writer_its_files(name: str) -> None:
    p = _commands()[name]
    assert "input_args" in p._defaults and "output_args" in p._defaults, name
    declared = set(p._defaults["input_args"]) | set(p._defaults["output_args"])
    # flags (capture --profile) and choices (map --model p2p) are not files
    dests = {a.dest for a in p._actions if a.nargs != 0 and a.choices is None}
    assert declared <= dests, declared - dests
    files = dests & _FILE_DESTS
    assert files <= declared, files - declared
