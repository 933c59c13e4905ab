"""The layout rules docs/architecture.md states, each checked: a shared core, per-example gradient providers,
accounting, one package per method; no import cycle; the core, grad_sample/ and accounting/ never reach a method; no
method imports another; per-example gradients through grad_sample/'s one entry point; no core module named after a
method; every datamodule a PrivateDataModule, every method's model a privacy layer or free of
privacy facts; one privacy-layer protocol the callback talks to alone; no fixtures in library
code; a small package root. Imports are read with ``ast``: top-level and function-level ones
count."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lightning_dprel", "datamodules", "callbacks")
LIB = "lightning_dprel"
METHODS = f"{LIB}.methods"
SHARED = (f"{LIB}.core", f"{LIB}.grad_sample", f"{LIB}.accounting")  # the layers every method builds on
ABOVE_SHARED = (METHODS, f"{LIB}.callbacks", f"{LIB}.export", f"{LIB}.cli")  # what the shared layers never reach
GRAD_SAMPLE_ENTRY = (f"{LIB}.grad_sample", f"{LIB}.grad_sample.base", f"{LIB}.grad_sample.dispatch")
GRADIENT_TRANSFORMS = {"vmap", "grad", "grad_and_value", "jacrev", "jacfwd", "vjp", "jvp", "hessian"}
MAX_ROOT_MODULES = 12
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


def _files() -> dict[str, Path]:
    files = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            files[".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = f
    return files


def _imports(f: Path) -> set[str]:
    """Every module ``f`` imports, anywhere in the file (``from m import x`` gives ``m`` and ``m.x``)."""
    deps = set()
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            deps |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            deps |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return deps


def _module_graph() -> dict[str, set[str]]:
    files = _files()
    return {name: {d for d in _imports(f) if d in files and d != name} for name, f in files.items()}


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


def _reach(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module ``start`` reaches through imports, with one import path to it."""
    paths, todo = {start: [start]}, [start]
    while todo:
        u = todo.pop()
        for v in sorted(graph.get(u, ())):
            if v not in paths:
                paths[v] = paths[u] + [v]
                todo.append(v)
    return paths


def _under(name: str, prefixes: tuple[str, ...] | str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in ((prefixes,) if isinstance(prefixes, str) else prefixes))


def _method_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if _under(name, METHODS) and len(parts) > 2 else None


def _method_names() -> list[str]:
    return sorted(p.name for p in (ROOT / LIB / "methods").iterdir() if (p / "__init__.py").exists())


# --- the rules -------------------------------------------------------------------------------------------------
def test_no_import_cycles():
    graph = _module_graph()
    assert len(graph) > 30 and graph["lightning_dprel.core.optim"] >= {"lightning_dprel.core.events", "lightning_dprel.core.randomness"}
    assert _cycles(graph) == []


def test_core_grad_sample_and_accounting_never_reach_a_method_a_callback_export_or_the_cli():
    graph = _module_graph()
    offenders = {}
    for name in sorted(graph):
        if _under(name, SHARED):
            bad = {v: " → ".join(p) for v, p in _reach(graph, name).items() if _under(v, ABOVE_SHARED)}
            if bad:
                offenders[name] = sorted(bad.values())[0]
    assert not offenders, offenders


def test_no_method_imports_another_method():
    offenders = {name: sorted(d for d in deps if _method_of(d) not in (None, _method_of(name)))
                 for name, deps in _module_graph().items() if _method_of(name)}
    assert len(_method_names()) >= 4
    assert not any(offenders.values()), {k: v for k, v in offenders.items() if v}


def test_methods_reach_per_example_gradients_only_through_the_grad_sample_entry_point():
    files, offenders = _files(), {}
    for name, f in files.items():
        if not _method_of(name):
            continue
        deps = _imports(f)
        providers = sorted(d for d in deps if _under(d, f"{LIB}.grad_sample")  # a module must be an entry, a name from one
                           and (d not in GRAD_SAMPLE_ENTRY if d in files else d.rsplit(".", 1)[0] not in GRAD_SAMPLE_ENTRY))
        transforms = sorted(d for d in deps if d.rsplit(".", 1)[0] in ("torch.func", "functorch")
                            and d.rsplit(".", 1)[1] in GRADIENT_TRANSFORMS)
        attrs = sorted({ast.unparse(n) for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.Attribute)
                        and n.attr in GRADIENT_TRANSFORMS and ast.unparse(n.value) in ("torch", "torch.func", "functorch")})
        if providers or transforms or attrs:
            offenders[name] = providers + transforms + attrs
    assert not offenders, offenders


