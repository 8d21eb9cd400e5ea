"""``shardplan capture``: files, errors in one line, lazy torch import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import run_cli


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = run_cli(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_module_imports_without_torch() -> None:
    code = ("import sys, shardplan.cli.capture, shardplan.capture; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


@pytest.mark.torch
def test_capture_mlp_writes_a_loadable_graph(tmp_path, capsys) -> None:
    pytest.importorskip("torch")
    from shardplan.ir import load_graph

    path = tmp_path / "g.json"
    rc, out, err = run(["capture", "mlp", "--batch-size", "4", "-o", str(path)], capsys)
    assert rc == 0, err
    assert "wrote graph to" in out and "6 nodes" in out
    graph = load_graph(path)
    assert graph.num_nodes == 6 and graph.batch_size == 4 and graph.name == "mlp"
    assert json.loads(path.read_text())["format"] == "shardplan.graph/1"


@pytest.mark.torch
def test_capture_module_level_json(capsys) -> None:
    pytest.importorskip("torch")
    rc, out, err = run(["capture", "mlp", "--granularity", "module", "--atomic", "Linear",
                        "--json", "--name", "paper-mlp", "--mode", "eval"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    assert data["name"] == "paper-mlp" and len(data["nodes"]) == 3
    assert data["granularity"] == "module" and data["mode"] == "eval"


@pytest.mark.torch
@pytest.mark.parametrize(("argv", "match"), [
    (["capture", "nope"], "unknown model 'nope'"),
    (["capture", "torchvision:resnet999"], "unknown torchvision"),
    (["capture", "no_such_file.py:make"], "does not exist"),
    (["capture", "mlp", "--granularity", "module", "--atomic", "Conv2d"],
     "atomic module type 'Conv2d' is not in the model"),
    (["capture", "mlp", "--atomic", "Linear"], "--atomic needs --granularity module"),
    (["capture", "mlp", "--granularity", "module"], "needs --atomic"),
    (["capture", "mlp", "--batch-size", "0"], "expected a positive integer"),
    (["capture", "mlp", "--granularity", "layer"], "invalid choice"),
    (["capture"], "capture needs a MODEL"),
])
def test_errors_are_one_line(tmp_path, capsys, argv: list[str], match: str) -> None:
    pytest.importorskip("torch")
    rc, out, err = run([*argv, "-o", str(tmp_path / "g.json")], capsys)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("shardplan: error: ")
    assert match in err
    assert not (tmp_path / "g.json").exists()


@pytest.mark.torch
def test_bad_user_function(tmp_path, capsys) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "m.py"
    path.write_text("def make():\n    return 'not a model'\n")
    for func, match in [("make", "must return (model, example_inputs)"),
                        ("missing", "has no function 'missing'")]:
        rc, _, err = run(["capture", f"{path}:{func}", "--json"], capsys)
        assert rc == 2 and err.count("\n") == 1 and match in err


@pytest.mark.torch
def test_user_function_capture(tmp_path, capsys) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "m.py"
    path.write_text("import torch\n"
                    "def make():\n"
                    "    m = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh())\n"
                    "    return m, (torch.randn(7, 3),)\n")
    rc, out, err = run(["capture", f"{path}:make", "--json"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    assert data["batch_size"] == 7 and data["name"] == "make"
    assert [n["op"] for n in data["nodes"]] == ["linear", "tanh"]


def test_missing_output_is_an_error(capsys) -> None:
    rc, _, err = run(["capture", "mlp"], capsys)
    assert rc == 2 and "-o FILE or --json" in err


@pytest.mark.torch
def test_list_models(capsys) -> None:
    pytest.importorskip("torch")
    rc, out, _ = run(["capture", "--list-models"], capsys)
    assert rc == 0
    assert {"mlp", "transformer", "transformers:gpt2", "torchvision:resnet152"} <= set(
        out.split())


@pytest.mark.torch
def test_through_the_real_main(tmp_path, capsys) -> None:
    pytest.importorskip("torch")
    from shardplan.cli.main import main
    from shardplan.ir import load_graph

    path = tmp_path / "g.json"
    assert main(["capture", "mlp", "-o", str(path)]) == 0
    assert load_graph(path).num_nodes == 6
    capsys.readouterr()
    assert main(["capture", "torchvision:nonet", "-o", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardplan: error: unknown torchvision")


@pytest.mark.torch
def test_capture_meta_flag_and_automatic_meta(tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("torch")
    from shardplan.workload import zoo

    spec = "gpt:hidden=32,layers=2,heads=4,vocab=64,seq=8"
    rc, out, err = run(["capture", spec, "--meta", "--batch-size", "2", "--json"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    assert data["device"] == "meta" and "note" not in err
    assert data["transformer"]["parameters"] == data["parameters"]
    monkeypatch.setattr(zoo, "_memory_bytes", lambda: 1000)  # nothing fits: meta by size
    rc, out, err = run(["capture", spec, "--batch-size", "2", "--json"], capsys)
    assert rc == 0, err
    notes = [line for line in err.splitlines() if line.startswith("shardplan: note:")]
    assert len(notes) == 1 and "meta device" in notes[0]
    assert json.loads(out)["device"] == "meta"
