"""``shardplan._ranks``: what every spawned rank sets up before its work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardplan import _ranks

_FAULTS = """
import resource, sys
if sys.argv[1] == "1":
    from shardplan._ranks import retain_freed_memory
    assert retain_freed_memory()
import torch

def run(alive, numel):  # 100 tensors made in turn, the last `alive` of them kept
    held = []
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(100):
        held.append(torch.ones(numel))
        del held[:-alive]
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

faults = 0
for numel in (1 << 16, 1 << 18, 1 << 21):  # 256 KiB, 1 MiB, 8 MiB
    for alive in (1, 8):
        run(alive, numel)  # the heap grows to what the pattern needs
        faults += run(alive, numel)
print(faults)
"""


def _faults(retain: bool) -> int:
    out = subprocess.run([sys.executable, "-c", _FAULTS, "1" if retain else "0"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_retained_memory_is_reused_without_page_faults() -> None:
    """Tensors freed and made again come from the retained heap: (almost) no new pages,
    where glibc's default hands memory back and faults it in again (13,760 pages here over
    these 600 tensors of 256 KiB to 8 MiB; retained: 0 alone, 1,536 once in CI with other
    tests running beside it)."""
    retained = _faults(True)
    assert retained < 2048  # fewer than one 8 MiB tensor's pages in all
    assert _faults(False) > 4 * max(retained, 2048)


def test_ranks_retain_freed_memory_before_their_target(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(_ranks, "die_with_parent", lambda pid: calls.append("parent"))
    monkeypatch.setattr(_ranks, "retain_freed_memory", lambda: calls.append("retain"))
    _ranks._rank_entry(lambda x: calls.append(x), 1, "target")
    assert calls == ["parent", "retain", "target"]


def test_retain_is_a_no_op_off_linux(monkeypatch) -> None:
    monkeypatch.setattr(_ranks.sys, "platform", "darwin")
    assert _ranks.retain_freed_memory() is False
