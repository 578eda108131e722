"""Report writers: one JSON with everything, a Markdown table, a PNG plot."""

import json
import platform
import subprocess
from pathlib import Path
from typing import List

from .stats import summarize

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


def _temp(case: dict) -> float:
    return case.get("sampling", {}).get("temperature", 0.0)


def by_temperature(results: dict) -> List[dict]:
    """Per temperature and decoder, pooled over cases: τ, both acceptance
    ratios, per-position acceptance, tok/s and speedup over every timed run."""
    groups = {}
    for c in results["cases"]:
        t = _temp(c)
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
            cycles = sum(a["spec"]["cycles"] for _, a, _ in items)
            drafted = sum(a["spec"]["drafted"] for _, a, _ in items)
            accepted = sum(a["spec"]["accepted"] for _, a, _ in items)
            emitted = sum(
                a["spec"].get("emitted", 0) + a["spec"]["fallback"]["plain_tokens"]
                for _, a, _ in items
            )
            acc_at = [
                sum(x)
                for x in zip(*(a["spec"].get("accepted_at", []) for _, a, _ in items))
            ]
            dr_at = [
                sum(x)
                for x in zip(*(a["spec"].get("drafted_at", []) for _, a, _ in items))
            ]
            matches = [a["token_match"] for _, a, _ in items]
            row.update(
                runs=sum(a["spec"].get("runs", 1) for _, a, _ in items),
                tau=(accepted + cycles) / cycles if cycles else None,
                tau_per_run=summarize(
                    [r["tau"] for _, a, _ in items for r in a["per_run"] if "tau" in r]
                ),
                acceptance_rate=accepted / drafted if drafted else None,
                draft_share=accepted / emitted if emitted else 0.0,
                per_position_acceptance=[
                    x / d if d else None for x, d in zip(acc_at, dr_at)
                ],
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


def environment() -> dict:
    import mlx.core as mx
    import mlx_lm

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
    }
    try:
        from importlib.metadata import version

        env["mlx_dflash"] = version("mlx-dflash")
    except Exception:
        env["mlx_dflash"] = None
    try:
        info = mx.device_info()
        env["device_info"] = {
            k: v for k, v in info.items() if isinstance(v, (int, str, float))
        }
    except Exception:
        pass
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0:
            env["gpu"] = out.stdout.strip()
    except Exception:
        pass
    try:
        import os

        env["cpu_count"] = os.cpu_count()
    except Exception:
        pass
    return env


def _num(x, spec: str) -> str:
    """A ratio with nothing to count (None: no cycle, nothing drafted) is n/a."""
    return "n/a" if x is None else format(x, spec)


def _mmm(s: dict, fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}–{fmt.format(s['max'])}]"


def rows(results: dict) -> List[List[str]]:
    out = []
    for c in results["cases"]:
        b = c["baseline"]
        case = f"{c['suite']}/{c['name']} ({c['prompt_tokens']}+{c['max_tokens']})"
        if "sampling" in c:
            case += f" T={_temp(c):g}"
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
            t = f" T={_temp(c):g}" if "sampling" in c else ""
            lines.append(
                f"- {c['suite']}/{c['name']}{t} {name}: "
                + " ".join(_num(p, ".2f") for p in pp)
            )
    lines += _fallback_lines(results)
    lines += ["", "## Settings", "", "```json", json.dumps(cfg, indent=1), "```"]
    lines += ["", "## Environment", "", "```json", json.dumps(env, indent=1), "```", ""]
    return "\n".join(lines)


def _fallback_lines(results: dict) -> List[str]:
    """Tokens and seconds per decoding mode, for arms run with the fallback."""
    out = []
    for c in results["cases"]:
        for name, a in c["arms"].items():
            f = a["spec"]["fallback"]
            if not f["plain_tokens"]:
                continue
            t = f" T={_temp(c):g}" if "sampling" in c else ""
            runs = a["spec"].get("runs", 1)
            out.append(
                f"- {c['suite']}/{c['name']}{t} {name}, per run: "
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


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, sp, lo, hi, taus = [], [], [], [], []
    for c in results["cases"]:
        for name, a in c["arms"].items():
            t = f" T={_temp(c):g}" if "sampling" in c else ""
            labels.append(f"{c['suite']}/{c['name']}{t}\n{name}")
            s = a["speedup"]
            sp.append(s["median"])
            lo.append(s["median"] - s["min"])
            hi.append(s["max"] - s["median"])
            tau = a["spec"]["tau"]
            taus.append(float("nan") if tau is None else tau)
    lengths = {}
    for c in results["cases"]:
        lengths.setdefault("mlx_lm (stock)", []).append(
            (c["max_tokens"], c["baseline"]["decode_tps"]["median"])
        )
        for name, a in c["arms"].items():
            lengths.setdefault(name, []).append(
                (c["max_tokens"], a["decode_tps"]["median"])
            )

    fig, axes = plt.subplots(1, 4, figsize=(max(16, 1.2 * len(labels) + 12), 4.5))
    x = range(len(labels))
    axes[0].bar(x, sp, yerr=[lo, hi], capsize=3, color="tab:blue")
    axes[0].axhline(1.0, color="gray", lw=0.8)
    axes[0].set_title("speedup vs stock mlx_lm (median, min–max)")
    axes[1].bar(x, taus, color="tab:orange")
    axes[1].set_title("τ (mean accepted length incl. bonus)")
    for ax in axes[:2]:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    for name, pts in lengths.items():
        agg = {}
        for n, v in pts:
            agg.setdefault(n, []).append(v)
        ns = sorted(agg)
        axes[2].plot(
            ns, [sum(agg[n]) / len(agg[n]) for n in ns], marker="o", label=name
        )
    axes[2].set_xlabel("generated tokens")
    axes[2].set_ylabel("decode tok/s (mean over cases)")
    axes[2].set_title("tok/s against generated length")
    axes[2].legend(fontsize=7)
    by_t = results.get("by_temperature") or by_temperature(results)
    for name in dict.fromkeys(r["decoder"] for r in by_t if "tau" in r):
        pts = [r for r in by_t if r["decoder"] == name and r["tau"] is not None]
        ts = [r["temperature"] for r in pts]
        tau = [r["tau"] for r in pts]
        # Pooled τ is a weighted mean of the runs' τ, so it lies inside their range.
        err = [
            [max(t - r["tau_per_run"]["min"], 0) for t, r in zip(tau, pts)],
            [max(r["tau_per_run"]["max"] - t, 0) for t, r in zip(tau, pts)],
        ]
        axes[3].errorbar(ts, tau, yerr=err, marker="o", capsize=3, label=name)
    axes[3].set_xlabel("temperature")
    axes[3].set_ylabel("τ (pooled; bars: per-run min–max)")
    axes[3].set_title("τ against temperature")
    axes[3].legend(fontsize=7)
    fig.suptitle(results["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
