"""The target: a stock mlx_lm model with hidden-state taps and a logits head.

Nothing here patches a class. Taps are small wrapper modules placed on the
model *instance* (`backbone.layers[i] = Tap(layer)`), so the model's own
forward loop runs unchanged and other instances are untouched. The block
kernels are one `kernels.BlockPath`, chosen once; its `Fitting` puts their
wrappers on the instance only inside `forward`.
"""

import copy
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import gather_last_axis
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

from .cache import BucketKVCache
from .kernels import BlockPath
from .wrapper import Wrapper


class Capture:
    """Plain holder so captured arrays never become module parameters."""

    __slots__ = ("on", "flush", "inputs", "outputs")

    def __init__(self):
        self.on = False
        self.flush = False
        self.inputs = None
        self.outputs = None


class Tap(Wrapper):
    """Wraps one module instance and records its first input and its output.

    A tap with `flush` set also starts evaluating the output while the forward
    is still being built (see `Target.forward(flush=True)`).
    """

    def __init__(self, inner: nn.Module, keep_input: bool = False):
        super().__init__(inner)
        self._capture = Capture()
        self._keep_input = keep_input
        self._flush = False

    def __call__(self, *args, **kwargs):
        return self.seen(args[0] if args else None, self.inner(*args, **kwargs))

    @property
    def recording(self) -> bool:
        """Whether `seen` keeps what it is given now."""
        return self._capture.on

    def seen(self, x, out):
        """Record `out` as this module's output for input `x` (also for a
        caller that computed it in a launch of its own: kernels/gdn.py)."""
        c = self._capture
        if c.on:
            c.inputs = x if self._keep_input else None
            c.outputs = out
        if self._flush and c.flush:
            mx.async_eval(out)
        return out


def _unwrap(module):
    return module.inner if isinstance(module, Tap) else module


class LocalLayers:
    """The layers a pipeline rank holds, as a list indexed from 0; reads and
    writes go to the model's own list (mlx_lm's `pipeline` leaves None
    before `first` and cuts the list after this rank's last layer)."""

    def __init__(self, layers: list, first: int):
        self._layers, self._first = layers, first

    def __len__(self):
        return len(self._layers) - self._first

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._layers[self._first + i]

    def __setitem__(self, i: int, module):
        if not 0 <= i < len(self):
            raise IndexError(i)
        self._layers[self._first + i] = module

    def __iter__(self):
        return iter(self._layers[self._first :])


@dataclass
class LayerKind:
    mixer: str  # "attention" or "gated_delta"
    moe: bool


@dataclass
class DeltaTaps:
    """Taps on one GatedDeltaNet layer: what rollback needs to replay its steps."""

    layer: nn.Module  # the stock GatedDeltaNet module
    conv: Tap
    a: Tap
    b: Tap


