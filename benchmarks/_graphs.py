"""Captured graphs for the benchmarks, cached under ``benchmarks/.cache/`` (git-ignored).

Benchmarks import :func:`captured` instead of capturing themselves, so that several scripts
(and several runs) capture each model once. A cache file is keyed by every capture argument;
delete ``benchmarks/.cache`` to re-capture (after a change to ``shardplan.capture``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from shardplan.ir import Graph, load_graph, save  # noqa: E402

CACHE = Path(__file__).resolve().parent / ".cache"


def captured(spec: str, **capture_options: Any) -> Graph:
    """``shardplan.capture.capture_spec(spec, **capture_options)``, from the cache when there.

    Parameters
    ----------
    spec : str
        A model spec of ``shardplan capture`` (``torchvision:resnet152``, ``FILE.py:FN``, ...).
    **capture_options
        Keywords of :func:`shardplan.capture.capture_spec` (``batch_size``, ``granularity``...).
    """
    key = json.dumps({"spec": spec, **capture_options}, sort_keys=True, default=str)
    slug = "".join(c if c.isalnum() else "_" for c in spec)[-60:]
    path = CACHE / f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"
    if path.exists():
        return load_graph(path)
    from shardplan.capture import capture_spec

    graph = capture_spec(spec, **capture_options)
    CACHE.mkdir(parents=True, exist_ok=True)
    save(graph, path)
    return graph
