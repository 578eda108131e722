"""The bench's PNG: only the panels the run gives something to compare in.

Always: decode tok/s of every arm beside stock mlx_lm, per case (bars with
min–max, the speedup written on each arm's bar). Where arms drafted: the
per-position acceptance curves. Only when the run varies them: tok/s against
generated length, τ against temperature, speedup against prompt length (one
x value would be a panel with nothing on its axis). Every arm is labelled, and
points that share an x are nudged apart so that none hides another.
"""

from pathlib import Path

from .pooled import by_temperature, case_name, temperature

MARKERS = "osD^vP*X"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in PANELS if p.applies(results)]
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    n_cases = len(results["cases"])
    width = max(6.0 * cols, 1.1 * n_cases * (1 + len(_arms(results))) + 4)
    fig, axes = plt.subplots(rows, cols, figsize=(width, 4.8 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for panel, ax in zip(panels, flat):
        panel.draw(results, ax)
    for ax in flat[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(results["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _arms(results) -> list:
    """Arm names in the order the run first lists them."""
    return list(dict.fromkeys(n for c in results["cases"] for n in c["arms"]))


def _case_label(c) -> str:
    return f"{case_name(c)}\n{c['prompt_tokens']}+{c['max_tokens']}"


def _nudge(i: int, n: int, span: float) -> float:
    """Offset of series i of n around a shared x, `span` wide in all."""
    return 0.0 if n == 1 else span * (i / (n - 1) - 0.5)


class Speeds:
    """Decode tok/s per case: stock and every arm side by side."""

    @staticmethod
    def applies(results) -> bool:
        return bool(results["cases"])

    @staticmethod
    def draw(results, ax):
        cases, arms = results["cases"], _arms(results)
        series = ["mlx_lm (stock)"] + arms
        w = 0.8 / len(series)
        tallest = 0.0
        for j, name in enumerate(series):
            xs, ys, lo, hi, tags = [], [], [], [], []
            for i, c in enumerate(cases):
                a = c["baseline"] if j == 0 else c["arms"].get(name)
                if a is None:
                    continue
                d = a["decode_tps"]
                xs.append(i + (j - (len(series) - 1) / 2) * w)
                ys.append(d["median"])
                lo.append(d["median"] - d["min"])
                hi.append(d["max"] - d["median"])
                tags.append("" if j == 0 else f"{a['speedup']['median']:.2f}×")
            bars = ax.bar(xs, ys, w, yerr=[lo, hi], capsize=2, label=name)
            tallest = max([tallest] + [y + h for y, h in zip(ys, hi)])
            for bar, tag, top in zip(bars, tags, hi):
                if tag:  # above the error bar
                    ax.annotate(
                        tag,
                        (bar.get_x() + bar.get_width() / 2, bar.get_height() + top),
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        xytext=(0, 2),
                        textcoords="offset points",
                    )
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(
            [_case_label(c) for c in cases], fontsize=7, rotation=30, ha="right"
        )
        ax.set_ylabel("decode tok/s (median; bars: min–max)")
        ax.set_title("decode speed beside stock mlx_lm (speedup on each bar)")
        # A band above the tallest bar for the speedup tags and the legend, so
        # the legend never hides a tag.
        ax.set_ylim(0, tallest * 1.35 or 1.0)
        ax.legend(fontsize=7, loc="upper center", ncol=min(len(series), 3))


class Acceptance:
    """P(draft position i accepted | drafted), per case and arm that drafted."""

    @staticmethod
    def curves(results):
        for c in results["cases"]:
            for name, a in c["arms"].items():
                pos = a["spec"].get("per_position_acceptance") or []
                if pos:
                    yield f"{case_name(c)} {name}", pos

    @classmethod
    def applies(cls, results) -> bool:
        return any(True for _ in cls.curves(results))

    @classmethod
    def draw(cls, results, ax):
        curves = list(cls.curves(results))
        for k, (label, pos) in enumerate(curves):
            dx = _nudge(k, len(curves), 0.3)  # equal curves stay visible
            xs = [i + 1 + dx for i in range(len(pos))]
            ax.plot(xs, pos, marker=MARKERS[k % len(MARKERS)], ms=4, label=label)
        ax.set_xlabel("draft position")
        ax.set_ylabel("P(accepted | drafted)")
        ax.set_ylim(0, 1.02)
        ax.set_title("per-position acceptance")
        ax.legend(fontsize=7)


def _by_x(results, x_of, y_of):
    """{series: {x: [y, ...]}} over cases, stock first, for line panels."""
    out = {}
    for c in results["cases"]:
        out.setdefault("mlx_lm (stock)", {}).setdefault(x_of(c), []).append(
            y_of(c, c["baseline"], stock=True)
        )
        for name, a in c["arms"].items():
            y = y_of(c, a, stock=False)
            if y is not None:
                out.setdefault(name, {}).setdefault(x_of(c), []).append(y)
    return {k: v for k, v in out.items() if not all(y is None for ys in v.values() for y in ys)}


def _lines(ax, series: dict, span: float):
    """Mean per x for each series, nudged apart, with a marker per series."""
    names = list(series)
    for i, name in enumerate(names):
        pts = series[name]
        xs = sorted(pts)
        ys = [sum(pts[x]) / len(pts[x]) for x in xs]
        dx = _nudge(i, len(names), span)
        ax.plot([x + dx for x in xs], ys, marker=MARKERS[i % len(MARKERS)], label=name)
    ax.legend(fontsize=7)


class Lengths:
    """Decode tok/s against generated length, when the run has several."""

    @staticmethod
    def applies(results) -> bool:
        return len({c["max_tokens"] for c in results["cases"]}) > 1

    @staticmethod
    def draw(results, ax):
        series = _by_x(
            results,
            lambda c: c["max_tokens"],
            lambda c, a, stock: a["decode_tps"]["median"],
        )
        ns = sorted({c["max_tokens"] for c in results["cases"]})
        _lines(ax, series, 0.02 * (ns[-1] - ns[0]))
        ax.set_xlabel("generated tokens")
        ax.set_ylabel("decode tok/s (mean over cases)")
        ax.set_title("speed against generated length")


class Contexts:
    """Speedup against prompt length, when a suite has prompts of several
    lengths (a context sweep; different suites' prompts are not one)."""

    @staticmethod
    def applies(results) -> bool:
        lengths = {}
        for c in results["cases"]:
            lengths.setdefault(c["suite"], set()).add(c["prompt_tokens"])
        return any(len(v) > 1 for v in lengths.values())

    @staticmethod
    def draw(results, ax):
        series = _by_x(
            results,
            lambda c: c["prompt_tokens"],
            lambda c, a, stock: None if stock else a["speedup"]["median"],
        )
        ps = sorted({c["prompt_tokens"] for c in results["cases"]})
        _lines(ax, series, 0.02 * (ps[-1] - ps[0]))
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("speedup vs stock (mean over cases)")
        ax.set_title("speedup against prompt length")


class Temperatures:
    """Pooled τ against temperature, when the run has several."""

    @staticmethod
    def applies(results) -> bool:
        return len({temperature(c) for c in results["cases"]}) > 1

    @staticmethod
    def draw(results, ax):
        by_t = results.get("by_temperature") or by_temperature(results)
        names = list(dict.fromkeys(r["decoder"] for r in by_t if r.get("tau") is not None))
        ts = sorted({r["temperature"] for r in by_t})
        span = 0.03 * (ts[-1] - ts[0])
        for i, name in enumerate(names):
            pts = [r for r in by_t if r["decoder"] == name and r["tau"] is not None]
            tau = [r["tau"] for r in pts]
            # Pooled τ is a weighted mean of the runs' τ, so it lies inside their range.
            err = [
                [max(t - r["tau_per_run"]["min"], 0) for t, r in zip(tau, pts)],
                [max(r["tau_per_run"]["max"] - t, 0) for t, r in zip(tau, pts)],
            ]
            dx = _nudge(i, len(names), span)
            ax.errorbar(
                [r["temperature"] + dx for r in pts],
                tau,
                yerr=err,
                marker=MARKERS[i % len(MARKERS)],
                capsize=3,
                label=name,
            )
        ax.set_xlabel("temperature")
        ax.set_ylabel("τ (pooled; bars: per-run min–max)")
        ax.set_title("τ against temperature")
        ax.legend(fontsize=7)


PANELS = [Speeds, Acceptance, Lengths, Contexts, Temperatures]
