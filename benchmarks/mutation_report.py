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
    "shardplan.cost._llm_moe.x_overlapped_layer_pair__mutmut_40":
        "`dtype=None` for `dtype=np.float64` on np.maximum of float64 event times: the same "
        "float64 array.",
    "shardplan.cost._llm_moe.x_overlapped_layer_pair__mutmut_42":
        "the `dtype=np.float64` dropped on np.maximum of float64 event times: the same array.",
    "shardplan.planner._llm.x__batching__mutmut_22":
        "`break` for `continue` past a micro-batch size that exceeds the largest or does not "
        "divide the replica's share: the sizes are ascending powers of two (or the one fixed "
        "size), so every later size exceeds or fails to divide as well.",
    "shardplan.planner._llm.x__batching__mutmut_26":
        "`pp >= 1` for `pp > 1` before `m < pp`: with pp = 1 the count m is at least 1, so "
        "the test is false either way.",
    "shardplan.planner._llm.x__batching__mutmut_29":
        "`break` for `continue` when a pipeline has fewer micro-batches than stages: larger "
        "micro-batches only make fewer, so every later size is skipped as well.",
    "shardplan.planner._llm.x__batching__mutmut_41":
        "`break` for `continue` past virtual stages that the pipeline cannot take (pp = 1 "
        "or m not a multiple of pp): the test does not depend on vp, so every later vp fails "
        "it too.",
    "shardplan.cost._formulas.x_optimizer_seconds__mutmut_12":
        "`step > 1` for `step > 0`: MIXED_PRECISION_STEP_BYTES holds 0, 16 and 24 only, so "
        "both guards let exactly the mixed precisions subtract the gradient copy.",
    "shardplan.cost._llm.x_llm_costs__mutmut_692":
        "`dtype=None` for `dtype=np.float64` around optimizer_seconds' result: it is already "
        "a float64 array (numpy arithmetic on float64 inputs).",
    "shardplan.cost._llm.x_llm_costs__mutmut_694":
        "the optimizer seconds' `dtype=np.float64` dropped: the same float64 array.",
    "shardplan.cost._llm.x_llm_costs__mutmut_869":
        "`master_bytes > 1` for `> 0`: precision_bytes gives master bytes 0 or 4, so both "
        "tests split mixed precision from fp32 alike.",
    "shardplan.export._parallel.x_torchtitan_parallel__mutmut_38":
        "`settings.schedule == 'XXinterleaved-1f1bXX'`: with vp > 1 the else branch names "
        "'interleaved-1f1b', which is the schedule the true branch would have kept.",
    "shardplan.export._parallel.x_torchtitan_parallel__mutmut_39":
        "`'INTERLEAVED-1F1B'`: the same as mutant 38 (the else branch gives the same name).",
    "shardplan.export._parallel.x_torchtitan_parallel__mutmut_139":
        "the imported model's default `None` for `''`: 'None' matches no llama spec either, so "
        "the sequence comes from the graph in both.",
    "shardplan.export._parallel.x_torchtitan_parallel__mutmut_141":
        "no default for the imported model (None): as mutant 139.",
    "shardplan.export._parallel.x_torchtitan_parallel__mutmut_144":
        "the default 'XXXX': matches no llama spec, as ''.",
    "shardplan.cost._gpu.x_nccl_terms__mutmut_2":
        "`.reshape(None)` for `.reshape(-1)`: the ids keep their shape, and every later use "
        "(`size`, `np.unique`, boolean masks, indexing a mask's result) treats a 2-d array "
        "of ids as the flat one (the tests pass lists, ranges and a 2-d array).",
    "shardplan.cost._gpu.x_nccl_terms__mutmut_8":
        "`.reshape(-2)` for `.reshape(-1)`: numpy takes any negative size as the one "
        "unknown dimension, so both flatten.",
    "shardplan.cost._gpu.x_nccl_terms__mutmut_52":
        "`node == node[1]` for `node == node[0]`: the GPUs of the second listed device's node "
        "instead of the first's; every node of a topology with levels has the same NVLink "
        "pair bandwidth (the pair models build nodes alike), so b_in is the same.",
    "shardplan.cost._gpu.x_cluster_collective_seconds__mutmut_36":
        "`dtype=None` for `dtype=np.float64`: integer byte counts stay integers, and "
        "`b > 0` and `lat + b * per_byte` (a float) come out the same.",
    "shardplan.cost._gpu.x_cluster_collective_seconds__mutmut_38":
        "the dtype argument dropped: as mutant 36.",
    "shardplan.cost._gpu.x_cluster_collective_seconds__mutmut_49":
        "`r >= 1` for `r > 1`: a group of one GPU has nccl_terms (0, 0), so "
        "`lat + b * per_byte` is the 0 the original writes.",
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
    "shardplan.planner._search.x_search__mutmut_122":
        "`timed_out = None` for `False`: every task taken sets it to `timed_out or cut` (a "
        "bool) and a deadline sets True; with no task taken there is no row, and `not None` "
        "raises InfeasibleError as `not False` does, so no result carries the None.",
    "shardplan.planner._search.x_search__mutmut_160":
        "`_GRACE * (time_limit or 1.0)`: differs only for time_limit 0, whose deadline is the "
        "start, so the seconds left are <= 0 either way and clamp to 0.",
    "shardplan.planner._families.x_tasks_for__mutmut_9":
        "`range(2, d + 1)` for `range(1, d + 1)`: drops the one-stage shape (1, D), which "
        "every family that uses `shapes` filters out (`s > 1`).",
    "shardplan.planner._families.x_tasks_for__mutmut_11":
        "`range(1, d + 2)`: adds s = D + 1, which never divides D.",
    "shardplan.planner._llm.x__divisors__mutmut_7":
        "`range(1, n + 2)`: adds n + 1, which never divides n.",
    "shardplan.planner._llm.x_baseline_comparison__mutmut_12":
        "`timeline=None` for `False` in the baseline's simulation: the timeline only "
        "decides whether intervals are kept; the comparison reads the iteration time and "
        "the memory fit, which do not depend on it.",
    "shardplan.planner._llm.x_baseline_comparison__mutmut_16":
        "`timeline` left at its default: same reason as mutant 12.",
    "shardplan.planner._llm.x_baseline_comparison__mutmut_17":
        "`timeline=True`: same reason as mutant 12.",
    "shardplan.planner._llm.x_baseline_comparison__mutmut_36":
        "the speed-up's `if best.iteration_seconds > 0` made always true: a winner is a "
        "simulated layout of a graph with work, whose iteration is never 0 s.",
    "shardplan.planner._llm.x_baseline_comparison__mutmut_38":
        "`>= 0` for `> 0`: same reason as mutant 36.",
    "shardplan.planner._llm.x_llm_plan__mutmut_21":
        "`timeline=None` for `False`: the simulators test it for truth only "
        "(`if timeline`), where None is False.",
    "shardplan.planner._llm.x_llm_search__mutmut_121":
        "`timeline=None` in the search's simulation: tested for truth only, as False; and "
        "the search keeps only the iteration time.",
    "shardplan.planner._llm.x_llm_search__mutmut_127":
        "`timeline` at its default (True) in the search's simulation: only the kept "
        "intervals differ, and the search reads the iteration time alone.",
    "shardplan.planner._llm.x_llm_search__mutmut_129":
        "`timeline=True`: same reason as mutant 127.",
    "shardplan.planner._llm.x_llm_search__mutmut_122":
        "`costs=None`: simulate_llm then prices the layout itself, from the same graph, "
        "topology, layout and settings, which gives the same costs (they are passed only to "
        "save that work).",
    "shardplan.planner._llm.x_llm_search__mutmut_128":
        "`costs` left out (None): same reason as mutant 122.",
    "shardplan.planner._llm.x_llm_search__mutmut_2":
        "default `max_microbatch=9` for 8: the per-replica micro-batches tried are 1, 2, 4, "
        "8, 16, and 8 and 9 admit the same ones.",
    "shardplan.planner._llm.x_candidates__mutmut_1":
        "default `max_microbatch=9` for 8: same reason as x_llm_search mutant 2.",
    "shardplan.planner._families.x_microbatch_choices__mutmut_28":
        "`(global_batch / m) % replicas` for `//`: the same condition first requires "
        "`global_batch % m == 0`, so the quotient is a whole number either way.",
    "shardplan.planner._families.x_microbatch_choices__mutmut_45":
        "`/` for `//` in the fallback: same reason as mutant 28.",
    "shardplan.planner._families.x_microbatch_choices__mutmut_39":
        "`range(1, global_batch + 2)`: adds global_batch + 1, which never divides it.",
    "shardplan.planner._llm.x_candidates__mutmut_8":
        "`... if isinstance(graph.meta, dict) or True`: a Graph's meta is always a dict.",
    "shardplan.planner._llm.x_candidates__mutmut_54":
        "`break` for `continue` in the micro-batch loop: the sizes are 1, 2, 4, 8, 16 in "
        "order; one above the maximum, or not dividing the replica's share, means every "
        "larger power of two is too.",
    "shardplan.planner._llm.x_candidates__mutmut_58":
        "`pp >= 1 and m < pp` for `pp > 1`: with pp = 1 the test is m < 1, never true "
        "(m >= 1).",
    "shardplan.planner._llm.x_candidates__mutmut_61":
        "`break` for `continue` when m < pp: m = share / mb falls as mb grows, so once it is "
        "below pp it stays below for every later mb.",
    "shardplan.planner._llm.x_family_rows__mutmut_66":
        "the throughput's condition made always true: a row that does not fit has an "
        "infinite time, so global_batch / time is 0.0, the else branch's value; a row that "
        "fits has a positive time.",
    "shardplan.planner._llm.x_family_rows__mutmut_68":
        "`c.fits or time > 0`: same reason as mutant 66.",
    "shardplan.planner._llm.x_family_rows__mutmut_69":
        "`time >= 0` for `> 0`: same reason as mutant 66 (no simulated time is 0).",
    "shardplan.planner._search.x_search__mutmut_187":
        "`_CTX[\"XXctxXX\"] = ctx`: as mutant 186, the workers' initializer sets "
        "`_CTX[\"ctx\"]` before any task reads it.",
    "shardplan.planner._search.x_search__mutmut_188":
        "`_CTX[\"CTX\"] = ctx`: same reason as mutant 187.",
    "shardplan.planner._search.x_search__mutmut_186":
        "`_CTX[\"ctx\"] = None` before the pool: every worker (process pool or Ray) runs "
        "the initializer `_set_ctx(ctx)` before its first task, which sets it again.",
    "shardplan._workers.xǁRayExecutorǁ__init____mutmut_7":
        "`self._started = None` for `False`: the flag is only read by `close()` as "
        "`if self._started:`, where None and False are both false.",
    "shardplan._workers.x__speaks_http2__mutmut_22":
        "`conn.recv(9 + len(head))` for `9 - len(head)`: recv returns the bytes already "
        "there (at most the size asked), the loop ends once 9 are read, and only byte 3 "
        "(the frame type) is looked at; asking for more never changes which byte is 4th.",
    "shardplan._workers.x__speaks_http2__mutmut_23":
        "`conn.recv(10 - len(head))` for `9 - len(head)`: same reason as mutant 22.",
    "shardplan.export._frameworks.x__per_replica__mutmut_4":
        "`settings.microbatch_size or 1` for `or 0`: export() resolves the settings, "
        "which fills microbatch_size from the graph, and ExecutionSettings refuses a "
        "micro-batch size below 1, so the `or` never picks its default.",
    "shardplan.export._frameworks.x__torch__mutmut_7":
        "`unit=None` for `unit=\"module\"`: pipeline_parts treats every unit but "
        "\"layer\" as module starts.",
    "shardplan.export._frameworks.x__torch__mutmut_18":
        "`unit=\"XXmoduleXX\"`: same reason as mutant 7.",
    "shardplan.export._frameworks.x__torch__mutmut_19":
        "`unit=\"MODULE\"`: same reason as mutant 7.",
    "shardplan.export._layers.x_pipeline_parts__mutmut_1":
        "default `unit=\"XXmoduleXX\"`: every unit but \"layer\" means module starts.",
    "shardplan.export._layers.x_pipeline_parts__mutmut_2":
        "default `unit=\"MODULE\"`: same reason as mutant 1.",
    "shardplan.export._layers.x__block_depth__mutmut_4":
        "`m.split(\".\") if (m) or True else ()`: an empty module path splits into [\"\"], "
        "whose one part is not a digit, as the original's empty tuple has none.",
    "shardplan.export.x_export__mutmut_58":
        "`topology` passed as None to the LLM exporters (megatron_parallel, "
        "torchtitan_parallel), which take it for the common signature and never read it.",
    "shardplan.export.x_export__mutmut_60":
        "`schedule` passed as None to the LLM exporters, which never read it (their "
        "schedule is the settings' name).",
    "shardplan.export.x_export__mutmut_70":
        "`topology` passed as None to the pipeline exporters: _torch, _torchtitan, _megatron "
        "and _deepspeed never read it (the pipeline view is built from plan, graph, "
        "settings and schedule).",
}