HOOKS = {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
         "register_hook", "register_full_backward_pre_hook", "register_backward_hook",
         "register_module_forward_hook", "register_module_forward_pre_hook",
         "register_module_full_backward_hook"}


def _taps(source: str) -> list[str]:
    """What taps layers in ``source``: autograd.Function subclasses and hook registrations."""
    found = []
    for node in ast.walk(ast.parse(source)):
        bases = [ast.unparse(b).split(".")[-1] for b in getattr(node, "bases", ())]
        if isinstance(node, ast.ClassDef) and "Function" in bases:
            found.append(f"class {node.name}")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in HOOKS:
            found.append(node.func.attr)
    return found


def test_grad_sample_reaches_no_encoder_or_method_and_has_one_ghost_implementation():
    files, graph = _files(), _module_graph()
    bad = {name: sorted(v for v in _reach(graph, name) if _under(v, (f"{LIB}.encoders", METHODS)))
           for name in files if _under(name, f"{LIB}.grad_sample")}
    # exactness is declared by the encoder, not listed in grad_sample/
    assert len(bad) > 5 and not any(bad.values()), {k: v for k, v in bad.items() if v}
    registry = [name for name, f in files.items() if any(
        isinstance(n, ast.FunctionDef) and n.name == "register_layer_rule"
        for n in ast.walk(ast.parse(f.read_text())))]
    assert len(registry) == 1, registry  # one registry of per-layer rules
    tapping = {name: found for name, f in files.items() if (found := _taps(f.read_text()))}
    assert set(tapping) == set(registry), tapping  # and only its module taps layers
    assert _taps("class T(torch.autograd.Function): ...\nm.register_forward_hook(h)") == [
        "class T", "register_forward_hook"]


def test_no_module_of_the_shared_layers_is_named_after_a_method():
    methods = set(_method_names())
    named = sorted(name for name in _files() if _under(name, SHARED) and methods & set(name.split(".")[2:]))
    assert not named, named


def _defaults(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, value) of every string a module states as a default: a function's default arguments,
    a class field's default, a module constant named ``*DEFAULT*``, a ``default=`` keyword (tuples
    and lists count their strings), an ``or`` fallback."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            found += node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
        elif isinstance(node, ast.ClassDef):
            fields = [n for n in node.body if isinstance(n, ast.AnnAssign)]
            found += [n.value for n in fields if n.value is not None]
        elif isinstance(node, ast.keyword) and node.arg == "default":
            found.append(node.value)
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            found.append(node.values[-1])  # ``x or "fallback"``
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [node.value for t in targets if isinstance(t, ast.Name) and "DEFAULT" in t.id]
    strings = []
    for expr in found:
        for n in ast.walk(expr):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                strings.append((n.lineno, n.value))
    return strings


def _named(files: dict[str, Path], names: set[str]) -> list[str]:
    shared = [(m, f) for m, f in files.items() if _under(m, (f"{LIB}.core", f"{LIB}.accounting"))]
    return sorted(f"{mod}:{line} {value!r}" for mod, f in shared
                  for line, value in _defaults(ast.parse(f.read_text())) if value in names)


def test_no_default_of_the_core_or_accounting_names_a_method_a_unit_or_a_mechanism():
    from lightning_dprel.accounting import registered_mechanisms
    from lightning_dprel.core.discovery import import_methods
    from lightning_dprel.core.specs import PRIVACY_UNITS

    from lightning_dprel.core.clipping_modes import CLIPPINGS

    assert import_methods() == {}
    methods_clipping = {n for n in CLIPPINGS if not _under(CLIPPINGS[n].factors.__module__, f"{LIB}.core")}
    names = set(_method_names()) | set(PRIVACY_UNITS) | set(registered_mechanisms()) | methods_clipping
    assert {"relational", "entity", "freq_corrected", "poisson_gaussian", "freq"} <= names
    assert not _named(_files(), names), _named(_files(), names)


def _library_classes(base: type, prefix: str) -> list[type]:
    """Classes defined in modules under ``prefix`` (demos excluded) that subclass ``base``."""
    found = {}
    for name in _files():
        if _under(name, prefix) and not _under(name, f"{LIB}.demos") and not name.endswith("__main__"):
            module = importlib.import_module(name)
            for cls in vars(module).values():
                if inspect.isclass(cls) and issubclass(cls, base) and cls.__module__ == name:
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


