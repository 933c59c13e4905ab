"""Shared scaffolding of the tests: a free port, a gloo group, spawning, running a DDP script; the released clipped sum
of an attached private step."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.multiprocessing as mp
from pytorch_lightning import Callback

ROOT = str(Path(__file__).resolve().parents[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int) -> Iterator[None]:
    """A CPU (gloo) process group for the body, destroyed afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


class ReleaseGroupAtTeardown(Callback):
    """Destroy the gloo group when a spawned rank's fit ends (Lightning leaves it alive).

    A rank that exits with gloo's threads still running can abort at interpreter shutdown
    ("terminate called without an active exception", SIGABRT): seen once in CI.
    """

    def teardown(self, trainer, pl_module, stage: str) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def spawn(worker: Callable[..., None], folder: str, world: int = 2) -> None:
    """Run ``worker(rank, world, port, folder)`` in ``world`` fresh processes and wait for all."""
    mp.start_processes(worker, args=(world, free_port(), str(folder)), nprocs=world, join=True, start_method="spawn")


def run_script(text: str, folder: Path, timeout: int = 240) -> None:
    """Write ``text`` to ``folder/script.py`` and run it with the project on PYTHONPATH; fail with its stderr."""
    script = Path(folder) / "ddp_script.py"
    script.write_text(text)
    tests = str(Path(__file__).resolve().parent)  # scripts import ReleaseGroupAtTeardown from here
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, tests, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script), str(folder)], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


class SaveReleasedSums(Callback):
    """Record, per step, the clipped global sum the attached DP optimizer adds its noise to (after the all-reduce), and
    save it with ε and the step count as ``folder/rank{r}_of{world}.pt`` when training ends."""

    def __init__(self, folder) -> None:
        self.folder, self.sums = folder, []

    def on_train_start(self, trainer, pl_module) -> None:
        from lightning_dprel.callbacks import PrivacyCallback

        self.privacy = next(c for c in trainer.callbacks if isinstance(c, PrivacyCallback))
        dp = self.privacy._layer.dp
        original = dp.add_noise
        dp.add_noise = lambda summed, noise="draw": self.sums.append(
            torch.cat([t.reshape(-1) for t in summed.values()]).clone()) or original(summed, noise)

    def on_train_end(self, trainer, pl_module) -> None:
        dp = self.privacy._layer.dp
        torch.save({"sums": self.sums, "epsilon": self.privacy.epsilon, "steps": self.privacy.steps,
                    "std": dp.noise_multiplier * dp.clip_norm},
                   f"{self.folder}/rank{trainer.global_rank}_of{trainer.world_size}.pt")


def assert_two_ranks_release_as_one(folder, steps: int) -> None:
    """Two ranks and one process (same init, same global samples): the same ε, σ·C and first clipped sum; the ranks
    agree on every step's global sum."""
    single = torch.load(Path(folder) / "rank0_of1.pt")
    ranks = [torch.load(Path(folder) / f"rank{r}_of2.pt") for r in (0, 1)]
    assert single["steps"] == ranks[0]["steps"] == ranks[1]["steps"] == steps
    assert abs(single["epsilon"] - ranks[0]["epsilon"]) <= 1e-12 * single["epsilon"] and ranks[0]["epsilon"] == ranks[1]["epsilon"]
    assert single["std"] == ranks[0]["std"] == ranks[1]["std"]
    assert single["sums"][0].norm() > 0
    for rank in ranks:  # the first step's parameters are equal, so its global clipped sum is one process's
        torch.testing.assert_close(rank["sums"][0], single["sums"][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(ranks[0]["sums"], ranks[1]["sums"]):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def record_noise_draws(monkeypatch) -> list:
    """Every noise vector a DPOptimizer draws, in order (to check that a resumed fit never replays one)."""
    from lightning_dprel.core.optim import DPOptimizer

    drawn: list = []
    original = DPOptimizer.draw_noise
    monkeypatch.setattr(DPOptimizer, "draw_noise", lambda self, device=None: drawn.append(original(self, device)) or drawn[-1])
    return drawn


def fit_saving_releases(folder, devices: int, strategy: str, model, *, steps: int, **fit_kwargs) -> None:
    """Fit ``model`` (a fresh one per call, torch seed 0) for ``steps`` private steps (C = 0.5, σ = 1.2) on
    ``devices`` CPU processes, saving each rank's released sums with :class:`SaveReleasedSums`."""
    import warnings

    from pytorch_lightning import Trainer

    from lightning_dprel.callbacks import PrivacyCallback

    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=steps, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, num_sanity_val_steps=0,
                      callbacks=[PrivacyCallback(delta=1e-5, clip_norm=0.5, noise_multiplier=1.2), SaveReleasedSums(folder),
                                 ReleaseGroupAtTeardown()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, **fit_kwargs)


def released_sum(monkeypatch, model, cb, batch) -> torch.Tensor:
    """The clipped sum the DP optimizer noises for ``batch`` (captured at add_noise), through the step PrivacyCallback
    attached to a plain module (after a fit with ``cb``)."""
    from lightning_dprel.core.optim import DPOptimizer
    from lightning_dprel.grad_sample.user_step import quiet_logging

    seen = []
    original = DPOptimizer.add_noise
    monkeypatch.setattr(DPOptimizer, "add_noise", lambda self, summed, noise="draw": seen.append(
        {n: t.clone() for n, t in summed.items()}) or original(self, summed, noise))
    with quiet_logging(model):
        cb._layer.training_step(batch, 0)
    cb._layer.dp.pre_step()  # stages 1-5 on the record, as the step does
    monkeypatch.setattr(DPOptimizer, "add_noise", original)
    return torch.cat([t.reshape(-1) for t in seen[-1].values()])
