"""Shared test setup: one thread per process, no hub access, small graphs."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from shardplan.ir import Graph  # noqa: E402


@pytest.fixture
def diamond() -> Graph:
    """0 -> {1, 2} -> 3, with distinct bytes per edge."""
    return Graph.from_arrays(
        name="diamond", fwd_flops=[1.0, 2.0, 3.0, 4.0], src=[0, 0, 1, 2], dst=[1, 2, 3, 3],
        edge_bytes=[10, 20, 30, 40], param_bytes=[4, 8, 0, 16], output_bytes=[10, 30, 40, 5],
    )


def random_dag(n: int, p: float, seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    iu = np.triu_indices(n, 1)
    keep = rng.random(iu[0].size) < p
    src, dst = iu[0][keep], iu[1][keep]
    perm = rng.permutation(n)  # ids no longer topological
    return Graph.from_arrays(name=f"rand{seed}", fwd_flops=rng.random(n), src=perm[src],
                             dst=perm[dst], edge_bytes=rng.integers(1, 100, src.size))
