"""What a pipeline plan's export gives the user to paste or run (issue 38), as text: torch's
``split_spec`` code, torchtitan's TOML (0.2), recipe and flags, and the one-line refusals
naming the format. ``test_formats.py`` and ``test_tools.py`` check the fields and that the
tools accept them; these pin the text."""

from __future__ import annotations

import json
import shlex
import tomllib

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.export import ExportOptions, export
from shardplan.importers.torchtitan import torchtitan_options
from shardplan.ir import Graph, Plan
from shardplan.simulate import Schedule
from shardplan.topology import build
from tests.helpers import hand_plan

_MODULES = (["tok_emb", "pos_emb", ""]
            + [f"blocks.{i}.{m}" for i in range(4) for m in ("ln1", "attn", "attn.proj", "mlp")]
            + ["ln_f", "head"])
_OPS = ["embedding", "embedding", "add"] + ["layer_norm", "scaled_dot_product_attention",
                                             "linear", "linear"] * 4 + ["layer_norm", "linear"]
_N = len(_MODULES)
_TOKENS = {"input_shapes": [[4, 16]], "input_dtypes": ["int64"]}


def _graph(meta: dict | None = None, modules: list[str] | None = None) -> Graph:
    mods = modules or _MODULES
    n = len(mods)
    return Graph.from_arrays(name="gpt", fwd_flops=np.full(n, 1e9), src=np.arange(n - 1),
                             dst=np.arange(1, n), output_bytes=np.full(n, 4096),
                             param_bytes=np.full(n, 1024), names=[f"n{i}" for i in range(n)],
                             ops=_OPS[:n] if modules is None else ["linear"] * n,
                             modules=mods, batch_size=4,
                             meta=_TOKENS if meta is None else meta)


def _plan(cuts: list[int], replicas: int = 1, n: int = _N, **execution: object) -> Plan:
    return hand_plan(cuts, n, replicas, **execution)


_CUT = 3 + 4 * 2  # blocks.2 starts
_CSV = "0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"


# ------------------------------------------------------------------------------------ torch
def test_torch_export_as_json_and_code() -> None:
    exp = export(_plan([_CUT], replicas=2, microbatches=4), _graph(),
                 build("flat", num_devices=4), "torch")
    assert exp.format == "torch" and exp.notes == ()
    assert json.loads(exp.text) == {
        "format": "shardplan.export/1", "to": "torch", "graph": "gpt",
        "split_spec": {"blocks.2": "BEGINNING"}, "num_stages": 2, "num_ranks": 2,
        "stage_rank": [0, 1], "data_parallel": 2, "schedule": "1F1B", "schedule_csv": _CSV,
        "microbatches": 4, "microbatch_size": 4,
        "stage_modules": [["tok_emb", "pos_emb", "blocks.0", "blocks.1"],
                          ["blocks.2", "blocks.3", "ln_f", "head"]],
        "moved": [],
        "python": "from torch.distributed.pipelining import SplitPoint, pipeline\n"
                  "split_spec = {'blocks.2': SplitPoint.BEGINNING}\n"
                  "pipe = pipeline(model, mb_args=(microbatch,), split_spec=split_spec)\n"}


def test_torch_code_runs_with_every_split_point() -> None:
    exp = export(_plan([3 + 4, 3 + 4 * 3]), _graph(), build("flat", num_devices=3), "torch")
    code = json.loads(exp.text)["python"]
    assert "split_spec = {'blocks.1': SplitPoint.BEGINNING, 'blocks.3': SplitPoint.BEGINNING}" \
        in code
    seen = {}

    class _SplitPoint:
        BEGINNING = "begin"

    def pipeline(model, mb_args, split_spec):
        seen.update(model=model, mb_args=mb_args, split_spec=split_spec)
        return "pipe"

    import sys
    import types

    fake = types.ModuleType("torch.distributed.pipelining")
    fake.SplitPoint, fake.pipeline = _SplitPoint, pipeline  # type: ignore[attr-defined]
    names = {"model": "M", "microbatch": "x"}
    saved = {k: sys.modules.get(k) for k in ("torch.distributed.pipelining",)}
    sys.modules["torch.distributed.pipelining"] = fake
    try:
        exec(code, names)  # noqa: S102 - the export's own code, run against a stand-in
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    assert names["pipe"] == "pipe"
    assert seen == {"model": "M", "mb_args": ("x",),
                    "split_spec": {"blocks.1": "begin", "blocks.3": "begin"}}


