"""``shardplan._ranks``: what every spawned rank sets up before its work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardplan import _ranks

_RETURNED = """
import sys
if sys.argv[1] == "1":
    from shardplan._ranks import retain_freed_memory
    assert retain_freed_memory()
import torch

def resident():  # pages in the resident set
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1])

returned = 0
for numel in (1 << 16, 1 << 18, 1 << 21):  # 256 KiB, 1 MiB, 8 MiB
    for alive in (1, 8, 40):  # 40 x 8 MiB outgrow the 256 MiB the heap grows by
        held = [torch.ones(numel) for _ in range(alive)]
        before = resident()
        del held
        returned += before - resident()
print(returned)
"""


def _returned(retain: bool) -> int:
    """Pages handed back to the system when tensors of 256 KiB to 8 MiB are freed."""
    out = subprocess.run([sys.executable, "-c", _RETURNED, "1" if retain else "0"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_retained_memory_stays_resident_when_freed() -> None:
    """Freed tensors stay in the process's heap for the next ones, where glibc's default
    hands them back (114,532 pages here) to fault them in again when the next step makes
    them. Without the trim threshold 16,384 pages go back; without the mmap threshold
    47,127 (the 8 MiB tensors beyond the heap's top are mapped, then unmapped). Counted in
    the resident set, not in page faults: a fault count also counts the kernel's own
    faults, and failed once in CI with 12,288 of them."""
    assert _returned(True) <= 0
    assert _returned(False) > 4096  # more than two 8 MiB tensors' pages


def test_ranks_retain_freed_memory_before_their_target(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(_ranks, "die_with_parent", lambda pid: calls.append("parent"))
    monkeypatch.setattr(_ranks, "retain_freed_memory", lambda: calls.append("retain"))
    _ranks._rank_entry(lambda x: calls.append(x), 1, "target")
    assert calls == ["parent", "retain", "target"]


def test_retain_is_a_no_op_off_linux(monkeypatch) -> None:
    monkeypatch.setattr(_ranks.sys, "platform", "darwin")
    assert _ranks.retain_freed_memory() is False
