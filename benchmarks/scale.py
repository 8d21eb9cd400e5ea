"""How do the planners scale? Seconds and peak memory of each planner against graph size and
device count, with the growth exponent fitted on a log-log scale.

    .venv/bin/python benchmarks/scale.py --quick     # a few minutes: 200..1600 operators
    .venv/bin/python benchmarks/scale.py             # 10^3..10^5 operators, 16..4096 devices
    .venv/bin/python benchmarks/scale.py --targets   # issue 17.2: Parmesan at its two sizes

Writes ``benchmarks/results/scale_quick.md`` (``--quick``), ``benchmarks/results/scale.md``
or ``benchmarks/results/scale_parmesan.md`` (``--targets``).

``--targets`` runs Parmesan (8 stages, one fresh process each) at exactly the sizes issue 17
asks for -- 10^4 operators onto 256 devices (a 16 x 16 hierarchy) within 60 s and 10^5
operators onto 4096 devices (4 x 8 x 16 x 8) within 10 minutes -- with those time limits, and
prints seconds, value, lower bound and value / bound (the plan's ``objective``).

Two sweeps per planner (Parmesan, the heuristic, the hierarchical partitioner, optimal
mapping): the graph grows at a fixed device count, and the device count grows at a fixed
graph. Graphs are paper 000's layered DAGs (:func:`shardplan.generate.layered`, width 100,
skip edges), topologies hierarchical (``4x8x16x8`` at 4096 devices, see ``SHAPES``); the
mapping input is a uniform partition into ``min(16, D)`` stages x ``D / stages`` replicas.

A last table times generated topology files: built, written and loaded in their generator
form (``pairs``) and, for one hierarchy, with the dense matrices listed (issue 19.4).

Each run is a fresh process (``--child``), so that memory is the run's own: inputs are built
first, the process's peak resident set is then reset (``/proc/self/clear_refs``) and read
after the run (``VmHWM``); ``peak MiB`` is that peak above the resident set before the run.
Every run has a time limit (``--limit``); one that reaches it (status ``timed_out``) measures
the limit, not the planner, so the fitted exponent uses only runs that finished on their
own (``fit points`` says how many) and is ``n/a`` with fewer than two. ``exponent`` is the
least-squares slope of log(CPU seconds) against log(size): 1 is linear, 2 quadratic (CPU
seconds of the single-threaded run, so that the fit does not follow the machine's load; the
time limits are wall-clock, so whether a run finishes still does). A branch and bound
(optimal mapping) takes what its instance needs: its exponent says little. Planners run
in-process (``workers=1``), one BLAS thread, seed 0; timings depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Hierarchical topology shape per device count (outermost level first).
SHAPES = {16: (2, 8), 32: (4, 8), 64: (8, 8), 128: (2, 8, 8), 256: (4, 8, 8), 1024: (4, 4, 8, 8),
          4096: (4, 8, 16, 8)}
PLANNERS = ("parmesan", "heuristic", "hierarchical", "optimal-mapping")

FULL = {"nodes": (1001, 3001, 10001, 30001, 100001), "nodes_devices": 256,
        "devices": (16, 64, 256, 1024, 4096), "devices_nodes": 10001, "limit": 600.0}
QUICK = {"nodes": (201, 401, 801, 1601), "nodes_devices": 16,
         "devices": (16, 32, 64, 128), "devices_nodes": 401, "limit": 15.0}
#: Issue 17.2's two Parmesan targets: operators, hierarchy shape, the time they must take.
TARGETS = ({"nodes": 10001, "shape": (16, 16), "limit": 60.0},
           {"nodes": 100001, "shape": (4, 8, 16, 8), "limit": 600.0})


# ---------------------------------------------------------------------- one run (child)
def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child(spec: dict) -> dict:
    """Build the inputs of ``spec``, run its planner once, return seconds, memory, status."""
    from shardplan import registry
    from shardplan.generate import layered
    from shardplan.topology import build

    graph = layered(num_nodes=spec["nodes"], width=100, seed=0, skip_probability=0.1,
                    params_per_weight=1e4)
    topo = build("hierarchical", shape=tuple(spec.get("shape") or SHAPES[spec["devices"]]))
    planner, limit = spec["planner"], spec["limit"]
    if planner == "optimal-mapping":
        stages = min(16, topo.num_devices)
        plan = registry.run("partition", "uniform", graph, topo, stages=stages,
                            replicas=topo.num_devices // stages).plan
        family, name, opts = "map", "optimal", {"plan": plan}
    elif planner == "parmesan":  # one (S, R): the search over shapes multiplies the work
        stages = min(8, topo.num_devices)
        family, name, opts = "partition", planner, {
            "stages": stages, "replicas": topo.num_devices // stages,
            "descent": bool(spec.get("descent", True))}
    elif planner == "heuristic":
        family, name, opts = "partition", planner, {"workers": 1, "restarts": 1}
    else:
        family, name, opts = "partition", planner, {"restarts": 1}
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set to the current one
        reset = True
    except OSError:
        reset = False
    base = _rss_kib("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    res = registry.run(family, name, graph, topo, seed=0, time_limit=limit, **opts)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _rss_kib("VmHWM")
    out = {"seconds": secs, "cpu_seconds": cpu,
           "peak_mib": max(0, peak - base) / 1024 if reset else None,
           "status": res.plan.status, "value": res.plan.objective.value,
           "lower_bound": res.plan.objective.lower_bound}
    if spec.get("breakdown"):  # the slowest stage's terms, as the plan's objective prices them
        import numpy as np

        from shardplan.cost import CostModel, stage_times
        from shardplan.partition._pipeline_common import placement

        plan = res.plan
        k, r = plan.num_stages, plan.num_replicas
        model = CostModel.from_settings(graph, topo, plan.settings)
        a = plan.assignment(graph.num_nodes)
        st = stage_times(model, a, placement(k, r), num_stages=k, order=range(k))
        worst = int(st.stage_seconds("overlap").argmax())
        out.update(compute=float(st.compute[worst].max()), send=float(st.send[worst].max()),
                   allreduce=float(st.allreduce[worst] / st.factor))
        # the same split with each replica's stages on neighbouring devices (device r S + s):
        # what a mapping could make of it, in the same model
        rmajor = np.arange(k * r, dtype=np.int64).reshape(r, k).T
        out["replica_major"] = float(stage_times(model, a, rmajor, num_stages=k,
                                                 order=range(k)).value("overlap"))
    return out


# ---------------------------------------------------------------------- topology files
def topology_files(quick: bool) -> list[dict]:
    """Build, write and load generated topologies in their generator form and (one
    hierarchy) with the dense matrices listed, as ``topology --dense`` writes them."""
    import tempfile

    from shardplan.ir import load_topology, write_json
    from shardplan.topology import build

    big = (4, 8, 8, 8) if quick else (4, 8, 16, 8)
    cases = [("hierarchical", {"shape": big}, True), ("hierarchical", {"shape": big}, False),
             ("torus3d", {"shape": (16, 16, 16)}, False), ("dgx1", {"boxes": 512}, False),
             ("flat", {"num_devices": 100_000}, False)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        for kind, kw, dense in cases:
            t0 = time.perf_counter()
            topo = build(kind, **kw)
            built = time.perf_counter() - t0
            t0 = time.perf_counter()
            write_json(path, topo.to_dict(dense=bool(dense)))
            wrote = time.perf_counter() - t0
            t0 = time.perf_counter()
            back = load_topology(path)
            loaded = time.perf_counter() - t0
            assert back.num_devices == topo.num_devices
            rows.append({"kind": kind, "devices": topo.num_devices,
                         "form": "dense lists" if dense else "generator (pairs)",
                         "build": built, "write": wrote, "load": loaded,
                         "mb": path.stat().st_size / 1e6})
            r = rows[-1]
            print(f"topology {kind:13s} {r['devices']:7d} {r['form']:18s} build "
                  f"{built:6.2f} s write {wrote:6.2f} s load {loaded:6.2f} s "
                  f"{r['mb']:8.2f} MB", flush=True)
    return rows


# ---------------------------------------------------------------------- the sweeps
def run_one(spec: dict) -> dict:
    """``spec`` in a fresh process; killed at 3 x its limit + 60 s (then status ``killed``)."""
    try:
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                             capture_output=True, text=True, timeout=3 * spec["limit"] + 60,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return {"seconds": math.nan, "cpu_seconds": math.nan, "peak_mib": None,
                "status": "killed"}
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        err = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"seconds": math.nan, "cpu_seconds": math.nan, "peak_mib": None,
                "status": f"error: {err[:80]}"}
    return json.loads(lines[-1])


def fit_exponent(sizes: list[float], values: list[float]) -> float | None:
    """Least-squares slope of log(values) against log(sizes); None with < 2 distinct sizes."""
    import numpy as np

    pts = [(math.log(s), math.log(v)) for s, v in zip(sizes, values, strict=True)
           if v is not None and v > 0 and math.isfinite(v)]
    if len({x for x, _ in pts}) < 2:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def sweep(cfg: dict, planners: list[str]) -> list[dict]:
    rows = []
    for planner in planners:
        for axis, sizes in (("nodes", cfg["nodes"]), ("devices", cfg["devices"])):
            runs = []
            for size in sizes:
                spec = {"planner": planner, "limit": cfg["limit"],
                        "nodes": size if axis == "nodes" else cfg["devices_nodes"],
                        "devices": size if axis == "devices" else cfg["nodes_devices"]}
                r = run_one(spec)
                runs.append((size, r))
                mem = "-" if r.get("peak_mib") is None else f"{r['peak_mib']:.0f}"
                print(f"{planner:16s} nodes {spec['nodes']:7d} devices {spec['devices']:5d} "
                      f"{r['seconds']:8.2f} s {r['cpu_seconds']:8.2f} s cpu {mem:>7s} MiB  "
                      f"{r['status']}", flush=True)
            done = [(s, r) for s, r in runs if r["status"] in ("optimal", "feasible")]
            rows.append({
                "planner": planner, "axis": axis, "runs": runs,
                "fit_points": len(done),
                "time_exp": fit_exponent([s for s, _ in done],
                                         [r["cpu_seconds"] for _, r in done]),
                "mem_exp": fit_exponent([s for s, _ in done],
                                        [r.get("peak_mib") for _, r in done]),
            })
            e = rows[-1]["time_exp"]
            print(f"{planner:16s} {axis}: time exponent "
                  f"{'n/a' if e is None else f'{e:.2f}'} over {len(done)} finished runs",
                  flush=True)
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)


def write_report(path: Path, cfg: dict, rows: list[dict], quick: bool, load: tuple,
                 files: list[dict]) -> None:
    cmd = "benchmarks/scale.py" + (" --quick" if quick else "")
    lines = ["# Planners at scale" + (" (quick)" if quick else ""), "",
             f"Written by `{cmd}` (do not edit by hand). Graphs: layered DAGs (width 100); "
             f"topologies: hierarchical ({', '.join(f'{d}: ' + 'x'.join(map(str, s)) for d, s in SHAPES.items() if d in cfg['devices'] or d == cfg['nodes_devices'])}). "  # noqa: E501
             f"Graph sweep at {cfg['nodes_devices']} devices, device sweep at "
             f"{cfg['devices_nodes']} operators; time limit {cfg['limit']:g} s per run; one "
             f"fresh process per run, one BLAS thread. `peak MiB`: peak resident set above the "
             f"inputs. Exponents: log-log least squares of CPU seconds (the run's process "
             f"time: the planners are single-threaded here, and wall seconds stretch with "
             f"the machine's load) over the runs that finished before their limit "
             f"(`timed_out` runs measure the limit). Load average "
             f"{load[0]:.1f} before, {os.getloadavg()[0]:.1f} after (2 cores).", "",
             "## Fitted growth exponents", "",
             "| planner | sweep | CPU time exponent | memory exponent | fit points |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['planner']} | {r['axis']} | {_fmt(r['time_exp'], '.2f')} | "
                     f"{_fmt(r['mem_exp'], '.2f')} | {r['fit_points']} of {len(r['runs'])} |")
    lines += ["", "## Runs", "",
              "| planner | operators | devices | seconds | CPU seconds | peak MiB | status | "
              "value | lower bound |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for size, run in r["runs"]:
            nodes = size if r["axis"] == "nodes" else cfg["devices_nodes"]
            devices = size if r["axis"] == "devices" else cfg["nodes_devices"]
            lines.append(f"| {r['planner']} | {nodes} | {devices} | "
                         f"{_fmt(run['seconds'], '.2f')} | {_fmt(run['cpu_seconds'], '.2f')} | "
                         f"{_fmt(run.get('peak_mib'), '.0f')} | "
                         f"{run['status']} | {_fmt(run.get('value'), '.4g')} | "
                         f"{_fmt(run.get('lower_bound'), '.4g')} |")
    if files:
        lines += ["", "## Topology files", "",
                  "Generated topologies written by their generator (`pairs`: `topology "
                  "--compact`, the default above 16384 devices) and, for one hierarchy, with "
                  "the dense matrices listed (the contract's form, the default up to 16384 "
                  "devices); wall seconds, in-process.", "",
                  "| kind | devices | file | build s | write s | load s | MB |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['kind']} | {r['devices']} | {r['form']} | {r['build']:.2f} | "
                  f"{r['write']:.2f} | {r['load']:.2f} | {r['mb']:.2f} |" for r in files]
    from shardplan.ir import write_atomic
    write_atomic(path, "\n".join(lines) + "\n")
    print(f"wrote {path}")


def targets(limit: float | None) -> list[dict]:
    """Parmesan at issue 17's two sizes (see the module docstring), one fresh process each."""
    rows = []
    for t in TARGETS:
        devices = math.prod(t["shape"])
        spec = {"planner": "parmesan", "nodes": t["nodes"], "devices": devices,
                "shape": list(t["shape"]), "limit": t["limit"] if limit is None else limit,
                "breakdown": True}
        r = run_one(spec)
        value, bound = r.get("value"), r.get("lower_bound")
        ratio = value / bound if value is not None and bound else None
        # the same run without boundary descent (the paper's refinement alone), side by side
        plain = run_one({**spec, "descent": False, "breakdown": False})
        rows.append({**spec, "target": t["limit"], **r, "ratio": ratio,
                     "plain_value": plain.get("value"), "plain_seconds": plain["seconds"]})
        print(f"parmesan nodes {t['nodes']:7d} devices {devices:5d} "
              f"({'x'.join(map(str, t['shape']))}) {r['seconds']:8.2f} s "
              f"{r['cpu_seconds']:8.2f} s cpu  {r['status']}  value {_fmt(value, '.4g')} "
              f"bound {_fmt(bound, '.4g')} value/bound {_fmt(ratio, '.3g')}  slowest stage: "
              f"compute {_fmt(r.get('compute'), '.3g')} send {_fmt(r.get('send'), '.3g')} "
              f"all-reduce/F {_fmt(r.get('allreduce'), '.3g')}  without descent: value "
              f"{_fmt(plain.get('value'), '.4g')} in {_fmt(plain['seconds'], '.2f')} s; "
              f"replica-major {_fmt(r.get('replica_major'), '.4g')}",
              flush=True)
    return rows


