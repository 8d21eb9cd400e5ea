"""The layers of docs/architecture.md, read from the code: every import of every module
(top-level and inside functions, absolute and relative) goes down the layers, no circle of
modules exists, topology stays plain data, capture and runtime do not import each other, only
the torch packages import torch, and no module is over 1,000 lines.

``importlib.import_module`` with a computed name (the registry's built-in algorithm packages,
the package facade's lazy subpackages) is not an import statement and is not read here.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "shardplan"
MAX_LINES = 1000

# ------------------------------------------------------------------------------------ layers
#: Modules at the bottom, importable from everywhere.
BASE = {"errors", "_version", "_rng", "_workers", "_ranks", "_argtypes", "_limits"}
_VALUES = BASE | {"ir"}
_CORE = _VALUES | {"objectives", "registry", "topology"}
_PLANNING = _CORE | {"cost", "strategy", "simulate", "partition", "mapping"}

#: What each unit (a subpackage, or a module directly under shardplan/) may import besides
#: itself; the arrows of docs/architecture.md. A unit missing here fails the test.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_version": set(),
    "_rng": {"errors"},
    "_workers": {"errors"},
    "_ranks": {"errors"},
    "_argtypes": {"errors", "_workers", "_limits"},  # --ray's type is the executor's address
    # parser; sizes are checked against the one table of limits
    "_limits": {"errors"},
    # value objects and their files
    "ir": BASE,
    # plain data every planner reads: no planner, no torch
    "objectives": _VALUES,
    "registry": _VALUES,
    "topology": _VALUES,
    "generate": _VALUES,
    "importers": _VALUES | {"topology"},  # importers write graph, topology and plan files
    # the time and memory model
    "cost": _CORE - {"registry"},
    # planners below the simulator: PaSE's tables price the simulator's strategy stages
    "strategy": _CORE | {"cost"},
    "simulate": _CORE | {"cost", "strategy"},
    # planners that judge candidates with the simulator
    "partition": _CORE | {"cost", "simulate"},
    "mapping": _CORE | {"cost", "simulate"},
    "planner": _PLANNING,
    "report": _PLANNING,
    "export": _PLANNING,
    # the torch side: workload below capture and runtime, measurement above the runtime
    "workload": {"errors", "_limits"},
    "capture": _VALUES | {"workload"},
    "runtime": _PLANNING - {"partition", "mapping"} | {"workload"},
    "measure": _PLANNING - {"partition", "mapping"} | {"workload", "capture", "runtime"},
    # the entry points: everything
    "cli": _PLANNING | {"planner", "report", "export", "generate", "importers", "workload",
                        "capture", "runtime", "measure", "shardplan"},
    "shardplan": _PLANNING | {"workload", "capture"},  # the package facade (__init__.py)
    "__main__": {"cli"},
}

#: The packages that may import torch (and torchvision, transformers).
TORCH_UNITS = {"workload", "capture", "runtime", "measure"}
TORCH_MODULES = ("torch", "torchvision", "transformers")

# ------------------------------------------------------------------ known, to be removed
#: Circles of modules and modules over MAX_LINES tolerated while they are being fixed. Empty
#: since phase 2 of issue 35 (docs/architecture.md, "Inside the packages"): keep them so.
#: Each entry is exact: a new module in a circle, a new circle or another long module fails
#: the test, and an entry that no longer holds must be taken off.
ALLOWED_CIRCLES: set[frozenset[str]] = set()
ALLOWED_LONG: set[str] = set()


# ---------------------------------------------------------------------------------- reading
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """Everything module ``name`` imports, anywhere in it (see :func:`imports_in`)."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imports_in(path.read_text(), package)


def imports_in(source: str, package: str) -> set[str]:
    """Everything ``source`` (a module of ``package``) imports, at any depth, as absolute
    dotted names; ``from a import b`` counts as ``a.b`` when that is a module, else as ``a``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                out.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules() else mod)
    return out


def _resolve(target: str) -> str | None:
    """The shardplan module an imported name lives in (None for other packages)."""
    if target != "shardplan" and not target.startswith("shardplan."):
        return None
    while target not in modules():
        target = target.rpartition(".")[0]
    return target


@cache
def graph() -> dict[str, set[str]]:
    """Module -> the shardplan modules it imports (itself left out)."""
    out = {}
    for name in modules():
        deps = {_resolve(t) for t in imports_of(name)}
        out[name] = {d for d in deps if d is not None and d != name}
    return out


def unit(name: str) -> str:
    """The layer unit of a module: its subpackage, or the module directly under shardplan."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "shardplan"


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[frozenset[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


# ------------------------------------------------------------------------------------ tests
def test_the_reader_sees_imports_inside_functions_and_relative_ones() -> None:
    """The parser's own check: function-level and relative imports count, as modules."""
    assert "shardplan.workload.zoo" in imports_of("shardplan.capture")  # inside a function
    assert "shardplan.measure._worker" in imports_of("shardplan.measure._measure")
    source = ("def f():\n    from ..runtime import _worker\n    from . import _timing\n"
              "    from .._ranks import run_ranks\n    import torch.nn\n")
    assert imports_in(source, "shardplan.measure") == {
        "shardplan.runtime._worker", "shardplan.measure._timing", "shardplan._ranks",
        "torch.nn"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        frozenset({"a", "b", "c"})]


def test_every_unit_has_a_layer() -> None:
    missing = sorted({unit(m) for m in modules()} - set(ALLOWED))
    assert not missing, f"add these to ALLOWED and docs/architecture.md: {missing}"


def test_imports_go_down_the_layers() -> None:
    wrong = sorted(f"{m} imports {d}" for m, deps in graph().items() for d in deps
                   if unit(d) != unit(m) and unit(d) not in ALLOWED[unit(m)])
    assert not wrong, "imports against docs/architecture.md:\n" + "\n".join(wrong)


def test_the_allowed_layers_form_no_circle() -> None:
    edges = {u: {v for v in deps if v != u} for u, deps in ALLOWED.items()}
    assert circles(edges) == []


def test_no_circle_of_modules() -> None:
    found = set(circles(graph()))
    new = sorted(sorted(c) for c in found - ALLOWED_CIRCLES)
    assert not new, f"circles of imports: {new}"
    gone = sorted(sorted(c) for c in ALLOWED_CIRCLES - found)
    assert not gone, f"gone, take them off ALLOWED_CIRCLES: {gone}"


@pytest.mark.parametrize("low,high", [("topology", "runtime"), ("topology", "strategy"),
                                      ("topology", "capture"), ("topology", "measure"),
                                      ("capture", "runtime"), ("runtime", "capture"),
                                      ("workload", "capture"), ("workload", "runtime")])
def test_named_boundaries(low: str, high: str) -> None:
    """The boundaries issue 35 names, spelled out (ALLOWED implies them)."""
    wrong = sorted(f"{m} imports {d}" for m, deps in graph().items() if unit(m) == low
                   for d in deps if unit(d) == high)
    assert not wrong


def test_only_the_torch_packages_import_torch() -> None:
    wrong = sorted(f"{m} imports {t}" for m in modules() if unit(m) not in TORCH_UNITS
                   for t in imports_of(m) if t.split(".")[0] in TORCH_MODULES)
    assert not wrong


def test_no_module_is_over_a_thousand_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for p in modules().values()}
    long = sorted(f"{p}: {n}" for p, n in sizes.items() if n > MAX_LINES
                  and p not in ALLOWED_LONG)
    assert not long
    gone = sorted(p for p in ALLOWED_LONG if sizes.get(p, 0) <= MAX_LINES)
    assert not gone, f"take them off ALLOWED_LONG: {gone}"
