"""shardplan._limits and shardplan.ir.hardware on their own."""

from __future__ import annotations

import pytest

from shardplan._limits import LIMITS, check_size, parse_count
from shardplan.errors import ShardplanError
from shardplan.ir.hardware import check_precision
from shardplan.topology import build


@pytest.mark.parametrize("kind", sorted(LIMITS))
def test_every_limit_admits_itself_and_refuses_above(kind: str) -> None:
    most, why = LIMITS[kind]
    assert check_size("x", most, kind) == most and why
    with pytest.raises(ShardplanError, match="^x .* is above the "):
        check_size("x", most * 2, kind)
    with pytest.raises(ShardplanError):
        check_size("x", float("nan"), kind)


def test_parse_count() -> None:
    assert parse_count("--num-layers", "24", "layers") == 24
    with pytest.raises(ShardplanError, match="takes an integer"):
        parse_count("--num-layers", "2e3", "layers")
    with pytest.raises(ShardplanError, match=">= 1"):
        parse_count("--num-layers", "0", "layers")


@pytest.mark.parametrize("device, precision, ok", [
    ("v100", "bf16", False), ("v100", "fp16", True), ("a100", "bf16", True),
    ("a100", "fp8", False), ("h100", "fp8", True)])
def test_precision_needs_the_hardware(device: str, precision: str, ok: bool) -> None:
    topo = build("flat", num_devices=2, device=device)
    if ok:
        check_precision(topo, precision)
    else:
        with pytest.raises(ShardplanError, match=f"^precision {precision} needs"):
            check_precision(topo, precision)
