"""The model zoo: names, configurations, user files and their errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.workload import build_model, list_models  # noqa: E402
from shardplan.workload.hf import HF_CONFIGS  # noqa: E402

pytestmark = pytest.mark.torch


def test_mlp_is_the_papers_model() -> None:
    model, inputs, name = build_model("mlp", batch_size=3)
    assert name == "mlp"
    assert inputs[0].shape == (3, 767)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(767, 1024), (1024, 1024),
                                                                  (1024, 10)]
    assert isinstance(list(model.children())[-1], torch.nn.Softmax)
    out = model(*inputs)
    assert torch.allclose(out.sum(dim=1), torch.ones(3))


def test_build_is_deterministic() -> None:
    a, xa, _ = build_model("transformer,num_layers=1", batch_size=2, seq_len=16)
    b, xb, _ = build_model("transformer,num_layers=1", batch_size=2, seq_len=16)
    assert torch.equal(xa[0], xb[0])
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_transformer_options_and_shapes() -> None:
    model, (ids,), _ = build_model("transformer,d_model=64,num_heads=2,num_layers=3",
                                   batch_size=2, seq_len=10)
    assert ids.shape == (2, 10)
    assert len(model.blocks) == 3
    assert model(ids).shape == (2, 10, 8192)


@pytest.mark.parametrize("name", ["bert-base", "bert-large", "gpt2", "gpt2-medium"])
def test_published_hf_sizes(name: str) -> None:
    family, sizes = HF_CONFIGS[name]
    expected = {"bert-base": (12, 768, 12), "bert-large": (24, 1024, 16), "gpt2": (12, 768, 12),
                "gpt2-medium": (24, 1024, 16)}[name]
    if family == "bert":
        got = (sizes["num_hidden_layers"], sizes["hidden_size"], sizes["num_attention_heads"])
        assert sizes["intermediate_size"] == 4 * sizes["hidden_size"]
    else:
        got = (sizes["n_layer"], sizes["n_embd"], sizes["n_head"])
    assert got == expected


def test_hf_model_builds_offline_with_published_vocab() -> None:
    model, (ids,), name = build_model("transformers:gpt2,n_layer=1", batch_size=2, seq_len=8)
    assert name == "gpt2"
    assert model.config.vocab_size == 50257 and model.config.n_positions == 1024
    assert model.config.n_layer == 1
    assert model(ids).shape == (2, 8, 50257)
    model, (ids,), _ = build_model("transformers:bert-tiny", batch_size=1, seq_len=8)
    assert model.config.vocab_size == 30522 and model.config.max_position_embeddings == 512
    assert model(ids).shape == (1, 8, 30522)


def test_torchvision_models() -> None:
    model, (x,), name = build_model("torchvision:resnet18", batch_size=2)
    assert name == "resnet18" and x.shape == (2, 3, 224, 224)
    _, (x,), _ = build_model("torchvision:inception_v3", batch_size=2)
    assert x.shape[-1] == 299
    _, (x,), _ = build_model("torchvision:resnet18", batch_size=1, image_size=64)
    assert x.shape == (1, 3, 64, 64)


def test_list_models() -> None:
    names = list_models()
    for n in ("mlp", "transformer", "transformers:bert-large", "transformers:gpt2",
              "torchvision:resnet152", "torchvision:swin_b", "torchvision:fcn_resnet50"):
        assert n in names


@pytest.mark.parametrize(("spec", "match"), [
    ("nope", "unknown model 'nope'"),
    ("torchvision:resnet999", "unknown torchvision"),
    ("torchvision:", "unknown model"),
    ("transformers:gpt3", "unknown transformers model 'gpt3'"),
    ("transformers:gpt2,no_such_option=1", "unknown GPT2Config option"),
    ("transformer,width=3", "unknown transformer option 'width'"),
    ("transformer,d_model=10,num_heads=3", "not divisible"),
    ("transformer,num_layers", "expected key=value"),
    ("mlp,x=1", "mlp takes no options"),
    ("missing_file.py:make", "does not exist"),
])
def test_bad_model_names(spec: str, match: str) -> None:
    with pytest.raises(ShardplanError, match=match):
        build_model(spec, batch_size=2)


def test_seq_len_too_long() -> None:
    with pytest.raises(ShardplanError, match="exceeds"):
        build_model("transformers:bert-tiny", seq_len=513)


def test_user_file(tmp_path) -> None:
    path = tmp_path / "mymodel.py"
    path.write_text(
        "import torch\n"
        "def make():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 3)), torch.randn(5, 4)\n"
        "def pair():\n"
        "    return torch.nn.Linear(4, 3), [torch.randn(5, 4)]\n"
        "def wrong():\n"
        "    return 3\n"
        "def boom():\n"
        "    raise RuntimeError('no model today')\n"
        "NOT_CALLABLE = 1\n")
    model, inputs, name = build_model(f"{path}:make")
    assert name == "make" and isinstance(model, torch.nn.Module) and inputs[0].shape == (5, 4)
    _, inputs, _ = build_model(f"{path}:pair")
    assert isinstance(inputs, tuple) and len(inputs) == 1
    for func, match in [("wrong", "must return"), ("absent", "has no function 'absent'"),
                        ("NOT_CALLABLE", "has no function"), ("boom", "no model today")]:
        with pytest.raises(ShardplanError, match=match):
            build_model(f"{path}:{func}")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_anywhere\n")
    with pytest.raises(ShardplanError, match="importing .* failed"):
        build_model(f"{broken}:make")


def test_gnn_is_paper_000s_figure_2() -> None:
    """Two chains of graph convolutions over the input, joined by a third convolution on
    their concatenated features; the graph convolution is mean aggregation over in-edges,
    checked against a dense normalised adjacency matrix."""
    from shardplan.workload.gnn import GNN, GraphConv, gnn_edges

    model, (x,), name = build_model("gnn,num_nodes=10,hidden=8,chain_length=3", batch_size=2)
    assert name == "gnn" and isinstance(model, GNN)
    assert x.shape == (2, 10, 16)
    assert len(model.chain_a) == len(model.chain_b) == 3
    assert model.combine.self_lin.in_features == 16  # 2 x hidden: the chains concatenated
    assert model(x).shape == (2, 4)
    src, dst = gnn_edges(model.cfg)
    assert src.numel() == dst.numel() and not bool((src == dst).any())
    pairs = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert all((b, a) in pairs for a, b in pairs)  # undirected
    assert all((i, (i + 1) % 10) in pairs for i in range(10))  # the ring
    conv = model.chain_a[0]
    assert isinstance(conv, GraphConv)
    adj = torch.zeros(10, 10)
    adj[dst, src] = 1.0
    dense = adj / adj.sum(dim=1, keepdim=True)
    want = torch.relu(conv.self_lin(x) + conv.nbr_lin(dense @ x))
    assert torch.allclose(conv(x), want, atol=1e-6)
    again, _, _ = build_model("gnn,num_nodes=10,hidden=8,chain_length=3", batch_size=2)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(),
                                                 strict=True))
    assert not any("src" in k or "deg" in k for k in model.state_dict())  # graph: not state


def test_gnn_options_are_checked() -> None:
    with pytest.raises(ShardplanError, match="unknown gnn option 'layers'"):
        build_model("gnn,layers=2")
    with pytest.raises(ShardplanError, match="num_nodes must be at least 3"):
        build_model("gnn,num_nodes=2")
    with pytest.raises(ShardplanError, match="must be an integer"):
        build_model("gnn,hidden=2.5")
    assert "gnn" in list_models()


def test_small_gpt2_vocabulary_drops_the_special_token_ids(capsys) -> None:
    """GPT-2's bos/eos id 50256 lies outside a smaller vocabulary: transformers warns on every
    build (into the user's terminal under ``train --baseline single``) unless they go."""
    small, _, _ = build_model("transformers:gpt2,n_layer=1,n_embd=32,n_head=2,vocab_size=64",
                              batch_size=1, seq_len=4)
    assert small.config.bos_token_id is None and small.config.eos_token_id is None
    assert "bos_token_id" not in capsys.readouterr().err
    kept, _, _ = build_model("transformers:gpt2,n_layer=1,n_embd=32,n_head=2,vocab_size=64,"
                             "eos_token_id=3", batch_size=1, seq_len=4)
    assert kept.config.eos_token_id == 3
    full, _, _ = build_model("transformers:gpt2,n_layer=1,n_embd=32,n_head=2", batch_size=1,
                             seq_len=4)
    assert full.config.bos_token_id == 50256


def test_meta_builds_have_no_storage_or_say_why_not() -> None:
    model, (x,), _ = build_model("transformer,num_layers=1", batch_size=2, seq_len=8,
                                 meta=True)
    assert x.is_meta and all(p.is_meta for p in model.parameters())
    with pytest.raises(ShardplanError, match="cannot be built on the meta device"):
        build_model("gnn", batch_size=2, meta=True)  # its graph is built from values
