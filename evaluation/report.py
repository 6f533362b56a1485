"""Evaluation reports: a markdown file with the per-dataset metrics table (with intervals) and a bar plot.

Both files are written atomically through ``infra.artifacts`` (local paths or ``s3://``). matplotlib is imported
inside :func:`plot_scores` with the Agg backend, so importing this module stays light.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from evaluation.metrics import ScoreTable
from infra import artifacts

PLOT_METRICS: tuple[str, ...] = ("em", "f1", "acc")
RATE_METRICS = {
    "em", "f1", "precision", "recall", "acc", "cem", "acc_l", "gold_recall", "repeated_doc_rate", "format_ok"
}


class ReportRef(BaseModel):
    """Where a report was written."""

    model_config = ConfigDict(frozen=True)

    markdown: str = Field(description="Path or URI of report.md.")
    plot: str | None = Field(description="Path or URI of the PNG plot, or None when no metric could be plotted.")


def _cell(name: str, mean: float, low: float, high: float) -> str:
    if name in RATE_METRICS:  # shown as percentages, as the seeds report them
        return f"{100 * mean:.1f} [{100 * low:.1f}, {100 * high:.1f}]"
    return f"{mean:.2f} [{low:.2f}, {high:.2f}]"


def render_table(table: ScoreTable, metrics: Sequence[str] | None = None) -> str:
    """Markdown table: one row per dataset, each cell ``mean [low, high]`` (rates in percent).

    Args:
        table: the aggregated scores.
        metrics: columns to show (default: all of the table's metrics).
    """
    names = list(metrics or table.metric_names)
    lines = ["| dataset | n | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for row in table.rows:
        cells = []
        for name in names:
            s = row.metrics.get(name)
            cells.append("–" if s is None else _cell(name, s.mean, s.low, s.high))
        label = f"**{row.dataset}**" if row.dataset == "ALL" else row.dataset
        lines.append(f"| {label} | {row.n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_scores(table: ScoreTable, uri: str | os.PathLike[str], metrics: Sequence[str] = PLOT_METRICS) -> bool:
    """Grouped bar chart (datasets x metrics) with bootstrap error bars, written as PNG.

    Returns:
        False (and writes nothing) when none of ``metrics`` is in the table.
    """
    names = [m for m in metrics if any(m in r.metrics for r in table.rows)]
    if not names or not table.rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = {m: 100.0 if m in RATE_METRICS else 1.0 for m in names}
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(table.rows) * len(names) / 2 + 2), 4))
    for j, name in enumerate(names):
        xs, ys, errs = [], [], [[], []]
        for i, row in enumerate(table.rows):
            s = row.metrics.get(name)
            if s is None:
                continue
            xs.append(i + (j - (len(names) - 1) / 2) * width)
            ys.append(s.mean * scale[name])
            errs[0].append(max(0.0, (s.mean - s.low) * scale[name]))
            errs[1].append(max(0.0, (s.high - s.mean) * scale[name]))
        ax.bar(xs, ys, width, yerr=errs, capsize=3, label=name)
    ax.set_xticks(range(len(table.rows)), [r.dataset for r in table.rows])
    ax.set_ylabel("score (%)" if all(scale[m] == 100.0 for m in names) else "score")
    ax.set_title(f"per-dataset scores ({int(table.confidence * 100)}% bootstrap intervals)")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    artifacts.write_bytes(uri, buf.getvalue())
    return True


def render_report(
    table: ScoreTable,
    title: str = "searchloop evaluation",
    details: Mapping[str, object] | None = None,
    notes: Sequence[str] = (),
    plot_name: str | None = "scores.png",
) -> str:
    """The report's markdown text (see :func:`write_report`)."""
    parts = [f"# {title}", "", f"Generated {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())}.", ""]
    if details:
        parts += [f"- **{k}**: {v}" for k, v in details.items()] + [""]
    parts += [
        "## Metrics",
        "",
        f"Mean per dataset with {int(table.confidence * 100)}% percentile-bootstrap intervals in brackets; "
        "rates (EM, F1, acc...) in percent. `ALL` pools every example.",
        "",
        render_table(table),
        "",
    ]
    if plot_name:
        parts += [f"![per-dataset scores]({plot_name})", ""]
    if notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(parts)


def write_report(
    table: ScoreTable,
    out_dir: str | os.PathLike[str],
    title: str = "searchloop evaluation",
    details: Mapping[str, object] | None = None,
    notes: Sequence[str] = (),
    plot_metrics: Sequence[str] = PLOT_METRICS,
) -> ReportRef:
    """Write ``report.md`` and ``scores.png`` into ``out_dir`` (each atomically).

    Args:
        table: aggregated scores.
        out_dir: directory path or URI.
        title: report heading.
        details: key/value lines shown under the title (model, preset, normalization...).
        notes: bullet notes (e.g. the judge's skip message).
        plot_metrics: metrics drawn in the plot.
    """
    plot_uri = artifacts.join(out_dir, "scores.png")
    has_plot = plot_scores(table, plot_uri, plot_metrics)
    md_uri = artifacts.join(out_dir, "report.md")
    artifacts.write_text(md_uri, render_report(table, title, details, notes, "scores.png" if has_plot else None))
    return ReportRef(markdown=md_uri, plot=plot_uri if has_plot else None)