def test_torch_takes_the_settings_and_schedule_given() -> None:
    plan, g, t = _plan([_CUT], microbatches=4), _graph(), build("flat", num_devices=2)
    other = plan.settings.override(microbatches=2, schedule="gpipe")[0]
    out = json.loads(export(plan, g, t, "torch", settings=other).text)
    assert (out["microbatches"], out["schedule"]) == (2, "GPipe")
    # a schedule of the user's own (a CSV): torch runs it as the class of its shape
    custom = Schedule.from_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    out = json.loads(export(plan, g, t, "torch", schedule=custom).text)
    assert (out["schedule"], out["microbatches"]) == ("1F1B", 2)
    four = _plan([3 + 2, _CUT, 3 + 4 * 3], microbatches=4)
    looped = Schedule.from_text("0F0,0F1,2F0,2F1,2B0,2B1,0B0,0B1\n"
                                "1F0,1F1,3F0,3F1,3B0,3B1,1B0,1B1\n")
    out = json.loads(export(four, g, build("flat", num_devices=4), "torch",
                            schedule=looped).text)
    assert (out["schedule"], out["num_stages"], out["num_ranks"]) == ("Interleaved1F1B", 4, 2)


# ------------------------------------------------------------------------------- torchtitan
def test_torchtitan_02_toml_text() -> None:
    exp = export(_plan([_CUT], replicas=2, microbatches=4), _graph(),
                 build("flat", num_devices=4), "torchtitan",
                 options=ExportOptions(torchtitan_version="0.2", schedule_csv="x.csv"))
    assert exp.format == "torchtitan" and exp.beside == {".schedule.csv": _CSV}
    assert exp.text == (
        "# shardplan export of plan 'gpt' on 'flat': 2 stages on 2 ranks x 2 replicas, 1f1b\n"
        "[parallelism]\n"
        "pipeline_parallel_degree = 2\n"
        "data_parallel_replicate_degree = 2\n"
        "data_parallel_shard_degree = 1\n"
        "tensor_parallel_degree = 1\n"
        'pipeline_parallel_schedule = "1F1B"\n'
        'pipeline_parallel_schedule_csv = "x.csv"\n'
        "pipeline_parallel_microbatch_size = 2\n"
        "module_fqns_per_model_part = [\n"
        '    ["tok_emb", "pos_emb", "blocks.0", "blocks.1"],\n'
        '    ["blocks.2", "blocks.3", "ln_f", "head"],\n'
        "]\n"
        "\n"
        "[training]\n"
        "local_batch_size = 8\n")


