"""``benchmarks/entities_items.py --quick`` runs on a saved ``HeteroData`` that is not the HPO one: its own relation
name (``--relation``), rows picked by ``--only`` (non-private and the public row included), generic row names,
progress lines on stderr, and clear refusals for a relation the data lacks or nodes with nothing to embed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch_geometric.data import HeteroData

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "entities_items.py"
REL = ("shopper", "bought", "product")


def synthetic(path: Path, *, item_graph: bool = True, x: bool = True) -> Path:
    """400 shoppers and 40 products (ids, names, 16-d features), 1..8 products each; no ``num_nodes``."""
    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["shopper"].ids = [f"c{i}" for i in range(400)]
    data["shopper"].names = [f"shopper {i}" for i in range(400)]
    data["product"].ids = [f"p{j}" for j in range(40)]
    data["product"].names = [f"product {j}" for j in range(40)]
    if x:
        data["product"].x = torch.randn(40, 16, generator=g)
        taste = torch.randn(400, 16, generator=g)
        data["shopper"].x = taste
    pairs = [(e, int(j)) for e in range(400) for j in torch.randperm(40, generator=g)[: 1 + e % 8]]
    data[REL].edge_index = torch.tensor(pairs).t().contiguous()
    if item_graph:
        src = torch.arange(40).repeat_interleave(3)  # 120 item-item pairs: more than one quick public batch (64)
        data["product", "like", "product"].edge_index = torch.stack([src, (src * 7 + torch.arange(120) % 3 + 1) % 40])
    torch.save(data, path)
    return path


def in_process(monkeypatch, *args: str) -> int:
    """The script's ``main`` run here (no second start of Python and Lightning): its exit status."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("entities_items_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    try:
        module.main()
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


def run(*args: str, tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "LIGHTNING_DPREL_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_quick_run_on_other_data_with_its_own_relation_and_chosen_rows(tmp_path):
    data = synthetic(tmp_path / "shop.pt")
    done = run("--quick", "--data", str(data), "--relation", ",".join(REL), "--only", "base,public,non-private,entity ε=1",
               "--out", str(tmp_path / "out"), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = (tmp_path / "out").glob("*.json")
    rows = [r["row"] for r in json.loads(result.read_text())["rows"]]
    assert rows == ["base (zero-shot)", "public data only (item graph)", "non-private", "entity-as-example ε=1"]
    assert json.loads(result.read_text())["relation"] == list(REL)
    md = next((tmp_path / "out").glob("*.md")).read_text()
    assert "HPO" not in md and "shopper × product" in md
    err = done.stderr
    assert "non-private, seed 0: start" in err and "non-private, seed 0: done in" in err
    assert "entity-as-example ε=1: training 6 steps" in err and "entity-as-example ε=1: 6 steps in" in err
    assert "public data only (item graph): 6 steps in" in err
    assert "DP popularity" not in done.stdout  # not picked, not run


def test_without_an_item_graph_the_public_row_is_skipped_with_a_note(tmp_path, monkeypatch, capsys):
    data = synthetic(tmp_path / "shop.pt", item_graph=False)
    assert in_process(monkeypatch, "--quick", "--data", str(data), "--relation", ",".join(REL), "--only",
                      "public,popularity ε=1", "--out", str(tmp_path / "out")) == 0
    assert "no product → product graph, so the 'public data only' row is skipped" in capsys.readouterr().err
    rows = [r["row"] for r in json.loads(next((tmp_path / "out").glob("*.json")).read_text())["rows"]]
    assert rows == ["DP popularity ε=1"]


@pytest.mark.parametrize("args, match", [
    (["--relation", "disease,has,phenotype"], "--relation disease,has,phenotype is not an edge type of the data; its "
                                              "edge types are shopper,bought,product; product,like,product"),
    (["--relation", "shopper,bought"], "--relation takes SRC,REL,DST"),
    (["--relation", ",".join(REL), "--only", "nonprivate"], "--only: unknown rows \\['nonprivate'\\]"),
])
def test_bad_flags_are_refused_clearly(tmp_path, monkeypatch, capsys, args, match):
    import re

    assert in_process(monkeypatch, "--quick", "--data", str(synthetic(tmp_path / "shop.pt")), *args) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err[-2000:]


def test_nodes_with_neither_features_nor_names_are_refused(tmp_path, monkeypatch, capsys):
    data = torch.load(synthetic(tmp_path / "shop.pt", x=False), weights_only=False)
    del data["shopper"].names
    torch.save(data, tmp_path / "bare.pt")
    assert in_process(monkeypatch, "--quick", "--data", str(tmp_path / "bare.pt"), "--relation", ",".join(REL)) == 2
    assert "data['shopper'] has neither features `x` nor `names` to embed (it has ids)" in capsys.readouterr().err