class Target:
    """A stock mlx_lm model seen through the few operations decoding needs.

    Args:
        model: a model from `mlx_lm.load` (or built from its `ModelArgs`).
        capture_layers: ids of the layers whose outputs the drafter reads
          (DFlash `target_layer_ids`); empty for drafters that need none.
        flush_every: with `forward(flush=True)`, start evaluating every n-th
          layer's output while the rest of the graph is still being built.
          Default: the block path's (4 on CUDA, where building and launching
          a verify graph costs about as long as running it,
          bench/results/speed.md; off elsewhere).
        flush_first: the first such start comes after this many layers
          (default: `flush_every`), the next ones every `flush_every` after it.
        block_attention_from: verify blocks attend with plain ops
          (kernels/attention.py) once they see this many keys, in the layer
          classes that module mirrors. Default: 4096 on CUDA, where MLX's
          fused call goes to cuDNN and is slower there; never elsewhere.
        block_linear: blocks of 2-64 rows (verify blocks, draft blocks) go
          through the linear layers with one kernel each (kernels/matmul.py)
          instead of a cuBLAS call whose host cost exceeds its device time.
          Default: on CUDA; the kernel exists only there.
        attention_kernel: verify blocks of the layers kernels/attention.py
          mirrors attend through kernels/flash.py (per-head norms and RoPE in
          one launch, split-K attention over the valid keys) instead of some
          15 graph nodes per layer; with `block_linear` too, the DFlash
          drafters made for this target run their layers the same way.
          Default: on CUDA; the kernels exist only there.
        block_path: the `kernels.BlockPath` these three switches adjust
          (default: `BlockPath.choose()`, CUDA's kernels where MLX CUDA is).
        pipeline_group: the group of a model mlx_lm has pipelined
          (`model.pipeline(group)`): this rank holds a range of the layers;
          the captured layers held by other ranks arrive through one all_sum
          of the features a forward.
    """

    def __init__(
        self,
        model: nn.Module,
        capture_layers: Sequence[int] = (),
        flush_every: Optional[int] = None,
        flush_first: Optional[int] = None,
        block_attention_from: Optional[int] = None,
        block_linear: Optional[bool] = None,
        attention_kernel: Optional[bool] = None,
        block_path: Optional[BlockPath] = None,
        pipeline_group: Optional[Any] = None,
    ):
        self.model = model
        # Qwen3.5 / VLM-style checkpoints nest the text model one level down.
        self.lm = model["language_model"] if "language_model" in model else model
        self.backbone = self.lm.model
        self.embed_tokens = self.backbone.embed_tokens
        # Tied or untied: decide by what the instance has, since some wrapper
        # args (Qwen3.5) do not carry `tie_word_embeddings`.
        if "lm_head" in self.lm:
            self.head = self.lm.lm_head
        else:
            self.head = self.embed_tokens.as_linear
        self.layers = self.backbone.layers
        self.num_layers = len(self.layers)
        self.first, self.pipeline_group = 0, pipeline_group
        if pipeline_group is not None:  # layers first ... first+len-1 are here
            self.first = self.backbone.start_idx
            self.layers = LocalLayers(self.backbone.layers, self.first)
            self.num_layers = self.lm.args.num_hidden_layers
        self.hidden_size = self.embed_tokens.weight.shape[-1]
        if self.embed_tokens.weight.dtype == mx.uint32:  # quantized embedding
            self.hidden_size = (
                self.embed_tokens.weight.shape[-1] * 32 // self.embed_tokens.bits
            )
        self.vocab_size = self.embed_tokens.weight.shape[0]  # rows, packed or not
        self.kinds = [self._kind(_unwrap(l)) for l in self.layers]
        self.delta_taps: dict = {}
        self._layer_taps: List[Tap] = []
        self.set_capture_layers(capture_layers)
        self._install_delta_taps()
        path = block_path if block_path is not None else BlockPath.choose()
        self.path = path.but(
            linear=block_linear,
            attention=attention_kernel,
            fold_from=block_attention_from,
        )
        self._flush_taps: List[Tap] = []
        self.set_verify_flush(flush_every, flush_first)
        self.fitting = self.path.fit(self)

    # ---- structure -------------------------------------------------------------

    @staticmethod
    def _kind(layer) -> LayerKind:
        mixer = "gated_delta" if getattr(layer, "is_linear", False) else "attention"
        mlp = layer.get("mlp", None) if isinstance(layer, dict) else None
        moe = mlp is not None and any(
            k in mlp for k in ("switch_mlp", "experts", "gate")
        )
        return LayerKind(mixer=mixer, moe=moe)

    def set_capture_layers(self, ids: Sequence[int]):
        for i in ids:
            if not 0 <= i < self.num_layers:
                raise ValueError(
                    f"target layer id {i} is out of range for a "
                    f"{self.num_layers}-layer target"
                )
        self.capture_layers = list(ids)
        here = range(self.first, self.first + len(self.layers))
        # One slot per captured layer: its tap, or None where another rank has it.
        self._capture_slots = [self._tap(i - self.first) if i in here else None for i in ids]
        self._layer_taps = [t for t in self._capture_slots if t is not None]

    def _tap(self, i: int) -> Tap:
        """Layer i's tap, wrapping the layer on first use (one tap per layer)."""
        if not isinstance(self.layers[i], Tap):
            self.layers[i] = Tap(self.layers[i])
        return self.layers[i]

    def _install_delta_taps(self):
        for i, kind in enumerate(self.kinds):
            if kind.mixer != "gated_delta":
                continue
            la = _unwrap(self.layers[i]).linear_attn
            for name in ("conv1d", "in_proj_a", "in_proj_b"):
                if not isinstance(la[name], Tap):
                    la[name] = Tap(la[name], keep_input=(name == "conv1d"))
            self.delta_taps[i] = DeltaTaps(la, la.conv1d, la.in_proj_a, la.in_proj_b)

    def set_verify_flush(self, every: Optional[int] = None, first: Optional[int] = None):
        """Which layers' outputs `forward(flush=True)` starts while it builds
        the rest: after `first` layers, then every `every` (see __init__)."""
        if every is None:
            every = self.path.flush_every
        first = every if first is None else first
        if every < 0 or first < 0 or (every == 0) != (first == 0):
            raise ValueError(f"verify flush every {every} from {first}: both 0 (off) or > 0")
        for t in self._flush_taps:
            t._flush = False
        layers = range(first - 1, self.num_layers, every) if every > 0 else ()
        self._flush_taps = [self._tap(i) for i in layers]
        for t in self._flush_taps:
            t._flush = True

    def set_block_linear(self, on: Optional[bool]):
        """Switch the linear kernel on or off (None: the default) for later
        forwards and for drafters made after this call."""
        self._refit(linear=on)

    def set_attention_kernel(self, on: Optional[bool]):
        """Switch flash.py's attention on or off (None: the default) for later
        forwards and for drafters made after this call."""
        self._refit(attention=on)

    def set_draft_flush(self, every: Optional[int]):
        """Start every n-th layer of a DFlash draft pass while the rest is
        built (0: off; None: the default) for drafters made after this call."""
        self._refit(draft_flush_every=every)

    def _refit(self, **switches):
        self.path = self.path.but(**switches)
        self.fitting = self.path.fit(self)

    @property
    def block_linear(self) -> bool:
        return self.path.linear

    @property
    def attention_kernel(self) -> bool:
        return self.path.attention

    def make_cache(self, bucket: Optional[bool] = None) -> List[Any]:
        """The model's own cache list, with plain KV caches made bucketed.

        Args:
            bucket: use `BucketKVCache` for attention layers (padded key length,
              explicit mask). Default: the block path's (on CUDA only,
              where attention kernels are compiled per key length).
        """
        if bucket is None:
            bucket = self.path.bucket
        if hasattr(self.model, "make_cache"):
            cache = self.model.make_cache()
        else:
            cache = [KVCache() for _ in self.layers]
        if bucket:
            cache = [BucketKVCache() if type(c) is KVCache else c for c in cache]
        for c in cache:
            if not isinstance(c, (KVCache, QuantizedKVCache, ArraysCache)):
                raise ValueError(
                    f"cache type {type(c).__name__} cannot be rolled back exactly "
                    "(sliding-window / rotating caches are not supported)"
                )
        return cache

    # ---- forward ---------------------------------------------------------------

    def forward(
        self,
        tokens: mx.array,
        cache: List[Any],
        *,
        last_only: bool = False,
        flush: bool = False,
    ):
        """Run the stock model on `tokens` (shape (1, S), or (B, S) over a
        batch's `RaggedCache`) with `cache`.

        Returns `(logits, features)`: logits for every row, or only the last
        row when `last_only`; features are the captured layer outputs
        concatenated on the last axis (None when nothing is captured).
        `flush` lets the device start on the first layers while Python builds
        the rest (never inside `mx.compile` / `mx.grad`, which cannot eval).
        """
        taps = self._layer_taps + [
            t for d in self.delta_taps.values() for t in (d.conv, d.a, d.b)
        ]
        for t in taps:
            t._capture.on = True
        for t in self._flush_taps:
            t._capture.flush = flush
        try:
            with self.fitting:
                h = self.backbone(tokens, cache)
        finally:
            for t in taps:
                t._capture.on = False
            for t in self._flush_taps:
                t._capture.flush = False
        if last_only:
            h = h[:, -1:]
        logits = self.logits(h)
        features = None
        if self._capture_slots:
            blank = None  # a layer another pipeline rank holds adds zeros here
            if None in self._capture_slots:
                blank = mx.zeros((*tokens.shape, self.hidden_size), dtype=h.dtype)
            features = mx.concatenate(
                [blank if t is None else t._capture.outputs for t in self._capture_slots],
                axis=-1,
            )
            if self.pipeline_group is not None:  # each rank adds the layers it has
                # After the pipeline's own send/recv and gather (through `h`):
                # a rank that ran this all_sum first would wait on its peer,
                # while that peer waits in recv for this rank's send.
                features = mx.depends(features, h)
                features = mx.distributed.all_sum(features, group=self.pipeline_group)
        return logits, features

    def logits(self, h: mx.array) -> mx.array:
        """The LM head on hidden states `h` (one kernel for 2-64 rows where the
        block path has it). A head split by vocabulary across ranks (mlx_lm's
        `shard`: `lm.sharding_group`) is gathered, as the model's own
        `__call__` does, so every rank decides on the whole vocabulary."""
        logits = self.fitting.logits(h, self.head)
        if self.head_sharded:
            logits = gather_last_axis(logits, self.lm.sharding_group)
        return logits

    @property
    def head_sharded(self) -> bool:
        """The LM head is split by vocabulary across ranks (mlx_lm's `shard`)."""
        return getattr(self.lm, "sharding_group", None) is not None

    def head_rows(self, ids: mx.array):
        """The LM head restricted to the vocabulary rows `ids` (sorted token
        ids): a function of hidden states to logits over `ids`, for a
        drafter's reduced vocabulary. Reads len(ids) of the head's rows
        instead of all of them; stock products (not the block path)."""
        if self.head_sharded:
            raise ValueError("a draft vocabulary needs the whole LM head on every rank")
        m = self.lm.lm_head if "lm_head" in self.lm else self.embed_tokens
        rows = copy.copy(m)  # same class and settings (bits, group size, mode)
        for name in ("weight", "scales", "biases", "bias"):
            if name in m:
                rows[name] = m[name][ids]
        mx.eval(rows.parameters())
        return rows if "lm_head" in self.lm else rows.as_linear

    def embed(self, tokens: mx.array) -> mx.array:
        return self.embed_tokens(tokens)
