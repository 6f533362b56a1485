"""Library packages never import Prefect; importing them pulls no heavy engine; imports flow one way; no cycles.

The module graph is built from the AST of every file (imports inside functions included, relative imports
resolved), so a lazy import cannot hide a cycle or a layer violation.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# evaluation sits below training (deviation from STYLE.md, see README "Layers"): rewards need the metrics and
# rollouts need the benchmark records, while evaluation itself never runs a model.
LAYERS = ["infra", "retrieval", "evaluation", "training", "tasks", "flows"]
LIBRARY = ["infra", "retrieval", "training", "evaluation"]
HEAVY = ["prefect", "faiss", "torch", "vllm", "verl", "colbert", "mlflow", "transformers", "bm25s"]
# Layers inside training/: a package may import its own rank or lower. em and rl share a rank and may not import
# each other; smartsearch sits above both. training.refs (shared refs) and training/__init__ are usable by all.
TRAINING_RANKS: dict[str, int] = {
    "refs": -1,
    "generation": 0,
    "protocols": 1,
    "agent": 2,
    "rewards": 3,
    "warmup": 4,
    "sft": 5,
    "em": 6,
    "rl": 6,
    "smartsearch": 7,
}


HEAVY_AT_IMPORT = ["torch", "faiss", "mlflow", "transformers", "vllm", "verl", "prefect"]


@pytest.mark.parametrize("package", LIBRARY)
def test_import_is_light(package: str) -> None:
    """Importing every module of the package (not only its ``__init__``) pulls in none of the heavy engines."""
    code = (
        "import sys, importlib, pathlib\n"
        f"root = pathlib.Path({str(REPO)!r})\n"
        "failed = []\n"
        f"for path in sorted((root / {package!r}).rglob('*.py')):\n"
        "    parts = path.relative_to(root).with_suffix('').parts\n"
        "    name = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)\n"
        "    before = set(sys.modules)\n"
        "    importlib.import_module(name)\n"
        f"    new = sorted(m for m in {HEAVY_AT_IMPORT!r} if m in sys.modules and m not in before)\n"
        "    if new:\n"
        "        failed.append(name + ': ' + ','.join(new))\n"
        "        for m in [m for m in sys.modules if m.split('.')[0] in new]:\n"
        "            del sys.modules[m]\n"
        "print('\\n'.join(failed))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"importing these {package} modules pulled in heavy engines:\n{out.stdout}"


# ---- config modules are leaves ---------------------------------------------------------------------------------
# A config module (``config.py`` in a library package) imports, anywhere in the file (``if TYPE_CHECKING:`` blocks
# aside), only the standard library, pydantic, the light infra modules, and other leaves; a project module is a
# leaf when the same holds for it. TRL's grpo_config.py (dataclasses + TrainingArguments) is the shape followed.
LEAF_THIRD_PARTY = {"pydantic", "typing_extensions", "__future__"}
LEAF_INFRA = {"infra.config", "infra.errors", "infra.lazy"}


def _leaf_imports(path: Path) -> tuple[set[str], set[str]]:
    """(third-party top-level names, project modules) imported by ``path`` outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    third: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            third.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            third.add(node.module.split(".")[0])
    third -= set(sys.stdlib_module_names) | set(LAYERS) | LEAF_THIRD_PARTY
    return third, set()


def leaf_violations(root: Path, graph: Mapping[str, Iterable[str]], modules: Iterable[str]) -> list[str]:
    """Why each of ``modules`` is not a leaf (empty list: all are): the chain to the first offending import."""

    def path_of(module: str) -> Path:
        p = root.joinpath(*module.split("."))
        return p / "__init__.py" if p.is_dir() else p.with_suffix(".py")

    verdict: dict[str, str | None] = {}

    def why(module: str, chain: tuple[str, ...]) -> str | None:
        if module in LEAF_INFRA:
            return None
        if module in verdict:
            return verdict[module]
        if module in chain:  # a cycle is reported elsewhere
            return None
        third, _ = _leaf_imports(path_of(module))
        reason = f"{module} imports {sorted(third)}" if third else None
        if reason is None:
            for target in sorted(graph.get(module, ())):
                if target.split(".")[0] == "infra" and target not in LEAF_INFRA:
                    reason = f"{module} -> {target} (not a light infra module)"
                    break
                sub = why(target, (*chain, module))
                if sub:
                    reason = f"{module} -> {sub}"
                    break
        verdict[module] = reason
        return reason

    return [r for m in sorted(modules) if (r := why(m, ()))]


