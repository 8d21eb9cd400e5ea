"""``shardplan capture MODEL``: trace a PyTorch model into a ``shardplan.graph/1`` file.

Torch is imported only when the command runs, so the other commands start fast.
"""

from __future__ import annotations

import argparse
import sys
import time

from shardplan._argtypes import size_int
from shardplan.cli._common import (
    add_output,
    declare_files,
    emit,
    positive_int,
    progress_reporter,
    split_names,
)
from shardplan.errors import ShardplanError

__all__ = ["register"]

_MODEL_HELP = ("mlp | transformer[,key=value...] | gnn[,key=value...] | torchvision:NAME | "
               "transformers:NAME[,key=value...] | gpt:hidden=H,layers=L,heads=A,vocab=V[,seq=S,"
               "ffn=F] | llama3:8B|70B|405B|debug[,key=value...] | "
               "llama2:7B|13B|70B|debug[,key=value...] | FILE.py:FUNCTION")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capture", help="trace a PyTorch model into a graph (paper 000, section 3.2)",
        description="Trace a model with torch.export into a computation graph: one node per "
                    "aten operator (forward/backward FLOPs, parameter and output bytes, "
                    "module path), or one per instance of the --atomic module types.",
        epilog="transformers NAMEs: bert-tiny, bert-mini, bert-small, bert-medium, bert-base, "
               "bert-large, gpt2, gpt2-medium, gpt2-large, gpt2-xl (published configs, no "
               "download). llama options: seq and torchtitan's model arguments (dim, n_layers, "
               "n_heads, n_kv_heads, vocab_size, multiple_of, ffn_dim_multiplier, ...). "
               "FILE.py:FUNCTION: FUNCTION() returns (model, example_inputs).")
    p.add_argument("model", metavar="MODEL", nargs="?", help=_MODEL_HELP)
    p.add_argument("--batch-size", type=size_int("batch"), default=8, metavar="N",
                   help="batch size of the example inputs (default 8)")
    p.add_argument("--seq-len", type=size_int("sequence"), default=None, metavar="L",
                   help="tokens per sequence for language models (default: the spec's "
                        "seq=, else 128; both given must agree)")
    p.add_argument("--image-size", type=positive_int, default=None, metavar="S",
                   help="image height and width (default 224; inception_v3 299)")
    p.add_argument("--granularity", choices=("op", "module"), default="op",
                   help="one node per operator (default) or per atomic module instance")
    p.add_argument("--atomic", type=split_names, default=None, metavar="TYPE,...",
                   help="module class names that are units of sharding (module granularity)")
    p.add_argument("--profile", action="store_true",
                   help="also measure forward/backward seconds per node on this machine")
    p.add_argument("--mode", choices=("train", "eval"), default="train",
                   help="trace the model in training (default) or evaluation mode")
    p.add_argument("--meta", action="store_true", default=None,
                   help="build the model on the meta device (no memory: FLOPs, bytes and "
                        "parameters without storage); without it, GPT and Llama models whose "
                        "parameters would not fit in memory are built on meta anyway")
    p.add_argument("--name", default=None, help="graph name (default: from MODEL)")
    p.add_argument("--list-models", action="store_true",
                   help="print the zoo's model names and exit")
    add_output(p)
    declare_files(p, inputs=("model",), outputs=("output",))
    p.set_defaults(handler=_run)


def _si(x: float) -> str:
    """``1.23e9`` -> ``"1.23 G"``."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} "


def _run(args: argparse.Namespace) -> int:

    if args.list_models:
        from shardplan.capture import list_models

        sys.stdout.write("\n".join(list_models()) + "\n")
        return 0
    if not args.model:
        raise ShardplanError(f"capture needs a MODEL ({_MODEL_HELP})")
    if not args.output and not args.json:
        raise ShardplanError("say where the graph goes: -o FILE or --json")
    from shardplan.capture import capture_spec
    from shardplan.workload.zoo import spec_seq

    seq = spec_seq(args.model)
    if seq is not None and args.seq_len is not None and seq != args.seq_len:
        raise ShardplanError(f"the model spec's seq={seq} and --seq-len {args.seq_len} "
                             f"disagree: give the sequence length once")
    args.seq_len = args.seq_len or seq or 128
    t0 = time.perf_counter()
    with progress_reporter({"flops": "counting FLOPs", "profile": "profiling"}) \
            as progress:
        graph = capture_spec(args.model, batch_size=args.batch_size, seq_len=args.seq_len,
                             image_size=args.image_size, name=args.name,
                             granularity=args.granularity, atomic=args.atomic,
                             profile=args.profile, mode=args.mode, progress=progress,
                             meta=args.meta)
    seconds = time.perf_counter() - t0
    emit(args, graph, what="graph")
    if not args.json:
        print(f"{graph.name}: {graph.num_nodes} nodes, {graph.num_edges} edges, "
              f"{_si(float(graph.fwd_flops.sum()))}FLOP forward, "
              f"{_si(float(graph.param_bytes.sum()))}B of parameters "
              f"(batch {graph.batch_size}, captured in {seconds:.1f} s)")
    return 0