def test_torchtitan_recipe_and_flags_text() -> None:
    exp = export(_plan([_CUT], replicas=2, microbatches=4), _graph(),
                 build("flat", num_devices=4), "torchtitan",
                 options=ExportOptions(output_name="tt_plan.py", torchtitan_base="my:fn",
                                       schedule_csv="C:\\runs\\my tt.csv"))
    text = exp.text
    assert exp.format == "torchtitan"
    assert text.startswith('"""shardplan export of plan \'gpt\' on \'flat\': 2 stages on 2 '
                           'ranks x 2 replicas, 1f1b.\n')
    assert "torchrun ... -m torchtitan.train --module tt_plan --config shardplan_plan\n" in text
    assert "``tt_plan.py.flags`` beside it holds the same settings" in text
    assert 'BASE = "my:fn"\n' in text
    # the CSV beside the recipe, by its name alone (a Windows path's too)
    assert 'SCHEDULE_CSV = str(Path(__file__).resolve().with_name("my tt.csv"))\n' in text
    # torchtitan 0.3.0's options: micro-batches as the local batch over the micro-batch size
    for line in ("par.pipeline_parallel_degree = 2", "par.pipeline_parallel_schedule = \"1F1B\"",
                 "par.module_fqns_per_model_part = MODULE_FQNS_PER_MODEL_PART",
                 "par.pipeline_parallel_microbatch_size = 2",
                 "par.data_parallel_replicate_degree = 2",
                 "config.training.local_batch_size = 8",
                 "config.training.global_batch_size = 16"):
        assert f"    {line}\n" in text, line
    assert "config.training.disable_cuda_graphs = True  #" in text
    flags = exp.beside[".flags"]
    assert flags.endswith("\n") and flags.count("\n") == 1
    # the flags read back (as torchtitan's importer and a shell read them) to the same path
    got = shlex.split(flags)
    assert got[:6] == ["--module", "my", "--config", "fn",
                       "--parallelism.pipeline_parallel_degree", "2"]
    assert got[6] == "--parallelism.module_fqns_per_model_part"  # one argument a stage
    assert got[9:] == [
        "--parallelism.pipeline_parallel_schedule", "1F1B",
        "--parallelism.pipeline_parallel_schedule_csv", "C:\\runs\\my tt.csv",
        "--parallelism.pipeline_parallel_microbatch_size", "2",
        "--parallelism.data_parallel_replicate_degree", "2",
        "--parallelism.data_parallel_shard_degree", "1",
        "--parallelism.tensor_parallel_degree", "1",
        "--parallelism.context_parallel_degree", "1",
        "--training.local_batch_size", "8", "--training.global_batch_size", "16",
        "--training.disable_cuda_graphs"]
    par = torchtitan_options(flags)["parallelism"]
    assert par["pipeline_parallel_schedule_csv"] == "C:\\runs\\my tt.csv"
    assert exp.beside[".schedule.csv"] == _CSV


@pytest.mark.parametrize("output, module", [("plan", "plan"), ("dir.py/x.py", "dir.py/x"),
                                            ("py.py", "py")])
def test_torchtitan_recipe_module_is_the_file_name_without_py(output: str,
                                                               module: str) -> None:
    exp = export(_plan([_CUT], microbatches=4), _graph(), build("flat", num_devices=2),
                 "torchtitan", options=ExportOptions(output_name=output))
    assert f"--module {module} --config shardplan_plan\n" in exp.text
    assert f"``{output}.flags`` beside it" in exp.text


def test_torchtitan_refusals_name_torchtitan() -> None:
    t2 = build("flat", num_devices=2)
    with pytest.raises(ShardplanError, match=r"^torchtitan gives every data-parallel rank "
                                             r"whole samples, and the micro-batch of 3 does "
                                             r"not split over 2 replicas$"):
        export(_plan([_CUT], replicas=2, microbatches=4, microbatch_size=3), _graph(),
               build("flat", num_devices=4), "torchtitan")
    # a layer whose modules come back after another layer's: split between the stages
    mods = ["tok_emb", "blocks.0.attn", "blocks.1.attn", "blocks.0.mlp", "head"]
    with pytest.raises(ShardplanError, match=r"^torchtitan places whole layers on stages, and "
                                             r"the plan splits layer 'blocks.0' between two "
                                             r"stages$"):
        export(_plan([2], n=5, microbatches=2), _graph(modules=mods), t2, "torchtitan")


def test_torchtitan_needs_no_token_ids() -> None:
    """torchtitan 0.3.0 counts a batch in samples (local_batch_size), as 0.2 did."""
    exp = export(_plan([_CUT], microbatches=4), _graph(meta={}), build("flat", num_devices=2),
                 "torchtitan")
    assert "config.training.local_batch_size = 16\n" in exp.text


