"""Acceptance-collapse fallback: decode plainly while speculation does not pay.

A speculative cycle pays when its tokens cost less time than decoding them
plainly. When a drafter collapses (a weak drafter, or text it never saw) each
cycle costs a draft and a verify for about one token, and at long context on
a slow backend even a 2-token verify costs well over a plain step. So:

- Speculation runs in short blocks first: a cycle verifies `probe_block`
  tokens (the anchor and 3 drafts), and the block doubles, up to the full
  block size, after each cycle that accepts all its drafts. A full-block
  verify only runs once the drafter has earned it.
- After every speculative cycle, the seconds per token of the cycles since
  speculation (re)started (the last `window` of them) are compared with a
  plain step's. If speculation loses, the next `plain_tokens` tokens are
  decoded plainly; each loss in a row doubles that stretch, up to `max_plain`.
- The last step of a plain stretch is a probe: it also drafts `probe_block - 1`
  tokens, which the plain steps then check against the target's own tokens,
  as a verify would, at the cost of one draft pass and no verify. If a cycle
  would have paid (its tokens, bonus included, reach the break-even: a
  probe-sized cycle's measured seconds over a plain step's), speculation
  restarts; otherwise the next, longer, plain stretch begins.
- With timing-based decisions (the default) the first step is plain, to
  measure a plain step, and the second is a probe.
Plain steps draft nothing (probes aside); the drafter only receives the
committed tokens' target features, which the next proposal needs. The plain
steps of a stretch up to its probe need no decision, so `PlainStretch` runs
them pipelined.
"""

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Deque, Dict, Iterator, List, Optional, Tuple

import mlx.core as mx

from .rollback import rollback, snapshot
from .stats import SpecStats

if TYPE_CHECKING:
    from .decode import Decoding

# Break-even tokens per cycle before a probe-sized cycle has been timed:
# speculate if one draft would be accepted, then let the timings decide.
UNMEASURED_BREAK_EVEN = 2.0


