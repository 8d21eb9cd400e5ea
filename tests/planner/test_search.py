"""``shardplan plan``'s search: every family's candidates ranked by the simulator."""

from __future__ import annotations

import json
import math

import pytest

from shardplan.errors import InfeasibleError
from shardplan.generate import layered
from shardplan.ir import Plan, load_plan, save
from shardplan.planner import microbatch_choices, search
from shardplan.simulate import PipelineView, simulate
from shardplan.topology import build
from tests.helpers import run_cli

FAMS = ["data-parallel", "parmesan", "pipedream-sequence", "uniform", "params"]


def _inputs(memory: float | None = None):
    g = layered(num_nodes=40, width=4, seed=3, skip_probability=0.2, params_per_weight=2e3)
    kw = {} if memory is None else {"memory_bytes": memory}
    t = build("hierarchical", shape=(2, 2), level_names=("box", "gpu"),
              bandwidth=(1e9, 2e10), latency=(1e-5, 1e-6), **kw)
    return g, t


def test_microbatch_choices():
    assert microbatch_choices(64, 1, 4) == [1, 2, 4]
    assert microbatch_choices(64, 4, 1) == [4, 8, 16, 32]
    assert microbatch_choices(64, 4, 2) == [4, 8, 16, 32]
    assert microbatch_choices(24, 4, 1) == [4, 8]
    assert microbatch_choices(64, 4, 1, fixed=8) == [8]
    assert microbatch_choices(64, 4, 1, fixed=7) == []


@pytest.fixture(scope="module")
def found():
    g, t = _inputs()
    return g, t, search(g, t, families=FAMS, workers=1, global_batch=32)


def test_winner_is_never_slower_than_any_candidate(found):
    g, t, res = found
    fit = [r for r in res.ranked if r.fits]
    assert res.winner is not None and fit
    best = min(r.iteration_seconds for r in fit)
    assert fit[0].iteration_seconds == best
    # the winner's file simulates to its row, with its own settings
    again = simulate(res.winner, g, t, timeline=False)
    assert again.iteration_seconds == pytest.approx(best, rel=1e-12)
    assert again.samples_per_iteration == 32
    # every family was searched and the ranking is sorted
    assert {r.family for r in res.ranked} == set(FAMS)
    keys = [r.key for r in res.ranked]
    assert keys == sorted(keys)
    comp = res.comparisons
    assert comp["speedup_over_data_parallel"] >= 1.0
    assert min(v["speedup_of_winner"] for v in comp["best_per_family"].values()) == 1.0


def test_every_candidate_trains_the_same_samples(found):
    _, _, res = found
    for r in res.ranked:
        if r.plan:
            s = Plan.from_dict(r.plan).settings
            assert s.global_batch == 32 and s.microbatches == r.microbatches
            assert s.schedule == r.schedule and s.gradient_sync == r.gradient_sync


def test_hybrid_sharding_and_pase_families():
    """The families whose plans are not plain pipelines: hybrids (Parmesan's stages, every
    stage's layers configured over its devices), paper 000's acyclic partitions and PaSE; each
    row re-simulates to its time from its own file."""
    g, t = _inputs()
    res = search(g, t, families=["hybrid", "sharding", "pase"], workers=1, global_batch=32)
    fams = {r.family for r in res.ranked if r.plan}
    assert fams == {"hybrid", "sharding", "pase"}
    for r in res.ranked:
        plan = Plan.from_dict(r.plan)
        again = simulate(plan, g, t, timeline=False)
        assert again.iteration_seconds == pytest.approx(r.iteration_seconds, rel=1e-12)
        if r.family == "hybrid":
            assert r.stages > 1 and r.replicas > 1
            assert {len(st.devices) for st in plan.stages} == {r.replicas}
            assert set(plan.strategy) == {str(v) for v in range(g.num_nodes)}
        elif r.family == "sharding":  # data flows forward through the components
            PipelineView.build(plan, g, plan.settings)  # raises on a cycle of stages
            assert "acyclic" in plan.meta
            assert all(len(st.devices) == 1 for st in plan.stages)
        else:
            assert plan.num_stages == 1 and plan.strategy is not None


def test_memory_infeasible_candidates_never_win():
    g, t = _inputs()
    params = float(g.param_bytes.sum())
    # room for 2.5 copies of the parameters, not the 4 of Adam's training state: data
    # parallelism (every replica holds everything) cannot fit, pipelines and FSDP can
    small = _inputs(memory=params * 2.5)[1]
    res = search(g, small, families=["data-parallel", "uniform"], workers=1, global_batch=32)
    assert res.winner is not None
    assert all(not r.fits for r in res.ranked if r.family == "data-parallel"
               and r.gradient_sync != "sharded")
    assert res.ranked[0].fits and simulate(res.winner, g, small, timeline=False).fits_memory
    tiny = _inputs(memory=1e3)[1]
    with pytest.raises(InfeasibleError, match="no plan fits"):
        search(g, tiny, families=["data-parallel", "uniform"], workers=1)


