"""Decoding on a target sharded across processes with `mx.distributed`.

Under MLX's launcher (`mlx.launch ... -- mlx-dflash generate|serve|bench`)
every rank loads the target through mlx_lm's own tensor-parallel sharding
(`model.shard(group)`, what `mlx_lm.utils.sharded_load` calls) and a full
copy of the drafter. After each all-reduce the residual stream, and so every
captured hidden state, is the same on every rank; a vocabulary-sharded head
is gathered before any decision (`Target.logits`). So every rank drafts,
verifies and accepts identically, and rolls back its own shard of the caches
(its KV heads, its GatedDeltaNet heads) with the one-process code. With
`--pipeline` mlx_lm's `pipeline` gives each rank a range of layers instead,
and `Target` gathers the captured layers from the ranks that hold them.

What must be the same on every rank but is not computed from the model --
a request's prompt ids, its parameters, a random seed, "stop now" -- rank 0
decides and shares with `World.share`: one all_sum of a padded int array, so
nothing travels but mx.distributed's own collectives. Only rank 0 prints or
serves HTTP; the others follow it (`lockstep.py`).
"""

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

import mlx.core as mx
import numpy as np

# The order `World.init` names the running backend in: one the launcher did not
# configure gives a one-process group, the one already up gives the world.
BACKENDS = ("jaccl", "ring", "nccl", "mpi")
INLINE = 255  # bytes of a shared value that travel with its length


@dataclass(frozen=True)
class World:
    """The process group a run decodes across (size 1: one process).

    `mode` is "single" (one process), "tensor" (the target's linears split
    across ranks by mlx_lm's `shard`) or "pipeline" (its layers split into
    ranges by mlx_lm's `pipeline`).
    """

    group: Optional[Any]
    backend: Optional[str]
    mode: str

    @classmethod
    def init(cls, pipeline: bool = False) -> "World":
        """The world MLX's launcher started this process in, or a single one;
        `pipeline` splits the target by layers instead of tensor parallel."""
        if not mx.distributed.is_available():
            return SINGLE
        group = mx.distributed.init()  # what mlx_lm's sharded_load uses too
        if group.size() == 1:
            return SINGLE
        mode = "pipeline" if pipeline else "tensor"
        # Name the backend: asking for the one already up returns its group.
        for name in BACKENDS:
            try:
                if mx.distributed.init(backend=name).size() == group.size():
                    return cls(group, name, mode)
            except RuntimeError:
                continue
        return cls(group, "unknown", mode)

    @property
    def size(self) -> int:
        return 1 if self.group is None else self.group.size()

    @property
    def rank(self) -> int:
        return 0 if self.group is None else self.group.rank()

    @property
    def leader(self) -> bool:
        """Rank 0: the one that prints, serves and decides."""
        return self.rank == 0

    def info(self) -> dict:
        """What `--json` and `/v1/models` report as `distributed`."""
        return {"world_size": self.size, "backend": self.backend, "mode": self.mode}

    def share(self, value: Any = None) -> Any:
        """Rank 0's `value` (anything JSON can hold) on every rank.

        One all_sum on the CPU stream of a fixed-size int array (every other
        rank adds zeros): the byte length and the first `INLINE` bytes; a
        longer value (a prompt) takes a second all_sum for the rest. Every
        rank must call it at the same point; the others pass nothing.
        """
        if self.size == 1:
            return value
        data = json.dumps(value).encode() if self.leader else b""
        head = np.zeros(INLINE + 1, np.int32)
        head[0] = len(data)
        head[1 : 1 + min(len(data), INLINE)] = np.frombuffer(data[:INLINE], np.uint8)
        head = np.array(self._sum(mx.array(head)))
        n = int(head[0])
        got = head[1 : 1 + min(n, INLINE)].astype(np.uint8).tobytes()
        if n > INLINE:
            rest = np.zeros(n - INLINE, np.int32)
            if self.leader:
                rest[:] = np.frombuffer(data[INLINE:], np.uint8)
            got += np.array(self._sum(mx.array(rest))).astype(np.uint8).tobytes()
        return value if self.leader else json.loads(got)

    def _sum(self, x: mx.array) -> mx.array:
        y = mx.distributed.all_sum(x, group=self.group, stream=mx.cpu)
        mx.eval(y)
        return y

    def fail(self, message: str):
        """End this rank with `message`. MLX's launcher then ends every other
        rank (it stops all when one exits non-zero), so none waits in a
        collective for a peer that is gone."""
        print(f"[mlx-dflash] rank {self.rank}/{self.size}: {message}", file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


SINGLE = World(None, None, "single")


def shard(model, world: World, where: str = "--model"):
    """Split `model` across `world` with mlx_lm's own `shard` (tensor parallel).

    A model family mlx_lm cannot shard is a ValueError naming it.
    """
    if world.size == 1:
        return model
    if world.mode == "pipeline":
        raise ValueError(f"{where}: --pipeline needs an mlx_lm directory or repo")
    if not hasattr(model, "shard"):
        kind = getattr(getattr(model, "args", None), "model_type", type(model).__name__)
        raise ValueError(
            f"{where}: mlx_lm has no tensor-parallel sharding for model type {kind!r}"
        )
    model.shard(world.group)
    mx.eval(model.parameters())
    return model


def same_seed(world: World, sampling):
    """`sampling` with a seed every rank shares: a sampled run without one
    would draw its own random key on each rank and the ranks would part."""
    if world.size == 1 or sampling.greedy or sampling.seed is not None:
        return sampling
    seed = world.share(int.from_bytes(os.urandom(4), "little") if world.leader else None)
    return dataclasses.replace(sampling, seed=seed)


def report(world: World) -> dict:
    """What `doctor` shows: the group, the backends this MLX build has, and
    under the launcher the median of 20 one-element all_sums (microseconds)."""
    out = dict(world.info(), rank=world.rank)
    out["backends_available"] = [b for b in BACKENDS if mx.distributed.is_available(b)]
    out["all_sum_us"] = None
    if world.size > 1:
        x, times = mx.array([1], dtype=mx.int32), []
        for _ in range(5):  # the ranks meet here first: not timed
            world._sum(x)
        for _ in range(20):
            tic = time.perf_counter()
            world._sum(x)
            times.append((time.perf_counter() - tic) * 1e6)
        out["all_sum_us"] = round(float(np.median(times)), 1)
    return out