def test_torchtitan_02_tokens_are_not_needed() -> None:
    exp = export(_plan([_CUT], microbatches=4), _graph(meta={}), build("flat", num_devices=2),
                 "torchtitan", options=ExportOptions(torchtitan_version="0.2"))
    assert tomllib.loads(exp.text)["training"] == {"local_batch_size": 16}


# -------------------------------------------------------------------- Megatron-LM, DeepSpeed
def _indented(exp) -> dict:
    """The JSON of an export, which is written indented (a file people read)."""
    data = json.loads(exp.text)
    assert exp.text == json.dumps(data, indent=2) + "\n"
    return data


def test_megatron_layout_export() -> None:
    exp = export(_plan([_CUT], replicas=2, microbatches=4), _graph(),
                 build("flat", num_devices=4), "megatron")
    assert exp.format == "megatron" and exp.notes == ()
    assert _indented(exp) == {
        "format": "shardplan.export/1", "to": "megatron", "graph": "gpt",
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2,
        "data_parallel_size": 2, "virtual_stages_per_rank": 1,
        "pipeline_model_parallel_layout": "Ett|ttL", "num_layers": 4,
        "micro_batch_size": 2, "global_batch_size": 16,
        "layers": {"tok_emb": "E", "pos_emb": "E", "blocks.0": "t", "blocks.1": "t",
                   "blocks.2": "t", "blocks.3": "t", "ln_f": "L", "head": "L"},
        "moved": [],
        "args": ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
                 "--pipeline-model-parallel-layout", "Ett|ttL", "--num-layers", "4",
                 "--micro-batch-size", "2", "--global-batch-size", "16"]}


def test_megatron_layout_of_the_settings_and_schedule_given() -> None:
    plan, g, t = _plan([_CUT], microbatches=4), _graph(), build("flat", num_devices=2)
    other = plan.settings.override(microbatches=2, microbatch_size=2)[0]
    out = json.loads(export(plan, g, t, "megatron", settings=other).text)
    assert out["args"][-4:] == ["--micro-batch-size", "2", "--global-batch-size", "4"]
    gp = Schedule.from_text("0F0,0F1,0F2,0B0,0B1,0B2\n1F0,1F1,1F2,1B0,1B1,1B2\n")
    with pytest.raises(ShardplanError, match=r"^megatron runs 1F1B \(interleaved with a layout "
                                             r"of more stages than ranks\), not custom$"):
        export(plan, g, t, "megatron", schedule=gp)
    out = json.loads(export(plan, g, t, "deepspeed", settings=other).text)
    assert out["ds_config"]["gradient_accumulation_steps"] == 2
    assert out["ds_config"]["train_batch_size"] == 4
    three = Schedule.from_text("0F0,0F1,0F2,0B0,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n")
    out = json.loads(export(plan, g, t, "deepspeed", schedule=three).text)
    assert out["ds_config"]["gradient_accumulation_steps"] == 3


@pytest.mark.parametrize("attention", ["bmm", "matmul", "baddbmm", "my_attention_op"])
def test_megatron_recognises_attention_by_its_operators(attention: str) -> None:
    mods = ["tok_emb", "layers.0.attn", "layers.0.mlp", "layers.1.attn", "layers.1.mlp",
            "head"]
    g = Graph.from_arrays(name="gpt", fwd_flops=np.full(6, 1e9), src=np.arange(5),
                          dst=np.arange(1, 6), output_bytes=np.full(6, 4096),
                          param_bytes=np.full(6, 1024), names=[f"n{i}" for i in range(6)],
                          ops=["embedding", attention, "linear", attention, "linear", "linear"],
                          modules=mods, batch_size=4)
    out = json.loads(export(_plan([3], n=6, microbatches=2), g, build("flat", num_devices=2),
                            "megatron").text)
    assert out["pipeline_model_parallel_layout"] == "Et|tL"