def _same(reason: str, *names: str) -> None:
    """Several mutants equivalent for one reason."""
    EQUIVALENT.update(dict.fromkeys(names, reason))


_same('in the branch for a boolean `recompute`, which no ExecutionSettings reaches: its '
      '__post_init__ turns a boolean into "full"/"none" (dead code, kept for other '
      'settings objects).',
      *(f"shardplan.export._parallel.x__setting__mutmut_{i}" for i in range(21, 41)))

_same('in the last line (`recorded.get(name, _DEFAULTS[name])`), reached only for a '
      'name the settings lack; every name asked for is an ExecutionSettings field, so '
      '`hasattr(settings, name)` always returns before it (dead code).',
      *(f"shardplan.export._parallel.x__setting__mutmut_{i}" for i in (55, 56, 57, 58)))

_same('`microbatch_size or 1` for `or 0`: the settings reaching the exporters are '
      'resolved (microbatch_size filled in) and ExecutionSettings refuses sizes below '
      '1.',
      *(f"shardplan.export._parallel.x__batch__mutmut_{i}" for i in (4,)))

_same('`json.dumps(value) if ... or True`: for a boolean json.dumps gives '
      '"true"/"false", what `str(value).lower()` gives.',
      *(f"shardplan.export._parallel.x__toml__mutmut_{i}" for i in (2,)))

