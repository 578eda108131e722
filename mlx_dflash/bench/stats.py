"""Small statistics: summaries over repeats, run order, token agreement."""

import statistics
from typing import Dict, List, Optional, Sequence


def summarize(values: Sequence[float]) -> Dict[str, float]:
    """Median, min and max (and n) of repeated measurements."""
    values = [float(v) for v in values]
    if not values:
        return {
            "median": float("nan"),
            "min": float("nan"),
            "max": float("nan"),
            "n": 0,
        }
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def run_order(repeats: int, arms: Sequence[str]) -> List[List[str]]:
    """Order of the arms in each repeat: forward on even repeats, reversed on odd.

    So each arm runs first as often as last, and slow drift (thermal, caches)
    does not favour one side.
    """
    arms = list(arms)
    return [arms if r % 2 == 0 else arms[::-1] for r in range(repeats)]


def token_match(
    reference: Sequence[int], output: Sequence[int]
) -> Dict[str, Optional[float]]:
    """Share of positions where `output` equals `reference`, and the first divergence.

    Compared over the longer length (a missing token counts as a mismatch);
    `first_divergence` is None when the two are identical.
    """
    n = max(len(reference), len(output))
    if n == 0:
        return {"equal_pct": 100.0, "first_divergence": None}
    same = sum(1 for a, b in zip(reference, output) if a == b)
    first = next(
        (i for i, (a, b) in enumerate(zip(reference, output)) if a != b),
        None if len(reference) == len(output) else min(len(reference), len(output)),
    )
    return {"equal_pct": 100.0 * same / n, "first_divergence": first}


def ideal_speedup(
    tau: Optional[float], t_ar: float, t_draft: float, t_verify: float
) -> float:
    """Speedup a cycle-costed engine would reach with no overhead: tau*t_AR/(t_draft+t_verify).

    NaN when no speculative cycle ran (tau None)."""
    if tau is None:
        return float("nan")
    return tau * t_ar / (t_draft + t_verify)
