"""Warm-up: what a generation builds on first use, run before the first request.

Backends build some kernels the first time they meet them: MLX CUDA
JIT-compiles (NVRTC) its gather kernels per dtype, attention per key-length
bucket and `mx.compile`d graphs (mlx_lm's top-p / min-p / top-k); the CPU
backend compiles `mx.compile`d graphs to C++. Left alone, the first request of
a kind pays for them. `warm_up` runs the sampling steps at every shape they
can meet (`sampling.warm`) and one short generation per sampling setting
through the real target and drafter (prefill, full blocks, the shorter blocks
of its tail). Key-length buckets past the warm-up's are built as long
contexts first reach them, greedy or sampled alike.
"""

from dataclasses import replace
from typing import Iterable

import mlx.core as mx

from .decode import generate_step
from .sampling import SamplingParams
from .sampling import warm as warm_sampling

# Short: each setting's generation costs a prefill and a few cycles.
PROMPT_TOKENS = 8


def warm_up(
    target,
    drafter,
    block_size: int,
    settings: Iterable[SamplingParams] = (SamplingParams(),),
    *,
    generate: bool = True,
    steps=generate_step,
):
    """Warm `target` + `drafter` for each sampling setting in `settings`.

    Args:
        target, drafter, block_size: as `generate_step` takes them.
        settings: the sampling settings requests will use (greedy is one).
        generate: also run one generation per setting (the server does);
          False warms only the sampling steps (`generate` does, lazily: the
          one generation it runs is the rest of the warm-up).
        steps: what runs the generations: `generate_step`, or the server's
          lockstep `Leader` when the target is split across ranks.

    The drafter ends in a started state; the next `prefill` starts it again.
    """
    # The head's width, from the lazy graph's shape (nothing is computed).
    vocab = target.logits(target.embed(mx.array([[0]]))).shape[-1]
    prompt = [i % vocab for i in range(1, PROMPT_TOKENS + 1)]
    drafted = hasattr(drafter, "propose_sampled")
    for params in settings:
        params = replace(params, seed=0)
        warm_sampling(vocab, block_size, params, drafted=drafted)
        if not generate:
            continue
        # One full block, then each shorter one as max_tokens runs out.
        run = steps(
            target,
            prompt,
            drafter,
            cache=target.make_cache(),
            cached=0,
            max_tokens=1 + block_size + block_size // 2,
            block_size=block_size,
            sampling=params,
        )
        for _ in run:
            pass