@dataclass
class Fallback:
    """Settings of the acceptance-collapse fallback (see the module docstring).

    Args:
        probe_block: block size when speculation (re)starts; a probe drafts
          `probe_block - 1` tokens.
        window: most recent speculative cycles whose time per token decides.
        plain_tokens: first plain stretch (probe step included).
        max_plain: longest plain stretch.
        break_even: fixed tokens-per-cycle threshold instead of timings
          (deterministic, for tests); None = measured: speculate while its
          seconds per token are below a plain step's.
    """

    probe_block: int = 4
    window: int = 4
    plain_tokens: int = 8
    max_plain: int = 512
    break_even: Optional[float] = None

    def __post_init__(self):
        if self.probe_block < 2:
            raise ValueError(f"probe_block must be >= 2, got {self.probe_block}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not 1 <= self.plain_tokens <= self.max_plain:
            raise ValueError(
                f"need 1 <= plain_tokens ({self.plain_tokens}) <= max_plain "
                f"({self.max_plain})"
            )


def _policy_help(d: Fallback = Fallback()) -> str:
    return (
        f"speculation starts with {d.probe_block}-token blocks, doubled up to the "
        "full block after each fully accepted cycle; while its measured time per "
        "token exceeds a plain step's, tokens are decoded plainly in stretches of "
        f"{d.plain_tokens}, {2 * d.plain_tokens}, ... up to {d.max_plain}, each "
        f"ended by a probe: {d.probe_block - 1} drafted tokens checked against the "
        "plain tokens, no verify"
    )


# The policy in one line, for the CLI flags that switch it on or off.
POLICY_HELP = _policy_help()


class FallbackState:
    """One generation's side of the policy. Before each step `decode` reads
    `plain`, `probe_now` and `block`; after it, it reports the step."""

    def __init__(self, cfg: Fallback, block_size: int):
        self.cfg = cfg
        self.full = block_size
        self.probe = min(cfg.probe_block, block_size)
        self.block = self.probe
        self.stretch = cfg.plain_tokens
        # Timing-based decisions need a plain step's cost first.
        self.plain_left = 2 if cfg.break_even is None else 0
        self.shadow: Optional[List[int]] = None  # probe drafts not yet checked
        self.hits = 0
        self.plain_cost: Optional[float] = None  # seconds per plain step (EMA)
        self.cycle_cost: Dict[int, float] = {}  # verified size -> seconds (EMA)
        self.recent: Deque[Tuple[int, float]] = deque(maxlen=cfg.window)

    @property
    def plain(self) -> bool:
        return self.plain_left > 0 or self.shadow is not None

    @property
    def probe_now(self) -> bool:
        """This plain step also drafts `probe - 1` tokens, to be checked."""
        return self.plain_left == 1

    @property
    def plain_run(self) -> int:
        """Plain steps ahead that need no decision in between (the stretch up to
        its probe step), which `decode` may run pipelined."""
        return self.plain_left - 1 if self.shadow is None and self.plain_left > 1 else 0

    def after_plain_run(self, tokens: int, seconds: float, stats: SpecStats):
        """`tokens` plain steps (at most `plain_run`) took `seconds` in all."""
        assert 0 < tokens <= self.plain_run
        stats.plain_tokens += tokens
        stats.plain_seconds += seconds
        self.plain_cost = _ema(self.plain_cost, seconds / tokens)
        self.plain_left -= tokens

    def after_plain(
        self, seconds: float, token: int, probe: Optional[List[int]], stats: SpecStats
    ):
        """One plain step gave `token` in `seconds`; `probe`: its probe's draft."""
        stats.plain_tokens += 1
        stats.plain_seconds += seconds
        if probe is None:  # a probe step also paid for a draft pass
            self.plain_cost = _ema(self.plain_cost, seconds)
        if self.plain_left > 0:
            self.plain_left -= 1
            if probe is None:
                return
            stats.probes += 1
            self.shadow, self.hits = probe, 0
        # The probe drafted the tokens after its anchor: this step's token
        # and those of the next steps.
        assert self.shadow is not None
        hit = bool(self.shadow) and token == self.shadow[0]
        if hit:
            self.hits += 1
            self.shadow = self.shadow[1:]
        if self.hits + 1 >= self._break_even():
            self.shadow = None  # a cycle would have paid: speculate
        elif not hit or not self.shadow:
            self.shadow = None
            self._to_plain(stats)

    def after_spec(
        self,
        verified: int,
        accepted: int,
        tokens: int,
        seconds: float,
        stats: SpecStats,
    ):
        self.cycle_cost[verified] = _ema(self.cycle_cost.get(verified), seconds)
        self.recent.append((tokens, seconds))
        n = sum(t for t, _ in self.recent)
        if self.cfg.break_even is not None:
            losing = n / len(self.recent) < self.cfg.break_even
        else:
            losing = sum(s for _, s in self.recent) / n > self.plain_cost
        if losing:
            self._to_plain(stats)
            return
        if len(self.recent) == self.cfg.window:
            self.stretch = self.cfg.plain_tokens  # speculation paid for a window
        if accepted == self.block - 1:
            self.block = min(2 * self.block, self.full)

    def _break_even(self) -> float:
        """Tokens a probe-sized cycle must yield to beat plain steps."""
        if self.cfg.break_even is not None:
            return self.cfg.break_even
        cost = self.cycle_cost.get(self.probe)
        if cost is None:
            return UNMEASURED_BREAK_EVEN
        return cost / self.plain_cost

    def _to_plain(self, stats: SpecStats):
        stats.fallbacks += 1
        self.plain_left = self.stretch
        self.stretch = min(2 * self.stretch, self.cfg.max_plain)
        self.block = self.probe
        self.recent.clear()


class PlainStretch:
    """Up to `n` plain steps after the anchor `d.y`, pipelined as mlx_lm's own
    loop: step t+1 is queued before step t's token is read. Iterating yields
    the tokens; `settle` (before the last token, or when the caller stops
    early) makes the caches hold anchor + tokens[:-1] and reports the stretch."""

    def __init__(self, d: "Decoding", n: int):
        self.d, self.n, self.anchor = d, n, d.y
        self.tokens: List[int] = []
        self.features: List[Optional[mx.array]] = []
        self.queued: Optional[dict] = None  # snapshot before the step queued ahead
        self.settled = False

    def __iter__(self) -> Iterator[int]:
        d = self.d
        nxt, f = d.plain_step(mx.array(self.anchor, mx.uint32))
        for i in range(self.n):
            cur = nxt
            self.features.append(f)
            self.queued = None
            if i + 1 < self.n:
                self.queued = snapshot(d.cache, d.target.delta_taps)
                nxt, f = d.plain_step(cur)
            t = cur.item()
            self.tokens.append(t)
            last = t in d.stop or i + 1 == self.n
            if last:  # settle before the last yield: the caller may stop there
                self.settle()
            yield t
            if last:
                return

    def settle(self):
        if self.settled or not self.tokens:
            return
        self.settled = True
        d = self.d
        if self.queued is not None:  # undo the step queued after the last token
            rollback(d.cache, d.target.delta_taps, self.queued, verified=1, kept=0)
        f = self.features
        d.drafter.commit(
            [self.anchor] + self.tokens[:-1],
            None if f[0] is None else mx.concatenate(f, axis=1),
        )
        d.fb.after_plain_run(len(self.tokens), time.perf_counter() - d.tic, d.stats)
        d.advance(self.tokens)


def _ema(old: Optional[float], new: float) -> float:
    return new if old is None else 0.8 * old + 0.2 * new
