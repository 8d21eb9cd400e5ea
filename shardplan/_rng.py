"""The one place where a seed becomes a random number generator (no global random state)."""

from __future__ import annotations

import numpy as np

from shardplan.errors import ShardplanError

__all__ = ["make_rng"]


def make_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    """Return a NumPy ``Generator`` for ``seed``.

    Parameters
    ----------
    seed : int, numpy.random.Generator or None
        An integer seed (same seed, same stream), an existing generator (returned as is), or
        ``None`` for seed 0: shardplan never draws from an unseeded source, so every run is
        reproducible by default.
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None:
        seed = 0
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ShardplanError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng(int(seed))
