"""The main job is private entities linked to public items, from the command line: it prints the base model, DP
popularity at the same ε, the private model and a non-private reference read from a committed benchmark side by side,
with the proven ε, its bound and the unit (validation entities declared public and not protected); ``report.json``
beside the selected checkpoint holds the same numbers, and the checkpoint exports like every model. Run here on the
tiny config's synthetic data (the HPO config has the same shape, checked below)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from lightning_dprel.cli import main

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("main_job")
    ref = tmp / "bench.json"
    ref.write_text(json.dumps({"summary": {"non-private": {"map": 0.61, "recall@20": 0.93}}}))
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["fit", "--config", str(ROOT / "configs" / "entities_items_tiny.yaml"), "--trainer.default_root_dir", str(tmp),
              "--trainer.max_steps", "12", "--reference_json", str(ref)])
    return tmp, out.getvalue()


def _row(printed: str, name: str) -> tuple[float, float]:
    line = next(l for l in printed.splitlines() if l.startswith(name))
    return tuple(float(v) for v in line.split()[-2:])


@pytest.mark.slow
def test_the_table_puts_base_popularity_private_and_the_reference_side_by_side(run):
    tmp, printed = run
    assert "MAP" in printed and "recall@20" in printed
    base, pop, private = _row(printed, "base (zero-shot)"), _row(printed, "DP popularity (ε = 4)"), _row(printed, "private model")
    assert _row(printed, "non-private (reference from bench.json; not trained here)") == (0.61, 0.93)
    assert private[0] > base[0] > pop[0]  # the synthetic task: the private model learns, popularity knows no query
    eps = float(re.search(r"privacy: epsilon = ([\d.]+) \(delta", printed).group(1))
    assert 3.5 < eps <= 4.0 and "proven by the PLD bound" in printed and "RDP" in printed
    assert re.search(r"unit: one entity with all its raw relations .*; \d+ validation entities declared public and not "
                     r"protected", printed)


@pytest.mark.slow
def test_report_json_beside_the_checkpoint_holds_the_printed_numbers(run):
    tmp, printed = run
    report = json.loads((tmp / "report.json").read_text())
    assert (tmp / "model.ckpt").is_file() and f"report: {tmp / 'report.json'}" in printed
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows)[:3] == ["base (zero-shot)", "DP popularity (ε = 4)", "private model"]
    for name in ("base (zero-shot)", "DP popularity (ε = 4)", "private model"):
        assert _row(printed, name) == tuple(round(rows[name]["metrics"][k], 4) for k in ("test_map", "test_recall@20"))
    assert report["epsilon"] <= 4.0 and report["bound"] == "pld" and report["bounds"]["rdp"] >= report["epsilon"]
    assert report["delta"] == pytest.approx(1 / (10 * report_n(tmp)), rel=1e-9)
    assert "not protected" in report["privacy_unit"]
    pop = rows["DP popularity (ε = 4)"]
    assert pop["epsilon"] <= 4.0 + 1e-9
    # the job's two releases together: more than either, less than their sum (composed in one ledger, PLD)
    assert max(pop["epsilon"], report["epsilon"]) < pop["epsilon_with_the_model"] < pop["epsilon"] + report["epsilon"]
    assert f"together spend epsilon = {pop['epsilon_with_the_model']:.4f}" in printed


def report_n(tmp: Path) -> int:
    """n, the training entities, as privacy.json's unit count gives it (the export below)."""
    from lightning_dprel.datamodules.datasets import SyntheticEntityItems
    from lightning_dprel.methods.entity_items import EntityItemDataModule

    return EntityItemDataModule(source=SyntheticEntityItems(num_entities=2000), relation=("entity", "has", "item"),
                                max_relations=8, expected_batch_size=256).num_entities


@pytest.mark.slow
def test_the_selected_checkpoint_exports_with_its_ledger(run, tmp_path):
    tmp, _ = run
    out = main(["export", "--ckpt_path", str(tmp / "model.ckpt"), "--out", str(tmp_path / "export")])
    privacy = json.loads((out / "privacy.json").read_text())
    report = json.loads((tmp / "report.json").read_text())
    assert privacy["epsilon"] == pytest.approx(report["epsilon"], rel=1e-9)
    assert privacy["mechanism"] == "entity_items" and "not protected" in privacy["public_data"]["validation_entities"]
    assert privacy["public_data"]["selection"]["monitor"] == "map"


@pytest.mark.slow
def test_the_hpo_main_job_is_this_recipe_at_epsilon_4():
    cfg = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    privacy = next(c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("PrivacyCallback"))["init_args"]
    assert privacy["target_epsilon"] == 4.0 and "delta" not in privacy  # the unit's default: 1/(10 n)
    data = cfg["data"]["init_args"]
    assert cfg["data"]["class_path"].endswith("EntityItemDataModule") and data["recipe"] == "entity"
    assert data["source"]["class_path"].endswith("HPODiseasePhenotypes") and data["sampled_items"] > 0
    assert cfg["model"]["init_args"]["precondition"] == 0.5  # the lever that won on validation (entities_items_levers)
    ref = json.loads((ROOT / cfg["reference_json"]).read_text())
    assert cfg["reference_row"] in ref["summary"]


@pytest.mark.slow
def test_the_reported_epsilons_match_dp_accounting(run):
    """The model's ε and the job's (the model and DP popularity composed) against dp-accounting's PLD accountant."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    from lightning_dprel.methods.entity_items.popularity import gaussian_sigma_for

    tmp, _ = run
    report = json.loads((tmp / "report.json").read_text())
    delta, n = report["delta"], report_n(tmp)
    steps = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(256 / n, dp_accounting.GaussianDpEvent(report["sigma"])), report["steps"])

    def reference(*events) -> float:
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        for e in events:
            acc.compose(e)
        return acc.get_epsilon(delta)

    pop = next(r for r in report["rows"] if r["name"].startswith("DP popularity"))
    assert -1e-6 <= report["epsilon"] - reference(steps) <= 5e-3
    joint = reference(steps, dp_accounting.GaussianDpEvent(gaussian_sigma_for(4.0, delta)))
    assert -1e-6 <= pop["epsilon_with_the_model"] - joint <= 5e-3
