"""Memory calibration: the memory model's peak per stage against torch's own measurements.

For each model (paper 000's MLP, a 2-layer GPT-style transformer at batch 4 x 128 tokens,
ResNet-50 at batch 2 and 64 pixels) and each plan (the whole model on one device, and the
two halves of a 2-stage pipeline cut by operator count), every stage is the program the
runtime runs (``shardplan train``'s export and split). For one micro-batch with Adam the
script compares:

- **predicted**: ``shardplan.cost.partition_memory_breakdown`` (``cost/_memory.py``): the
  stage's total, and the old rule (every term added: parameters, gradients, optimizer state
  and activations together) for reference;
- **MemTracker**: the peak of ``torch.distributed._tools.mem_tracker.MemTracker`` over a
  steady-state training step of the stage (the optimizer state exists from a first step;
  forward, backward with a gradient of ones on the outputs, Adam step, gradients set to
  None), with what it attributes the peak to;
- **RSS** (whole models only): the process's resident-set high-water mark during that step
  (``/proc/self/clear_refs`` reset after the warm-up step) less its size before the model
  was built, in a fresh process per model. It includes the allocator's and the threads'
  own memory and torch's lazily created state, which no model of tensors predicts, and
  misses pages the allocator maps but never touches.

The goal is predicted within 10% of MemTracker. Usage::

    .venv/bin/python benchmarks/memory_calibration.py

Writes ``benchmarks/results/memory_calibration.md`` (about 2 minutes).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
MIB = 2.0**20
MODELS = (("mlp", {"batch_size": 8}),
          ("transformer,num_layers=2", {"batch_size": 4, "seq_len": 128}),
          ("torchvision:resnet50", {"batch_size": 2, "image_size": 64}))


def _programs(spec: str, sizes: dict, stages: int):
    """(graph, plan, stage programs, probes) as the runtime builds them."""
    from shardplan.capture import capture_spec
    from shardplan.runtime import config_for_plan, contiguous_plan
    from shardplan.runtime._rank import _stage_programs

    graph = capture_spec(spec, **sizes)
    plan = contiguous_plan(graph, stages, 1)
    extra = {k: v for k, v in sizes.items() if k in ("seq_len", "image_size")}
    cfg = config_for_plan(plan, graph, model=spec, steps=1, microbatches=1, schedule="gpipe",
                          optimizer="adam", **extra)
    _, programs, probes = _stage_programs(cfg, probe_batch=sizes["batch_size"])
    return graph, plan, programs, probes


def _step_fn(module, inputs, first: bool):
    """One training step of a stage: forward, backward (ones on the outputs), Adam."""
    import torch

    opt = torch.optim.Adam(module.parameters(), lr=1e-3)

    def step() -> None:
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point() and not first)
                  for t in inputs]
        xs = [t.clone() if t.requires_grad else t for t in leaves]  # in-place ops allowed
        out = module(*xs)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(o, torch.Tensor) and o.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        del out, outs, xs, leaves
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, opt


def _memtracker(module, inputs, first: bool) -> dict[str, float]:
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    step, opt = _step_fn(module, inputs, first)
    step()  # the optimizer state exists from here on, as in a running job
    mt = MemTracker()
    mt.track_external(module, opt)
    with mt:
        step()
    snap = mt.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {str(getattr(k, "value", k)): float(v) for k, v in snap.items()}


def _rss_child(spec: str, sizes: dict) -> None:
    """In a fresh process: the RSS high-water mark of a steady-state step of the whole
    model, less the RSS before the model was built. Prints bytes as JSON."""
    import torch

    torch.set_num_threads(1)
    from shardplan.workload import build

    def rss() -> float:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def hwm() -> float:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    extra = {k: v for k, v in sizes.items() if k in ("seq_len", "image_size")}
    _warm_torch()
    before = rss()
    model, inputs, _ = build(spec, batch_size=sizes["batch_size"], **extra)
    step, _ = _step_fn(model, inputs, True)
    step()
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset VmHWM to the current RSS
        reset = True
    except OSError:
        reset = False
    step()
    print(json.dumps({"bytes": hwm() - before, "reset": reset}))


def _warm_torch() -> None:
    """Create torch's lazily built state (thread pools, kernel caches, the autograd engine)
    with a tiny model of every layer kind the models use, so that the RSS difference is the
    model's; tiny, so that what it frees does not leave the real model room in the
    allocator's arenas."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    tiny = nn.ModuleDict({"conv": nn.Conv2d(3, 4, 3), "bn": nn.BatchNorm2d(4),
                          "emb": nn.Embedding(16, 8), "ln": nn.LayerNorm(8),
                          "fc": nn.Linear(8, 4)})
    opt = torch.optim.Adam(tiny.parameters())
    x = torch.randn(2, 3, 8, 8)
    h = F.relu(tiny["bn"](tiny["conv"](x))).mean(dim=(2, 3))
    t = tiny["ln"](tiny["emb"](torch.randint(0, 16, (2, 5))))
    t = F.scaled_dot_product_attention(t[:, None], t[:, None], t[:, None])[:, 0].mean(1)
    out = F.gelu(tiny["fc"](t)) + h
    F.cross_entropy(torch.softmax(out, -1), torch.tensor([0, 1])).backward()
    opt.step()
    del tiny, opt, x, h, t, out
    gc.collect()


