"""Linear layers and MLPs whose verify- and draft-sized blocks take matmul.py.

`BlockLinear` wraps one plain `nn.Linear` (or affine `nn.QuantizedLinear`) *instance* and `BlockMLP` one
mirrored MLP instance; the block path (path.py) builds them once and puts
them where the stock modules sit only for the duration of a forward, so that
outside it the model is stock. Each call asks the backend (cuda.py's) whether
its kernel takes the block; otherwise the stock module runs.
"""

from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..wrapper import Wrapper, class_name
from .matmul import Fits, blockable, weight_of


def stock(module: nn.Module) -> nn.Module:
    """`module`, or the one a `BlockLinear` wraps."""
    return module["inner"] if isinstance(module, BlockLinear) else module


def fusable(*layers: nn.Module) -> bool:
    """Whether one kernel launch can take these linear layers' products
    (plain or quantized Linear layers without biases; shapes and a launch's
    one kind of weight are checked per call)."""
    return all(blockable(l) and "bias" not in l for l in (stock(m) for m in layers))


class BlockLinear(Wrapper):
    """Wraps one `blockable` Linear: blocks of 2-64 rows take the backend's
    `block_matmul`, everything else the stock layer."""

    def __init__(self, inner: nn.Module, ops):
        super().__init__(inner)
        self.ops = ops
        self.fits = Fits()

    def __call__(self, x: mx.array) -> mx.array:
        l = self["inner"]
        w = weight_of(l)
        if self.fits(x, lambda: self.ops.applies(x, w)):
            return self.ops.block_matmul(x, w, l.get("bias"))
        return l(x)


# MLP classes whose __call__ is `down_proj(swiglu(gate_proj(x), up_proj(x)))`.
MIRRORED_MLP = {
    "mlx_lm.models.llama.MLP",
    "mlx_lm.models.qwen2.MLP",
    "mlx_lm.models.qwen3.MLP",
    "mlx_lm.models.qwen3_moe.MLP",
    "mlx_lm.models.qwen3_next.Qwen3NextMLP",
}


class BlockMLP(Wrapper):
    """Wraps one mirrored MLP instance: for a block of 2-64 rows, gate, up and
    SwiGLU are one launch (`block_swiglu`); everything else is the stock MLP."""

    def __init__(self, inner: nn.Module, ops):
        super().__init__(inner)
        self.ops = ops
        self.fits = Fits()

    def __call__(self, x: mx.array) -> mx.array:
        mlp = self.inner
        g, u = weight_of(stock(mlp.gate_proj)), weight_of(stock(mlp.up_proj))
        if not self.fits(x, lambda: g.shape == u.shape and self.ops.applies(x, g, u)):
            return mlp(x)
        return mlp.down_proj(self.ops.block_swiglu(x, g, u))


def wrap_mlp(mlp, ops) -> Optional[BlockMLP]:
    """A `BlockMLP` around `mlp` if its class is mirrored and its gate and up
    projections are `fusable`, else None."""
    if class_name(mlp) not in MIRRORED_MLP:
        return None
    return BlockMLP(mlp, ops) if fusable(mlp.gate_proj, mlp.up_proj) else None


def plain_linears(module: nn.Module) -> List[nn.Module]:
    """The `blockable` Linear instances under `module` (exact types: plain
    `nn.Linear` and affine `nn.QuantizedLinear`, never subclasses such as
    sharded layers)."""
    return [m for _, m in module.named_modules() if blockable(m)]
