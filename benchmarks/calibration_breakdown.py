"""Where an iteration's time goes: the simulator's components beside the real run's phases.

For the plans of ``benchmarks/calibration.py`` (same model specs, micro-batch sizes,
micro-batches, optimizer and measured topology), this script simulates one iteration
(``simulate(..., timeline=True)``) and runs the plan with the runtime while timing its phases
on every rank, then prints, per plan and rank, the simulator's figures next to the measured
ones (milliseconds per iteration, medians over the timed steps):

- ``forward``: the model's (or stage's) forward; ``loss``: the loss's forward and backward
  (the runtime's loss, :func:`shardplan.workload.loss_fn_for`); ``backward``: the
  autograd backward without the loss's; ``pipelining``: what torch's pipelining schedule
  spends in its forward and backward actions beside the stage's own computation;
  ``p2p``: posting and waiting on stage-to-stage messages (waits include idle time: a
  bubble shows here); ``redistribute``: a DTensor program's redistributions (the
  runtime's ``_dtensor.redistribute``: reductions of partial sums, re-shards, gathers of
  outputs; waits include the other ranks' lateness, and DTensor's collectives are
  asynchronous: a wait can fall in the next operator, under ``forward``); ``grad sync``:
  the runtime's gradient reduction after the schedule; ``optimizer``: the optimizer step
  and ``zero_grad``; ``other``: the rest of the timed step (Python between phases);
  ``step``: the rank's timed step.
- The simulator's ``F``, ``B`` and ``OPT`` intervals of that rank's device, its messages
  (``activation``, ``gradient``, ``allreduce`` sent), its idle time before its optimizer
  finishes, and the iteration.

Phases are timed exclusively (a phase running inside another is not counted twice) by
wrapping the runtime's functions in every rank (the runtime spawns its ranks, and spawn
imports this file in each of them first); each rank writes its timings to a temporary
directory. A benchmark: timing adds a few microseconds per call.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/calibration_breakdown.py \\
        --model transformer --plans "one device|pipeline 2 x 1, GPipe (Parmesan)"
    .venv/bin/python benchmarks/calibration_breakdown.py --list     # the plan names

Prints the tables; writes nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import calibration  # noqa: E402

PHASES = ("forward", "loss", "backward", "pipelining", "p2p", "redistribute", "grad sync",
          "optimizer", "other")


# ----------------------------------------------------------------- timing inside the ranks
class _Clock:
    """Exclusive phase times of the current step of this process (nested phases pause
    their parent)."""

    def __init__(self) -> None:
        self.out_dir: str | None = None
        self.reset()

    def reset(self) -> None:
        self.acc: dict[str, float] = defaultdict(float)
        self.stack: list[list[Any]] = []  # [phase, start of its current exclusive slice]
        self.steps: list[dict[str, float]] = []
        self.t0: float | None = None

    def enter(self, phase: str) -> None:
        now = time.perf_counter()
        if self.stack:
            top = self.stack[-1]
            self.acc[top[0]] += now - top[1]
        self.stack.append([phase, now])

    def leave(self) -> None:
        now = time.perf_counter()
        phase, start = self.stack.pop()
        self.acc[phase] += now - start
        if self.stack:
            self.stack[-1][1] = now

    def add(self, phase: str, seconds: float) -> None:
        self.acc[phase] += seconds

    def tick(self, now: float) -> None:
        """The runtime's ``_time()``: called at a step's start and at its end."""
        if self.t0 is None:
            self.t0 = now
            self.acc = defaultdict(float)
            return
        step = dict(self.acc)
        step["step"] = now - self.t0
        self.steps.append(step)
        self.t0 = None
        if self.out_dir is not None:
            rank = os.environ.get("LOCAL_RANK", "0")
            path = os.path.join(self.out_dir, f"rank{rank}.json")
            with open(path + ".tmp", "w", encoding="utf-8") as fh:
                json.dump(self.steps, fh)
            os.replace(path + ".tmp", path)


CLOCK = _Clock()
_ENV = "SHARDPLAN_BREAKDOWN_DIR"
_PROFILE = "SHARDPLAN_BREAKDOWN_PROFILE"


def _timed(fn: Any, phase: str) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        CLOCK.enter(phase)
        try:
            return fn(*args, **kwargs)
        finally:
            CLOCK.leave()

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _install() -> None:
    """Wrap the runtime's phases (in this process; forked ranks inherit the wrappers)."""
    import torch
    import torch.distributed.pipelining.schedules as sched
    import torch.distributed.pipelining.stage as pstage

    from shardplan.runtime import _dtensor, _rank, _tensor_parallel, _worker

    orig_time = _worker._time

    prof: list[Any] = []
    want = os.environ.get(_PROFILE) == "1" and os.environ.get("LOCAL_RANK", "0") == "0"

    def tick() -> float:
        if want and CLOCK.t0 is not None and prof:  # the profiled step ends
            prof[0].__exit__(None, None, None)
            table = prof[0].key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
            with open(os.path.join(CLOCK.out_dir or ".", "profile.txt"), "w") as fh:
                fh.write(table)
            prof.clear()
        now = orig_time()
        CLOCK.tick(now)
        if want and CLOCK.t0 is not None and len(CLOCK.steps) == 3:  # the 4th step
            prof.append(torch.profiler.profile(activities=[
                torch.profiler.ProfilerActivity.CPU]))
            prof[0].__enter__()
        return now

    _worker._time = _rank._time = tick  # _rank's: the strategy runs' clock
    torch.autograd.backward = _timed(torch.autograd.backward, "backward")
    base = pstage._PipelineStageBase
    base.forward_one_chunk = _timed(base.forward_one_chunk, "pipelining")
    base.backward_one_chunk = _timed(base.backward_one_chunk, "pipelining")
    sched._batch_p2p = _timed(sched._batch_p2p, "p2p")
    sched._wait_batch_p2p = _timed(sched._wait_batch_p2p, "p2p")
    _worker._StageModule.forward = _timed(_worker._StageModule.forward, "forward")
    _dtensor.ShardedProgram.forward = _timed(_dtensor.ShardedProgram.forward, "forward")
    _worker._sync_grads = _timed(_worker._sync_grads, "grad sync")
    _tensor_parallel.sync_stage_grads = _timed(_tensor_parallel.sync_stage_grads,
                                               "grad sync")
    _dtensor.sync_grads = _timed(_dtensor.sync_grads, "grad sync")
    _dtensor.redistribute = _timed(_dtensor.redistribute, "redistribute")

    orig_opt = _worker._optimizer

    def optimizer(cfg: Any, params: Any) -> Any:
        opt = orig_opt(cfg, params)
        opt.step = _timed(opt.step, "optimizer")
        opt.zero_grad = _timed(opt.zero_grad, "optimizer")
        return opt

    _worker._optimizer = _rank._optimizer = optimizer

    orig_build = _worker._build

    def build(cfg: Any, batch: int) -> Any:  # DDP / FSDP / single: the model's forward
        model, inputs, name = orig_build(cfg, batch)
        if sys._getframe(1).f_code.co_name not in ("_run_baseline", "run_single"):
            return model, inputs, name  # exported and split: the stage programs are timed
        model.register_forward_pre_hook(lambda *_: CLOCK.enter("forward"), prepend=True)
        model.register_forward_hook(lambda *_: CLOCK.leave(), always_call=True)
        return model, inputs, name

    orig_loss = _worker.loss_fn_for

    def loss_fn_for(spec: str) -> Any:
        fn = orig_loss(spec)

        def loss(output: Any, target: Any) -> Any:
            CLOCK.enter("loss")
            try:
                value = fn(output, target)
            finally:
                CLOCK.leave()
            if getattr(value, "requires_grad", False) and getattr(output, "requires_grad",
                                                                  False):
                began: list[float] = []
                value.register_hook(lambda g: began.append(time.perf_counter()))

                def done(g: Any) -> None:  # the loss's backward: charged to "loss"
                    if began:
                        spent = time.perf_counter() - began.pop()
                        CLOCK.add("loss", spent)
                        CLOCK.add("backward", -spent)

                output.register_hook(done)
            return value

        return loss

    _worker._build = _rank._build = build
    _worker.loss_fn_for = loss_fn_for
    _tensor_parallel.loss_fn_for = loss_fn_for