def _rss(spec: str, sizes: dict) -> tuple[float, bool] | None:
    done = subprocess.run([sys.executable, __file__, "--rss-child", spec, json.dumps(sizes)],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        sys.stderr.write(f"RSS measurement of {spec} failed: {done.stderr.strip()[-500:]}\n")
        return None
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return float(out["bytes"]), bool(out["reset"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rss-child", nargs=2, metavar=("SPEC", "SIZES"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS / "memory_calibration.md"))
    args = ap.parse_args(argv)
    if args.rss_child:
        _rss_child(args.rss_child[0], json.loads(args.rss_child[1]))
        return 0
    import torch

    torch.set_num_threads(1)
    from shardplan.cost import partition_memory_breakdown
    from shardplan.ir.io import write_atomic

    rows = []
    ratios = []
    for spec, sizes in MODELS:
        rss = _rss(spec, sizes)
        for stages in (1, 2):
            graph, plan, programs, probes = _programs(spec, sizes, stages)
            br = partition_memory_breakdown(graph, plan.assignment(graph.num_nodes), stages,
                                            optimizer="adam", in_flight=1)
            for s, prog in enumerate(programs):
                got = _memtracker(prog.module, probes[s][0], s == 0)
                pred = float(br["total"][s])
                old = float(br["params"][s] + br["gradients"][s] + br["optimizer"][s]
                            + br["activations"][s])
                ratio = pred / got["Total"]
                ratios.append(ratio)
                parts = ", ".join(f"{k} {v / MIB:.1f}" for k, v in got.items()
                                  if k != "Total" and v >= 0.05 * MIB)
                measured = "" if stages > 1 or rss is None else \
                    f"{rss[0] / MIB:.1f}" + ("" if rss[1] else " (no reset)")
                rows.append(f"| {spec} | {stages} | {s} | {pred / MIB:.1f} | {old / MIB:.1f} | "
                            f"{got['Total'] / MIB:.1f} | {ratio:.3f} | {parts} | "
                            f"{measured or '-'} |")
                print(rows[-1], flush=True)
            del programs, probes
            gc.collect()
    within = sum(abs(r - 1.0) <= 0.10 for r in ratios)
    text = "\n".join([
        "# Memory calibration: predicted peak per stage vs torch's MemTracker and RSS",
        "",
        "Written by `benchmarks/memory_calibration.py` (torch "
        f"{torch.__version__}, CPU, one micro-batch, Adam, steady-state step). "
        "`predicted` is `cost/_memory.py`'s total (parameters, gradients, optimizer state, "
        "and the larger of the activations and the optimizer step's temporaries); `old rule` "
        "adds every term (parameters + gradients + optimizer state + activations), the model "
        "before this calibration. `MemTracker` is the peak over the step with its parts in "
        "MiB (Parameter, Gradient, Activation, Optstate, Temp). `RSS` is the resident-set "
        "high-water mark of the step less the RSS before the model was built (whole models "
        "only, allocator and thread memory included).",
        "",
        "| model | stages | stage | predicted MiB | old rule MiB | MemTracker MiB | "
        "predicted / MemTracker | MemTracker parts at the peak | RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{within} of {len(ratios)} stages within 10% of MemTracker; predicted / MemTracker "
        f"from {min(ratios):.3f} to {max(ratios):.3f}.",
        "",
        "What the model leaves out (read from the MemTracker parts): with one micro-batch "
        "the backward frees activations while it creates gradients, so the peak holds only "
        "part of the gradients (the model counts all of them: an over-estimate); the "
        "gradient of a stage's output (the logits' gradient of a language-model head) lives "
        "beside the saved activations at the start of the backward (not counted: an "
        "under-estimate); and a captured operator's output that its consumers' backward does "
        "not save (a batch-norm output read only by a ReLU) is freed early, though the model "
        "keeps every output (an over-estimate on convolutional stages).",
        "",
    ])
    write_atomic(args.out, text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
