"""Searches on Ray (issue 17.4): the same plans as local processes for a given seed."""

from __future__ import annotations

import pytest

from shardplan import registry
from shardplan.generate import layered
from shardplan.topology import build

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.multiprocess


def test_ray_address_that_answers_nothing_is_one_line():
    from shardplan._workers import RayExecutor
    from shardplan.errors import ShardplanError

    with pytest.raises(ShardplanError, match="cannot reach the Ray cluster"):
        RayExecutor("127.0.0.1:1", 1)  # nothing listens on port 1
    with pytest.raises(ShardplanError, match="HOST:PORT"):
        RayExecutor("nowhere", 1)


def test_ray_address_that_accepts_but_never_answers_is_one_line(capfd):
    """Issue 34: a port that accepts connections but is no Ray server made Ray retry for
    minutes, logging every attempt on stderr; now one line, after the bounded wait."""
    import socket

    from shardplan._workers import _ANSWER_SECONDS, RayExecutor
    from shardplan.errors import ShardplanError

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        with pytest.raises(ShardplanError, match="does not answer as Ray"):
            RayExecutor(f"127.0.0.1:{port}", 1)
    assert _ANSWER_SECONDS <= 10
    assert capfd.readouterr().err == ""  # none of Ray's logs


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield "auto"  # the executor finds the running Ray and leaves it running
    ray.shutdown()


def test_planner_and_heuristic_on_ray_equal_local_processes(local_ray):
    from shardplan.planner import search

    g = layered(num_nodes=30, width=3, seed=5, skip_probability=0.2, params_per_weight=2e3)
    t = build("hierarchical", shape=(2, 2), level_names=("box", "gpu"),
              bandwidth=(1e9, 2e10), latency=(1e-5, 1e-6))
    fams = ["data-parallel", "parmesan", "uniform", "hybrid"]
    local = search(g, t, families=fams, workers=2, global_batch=16)
    on_ray = search(g, t, families=fams, workers=2, global_batch=16, ray=local_ray)

    def rows(res, timed: bool = True):
        # the hybrid's per-stage strategy searches run under a share of the task's seconds:
        # on a loaded machine (the suite's other workers) one side may cut them, so its rows
        # are compared by what was evaluated, the others by their times too
        return [(r.family, r.stages, r.replicas, r.schedule, r.microbatches, r.mapping,
                 r.gradient_sync) + ((r.iteration_seconds,) if timed or r.family != "hybrid"
                                     else ())
                for r in res.ranked]

    assert sorted(rows(on_ray, False)) == sorted(rows(local, False)) and len(rows(local)) > 10
    assert [r for r in rows(on_ray) if r[0] != "hybrid"] == \
        [r for r in rows(local) if r[0] != "hybrid"]
    assert any(r[0] == "hybrid" for r in rows(local))
    assert on_ray.winner.to_dict()["stages"] == local.winner.to_dict()["stages"]

    runs = [registry.run("partition", "heuristic", g, t, seed=3, restarts=4, workers=w,
                         ray=address).plan
            for w, address in ((1, None), (2, None), (2, local_ray), (1, local_ray))]
    assert len({tuple(tuple(st.nodes) for st in p.stages) for p in runs}) == 1
    assert len({p.objective.value for p in runs}) == 1
