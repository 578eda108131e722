"""Report writers: one JSON with everything, a Markdown table, a PNG plot."""

import json
from pathlib import Path
from typing import List

from .environment import environment  # noqa: F401 - cli.py calls report.environment
from .plot import plot
from .pooled import by_temperature, case_name, temperature

NOTES = (
    "decode tok/s: tokens after the first / time after the first token (prefill excluded). "
    "TTFT: prompt in to first token out. speedup: DFlash decode tok/s / stock mlx_lm decode "
    "tok/s, paired per repeat. tau: mean accepted length per cycle incl. the bonus token. "
    "acc/drafted: accepted draft tokens / drafted tokens (per drafted token). "
    "share from draft: emitted tokens that came from the draft / emitted tokens (NOT an "
    "acceptance rate). ideal = tau * t_AR / (t_draft + t_verify), from the same run's "
    "baseline per-token time and the warm draft/verify forwards; efficiency = speedup / ideal. "
    "cycle = measured decode time / cycles; overhead = cycle - draft - verify. "
    "verify@new-len: first 16-token forward at a new key length (includes any JIT compile). "
    "cold ×: speedup of the arm's first run, which meets every key length for the first time "
    "(timed runs repeat lengths already seen in warm-up). "
    "T > 0: stock mlx_lm samples with make_sampler(temp, top_p, min_p, top_k), ours with "
    "lossless speculative sampling (drafts drawn from the drafter's q, accepted with "
    "min(1, p/q)); repeat r seeds both with seed + r. The two draw different, equally "
    "valid samples, so token match is n/a; τ, acc/drafted and share from draft are pooled "
    "over all timed runs. Engine arms are τ-controlled only at T = 0 (their oracle drafts "
    "are one-hot, accepted with probability p(x) when sampling)."
)

SAMPLED = "n/a (sampled)"


def _num(x, spec: str) -> str:
    """A ratio with nothing to count (None: no cycle, nothing drafted) is n/a."""
    return "n/a" if x is None else format(x, spec)


def _mmm(s: dict, fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}–{fmt.format(s['max'])}]"


BY_TEMP_HEADER = [
    "T",
    "decoder",
    "cases",
    "τ pooled",
    "τ per run med [min–max]",
    "acc/drafted",
    "share from draft",
    "decode tok/s med [min–max]",
    "speedup med [min–max]",
    "match %",
]


def by_temperature_rows(rows_: List[dict]) -> List[List[str]]:
    out = []
    for r in rows_:
        if "tau" not in r:
            out.append(
                [
                    f"{r['temperature']:g}",
                    r["decoder"],
                    str(r["cases"]),
                    "",
                    "",
                    "",
                    "",
                    _mmm(r["decode_tps"]),
                    "1.00",
                    "",
                ]
            )
            continue
        m = r["token_match_pct"]
        out.append(
            [
                f"{r['temperature']:g}",
                r["decoder"],
                str(r["cases"]),
                _num(r["tau"], ".3f"),
                _mmm(r["tau_per_run"], "{:.2f}"),
                _num(r["acceptance_rate"], ".3f"),
                f"{r['draft_share']:.3f}",
                _mmm(r["decode_tps"]),
                _mmm(r["speedup"], "{:.2f}"),
                SAMPLED if m is None else f"{m:.1f}",
            ]
        )
    return out


def rows(results: dict) -> List[List[str]]:
    out = []
    for c in results["cases"]:
        b = c["baseline"]
        case = f"{c['suite']}/{c['name']} ({c['prompt_tokens']}+{c['max_tokens']})"
        if "sampling" in c:
            case += f" T={temperature(c):g}"
        out.append(
            [
                case,
                "mlx_lm (stock)",
                _mmm(b["decode_tps"]),
                "1.00",
                _mmm(b["ttft_s"], "{:.3f}"),
                "",
                "",
                "",
                "",
                "",
                f"{b['peak_memory_gb']:.2f}",
                f"{b['t_ar_ms']:.1f}",
                "",
                "",
                "",
                "",
                "",
                "",
                "",
            ]
        )
        for name, a in c["arms"].items():
            sp, tm, p = a["spec"], a["token_match"], a.get("profile") or {}
            if tm is None:
                match, div = SAMPLED, "n/a"
            else:
                match = f"{tm['equal_pct']:.1f}"
                div = (
                    "—"
                    if tm["first_divergence"] is None
                    else str(tm["first_divergence"])
                )
            out.append(
                [
                    case,
                    name,
                    _mmm(a["decode_tps"]),
                    _mmm(a["speedup"], "{:.2f}"),
                    _mmm(a["ttft_s"], "{:.3f}"),
                    _num(sp["tau"], ".2f"),
                    _num(sp["acceptance_rate"], ".3f"),
                    f"{sp['draft_share']:.3f}",
                    match,
                    div,
                    f"{a['peak_memory_gb']:.2f}",
                    f"{p.get('t_ar_ms', float('nan')):.1f}",
                    f"{p.get('draft_ms', float('nan')):.1f}",
                    f"{p.get('verify_ms', float('nan')):.1f}",
                    f"{p.get('verify_new_len_ms', float('nan')):.1f}",
                    f"{p.get('cycle_ms', float('nan')):.1f}",
                    f"{a.get('ideal_speedup', float('nan')):.2f}",
                    f"{a.get('efficiency', float('nan')):.2f}",
                    f"{a.get('cold_speedup', float('nan')):.2f}",
                ]
            )
    return out


