"""Report charts as inline SVG text (matplotlib): nothing to fetch at view time.

The SVG is made deterministic (fixed hash salt, no date) so the same report renders to
the same bytes, and text stays text (``svg.fonttype: none``) so the page is searchable.
Figures are made with ``matplotlib.figure.Figure`` directly rather than through pyplot,
so no GUI backend is ever selected and nothing global is left behind. matplotlib (with
numpy) is imported on the first chart, not with this module: it costs about 0.4 s, and
the CLI imports the renderers for every command while only a few draw.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from forklab.experiments.experiment.analysis.slices import SliceEffect, feature_text
from forklab.experiments.experiment.report.model import ComparisonRow, WorldRow
from forklab.experiments.experiment.spec import Role

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ROLE_COLOURS = {
    Role.baseline: "#6b7280",
    Role.treatment: "#2563eb",
    Role.placebo: "#a855f7",
    Role.positive_control: "#ea580c",
}
RESCUE_COLOUR = "#059669"
HARM_COLOUR = "#e11d48"


@contextmanager
def _figure(height: float) -> Iterator[tuple[Figure, Axes]]:
    """A figure outside pyplot's global state (no backend, nothing to close or leak)."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(
        {
            "svg.hashsalt": "forklab",
            "svg.fonttype": "none",
            "font.size": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    ):
        fig = Figure(figsize=(7.5, height))
        yield fig, fig.add_subplot()


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def load_renderer() -> None:
    """Import matplotlib and draw a chart with text: a process's first chart pays that
    and the SVG backend's and fonts' loading (~0.3 s); a process that will render
    reports does it ahead (``forklab.workers.experiment.worker.cpu_pool``)."""
    with _figure(1.0) as (fig, ax):
        ax.set_title("forklab")
        _svg(fig)


def rate_axis(worlds: list[WorldRow]) -> float:
    """The right end of the failure-rate axis, in percent: the highest interval bound with
    a margin, rounded up to a multiple of 10 (a fixed 100 % would squash a 39 % maximum
    into the left third of the chart); 100 at most, 10 at least."""
    top = max([0.0, *(w.failure_ci_high for w in worlds if w.episodes)]) * 100
    return float(min(100, max(10, math.ceil(top * 1.08 / 10) * 10)))


def failure_rate_chart(worlds: list[WorldRow]) -> str:
    """Failure rate per world with its Wilson interval, baseline rate as a reference line."""
    rows = [w for w in worlds if w.episodes]
    with _figure(0.45 * len(rows) + 1.2) as (fig, ax):
        ys = list(range(len(rows)))[::-1]
        rates = [w.failure_rate * 100 for w in rows]
        errors = [
            [(w.failure_rate - w.failure_ci_low) * 100 for w in rows],
            [(w.failure_ci_high - w.failure_rate) * 100 for w in rows],
        ]
        ax.barh(ys, rates, color=[ROLE_COLOURS[w.role] for w in rows], height=0.6)
        ax.errorbar(rates, ys, xerr=errors, fmt="none", ecolor="#111827", capsize=3, lw=1)
        base = next((w for w in rows if w.role is Role.baseline), None)
        if base is not None:
            ax.axvline(base.failure_rate * 100, color="#6b7280", ls="--", lw=1)
        ax.set_yticks(ys, [w.name for w in rows], parse_math=False)
        ax.set_xlim(0, rate_axis(rows))
        ax.set_xlabel("failure rate, % of episodes (bars: 95% Wilson interval)")
        return _svg(fig)


def rescue_harm_chart(comparisons: list[ComparisonRow]) -> str:
    """Rescues to the right, harms to the left, per comparison: cancellation made visible."""
    with _figure(0.45 * max(1, len(comparisons)) + 1.2) as (fig, ax):
        ys = list(range(len(comparisons)))[::-1]
        labels = [f"{c.world} vs {c.vs}" for c in comparisons]
        ax.barh(ys, [c.rescue for c in comparisons], color=RESCUE_COLOUR, label="rescues")
        ax.barh(ys, [-c.harm for c in comparisons], color=HARM_COLOUR, label="harms")
        for y, c in zip(ys, comparisons, strict=True):
            ax.annotate(
                f"net {c.net:+d}",
                (max(c.rescue, 0), y),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
            )
        ax.axvline(0, color="#111827", lw=1)
        ax.set_yticks(ys, labels, parse_math=False)
        ax.set_xlabel("episodes (harms left, rescues right)")
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
        return _svg(fig)


def difference_axis(slices: list[SliceEffect]) -> tuple[float, float]:
    """x limits that fit every interval and zero, with a margin: a fixed [-1, 1] would
    squash intervals of a few hundredths into a few pixels."""
    low = min([0.0, *(s.ci_low for s in slices)])
    high = max([0.0, *(s.ci_high for s in slices)])
    pad = max(0.01, (high - low) * 0.08)
    return max(-1.0, low - pad), min(1.0, high + pad)


def slice_forest_chart(title: str, slices: list[SliceEffect]) -> str:
    """Each slice's paired difference with its interval: which slices pay, which harm,
    and which cannot tell (an interval across the zero line)."""
    with _figure(0.35 * max(1, len(slices)) + 1.3) as (fig, ax):
        ys = list(range(len(slices)))[::-1]
        for y, s in zip(ys, slices, strict=True):
            colour = RESCUE_COLOUR if s.ci_low > 0 else HARM_COLOUR if s.ci_high < 0 else "#6b7280"
            ax.errorbar(
                [s.difference],
                [y],
                xerr=[[s.difference - s.ci_low], [s.ci_high - s.difference]],
                fmt="o",
                color=colour,
                capsize=3,
                lw=1.5,
            )
        ax.axvline(0, color="#111827", lw=1)
        # a workload's text is text: matplotlib would read "$…$" in it as mathtext (and
        # raise on an unknown symbol), so its parser is off for every label drawn from data
        labels = [f"{s.feature} = {feature_text(s.value)} (n {s.n})" for s in slices]
        ax.set_yticks(ys, labels, parse_math=False)
        ax.set_xlim(*difference_axis(slices))
        ax.set_xlabel("success-rate difference in the slice (95% Newcombe interval)")
        ax.set_title(title, fontsize=10, loc="left", parse_math=False)
        return _svg(fig)
