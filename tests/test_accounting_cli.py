"""``python -m lightning_dprel.accounting``: the exact command forms of issue 3."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lightning_dprel.accounting import DEFAULT_ORDERS, epsilon_for, per_step_rdp, rdp_to_epsilon
from lightning_dprel.accounting.cli import main
from lightning_dprel.core.specs import SamplingSpec

BASE = ["--nodes", "20000", "--edges", "50000", "--max-degree", "3", "--sampling-rate", "0.002",
        "--neg-per-pos", "2", "--steps", "2000"]
SPEC = SamplingSpec(num_nodes=20000, num_edges=50000, max_degree=3, sampling_rate=0.002, neg_per_pos=2,
                    expected_batch_size=100.0, steps_per_epoch=500)


def _run(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "clipping,accounting,mechanism",
    [("freq", None, "freq_corrected"), ("freq", "paper", "freq_paper"), ("standard", None, "standard"),
     ("naive", None, "naive")],
)
def test_epsilon_command(capsys, clipping, accounting, mechanism):
    argv = ["epsilon", *BASE, "--noise-multiplier", "1.0", "--clipping", clipping, "--json"]
    if accounting:
        argv += ["--accounting", accounting]
    out = _run(capsys, argv)
    eps, order = rdp_to_epsilon(DEFAULT_ORDERS, 2000 * per_step_rdp(mechanism, SPEC, 1.0), 1 / 50000)
    assert out["epsilon"] == pytest.approx(eps, rel=1e-12) and out["order"] == order
    assert out["delta"] == 1 / 50000 and out["mechanism"] == mechanism  # --delta defaults to 1/M


def test_noise_multiplier_command(capsys):
    out = _run(capsys, ["noise-multiplier", *BASE, "--clipping", "freq", "--accounting", "paper",
                        "--target-epsilon", "3", "--delta", "1e-5", "--json"])
    sigma = out["noise_multiplier"]
    eps, _ = epsilon_for(delta=1e-5, steps=2000, sampling=SPEC, noise_multiplier=sigma, mechanism="freq_paper")
    assert 0.99 * 3 <= eps <= 3


def test_plot(capsys, tmp_path):
    png = tmp_path / "fig2.png"
    out = _run(capsys, ["epsilon", *BASE, "--noise-multiplier", "1.0", "--clipping", "freq", "--json",
                        "--plot", str(png)])
    assert {"epsilon", "order"} <= set(out) and out["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_module_entry_point():
    cmd = [sys.executable, "-m", "lightning_dprel.accounting", "epsilon", *BASE, "--noise-multiplier", "2.0",
           "--clipping", "naive", "--delta", "1e-5", "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    out = json.loads(res.stdout)
    assert out["epsilon"] == pytest.approx(rdp_to_epsilon(DEFAULT_ORDERS, 2000 * DEFAULT_ORDERS / 8, 1e-5)[0])


@pytest.mark.parametrize(
    "args,name",
    [
        (["--sampling-rate", "1.5"], "sampling_rate"),
        (["--neg-per-pos", "400"], "neg_per_pos"),
        (["--max-degree", "0"], "max_degree"),
        (["--delta", "1.0"], "delta"),
        (["--edges", "0"], "num_edges"),
        (["--nodes", "0"], "num_nodes"),
    ],
)
def test_bad_input_names_the_parameter(capsys, args, name):
    argv = ["epsilon", *BASE, "--noise-multiplier", "1.0", "--clipping", "freq", "--json"]
    flag, value = args
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    assert name in capsys.readouterr().err


def test_zero_noise_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["epsilon", *BASE, "--noise-multiplier", "0", "--clipping", "standard"])
    assert "noise_multiplier" in capsys.readouterr().err
