"""``python -m shim report --plot``: device memory over time from SHIM_TRACE records (needs matplotlib)."""
from __future__ import annotations

from shim.observe.events import GiB
from shim.observe.tracefile import Trace, runs, stamp

INEFFECTIVE_COLOUR = "#d62728"
"""Red, kept out of the ranks' colours: ineffective sleeps stand out."""


def plot(trace: "Trace | list", out: str) -> None:
    """:func:`figure` written to ``out``. Raises OSError / ValueError when it cannot be written."""
    import matplotlib.pyplot as plt

    fig = figure(trace)
    try:
        fig.savefig(out)
    finally:
        plt.close(fig)


def figure(trace: "Trace | list"):
    """Device memory in use over time (needs matplotlib): one panel per run, one colour per
    rank; the sleep pool's size as a dashed line; sleeps (v) and wakes (^) marked, ineffective
    sleeps as large red crosses; the memory axis starts at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if isinstance(trace, list):
        records, trace = trace, Trace()
        trace.records = sorted(records, key=lambda r: r["t"])
    groups = runs(trace) or [[]]
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 3.2 * len(groups) + 0.8), squeeze=False)
    colours = [c for c in plt.rcParams["axes.prop_cycle"].by_key().get("color", []) if c != INEFFECTIVE_COLOUR] or ["C0"]
    marked_bad = False
    for number, (group, ax) in enumerate(zip(groups, axes[:, 0]), 1):
        t0 = min((p["start"] for p in group), default=0.0)
        for i, proc in enumerate(group):
            colour = colours[i % len(colours)]
            pts = [(r["t"] - t0, (r["total"] - r["free"]) / GiB, r) for r in proc["records"]
                   if r.get("free") is not None and r.get("total") is not None]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ax.step(xs, [p[1] for p in pts], where="post", color=colour,
                    label=f"rank {proc['rank']} in use (pid {proc['pid']})")
            pool = [(x, r["tracked"] / GiB) for x, _, r in pts if isinstance(r.get("tracked"), (int, float))]
            if pool:
                ax.step([p[0] for p in pool], [p[1] for p in pool], where="post", color=colour, linestyle="--",
                        linewidth=1, label=f"rank {proc['rank']} sleep pool")
            for marker, event in (("v", "sleep"), ("^", "wake")):
                sel = [(x, y) for x, y, r in pts if r["event"] == event and r.get("effective") is not False]
                if sel:
                    ax.plot([p[0] for p in sel], [p[1] for p in sel], linestyle="none", marker=marker,
                            color=colour, markersize=5)
            bad = [(x, y) for x, y, r in pts if r["event"] == "sleep" and r.get("effective") is False]
            if bad:
                ax.plot([p[0] for p in bad], [p[1] for p in bad], linestyle="none", marker="X", color=INEFFECTIVE_COLOUR,
                        markersize=11, markeredgecolor="black", zorder=5,
                        label=None if marked_bad else "ineffective sleep")
                marked_bad = True
        ax.set_ylim(bottom=0)
        ax.set_ylabel("device memory (GiB)")
        ax.set_title(f"run {number}, started {stamp(t0)}: v sleep, ^ wake, dashed: sleep pool" if group
                     else "no events")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the run's first event")
    fig.tight_layout()
    return fig
