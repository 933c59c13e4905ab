"""PrivacyCallback under 2-process DDP on CPU (gloo): both ranks stop at the same step, ε as in one process.

The test launches this file twice as a script (LOCAL_RANK 0 and 1, Lightning's external-launcher
convention), so no process is forked from pytest. Each rank writes what it saw to a JSON file.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_privacy_callback import (  # noqa: E402
    SpecDataModule,
    _real_target,
    independent_eps,
    make_spec,
    make_trainer,
    module_for,
    real_pair,
)

from lightning_dprel.callbacks import PrivacyCallback  # noqa: E402

SPEC = make_spec(n=3000, m=6000, K=4, gamma=0.02, k=3, steps_per_epoch=6)
SIGMA, MECH = 1.1, "freq_corrected"
DELTA = 1.0 / SPEC.num_edges
SAME_STOP, SPLIT_STOP, REAL_STOP = 9, 5, 6  # steps at which the scenarios must stop

# real_pair() is seeded (the runs are compared) and keeps the default δ = 1/m above 1/(120 entities): as in
# test_privacy_callback, whose autouse filter this module does not import.
pytestmark = pytest.mark.filterwarnings(
    "ignore:(DPRelationalModule\\(noise_seed|RelationalDataModule\\(sampling_seed)=<int>\\)",
    "ignore:PrivacyCallback. δ = \\S+ is not below 1/n",
)


def _target_between(steps: int) -> float:
    """A target with ε(steps) ≤ target < ε(steps + 1)."""
    return 0.5 * (independent_eps(MECH, SPEC, SIGMA, DELTA, steps) + independent_eps(MECH, SPEC, SIGMA, DELTA, steps + 1))


def _fit(target: float) -> dict:
    callback, module = PrivacyCallback(target_epsilon=target), module_for(MECH, SIGMA)
    trainer = make_trainer(callback, strategy="ddp", devices=2)
    trainer.fit(module, datamodule=SpecDataModule(SPEC))
    return dict(
        steps=callback.steps, optimizer_steps=module.optimizer_steps, global_step=trainer.global_step,
        epsilon=callback.epsilon, stopped_step=callback.stopped_step, world_size=trainer.world_size,
        weight=float(module.layer.weight.detach()),
    )


def _rank_main(out_dir: str) -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    rank = int(os.environ["LOCAL_RANK"])
    same = _fit(_target_between(SAME_STOP))
    # Rank 1 alone asks to stop at SPLIT_STOP: the agreed decision must stop rank 0 there too.
    split = _fit(_target_between(SPLIT_STOP if rank == 1 else SPLIT_STOP + 6))
    real = _fit_real()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"same": same, "split": split, "real": real}))


def _fit_real() -> dict:
    """DPRelationalModule + RelationalDataModule: global batch sliced per rank, noise drawn once."""
    module, dm = real_pair()
    callback = PrivacyCallback(target_epsilon=_real_target(REAL_STOP)[0])
    trainer = make_trainer(callback, strategy="ddp", devices=2, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    params = torch.cat([p.detach().flatten() for p in module.parameters()])
    return dict(steps=callback.steps, dp_steps=module.privacy_ledger.steps, epsilon=callback.epsilon,
                params=params.tolist())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_process_ddp_ranks_stop_together_with_single_process_epsilon(tmp_path):
    port = str(_free_port())
    root = Path(__file__).resolve().parents[1]
    procs = []
    for rank in (0, 1):
        env = dict(
            os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", NODE_RANK="0",
            LOCAL_RANK=str(rank), PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        )
        procs.append(subprocess.Popen(
            [sys.executable, __file__, str(tmp_path)], env=env, cwd=root,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=150)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("DDP ranks did not finish in 150 s (a rank kept training after the other stopped?)")
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]

    # one process, same configuration
    single = PrivacyCallback(target_epsilon=_target_between(SAME_STOP))
    make_trainer(single).fit(module_for(MECH, SIGMA), datamodule=SpecDataModule(SPEC))
    assert single.steps == SAME_STOP

    for rank in ranks:
        same, split = rank["same"], rank["split"]
        assert same["world_size"] == 2
        assert same["steps"] == same["optimizer_steps"] == same["global_step"] == same["stopped_step"] == SAME_STOP
        assert same["epsilon"] == pytest.approx(single.epsilon, rel=1e-12)
        assert same["epsilon"] == pytest.approx(independent_eps(MECH, SPEC, SIGMA, DELTA, SAME_STOP), rel=1e-9)
        assert split["steps"] == split["optimizer_steps"] == split["global_step"] == SPLIT_STOP
        assert split["epsilon"] == pytest.approx(independent_eps(MECH, SPEC, SIGMA, DELTA, SPLIT_STOP), rel=1e-9)
    assert ranks[0]["same"]["weight"] == ranks[1]["same"]["weight"]  # DDP kept the replicas identical

    # our module and datamodule: both ranks stop together, with the single-process ε
    target, eps_expected = _real_target(REAL_STOP)
    single_cb = PrivacyCallback(target_epsilon=target)
    module, dm = real_pair()
    make_trainer(single_cb, limit_val_batches=0).fit(module, datamodule=dm)
    for rank in ranks:
        real = rank["real"]
        assert real["steps"] == real["dp_steps"] == single_cb.steps == REAL_STOP
        assert real["epsilon"] == pytest.approx(single_cb.epsilon, rel=1e-12)
        assert real["epsilon"] == pytest.approx(eps_expected, rel=1e-9)
    assert ranks[0]["real"]["params"] == ranks[1]["real"]["params"]  # one noise draw, identical replicas
    single_params = torch.cat([p.detach().flatten() for p in module.parameters()])
    # the 2-rank run is the single-process run (same global batches, one noise draw), up to summation order
    assert torch.allclose(torch.tensor(ranks[0]["real"]["params"]), single_params, rtol=0, atol=1e-5)


if __name__ == "__main__":
    _rank_main(sys.argv[1])
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # the results are written: skip interpreter teardown, where gloo's threads once aborted under load
