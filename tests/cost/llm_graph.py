"""A Megatron-style GPT written as the graph capture makes of it (no torch): for the planning
core's LLM tests, which must run in milliseconds. ``tests/capture`` checks the captured zoo
GPT against the same structure."""

from __future__ import annotations

from shardplan.ir import Graph


def gpt_graph(*, hidden: int = 64, layers: int = 4, heads: int = 4, vocab: int = 128,
              seq: int = 32, batch: int = 2, dtype_bytes: int = 4, loss: bool = True,
              head: str = "output", after_head: tuple[tuple[str, str], ...] = ()) -> Graph:
    """Pre-LayerNorm GPT (GELU MLP of 4h, learned positions, biases, tied head) at ``batch``
    sequences, fp32 bytes, ending at its loss (``loss``) or at the logits, as the model
    zoo's capture does. ``head`` names the output head's module; ``after_head`` chains
    elementwise ``(op, module)`` nodes on the logits before the loss (a logit bias, a
    soft cap). Parameters: 12 l h^2 + 13 l h + V h + s h + 2 h."""
    h, s, b, v_size = hidden, seq, batch, vocab
    act = b * s * h * dtype_bytes
    names, ops, mods, fwd, pb, ob = [], [], [], [], [], []
    src, dst, eb = [], [], []

    def node(name, op, mod, flops, params, out):
        names.append(name)
        ops.append(op)
        mods.append(mod)
        fwd.append(float(flops))
        pb.append(params * dtype_bytes)
        ob.append(out)
        return len(names) - 1

    def edge(a, c, nbytes=None):
        src.append(a)
        dst.append(c)
        eb.append(ob[a] if nbytes is None else nbytes)

    tok = node("tok", "embedding", "tok_embeddings", 0, v_size * h, act)
    pos = node("pos", "embedding", "pos_embeddings", 0, s * h, act)
    x = node("embed_add", "add", "", b * s * h, 0, act)
    edge(tok, x)
    edge(pos, x)
    for i in range(layers):
        p = f"layers.{i}"
        n1 = node(f"{p}.ln1", "layer_norm", f"{p}.attention_norm", 5 * b * s * h, 2 * h, act)
        qkv = node(f"{p}.qkv", "linear", f"{p}.attention.wqkv", 2 * b * s * h * 3 * h,
                   3 * h * h + 3 * h, 3 * act)
        core = node(f"{p}.sdpa", "scaled_dot_product_attention", f"{p}.attention",
                    4 * b * s * s * h, 0, act)
        wo = node(f"{p}.wo", "linear", f"{p}.attention.wo", 2 * b * s * h * h, h * h + h, act)
        a1 = node(f"{p}.add1", "add", p, b * s * h, 0, act)
        n2 = node(f"{p}.ln2", "layer_norm", f"{p}.ffn_norm", 5 * b * s * h, 2 * h, act)
        w1 = node(f"{p}.w1", "linear", f"{p}.feed_forward.w1", 8 * b * s * h * h,
                  4 * h * h + 4 * h, 4 * act)
        gelu = node(f"{p}.gelu", "gelu", f"{p}.feed_forward", 8 * b * s * h, 0, 4 * act)
        w2 = node(f"{p}.w2", "linear", f"{p}.feed_forward.w2", 8 * b * s * h * h,
                  4 * h * h + h, act)
        a2 = node(f"{p}.add2", "add", p, b * s * h, 0, act)
        for a, c in ((x, n1), (x, a1), (n1, qkv), (qkv, core), (core, wo), (wo, a1),
                     (a1, n2), (a1, a2), (n2, w1), (w1, gelu), (gelu, w2), (w2, a2)):
            edge(a, c)
        x = a2
    norm = node("norm", "layer_norm", "norm", 5 * b * s * h, 2 * h, act)
    out = node("output", "linear", head, 2 * b * s * h * v_size, 0,
               b * s * v_size * dtype_bytes)
    edge(x, norm)
    edge(norm, out)
    for op, mod in after_head:
        nxt = node(f"{mod or 'logits'}.{op}", op, mod, b * s * v_size, 0,
                   b * s * v_size * dtype_bytes)
        edge(out, nxt)
        out = nxt
    if loss:
        edge(out, node("loss", "cross_entropy", "", 3 * b * s * v_size, 0, dtype_bytes))
    dims = {"family": "gpt", "hidden": h, "layers": layers, "heads": heads,
            "kv_heads": heads, "ffn": 4 * h, "vocab": v_size, "seq": s, "tied": True}
    return Graph.from_arrays(name="gpt-test", batch_size=b, fwd_flops=fwd, src=src, dst=dst,
                             edge_bytes=eb, param_bytes=pb, output_bytes=ob, names=names,
                             ops=ops, modules=mods, meta={"transformer": dims})


def gpt_parameters(*, hidden: int, layers: int, vocab: int, seq: int) -> int:
    """Megatron's count (llm-facts.md): 12 l h^2 (1 + 13 / (12 h)) + V h + s h, plus the
    final norm's 2 h."""
    h = hidden
    return 12 * layers * h * h + 13 * layers * h + vocab * h + seq * h + 2 * h
