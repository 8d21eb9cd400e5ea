"""``simulate`` prints an LLM plan's memory as runs report it: allocated, reserved, on the
device (issue 44), and the JSON carries the same figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli

ARGS = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
        "--max-position-embeddings 128 --vocab-size 1000 --micro-batch-size 2 "
        "--global-batch-size 16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        "--bf16")


@pytest.mark.torch
def test_simulate_prints_allocated_reserved_and_device_memory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert run_cli(["import", "megatron", "--cluster", "dgx-a100,nodes=1", "-o", str(out),
                    "--args", ARGS]) == 0
    capsys.readouterr()
    files = [str(out / f) for f in ("plan.json", "graph.json", "topology.json")]
    assert run_cli(["simulate", *files]) == 0
    text = capsys.readouterr().out
    assert " allocated, " in text and " reserved, " in text and " on the device" in text
    assert run_cli(["simulate", *files, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    alloc, res, dev = (max(data[k]) for k in ("peak_memory_bytes", "reserved_memory_bytes",
                                               "device_memory_bytes"))
    assert alloc <= res < dev
    assert f"{dev / 2**30:.2f} on the device" in text
