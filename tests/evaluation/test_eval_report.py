"""Markdown report with the metrics table, intervals and a real matplotlib PNG, written atomically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from evaluation.metrics import aggregate
from evaluation.report import render_table, write_report

EXAMPLES = [
    {"dataset": "hotpotqa", "em": 1.0, "f1": 1.0, "acc": 1.0, "searches": 2.0},
    {"dataset": "hotpotqa", "em": 0.0, "f1": 0.5, "acc": 1.0, "searches": 1.0},
    {"dataset": "musique", "em": 0.0, "f1": 0.0, "acc": 0.0, "searches": 3.0},
]


def test_render_table_cells_and_rows() -> None:
    table = aggregate(EXAMPLES, n_resamples=200)
    md = render_table(table)
    lines = md.splitlines()
    assert lines[0] == "| dataset | n | em | f1 | acc | searches |"
    # hotpotqa em mean 0.5 -> "50.0 [..]" ; searches is a count -> two decimals
    assert lines[2].startswith("| hotpotqa | 2 | 50.0 [") and "1.50 [" in lines[2]
    assert lines[3].startswith("| musique | 1 | 0.0 [0.0, 0.0]")
    assert lines[4].startswith("| **ALL** | 3 | 33.3 [")


def test_write_report_files(tmp_path: Path) -> None:
    table = aggregate(EXAMPLES, n_resamples=200)
    ref = write_report(table, tmp_path / "rep", title="demo", details={"model": "smollm2"}, notes=["judge skipped"])
    md = Path(ref.markdown).read_text()
    assert md.startswith("# demo") and "- **model**: smollm2" in md and "- judge skipped" in md
    assert "![per-dataset scores](scores.png)" in md and "| musique | 1 |" in md
    png = Path(ref.plot).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["report.md", "scores.png"]  # no temp files


def test_report_without_plottable_metrics(tmp_path: Path) -> None:
    table = aggregate([{"dataset": "a", "searches": 1.0}], n_resamples=50)
    ref = write_report(table, tmp_path)
    assert ref.plot is None and "![" not in Path(ref.markdown).read_text()


def test_importing_report_does_not_import_matplotlib() -> None:
    code = "import sys, evaluation.report, evaluation.judge; print('matplotlib' in sys.modules, 'httpx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False False"
