"""Shared scaffolding of the multi-process tests: a free port, a gloo group, spawning, running a DDP script."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

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
