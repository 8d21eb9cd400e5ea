"""Split an exported program into one ``torch.fx.GraphModule`` per pipeline stage.

A plan names, per stage, the ids of graph nodes; an operator-level graph's node names are the
fx node names of ``torch.export``'s training-IR program (see :mod:`shardplan.workload.program`),
so exporting the same model again (at the micro-batch size) and cutting its fx graph by those
names gives the stage programs. Parameters, buffers and constants are fetched with
``get_attr`` under their original fully qualified names: a stage module's ``state_dict`` keys
are a subset of the unsplit model's, and checkpoints load into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.export.graph_signature import OutputKind

from shardplan.errors import ShardplanError

__all__ = ["StageProgram", "example_tensor", "match_graph", "probe", "split_program",
           "tied_groups"]


@dataclass(frozen=True, slots=True)
class StageProgram:
    """One pipeline stage: its module and the example tensors of its inputs and outputs.

    Attributes
    ----------
    index : int
        Position in the pipeline (0 = receives the model's inputs).
    plan_stage : int
        Index of this stage in the plan's ``stages``.
    module : torch.fx.GraphModule
        ``forward(*inputs)`` returns one tensor or a tuple (what the next stage receives; the
        last stage returns the model's output).
    inputs, outputs : tuple of str
        fx names of the values received and sent.
    input_meta, output_meta : tuple of torch.Tensor
        Fake/meta example values (shape and dtype) of the inputs and outputs.
    param_names : tuple of str
        Fully qualified names of the parameters the stage reads.
    """

    index: int
    plan_stage: int
    module: fx.GraphModule
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_meta: tuple[Any, ...]
    output_meta: tuple[Any, ...]
    param_names: tuple[str, ...]


def _assign_buffer(buffer: torch.Tensor, value: torch.Tensor) -> None:
    """A buffer update the exported program returns (BatchNorm running statistics)."""
    with torch.no_grad():
        buffer.copy_(value)



def _set_attr(root: nn.Module, fqn: str, value: Any, *, param: bool, persistent: bool) -> None:
    *path, last = fqn.split(".")
    mod = root
    for part in path:
        if not hasattr(mod, part):
            mod.add_module(part, nn.Module())
        mod = getattr(mod, part)
    if param:
        mod.register_parameter(last, value)
    elif isinstance(value, torch.Tensor):
        mod.register_buffer(last, value, persistent=persistent)
    else:
        setattr(mod, last, value)


def match_graph(graph_nodes: Sequence[tuple[str, str, str]],
                program: Sequence[tuple[str, str, str]], *, model: str = "the model"
                ) -> dict[str, str]:
    """Which operator of ``program`` each graph node is: graph name -> program name.

    The runtime exports the model itself, with a dynamic batch dimension (and maybe another
    torch than the one that captured the graph); shape arithmetic can then add, drop or
    rename a few operators (GPT-2's attention mask), so names are matched by aligning the two
    operator sequences, each operator known by ``(operator, module)``: the longest common
    blocks first (``difflib.SequenceMatcher``, no junk heuristic). Identical sequences map
    names to themselves. Graph nodes without a partner are dropped (their program operators,
    if any, follow their inputs' stage); O(n^2) worst case, O(n) for near-identical programs.

    Raises
    ------
    ShardplanError
        Fewer than 90% of the graph's operators were found: the graph is not this model's.
    """
    import difflib

    a = [(op, mod) for _, op, mod in graph_nodes]
    b = [(op, mod) for _, op, mod in program]
    if a == b and all(g[0] == p[0] for g, p in zip(graph_nodes, program, strict=True)):
        return {g[0]: g[0] for g in graph_nodes}
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    out: dict[str, str] = {}
    for i, j, size in sm.get_matching_blocks():
        for k in range(size):
            out[graph_nodes[i + k][0]] = program[j + k][0]
    if len(out) < 0.9 * len(graph_nodes):
        raise ShardplanError(f"the graph does not match {model}: only {len(out)} of its "
                             f"{len(graph_nodes)} operators are in the model's exported program "
                             f"(was the graph captured from this model, at op granularity, in "
                             f"train mode?)")
    return out


def _batch_sizes(input_nodes: Sequence[fx.Node], batch: int | None) -> dict[Any, int]:
    """The symbols of the inputs' batch dimensions, each bound to ``batch``."""
    if batch is None:
        return {}
    out = {}
    for node in input_nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dim() and isinstance(val.shape[0], torch.SymInt):
            out[val.shape[0].node.expr] = int(batch)
    return out


def _concrete(node: fx.Node, sizes: dict[Any, int]) -> Any:
    """The value of a size node at the bound batch size."""
    val = node.meta.get("val")
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = val.node.expr
        expr = expr.xreplace(sizes) if hasattr(expr, "xreplace") else expr
        if getattr(expr, "free_symbols", None):
            raise ShardplanError(f"value {node.name!r} crossing a stage boundary depends on "
                                 f"sizes other than the batch ({expr}); cut the graph elsewhere")
        kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(val)]
        return kind(expr)
    if isinstance(val, (int, float, bool)):
        return val
    raise ShardplanError(f"value {node.name!r} crossing a stage boundary is not a tensor "
                         f"({type(val).__name__}); cut the graph elsewhere")


def _node_inputs(node: fx.Node) -> list[fx.Node]:
    found: dict[fx.Node, None] = {}
    fx.node.map_arg((node.args, node.kwargs), lambda a: found.setdefault(a, None))
    return list(found)


def split_program(
    model: nn.Module,
    ep: torch.export.ExportedProgram,
    stage_nodes: Sequence[Sequence[str]],
    order: Sequence[int],
    *,
    batch: int | None = None,
) -> list[StageProgram]:
    """Cut ``ep`` into pipeline stages.

    Parameters
    ----------
    model : torch.nn.Module
        The exported model; its parameter and buffer objects are shared by the stage modules.
    ep : ExportedProgram
        ``torch.export.export(model, inputs)`` in training mode, at the micro-batch size.
    stage_nodes : sequence of sequence of str
        Per plan stage, the fx names of its operators in ``ep`` (:func:`match_graph`).
        Operators the graph leaves out (``getitem``, bookkeeping calls, unread buffer
        updates, shape arithmetic) go with the operator they read from.
    order : sequence of int
        The plan stages in pipeline order (:class:`shardplan.simulate.PipelineView`'s: one
        derivation of stage order for the simulator and the runtime).
    batch : int, optional
        For a program exported with a dynamic batch dimension: the batch size the stages
        will run at. Sizes computed from the batch (``sym_size``, products of sizes) are sent
        by no stage: a stage that reads one computed by an earlier stage gets its value at
        ``batch`` as a constant (pipeline stages exchange tensors only).

    Returns
    -------
    list of StageProgram
        In pipeline order. Stage ``k`` receives every
        value made before it that stage ``k`` or a later one reads (values skipping stages
        are passed through the stages between: torch's pipeline stages talk to neighbours
        only) and sends what stage ``k + 1`` receives; the last stage returns the model's
        output.

    Raises
    ------
    ShardplanError
        A name the program does not have (the graph was captured from another model), a model
        with more than one output tensor, data flowing against ``order``.

    Notes
    -----
    O(n + m) over the program's nodes and uses, plus the live-value sets: O(S x v) for S
    stages and v values crossing a stage boundary.
    """
    gm = ep.graph_module
    g = gm.graph
    sig = ep.graph_signature
    params = dict(sig.inputs_to_parameters)
    buffers = dict(sig.inputs_to_buffers)
    constants = dict(sig.inputs_to_lifted_tensor_constants)
    constants.update(getattr(sig, "inputs_to_lifted_custom_objs", {}) or {})
    user_inputs = list(sig.user_inputs)

    by_name = {n.name: n for n in g.nodes}
    stage_of: dict[fx.Node, int] = {}
    for s, names in enumerate(stage_nodes):
        for nm in names:
            node = by_name.get(nm)
            if node is None or node.op != "call_function":
                raise ShardplanError(f"graph node {nm!r} is not an operator of the model's "
                                     f"exported program: was the graph captured from this "
                                     f"model (same spec, op granularity, train mode)?")
            stage_of[node] = s
    num_plan_stages = len(stage_nodes)
    # Operators outside the graph follow their inputs (getitem: its tuple's producer).
    for node in g.nodes:
        if node.op != "call_function" or node in stage_of:
            continue
        ins = [stage_of[a] for a in _node_inputs(node) if a in stage_of]
        if ins:
            stage_of[node] = max(ins)
    for node in reversed(g.nodes):  # operators on parameters/constants only: first reader
        if node.op == "call_function" and node not in stage_of:
            users = [stage_of[u] for u in node.users if u in stage_of]
            stage_of[node] = min(users) if users else 0

    if sorted(order) != list(range(num_plan_stages)):
        raise ShardplanError(f"the pipeline order {list(order)} is not one of the "
                             f"{num_plan_stages} plan stages each")
    pos = {s: k for k, s in enumerate(order)}
    for node, s in stage_of.items():
        for a in _node_inputs(node):
            if a in stage_of and pos[stage_of[a]] > pos[s] \
                    and isinstance(a.meta.get("val"), torch.Tensor):
                raise ShardplanError(
                    f"the model's program sends {a.name!r} from plan stage {stage_of[a]} back "
                    f"to plan stage {s}, which the graph runs first: the graph does not match "
                    f"the model's exported program")
    stage_at = {node: pos[s] for node, s in stage_of.items()}
    num = num_plan_stages
    input_nodes = [by_name[nm] for nm in user_inputs]
    for node in input_nodes:
        stage_at[node] = -1

    out_node = next(iter(g.find_nodes(op="output")))
    out_args = out_node.args[0]
    user_out: list[fx.Node] = []
    mutations: list[tuple[fx.Node, str]] = []
    for spec, arg in zip(sig.output_specs, out_args, strict=True):
        if spec.kind == OutputKind.USER_OUTPUT:
            user_out.append(arg)
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            mutations.append((arg, spec.target))
        else:
            raise ShardplanError(f"the exported program has an output of kind "
                                 f"{spec.kind.name}, which the runtime does not handle")
    if len(user_out) != 1 or not isinstance(user_out[0], fx.Node):
        raise ShardplanError(f"the runtime trains models with one output tensor; this one "
                             f"returns {len(user_out)}")
    model_out = user_out[0]

    # Last stage reading each value (the model output is read by the last stage).
    last_use: dict[fx.Node, int] = {}
    for node in g.nodes:
        if node.op != "call_function":
            continue
        for a in _node_inputs(node):
            if a in stage_at:
                last_use[a] = max(last_use.get(a, -1), stage_at[node])
    last_use[model_out] = num - 1
    order_index = {n: i for i, n in enumerate(g.nodes)}
    sizes = _batch_sizes(input_nodes, batch)
    live_in: list[list[fx.Node]] = []
    for k in range(num):
        vals = [v for v, last in last_use.items() if stage_at[v] < k <= last
                and (v in input_nodes or isinstance(v.meta.get("val"), torch.Tensor))]
        if k == 0:
            vals = list(dict.fromkeys([*input_nodes, *vals]))
        live_in.append(sorted(vals, key=order_index.__getitem__))

    root_attrs: dict[str, tuple[Any, bool, bool]] = {}
    for ph in g.find_nodes(op="placeholder"):
        if ph.name in params:
            fqn = params[ph.name]
            root_attrs[ph.name] = (model.get_parameter(fqn), True, True)
        elif ph.name in buffers:
            fqn = buffers[ph.name]
            persistent = fqn not in sig.non_persistent_buffers
            root_attrs[ph.name] = (model.get_buffer(fqn), False, persistent)
        elif ph.name in constants:
            root_attrs[ph.name] = (ep.constants[constants[ph.name]], False, False)

    def attr_name(ph: fx.Node) -> str:
        if ph.name in params:
            return params[ph.name]
        if ph.name in buffers:
            return buffers[ph.name]
        return "_shardplan_const." + constants[ph.name].replace(".", "_")

    stages: list[StageProgram] = []
    for k in range(num):
        sg = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        root = nn.Module()
        used_params: list[str] = []
        for v in live_in[k]:
            p = sg.placeholder(v.name)
            p.meta["val"] = v.meta.get("val")
            env[v] = p

        def lookup(a: fx.Node, _env: dict[fx.Node, fx.Node] = env, _sg: fx.Graph = sg,
                   _root: nn.Module = root, _used: list[str] = used_params,
                   _k: int = k) -> Any:
            if a in _env:
                return _env[a]
            if a.op == "call_function" and not isinstance(a.meta.get("val"), torch.Tensor) \
                    and stage_at.get(a, _k) < _k:  # a size an earlier stage computed
                return _concrete(a, sizes)
            if a.op == "placeholder" and a.name in root_attrs:
                value, is_param, persistent = root_attrs[a.name]
                name = attr_name(a)
                _set_attr(_root, name, value, param=is_param, persistent=persistent)
                if is_param:
                    _used.append(name)
                node = _sg.get_attr(name)
                node.meta["val"] = a.meta.get("val")
                _env[a] = node
                return node
            if a.op == "get_attr":  # higher-order operators' subgraphs
                _set_attr(_root, str(a.target), getattr(gm, str(a.target)), param=False,
                          persistent=False)
                node = _sg.get_attr(str(a.target))
                _env[a] = node
                return node
            raise AssertionError(f"stage {_k}: value {a.name} is neither received nor local")

        for node in g.nodes:
            if node.op == "call_function" and stage_at.get(node) == k:
                for a in _node_inputs(node):
                    lookup(a)
                env[node] = sg.node_copy(node, lambda a, _f=lookup: _f(a))
        for value, target in mutations:
            if stage_at.get(value) == k:
                buf_ph = next(ph for ph in g.find_nodes(op="placeholder")
                              if buffers.get(ph.name) == target)
                sg.call_function(_assign_buffer, (lookup(buf_ph), lookup(value)))
        outs = [model_out] if k == num - 1 else live_in[k + 1]
        result = [lookup(v) for v in outs]
        if k < num - 1:  # sends need contiguous tensors (a transpose may cross a boundary)
            result = [sg.call_method("contiguous", (r,)) for r in result]
        sg.output(result[0] if len(result) == 1 else tuple(result))
        sg.lint()
        module = fx.GraphModule(root, sg, class_name=f"Stage{k}")
        stages.append(StageProgram(
            index=k, plan_stage=int(order[k]), module=module,
            inputs=tuple(v.name for v in live_in[k]), outputs=tuple(v.name for v in outs),
            input_meta=tuple(v.meta.get("val") for v in live_in[k]),
            output_meta=tuple(v.meta.get("val") for v in outs),
            param_names=tuple(dict.fromkeys(used_params)),
        ))
    return stages


def probe(stages: Sequence[StageProgram], inputs: Sequence[Any], model: nn.Module
          ) -> list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]:
    """Per stage, example values of what it receives and what it returns, at the batch size
    of ``inputs``, with ``requires_grad`` as in training (the exported program's symbolic
    shapes and missing ``requires_grad`` say neither).

    The stages run once, in order, on ``inputs``; the model's buffers (BatchNorm running
    statistics the stages update) and the random state are restored afterwards, so the probe
    leaves no trace in training. O(one forward).
    """
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    out = []
    values = tuple(inputs)
    with torch.random.fork_rng(devices=[]):
        for st in stages:
            res = st.module(*values)
            outs = res if isinstance(res, tuple) else (res,)
            out.append((values, tuple(outs)))
            values = tuple(outs)
    with torch.no_grad():
        for b, v in saved:
            b.copy_(v)
    return out


def example_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """A zero tensor with the shape, dtype and ``requires_grad`` of ``value``: what a
    pipeline stage needs to know to send and receive it."""
    if not isinstance(value, torch.Tensor):
        raise ShardplanError(f"a value crossing a stage boundary is not a tensor "
                             f"({type(value).__name__}); cut the graph elsewhere")
    t = torch.zeros(tuple(value.shape), dtype=value.dtype, device=device)
    return t.requires_grad_(bool(value.requires_grad and value.is_floating_point()))


def tied_groups(stages: Sequence[StageProgram], model: nn.Module) -> list[tuple[str, ...]]:
    """Names of each parameter object held under several names by different stages.

    GPT-2's token embedding and LM head are one ``Parameter``; after the split each stage
    holding it keeps its own copy, and their gradients must be summed.
    """
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    holders: dict[str, set[int]] = {}
    for st in stages:
        for name in st.param_names:
            holders.setdefault(name, set()).add(st.index)
    groups = []
    for names in names_of.values():
        held = [n for n in names if n in holders]
        stages_holding = set().union(*(holders[n] for n in held)) if held else set()
        if len(stages_holding) > 1:
            groups.append(tuple(held))
    return groups

