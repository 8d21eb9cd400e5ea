"""Import a Megatron-LM run from its command-line arguments (``shardplan import megatron``).

The arguments are read as Megatron-LM's ``megatron/training/arguments.py`` defines them (the
``core_r0.12`` - ``core_r0.14`` era: ``--num-virtual-stages-per-pipeline-rank``,
``--decoder-first-pipeline-num-layers``, ``--use-torch-fsdp2``, ``--use-megatron-fsdp`` with
``--data-parallel-sharding-strategy``); the text is split with :mod:`shlex` and every
argument is looked up in the tables below -- nothing in it is ever run.

What is read:

- model: ``--num-layers``, ``--hidden-size``, ``--num-attention-heads``,
  ``--group-query-attention`` with ``--num-query-groups``, ``--ffn-hidden-size`` (default
  ``4 h``, or Megatron's SwiGLU default ``int(8 h / 3 / 64) * 64``), ``--seq-length``,
  ``--max-position-embeddings``, the vocabulary (below). ``--swiglu`` or grouped-query
  attention select the ``llama`` family by dimensions; otherwise the ``gpt`` family. Where
  ``--normalization``, ``--position-embedding-type`` or
  ``--untie-embeddings-and-output-weights`` disagree with the family chosen, a note says so.
- the vocabulary: Megatron takes it from the tokenizer and pads it to a multiple of
  ``--make-vocab-size-divisible-by`` (128) x tensor parallelism. shardplan reads no tokenizer:
  ``--vocab-size V`` (Megatron's own argument, the size before padding) is padded as Megatron
  pads it; ``--padded-vocab-size V`` (shardplan's) is used as given; ``--tokenizer-type
  GPT2BPETokenizer`` means 50,257 before padding. Otherwise the import stops and asks for one.
- batch: ``--micro-batch-size``, ``--global-batch-size`` (default: micro-batch x
  data-parallel size).
- parallelism: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--num-layers-per-virtual-pipeline-stage`` or ``--num-virtual-stages-per-pipeline-rank``,
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` (uneven
  stages: :attr:`~shardplan.ir.ParallelConfig.stage_layers`), ``--context-parallel-size``,
  ``--sequence-parallel``. Megatron takes the world size from ``torchrun``; the data-parallel
  size is the cluster's GPUs / (tp x pp x cp), or shardplan's own ``--data-parallel-size``
  (both given: they must agree; neither: 1).
- settings: ``--fp16`` / ``--bf16`` / ``--fp8-format`` (precision), ``--recompute-granularity
  full|selective`` with ``--recompute-method`` and ``--recompute-num-layers`` (or the older
  ``--recompute-activations``: selective), ``--use-distributed-optimizer`` (ZeRO-1:
  ``gradient_sync`` ``zero1``), ``--use-torch-fsdp2`` or ``--use-megatron-fsdp`` with
  ``--data-parallel-sharding-strategy optim_grads_params`` (ZeRO-3: the data-parallel ranks
  become ``dp_shard``; ``sharded``; ``optim``: ZeRO-1; the default ``no_shard``: DDP),
  ``--overlap-grad-reduce`` (DDP's ``bucketed``), Megatron-DeepSpeed's ``--deepspeed`` with
  ``--zero-stage 0|1|2|3`` (3: ``sharded`` with ``shard_unit`` ``module``, DeepSpeed gathering
  each sub-module on its own; 1 and 2: ``zero1``; its JSON config is not read) and the
  older ``--checkpoint-activations`` (full recompute),
  ``--overlap-param-gather``, ``--tp-comm-overlap``, ``--optimizer adam|sgd``;
  ``--accumulate-allreduce-grads-in-fp32`` (``grad_reduce`` ``fp32``; Megatron-LM turns it on
  with ``--bf16``, so bf16 and fp8 runs have it too, unless DeepSpeed runs the step or
  ``--grad-reduce-in-bf16`` keeps them in bf16: ``grad_reduce`` ``param``; Megatron-LM's
  ``arguments.py``, and Megatron-Bridge's ``grad_reduce_in_fp32 = False``).

- mixtures of experts (``--num-experts`` with the router's, the experts' and multi-latent
  attention's arguments: a zoo flavor with overrides, ``deepseek_v3:671B,seq=4096``), the
  expert grid (``--expert-model-parallel-size``, ``--expert-tensor-parallel-size``: the
  plan's ``ep`` and ``etp``), the MoE settings (``--moe-token-dispatcher-type``,
  ``--moe-expert-capacity-factor``, ``--moe-grouped-gemm``) and
  ``--pipeline-model-parallel-layout``: :mod:`shardplan.importers._megatron_moe`.

Anything else in :data:`IGNORED_FLAGS` / :data:`IGNORED_VALUES` (paths, logging, learning
rates, dropout, kernels' fusion switches) is skipped silently; an argument in no table may
change the run and is not modelled: one note names it.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.importers import _megatron_moe as moe
from shardplan.importers._run import (
    ModelDims,
    RunConfig,
    balanced_stage_layers,
    execution_of,
    uneven_stage_layers,
)
from shardplan.ir.parallel import ParallelConfig
from shardplan.ir.settings import RECOMPUTE_MODULES

__all__ = ["IGNORED_FLAGS", "IGNORED_VALUES", "KNOWN_UNMODELLED", "megatron_args_of_row",
           "parse_megatron", "split_arguments"]

#: Arguments read, and whether each is a switch (no value).
_READ_SWITCHES = frozenset({
    "--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights",
    "--sequence-parallel", "--fp16", "--bf16", "--recompute-activations",
    "--use-distributed-optimizer", "--use-torch-fsdp2", "--use-megatron-fsdp",
    "--use-custom-fsdp", "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
    "--deepspeed", "--no-pipeline-parallel", "--checkpoint-activations",
    "--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16",
    "--account-for-embedding-in-pipeline-split",
    "--use-legacy-models",
    "--account-for-loss-in-pipeline-split",
}) | moe.MOE_SWITCHES
_READ_VALUES = frozenset({
    "--num-layers", "--hidden-size", "--num-attention-heads", "--num-query-groups",
    "--ffn-hidden-size", "--seq-length", "--max-position-embeddings", "--vocab-size",
    "--padded-vocab-size", "--make-vocab-size-divisible-by", "--tokenizer-type",
    "--normalization", "--position-embedding-type", "--micro-batch-size",
    "--global-batch-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--context-parallel-size", "--data-parallel-size", "--fp8-format",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--data-parallel-sharding-strategy", "--optimizer", "--kv-channels", "--zero-stage",
    "--deepspeed_config", "--deepspeed-config", "--pp-partition-method", "--transformer-impl",
}) | moe.MOE_VALUES
#: Arguments read that take one or more values (argparse's ``nargs='+'``).
_READ_LISTS = moe.MOE_LISTS | {"--recompute-modules"}

#: Switches that do not change what shardplan models (logging, checkpoints, kernel fusion).
IGNORED_FLAGS = frozenset({
    "--use-mcore-models", "--no-masked-softmax-fusion",
    "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-gradient-accumulation-fusion",
    "--no-async-tensor-model-parallel-allreduce", "--no-rope-fusion",
    "--no-position-embedding", "--log-params-norm", "--log-num-zeros-in-grad",
    "--log-throughput", "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard",
    "--log-memory-to-tensorboard", "--log-world-size-to-tensorboard", "--no-save-optim",
    "--no-save-rng", "--no-load-optim", "--no-load-rng", "--finetune", "--use-checkpoint-args",
    "--exit-on-missing-checkpoint", "--calculate-per-token-loss", "--bias-swiglu-fusion",
    "--attention-softmax-in-fp32", "--apply-query-key-layer-scaling",
    "--no-query-key-layer-scaling", "--cross-entropy-loss-fusion", "--manual-gc",
    "--check-for-nan-in-loss-and-grad", "--no-check-for-nan-in-loss-and-grad",
    "--mock-data", "--tensorboard-log-interval", "--use-rotary-position-embeddings",
    "--no-persist-layer-norm", "--apply-layernorm-1p", "--timing-log-level",
    "--deepspeed-activation-checkpointing",
    "--no-create-attention-mask-in-dataloader", "--fp16-lm-cross-entropy",
}) | moe.MOE_IGNORED_FLAGS
#: Arguments with one value that do not change what shardplan models.
IGNORED_VALUES = frozenset({
    "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-decay-samples",
    "--lr-warmup-iters", "--lr-warmup-samples", "--lr-warmup-fraction", "--weight-decay",
    "--clip-grad", "--adam-beta1", "--adam-beta2", "--adam-eps", "--sgd-momentum",
    "--init-method-std", "--train-iters", "--train-samples", "--log-interval",
    "--save-interval", "--eval-interval", "--eval-iters", "--save", "--load", "--data-path",
    "--vocab-file", "--merge-file", "--tokenizer-model", "--split", "--distributed-backend",
    "--seed", "--tensorboard-dir", "--wandb-project", "--wandb-exp-name", "--wandb-save-dir",
    "--attention-dropout", "--hidden-dropout", "--loss-scale", "--initial-loss-scale",
    "--min-loss-scale", "--loss-scale-window", "--hysteresis", "--num-workers",
    "--dataloader-type", "--data-cache-path", "--attention-backend",
    "--ckpt-format", "--exit-interval", "--exit-duration-in-mins", "--norm-epsilon",
    "--rotary-base", "--rotary-percent", "--distributed-timeout-minutes", "--timing-log-option",
    "--tensorboard-queue-size", "--log-timers-to-tensorboard", "--hf-tokenizer-path",
    "--ddp-bucket-size", "--bucket-size", "--start-weight-decay", "--end-weight-decay",
    "--weight-decay-incr-style", "--fp8-amax-history-len", "--fp8-amax-compute-algo",
    "--fp8-margin", "--fp8-recipe", "--profile-step-start", "--profile-step-end",
    "--dist-ckpt-format", "--init-method-xavier-uniform", "--data-args-path",
}) | moe.MOE_IGNORED_VALUES

#: Megatron-LM arguments that change the run and that shardplan does not model (a note
#: names each one given), as Megatron-LM's ``megatron/training/arguments.py`` defines them
#: for the megatron-core release pinned in requirements.txt (0.16; the wheel ships
#: ``megatron.core`` only, so the names are written here). Any argument in none of the
#: tables is refused, naming the closest known one: Megatron's own parser
#: (``allow_abbrev=False``) would stop the run on it.
KNOWN_UNMODELLED = frozenset({
    "--moe-layer-recompute", "--moe-pad-expert-input-to-capacity", "--moe-shared-expert-gate",
    "--moe-shared-expert-overlap", "--moe-apply-probs-on-input", "--num-layers-per-stage",
    "--encoder-num-layers", "--decoder-num-layers",
    "--encoder-pipeline-model-parallel-size", "--encoder-tensor-model-parallel-size",
    "--use-flash-attn", "--use-distributed-checkpointing", "--overlap-p2p-communication",
    "--no-overlap-p2p-communication", "--defer-embedding-wgrad-compute",
    "--delay-wgrad-compute", "--tp-comm-overlap-cfg", "--tp-comm-bulk-wgrad",
    "--tp-comm-bulk-dgrad", "--cpu-offloading", "--cpu-offloading-num-layers",
    "--fp8-param-gather", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16",
    "--num-layers-at-end-in-bf16", "--fp4-format", "--rampup-batch-size",
    "--decoupled-lr", "--decoupled-min-lr", "--use-precision-aware-optimizer",
    "--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype",
    "--optimizer-cpu-offload", "--overlap-param-gather-with-optimizer-step",
    "--align-param-gather", "--no-align-param-gather", "--align-grad-reduce",
    "--num-distributed-optimizer-instances", "--use-sharp", "--ddp-average-in-collective",
    "--ddp-num-buckets", "--ddp-pad-buckets-for-high-nccl-busbw", "--gradient-reduce-div-fusion",
    "--cross-entropy-fusion-impl", "--mtp-loss-scaling-factor", "--hybrid-attention-ratio",
    "--hybrid-mlp-ratio", "--hybrid-override-pattern", "--squared-relu",
    "--openai-gelu", "--onnx-safe", "--bert-no-binary-head",
    "--hierarchical-context-parallel-sizes", "--cp-comm-type", "--nccl-communicator-config-path",
    "--use-tp-pp-dp-mapping", "--ds-sequence-parallel-size",
    "--distribute-saved-activations",
    "--use-cpu-initialization", "--empty-unused-memory-level", "--deterministic-mode",
    "--te-rng-tracker", "--inference-rng-tracker",
})

#: Megatron's ``--tokenizer-type`` values whose vocabulary is known without the tokenizer
#: file (GPT-2's BPE: 50,257 tokens, before padding).
_TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257}
#: ``--tokenizer-type``'s choices in Megatron-LM's ``arguments.py`` (its parser refuses any
#: other; megatron-core's ``tokenizers/text/utils/build_tokenizer.py`` builds these).
TOKENIZER_TYPES = ("BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer",
                   "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
                   "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
                   "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer",
                   "SFTTokenizer")


def split_arguments(text: str) -> list[tuple[str, list[str]]]:
    """``--a 1 --b --c=2`` -> ``[("--a", ["1"]), ("--b", []), ("--c", ["2"])]``.

    The text is split as a POSIX shell splits it (:func:`shlex.split`; line continuations
    ``\\`` and newlines are blanks); a token starting with ``--`` starts an argument and the
    tokens up to the next one are its values (``-1`` is a value).

    Raises
    ------
    ShardplanError
        Unbalanced quotes, or a value before the first argument.
    """
    try:
        tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise ShardplanError(f"cannot split the arguments: {exc}") from None
    out: list[tuple[str, list[str]]] = []
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok.partition("=")
            out.append((name, [value] if eq else []))
        elif not out:
            raise ShardplanError(f"expected arguments like --num-layers 24, got {tok!r} first")
        else:
            out[-1][1].append(tok)
    return out


#: The kind of size (:data:`shardplan._limits.LIMITS`) of each integer argument read.
_SIZES = {
    "--num-layers": "layers", "--hidden-size": "width", "--ffn-hidden-size": "width",
    "--kv-channels": "width", "--num-attention-heads": "heads", "--num-query-groups": "heads",
    "--seq-length": "sequence", "--max-position-embeddings": "sequence",
    "--vocab-size": "vocab", "--padded-vocab-size": "vocab",
    "--make-vocab-size-divisible-by": "vocab", "--micro-batch-size": "batch",
    "--global-batch-size": "batch", "--tensor-model-parallel-size": "degree",
    "--pipeline-model-parallel-size": "degree", "--context-parallel-size": "degree",
    "--data-parallel-size": "degree", "--num-virtual-stages-per-pipeline-rank": "degree",
    "--num-layers-per-virtual-pipeline-stage": "layers",
    "--decoder-first-pipeline-num-layers": "layers",
    "--decoder-last-pipeline-num-layers": "layers", "--recompute-num-layers": "layers",
    "--zero-stage": "degree",
}


def _int(name: str, values: list[str], minimum: int = 1) -> int:
    from shardplan._limits import parse_count

    return parse_count(name, values[0], _SIZES.get(name, "batch"), minimum)


def _read(text: str) -> tuple[dict[str, list[str]], list[str]]:
    """The arguments read (name -> values, the last given wins as in argparse) and the
    notes of those that are not."""
    args: dict[str, list[str]] = {}
    notes: list[str] = []
    unknown: list[str] = []
    for name, values in split_arguments(text):
        if name in _READ_SWITCHES:
            if values:
                raise ShardplanError(f"{name} takes no value, got {' '.join(values)!r}")
        elif name in _READ_VALUES:
            if len(values) != 1:
                raise ShardplanError(f"{name} takes one value, got {len(values)}: "
                                     f"{' '.join(values)!r}")
        elif name in _READ_LISTS:
            if not values:
                raise ShardplanError(f"{name} takes one or more values, got none")
        elif name in IGNORED_FLAGS or name in IGNORED_VALUES:
            continue
        else:
            if name not in unknown:
                unknown.append(name)
            continue
        if name in args and args[name] != values:
            notes.append(f"{name} is given twice: the last ({' '.join(values) or 'on'}) "
                         f"counts, as in Megatron-LM")
        args[name] = values
    for n in unknown:
        if n not in KNOWN_UNMODELLED:
            import difflib

            known = sorted(_READ_SWITCHES | _READ_VALUES | _READ_LISTS | IGNORED_FLAGS |
                           IGNORED_VALUES | KNOWN_UNMODELLED)
            close = difflib.get_close_matches(n, known, n=1, cutoff=0.6)
            hint = (f" (did you mean {close[0]}?)" if close else
                    f" (the closest known is "
                    f"{difflib.get_close_matches(n, known, n=1, cutoff=0.0)[0]})")
            raise ShardplanError(f"unknown Megatron-LM argument {n}{hint}: Megatron-LM's "
                                 f"parser refuses it (allow_abbrev=False)")
    notes += [f"Megatron-LM argument {n} changes the run and is not modelled" for n in unknown]
    return args, notes


def _padded_vocab(args: Mapping[str, list[str]], tp: int) -> int:
    tokenizer = args.get("--tokenizer-type", [None])[0]
    if tokenizer is not None and tokenizer not in TOKENIZER_TYPES:
        raise ShardplanError(f"--tokenizer-type {tokenizer!r} is not one of Megatron-LM's "
                             f"({', '.join(TOKENIZER_TYPES)})")
    if "--padded-vocab-size" in args:
        return _int("--padded-vocab-size", args["--padded-vocab-size"])
    if "--vocab-size" in args:
        vocab = _int("--vocab-size", args["--vocab-size"])
    elif args.get("--tokenizer-type", [""])[0] in _TOKENIZER_VOCAB:
        vocab = _TOKENIZER_VOCAB[args["--tokenizer-type"][0]]
    else:
        raise ShardplanError("Megatron-LM reads the vocabulary from the tokenizer: give "
                             "--vocab-size V (padded as Megatron pads it) or "
                             "--padded-vocab-size V")
    divisible = _int("--make-vocab-size-divisible-by",
                     args.get("--make-vocab-size-divisible-by", ["128"]))
    multiple = divisible * tp
    return math.ceil(vocab / multiple) * multiple


def _model(args: Mapping[str, list[str]], tp: int, notes: list[str]) -> ModelDims:
    for need in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length"):
        if need not in args:
            raise ShardplanError(f"the model needs {need}")
    layers = _int("--num-layers", args["--num-layers"])
    hidden = _int("--hidden-size", args["--hidden-size"])
    heads = _int("--num-attention-heads", args["--num-attention-heads"])
    seq = _int("--seq-length", args["--seq-length"])
    experts = moe.has_experts(args, notes)
    if not experts and "--kv-channels" in args and \
            _int("--kv-channels", args["--kv-channels"]) * heads != hidden:
        notes.append("--kv-channels other than hidden / heads is not modelled (attention's "
                     "width is the hidden size)")
    kv = heads
    if "--group-query-attention" in args:
        kv = _int("--num-query-groups", args.get("--num-query-groups", ["1"]))
    elif "--num-query-groups" in args:
        notes.append("--num-query-groups without --group-query-attention is ignored, as "
                     "Megatron-LM ignores it")
    swiglu = "--swiglu" in args
    if "--ffn-hidden-size" in args:
        ffn = _int("--ffn-hidden-size", args["--ffn-hidden-size"])
    else:
        ffn = int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden
    family = "moe" if experts else "llama" if swiglu or kv != heads else "gpt"
    norm = args.get("--normalization", ["LayerNorm"])[0]
    if norm not in ("LayerNorm", "RMSNorm"):
        raise ShardplanError(f"--normalization is LayerNorm or RMSNorm, got {norm!r}")
    pos = args.get("--position-embedding-type", ["learned_absolute"])[0]
    if pos not in ("learned_absolute", "rope", "mrope", "relative", "yarn", "none"):
        raise ShardplanError(f"unknown --position-embedding-type {pos!r}")
    untied = "--untie-embeddings-and-output-weights" in args
    want = {"gpt": ("LayerNorm", "learned_absolute", False), "llama": ("RMSNorm", "rope", True),
            "moe": ("RMSNorm", "yarn" if pos == "yarn" else "rope", True)}
    w_norm, w_pos, w_untied = want[family]
    what = {"llama": "Llama-style (SwiGLU / grouped queries)", "gpt": "GPT",
            "moe": "mixture-of-experts"}[family]
    if norm != w_norm:
        notes.append(f"--normalization {norm} is modelled as the {what} model's {w_norm}")
    if pos != w_pos:
        notes.append(f"--position-embedding-type {pos} is modelled as the {what} model's "
                     f"{w_pos}")
    if untied != w_untied:
        notes.append(f"{'untied' if untied else 'tied'} embedding and output weights are "
                     f"modelled as the {what} model's {'untied' if w_untied else 'tied'} ones")
    if family == "gpt" and "--max-position-embeddings" in args and pos == "learned_absolute":
        maxpos = _int("--max-position-embeddings", args["--max-position-embeddings"])
        if maxpos < seq:
            raise ShardplanError(f"--seq-length {seq} is longer than "
                                 f"--max-position-embeddings {maxpos}")
    vocab = _padded_vocab(args, tp)
    if experts:
        return moe.moe_dims(args, {"hidden": hidden, "layers": layers, "heads": heads,
                                   "kv_heads": kv, "ffn": ffn, "vocab": vocab, "seq": seq},
                            notes)
    # ModelDims refuses these too; here in the arguments' own names
    if hidden % heads:
        raise ShardplanError(f"--hidden-size {hidden} is not a multiple of "
                             f"--num-attention-heads {heads}")
    if heads % kv:
        raise ShardplanError(f"--num-attention-heads {heads} is not a multiple of "
                             f"--num-query-groups {kv}")
    return ModelDims(family=family, hidden=hidden, num_layers=layers, num_heads=heads,
                     num_kv_heads=kv, ffn=ffn, vocab=vocab, seq_len=seq)


def _recompute(args: Mapping[str, list[str]], layers_per_chunk: int, notes: list[str]) -> str:
    gran = args.get("--recompute-granularity", [None])[0]
    if gran is None and "--checkpoint-activations" in args:
        # Megatron-LM before 2022 (and Megatron-DeepSpeed): every layer's input kept, each
        # layer recomputed in the backward -- today's full / uniform / 1 layer
        gran = "full"
    if gran is None:
        if "--recompute-activations" in args:
            return "selective"
        for extra in ("--recompute-method", "--recompute-num-layers"):
            if extra in args:
                notes.append(f"{extra} without --recompute-granularity full does nothing")
        if "--recompute-modules" in args:
            notes.append("--recompute-modules without --recompute-granularity selective does "
                         "nothing")
        return "none"
    if gran == "selective":
        if "--recompute-num-layers" in args:
            # megatron-core's TransformerConfig.__post_init__ refuses it
            raise ShardplanError("--recompute-granularity selective takes no "
                                 "--recompute-num-layers: Megatron-LM refuses it (its "
                                 "TransformerConfig: recompute_num_layers must be None)")
        if "--recompute-method" in args:
            notes.append("--recompute-method does nothing under --recompute-granularity "
                         "selective (it always recomputes every layer's attention)")
        return "selective"
    if "--recompute-modules" in args:
        notes.append("--recompute-modules without --recompute-granularity selective does "
                     "nothing")
    if gran != "full":
        raise ShardplanError(f"--recompute-granularity is full or selective, got {gran!r}")
    if "--recompute-granularity" in args:
        # megatron-core's TransformerConfig.__post_init__: "Using recompute_granularity: full
        # so recompute_method must be "block" or "uniform"", and recompute_num_layers set
        for need in ("--recompute-method", "--recompute-num-layers"):
            if need not in args:
                raise ShardplanError(f"--recompute-granularity full needs {need}: Megatron-LM "
                                     f"refuses full recompute without it (its "
                                     f"TransformerConfig: recompute_method must be block or "
                                     f"uniform, recompute_num_layers between 1 and the layers "
                                     f"per pipeline rank)")
    method = args.get("--recompute-method", ["uniform"])[0]
    if method not in ("uniform", "block"):
        raise ShardplanError(f"--recompute-method is uniform or block, got {method!r}")
    n = _int("--recompute-num-layers", args.get("--recompute-num-layers", ["1"]))
    if method == "uniform" and n > 1:
        notes.append(f"--recompute-method uniform --recompute-num-layers {n} (one checkpoint "
                     f"per {n} layers) is modelled as every layer's input kept")
    if method == "block" and n < layers_per_chunk:
        notes.append(f"--recompute-method block --recompute-num-layers {n} recomputes {n} of "
                     f"each stage's {layers_per_chunk} layers: modelled as all of them")
    return "full"


def _deepspeed(args: Mapping[str, list[str]], pp: int, notes: list[str]
               ) -> tuple[bool, str] | None:
    """Megatron-DeepSpeed's ZeRO (``--deepspeed --zero-stage N``): (fully sharded, gradient
    sync), or None when the run does not use DeepSpeed."""
    stage_arg = args.get("--zero-stage")
    if "--deepspeed" not in args:
        if stage_arg is not None:
            notes.append("--zero-stage without --deepspeed does nothing (DeepSpeed is off)")
        return None
    for flag in ("--use-torch-fsdp2", "--use-megatron-fsdp", "--use-custom-fsdp",
                 "--use-distributed-optimizer"):
        if flag in args:
            raise ShardplanError(f"--deepspeed and {flag} exclude each other")
    for key in ("--deepspeed_config", "--deepspeed-config"):
        if key in args:
            notes.append(f"{key} is not read: DeepSpeed's ZeRO defaults are assumed (buckets "
                         f"of stage3_prefetch_bucket_size 5e7 and reduce_bucket_size 5e8)")
    stage = _int("--zero-stage", stage_arg or ["0"], 0)
    if stage > 3:
        raise ShardplanError(f"--zero-stage is 0, 1, 2 or 3, got {stage}")
    if stage >= 2 and pp > 1:
        raise ShardplanError(f"DeepSpeed's pipeline engine runs ZeRO stage 0 or 1, not "
                             f"--zero-stage {stage} with --pipeline-model-parallel-size {pp}")
    if stage == 3:
        return True, "sharded"
    if stage == 2:
        notes.append("--zero-stage 2 is modelled as stage 1: gradients are not kept sharded")
    return False, "zero1" if stage else "end"


def _sharding(args: Mapping[str, list[str]], notes: list[str], pp: int = 1
              ) -> tuple[bool, str]:
    """(fully sharded data parallelism, gradient sync)."""
    deepspeed = _deepspeed(args, pp, notes)
    if deepspeed is not None:
        return deepspeed
    fsdp2 = "--use-torch-fsdp2" in args
    mfsdp = "--use-megatron-fsdp" in args or "--use-custom-fsdp" in args
    dist_opt = "--use-distributed-optimizer" in args
    strategy = args.get("--data-parallel-sharding-strategy", [None])[0]
    if strategy not in (None, "no_shard", "optim", "optim_grads", "optim_grads_params"):
        raise ShardplanError(f"unknown --data-parallel-sharding-strategy {strategy!r}")
    if fsdp2 and mfsdp:
        raise ShardplanError("--use-torch-fsdp2 and --use-megatron-fsdp exclude each other")
    if fsdp2:
        if strategy not in (None, "optim_grads_params"):
            notes.append(f"--data-parallel-sharding-strategy {strategy} applies to Megatron "
                         f"FSDP; --use-torch-fsdp2 shards everything (ZeRO-3)")
        return True, "sharded"
    if mfsdp:
        if strategy is None:  # Megatron-LM's default strategy
            notes.append("--use-megatron-fsdp without --data-parallel-sharding-strategy shards "
                         "nothing (Megatron-LM's default no_shard): modelled as DDP")
            strategy = "no_shard"
        if strategy == "optim_grads_params":
            return True, "sharded"
        if strategy == "optim_grads":
            notes.append("--data-parallel-sharding-strategy optim_grads (ZeRO-2) is modelled "
                         "as ZeRO-1: gradients are not kept sharded")
            return False, "zero1"
        if strategy == "optim":
            return False, "zero1"
        return False, "bucketed" if "--overlap-grad-reduce" in args else "end"
    if strategy is not None and strategy != "no_shard":
        notes.append(f"--data-parallel-sharding-strategy {strategy} needs --use-megatron-fsdp:"
                     f" ignored, as Megatron-LM ignores it")
    if dist_opt:
        return False, "zero1"
    return False, "bucketed" if "--overlap-grad-reduce" in args else "end"


#: Megatron-DeepSpeed's ``--pp-partition-method`` values read (DeepSpeed's
#: ``PipelineModule(partition_method=...)``): the blocks alone balanced, or the blocks and
#: the two embedding layers (input embedding, tied output head) balanced together.
_PARTITION_METHODS = ("type:transformer", "type:transformer|embedding")


def _stage_layers(args: Mapping[str, list[str]], num_layers: int, pp: int, vp: int,
                  first: int | None, last: int | None, notes: list[str]
                  ) -> tuple[int, ...] | None:
    """Blocks per virtual stage as the run's stack splits them (None: even).

    Megatron-Core: ``--decoder-first/last-pipeline-num-layers``, or
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``
    (the embedding / the loss counted as one layer of the first / last virtual stage; Megatron
    requires the total to divide by pp x vp). Megatron-DeepSpeed (``--deepspeed`` with a
    pipeline): ``--pp-partition-method``, DeepSpeed's ``PipelineModule`` balancing its
    layers over the stages (default ``type:transformer``, the blocks alone), so a block count
    that does not divide is split with the extra blocks on the first stages.
    """
    emb = "--account-for-embedding-in-pipeline-split" in args
    loss = "--account-for-loss-in-pipeline-split" in args
    method = args.get("--pp-partition-method", [None])[0]
    if emb or loss:
        if first is not None or last is not None:
            raise ShardplanError("--account-for-embedding/loss-in-pipeline-split and "
                                 "--decoder-first/last-pipeline-num-layers exclude each other")
        total = num_layers + int(emb) + int(loss)
        if total % (pp * vp):
            raise ShardplanError(f"{num_layers} layers with the embedding and loss counted "
                                 f"({total}) do not divide evenly over pp x vp = {pp * vp} "
                                 f"pipeline stages, as Megatron-Core requires")
        return balanced_stage_layers(num_layers, pp * vp, embedding=emb, loss=loss)
    if "--deepspeed" in args and pp > 1:
        method = method or "type:transformer"
        if method not in _PARTITION_METHODS:
            raise ShardplanError(f"--pp-partition-method is one of "
                                 f"{', '.join(_PARTITION_METHODS)}, got {method!r}")
        if first is not None or last is not None or vp > 1:
            raise ShardplanError("DeepSpeed's pipeline engine has neither uneven "
                                 "--decoder-first/last-pipeline-num-layers nor virtual stages")
        both = method.endswith("|embedding")
        return balanced_stage_layers(num_layers, pp, embedding=both, loss=both)
    if method is not None:
        notes.append("--pp-partition-method without --deepspeed and a pipeline does nothing")
    return uneven_stage_layers(num_layers, pp, vp, first, last)


def _pipeline(args: Mapping[str, list[str]], num_layers: int, pp: int, notes: list[str]
              ) -> tuple[int, tuple[int, ...] | None]:
    """``(vp, stage_layers)``: virtual stages per pipeline rank and the blocks of each
    (None: even), from ``--num-virtual-stages-per-pipeline-rank`` or
    ``--num-layers-per-virtual-pipeline-stage`` with the uneven splits of
    :func:`_stage_layers`, or from ``--pipeline-model-parallel-layout``, which excludes them
    all (Megatron-LM's ``validate_args``, megatron-core's ``TransformerConfig``)."""
    per_vp = args.get("--num-layers-per-virtual-pipeline-stage")
    per_rank = args.get("--num-virtual-stages-per-pipeline-rank")
    first = _int("--decoder-first-pipeline-num-layers", args["--decoder-first-pipeline-num-layers"],
                 0) if "--decoder-first-pipeline-num-layers" in args else None
    last = _int("--decoder-last-pipeline-num-layers", args["--decoder-last-pipeline-num-layers"],
                0) if "--decoder-last-pipeline-num-layers" in args else None
    mtp = _int("--mtp-num-layers", args["--mtp-num-layers"], 0) \
        if "--mtp-num-layers" in args else 0
    if mtp:
        notes.append(f"--mtp-num-layers {mtp}: multi-token prediction layers are not modelled")
    if "--pipeline-model-parallel-layout" in args:
        if per_vp or per_rank:
            raise ShardplanError("--pipeline-model-parallel-layout sets the virtual stages: "
                                 "Megatron-LM refuses it with --num-layers-per-virtual-"
                                 "pipeline-stage or --num-virtual-stages-per-pipeline-rank")
        others = [a for a in ("--decoder-first-pipeline-num-layers",
                              "--decoder-last-pipeline-num-layers",
                              "--account-for-embedding-in-pipeline-split",
                              "--account-for-loss-in-pipeline-split") if a in args]
        if others:
            raise ShardplanError(f"--pipeline-model-parallel-layout and {others[0]} exclude "
                                 f"each other (megatron-core's TransformerConfig)")
        return moe.layout_stages(args["--pipeline-model-parallel-layout"][0], pp, num_layers,
                                 mtp, notes)
    if per_vp and per_rank:
        raise ShardplanError("give --num-layers-per-virtual-pipeline-stage or "
                             "--num-virtual-stages-per-pipeline-rank, not both")
    vp = 1
    if per_rank:
        vp = _int("--num-virtual-stages-per-pipeline-rank", per_rank)
    elif per_vp:
        n = _int("--num-layers-per-virtual-pipeline-stage", per_vp)
        if first is not None or last is not None:
            raise ShardplanError("uneven first/last pipeline stages go with "
                                 "--num-virtual-stages-per-pipeline-rank")
        if num_layers % (pp * n):
            raise ShardplanError(f"{num_layers} layers are not a multiple of pp {pp} x "
                                 f"{n} layers per virtual stage")
        vp = num_layers // (pp * n)
    return vp, _stage_layers(args, num_layers, pp, vp, first, last, notes)


def _stack(args: Mapping[str, list[str]]) -> str:
    """The software the arguments run (:attr:`~shardplan.ir.ExecutionSettings.stack`):
    Megatron-DeepSpeed with ``--deepspeed``; Megatron's own modules, every tensor autograd
    keeps, with ``--transformer-impl local`` or ``--use-legacy-models``; else Megatron-Core
    with Transformer Engine, Megatron-LM's default ``--transformer-impl
    transformer_engine``."""
    impl = args.get("--transformer-impl", ["transformer_engine"])[0]
    if impl not in ("transformer_engine", "local", "inference_optimized"):
        raise ShardplanError(f"--transformer-impl is transformer_engine or local, got "
                             f"{impl!r}")
    if "--deepspeed" in args:
        return "megatron-deepspeed"
    if impl == "local" or "--use-legacy-models" in args:
        return "megatron"
    return "megatron-core"


def parse_megatron(text: str, *, num_gpus: int | None = None, cluster: str | None = None
                   ) -> RunConfig:
    """Read a Megatron-LM argument string into a checked :class:`RunConfig`.

    Parameters
    ----------
    text : str
        The arguments, as given to ``pretrain_gpt.py`` (quoted as a shell quotes them).
    num_gpus : int, optional
        GPUs of the cluster: the data-parallel size is ``num_gpus / (tp x pp x cp)``.
    cluster : str, optional
        The cluster spec, recorded in the result.

    Returns
    -------
    RunConfig
        With ``notes`` naming every argument that changes the run and is not modelled.

    Raises
    ------
    ShardplanError
        A missing or malformed argument, or an inconsistent run (:class:`RunConfig`).

    Notes
    -----
    Megatron-LM's choices kept: ``--sequence-parallel`` is switched off without tensor
    parallelism (with a note), as Megatron does; the interleaved schedule is used when a
    pipeline rank holds more than one virtual stage; the fp8 formats count as ``fp8``.
    O(number of arguments).

    Examples
    --------
    >>> run = parse_megatron("--num-layers 24 --hidden-size 1024 --num-attention-heads 16 "
    ...                      "--seq-length 1024 --vocab-size 50257 --micro-batch-size 4 "
    ...                      "--global-batch-size 64 --tensor-model-parallel-size 2 --bf16",
    ...                      num_gpus=8)
    >>> run.parallel.label(), run.model.vocab, run.microbatches
    ('TP 2 x DP 4', 50432, 4)
    """
    args, notes = _read(text)
    tp = _int("--tensor-model-parallel-size", args.get("--tensor-model-parallel-size", ["1"]))
    pp = _int("--pipeline-model-parallel-size", args.get("--pipeline-model-parallel-size",
                                                         ["1"]))
    cp = _int("--context-parallel-size", args.get("--context-parallel-size", ["1"]))
    model = _model(args, tp, notes)
    vp, stage_layers = _pipeline(args, model.num_layers, pp, notes)
    if "--no-pipeline-parallel" in args and pp > 1:
        raise ShardplanError(f"--no-pipeline-parallel and --pipeline-model-parallel-size {pp} "
                             f"contradict each other")
    fsdp, sync = _sharding(args, notes, pp)
    shard_unit = "module" if fsdp and "--deepspeed" in args else "block"
    model_parallel = tp * pp * cp
    dp_given = (_int("--data-parallel-size", args["--data-parallel-size"])
                if "--data-parallel-size" in args else None)
    if num_gpus is not None:
        if num_gpus % model_parallel:
            raise ShardplanError(f"the cluster's {num_gpus} GPUs are not a multiple of tp x pp x "
                                 f"cp = {model_parallel}")
        dp = num_gpus // model_parallel
        if dp_given is not None and dp_given != dp:
            raise ShardplanError(f"--data-parallel-size {dp_given} and the cluster's {num_gpus} "
                                 f"GPUs / (tp x pp x cp = {model_parallel}) = {dp} disagree")
    else:
        dp = dp_given or 1
    ep, etp = moe.expert_grid(args, tp, biases=model.moe is not None and
                              "--disable-bias-linear" not in args)
    # RunConfig refuses these too; here in the arguments' own names
    if ep > 1 and model.moe is None:
        raise ShardplanError(f"--expert-model-parallel-size {ep} needs a mixture of experts: "
                             f"give --num-experts (above 0)")
    if model.moe is not None and model.moe.num_experts % ep:
        raise ShardplanError(f"--num-experts {model.moe.num_experts} is not a multiple of "
                             f"--expert-model-parallel-size {ep}, as megatron-core requires")
    parallel = ParallelConfig(tp=tp, pp=pp, cp=cp, vp=vp, stage_layers=stage_layers,
                              dp=1 if fsdp else dp, dp_shard=dp if fsdp else 1, ep=ep, etp=etp)
    if "--micro-batch-size" not in args:
        raise ShardplanError("the batch needs --micro-batch-size")
    micro = _int("--micro-batch-size", args["--micro-batch-size"])
    glob = (_int("--global-batch-size", args["--global-batch-size"])
            if "--global-batch-size" in args else micro * dp)
    if "--fp8-format" in args:
        if args["--fp8-format"][0] not in ("e4m3", "hybrid"):
            raise ShardplanError(f"--fp8-format is e4m3 or hybrid, got "
                                 f"{args['--fp8-format'][0]!r}")
        precision = "fp8"
    elif "--fp16" in args and "--bf16" in args:
        raise ShardplanError("--fp16 and --bf16 exclude each other")
    else:
        precision = "fp16" if "--fp16" in args else "bf16" if "--bf16" in args else "fp32"
    seq_par = "--sequence-parallel" in args
    if seq_par and tp == 1:
        notes.append("--sequence-parallel without tensor parallelism is switched off, as "
                     "Megatron-LM does")
        seq_par = False
    optimizer = args.get("--optimizer", ["adam"])[0]
    if optimizer not in ("adam", "sgd"):
        raise ShardplanError(f"--optimizer is adam or sgd, got {optimizer!r}")
    if ep > 1 and tp > 1 and not seq_par:
        notes.append("megatron-core warns that expert and tensor parallelism need "
                     "--sequence-parallel")
    per_chunk = max(parallel.layers_per_stage(model.num_layers))
    # Megatron-LM's arguments.py: bf16 "requires gradient accumulation and all-reduce to be
    # performed in fp32" unless --grad-reduce-in-bf16 (DeepSpeed's engine, when it runs the
    # step, keeps its own)
    half = precision in ("bf16", "fp8")
    fp32_grads = precision != "fp32" and "--deepspeed" not in args and (
        not (half and "--grad-reduce-in-bf16" in args)
        and (half or "--accumulate-allreduce-grads-in-fp32" in args))
    execution = execution_of(parallel, micro_batch_size=micro, global_batch=glob,
                             precision=precision,
                             recompute=_recompute(args, per_chunk, notes),
                             gradient_sync=sync, sequence_parallel=seq_par,
                             tp_comm_overlap="--tp-comm-overlap" in args, optimizer=optimizer,
                             shard_unit=shard_unit,
                             grad_reduce="fp32" if fp32_grads else "param",
                             stack=_stack(args),
                             moe=moe.moe_settings(args, notes) if model.moe else None)
    if execution["recompute"] == "selective" and "--recompute-modules" in args:
        modules = tuple(args["--recompute-modules"])
        bad = [m for m in modules if m not in RECOMPUTE_MODULES]
        if bad:
            raise ShardplanError(f"--recompute-modules takes {', '.join(RECOMPUTE_MODULES)}, "
                                 f"got {' '.join(bad)}")
        execution["recompute_modules"] = modules
    if sync == "zero1":  # the distributed optimizer's bucketed overlaps (simulate._llm)
        execution.update(overlap_grad_reduce="--overlap-grad-reduce" in args,
                         overlap_param_gather="--overlap-param-gather" in args)
    return RunConfig(model=model, cluster=cluster, num_gpus=num_gpus, parallel=parallel,
                     micro_batch_size=micro, global_batch=glob, execution=execution,
                     notes=tuple(notes), source="megatron")


def _cell(row: Mapping[str, Any], key: str) -> str:
    v = row.get(key)
    return "" if v is None else str(v).strip()


def megatron_args_of_row(row: Mapping[str, Any]) -> str:
    """The Megatron-LM arguments of one row of ``gpu-runs/*.csv`` (its README's rules).

    A row gives ``hidden``, ``heads``, ``layers``, ``vocab``, ``seq``, ``tp``, ``pp``, ``vp``
    (virtual stages per rank; empty: 1), ``dp``, ``global_batch``, ``micro_batch`` (empty: not
    published; 1 is written), ``precision``, ``recompute`` (``full``: uniform, one layer;
    ``selective``), ``sequence_parallel`` (0/1) and ``optimizer_sharding`` (``zero3
    (DeepSpeed)``: Megatron-DeepSpeed's ``--deepspeed --zero-stage 3``; another ``zero3...``:
    Megatron FSDP of everything; ``zero1`` / ``distributed``: the distributed optimizer, or
    under a ``Megatron-DeepSpeed`` ``stack`` DeepSpeed's ZeRO-1; ``none (ZeRO stage 0)``
    there: ``--zero-stage 0``). Optional columns: ``cp`` (context parallelism), ``ffn``,
    ``kv_heads`` and a ``model`` naming Llama (a Llama-style model: SwiGLU, RMSNorm, rotary
    positions, grouped queries, untied head), a ``notes`` naming DeepSpeed's partition method
    ``type:transformer|embedding``. A ``Megatron-Core`` row whose blocks do not divide over
    ``pp x vp`` virtual stages but do with the embedding and loss counted as layers takes
    ``--account-for-embedding/loss-in-pipeline-split``: the one split Megatron-Core accepts
    for it. Virtual stages go in as
    ``--num-virtual-stages-per-pipeline-rank``; the data-parallel size as shardplan's
    ``--data-parallel-size``.

    A mixture of experts (``experts`` above 1, or ``ep`` above 1) takes ``--num-experts``,
    ``--moe-router-topk`` (``topk``), ``--moe-ffn-hidden-size`` (``moe_ffn``),
    ``--expert-model-parallel-size`` (``ep``), the optional ``etp`` as
    ``--expert-tensor-parallel-size``, RMSNorm, rotary positions and untied embeddings, and
    its vocabulary as ``--padded-vocab-size``: Megatron-Bridge and NeMo 2.0, which ran such
    rows, keep a Hugging Face model's vocabulary unpadded (their ``should_pad_vocab`` is
    False). Two optional columns carry what the others cannot: ``megatron_args`` (further
    arguments of the architecture and of the stack's MoE settings, written as they are;
    ``--swiglu`` unless they name ``--quick-geglu``) and ``layout`` (a
    ``--pipeline-model-parallel-layout`` of ``pp x vp`` stages, written instead of the virtual
    stages).
    """
    def num(key: str, default: int | None = None) -> int:
        text = _cell(row, key)
        if not text:
            if default is None:
                raise ShardplanError(f"row {_cell(row, 'id') or '?'} has no {key}")
            return default
        try:
            return int(float(text))
        except ValueError:
            raise ShardplanError(f"row {_cell(row, 'id') or '?'}: {key} is not a number: "
                                 f"{text!r}") from None

    layers, pp, vp, heads = num("layers"), num("pp", 1), num("vp", 1), num("heads")
    experts = num("experts", 1) > 1 or num("ep", 1) > 1
    out = ["--num-layers", str(layers), "--hidden-size", str(num("hidden")),
           "--num-attention-heads", str(heads), "--seq-length", str(num("seq")),
           "--max-position-embeddings", str(num("seq")),
           "--padded-vocab-size" if experts else "--vocab-size", str(num("vocab")),
           "--micro-batch-size", str(num("micro_batch", 1)),
           "--global-batch-size", str(num("global_batch")),
           "--tensor-model-parallel-size", str(num("tp", 1)),
           "--pipeline-model-parallel-size", str(pp),
           "--data-parallel-size", str(num("dp", 1))]
    if num("cp", 1) > 1:
        out += ["--context-parallel-size", str(num("cp"))]
    kv = num("kv_heads", heads)
    if "llama" in _cell(row, "model").lower():
        out += ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                "--untie-embeddings-and-output-weights"]
    if kv != heads:
        out += ["--group-query-attention", "--num-query-groups", str(kv)]
    if _cell(row, "ffn"):
        out += ["--ffn-hidden-size", str(num("ffn"))]
    if experts:
        out += _row_experts(row, num)
    layout = _cell(row, "layout")
    if layout:
        out += ["--pipeline-model-parallel-layout", layout]
    elif vp > 1:
        out += ["--num-virtual-stages-per-pipeline-rank", str(vp)]
    stack = _cell(row, "stack").lower()
    if not layout and layers % (pp * vp) and not (layers + 2) % (pp * vp) and (
            "megatron-core" in stack or "megatron-bridge" in stack):
        # the one split Megatron-Core accepts for such a count (126 blocks over pp 8 x vp 8:
        # uneven first/last ranks would need their blocks to divide by vp)
        out += ["--account-for-embedding-in-pipeline-split",
                "--account-for-loss-in-pipeline-split"]
    precision = _cell(row, "precision").lower()
    if precision in ("fp16", "bf16"):
        out.append(f"--{precision}")
    elif precision == "fp8":
        out += ["--bf16", "--fp8-format", "hybrid"]
    recompute = _cell(row, "recompute").lower()
    if recompute == "full":
        out += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1"]
    elif recompute == "selective":
        out += ["--recompute-granularity", "selective"]
    if _cell(row, "sequence_parallel") in ("1", "true", "True"):
        out.append("--sequence-parallel")
    out += _row_sharding(row, pp)
    return shlex.join(out)


def _row_experts(row: Mapping[str, Any], num: Any) -> list[str]:
    """The mixture-of-experts arguments of a row (:func:`megatron_args_of_row`)."""
    extra = shlex.split(_cell(row, "megatron_args"))
    out = ["--normalization", "RMSNorm", "--position-embedding-type", "rope",
           "--untie-embeddings-and-output-weights",
           "--num-experts", str(num("experts")), "--moe-router-topk", str(num("topk")),
           "--moe-ffn-hidden-size", str(num("moe_ffn")),
           "--expert-model-parallel-size", str(num("ep", 1))]
    if _cell(row, "etp"):
        out += ["--expert-tensor-parallel-size", str(num("etp"))]
    if "--quick-geglu" not in extra and "--swiglu" not in extra:
        out.append("--swiglu")
    return out + extra


def _row_sharding(row: Mapping[str, Any], pp: int) -> list[str]:
    """The data-parallel sharding arguments of a row (:func:`megatron_args_of_row`), and
    ``--transformer-impl local`` for a row of Megatron-LM before Megatron-Core and
    Transformer Engine (a row with no ``stack``: the 2020-2022 papers)."""
    sharding = _cell(row, "optimizer_sharding").lower()
    legacy = [] if _cell(row, "stack") else ["--transformer-impl", "local"]
    if "megatron-deepspeed" in _cell(row, "stack").lower():
        stage = 3 if sharding.startswith("zero3") else 1 if sharding.startswith("zero1") else 0
        out = ["--deepspeed", "--zero-stage", str(stage)]
        if pp > 1 and "type:transformer|embedding" in _cell(row, "notes"):
            out += ["--pp-partition-method", "type:transformer|embedding"]
        return out
    if sharding.startswith("zero3") and "deepspeed" in sharding:
        return ["--deepspeed", "--zero-stage", "3"]
    if sharding.startswith("zero3"):
        return legacy + ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                         "optim_grads_params"]
    if sharding.startswith(("zero1", "distributed")):
        return legacy + ["--use-distributed-optimizer"]
    return legacy
