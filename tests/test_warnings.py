"""A plain run prints none of Lightning's notices that do not apply to it (issue 21, item 5).

pytest resets warning filters around each test, so this runs the fit in a fresh interpreter, as a user would.
"""

from __future__ import annotations

import pytest
import os
import subprocess
import sys
import textwrap

from lightning_dprel.core.notices import LIGHTNING_WARNINGS, LITLOGGER_TIP

RUN = textwrap.dedent("""
    import pytorch_lightning as pl
    from lightning_dprel.callbacks import PrivacyCallback
    from lightning_dprel.datamodules import RelationalDataModule
    from lightning_dprel.demos import random_feature_graph
    from lightning_dprel.encoders import MLPEncoder
    from lightning_dprel.methods.relational.module import DPRelationalModule

    dm = RelationalDataModule(random_feature_graph(120, 400, dim=8, seed=3), max_degree=3, expected_batch_size=12.0,
                              neg_per_pos=2, max_eval_queries=16, eval_batch_size=16)
    module = DPRelationalModule(MLPEncoder(8, hidden_dim=16, out_dim=8), clipping="freq", noise_multiplier=1.0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1,
                         val_check_interval=2, callbacks=[PrivacyCallback(target_epsilon=50.0, delta=1e-4)])
    trainer.fit(module, datamodule=dm)
    trainer.test(module, datamodule=dm, verbose=False)
    print("RUN-DONE")
""")


@pytest.mark.slow
def test_a_fit_prints_no_lightning_notice_that_does_not_apply():
    env = {**os.environ, "PYTHONWARNINGS": "default"}  # show every warning once, DeprecationWarnings included
    done = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, env=env, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "RUN-DONE" in done.stdout, out[-3000:]
    assert LITLOGGER_TIP not in out, out[-3000:]
    for pattern in ("`isinstance(treespec, LeafSpec)` is deprecated", "Your `IterableDataset` has `__len__` defined"):
        assert pattern not in out, out[-3000:]
    assert len(LIGHTNING_WARNINGS) == 2
