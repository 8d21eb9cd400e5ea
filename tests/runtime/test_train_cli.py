"""``shardplan train`` and ``python -m shardplan.runtime`` (under torchrun)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from helpers import run_cli  # noqa: E402

from shardplan.ir import load_graph, save  # noqa: E402
from shardplan.runtime import contiguous_plan  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("train")
    g, t, p = str(d / "g.json"), str(d / "t.json"), str(d / "p.json")
    assert run_cli(["capture", "mlp", "--batch-size", "8", "-o", g]) == 0
    assert run_cli(["topology", "flat", "--devices", "2", "-o", t]) == 0
    save(contiguous_plan(load_graph(g), 2, 1), p)
    return {"graph": g, "topo": t, "plan": p, "dir": str(d)}


def test_baseline_single_prints_losses_and_times(files, capsys) -> None:
    argv = ["train", files["plan"], files["graph"], files["topo"], "--steps", "3",
            "--baseline", "single", "--microbatches", "2", "--json"]
    assert run_cli(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["losses"]) == len(out["seconds_per_step"]) == 3
    assert out["kind"] == "single" and out["processes"] == 1
    assert all(s > 0 for s in out["seconds_per_step"])


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "positive integer"),
    (["--steps", "1", "--microbatches", "3"], "not divisible"),
    (["--steps", "1", "--resume"], "--checkpoint-dir"),
])
def test_bad_input_is_one_line_exit_2(files, capsys, argv, message) -> None:
    code = run_cli(["train", files["plan"], files["graph"], files["topo"], *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.multiprocess
def test_error_in_a_rank_is_one_line(files, capsys) -> None:
    code = run_cli(["train", files["plan"], files["graph"], files["topo"], "--steps", "1",
                    "--model", "nosuchmodel"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("shardplan: error: training failed on rank ")
    assert "unknown model" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.multiprocess
def test_pipeline_run_matches_single(files, capsys) -> None:
    base = ["train", files["plan"], files["graph"], files["topo"], "--steps", "2",
            "--microbatches", "2", "--json"]
    assert run_cli(base) == 0
    piped = json.loads(capsys.readouterr().out)
    assert run_cli([*base, "--baseline", "single"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert piped["processes"] == 2 and piped["kind"] == "pipeline"
    assert piped["losses"] == pytest.approx(single["losses"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchrun_entry_point(files) -> None:
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "shardplan.runtime",
         files["plan"], files["graph"], files["topo"], "--steps", "2", "--microbatches", "2",
         "--json"], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("{")][-1]
    out = json.loads(line)
    assert len(out["losses"]) == 2 and out["processes"] == 2
