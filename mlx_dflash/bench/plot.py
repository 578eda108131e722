"""The bench's PNG: decode tok/s and speedup per case and arm."""

from pathlib import Path

from .pooled import by_temperature, temperature


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, sp, lo, hi, taus = [], [], [], [], []
    for c in results["cases"]:
        for name, a in c["arms"].items():
            t = f" T={temperature(c):g}" if "sampling" in c else ""
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
