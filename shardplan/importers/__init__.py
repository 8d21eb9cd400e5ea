"""Importers: graphs from other tools' formats (PipeDream / DAPPLE / Piper profiles), and
training runs from Megatron-LM's arguments and torchtitan's configs (:class:`RunConfig`)."""

from shardplan.importers._run import ModelDims, RunConfig
from shardplan.importers.megatron import megatron_args_of_row, parse_megatron
from shardplan.importers.pipedream import load_pipedream, parse_pipedream
from shardplan.importers.torchtitan import run_of_torchtitan, torchtitan_options

IMPORTERS = {"pipedream": load_pipedream}
"""Every importer by the name ``shardplan import KIND`` uses: ``fn(path, *, name, batch_size)``."""

__all__ = ["IMPORTERS", "ModelDims", "RunConfig", "load_pipedream", "megatron_args_of_row",
           "parse_megatron", "parse_pipedream", "run_of_torchtitan", "torchtitan_options"]