def _ops_graph(mods: list[str], ops: list[str]) -> Graph:
    n = len(mods)
    return Graph.from_arrays(name="gpt", fwd_flops=np.full(n, 1e9), src=np.arange(n - 1),
                             dst=np.arange(1, n), output_bytes=np.full(n, 4096),
                             param_bytes=np.full(n, 1024), names=[f"n{i}" for i in range(n)],
                             ops=ops, modules=mods, batch_size=4)


@pytest.mark.parametrize("mods, ops, cut, match", [
    (["emb", "attn", "mlp", "head"], ["embedding", "bmm", "linear", "linear"], 2,
     r"^megatron's layout counts transformer layers, and the graph has no repeated block "
     r"list \(module paths like layers\.0\)$"),
    (["emb", "layers.0.mlp", "layers.1.attn", "head"],
     ["embedding", "linear", "bmm", "linear"], 2,
     r"^megatron's layout counts transformer layers, and 'layers\.0' has no attention$"),
    (["emb", "layers.0.attn", "mid", "layers.1.attn", "head"],
     ["embedding", "bmm", "linear", "bmm", "linear"], 3,
     r"^megatron's layout has the transformer layers together, and the graph has other "
     r"modules between its blocks$"),
    (["emb", "layers.0.attn", "layers.1.attn", "head", "layers.1.out"],
     ["embedding", "bmm", "bmm", "linear", "linear"], 3,
     r"^megatron places whole layers on stages, and the plan splits layer 'layers\.1' "
     r"between two stages$"),
])
def test_megatron_refusals(mods, ops, cut, match) -> None:
    with pytest.raises(ShardplanError, match=match):
        export(_plan([cut], n=len(mods), microbatches=2), _ops_graph(mods, ops),
               build("flat", num_devices=2), "megatron")


def test_megatron_keeps_the_embedding_first_and_the_output_last() -> None:
    g, t = _graph(), build("flat", num_devices=2)
    with pytest.raises(ShardplanError, match=r"^megatron keeps the output layer on the last "
                                             r"pipeline stage$"):
        export(_plan([_N - 1], microbatches=2), g, t, "megatron")  # ln_f | head
    with pytest.raises(ShardplanError, match=r"^megatron keeps the embedding on the first "
                                             r"pipeline stage$"):
        export(_plan([1], microbatches=2), g, t, "megatron")


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed"])
def test_whole_samples_per_replica(fmt: str) -> None:
    with pytest.raises(ShardplanError, match=rf"^{fmt} gives every data-parallel rank whole "
                                             r"samples, and the micro-batch of 3 does not "
                                             r"split over 2 replicas$"):
        export(_plan([_CUT], replicas=2, microbatches=4, microbatch_size=3), _graph(),
               build("flat", num_devices=4), fmt)


def test_deepspeed_export() -> None:
    exp = export(_plan([_CUT], replicas=2, microbatches=4), _graph(),
                 build("flat", num_devices=4), "deepspeed")
    assert exp.format == "deepspeed" and exp.notes == ()
    assert _indented(exp) == {
        "format": "shardplan.export/1", "to": "deepspeed", "graph": "gpt", "num_stages": 2,
        "layers": ["tok_emb", "pos_emb", "blocks.0", "blocks.1", "blocks.2", "blocks.3",
                   "ln_f", "head"],
        "parts": [0, 4, 8], "partition_method": "uniform", "moved": [],
        "ds_config": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                      "gradient_accumulation_steps": 4}}


def test_deepspeed_refusals() -> None:
    g, t = _graph(), build("flat", num_devices=2)
    four = _plan([3 + 2, _CUT, 3 + 4 * 3], microbatches=4)
    looped = Schedule.from_text("0F0,0F1,2F0,2F1,2B0,2B1,0B0,0B1\n"
                                "1F0,1F1,3F0,3F1,3B0,3B1,1B0,1B1\n")
    with pytest.raises(ShardplanError, match=r"^deepspeed's PipelineModule runs one stage per "
                                             r"rank, and the plan's schedule runs 4 stages on "
                                             r"2 ranks$"):
        export(four, g, build("flat", num_devices=4), "deepspeed", schedule=looped)
    mods = ["emb", "layers.0.attn", "layers.1.attn", "head", "layers.1.out"]
    with pytest.raises(ShardplanError, match=r"^deepspeed places whole layers on stages, and "
                                             r"the plan splits layer 'layers\.1'"):
        export(_plan([3], n=5, microbatches=2),
               _ops_graph(mods, ["embedding", "bmm", "bmm", "linear", "linear"]), t,
               "deepspeed")