_same('the `settings.schedule == "interleaved-1f1b"` test mutated: when it is true the '
      'other branch yields "interleaved-1f1b" too, so the schedule named is the same.',
      *(f"shardplan.export._parallel.x_torchtitan_parallel__mutmut_{i}" for i in (38, 39)))

_same('another default for a missing `model` (None, "XXXX"): its string never matches '
      "the `llama[23]:FLAVOR,seq=N` pattern, as the original's empty string does not.",
      *(f"shardplan.export._parallel.x_torchtitan_parallel__mutmut_{i}" for i in (118, 120, 123)))

_same('default `exact=True`: every exporter passes `exact=opts.exact`, so the default '
      'is never used.',
      *(f"shardplan.export._frameworks.x__common__mutmut_{i}" for i in (3,)))

_same("the `count` of `str.replace` (the run of E's or L's collapsed to one letter) "
      "dropped or set to 2: a stage's E's (and L's) are one run, so the run occurs once "
      'and every count replaces the same single occurrence.',
      *(f"shardplan.export._frameworks.x__megatron__mutmut_{i}" for i in (102, 111, 123, 132)))

_same('`rsplit("/")` or `rsplit("/", 2)` for `rsplit("/", 1)`, then `[-1]`: the last '
      'piece is the same however many splits are made.',
      *(f"shardplan.export._frameworks.x__torchtitan__mutmut_{i}" for i in (116, 125)))

