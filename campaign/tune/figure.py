"""The tune's figure: the objective over trials (best so far as a step), and the throughput-latency front.

matplotlib is the optional ``plot`` extra, imported only here and only when a figure is drawn (Agg backend); without
it the tune report simply has no figure.
"""

from __future__ import annotations

from pathlib import Path

from campaign.records.tune import TuneReport


def draw(report: TuneReport, path: Path) -> Path | None:
    """Draw ``report`` to ``path`` (PNG); None when matplotlib is not installed or nothing passed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ok = [t for t in report.trials if t.outcome == "passed" and t.objective is not None]
    if not ok:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    sign = 1.0 if report.higher_is_better else -1.0
    best: list[float] = []
    for t in ok:
        value = t.objective or 0.0
        best.append(value if not best or sign * value > sign * best[-1] else best[-1])
    left.plot([t.number for t in ok], [t.objective for t in ok], "o", label="passed trial")
    left.step([t.number for t in ok], best, where="post", label="best so far")
    failed = [t.number for t in report.trials if t.outcome in ("failed", "rejected")]
    if failed:
        left.plot(
            failed, [min(t.objective or 0.0 for t in ok)] * len(failed), "x", color="red", label="failed/rejected"
        )
    left.set_xlabel("trial")
    left.set_ylabel(report.objective)
    left.set_title("objective over trials")
    left.legend()
    lat = [t for t in ok if t.latency_ms is not None]
    right.plot([t.latency_ms for t in lat], [t.objective for t in lat], "o", alpha=0.6)
    front: list[tuple[float, float]] = []
    for t in sorted(lat, key=lambda t: (t.latency_ms or 0.0, -sign * (t.objective or 0.0))):
        if not front or sign * (t.objective or 0.0) > sign * front[-1][1]:
            front.append((t.latency_ms or 0.0, t.objective or 0.0))
    if front:
        right.step([f[0] for f in front], [f[1] for f in front], where="post", color="black", label="front")
        right.legend()
    right.set_xlabel("median TTFT at the objective's level (ms)")
    right.set_ylabel(report.objective)
    right.set_title("throughput-latency front")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
