"""The command line against the library: the same call, timed side by side.

Run: ``.venv/bin/python benchmarks/cli_overhead.py [--quick] [--repeats N]``; writes
``benchmarks/results/cli_overhead.md``.

For each call (the sharding heuristic and the hierarchical partitioner on ``layered(201)``
onto 96 devices, the optimal mapping of a 4 x 2 plan of it onto a DGX-1, and without
``--quick`` Parmesan on resnet152 onto two DGX-1 boxes) it measures, every one in a fresh
process:

- **library**: loading the two files, ``registry.run`` and writing the plan, timed inside a
  process that set ``OMP_NUM_THREADS=1`` before NumPy loaded and had already imported the
  algorithms (what a library user's script pays per call);
- **CLI**: the wall time of ``python -m shardplan ...`` started *without* ``OMP_NUM_THREADS``
  in its environment (the command line must set it itself, before NumPy loads);
- **start-up**: the wall time of a process that only does what the command line does before
  it can start working (interpreter, parser, registry imports);
- **NumPy first**: the CLI again, but with NumPy imported before ``main`` runs, as the
  command line did before the thread limit moved ahead of it (its BLAS then runs one thread
  per core, which on a small shared machine makes the linear algebra several times slower).

The goal is ``(CLI - start-up) / library <= 1.2``. Each figure is the minimum over
``--repeats`` runs (default 3): the machine is shared, and the minimum is the least noisy
estimate of what a call costs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardplan.ir import save, write_atomic  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"

_LIBRARY = """
import sys, time
from shardplan import registry
from shardplan.ir import load_graph, load_plan, load_topology, save
for family in registry.FAMILIES:
    registry.available(family)
family, algorithm, graph_path, topo_path, plan_path, out = sys.argv[1:7]
options = {}
for pair in sys.argv[7:]:
    key, value = pair.split("=", 1)
    options[key] = int(value) if value.isdigit() else value
t0 = time.perf_counter()
graph = load_graph(graph_path)
topology = load_topology(topo_path)
if plan_path != "-":
    options["plan"] = load_plan(plan_path)
result = registry.run(family, algorithm, graph, topology, seed=0, **options)
save(result.plan, out)
print(time.perf_counter() - t0)
"""

_STARTUP = """
from shardplan.cli.main import build_parser
from shardplan import registry
build_parser()
for family in registry.FAMILIES:
    registry.available(family)
