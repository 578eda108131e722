"""Engine-efficiency mode: a real-size draft forward with an oracle's proposals.

The DFlash draft model runs every cycle at its real cost, but the tokens it
proposes are replaced by an oracle that replays a known continuation, wrong
at a position drawn from a set acceptance profile. So the cost model is real
and the mean accepted length tau is controlled. The draft's own argmax is
added to the proposals times zero, so its forward is evaluated in the same
graph (and the same host sync) as the verify pass.
"""

from typing import List, Optional, Sequence

import mlx.core as mx

from ..drafters import DFlashDrafter, OracleDrafter


def geometric_p(tau: float, block_size: int) -> float:
    """Per-position acceptance p with E[tau] = 1 + p + ... + p^(B-1) equal to `tau`."""
    if not 1.0 <= tau <= block_size:
        raise ValueError(f"tau {tau} must lie in [1, block size {block_size}]")
    if tau == block_size:
        return 1.0

    def expected(p):
        return sum(p**i for i in range(block_size))

    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected(mid) < tau else (lo, mid)
    return (lo + hi) / 2


def geometric_schedule(
    tau: float, block_size: int, *, cycles: int = 256, seed: int = 0
) -> List[int]:
    """Per-cycle index of the first wrong draft token, for a target tau.

    The first wrong index k (accepted = k, tau = k + 1) follows the truncated
    geometric law P(k) = p^k (1 - p), k < B-1, P(B-1) = p^(B-1): each drafted
    token is right with probability p given the ones before it were. Drawn at
    the quantiles of a base-2 van der Corput sequence (offset by `seed`), so
    every prefix of the schedule, and so even a short run, averages `tau`.
    """
    p = geometric_p(tau, block_size)
    n = block_size - 1
    cdf, acc = [], 0.0
    for k in range(n):
        acc += p**k * (1 - p)
        cdf.append(acc)
    cdf.append(1.0)
    out = []
    for i in range(cycles):
        u = _van_der_corput(i + 1 + seed)
        out.append(next(k for k, c in enumerate(cdf) if u <= c + 1e-12))
    return out


def _van_der_corput(i: int) -> float:
    u, f = 0.0, 0.5
    while i:
        u += f * (i & 1)
        i >>= 1
        f /= 2
    return u


class EngineDrafter:
    """DFlash forward for cost, oracle tokens for content.

    Args:
        dflash: a `DFlashDrafter` of the intended shape (random weights do).
        oracle: an `OracleDrafter` over prompt + the expected output.
    """

    name = "engine"

    def __init__(self, dflash: DFlashDrafter, oracle: OracleDrafter):
        self.dflash = dflash
        self.oracle = oracle
        self.capture_layers = dflash.capture_layers

    def start(self, prompt):
        self.dflash.start(prompt)
        self.oracle.start(prompt)

    def commit(self, tokens, features):
        self.dflash.commit(tokens, features)
        self.oracle.commit(tokens, features)

    def trim(self, n):
        self.dflash.trim(n)
        self.oracle.trim(n)

    def state(self):
        return {"dflash": self.dflash.state(), "oracle": self.oracle.state()}

    def load_state(self, state):
        self.dflash.load_state(state["dflash"])
        self.oracle.load_state(state["oracle"])

    def propose(self, anchor: int, n: int) -> mx.array:
        drafted = self.dflash.propose(anchor, n)
        tokens = self.oracle.propose(anchor, n).astype(mx.uint32)
        if tokens.size == 0:
            mx.eval(drafted)  # still pay for the forward
            return tokens
        return tokens + drafted[: tokens.size].astype(mx.uint32) * 0


def make_engine_drafter(
    draft,
    target,
    reference: Sequence[int],
    *,
    tau: float,
    block_size: int,
    vocab_size: int,
    seed: int = 0,
    cycles: Optional[int] = None,
) -> EngineDrafter:
    schedule = geometric_schedule(
        tau, block_size, cycles=cycles or max(64, len(reference) // 2), seed=seed
    )
    oracle = OracleDrafter(
        reference, vocab_size=vocab_size, schedule=schedule, seed=seed
    )
    return EngineDrafter(DFlashDrafter(draft, target), oracle)