# ------------------------------------------------------------------------------ the tables
def _sim_components(sim: Any, device: int) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    last = 0.0
    for iv in sim.intervals:
        if iv.device != device:
            continue
        kind = {"F": "F", "B": "B", "OPT": "OPT"}.get(iv.kind, iv.kind)
        if iv.kind in ("BI", "BW"):
            kind = "B"
        out[kind] += iv.end - iv.start
        if iv.kind in ("F", "B", "BI", "BW", "OPT"):
            last = max(last, iv.end)
    out["idle"] = last - out["F"] - out["B"] - out["OPT"]
    out["iteration"] = sim.iteration_seconds
    return out


def _measured(out_dir: str, ranks: int, warmup: int,
              skip: int | None = None) -> list[dict[str, float]]:
    rows = []
    for r in range(ranks):
        path = os.path.join(out_dir, f"rank{r}.json")
        if not os.path.exists(path):
            rows.append({})
            continue
        with open(path, encoding="utf-8") as fh:
            steps = [s for i, s in enumerate(json.load(fh)) if i >= warmup and i != skip]
        keys = {k for s in steps for k in s}
        med = {k: statistics.median(s.get(k, 0.0) for s in steps) for k in keys}
        med["other"] = med.get("step", 0.0) - sum(med.get(p, 0.0) for p in PHASES
                                                  if p != "other")
        rows.append(med)
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="transformer", choices=list(calibration.MODELS))
    ap.add_argument("--plans", default="one device|pipeline 2 x 1, GPipe (Parmesan)|"
                    "pipeline 2 x 1, 1F1B (Parmesan)",
                    help="plan names separated by '|' (see --list)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hybrid", action="store_true", help="also measure 4 processes")
    ap.add_argument("--list", action="store_true", help="print the plan names and stop")
    ap.add_argument("--torch-profile", action="store_true",
                    help="also print torch.profiler's top operators of rank 0's 4th step "
                         "(slows that step: its phases are left out)")
    args = ap.parse_args(argv)
    from shardplan.capture import capture_spec
    from shardplan.ir import ExecutionSettings
    from shardplan.simulate import simulate
    from shardplan.topology import build

    spec, mbs = calibration.MODELS[args.model]
    wanted = [p.strip() for p in args.plans.split("|") if p.strip()]
    load = os.getloadavg()[0]
    topo2 = build("measure", nproc=2, repeats=5)
    topo4 = build("measure", nproc=4, repeats=3) if args.hybrid else None
    graph = capture_spec(spec, batch_size=mbs, seq_len=calibration.SEQ, profile=True)
    settings, _ = ExecutionSettings().override(
        microbatches=calibration.MICRO, microbatch_size=mbs,
        global_batch=calibration.MICRO * mbs, optimizer="adam", schedule="gpipe")
    plans = calibration._plans(graph, topo2, topo4, settings)
    if args.list:
        print("\n".join(kind for kind, _, _ in plans))
        return 0
    print(f"# {args.model}: simulator components vs measured phases (ms per iteration; "
          f"load average {load:.2f})\n")
    for t in (topo2, topo4):
        if t is not None:
            print(f"- `--nproc {t.num_devices}`: {calibration._overheads_text(t)}")
    loss = graph.meta.get("loss")
    if loss:
        print(f"- loss ({loss['function']}) per micro-batch: {_ms(loss['fwd_seconds'])} / "
              f"{_ms(loss['bwd_seconds'])} ms forward / backward")
    print()
    for kind, plan, _ in plans:
        if wanted and kind not in wanted:
            continue
        used = sorted({d for st in plan.stages for d in st.devices})
        topo = topo4 if len(used) > 2 else topo2
        sim = simulate(plan, graph, topo, timeline=True)
        with tempfile.TemporaryDirectory(prefix="breakdown-") as tmp:
            os.environ[_ENV] = tmp  # the spawned ranks import this file: see the end
            if args.torch_profile:
                os.environ[_PROFILE] = "1"
            try:
                cfg, res = calibration._run(plan, graph, spec, args.steps)
            finally:
                del os.environ[_ENV]
                os.environ.pop(_PROFILE, None)
            meas = _measured(tmp, len(used), args.warmup, skip=3 if args.torch_profile
                             else None)
            profile = os.path.join(tmp, "profile.txt")
            profile_text = Path(profile).read_text() if os.path.exists(profile) else ""
        step = statistics.median(res.seconds_per_step[args.warmup:])
        print(f"## {kind} ({cfg.kind}): predicted {_ms(sim.iteration_seconds)}, "
              f"measured {_ms(step)} (ratio {sim.iteration_seconds / step:.2f})\n")
        if plan.strategy is not None:
            print(f"Strategy: {calibration._split_note(plan)}, the rest replicated.\n")
        head = "| phase | " + " | ".join(f"rank {r} measured" for r in range(len(used)))
        print(head + " |")
        print("|---|" + "---:|" * len(used))
        for p in (*PHASES, "step"):
            print(f"| {p} | " + " | ".join(_ms(m.get(p)) for m in meas) + " |")
        comps = [_sim_components(sim, d) for d in used]
        keys = ["F", "B", "OPT", "activation", "gradient", "allreduce", "idle", "iteration"]
        print("\n| simulated | " + " | ".join(f"device {d}" for d in used) + " |")
        print("|---|" + "---:|" * len(used))
        for k in keys:
            print(f"| {k} | " + " | ".join(_ms(c.get(k, 0.0)) for c in comps) + " |")
        print()
        if profile_text:
            print("```\n" + profile_text + "```\n")
        sys.stdout.flush()
    return 0


if __name__ == "__mp_main__" and os.environ.get(_ENV):
    # A rank spawned by the runtime: multiprocessing's spawn imports the parent's main
    # file under this name before the rank's target runs.
    _install()
    CLOCK.out_dir = os.environ[_ENV]

if __name__ == "__main__":
    sys.exit(main())