"""

_NUMPY_FIRST = "import numpy, sys; from shardplan.cli.main import main; sys.exit(main())"


def _env(*, threads_set: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OMP_NUM_THREADS", None)
    env.pop("MKL_NUM_THREADS", None)
    env.pop("OPENBLAS_NUM_THREADS", None)
    if threads_set:
        env["OMP_NUM_THREADS"] = "1"
    return env


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def measure(case: dict, tmp: Path, repeats: int) -> dict[str, float]:
    out = str(tmp / "out.json")
    cli_args = [case["command"], *case["files"],
                "--algorithm", case["algorithm"], "-o", out]
    for key, value in case["options"].items():
        cli_args += [f"--{key.replace('_', '-')}", str(value)]
    py = sys.executable
    lib_args = [case["family"], case["algorithm"], case["files"][-2], case["files"][-1],
                case["files"][0] if case["family"] == "map" else "-", out,
                *(f"{k}={v}" for k, v in case["options"].items())]
    lib, cli, start, first = [], [], [], []
    for _ in range(repeats):
        res = subprocess.run([py, "-c", _LIBRARY, *lib_args], env=_env(threads_set=True),
                             check=True, capture_output=True, text=True, cwd=ROOT)
        lib.append(float(res.stdout.strip().splitlines()[-1]))
        cli.append(_wall([py, "-m", "shardplan", *cli_args], _env(threads_set=False)))
        start.append(_wall([py, "-c", _STARTUP], _env(threads_set=False)))
        first.append(_wall([py, "-c", _NUMPY_FIRST, *cli_args], _env(threads_set=False)))
    return {"library": min(lib), "cli": min(cli), "startup": min(start),
            "numpy_first": min(first)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the captured resnet152 case")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from shardplan import registry
    from shardplan.generate import layered
    from shardplan.topology import build

    tmp = Path(tempfile.mkdtemp(prefix="cli-overhead-"))
    g201, g1001, t96 = tmp / "g201.json", tmp / "g1001.json", tmp / "t96.json"
    save(layered(201, seed=0), g201)
    save(layered(1001, seed=0), g1001)
    save(build("hierarchical", shape=(2, 6, 8)), t96)
    uni, g_map = tmp / "uniform32.json", layered(1001, seed=0)
    save(build("uniform-dist", num_devices=32, seed=0), uni)
    p32 = tmp / "p32.json"
    save(registry.run("partition", "parmesan", g_map, build("uniform-dist", num_devices=32,
                                                            seed=0), stages=8, replicas=4).plan,
         p32)
    cases = [
        {"name": "partition heuristic, 201 nodes, 96 devices", "command": "partition",
         "family": "partition", "algorithm": "heuristic", "files": [str(g201), str(t96)],
         "options": {}},
        {"name": "partition hierarchical, 1001 nodes, 96 devices", "command": "partition",
         "family": "partition", "algorithm": "hierarchical", "files": [str(g1001), str(t96)],
         "options": {}},
        {"name": "map optimal, 1001 nodes, 8 x 4 on uniform-dist 32", "command": "map",
         "family": "map", "algorithm": "optimal", "files": [str(p32), str(g1001), str(uni)],
         "options": {}},
    ]
    if not args.quick:
        from benchmarks._graphs import captured

        r152, dgx2 = tmp / "resnet152.json", tmp / "dgx1x2.json"
        save(captured("torchvision:resnet152", batch_size=8), r152)
        save(build("dgx1", boxes=2), dgx2)
        cases.append({"name": "partition parmesan, resnet152, 4 x 4 on 2 DGX-1",
                      "command": "partition", "family": "partition", "algorithm": "parmesan",
                      "files": [str(r152), str(dgx2)], "options": {"stages": 4, "replicas": 4}})
    rows = []
    for case in cases:
        m = measure(case, tmp, args.repeats)
        rows.append((case["name"], m))
        print(case["name"], {k: round(v, 3) for k, v in m.items()}, flush=True)
    lines = [
        "# Command line against library, same call", "",
        f"Written by `benchmarks/cli_overhead.py{' --quick' if args.quick else ''}` "
        f"(minimum of {args.repeats} runs each, fresh processes; {os.cpu_count()} cores, "
        "shared). Library: load + run + write inside a warm process with "
        "`OMP_NUM_THREADS=1` set before NumPy loads. CLI: `python -m shardplan ...` started "
        "without `OMP_NUM_THREADS`. Start-up: interpreter, parser and registry imports alone. "
        "NumPy first: the CLI with NumPy imported before `main` (the order before the fix).",
        "",
        "| call | library s | CLI s | start-up s | (CLI - start-up) / library | "
        "NumPy first s | NumPy first / CLI |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in rows:
        # Below a tenth of a second the call is within the start-up's run-to-run noise.
        ratio = f"{(m['cli'] - m['startup']) / m['library']:.2f}" if m["library"] >= 0.1 \
            else "(call below start-up noise)"
        lines.append(f"| {name} | {m['library']:.3f} | {m['cli']:.3f} | {m['startup']:.3f} | "
                     f"{ratio} | {m['numpy_first']:.3f} | "
                     f"{m['numpy_first'] / m['cli']:.2f} |")
    lines += ["", "Goal: (CLI - start-up) / library <= 1.2.", ""]
    text = "\n".join(lines)
    RESULTS.mkdir(exist_ok=True)
    write_atomic(RESULTS / "cli_overhead.md", text)
    print(text)


if __name__ == "__main__":
    main()
