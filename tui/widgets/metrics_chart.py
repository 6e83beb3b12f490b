"""Loss and accuracy over rounds, the quickest read of whether a job is converging."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from tui.model import Job


class MetricsChart(PlotextPlot):
    DEFAULT_CSS = """
    MetricsChart { min-height: 6; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._shown: object = None

    def show(self, job: Job | None) -> None:
        """Redraw only when the data changed: plotext re-renders the whole plot."""
        key = (job.job_id, job.metrics) if job else None
        if key == self._shown:
            return
        self._shown = key
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        # The legend is the title, above the plot: plotext draws its own legend inside the
        # plot area, over the lines, which a short chart cannot spare.
        plt.title("loss (red, left) · accuracy (green, right) by round")
        rows = [m for m in job.metrics if m.round] if job else []
        losses = [(m.round, m.loss) for m in rows if m.loss is not None]
        accs = [(m.round, m.accuracy) for m in rows if m.accuracy is not None]
        if losses:
            plt.plot(
                [r for r, _ in losses],
                [v for _, v in losses],
                color="red",
                marker="braille",
            )
        if accs:
            plt.plot(
                [r for r, _ in accs],
                [v for _, v in accs],
                color="green",
                marker="braille",
                yside="right",
            )
        if rows:
            # Rounds are whole numbers; plotext would otherwise label 1.0, 2.2, 3.5...
            ticks = sorted({m.round for m in rows})
            step = max(1, len(ticks) // 8)
            plt.xticks(ticks[::step])
        if not losses and not accs:
            plt.title("loss & accuracy by round: waiting for the first commit")
        self.refresh()