def config_modules(root: Path) -> list[str]:
    """Every ``config.py`` of the library packages except ``infra/config.py`` (the base they all build on)."""
    return sorted(
        ".".join(p.relative_to(root).with_suffix("").parts)
        for package in LIBRARY for p in (root / package).rglob("config.py")
        if p.relative_to(root).as_posix() != "infra/config.py"
    )


def test_config_modules_are_leaves() -> None:
    modules = config_modules(REPO)
    assert {"training.rl.config", "training.em.config", "training.smartsearch.config"} <= set(modules)
    problems = leaf_violations(REPO, module_graph(REPO, LAYERS), modules)
    assert not problems, "config modules must be leaves:\n" + "\n".join(problems)


def test_leaf_checker_catches_an_engine_import_in_a_config(tmp_path: Path) -> None:
    """A config importing a module that imports torch (inside a function) is reported with the chain."""
    pkg = tmp_path / "training" / "rl"
    pkg.mkdir(parents=True)
    for init in (tmp_path / "training" / "__init__.py", pkg / "__init__.py"):
        init.write_text('"""x."""\n')
    (pkg / "config.py").write_text("from pydantic import BaseModel\nfrom training.rl.engine import X\n")
    (pkg / "engine.py").write_text("X = 1\ndef f():\n    import torch\n")
    (pkg / "spec.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n")
    graph = module_graph(tmp_path, ["training"])
    assert leaf_violations(tmp_path, graph, ["training.rl.spec"]) == []
    assert leaf_violations(tmp_path, graph, ["training.rl.config"]) == [
        "training.rl.config -> training.rl.engine imports ['torch']"]


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


# ---- the module graph ---------------------------------------------------------------------------------------------


def module_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module name -> the project modules it imports anywhere in the file (function bodies included).

    ``from pkg import name`` counts as an edge to ``pkg.name`` when that is a module, else to ``pkg``.
    Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` too; those implicit parent edges are not counted
    (every re-exporting ``__init__`` would otherwise be a cycle).
    """
    files: dict[str, Path] = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(t for a in node.names if (t := owner(a.name)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    prefix = here[: len(here) - (node.level - 1)]
                    base = ".".join([*prefix, base] if base else prefix)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = full if full in files else owner(base)
                    if target:
                        targets.add(target)
        targets.discard(module)
        graph[module] = targets
    return graph


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph.get(nxt, ()))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def training_layer_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Imports inside training/ that go up the layer order or across between em and rl."""
    problems = []
    for module, targets in sorted(graph.items()):
        parts = module.split(".")
        if parts[0] != "training" or len(parts) < 2:
            continue
        for target in sorted(targets):
            tparts = target.split(".")
            if tparts[0] != "training" or len(tparts) < 2 or tparts[1] == parts[1]:
                continue
            src, dst = TRAINING_RANKS.get(parts[1]), TRAINING_RANKS.get(tparts[1])
            if src is None or dst is None:
                problems.append(f"{module} -> {target}: training/{parts[1] if src is None else tparts[1]} has no layer")
            elif dst != -1 and dst >= src:
                problems.append(f"{module} -> {target}: training/{parts[1]} may not import training/{tparts[1]}")
    return problems


def test_no_module_cycles() -> None:
    cycles = find_cycles(module_graph(REPO, LAYERS))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_training_layer_order() -> None:
    problems = training_layer_violations(module_graph(REPO, ["training"]))
    assert not problems, "\n".join(problems)


def test_checker_catches_a_planted_cycle_and_layer_violation(tmp_path: Path) -> None:
    """A cycle hidden in a function-level relative import, and sft importing em, are both reported."""
    pkg = tmp_path / "training"
    for sub in ("em", "sft", "generation"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text('"""x."""\n')
    (pkg / "__init__.py").write_text('"""x."""\n')
    (pkg / "generation" / "a.py").write_text("from training.generation import b\n")
    (pkg / "generation" / "b.py").write_text("def f():\n    from .a import x\n    return x\n")
    (pkg / "sft" / "w.py").write_text("def g():\n    import training.em.s\n")
    (pkg / "em" / "s.py").write_text("from training.sft.w import g\n")
    graph = module_graph(tmp_path, ["training"])
    assert graph["training.generation.b"] == {"training.generation.a"}
    cycles = find_cycles(graph)
    assert ["training.generation.a", "training.generation.b"] in cycles
    assert ["training.em.s", "training.sft.w"] in cycles
    problems = training_layer_violations(graph)
    assert problems == ["training.sft.w -> training.em.s: training/sft may not import training/em"]


def test_em_and_rl_are_independent() -> None:
    graph = {"training.em.x": {"training.rl.y"}, "training.rl.y": set(), "training.rl.z": {"training.refs"}}
    expected = "training.em.x -> training.rl.y: training/em may not import training/rl"
    assert training_layer_violations(graph) == [expected]
