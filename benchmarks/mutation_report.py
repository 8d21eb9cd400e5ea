"""Mutation testing of the planning packages: run mutmut and write its score per package.

Run from the repository root (``make mutation`` does)::

    .venv/bin/python benchmarks/mutation_report.py --run [PATTERN ...]

``--run`` calls ``mutmut run`` (configured in ``pyproject.toml``'s ``[tool.mutmut]``: the
packages ``partition``, ``mapping``, ``strategy``, ``cost``, ``simulate``, ``planner`` and
``export``, the checkpoint reader ``runtime/_checkpoint.py`` and the worker pools
``_workers.py`` are mutated, and their fast tests run against every mutant) on the mutants
whose names match the PATTERNs (mutmut's globs over names such as
``shardplan.cost._formulas.x_message_seconds__mutmut_3``; none: every mutant, many hours
on 2 cores). Without ``--run`` the results already in ``mutants/`` are reported. Writes
``benchmarks/results/mutation.md``: per package the mutants checked, killed (a test failed,
or the mutant timed out), survived, explained as equivalent (``EQUIVALENT`` below, each with
its reason) and the score ``killed / (checked - equivalent)``; then every survivor with its
diff. Mutants not checked (outside the patterns run) are counted apart, so a partial run
says how partial it is. A target none of whose mutants ``mutants/`` has checked keeps its
row and survivors from the previous report (the results of an earlier run, perhaps in
another checkout), marked as carried over.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from shardplan.ir import write_atomic  # noqa: E402

#: Report row -> mutmut's result files for it, under ``mutants/shardplan/``.
TARGETS = {"partition": "partition/*.py.meta", "mapping": "mapping/*.py.meta",
           "strategy": "strategy/*.py.meta", "cost": "cost/*.py.meta",
           "simulate": "simulate/*.py.meta", "planner": "planner/*.py.meta",
           "export": "export/*.py.meta", "runtime._checkpoint": "runtime/_checkpoint.py.meta",
           "_workers": "_workers.py.meta"}
PACKAGES = tuple(TARGETS)

#: Survivors that no test can kill: the mutant computes the same function. Mutant name ->
#: why. Every entry was checked by reading the mutant's diff (``mutmut show NAME``).
EQUIVALENT: dict[str, str] = {
    "shardplan.partition.brute_force.x_imbalance_lower_bound__mutmut_7":
        "`level = None` for `-np.inf`: the initial level is overwritten by the loop's first "
        "pass whenever there is a component, and never read when there is none (the final "
        "loop then runs over no loads).",
    "shardplan.partition.brute_force.x_imbalance_lower_bound__mutmut_8":
        "`level = +np.inf` for `-np.inf`: same reason as mutant 7.",
    "shardplan.partition.brute_force.x_imbalance_lower_bound__mutmut_9":
        "`while j <= k` for `while j < k`: the loop always leaves by its `j == k` break "
        "before the condition is tested with j == k.",
    "shardplan.partition.brute_force.x_imbalance_lower_bound__mutmut_19":
        "`level < ws[j]` for `level <= ws[j]`: when the level equals the next load, taking "
        "that load into the pool leaves the level unchanged ((j level + ws[j]) / (j + 1) = "
        "level), and the loads it sets to the level already are at it.",
    "shardplan.planner._search.xǁPlanSearchǁto_dict__mutmut_2":
        "`self.ranked if (top is None) and False else self.ranked[:top]`: with top None the "
        "mutant takes `self.ranked[:None]`, the whole tuple, which is what the original "
        "returns.",
}

#: mutmut's exit codes (``mutmut.stats.status_by_exit_code``) grouped for the report.
KILLED = {1, 3, 36, -24, 24, 152, 255, -11, -9}  # failed, internal error, timeout, crash
SURVIVED = {0}
NO_TESTS = {5, 33}


def _status(code: int | None) -> str:
    if code is None:
        return "not checked"
    if code in KILLED:
        return "killed"
    if code in SURVIVED:
        return "survived"
    if code in NO_TESTS:
        return "no tests"
    if code == 34:
        return "skipped"
    return "suspicious"


def collect(root: Path) -> dict[str, dict[str, int | None]]:
    """Mutant name -> exit code, from mutmut's ``mutants/**/*.py.meta`` files, for the
    planning packages."""
    import json

    out: dict[str, dict[str, int | None]] = {p: {} for p in PACKAGES}
    for pkg in PACKAGES:
        for meta in sorted((root / "mutants" / "shardplan").glob(TARGETS[pkg])):
            data = json.loads(meta.read_text())
            out[pkg].update(data["exit_code_by_key"])
    return out


def _diff(name: str) -> str:
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "mutmut"), "show", name], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("#")]
    return "\n".join(lines).strip()


def _target(name: str) -> str | None:
    """The report row a mutant's name belongs to."""
    rest = name.removeprefix("shardplan.")
    return next((pkg for pkg in PACKAGES if rest.startswith(pkg + ".")), None)


