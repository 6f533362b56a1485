"""Library packages never import Prefect; importing them pulls no heavy engine; imports flow one way."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# evaluation sits below training (deviation from STYLE.md, see README "Layers"): rewards need the metrics and
# rollouts need the benchmark records, while evaluation itself never runs a model.
LAYERS = ["infra", "retrieval", "evaluation", "training", "tasks", "flows"]
LIBRARY = ["infra", "retrieval", "training", "evaluation"]
HEAVY = ["prefect", "faiss", "torch", "vllm", "verl", "colbert", "mlflow", "transformers", "bm25s"]


@pytest.mark.parametrize("package", LIBRARY)
def test_import_is_light(package: str) -> None:
    code = (
        "import sys, importlib, pkgutil\n"
        f"pkg = importlib.import_module({package!r})\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import {package} pulled in {out.stdout.strip()}"


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_library_never_imports_prefect_and_layers_flow_one_way() -> None:
    problems = []
    for i, layer in enumerate(LAYERS):
        for path in (REPO / layer).rglob("*.py"):
            imported = _imported_top_levels(path)
            if layer in LIBRARY and "prefect" in imported:
                problems.append(f"{path.relative_to(REPO)} imports prefect")
            for higher in LAYERS[i + 1 :]:
                if higher in imported:
                    problems.append(f"{path.relative_to(REPO)} ({layer}) imports {higher}")
    assert not problems, "\n".join(problems)
