"""Signals to a command with worker processes: no worker outlives it, Ctrl-C answers at once.

Each test starts ``python -m shardplan`` on a search that would run for two minutes with two
worker processes (the sharding heuristic's restarts, the optimal mapping's concurrent
targets), waits for the workers to appear, signals the command and checks that it ends
promptly and that none of its workers is left running. Linux only (``/proc``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardplan import registry
from shardplan.generate import layered, random_dag
from shardplan.ir import save
from shardplan.topology import build

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")]

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "shardplan", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_workers(proc: subprocess.Popen, count: int = 2, timeout: float = 90.0
                      ) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        kids = _children(proc.pid)
        if len(kids) >= count:
            time.sleep(0.3)  # let the workers start their tasks
            return _children(proc.pid)
        if proc.poll() is not None:
            pytest.fail(f"the command ended before starting workers: {proc.communicate()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("no worker processes appeared")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, list[str]]:
    tmp = tmp_path_factory.mktemp("signals")
    g, t = tmp / "g.json", tmp / "t.json"
    save(layered(201, seed=0), g)
    save(build("hierarchical", shape=(2, 4)), t)
    # A mapping that the optimal search cannot finish in minutes.
    gm, tm, pm = tmp / "gm.json", tmp / "tm.json", tmp / "pm.json"
    graph, topo = random_dag(300, seed=0), build("uniform-dist", num_devices=64, seed=0)
    save(graph, gm)
    save(topo, tm)
    save(registry.run("partition", "uniform", graph, topo, stages=8, replicas=8).plan, pm)
    return {
        "heuristic": ["partition", str(g), str(t), "--algorithm", "heuristic", "--workers",
                      "2", "--restarts", "1000000", "--start", "random", "--time-limit", "120",
                      "-o", str(tmp / "out.json")],
        "map": ["map", str(pm), str(gm), str(tm), "--algorithm", "optimal", "--workers", "2",
                "--time-limit", "120", "-o", str(tmp / "out.json")],
    }


@pytest.mark.parametrize("command", ["heuristic", "map"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT],
                         ids=["TERM", "KILL", "INT"])
def test_no_worker_outlives_the_command(inputs, command: str, sig: int) -> None:
    proc = _start(inputs[command])
    try:
        workers = _wait_for_workers(proc)
        sent = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
        answered = time.monotonic() - sent
        _, err = proc.communicate()
        end = time.monotonic() + 5.0
        while any(_alive(w) for w in workers) and time.monotonic() < end:
            time.sleep(0.05)
        assert not [w for w in workers if _alive(w)], f"workers left running after {sig!r}"
    finally:
        if proc.poll() is None:
            proc.kill()
    # The search would have run for 120 s: the command answered the signal, not the search.
    assert answered < 10.0, (answered, rc, err)
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL
    else:
        assert rc == {signal.SIGTERM: 143, signal.SIGINT: 130}[sig], (rc, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("shardplan: error: "), err
        assert not (Path(inputs[command][-1])).exists()