def write_targets(path: Path, rows: list[dict], load: tuple) -> None:
    lines = ["# Parmesan at scale (issue 17.2)", "",
             "Written by `benchmarks/scale.py --targets` (do not edit by hand). Layered DAGs "
             "(width 100, skip edges), hierarchical topologies, Parmesan with 8 stages x D / 8 "
             "replicas, seed 0, one fresh process per run, one BLAS thread; the time limit is "
             "the issue's target. `value`: the plan's largest stage time (overlap view, "
             "seconds); `lower bound`: the plan's `objective.lower_bound` (compute and the "
             "gradient all-reduce no split avoids; point-to-point sends are not in it, see "
             "`pipeline_lower_bound`). The slowest stage's value is `max(compute, send) + "
             "all-reduce / F` (per micro-batch, its slowest replica; F = M + S - 1): the "
             "last three columns. `without descent`: the same run with `descent=false` (the "
             "paper's refinement alone, no boundary descent): its value and seconds. "
             "`replica-major`: the plan's split priced on the placement that puts replica r "
             "of stage s on device r S + s (each replica's stages on neighbouring devices) "
             "instead of the consecutive one (s R + r) the value and bound are for: what a "
             "mapping could make of the same split. "
             "Load average "
             f"{load[0]:.1f} before, {os.getloadavg()[0]:.1f} after (2 cores).", "",
             "| operators | devices | shape | target s | seconds | CPU seconds | peak MiB | "
             "status | value | lower bound | value / bound | compute | send | all-reduce / F | "
             "without descent: value | without descent: seconds | replica-major |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['nodes']} | {r['devices']} | {'x'.join(map(str, r['shape']))} | "
                     f"{r['target']:g} | {_fmt(r['seconds'], '.2f')} | "
                     f"{_fmt(r['cpu_seconds'], '.2f')} | {_fmt(r.get('peak_mib'), '.0f')} | "
                     f"{r['status']} | {_fmt(r.get('value'), '.4g')} | "
                     f"{_fmt(r.get('lower_bound'), '.4g')} | {_fmt(r.get('ratio'), '.3g')} | "
                     f"{_fmt(r.get('compute'), '.4g')} | {_fmt(r.get('send'), '.4g')} | "
                     f"{_fmt(r.get('allreduce'), '.4g')} | {_fmt(r.get('plain_value'), '.4g')} | "
                     f"{_fmt(r.get('plain_seconds'), '.2f')} | "
                     f"{_fmt(r.get('replica_major'), '.4g')} |")
    from shardplan.ir import write_atomic
    write_atomic(path, "\n".join(lines) + "\n")
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 15 s limits (minutes)")
    ap.add_argument("--limit", type=float, default=None, help="time limit per run (seconds)")
    ap.add_argument("--planners", default=",".join(PLANNERS),
                    help=f"comma-separated subset of {','.join(PLANNERS)}")
    ap.add_argument("--out", default=None, help="the markdown file to write")
    ap.add_argument("--no-files", action="store_true",
                    help="skip the topology file timings (build, write, load)")
    ap.add_argument("--targets", action="store_true",
                    help="Parmesan at issue 17's two sizes only (10^4 onto 256, 10^5 onto 4096)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.targets:
        load = os.getloadavg()
        rows = targets(args.limit)
        write_targets(Path(args.out) if args.out else
                      ROOT / "benchmarks/results/scale_parmesan.md", rows, load)
        return
    cfg = dict(QUICK if args.quick else FULL)
    if args.limit is not None:
        cfg["limit"] = args.limit
    planners = [p for p in args.planners.split(",") if p]
    bad = [p for p in planners if p not in PLANNERS]
    if bad:
        ap.error(f"unknown planner(s) {', '.join(bad)} (choose from {', '.join(PLANNERS)})")
    load = os.getloadavg()
    files = topology_files(args.quick) if not args.no_files else []
    rows = sweep(cfg, planners)
    out = Path(args.out) if args.out else ROOT / "benchmarks/results" / (
        "scale_quick.md" if args.quick else "scale.md")
    write_report(out, cfg, rows, args.quick, load, files)


if __name__ == "__main__":
    main()