def test_time_limit_returns_the_best_so_far():
    g, t = _inputs()
    res = search(g, t, families=FAMS, workers=1, time_limit=1e-3)
    assert res.timed_out and res.done < res.tasks


@pytest.mark.parametrize("workers", [1, 2])
def test_time_limit_cuts_a_task_between_its_variants(monkeypatch, workers):
    """A task whose variants take longer than the whole limit stops simulating them at the
    deadline and hands back the ones it has (it used to run them all: a 1280-device torus
    ran 35 minutes under --time-limit 40)."""
    import time

    from shardplan.planner import _families

    real = _families._simulate

    def slow(plan, ctx):
        time.sleep(0.4)
        return real(plan, ctx)

    monkeypatch.setattr(_families, "_simulate", slow)  # forked workers inherit it
    g, t = _inputs()
    res = search(g, t, families=["data-parallel"], workers=workers, global_batch=32,
                 time_limit=1.0)
    # 3 micro-batch counts x 3 syncs = 9 variants of 0.4 s each; the limit leaves room for 3
    assert res.timed_out and 1 <= len(res.ranked) < 9
    assert res.winner is not None


def test_same_seed_same_winner_with_worker_processes(found, monkeypatch):
    """Same seed, same winner, whatever the worker count, when no search is cut short (a
    task's partition search stops at TASK_SECONDS: on a loaded machine Parmesan's
    refinement stopped at another partition of the same simulated time)."""
    from shardplan.planner import _search

    g, t, _ = found
    monkeypatch.setattr(_search, "TASK_SECONDS", 600.0)  # forked workers inherit it
    res = search(g, t, families=FAMS, workers=1, global_batch=32)
    two = search(g, t, families=FAMS, workers=2, global_batch=32)
    assert two.winner.to_dict()["stages"] == res.winner.to_dict()["stages"]
    assert two.ranked[0].iteration_seconds == res.ranked[0].iteration_seconds


def test_cli_plan(tmp_path, capsys):
    g, t = _inputs()
    save(g, tmp_path / "g.json")
    save(t, tmp_path / "t.json")
    out, rep = tmp_path / "win.json", tmp_path / "r.html"
    assert run_cli(["plan", str(tmp_path / "g.json"), "--cluster", str(tmp_path / "t.json"),
                    "--families", ",".join(FAMS), "--global-batch", "32", "--workers", "1",
                    "-o", str(out), "--report", str(rep), "--json", "--top", "5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["ranked"]) == 5 and data["global_batch"] == 32
    win = load_plan(out)
    assert data["winner"]["stages"] == win.to_dict()["stages"]
    assert win.settings.global_batch == 32
    html = rep.read_text()
    assert "Candidates, ranked by the simulator" in html and "<img" in html
    # the winner is a plan every command takes
    assert run_cli(["simulate", str(out), str(tmp_path / "g.json"), str(tmp_path / "t.json"),
                    "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert math.isclose(sim["iteration_seconds"], data["ranked"][0]["iteration_seconds"],
                        rel_tol=1e-12)


@pytest.mark.parametrize("args, message", [
    (["--families", "bogus"], "unknown plan family"),
    (["--cluster", "nosuchkind,devices=4"], "unknown topology kind"),
    (["--memory-limit", "lots"], "expected a size"),
])
def test_cli_plan_errors(tmp_path, capsys, args, message):
    g, _ = _inputs()
    save(g, tmp_path / "g.json")
    argv = ["plan", str(tmp_path / "g.json"), "--cluster", "flat,num_devices=4", *args]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardplan: error:") and message in err and err.count("\n") == 1


def test_cli_cluster_from_a_builder(tmp_path, capsys):
    g, _ = _inputs()
    save(g, tmp_path / "g.json")
    assert run_cli(["plan", str(tmp_path / "g.json"), "--cluster", "hierarchical,shape=2x2",
                    "--families", "data-parallel,uniform", "--workers", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["winner"]["topology"].startswith("hier")


@pytest.mark.parametrize("families", [
    "data-parallel", "parmesan", "pase",
    pytest.param("hybrid", marks=pytest.mark.slow)])
def test_cli_plan_runs_the_winner(capsys, families):
    """``--run`` trains the winner on real processes (DDP/FSDP for one replicated stage,
    DTensor for a strategy, the pipeline runtime otherwise) and reports the simulator's
    prediction next to the steps."""
    devices = 4 if families == "hybrid" else 2
    assert run_cli(["plan", "mlp", "--batch-size", "16", "--cluster",
                    f"flat,num_devices={devices}",
                    "--families", families, "--workers", "1", "--run", "--steps", "3",
                    "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    run, win = data["run"], data["ranked"][0]
    assert win["family"] == families
    assert run["steps"] == 3 and len(run["losses"]) == 3
    assert all(math.isfinite(x) for x in run["losses"])
    assert run["predicted_seconds"] == pytest.approx(win["iteration_seconds"], rel=1e-12)
    assert run["measured_seconds"] > 0
    assert run["ratio"] == pytest.approx(run["predicted_seconds"] / run["measured_seconds"])
