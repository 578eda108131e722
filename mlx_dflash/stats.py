"""Statistics of one speculative generation: acceptance, and time per decoding mode."""

from dataclasses import dataclass, field, fields
from typing import List, Optional


@dataclass
class SpecStats:
    """Speculative statistics of one generation.

    `tau` is the mean accepted length per cycle, bonus token included
    (1 .. block size). `acceptance_rate` is per drafted token: accepted draft
    tokens / drafted tokens. `draft_share` is the share of emitted tokens that
    came from the draft; it is *not* an acceptance rate. A ratio with nothing
    to count is None, not 0: `tau` before any speculative cycle, acceptance
    where nothing was drafted.

    With the acceptance-collapse fallback, tokens and seconds are split by
    mode: speculative cycles (`emitted`, `spec_seconds`) and plain steps
    (`plain_tokens`, `plain_seconds`, probes included). `fallbacks` counts the
    plain stretches begun (after a losing window or a failed probe), `probes`
    the plain steps that also drafted, to test whether speculation pays.
    """

    block_size: int
    cycles: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_at: List[int] = field(default_factory=list)
    drafted_at: List[int] = field(default_factory=list)
    plain_tokens: int = 0
    plain_seconds: float = 0.0
    spec_seconds: float = 0.0
    fallbacks: int = 0
    probes: int = 0

    def __post_init__(self):
        self.accepted_at = [0] * max(self.block_size - 1, 0)
        self.drafted_at = [0] * max(self.block_size - 1, 0)

    def record(self, drafted: int, accepted: int, emitted: int):
        self.cycles += 1
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += emitted
        for i in range(drafted):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1

    def merge(self, other: "SpecStats") -> "SpecStats":
        """Add `other`'s counts and seconds to these (pooling runs); returns self."""
        for f in fields(self):
            if f.name == "block_size":
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, list):
                a[:] = [x + y for x, y in zip(a, b)]
            else:
                setattr(self, f.name, a + b)
        return self

    @property
    def tau(self) -> Optional[float]:
        return (self.accepted + self.cycles) / self.cycles if self.cycles else None

    @property
    def acceptance_rate(self) -> Optional[float]:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def draft_share(self) -> float:
        total = self.emitted + self.plain_tokens
        return self.accepted / total if total else 0.0

    @property
    def per_position(self) -> List[Optional[float]]:
        """P(draft position i accepted | it was drafted), i = 1 .. B-1."""
        return [a / d if d else None for a, d in zip(self.accepted_at, self.drafted_at)]

    def as_dict(self) -> dict:
        return {
            "block_size": self.block_size,
            "cycles": self.cycles,
            "tau": _round(self.tau),
            "acceptance_rate": _round(self.acceptance_rate),
            "draft_share": round(self.draft_share, 4),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "per_position_acceptance": [_round(p) for p in self.per_position],
            "fallback": {
                "plain_stretches": self.fallbacks,
                "probes": self.probes,
                "plain_tokens": self.plain_tokens,
                "plain_seconds": round(self.plain_seconds, 4),
                "speculative_tokens": self.emitted,
                "speculative_seconds": round(self.spec_seconds, 4),
            },
        }

    @classmethod
    def from_dict(cls, d: dict) -> "SpecStats":
        """The counts `as_dict` wrote (its seconds are rounded), to pool them
        with `merge`; per-position counts where the dict has them (the bench's
        pooled stats do)."""
        f = d["fallback"]
        s = cls(
            d["block_size"],
            cycles=d["cycles"],
            drafted=d["drafted"],
            accepted=d["accepted"],
            emitted=f["speculative_tokens"],
            plain_tokens=f["plain_tokens"],
            plain_seconds=f["plain_seconds"],
            spec_seconds=f["speculative_seconds"],
            fallbacks=f["plain_stretches"],
            probes=f.get("probes", 0),
        )
        s.accepted_at = list(d.get("accepted_at", []))
        s.drafted_at = list(d.get("drafted_at", []))
        return s


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 4)
