"""Importers: graphs from other tools' formats (PipeDream / DAPPLE / Piper profiles)."""

from shardplan.importers.pipedream import load_pipedream, parse_pipedream

IMPORTERS = {"pipedream": load_pipedream}
"""Every importer by the name ``shardplan import KIND`` uses: ``fn(path, *, name, batch_size)``."""

__all__ = ["IMPORTERS", "load_pipedream", "parse_pipedream"]