_same('`zip(..., strict=True)` made non-strict: the zipped sequences always have the '
      'same length (cuts and their snapped copy; the named nodes and their stages; '
      'their layer keys and stages).',
      *(f"shardplan.export._layers.x_pipeline_parts__mutmut_{i}"
        for i in (141, 144, 145, 184, 187, 188, 209, 212, 213)))

_same('`cut >= old` for `cut > old`: the line runs only when `old != cut` (equal cuts '
      '`continue` just before).',
      *(f"shardplan.export._layers.x_pipeline_parts__mutmut_{i}" for i in (162,)))

_same('`range(len(parts) + 1)` for `range(1, ...)`: adds the empty prefix "" to '
      'first_of, which is never looked up (module paths and their prefixes are non- '
      'empty).',
      *(f"shardplan.export._layers.x_pipeline_parts__mutmut_{i}" for i in (72,)))

_same('`range(1, len(parts) + 2)`: the extra prefix is the whole path again, and '
      'setdefault keeps its first node.',
      *(f"shardplan.export._layers.x_pipeline_parts__mutmut_{i}" for i in (76,)))

_same('`range(1, len(parts) + 2)`: the list gets the whole path twice at its end; '
      'callers take the first prefix that matches or ask whether any does, which a '
      'repeated last item never changes.',
      *(f"shardplan.export._layers.x__prefixes__mutmut_{i}" for i in (12,)))