def previous(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """An earlier report's table rows (row name -> its cells after the name) and survivor
    sections (row name -> the sections' lines, in order)."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"\| ([\w.]+)(?: \(earlier run\))? (\| \d.*)$", line)
        if m and m.group(1) in TARGETS:
            rows[m.group(1)] = m.group(2)
    sections: dict[str, list[str]] = {}
    body = text.split("\n## Survivors\n", 1)[1] if "\n## Survivors\n" in text else ""
    for part in re.split(r"(?m)^(?=### `)", body):
        m = re.match(r"### `([^`]+)`", part)
        pkg = _target(m.group(1)) if m else None
        if pkg is not None:
            sections.setdefault(pkg, []).extend(part.rstrip("\n").split("\n") + [""])
    return rows, sections


def report(results: dict[str, dict[str, int | None]], command: str, note: str = "",
           old: str = "") -> str:
    rows = ["| package | mutants | checked | killed | survived | equivalent | no tests | "
            "score |", "|---|---|---|---|---|---|---|---|"]
    survivors: list[tuple[str, str]] = []
    old_rows, old_sections = previous(old)
    carried: list[str] = []
    for pkg in PACKAGES:
        status = {k: _status(v) for k, v in results[pkg].items()}
        count = Counter(status.values())
        checked = sum(n for s, n in count.items() if s != "not checked")
        if not checked and pkg in old_rows:
            rows.append(f"| {pkg} (earlier run) {old_rows[pkg]}")
            carried.append(pkg)
            continue
        equivalent = sum(1 for k, s in status.items() if s == "survived" and k in EQUIVALENT)
        killed = count["killed"]
        survived = count["survived"] - equivalent
        denom = killed + survived
        score = f"{100.0 * killed / denom:.1f}%" if denom else "-"
        rows.append(f"| {pkg} | {len(status)} | {checked} | {killed} | {survived} | "
                    f"{equivalent} | {count['no tests']} | {score} |")
        survivors += [(k, pkg) for k, s in sorted(status.items()) if s == "survived"]
    out = ["# Mutation testing of the planning packages", "",
           "Written by `benchmarks/mutation_report.py` from mutmut's results in `mutants/` "
           f"(they accumulate over runs; the last one: `{command}`).", "",
           *([note, ""] if note else []),
           "Score: killed / (killed + survived that are not equivalent); a mutant that "
           "times out counts as killed. `checked` counts the mutants this run tested; the "
           "others (outside the patterns run) are not in the score.", "", *rows, ""]
    if carried:
        out[-1:-1] = ["", "Rows marked *earlier run* (and their survivors) are carried over "
                      "from the previous report: `mutants/` holds no checked mutant of them."]
    if survivors or any(old_sections.get(p) for p in carried):
        out += ["## Survivors", ""]
        for name, _ in survivors:
            why = EQUIVALENT.get(name)
            out.append(f"### `{name}`" + (" (equivalent)" if why else ""))
            if why:
                out.append(f"\n{why}\n")
            out += ["", "```diff", _diff(name), "```", ""]
    for pkg in carried:
        out += old_sections.get(pkg, [])
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="store_true", help="run mutmut first")
    ap.add_argument("--max-children", type=int, default=2)
    ap.add_argument("--note", default="", help="a line for the report (what was sampled)")
    ap.add_argument("patterns", nargs="*", help="mutant name globs (default: all)")
    args = ap.parse_args()
    command = "mutmut run --max-children {} {}".format(args.max_children,
                                                        " ".join(args.patterns)).strip()
    if args.run:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run([str(ROOT / ".venv" / "bin" / "mutmut"), "run",
                               "--max-children", str(args.max_children), *args.patterns],
                              cwd=ROOT, env=env, check=False)
        if proc.returncode not in (0, 1):
            print(f"mutmut run failed with exit status {proc.returncode}", file=sys.stderr)
            return 2
    results = collect(ROOT)
    if not any(results.values()):
        print("no mutmut results in mutants/: run with --run first", file=sys.stderr)
        return 2
    path = ROOT / "benchmarks" / "results" / "mutation.md"
    old = path.read_text() if path.exists() else ""
    write_atomic(path, report(results, command, args.note, old))
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
