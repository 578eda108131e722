"""`BlockPath`: the one decision whether, and which, block kernels run.

`BlockPath.choose()` is made once (a `Target` makes it, or takes one as
`block_path=`): the backend (cuda.py's `CudaKernels` where MLX CUDA is
available, else None: the plain path) and the switches `linear` (matmul.py's
products), `attention` (flash.py's), `fold_from` (attention.py's plain-ops
attention from that many keys) and `draft_flush_every` (a DFlash draft pass
starts every n-th layer's output while the rest is built; 0: off).
`fit(target)` and `fit_draft(draft)` build the wrappers once, on the
instances they mirror; a `Fitting` puts them where the stock modules sit for
the duration of `with fitting:` (one forward), and takes them off again, so
that outside it the model is stock. With no backend
and no fold, a fitting holds nothing and `with` costs two empty loops.

Layers split across ranks by mlx_lm's `shard` (`mlx.nn.layers.distributed`
linears, or a `sharding_group` whose all_sum the stock `__call__` runs) keep
the stock path: the wrappers mirror one-process layers and would drop the
collectives.
"""

import math
from dataclasses import dataclass
from typing import Any, List, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers import distributed
from mlx_lm.models.qwen3_5 import GatedDeltaNet

from ..wrapper import Wrapper
from .attention import wrap_attention
from .gdn import BlockDelta, StepStates
from .layer import DraftBlockLayer, HybridBlockLayer, wrap_hybrid, wrap_layer
from .linear import BlockLinear, plain_linears, wrap_mlp
from .matmul import QUANTIZED, Fits, blockable, weight_of

AUTO = "auto"


@dataclass(frozen=True)
class BlockPath:
    """Which block kernels run (see module docstring); `ops` None: none."""

    ops: Any
    linear: bool
    attention: bool
    fold_from: float
    draft_flush_every: int = 0

    @classmethod
    def choose(
        cls,
        backend=AUTO,
        *,
        linear: Optional[bool] = None,
        attention: Optional[bool] = None,
        fold_from: Optional[float] = None,
        draft_flush_every: Optional[int] = None,
    ) -> "BlockPath":
        """The path for `backend` ("auto": CUDA's kernels where MLX CUDA is
        available, none elsewhere; None: none; or a backend object). Each
        switch left None takes the default: on with a backend (the kernels
        exist only there), the fold from the backend's `fold_from` keys
        (never without one), the draft flush the backend's (off without
        one). A kernel switch asked on without a backend is off."""
        if isinstance(backend, str):
            if backend != AUTO:
                raise ValueError(f"backend {backend!r}: 'auto', None or a backend")
            from .cuda import CudaKernels

            backend = CudaKernels() if mx.cuda.is_available() else None
        on = backend is not None
        if fold_from is None:
            fold_from = backend.fold_from if on else math.inf
        if draft_flush_every is None:
            draft_flush_every = backend.draft_flush_every if on else 0
        if draft_flush_every < 0:
            raise ValueError(f"draft_flush_every {draft_flush_every}: 0 (off) or more")
        return cls(
            backend,
            on and (linear is None or bool(linear)),
            on and (attention is None or bool(attention)),
            fold_from,
            int(draft_flush_every),
        )

    def but(self, **switches) -> "BlockPath":
        """This path's backend with some switches changed (None: the default)."""
        now = dict(linear=self.linear, attention=self.attention)
        now["fold_from"] = self.fold_from
        now["draft_flush_every"] = self.draft_flush_every
        return BlockPath.choose(self.ops, **{**now, **switches})

    @property
    def flush_every(self) -> int:
        """`Target`'s default for `flush_every`: the backend's, else off."""
        return self.ops.flush_every if self.ops is not None else 0

    @property
    def bucket(self) -> bool:
        """`Target.make_cache`'s default: bucketed KV caches with a backend."""
        return self.ops is not None and self.ops.bucket

    def fit(self, target) -> "Fitting":
        """The wrappers for `target`'s verify blocks, built on its mirrored
        instances: whole decoder layers (layer.py) with the linear kernel on,
        else the attention (fold from `fold_from` keys, fused q/k/v, flash.py)
        and the MLP separately; `BlockLinear` on the plain Linear layers those
        leave; the fused GatedDeltaNet; and the head for `logits`."""
        f = Fitting(self.ops)
        ops, kernel = self.ops, self.attention
        own = self.fold_from != math.inf or self.attention
        shards = set()  # ids of the modules in sharded layers: stock only
        for i, layer in enumerate(target.layers):
            inner = _inner(layer)
            if not isinstance(inner, dict):
                continue
            if sharded(inner):
                shards |= {id(m) for _, m in inner.named_modules()}
                continue
            if ops is not None:
                la = inner.get("linear_attn", None)
                if type(la) is GatedDeltaNet:
                    la.step_states = StepStates(ops)
                    f.slots.append(
                        (inner, "linear_attn", la, BlockDelta(la, ops, self.linear))
                    )
            hybrid = None
            if self.linear:
                wrapped = wrap_layer(inner, self.fold_from, ops, kernel)
                if wrapped is not None:
                    f.layers.append((target.layers, i, inner, wrapped))
                    continue
                hybrid = wrap_hybrid(inner, ops)
                if hybrid is not None:  # its mixer keeps its own wrappers
                    f.layers.append((target.layers, i, inner, hybrid))
            attn, mlp = inner.get("self_attn", None), inner.get("mlp", None)
            if attn is not None and (own or self.linear):
                wrapped = wrap_attention(attn, self.fold_from, ops, self.linear, kernel)
                if wrapped is not None:
                    f.attention.append(wrapped)
                    f.slots.append((inner, "self_attn", attn, wrapped))
            if mlp is not None and self.linear and not (hybrid and hybrid.mlp_folds):
                wrapped = wrap_mlp(mlp, ops)
                if wrapped is not None:
                    f.mlp.append(wrapped)
                    f.slots.append((inner, "mlp", mlp, wrapped))
        if self.linear:
            # Whole wrapped layers launch their products themselves: no
            # wrapper there (a verify would put on ~250 for nothing).
            inside = {id(m) for *_, w in f.layers for m in _launched(w)}
            f.add_linears(target.backbone, skip=inside | shards)
            head = target.lm.get("lm_head", None) or target.embed_tokens
            heads = (nn.Linear, nn.Embedding, *QUANTIZED)
            if (
                type(head) in heads
                and "bias" not in head
                and not sharded(target.lm, own_only=True)
            ):
                f.head = head
        return f

    def fit_draft(self, draft) -> "Fitting":
        """The wrappers for a DFlash draft's blocks: with both kernels on,
        its layers in fused launches (layer.py); with the linear kernel,
        `BlockLinear` on every plain Linear. Sets the draft attention's fold
        from `fold_from` keys."""
        f = Fitting(self.ops)
        for i, layer in enumerate(draft.layers):
            layer.self_attn.from_keys = self.fold_from
            if self.linear and self.attention:
                wrapped = DraftBlockLayer(layer, self.ops)
                f.layers.append((draft.layers, i, layer, wrapped))
        if self.linear:
            f.add_linears(draft)
        return f