def test_torch_export_json_is_indented() -> None:
    _indented(export(_plan([_CUT], microbatches=4), _graph(), build("flat", num_devices=2),
                     "torch"))


def test_unknown_formats_and_plans_off_the_cluster_are_refused() -> None:
    g, t = _graph(), build("flat", num_devices=2)
    with pytest.raises(ShardplanError, match=r"^unknown export format 'onnx' \(choose from "
                                             r"torch, torchtitan, megatron, deepspeed, "
                                             r"chrome-trace\)$"):
        export(_plan([_CUT], microbatches=4), g, t, "onnx")
    off = _plan([_CUT], replicas=2, microbatches=4)  # devices 0-3 on a 2-device cluster
    for fmt in ("torch", "chrome-trace"):
        with pytest.raises(ShardplanError):
            export(off, g, t, fmt)


def test_chrome_trace_is_compact_json() -> None:
    exp = export(_plan([_CUT], microbatches=2), _graph(), build("flat", num_devices=2),
                 "chrome-trace")
    assert exp.format == "chrome-trace" and exp.beside == {}
    assert exp.text == json.dumps(json.loads(exp.text), separators=(",", ":")) + "\n"


def test_an_unknown_torchtitan_version_names_the_known_ones() -> None:
    with pytest.raises(ShardplanError, match=r"^unknown torchtitan version '9' \(choose from "
                                             r"current, 0\.2\)$"):
        ExportOptions(torchtitan_version="9")


def test_megatron_counts_are_whole_numbers() -> None:
    exp = export(_plan([_CUT], replicas=2, microbatches=4), _graph(),
                 build("flat", num_devices=4), "megatron")
    assert '"virtual_stages_per_rank": 1,' in exp.text


def test_torchtitan_takes_the_settings_and_schedule_given() -> None:
    plan, g, t = _plan([_CUT], microbatches=4), _graph(), build("flat", num_devices=2)
    opts = ExportOptions(torchtitan_version="0.2")
    other = plan.settings.override(microbatches=2, schedule="gpipe")[0]
    conf = tomllib.loads(export(plan, g, t, "torchtitan", settings=other, options=opts).text)
    assert conf["parallelism"]["pipeline_parallel_schedule"] == "GPipe"
    assert conf["training"]["local_batch_size"] == 4 * 2
    custom = Schedule.from_text("0F0,0F1,0F2,0B0,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n")
    exp = export(plan, g, t, "torchtitan", schedule=custom, options=opts)
    conf = tomllib.loads(exp.text)
    assert conf["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    assert exp.beside[".schedule.csv"] == custom.to_text()
    flags = shlex.split(export(plan, g, t, "torchtitan", schedule=custom).beside[".flags"])
    assert flags[flags.index("--training.local_batch_size") + 1] == "12"  # 3 micro-batches of 4


def test_a_simulated_interleaving_is_exported_as_one_stage_per_rank() -> None:
    four = _plan([3 + 2, _CUT, 3 + 4 * 3], microbatches=4, schedule="interleaved-1f1b")
    exp = export(four, _graph(), build("flat", num_devices=4), "torch")
    out = json.loads(exp.text)
    assert (out["num_stages"], out["num_ranks"]) == (4, 4)
    assert exp.notes == ("the plan places its 4 stages on devices of their own: exported as 4 "
                         "ranks of one stage each (torch's Interleaved1F1B order), not the "
                         "simulated 2 stages on each of 2 rank(s)",)
