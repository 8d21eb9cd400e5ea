"""Megatron-Core's Transformer Engine blocks keep less than eager autograd of the captured
model: counted per token and block against what its modules save (shardplan.cost._llm.te_kept)."""

import numpy as np
import pytest

from shardplan.capture import capture_spec
from shardplan.cost import block_layout, llm_costs
from shardplan.cost._llm import _graph_facts, te_kept
from shardplan.ir import ExecutionSettings, ParallelConfig
from shardplan.topology import build_spec

pytestmark = pytest.mark.torch

H, HEADS, KV, FFN, SEQ = 256, 4, 2, 512, 64


@pytest.fixture(scope="module")
def llama():
    return capture_spec(f"llama3:8B,dim={H},n_layers=2,n_heads={HEADS},n_kv_heads={KV},"
                        f"ffn_dim={FFN},vocab_size=1000,seq={SEQ}", batch_size=1, meta=True)


def _per_token_block(graph, kept):
    lay = block_layout(graph)
    return kept[lay.block == 0].sum() / 4 / SEQ / H  # fp32 captured, per hidden element


def test_transformer_engine_keeps_what_its_modules_save(llama):
    eager = _graph_facts(llama).kept_bytes(llama, 4)
    drop, own = te_kept(llama)
    te = np.where(drop, 0.0, eager)
    te[own] = llama.output_bytes[own]
    # the residual and the normalized input of both norms (2 + 2), q, k and v at their own
    # heads, the attention's output, the MLP's gate and up products and their product
    want = 4 + (1 + 2 * KV / HEADS) + 1 + 3 * FFN / H
    assert _per_token_block(llama, te) == pytest.approx(want)
    assert _per_token_block(llama, eager) > want + 2  # rotary, repeated k / v, SiLU, copies


def test_megatron_core_prices_its_smaller_activations(llama):
    topo = build_spec("dgx-h100,nodes=1")
    st = ExecutionSettings(microbatch_size=1, microbatches=2, precision="bf16")
    own = llm_costs(llama, topo, ParallelConfig(), st).memory
    te = llm_costs(llama, topo, ParallelConfig(),
                   ExecutionSettings(microbatch_size=1, microbatches=2, precision="bf16",
                                     stack="megatron-core")).memory
    assert te["activations"][0] < own["activations"][0]
    assert te["params"][0] == own["params"][0]
