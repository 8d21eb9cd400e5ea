"""``shardplan train`` and ``python -m shardplan.runtime`` (under torchrun): settings from the
plan, input shapes from the graph, errors before any process starts, a launcher that cleans
up (issues #12, #18, #22)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace

import pytest

pytest.importorskip("torch")

from helpers import run_cli  # noqa: E402

from shardplan.ir import ExecutionSettings, Objective, Plan, Stage, load_graph, save  # noqa: E402
from shardplan.runtime import contiguous_plan  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2 = "transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64"


def _env(**extra: str) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": ROOT + (os.pathsep + path if path else ""), **extra}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("train")
    g, t, p = str(d / "g.json"), str(d / "t.json"), str(d / "p.json")
    assert run_cli(["capture", "mlp", "--batch-size", "4", "-o", g]) == 0
    assert run_cli(["topology", "flat", "--devices", "2", "-o", t]) == 0
    graph = load_graph(g)
    plan = contiguous_plan(graph, 2, 1)
    settings = ExecutionSettings(microbatches=2, microbatch_size=2, schedule="gpipe",
                                 optimizer="sgd")
    save(replace(plan, execution=settings), p)
    # Stage 0 holds the first and last operators, stage 1 the middle: a cycle.
    n = graph.num_nodes
    order = [int(v) for v in graph.topological_order]
    cyc = Plan(graph=graph.name, topology="", algorithm="heuristic",
               objective=Objective("none", 0.0),
               stages=(Stage(tuple(sorted([order[0], order[-1]])), (0,)),
                       Stage(tuple(sorted(order[1:-1])), (1,))))
    assert n > 2
    cp = str(d / "cyclic.json")
    save(cyc, cp)
    return {"graph": g, "topo": t, "plan": p, "cyclic": cp, "dir": str(d)}


def test_single_baseline_reads_the_plans_settings(files, capsys) -> None:
    argv = ["train", files["plan"], files["graph"], files["topo"], "--steps", "3",
            "--baseline", "single", "--json"]
    assert run_cli(argv) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert len(out["losses"]) == len(out["seconds_per_step"]) == 3
    assert out["kind"] == "single" and out["processes"] == 1
    assert (out["microbatches"], out["microbatch_size"], out["global_batch"]) == (2, 2, 4)
    assert out["settings"]["schedule"] == "gpipe" and out["settings"]["optimizer"] == "sgd"
    assert cap.err == ""  # nothing overridden
    assert all(s > 0 for s in out["seconds_per_step"])


def test_flags_override_the_plan_in_one_line_each(files, capsys) -> None:
    argv = ["train", files["plan"], files["graph"], files["topo"], "--steps", "1",
            "--baseline", "single", "--json", "--microbatches", "4", "--global-batch", "16",
            "--optimizer", "adam", "--schedule", "1f1b"]
    assert run_cli(argv) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert (out["microbatches"], out["microbatch_size"], out["global_batch"]) == (4, 4, 16)
    notes = cap.err.splitlines()
    assert all(line.startswith("shardplan: note: ") for line in notes)
    assert {line.split()[2] for line in notes} == {"microbatches", "microbatch-size",
                                                   "optimizer", "schedule"}


def test_input_shapes_come_from_the_graph(tmp_path, capsys) -> None:
    from shardplan.runtime._args import input_sizes

    g = str(tmp_path / "g.json")
    assert run_cli(["capture", GPT2, "--batch-size", "2", "--seq-len", "12", "-o", g]) == 0
    graph = load_graph(g)
    assert graph.meta["input_shapes"] == [[2, 12]]
    seq, img, check, notes = input_sizes(graph, None, None)
    assert (seq, img, check, notes) == (12, None, ((12,),), [])
    seq, _, check, notes = input_sizes(graph, 16, None)
    assert seq == 16 and check is None and notes == ["seq-len 16 overrides the graph's 12"]
    r = str(tmp_path / "r.json")
    assert run_cli(["capture", "torchvision:resnet18", "--batch-size", "2", "--image-size",
                    "64", "-o", r]) == 0
    _, img, check, _ = input_sizes(load_graph(r), None, None)
    assert img == 64 and check == ((3, 64, 64),)


@pytest.fixture
def no_spawn(monkeypatch):
    """Fail the test if any rank is started."""
    import shardplan.runtime._launch as launch

    def refuse(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch, "run_ranks", refuse)


@pytest.mark.parametrize("extra,message", [
    (["--steps", "0"], "positive integer"),
    (["--steps", "1", "--microbatch-size", "3", "--global-batch", "8"], "is not"),
    (["--steps", "1", "--resume"], "--checkpoint-dir"),
    (["--steps", "1", "--model", "torchvision:resnet50"], "captured from 'mlp'"),
    (["--steps", "1", "--resume", "--checkpoint-dir", "{dir}/nosuch"], "does not exist"),
    (["--steps", "1", "--checkpoint-dir", "{graph}"], "is a file"),
    (["--steps", "1", "--nproc", "3"], "--nproc is for"),
])
def test_bad_input_is_one_line_exit_2_before_spawning(files, capsys, no_spawn, extra,
                                                      message) -> None:
    extra = [a.format(**files) for a in extra]
    code = run_cli(["train", files["plan"], files["graph"], files["topo"], *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("shardplan: error: ")
    assert message in err and "Traceback" not in err


def test_cyclic_plan_is_refused_before_spawning(files, capsys, no_spawn) -> None:
    code = run_cli(["train", files["cyclic"], files["graph"], files["topo"], "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "cycle" in err and len(err.strip().splitlines()) == 1


def test_runtime_module_without_torchrun_is_one_line(files) -> None:
    env = {k: v for k, v in _env().items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                        "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "shardplan.runtime", files["plan"],
                           files["graph"], files["topo"], "--steps", "1"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("shardplan: error: python -m shardplan.runtime runs under "
                                  "torchrun")
    assert len(done.stderr.strip().splitlines()) == 1


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (Linux /proc)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                parent[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def _maps(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_long_run(files, tmp_path) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardplan", "train", files["plan"], files["graph"],
         files["topo"], "--steps", "100000"], env=_env(TMPDIR=str(tmp_path)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    kids: list[int] = []
    while time.monotonic() < deadline:  # both ranks started and training
        kids = _children(proc.pid)
        if len(kids) >= 3 and any(n.startswith("shardplan-train-") for n in os.listdir(tmp_path)) \
                and os.path.exists(next(tmp_path.glob("shardplan-train-*/rank1.log"), "/x")):
            time.sleep(3.0)
            kids = _children(proc.pid)
            break
        time.sleep(0.2)
    assert len(kids) >= 2, "the ranks did not start"
    return proc, kids


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.multiprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_to_the_launcher_stops_everything(files, tmp_path) -> None:
    proc, kids = _start_long_run(files, tmp_path)
    try:
        # The launcher only waits: it has not loaded torch (the ranks have).
        with open(f"/proc/{proc.pid}/maps", encoding="utf-8") as fh:
            assert "libtorch" not in fh.read()
        assert sum("libtorch" in _maps(k) for k in kids) == 2  # the two ranks
        proc.send_signal(signal.SIGTERM)  # the launcher alone, as `kill PID` does
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines() == [
        "shardplan: error: stopped by SIGTERM: the 2 training processes were stopped and the "
        "temporary folder removed"]
    assert _wait_gone(kids, 10.0) == []
    assert not list(tmp_path.glob("shardplan-train-*"))


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ranks_die_with_a_killed_launcher(files, tmp_path) -> None:
    proc, kids = _start_long_run(files, tmp_path)
    try:
        proc.kill()  # SIGKILL: no handler runs; the parent-death signal stops the ranks
        proc.communicate(timeout=30)
        assert _wait_gone(kids, 10.0) == []
    finally:
        for k in kids:
            if _alive(k):
                os.kill(k, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_error_in_a_rank_is_one_line(files, capsys) -> None:
    code = run_cli(["train", files["plan"], files["graph"], files["topo"], "--steps", "1",
                    "--model", "transformer,num_layers=1,d_model=16,num_heads=2"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("shardplan: error: ") and "Traceback" not in err
    assert "captured from" in err


@pytest.mark.slow
@pytest.mark.multiprocess
def test_pipeline_run_matches_single(files, capsys) -> None:
    base = ["train", files["plan"], files["graph"], files["topo"], "--steps", "2", "--json"]
    assert run_cli(base) == 0
    piped = json.loads(capsys.readouterr().out)
    assert run_cli([*base, "--baseline", "single"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert piped["processes"] == 2 and piped["kind"] == "pipeline"
    assert piped["settings"] == single["settings"]
    assert piped["losses"] == pytest.approx(single["losses"], rel=1e-6)


def _torchrun() -> str:
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed")
    return torchrun


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchrun_entry_point(files) -> None:
    done = subprocess.run(
        [_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "shardplan.runtime",
         files["plan"], files["graph"], files["topo"], "--steps", "2", "--json"],
        capture_output=True, text=True, env=_env(), timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("{")][-1]
    out = json.loads(line)
    assert len(out["losses"]) == 2 and out["processes"] == 2


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchrun_two_nodes_on_localhost(files, tmp_path, capsys) -> None:
    """The README's two-machine recipe, as two torchrun "nodes" on this machine: each
    node runs one process; both read the same plan, graph and topology files and write
    checkpoints into one shared folder. Equal to ``shardplan train`` on one machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ck = str(tmp_path / "ck")
    nodes = [subprocess.Popen(
        [_torchrun(), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(n),
         "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "shardplan.runtime",
         files["plan"], files["graph"], files["topo"], "--steps", "3", "--json",
         "--checkpoint-dir", ck], env=_env(GLOO_SOCKET_IFNAME="lo"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for n in range(2)]
    outs = []
    try:
        for p in nodes:
            outs.append(p.communicate(timeout=300))
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    two = json.loads([x for x in outs[0][0].splitlines() if x.startswith("{")][-1])
    assert run_cli(["train", files["plan"], files["graph"], files["topo"], "--steps", "3",
                    "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert two["losses"] == one["losses"] and two["processes"] == 2
    with open(os.path.join(ck, "latest"), encoding="utf-8") as fh:
        assert fh.read().strip() == "step-00000003"
