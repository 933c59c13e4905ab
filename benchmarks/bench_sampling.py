"""Benchmark and measurements for coupled relational sampling (issue 4).

1. Degree capping time on a synthetic graph with 10^6 nodes and 5·10^6 edges (target < 10 s, 2 cores).
2. Time per sampled batch at b = 1024, k = 4, including max-freq (target < 5 ms): the sampling
   primitives alone and the datamodule's full TupleBatch (with 16-dim node features).
3. Stability of capping under node removal: on random graphs, how many capped edges *not incident to the
   removed node* change, for this library's ``"drop"`` (keep iff top-K priority at both ends) and for the
   paper's sequential random dropping (Daigavane et al. 2021, Algorithm 1: edges in random order, kept while
   both ends are below K).

The datamodule builds batches single-threaded (see ``datamodules.rows.one_thread``); the raw
primitives run at torch's thread count (``--threads``), so on shared cores their median shows OpenMP stalls
that the datamodule avoids. The load average is printed first: timings on a loaded machine are inflated.

Run: ``python benchmarks/bench_sampling.py [--quick] [--threads N] [--skip-locality]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.utils import barabasi_albert_graph

from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule
from lightning_dprel.datamodules.edge_tuples.sampling import (
    cap_degree,
    edge_priority,
    max_freq,
    neg_sample_wor,
    poisson_positives,
    to_simple_undirected,
)


def _timeit(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def bench_capping(n: int, m: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, n, (2, m), generator=g)
    t0 = time.perf_counter()
    simple = to_simple_undirected(raw, n)
    t1 = time.perf_counter()
    capped = cap_degree(simple, n, 5, policy="drop", generator=torch.Generator().manual_seed(1))
    t2 = time.perf_counter()
    cap_degree(capped, n, 5, policy="assert")
    t3 = time.perf_counter()
    print(f"[capping] n={n:.0e} raw edges={m:.0e} simple={simple.shape[1]} capped(K=5)={capped.shape[1]}")
    print(f"[capping] to_simple_undirected {t1 - t0:.2f} s | cap_degree drop {t2 - t1:.2f} s | "
          f"assert check {t3 - t2:.2f} s | total {t2 - t0:.2f} s (target < 10 s, ratio {(t2 - t0) / 10:.2f})")
    return capped


def bench_batches(n: int, capped: torch.Tensor, b: float, k: int, repeat: int) -> None:
    m = capped.shape[1]
    g_pos, g_neg = torch.Generator().manual_seed(2), torch.Generator().manual_seed(3)

    def primitives():
        idx = poisson_positives(m, b / m, generator=g_pos)
        pos = capped[:, idx].t()
        neg, _ = neg_sample_wor(idx.numel(), k, n, generator=g_neg)
        max_freq(pos, neg)

    for _ in range(10):
        primitives()
    times = _timeit(primitives, repeat)
    med = statistics.median(times) * 1e3
    print(f"[batch] primitives (Poisson + NEG-SAMPLE-WOR + max_freq), b={b:g}, k={k}, m={m}: median {med:.2f} ms, "
          f"min {min(times) * 1e3:.2f} ms, p90 {sorted(times)[int(0.9 * repeat)] * 1e3:.2f} ms "
          f"(target < 5 ms, ratio {med / 5:.2f})")

    data = Data(x=torch.randn(n, 16), edge_index=capped, num_nodes=n)
    t0 = time.perf_counter()
    dm = RelationalDataModule(data, max_degree=5, expected_batch_size=b, neg_per_pos=k, steps_per_epoch=repeat + 10,
                              max_eval_queries=1000, eval_candidates=100)
    dm.setup("fit")
    print(f"[batch] datamodule setup (split, capping, eval candidates) {time.perf_counter() - t0:.2f} s; "
          f"m={dm.sampling_spec.num_edges} gamma={dm.sampling_spec.sampling_rate:.3g}")
    it = iter(dm.train_dataloader())
    for _ in range(10):
        next(it)
    times = _timeit(lambda: next(it), repeat)
    med = statistics.median(times) * 1e3
    print(f"[batch] full TupleBatch (incl. unique ids, gather of x[U,16], max_freq): median {med:.2f} ms, "
          f"min {min(times) * 1e3:.2f} ms, p90 {sorted(times)[int(0.9 * repeat)] * 1e3:.2f} ms "
          f"(target < 5 ms, ratio {med / 5:.2f})")


def _greedy_cap(edges: list[tuple[int, int]], prio: list[int], k_cap: int) -> set[tuple[int, int]]:
    """Daigavane et al. 2021, Algorithm 1: edges in random (priority) order, kept while both ends < K."""
    deg: dict[int, int] = {}
    kept = set()
    for _, (u, v) in sorted(zip(prio, edges)):
        if deg.get(u, 0) < k_cap and deg.get(v, 0) < k_cap:
            kept.add((u, v))
            deg[u] = deg.get(u, 0) + 1
            deg[v] = deg.get(v, 0) + 1
    return kept


def measure_locality(
    name: str, simple: torch.Tensor, n: int, k_cap: int, removals: int, seed: int = 0, *, highest: bool = False
) -> None:
    salt_gen = torch.Generator().manual_seed(seed)
    salt = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(seed)))
    prio = edge_priority(simple, salt).tolist()
    edges = [tuple(e) for e in simple.t().tolist()]
    prio_of = dict(zip(edges, prio))
    local_full = set(map(tuple, cap_degree(simple, n, k_cap, policy="drop", generator=salt_gen).t().tolist()))
    greedy_full = _greedy_cap(edges, prio, k_cap)
    deg = torch.bincount(simple.flatten(), minlength=n)
    candidates = torch.nonzero(deg > 0).flatten()
    if highest:  # the worst case for "drop": its changes are bounded by the removed node's degree
        pick = torch.argsort(deg, descending=True)[:removals]
    else:
        pick = candidates[torch.randperm(candidates.numel(), generator=torch.Generator().manual_seed(seed + 1))[:removals]]
    stats = {"drop (local top-K)": [], "greedy (Daigavane Alg. 1)": []}
    for w in pick.tolist():
        rest = simple[:, (simple[0] != w) & (simple[1] != w)]
        rest_edges = [tuple(e) for e in rest.t().tolist()]
        local = set(map(tuple, cap_degree(rest, n, k_cap, policy="drop",
                                          generator=torch.Generator().manual_seed(seed)).t().tolist()))
        greedy = _greedy_cap(rest_edges, [prio_of[e] for e in rest_edges], k_cap)
        for key, full, after in (("drop (local top-K)", local_full, local), ("greedy (Daigavane Alg. 1)", greedy_full, greedy)):
            before = {e for e in full if w not in e}
            stats[key].append((len(after - before), len(before - after), int(deg[w])))
    which = "highest-degree" if highest else "random"
    print(f"[locality] {name}: n={n} simple edges={simple.shape[1]} K={k_cap}; {removals} {which} nodes removed "
          f"(degrees {int(deg[pick].min())}-{int(deg[pick].max())})")
    for key, full in (("drop (local top-K)", local_full), ("greedy (Daigavane Alg. 1)", greedy_full)):
        rows = stats[key]
        changed = [a + r for a, r, _ in rows]
        print(f"  {key:27s} keeps {len(full):6d} edges ({len(full) / simple.shape[1]:.2f}); changed edges not incident "
              f"to the removed node: mean {statistics.mean(changed):.2f}, max {max(changed)} "
              f"(added mean {statistics.mean(a for a, _, _ in rows):.2f}, removed mean {statistics.mean(r for _, r, _ in rows):.2f}, "
              f"max removed {max(r for _, r, _ in rows)}); share of removals changing none: "
              f"{sum(c == 0 for c in changed) / len(changed):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10x smaller graph, fewer repeats")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--skip-locality", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    # On a shared machine the load average says how much the timings below may be inflated.
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpus {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    n, m = (10**5, 5 * 10**5) if args.quick else (10**6, 5 * 10**6)
    capped = bench_capping(n, m)
    bench_batches(n, capped, b=1024.0, k=4, repeat=50 if args.quick else 200)
    if args.skip_locality:
        return
    g = torch.Generator().manual_seed(4)
    er = to_simple_undirected(torch.randint(0, 2000, (2, 10_000), generator=g), 2000)
    measure_locality("Erdos-Renyi, avg degree 10", er, 2000, 5, removals=40 if args.quick else 200)
    measure_locality("Erdos-Renyi, avg degree 10", er, 2000, 5, removals=20, highest=True)
    torch.manual_seed(5)
    np.random.seed(5)  # barabasi_albert_graph draws from numpy's global generator
    ba = to_simple_undirected(barabasi_albert_graph(2000, 5), 2000)
    measure_locality("Barabasi-Albert, 5 edges per new node", ba, 2000, 5, removals=40 if args.quick else 200)
    measure_locality("Barabasi-Albert, 5 edges per new node", ba, 2000, 5, removals=20, highest=True)


if __name__ == "__main__":
    main()
