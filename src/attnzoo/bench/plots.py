"""Log-log plots of benchmark rows (time and peak memory against the swept variable)."""

from __future__ import annotations

from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attnzoo._io import atomic_save_figure  # noqa: E402


def plot_sweep(rows: list, sweep: str, xkey: str, path: str, title: str) -> str | None:
    """One PNG with time (fwd, fwd+bwd) and peak memory panels for the rows of ``sweep``."""
    rows = [r for r in rows if r.sweep == sweep and r.status == "ok"]
    if not rows:
        return None
    metrics = [
        ("fwd_ms", "forward time (ms)"),
        ("fwdbwd_ms", "forward+backward time (ms)"),
        ("fwd_peak_mb", "forward peak memory (MiB)"),
    ]
    metrics = [m for m in metrics if any(getattr(r, m[0]) is not None for r in rows)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    series = defaultdict(list)
    for r in rows:
        series[(r.mechanism, r.causal)].append(r)
    # one colour per mechanism (the default cycle repeats after 10), dashed when causal
    mechs = sorted({m for m, _ in series})
    cmap = plt.get_cmap("tab10" if len(mechs) <= 10 else "tab20")
    color = {m: cmap(i % cmap.N) for i, m in enumerate(mechs)}
    for ax, (key, label) in zip(axes[0], metrics, strict=True):
        for (mech, causal), rs in sorted(series.items()):
            pts = sorted((getattr(r, xkey), getattr(r, key)) for r in rs if getattr(r, key) is not None)
            if pts:
                xs, ys = zip(*pts, strict=True)
                ys = [max(y, 1e-3) for y in ys]
                ax.plot(
                    xs,
                    ys,
                    marker="o",
                    color=color[mech],
                    linestyle="--" if causal else "-",
                    label=mech + (" (causal)" if causal else ""),
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xkey)
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=110)
    return path
