"""The top level holds what the quickstart and the docs type; each method's classes live in its package and the
extension points in ``lightning_dprel.core`` / ``lightning_dprel.accounting``."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_dprel

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = [
    "PrivacyCallback", "ValidationSelection", "DPDataLoader", "GraphSource", "GraphPair", "RelationalDataModule",
    "NodeSplitDataModule", "DPRelationalModule", "MLPEncoder", "TextEncoder", "export_model",
]
METHOD_EXPORTS = {
    "relational": ["DPRelationalModule", "RelationalDataModule"],
    "dp_gcn": ["DPNodeModule", "NodeSplitDataModule", "GNNClassifier"],
    "advsgm": ["DPSkipGramModule", "SkipGramDataModule"],
    "dp_gpl": ["DPGPLModule", "PromptDataModule"],
    "entity_items": ["EntityItemRanker", "EntityItemDataModule"],
}
EXTENSION_POINTS = {
    "lightning_dprel.core": ["LedgerModule", "PrivateModule", "PrivateDataModule", "PrivacyUnit",
                             "register_privacy_unit", "SamplingSpec", "NoiseSpec", "GaussianRelease"],
    "lightning_dprel.accounting": ["register_mechanism", "Accountant"],
}


def test_the_top_level_is_pinned_and_small():
    assert sorted(lightning_dprel.__all__) == sorted(TOP_LEVEL)
    assert len(lightning_dprel.__all__) <= 15
    for name in lightning_dprel.__all__:
        assert getattr(lightning_dprel, name).__name__ == name
    assert set(TOP_LEVEL) <= set(dir(lightning_dprel))


@pytest.mark.parametrize("name", ["TupleBatch", "KeyedStream", "DPOptimizer", "PRIVACY_UNIT", "PrivacyLedger"])
def test_internals_are_not_at_the_top_level(name):
    with pytest.raises(AttributeError, match=name):
        getattr(lightning_dprel, name)


def test_every_top_level_name_is_one_the_docs_type():
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    unused = [n for n in TOP_LEVEL if not re.search(rf"\b{n}\b", text)]
    assert not unused, f"top-level names no page uses: {unused}"


@pytest.mark.parametrize("method", sorted(METHOD_EXPORTS))
def test_each_method_package_exports_its_classes(method):
    package = importlib.import_module(f"lightning_dprel.methods.{method}")
    for name in METHOD_EXPORTS[method]:
        assert name in package.__all__ and getattr(package, name).__name__ == name


@pytest.mark.parametrize("package", sorted(EXTENSION_POINTS))
def test_the_extension_points_live_in_named_subpackages(package):
    module = importlib.import_module(package)
    for name in EXTENSION_POINTS[package]:
        assert name in module.__all__ and getattr(module, name) is not None


def test_importing_the_top_level_loads_no_torch():
    code = ("import sys, lightning_dprel, lightning_dprel.core\n"
            "print(sorted(m for m in ('torch', 'pytorch_lightning', 'torch_geometric') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]