HEADER = [
    "case (prompt+gen tokens)",
    "decoder",
    "decode tok/s med [min–max]",
    "speedup med [min–max]",
    "TTFT s",
    "τ",
    "acc/drafted",
    "share from draft",
    "match %",
    "1st div.",
    "peak GB",
    "AR ms",
    "draft ms",
    "verify ms",
    "verify@new-len ms",
    "cycle ms",
    "ideal ×",
    "efficiency",
    "cold ×",
]


def _md_row(cells: List[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown(results: dict, command: str) -> str:
    cfg, env = results["settings"], results["environment"]
    lines = [f"# {results['title']}", "", "Command:", "", "```", command, "```", ""]
    by_t = results.get("by_temperature") or by_temperature(results)
    if len({r["temperature"] for r in by_t}) > 1 or any(r["temperature"] for r in by_t):
        lines += ["## By temperature (pooled over cases and repeats)", ""]
        lines += [_md_row(BY_TEMP_HEADER), "|" + "---|" * len(BY_TEMP_HEADER)]
        lines += [_md_row(r) for r in by_temperature_rows(by_t)]
        lines += ["", "## Per case", ""]
    lines += [_md_row(HEADER), "|" + "---|" * len(HEADER)]
    lines += [_md_row(r) for r in rows(results)]
    lines += [
        "",
        NOTES,
        "",
        "## Per-position acceptance (P(position i accepted | drafted))",
        "",
    ]
    for c in results["cases"]:
        for name, a in c["arms"].items():
            pp = a["spec"]["per_position_acceptance"]
            lines.append(
                f"- {case_name(c)} {name}: "
                + " ".join(_num(p, ".2f") for p in pp)
            )
    lines += _fallback_lines(results)
    lines += _paired_lines(results)
    lines += ["", "## Settings", "", "```json", json.dumps(cfg, indent=1), "```"]
    lines += ["", "## Environment", "", "```json", json.dumps(env, indent=1), "```", ""]
    return "\n".join(lines)


def _paired_lines(results: dict) -> List[str]:
    """Each arm's decode tok/s over the first arm's in the same repeat."""
    out = []
    for c in results["cases"]:
        for name, a in c["arms"].items():
            p = a.get("paired")
            if p is None:
                continue
            out.append(
                f"- {case_name(c)} {name} / {p['against']}: "
                f"{_mmm(p['ratio'], '{:.3f}')} ({p['ratio']['n']} repeats)"
            )
    if not out:
        return []
    head = "## Arms paired per repeat (decode tok/s / the first arm's, same repeat)"
    return ["", head, ""] + out


def _fallback_lines(results: dict) -> List[str]:
    """Tokens and seconds per decoding mode, for arms run with the fallback."""
    out = []
    for c in results["cases"]:
        for name, a in c["arms"].items():
            f = a["spec"]["fallback"]
            if not f["plain_tokens"]:
                continue
            runs = a["spec"].get("runs", 1)
            out.append(
                f"- {case_name(c)} {name}, per run: "
                f"plain {f['plain_tokens'] / runs:.1f} tokens in "
                f"{f['plain_seconds'] / runs:.2f} s ({f.get('probes', 0) / runs:.1f} "
                f"probes, {f['plain_stretches'] / runs:.1f} stretches); speculative "
                f"{f['speculative_tokens'] / runs:.1f} tokens in "
                f"{f['speculative_seconds'] / runs:.2f} s ({a['spec']['cycles'] / runs:.1f} "
                "cycles)"
            )
    if not out:
        return []
    head = "## Fallback: tokens and seconds per mode (mean over timed runs)"
    return ["", head, ""] + out


def table(results: dict) -> str:
    """Compact plain-text table for the terminal."""
    keep = [0, 1, 2, 3, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18]
    hdr = [HEADER[i] for i in keep]
    body = [[r[i] for i in keep] for r in rows(results)]
    widths = [max(len(x) for x in col) for col in zip(hdr, *body)]
    fmt = lambda r: "  ".join(x.ljust(w) for x, w in zip(r, widths))
    return "\n".join(
        [fmt(hdr), fmt(["-" * w for w in widths])] + [fmt(r) for r in body]
    )


def write(results: dict, stem: Path, command: str, *, png: bool = True) -> List[Path]:
    """Write stem.json, stem.md and stem.png; return their paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    results = dict(results, command=command)
    results.setdefault("by_temperature", by_temperature(results))
    paths = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    paths[0].write_text(json.dumps(results, indent=1))
    md = markdown(results, command)
    if png:
        paths.append(stem.with_suffix(".png"))
        plot(results, paths[2])
        md = md.replace(
            "## Per-position", f"![plot]({paths[2].name})\n\n## Per-position", 1
        )
    paths[1].write_text(md)
    return paths