@pytest.mark.filterwarnings("ignore")
def test_every_datamodule_is_a_private_datamodule_declaring_a_registered_unit():
    from pytorch_lightning import LightningDataModule

    from lightning_dprel.core.datamodule import PrivateDataModule
    from lightning_dprel.core.specs import privacy_unit

    datamodules = _library_classes(LightningDataModule, LIB)
    assert len(datamodules) >= 4
    offenders = [c.__qualname__ for c in datamodules if not issubclass(c, PrivateDataModule)]
    assert not offenders, f"not PrivateDataModules: {offenders}"
    for cls in datamodules:
        if not inspect.isabstract(cls) and hasattr(cls, "privacy_unit"):
            privacy_unit(cls.privacy_unit)  # a registered unit (raises otherwise)


def _privacy_facts() -> set[str]:
    """The names a privacy layer states: the protocol's members, and the facts a plain module may
    not state by hand."""
    from lightning_dprel.core.attached import HAND_MADE_FACTS
    from lightning_dprel.core.privacy_layer import PrivacyLayer

    names = [*vars(PrivacyLayer), *PrivacyLayer.__annotations__]
    return {n for n in names if not n.startswith("_")} | set(HAND_MADE_FACTS)


@pytest.mark.filterwarnings("ignore")
def test_every_lightning_module_of_a_method_is_a_privacy_layer_or_states_no_privacy_fact():
    """A method's model carries its own layer (a LedgerModule), or is a plain module that
    PrivacyCallback makes private: then it states no privacy fact (the attached layer does)."""
    from pytorch_lightning import LightningModule

    from lightning_dprel.core.ledger_module import LedgerModule

    modules = _library_classes(LightningModule, METHODS)
    facts = _privacy_facts()
    assert len(modules) >= 4 and {"noise_spec", "privacy_ledger", "open_fit", "charge"} <= facts
    offenders = {c.__qualname__: sorted(n for n in facts if hasattr(c, n))
                 for c in modules if not issubclass(c, LedgerModule)}
    assert not any(offenders.values()), f"plain modules stating privacy facts: {offenders}"


