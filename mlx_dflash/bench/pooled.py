"""Numbers pooled per temperature and decoder over a bench run's cases."""

from typing import List

from ..stats import SpecStats
from .stats import summarize


def temperature(case: dict) -> float:
    return case.get("sampling", {}).get("temperature", 0.0)


def case_name(case: dict) -> str:
    """suite/name, with " T=t" for a case that names its sampling."""
    t = f" T={temperature(case):g}" if "sampling" in case else ""
    return f"{case['suite']}/{case['name']}{t}"


def by_temperature(results: dict) -> List[dict]:
    """Per temperature and decoder, pooled over cases: τ, both acceptance
    ratios, per-position acceptance, tok/s and speedup over every timed run."""
    groups = {}
    for c in results["cases"]:
        t = temperature(c)
        groups.setdefault((t, "mlx_lm (stock)"), []).append((c, c["baseline"], None))
        for name, a in c["arms"].items():
            groups.setdefault((t, name), []).append((c, a, c["baseline"]))
    out = []
    for (t, name), items in groups.items():
        row = {
            "temperature": t,
            "decoder": name,
            "cases": len(items),
            "decode_tps": summarize(
                [r["decode_tps"] for _, a, _ in items for r in a["per_run"]]
            ),
        }
        if items[0][2] is not None:
            pooled = SpecStats.from_dict(items[0][1]["spec"])
            for _, a, _ in items[1:]:
                pooled.merge(SpecStats.from_dict(a["spec"]))
            matches = [a["token_match"] for _, a, _ in items]
            row.update(
                runs=sum(a["spec"].get("runs", 1) for _, a, _ in items),
                tau=pooled.tau,
                tau_per_run=summarize(
                    [r["tau"] for _, a, _ in items for r in a["per_run"] if "tau" in r]
                ),
                acceptance_rate=pooled.acceptance_rate,
                draft_share=pooled.draft_share,
                per_position_acceptance=pooled.per_position,
                speedup=summarize(
                    [
                        r["decode_tps"] / b["decode_tps"]
                        for _, a, base in items
                        for r, b in zip(a["per_run"], base["per_run"])
                    ]
                ),
                token_match_pct=(
                    None
                    if any(m is None for m in matches)
                    else sum(m["equal_pct"] for m in matches) / len(matches)
                ),
            )
        out.append(row)
    return sorted(
        out, key=lambda r: (r["temperature"], r["decoder"] != "mlx_lm (stock)")
    )