SHARDED_LINEARS = (
    distributed.AllToShardedLinear,
    distributed.ShardedToAllLinear,
    distributed.QuantizedAllToShardedLinear,
    distributed.QuantizedShardedToAllLinear,
)


def sharded(module: nn.Module, own_only: bool = False) -> bool:
    """Whether `module` (or, unless `own_only`, a module under it) was split
    across ranks by mlx_lm's `shard`: a distributed linear, or a
    `sharding_group` set for the collectives its own `__call__` runs."""
    mods = [module] if own_only else [m for _, m in module.named_modules()]
    return any(
        isinstance(m, SHARDED_LINEARS) or getattr(m, "sharding_group", None) is not None
        for m in mods
    )


def _inner(module):
    """The module an outer wrapper (a `Tap`) holds, else `module`."""
    return module["inner"] if isinstance(module, Wrapper) else module


class Fitting:
    """Wrappers built once for one model; `with fitting:` puts them on the
    instance (dict and list item assignments, no class changes) and takes
    them off again.

    `layers`: (list, index, stock, wrapper) of whole layers, put in place
    under an outer wrapper (a tap) where one sits there; `slots`: (container,
    key, stock, wrapper) of everything else. `attention` and `mlp` list those
    wrappers; `linears` the stock (quantized) Linear layers given a `BlockLinear`."""

    def __init__(self, ops):
        self.ops = ops
        self.layers: List[tuple] = []
        self.slots: List[tuple] = []
        self.attention: List[Wrapper] = []
        self.mlp: List[Wrapper] = []
        self.linears: List[nn.Module] = []
        self.head: Optional[nn.Module] = None
        self.head_fits = Fits()

    def add_linears(self, root: nn.Module, skip=frozenset()):
        """`BlockLinear` for every `blockable` Linear under `root` not in `skip`."""
        for container, key, m in _children(root):
            if blockable(m) and id(m) not in skip:
                self.linears.append(m)
                self.slots.append((container, key, m, BlockLinear(m, self.ops)))

    def __enter__(self):
        for container, i, stock, wrapped in self.layers:
            _put_layer(container, i, stock, wrapped, wrapped)
        for container, key, _, wrapped in self.slots:
            container[key] = wrapped
        return self

    def __exit__(self, *exc):
        for container, key, stock, _ in self.slots:
            container[key] = stock
        for container, i, stock, wrapped in self.layers:
            _put_layer(container, i, stock, wrapped, stock)
        return False

    def logits(self, h: mx.array, head) -> mx.array:
        """`head(h)`, or the head's weight through `block_matmul` for 2-64 rows."""
        m = self.head
        if m is not None:
            w = weight_of(m)
            if self.head_fits(h, lambda: self.ops.applies(h, w)):
                return self.ops.block_matmul(h, w)
        return head(h)


def _launched(wrapped) -> List[nn.Module]:
    """The Linear layers whose products a wrapped layer launches itself."""
    if isinstance(wrapped, HybridBlockLayer):
        l = wrapped.inner
        own = plain_linears(l["mlp"]) if wrapped.mlp_folds else []
        return own + (plain_linears(l["self_attn"]) if wrapped.attention_folds else [])
    return plain_linears(wrapped.inner)


def _put_layer(layers: list, i: int, stock, wrapped, module):
    """Layer i becomes `module`, under the outer wrapper (tap) there if any."""
    here = layers[i]
    if here is stock or here is wrapped:
        layers[i] = module
    else:
        here["inner"] = module


def _children(root):
    """(container, key, module) for every module below `root`, where
    `container[key]` is the module (containers: modules, lists, dicts)."""
    seen, stack = set(), [root]
    while stack:
        c = stack.pop()
        items = c.items() if isinstance(c, dict) else enumerate(c)
        for k, v in items:
            if isinstance(v, nn.Module):
                if id(v) not in seen:
                    seen.add(id(v))
                    yield c, k, v
                    stack.append(v)
            elif isinstance(v, (list, dict)):
                stack.append(v)