def _probes(f: Path, facts: set[str]) -> list[str]:
    """``getattr``/``hasattr`` calls in ``f`` that ask a model or its layer for a privacy fact, or
    for a name not written out (a datamodule's or a loader's facts are the data's to state)."""
    found = []
    for node in ast.walk(ast.parse(f.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2):
            continue
        name = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
        asked = ast.unparse(node.args[0])
        model = asked in ("pl_module", "module", "layer", "self._layer")
        if model and (name is None or name in facts):
            found.append(f"{f.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_one_privacy_layer_protocol_and_the_callback_talks_to_it_alone():
    """LedgerModule (and the DP-SGD PrivateModule on it) and the attached layer are one hierarchy
    and share its code; the callback never probes a model for a privacy fact; the sample token is
    defined once."""
    from lightning_dprel.core.attached import AttachedDPSGD
    from lightning_dprel.core.ledger_module import LedgerModule
    from lightning_dprel.core.privacy_layer import PrivacyLayer
    from lightning_dprel.core.private_module import PrivateModule

    layers = (LedgerModule, PrivateModule, AttachedDPSGD)
    assert all(issubclass(cls, PrivacyLayer) for cls in layers)
    shared = ("charge", "_charge", "noise_spec", "set_noise_multiplier", "is_private",
              "releases_per_sample", "fit_opened", "charge_data_releases", "epsilon",
              "epsilon_bounds", "report_delta")
    redefined = {cls.__name__: [n for n in shared if n in vars(cls)] for cls in layers}
    assert not any(redefined.values()), redefined
    facts = _privacy_facts()
    probes = [p for f in sorted((ROOT / LIB / "callbacks").glob("*.py")) for p in _probes(f, facts)]
    assert not probes, probes
    counter = [str(f.relative_to(ROOT)) for f in (ROOT / LIB).rglob("*.py")
               if "batch_progress" in f.read_text()]
    assert counter == ["lightning_dprel/core/privacy_layer.py"], counter


def test_the_library_never_imports_its_fixtures():
    """``lightning_dprel.demos`` is for tests and docs, as Lightning's ``demos/boring_classes.py`` (imported by none of
    Lightning's running code)."""
    offenders = {m: sorted(d for d in deps if _under(d, f"{LIB}.demos"))
                 for m, deps in _module_graph().items() if _under(m, LIB) and not _under(m, f"{LIB}.demos")}
    assert not any(offenders.values()), {k: v for k, v in offenders.items() if v}


def test_the_package_root_holds_at_most_12_modules():
    root = sorted(p.name for p in (ROOT / LIB).glob("*.py"))
    assert "__init__.py" in root and len(root) <= MAX_ROOT_MODULES, root


def test_training_path_files_are_small():
    sizes = {p: len((ROOT / p).read_text().splitlines()) for p in TRAINING_PATH}
    assert all((ROOT / p).exists() for p in TRAINING_PATH)
    assert max(sizes.values()) <= MAX_LINES, {p: n for p, n in sizes.items() if n > MAX_LINES}


def test_the_library_never_imports_the_top_level_packages():
    """``callbacks`` / ``datamodules`` are thin re-exports for users; a user project may have its own."""
    graph = _module_graph()
    offenders = {m: sorted(d for d in deps if d.split(".")[0] in ("callbacks", "datamodules"))
                 for m, deps in graph.items() if m.startswith("lightning_dprel")}
    assert not any(offenders.values()), offenders
    for top in ("callbacks", "datamodules"):
        lines = (ROOT / top / "__init__.py").read_text().count("\n")
        assert lines < 15  # re-exports only


DOCUMENTED = ("core", "grad_sample", "accounting", "callbacks", "datamodules", "methods")  # the privacy path


def _undocumented(page: str, files: list[str]) -> list[str]:
    """Files (paths under the package) that ``page`` does not name: by file name, a method by its package folder."""
    missing = set()
    for rel in files:
        parts = rel.split("/")
        if parts[0] == "methods":
            folder = f"methods/{parts[1]}/"
            missing |= {folder} if folder not in page else ({rel} if f"`{parts[-1]}`" not in page else set())
        elif f"`{parts[-1]}`" not in page and f"`{rel}`" not in page:
            missing.add(rel)
    return sorted(missing)


def _privacy_path_files() -> list[str]:
    files = []
    for f in sorted((ROOT / LIB).rglob("*.py")):
        parts = f.relative_to(ROOT / LIB).parts
        if parts[0] not in DOCUMENTED or f.name in ("__init__.py", "__main__.py"):
            continue
        if parts[:2] == ("datamodules", "datasets") or (parts[0] == "accounting" and len(parts) > 2):
            continue  # graph sources and pure accounting kernels: named by their folder
        files.append("/".join(parts))
    return files


def test_the_architecture_page_names_every_file_of_the_privacy_path():
    page = (ROOT / "docs" / "architecture.md").read_text()
    files = _privacy_path_files()
    assert len(files) > 60
    assert not _undocumented(page, files)


# --- the checkers can fail --------------------------------------------------------------------------------------
def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_reach_follows_imports_through_other_modules():
    graph = {"core.x": {"util"}, "util": {"methods.m.module"}, "methods.m.module": set()}
    assert _reach(graph, "core.x")["methods.m.module"] == ["core.x", "util", "methods.m.module"]
    assert _method_of(f"{METHODS}.advsgm.module") == "advsgm" and _method_of(f"{LIB}.core.ledger") is None


def test_the_default_finder_finds_each_kind_of_default(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "from dataclasses import dataclass\n"
        "DEFAULT_MECHANISM = 'freq_corrected'\nOTHER = 'entity'\n"
        "def f(a, m='standard', *, unit=('entity',)): pass\n"
        "@dataclass\nclass S:\n    unit: str = 'example'\n"
        "p.add_argument('--m', default='naive')\n"
        "name = given or spent or 'freq_paper'\n"
    )
    got = {value for _, value in _defaults(ast.parse(f.read_text()))}
    assert got == {"freq_corrected", "standard", "entity", "example", "naive", "freq_paper"}  # not OTHER
    found = _named({f"{LIB}.core.m": f, f"{LIB}.methods.m": f}, {"naive"})
    assert found == [f"{LIB}.core.m:8 'naive'"]  # only the shared layers are read


def test_imports_inside_functions_count(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def late():\n    from lightning_dprel.methods.advsgm import module\n    import torch.func\n")
    assert {"lightning_dprel.methods.advsgm", "lightning_dprel.methods.advsgm.module", "torch.func"} <= _imports(f)


@pytest.mark.slow
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


def test_the_documentation_check_finds_an_unnamed_file():
    page = "`core/` holds `ledger.py`; `methods/m/`: `module.py`"
    files = ["core/ledger.py", "core/hidden.py", "methods/m/module.py", "methods/m/extra.py", "methods/n/module.py"]
    assert _undocumented(page, files) == ["core/hidden.py", "methods/m/extra.py", "methods/n/"]

