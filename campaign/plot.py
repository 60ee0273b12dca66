"""Plot a comparison: output throughput and p90 end-to-end latency against load, one line per variant.

matplotlib is an optional extra (``pip install campaign[plot]``) and is imported only when a plot is drawn, with
the Agg backend so it works without a display.
"""

from __future__ import annotations

from pathlib import Path

from campaign.compare import Comparison
from campaign.errors import UsageError


def plot(c: Comparison, path: str | Path) -> Path:
    """Draw ``c`` to an image file at ``path`` (format from its suffix, e.g. .png) and return the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise UsageError("--plot needs matplotlib, which is not installed", hint="pip install 'campaign[plot]'") from e
    if not c.series:
        raise UsageError("nothing to plot: none of the compared variants has a bench result")
    out = Path(path)
    fig, (ax_tp, ax_lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    axes = {s.axis for s in c.series}
    xlabel = (
        "concurrency" if axes == {"concurrency"} else "request rate (req/s)" if axes == {"request_rate"} else "load"
    )
    for s in c.series:
        xs = [p.x for p in s.points]
        ax_tp.plot(xs, [p.output_throughput for p in s.points], marker="o", label=s.key)
        ax_lat.plot(xs, [p.e2e_p90_ms for p in s.points], marker="o", label=s.key)
    for ax, title, ylabel in (
        (ax_tp, "output throughput", "tokens/s"),
        (ax_lat, "p90 end-to-end latency", "ms"),
    ):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if axes == {"concurrency"} and max(p.x for s in c.series for p in s.points) >= 8:
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    ax_tp.legend(fontsize="small")
    fig.tight_layout()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot write the plot to {out}: {e}") from e
    finally:
        plt.close(fig)
    return out
