"""The private step of entities linked to public items: the full softmax against a sampled one, side by side.

The main job's sizes (18,387 public items, d = 384, K = 20, b = 1,024 entities in expectation) on random features: a
plain ``EntityItemRanker`` made private by ``PrivacyCallback`` (entity-as-example, σ fixed), timed per step after a
warm-up, for the full softmax (S = 0) and S public items drawn per step. Prints seconds per step and the ratio to the
full softmax; writes ``benchmarks/results/sampled_softmax_<device>.json``.

    python benchmarks/bench_sampled_softmax.py [--items 18387] [--batch 1024] [--steps 8] [--sampled 0,512,1024]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch_geometric.data import HeteroData

RESULTS = Path(__file__).parent / "results"


class StepTimes(pl.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter() - self.t)


def data(items: int, entities: int, dim: int, per_entity: int) -> HeteroData:
    g = torch.Generator().manual_seed(0)
    d = HeteroData()
    d["e"].ids, d["e"].x = [f"e{i}" for i in range(entities)], torch.randn(entities, dim, generator=g)
    d["i"].ids, d["i"].x = [f"i{j}" for j in range(items)], torch.randn(items, dim, generator=g)
    d["e", "has", "i"].edge_index = torch.stack([torch.arange(entities).repeat_interleave(per_entity),
                                                  torch.randint(items, (entities * per_entity,), generator=g)])
    return d


def time_steps(graph: HeteroData, sampled: int, batch: int, steps: int, device: str) -> float:
    from lightning_dprel.callbacks import PrivacyCallback
    from lightning_dprel.methods.entity_items import EntityItemDataModule, EntityItemRanker

    dm = EntityItemDataModule(graph, relation=("e", "has", "i"), max_relations=20, expected_batch_size=batch,
                              sampled_items=sampled)
    model = EntityItemRanker(dm.item_x, dim=dm.item_x.size(1))
    timer = StepTimes()
    pl.Trainer(max_steps=steps + 2, accelerator=device, devices=1, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
               callbacks=[PrivacyCallback(delta=1e-5, clip_norm=1.0, noise_multiplier=1.0), timer]).fit(model, dm)
    return sorted(timer.times[2:])[len(timer.times[2:]) // 2]  # the median step after two warm-up steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=18387)
    ap.add_argument("--entities", type=int, default=6711)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--sampled", default="0,512,1024")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    graph = data(args.items, args.entities, 384, 20)
    rows = []
    for s in [int(v) for v in args.sampled.split(",")]:
        seconds = time_steps(graph, s, args.batch, args.steps, args.device)
        rows.append({"sampled_items": s, "seconds_per_step": seconds})
    full = next((r["seconds_per_step"] for r in rows if r["sampled_items"] == 0), None)
    for r in rows:
        r["ratio_to_full"] = None if full is None else r["seconds_per_step"] / full
        print(f"S = {r['sampled_items'] or 'all items':>9}: {r['seconds_per_step']:.3f} s a step"
              + ("" if full is None else f", {r['ratio_to_full']:.2f}× the full softmax"), flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"sampled_softmax_{args.device}.json"
    out.write_text(json.dumps({"args": vars(args), "rows": rows, "platform": platform.platform(), "torch": torch.__version__,
                               "threads": torch.get_num_threads(), "cpus": os.cpu_count()}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
