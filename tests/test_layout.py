"""The layout shows the architecture: a shared core, per-example gradient providers, accounting, one package per
method; no import cycle (function-level imports count), the core imports no method, no method imports another."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lightning_dprel", "datamodules", "callbacks")
# The training path: datamodule → batch → module → optimizer hook → ledger/callback (accounting math and
# dataset parsers are not on it).
TRAINING_PATH = [
    "lightning_dprel/datamodules/edge_tuples/datamodule.py", "lightning_dprel/datamodules/edge_tuples/coupled_stream.py",
    "lightning_dprel/datamodules/edge_tuples/graph_prep.py", "lightning_dprel/datamodules/edge_tuples/rows.py",
    "lightning_dprel/datamodules/edge_tuples/sampling.py", "lightning_dprel/datamodules/edge_tuples/batch.py", "lightning_dprel/grad_sample/per_tuple.py", "lightning_dprel/methods/relational/module.py",
    "lightning_dprel/core/clipping.py", "lightning_dprel/core/optim.py", "lightning_dprel/core/randomness.py", "lightning_dprel/core/ledger.py",
    "lightning_dprel/core/budget.py", "lightning_dprel/callbacks/privacy.py", "lightning_dprel/callbacks/checks.py",
]
MAX_LINES = 370  # "~350", with a docstring's worth of slack


def _module_graph() -> dict[str, set[str]]:
    files = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            files[name.removesuffix(".__init__")] = f
    graph = {}
    for name, f in files.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):  # every import, function-level ones included
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                deps |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, stack, found = {}, [], []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


def test_training_path_files_are_small():
    sizes = {p: len((ROOT / p).read_text().splitlines()) for p in TRAINING_PATH}
    assert all((ROOT / p).exists() for p in TRAINING_PATH)
    assert max(sizes.values()) <= MAX_LINES, {p: n for p, n in sizes.items() if n > MAX_LINES}


def test_no_import_cycles():
    graph = _module_graph()
    assert len(graph) > 30 and graph["lightning_dprel.core.optim"] >= {"lightning_dprel.core.events", "lightning_dprel.core.randomness"}
    assert _cycles(graph) == []


def test_the_library_never_imports_the_top_level_packages():
    """``callbacks`` / ``datamodules`` are thin re-exports for users; a user project may have its own (issue 12)."""
    graph = _module_graph()
    offenders = {m: sorted(d for d in deps if d.split(".")[0] in ("callbacks", "datamodules"))
                 for m, deps in graph.items() if m.startswith("lightning_dprel")}
    assert not any(offenders.values()), offenders
    for top in ("callbacks", "datamodules"):
        lines = (ROOT / top / "__init__.py").read_text().count("\n")
        assert lines < 15  # re-exports only


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_a_user_project_with_its_own_callbacks_and_datamodules_packages(tmp_path):
    import subprocess
    import sys

    for name in ("callbacks", "datamodules"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MINE = {name!r}\n")
    code = (
        "import callbacks, datamodules\n"
        "assert callbacks.MINE == 'callbacks' and datamodules.MINE == 'datamodules'  # the user's own packages win\n"
        "from lightning_dprel import PrivacyCallback, RelationalDataModule, ValidationSelection\n"
        "import lightning_dprel.cli, lightning_dprel.datamodules.datasets\n"
        "print(PrivacyCallback.__module__, RelationalDataModule.__module__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["lightning_dprel.callbacks.privacy", "lightning_dprel.datamodules.edge_tuples.datamodule"]
    cli = subprocess.run([sys.executable, "-m", "lightning_dprel", "fit", "--config", str(Path(ROOT) / "configs" / "tiny.yaml"),
                          "--print_config"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "lightning_dprel.callbacks.PrivacyCallback" in cli.stdout, cli.stderr[-2000:]
