"""A PNG of loss and accuracy per round, written next to a job's metrics.

People judge a training run from its curves first. The plot is drawn with matplotlib's object
API on an Agg canvas, never pyplot: no display is needed, no global backend is switched in a
process that may be the user's own (the SDK runs nodes in-process), and several node threads
may draw at once. matplotlib is imported only here, only when a plot is written.

Every label is a fixed word except the title, which carries the job's name: a peer's text.
It is drawn through :func:`plot_label`, with control characters escaped, and with
``parse_math=False``, so ``$\\x$`` is text rather than a mathtext error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuflex.safetext import printable


def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            xs.append(int(row["round"]))
            ys.append(float(value))
    return xs, ys


def plot_label(text: str) -> str:
    """Untrusted text for a plot label; draw it with ``parse_math=False``."""
    return printable(text, 120)


def plot_metrics(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path | None:
    """Write loss (test and train) and accuracy per round to ``path``; None when there is no
    round to plot or matplotlib is missing (the CSV and JSON still carry every number)."""
    if not rows:
        return None
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(9, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    loss_ax, acc_ax = fig.subplots(1, 2)
    for key, label in (("loss", "test loss"), ("train_loss", "train loss")):
        xs, ys = _series(rows, key)
        if xs:
            loss_ax.plot(xs, ys, marker="o", markersize=3, label=label)
    loss_ax.set(xlabel="round", ylabel="loss", title="loss")
    loss_ax.legend(loc="best")
    xs, ys = _series(rows, "accuracy")
    acc_ax.plot(xs, ys, marker="o", markersize=3, color="tab:green")
    acc_ax.set(xlabel="round", ylabel="accuracy", title="test accuracy", ylim=(0, 1))
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    if title:
        fig.suptitle(plot_label(title), parse_math=False)  # a job name is peer text: "$\\x$" is not mathtext
    fig.tight_layout()
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    fig.savefig(tmp, format="png")
    tmp.replace(out)
    return out