_same('the data-parallel plan\'s `status="feasible"` left out: "feasible" is Plan\'s '
      'default status.',
      *(f"shardplan.planner._families.x__data_parallel__mutmut_{i}" for i in (14,)))

_same('PaSE\'s rows simulated under other `schedules` (None: the context\'s; dropped; '
      '"XXgpipeXX", "GPIPE"): a PaSE plan is one stage, and `_variants` simulates a '
      'one-stage plan under GPipe alone whatever schedules it is handed.',
      *(f"shardplan.planner._families.x__pase__mutmut_{i}" for i in (47, 55, 63, 64)))

_same('`np.asarray(..., dtype=None)` or without dtype for `dtype=np.float64` in '
      'sharding_inputs: the node seconds the cost model returns and a Topology\'s latency '
      'matrix are float64 arrays already.',
      *(f"shardplan.planner._families.x_sharding_inputs__mutmut_{i}" for i in (13, 15, 47, 49)))

_same('`np.fill_diagonal(cost, None)` or `(cost, 1.0)` for `0.0`: the Topology built from '
      'the matrix (dataclasses.replace runs its __post_init__) sets every diagonal entry to '
      '0.0 itself (ir.topology._matrix), and checks finiteness off the diagonal only.',
      *(f"shardplan.planner._families.x_sharding_inputs__mutmut_{i}" for i in (56, 59)))

_same('the settings handed to sharding_inputs keep the base schedule (`schedule=None` '
      'or left out) instead of "gpipe": sharding_inputs reads only the cost model\'s node '
      'seconds, edge bytes and inverse bandwidth, and the cost model never reads the '
      'schedule.',
      *(f"shardplan.planner._families.x__sharding__mutmut_{i}" for i in (37, 40)))

_same('`Objective("iteration_seconds", secs, )`: the lower bound left out is None, '
      'Objective\'s default, as passed.',
      *(f"shardplan.planner._families.x__stage_choice__mutmut_{i}" for i in (88,)))

_same('`m // (s / 2)` for `m // (s // 2)` in the interleaved rounds test: the line runs '
      'only for an even s (an odd one `continue`s just before), so s / 2 is the whole '
      'number s // 2 as a float, and m % max(1, m // (s / 2)) is the same number as a '
      'float, zero exactly when the original is.',
      *(f"shardplan.planner._families.x__variants__mutmut_{i}" for i in (67,)))

_same('another family name (None, "XXparmesanXX", "PARMESAN") in the Task the hybrid '
      'hands _partition: _partition reads the task\'s stages, replicas and budget, never '
      'its family (the algorithm is its own argument, "parmesan").',
      *(f"shardplan.planner._families.x__hybrid__mutmut_{i}" for i in (17, 25, 26)))

_same('another default for the hybrid plan\'s `meta["hybrid"]` or its '
      '`"timed_out_stages"` (None, or none given): every plan reaching the line has both, '
      'since hybrid_plan always writes `meta["hybrid"] = {..., "timed_out_stages": cut}` '
      'and _stage_choice returns PaSE\'s plan or one whose meta extends it; and a None '
      'list of stages cut short would read as false as the empty one does.',
      *(f"shardplan.planner._families.x__hybrid__mutmut_{i}" for i in (129, 131, 133, 135)))

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
