"""PaSE's Table I measured here: seconds to find the best strategy for the four benchmarks at
4..64 devices, GenerateSeq vs breadth-first ordering, with peak memory.

    .venv/bin/python benchmarks/pase_table1.py            # full: 4, 8, 16, 32, 64 devices
    .venv/bin/python benchmarks/pase_table1.py --quick    # 4 and 8 devices only

Writes ``benchmarks/results/pase_table1.md`` and ``pase_table1.png``. Every measurement runs
in a fresh process: seconds include building the tables (configurations, costs) and the
search; peak memory is that process's peak resident set (``resource.getrusage``), beside the
resident set of a process that only imported the same modules (the baseline). The
breadth-first ordering gets a time limit (``--bfs-time-limit``) and the same 4 GiB table
budget as the default; "OOM (x GiB)" means its
dependent sets would need x GiB of tables, as the paper's OOM entries. The paper's prototype
numbers are not re-typed here; see the paper's Table I.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("alexnet", "inception-v3", "rnnlm", "transformer")


_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from shardplan.generate import generate
from shardplan.strategy import TableTooLargeError, build_tables, solve
kind, p, ordering, limit = {args!r}
out = {{}}
if kind is not None:
    g = generate(kind)
    t0 = time.perf_counter()
    try:
        res = solve(build_tables(g, p), ordering=ordering, time_limit=limit)
        out = {{"status": res.status, "value": res.value, "max_dep": res.max_dependent}}
    except TableTooLargeError as exc:
        need = str(exc).split(" needs ")[1].split(" GiB")[0]
        out = {{"status": "OOM (" + need + " GiB)", "value": None, "max_dep": None}}
    out["seconds"] = time.perf_counter() - t0
out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def measure(kind: str | None, devices: int, ordering: str, time_limit: float | None) -> dict:
    """Run one search in a fresh interpreter; its seconds and peak resident set (MB)."""
    code = _CHILD.format(root=str(ROOT), args=(kind, devices, ordering, time_limit))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 and 8 devices only")
    ap.add_argument("--bfs-time-limit", type=float, default=60.0)
    args = ap.parse_args()
    devices = (4, 8) if args.quick else (4, 8, 16, 32, 64)
    rows = []
    base = measure(None, 1, "", None)["peak_mb"]
    for kind in KINDS:
        for p in devices:
            gs = measure(kind, p, "generate-seq", None)
            bf = measure(kind, p, "bfs", args.bfs_time_limit)
            rows.append((kind, p, gs, bf))
            print(f"{kind:13s} {p:3d}  generate-seq {gs['seconds']:8.2f} s "
                  f"{gs['peak_mb']:8.1f} MB  |D|<={gs['max_dep']}   bfs {bf['status']} "
                  f"{bf['seconds']:.2f} s", flush=True)
    RESULTS.mkdir(exist_ok=True)
    lines = ["# PaSE Table I, measured here", "",
             f"`{' '.join(['benchmarks/pase_table1.py', *sys.argv[1:]])}`; one core "
             "(OMP_NUM_THREADS=1), `pase` cost model, each run in a fresh process. Seconds = "
             "tables + search; peak = the process's peak resident set (a process that only "
             f"imports shardplan and numpy: {base:.0f} MB).", "",
             "| benchmark | devices | GenerateSeq s | peak MB | max dependent set | "
             "breadth-first | BF s | BF peak MB | optimum (pase_cost) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kind, p, gs, bf in rows:
        lines.append(f"| {kind} | {p} | {gs['seconds']:.2f} | {gs['peak_mb']:.0f} | "
                     f"{gs['max_dep']} | {bf['status']} | {bf['seconds']:.2f} | "
                     f"{bf['peak_mb']:.0f} | {gs['value']:.4g} |")
    name = "pase_table1_quick" if args.quick else "pase_table1"
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in KINDS:
        xs = [p for k, p, _, _ in rows if k == kind]
        ys = [gs["seconds"] for k, _, gs, _ in rows if k == kind]
        ax.plot(xs, ys, marker="o", label=kind)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("devices")
    ax.set_ylabel("search seconds (GenerateSeq)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=120)
    print(f"wrote {RESULTS / (name + '.md')}")


if __name__ == "__main__":
    main()
