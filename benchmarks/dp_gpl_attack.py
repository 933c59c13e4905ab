"""DP-GPL membership attacks (spec "The attack on prompts", Acceptance "MIA"): LiRA on prompts, on the released student,
and the white-box vote audit, on CPU in about 8–10 minutes (``--quick``: about a minute and a half).

(a) **Non-private 5-shot prompts** (GPF-plus + answer head, 100 Adam epochs at lr 0.05: the DP-GPL teachers' tuning)
    on a frozen GCN Φ pre-trained by DGI on the public half G_pub; the private half is the attack's pool (each node on
    G[V_pub ∪ {v}]). Online LiRA of :func:`lightning_dprel.audit.prompt_lira.prompt_lira`: ≥ 64 shadows, each candidate
    IN for exactly half, 100 target prompts × (5 members + 250 non-members). WordNet nouns (10k synsets, MiniLM) and a
    planted-partition ``SyntheticNodes`` graph. Issue target: AUC ≥ 0.7 and TPR ≥ 5 % at 1 % FPR.
(b) **The released DP-GPL student** (``DPGPLModule``, provable mode, secret partition and noise, N = 20 teachers,
    Q = 50 queries, T = 0.3·N, σ₁ = σ₂ calibrated to ε ∈ {1, 4} at δ = 1e-5; ε = ∞ the noise-free ensemble as a
    control) on ``SyntheticNodes``. K full DP-GPL runs; in each, every private node is IN with probability 1/2
    (independently: the shadows' memberships carry no information on the target run's) and the others are removed.
    Leave-one-out online LiRA: each run in turn is the target, the other K − 1 its shadows; φ = the student's logit
    confidence on the node's own example. ``dp_tpr_check`` tests TPR ≤ e^ε·FPR + δ at 1 % and 0.1 % FPR
    (Clopper–Pearson, 95 %).
(c) **White-box vote audit** (:func:`lightning_dprel.audit.pate.audit_confident_gnmax`): worst-case neighbouring vote
    histograms (one teacher's vote moves), N = 250, C = 26, T = 0.3·N, σ₁ = σ₂ = σ(ε, Q = 200, δ = 1e-5):
    the audited ε lower bound of one query vs the proven ε of one query.

A lower bound above a proven ε, or a failed TPR check, exits 3. Usage:
``python benchmarks/dp_gpl_attack.py [--quick] [--out benchmarks/results/dp_gpl_attack]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
import time
import warnings
from pathlib import Path

import torch

DELTA = 1e-5


@contextlib.contextmanager
def _quiet():
    names = ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            for n, lv in levels.items():
                logging.getLogger(n).setLevel(lv)


def _pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f} %"


# --- (a) non-private prompts -------------------------------------------------------------------------------------
def prompt_attack(name: str, source, *, shadows: int, targets: int, epochs: int, seed: int = 0) -> dict:
    from lightning_dprel.audit.prompt_lira import prompt_lira
    from lightning_dprel.methods.dp_gpl import GraphEncoder, PromptDataModule, TuningConfig, pretrain

    start = time.perf_counter()
    with _quiet():
        dm = PromptDataModule(source, num_teachers=20, num_queries=50)  # the public / private halves only
        dm.setup()
    x_pub, ei_pub = dm.public_graph()
    encoder = pretrain(GraphEncoder(dm.num_features, 128, num_layers=dm.hops), x_pub, ei_pub, method="dgi",
                       epochs=100, seed=seed)
    pool, labels, _ = dm.teacher_examples()
    res = prompt_lira(encoder, dm.data.x, pool, labels, shots=5, num_shadows=shadows, num_targets=targets,
                      cfg=TuningConfig("gpf_plus", epochs, 0.05), num_classes=dm.num_classes, seed=seed)
    fixed = res.rescore(fixed_variance=True)  # Carlini et al.'s pooled-variance variant, same prompts
    return {"graph": name, "source": repr(source), "pool": pool.size, "seconds": time.perf_counter() - start,
            **res.to_dict(), "fixed_variance": {"auc": fixed.auc, "tprs": list(fixed.tprs)}}


# --- (b) the released DP-GPL student ------------------------------------------------------------------------------
def _excluding_datamodule():
    from lightning_dprel.methods.dp_gpl import PromptDataModule

    class ExcludingDataModule(PromptDataModule):
        """The same graph with the private nodes in ``removed`` deleted (node-level remove: their examples go)."""

        def __init__(self, *args, removed: torch.Tensor, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.removed = removed

        def teacher_examples(self):
            examples, labels, teacher = super().teacher_examples()
            keep = (~self.removed[self.private.nonzero().view(-1)]).nonzero().view(-1)
            return examples.select(keep), labels[keep], teacher[keep]

    return ExcludingDataModule


def student_attack(source, *, epsilon: float, runs: int, teachers: int, queries: int, seed: int = 0,
                   groups: int | None = None) -> dict:
    import pytorch_lightning as pl

    from lightning_dprel.audit.lira import dp_tpr_check, lira_scores, logit_confidence_from_logits, roc_summary
    from lightning_dprel.methods.dp_gpl import DPGPLModule

    start = time.perf_counter()
    dm_cls = _excluding_datamodule()
    data = source.load()
    gen = torch.Generator().manual_seed(1000 + seed)
    phi, inside, accs, answered, proven = [], [], [], [], math.inf
    with _quiet():
        probe = dm_cls(source, num_teachers=teachers, num_queries=queries, removed=torch.zeros(data.num_nodes, dtype=torch.bool))
        probe.setup()
    cand = probe.private.nonzero().view(-1)  # every private node is a candidate
    labels = probe.data.y[cand]
    cand_batch = probe.teacher_nets.batch(cand)  # the node's own example, G[V_pub ∪ {v}] (public data and v only)
    for k in range(runs):
        with _quiet():
            member = torch.rand(cand.numel(), generator=gen) < 0.5
            removed = torch.zeros(data.num_nodes, dtype=torch.bool)
            removed[cand[~member]] = True
            dm = dm_cls(source, num_teachers=teachers, num_queries=queries, removed=removed, query_groups=groups)
            kw = (dict(sigma_threshold=0.0, sigma_vote=0.0) if math.isinf(epsilon) else dict(target_epsilon=epsilon))
            module = DPGPLModule(allow_untracked=True, hidden_dim=64, pretrain_epochs=100, teacher_epochs=100, delta=DELTA, seed=seed,
                                 threshold=0.3 if groups is None else None, **kw)
            trainer = pl.Trainer(max_epochs=50, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                 enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
            trainer.fit(module, dm)
            accs.append(float(trainer.test(module, dm, verbose=False)[0]["test_acc"]))
        with torch.no_grad():
            logits = module.student(dm.data.x, cand_batch)
        phi.append(logit_confidence_from_logits(logits, labels))
        inside.append(member)
        answered.append(module.answers.num_answered)
        proven = module.epsilon()
    phi, inside = torch.stack(phi), torch.stack(inside)  # [K, M]
    k_runs, m = phi.shape
    target_phi, ins, outs, is_member = [], [], [], []
    for k in range(k_runs):  # leave-one-out: run k is the target, the others its shadows
        others = torch.arange(k_runs) != k
        p, s = phi[others].t(), inside[others].t()  # [M, K-1]
        ins.append(torch.where(s, p, torch.nan))
        outs.append(torch.where(~s, p, torch.nan))
        target_phi.append(phi[k])
        is_member.append(inside[k])
    target_phi, is_member, ins, outs = torch.cat(target_phi), torch.cat(is_member), torch.cat(ins), torch.cat(outs)
    # pairs with < 2 shadows on a side cannot be fitted; the filter reads the other runs only (independent of the target)
    ok = ((~ins.isnan()).sum(1) >= 2) & ((~outs.isnan()).sum(1) >= 2)
    target_phi, is_member, ins, outs = target_phi[ok], is_member[ok], ins[ok], outs[ok]
    scores = lira_scores(target_phi, ins, outs)
    roc = roc_summary(scores, is_member)
    out = {"epsilon_target": epsilon, "epsilon_proven": proven, "query_groups": groups, "runs": k_runs, "candidates": m, "pairs": int(scores.numel()),
           "members": int(is_member.sum()),
           "teachers": teachers, "queries": queries, "answered_mean": sum(answered) / len(answered),
           "test_acc_mean": sum(accs) / len(accs), "auc": roc.auc, "fprs": list(roc.fprs), "tprs": list(roc.tprs),
           "seconds": time.perf_counter() - start}
    if math.isfinite(proven):
        check = dp_tpr_check(scores, is_member, proven, DELTA)
        out["dp_check"] = check.to_dict()
    return out


def _student_table(b_rows: list[dict], runs: int, b_src, groups: int | None = None) -> list[str]:
    how = ("T = 0.3·N, σ₁ = σ₂ calibrated to ε" if groups is None else
           f"{groups} query groups (public clusters), GNMax without a threshold, σ₂ calibrated to ε; the student learns on "
           "every public training node of an answered cluster; \"answered\" counts groups")
    lines = ["", f"## (b) LiRA on the released DP-GPL student ({runs} DP-GPL runs per ε, leave-one-out)", "",
              f"`DPGPLModule` (provable, secret partition and noise), {b_src!r}, N = 20 teachers, Q = 50, {how}; "
              "every private node IN with probability 1/2 per run (removed otherwise); "
              "φ = the student's confidence on the node's own example. Check: TPR⁻ ≤ e^ε·FPR⁺ + δ (Clopper–Pearson, "
              "95 % over all four intervals). ε = ∞: the noise-free ensemble (a control; no bound to check).", "",
              "| ε (proven) | runs | pairs (members) | answered / Q | student test acc. | AUC | TPR @ 1 % (FPR) | bound e^ε·FPR⁺+δ | TPR @ 0.1 % (FPR) | bound | audited ε_lb | ≤ proven? | s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in b_rows:
        chk = r.get("dp_check")
        eps = "∞ (no noise)" if math.isinf(r["epsilon_proven"]) else f"{r['epsilon_proven']:.3f}"
        if chk:
            c1, c2 = chk["checks"]
            cells = (f"{_pct(c1['tpr'], 2)} ({_pct(c1['fpr'], 2)}) | {c1['bound']:.3f} | {_pct(c2['tpr'], 2)} ({_pct(c2['fpr'], 2)}) | "
                     f"{c2['bound']:.4f} | {chk['epsilon_lb']:.3f} | {'yes' if chk['passed'] and chk['epsilon_lb'] <= r['epsilon_proven'] else '**VIOLATION**'}")
        else:
            cells = f"{_pct(r['tprs'][0], 2)} | — | {_pct(r['tprs'][1], 2)} | — | — | —"
        lines.append(f"| {eps} | {r['runs']} | {r['pairs']} ({r['members']}) | {r['answered_mean']:.1f} / {r['queries']} | "
                     f"{r['test_acc_mean']:.3f} | {r['auc']:.3f} | {cells} | {r['seconds']:.0f} |")
    return lines


# --- (c) the white-box vote audit ----------------------------------------------------------------------------------
def vote_audit(epsilon: float, *, trials: int, teachers: int = 250, classes: int = 26, queries: int = 200) -> dict:
    from lightning_dprel.accounting.analysis.pate import sigma_for_epsilon
    from lightning_dprel.audit.pate import audit_confident_gnmax

    start = time.perf_counter()
    sigma = sigma_for_epsilon(epsilon, DELTA, queries)
    with _quiet():
        a = audit_confident_gnmax(teachers, classes, 0.3 * teachers, sigma, sigma, trials=trials, seed=0, delta=DELTA)
    return {"epsilon_target": epsilon, "queries": queries, "sigma": sigma, "seconds": time.perf_counter() - start,
            **a.to_dict()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few shadows, runs and trials (about two minutes)")
    parser.add_argument("--student-groups", type=int, default=None, metavar="K",
                        help="only (b), with K query groups (GNMax, ε = 1 and 4); writes dp_gpl_attack_groups")
    parser.add_argument("--out", default=None, help="default benchmarks/results/dp_gpl_attack (quick: print only)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from lightning_dprel.datamodules.datasets import SyntheticNodes, WordNetNodes

    q = args.quick
    shadows, targets = (16, 20) if q else (64, 100)
    runs = 8 if q else 64
    trials = 200_000 if q else 2_000_000
    out = Path(args.out) if args.out else (None if q else Path("benchmarks/results/dp_gpl_attack"))
    violation = False
    if args.student_groups is not None:
        b_src = SyntheticNodes(600, 4, dim=16, feature_noise=1.5, seed=0)
        b_rows = [student_attack(b_src, epsilon=e, runs=runs, teachers=20, queries=50, groups=args.student_groups)
                  for e in (1.0, 4.0)]
        for r in b_rows:
            chk = r["dp_check"]
            violation |= (not chk["passed"]) or chk["epsilon_lb"] > r["epsilon_proven"]
        lines = [f"# DP-GPL student attack, query groups{' (quick)' if q else ''}", "",
                 f"`python benchmarks/dp_gpl_attack.py --student-groups {args.student_groups}" + (" --quick" if q else "") +
                 "`, CPU, 1 thread; δ = 1e-5.", *_student_table(b_rows, runs, b_src, args.student_groups)]
        print("\n".join(lines))
        if not q:
            dest = Path("benchmarks/results/dp_gpl_attack_groups")
            dest.with_suffix(".md").write_text("\n".join(lines) + "\n")
            dest.with_suffix(".json").write_text(json.dumps({"delta": DELTA, "student": b_rows}, indent=2, default=str) + "\n")
        return 3 if violation else 0

    print("(a) LiRA on non-private 5-shot prompts", flush=True)
    a_rows = []
    for name, src in (("WordNet nouns (10k)", WordNetNodes(max_nodes=10000)),
                      ("SyntheticNodes", SyntheticNodes(1000, 4, dim=16, feature_noise=2.0, seed=0))):
        r = prompt_attack(name, src, shadows=shadows, targets=targets, epochs=100)
        a_rows.append(r)
        print(f"  {name}: AUC {r['auc']:.3f}, TPR {_pct(r['tprs'][0])} @1 %, {_pct(r['tprs'][1])} @0.1 % ({r['seconds']:.0f} s)", flush=True)

    print("(b) LiRA on the released DP-GPL student", flush=True)
    b_src = SyntheticNodes(600, 4, dim=16, feature_noise=1.5, seed=0)
    b_rows = []
    for eps in ((4.0, math.inf) if q else (1.0, 4.0, math.inf)):
        r = student_attack(b_src, epsilon=eps, runs=runs, teachers=20, queries=50)
        b_rows.append(r)
        chk = r.get("dp_check")
        if chk is not None:
            violation |= (not chk["passed"]) or chk["epsilon_lb"] > r["epsilon_proven"]
        print(f"  ε = {eps}: AUC {r['auc']:.3f}, TPR {_pct(r['tprs'][0])} @1 %, {_pct(r['tprs'][1])} @0.1 %, "
              f"passed {chk['passed'] if chk else '—'} ({r['seconds']:.0f} s)", flush=True)

    print("(c) white-box vote audit", flush=True)
    c_rows = []
    for eps in (1.0, 4.0):
        r = vote_audit(eps, trials=trials)
        c_rows.append(r)
        violation |= r["violation"]
        print(f"  ε = {eps}: σ {r['sigma']:.1f}, audited {r['epsilon']:.4f} ≤ proven {r['proven_epsilon']:.4f} per query "
              f"({r['seconds']:.0f} s)", flush=True)

    lines = [f"# DP-GPL membership attacks{' (quick)' if q else ''}", "",
             "`python benchmarks/dp_gpl_attack.py" + (" --quick" if q else "") + "`, CPU, 1 thread; δ = 1e-5.", "",
             f"## (a) Online LiRA on non-private 5-shot prompts ({shadows} shadows, {targets} target prompts)", "",
             "GPF-plus + linear head, 100 Adam epochs at lr 0.05, on a frozen 2-layer GCN pre-trained by DGI on G_pub; "
             "pool = the private half. Each shadow = one 5-shot prompt per group of 10 candidates (half of each group), "
             f"so every candidate is IN for exactly {shadows // 2} shadows; members = each target's 5 shots, non-members = "
             "250 other candidates per target. Issue target: AUC ≥ 0.7 and TPR ≥ 5 % at 1 % FPR.", "",
             "Main columns: online LiRA with a per-candidate variance (Carlini et al.'s default with ≥ 64 shadows); "
             "the last column scores the same φs with one pooled variance per side (their fixed-variance variant).", "",
             "| graph | pool | candidates | members / non-members | prompt acc. (shots / non-members) | AUC | TPR @ 1 % FPR | TPR @ 0.1 % FPR | target met? | fixed variance: AUC, TPR @ 1 %, @ 0.1 % | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in a_rows:
        met, fv = r["auc"] >= 0.7 and r["tprs"][0] >= 0.05, r["fixed_variance"]
        lines.append(f"| {r['graph']} | {r['pool']} | {r['num_candidates']} | {r['members']} / {r['non_members']} | "
                     f"{r['member_accuracy']:.2f} / {r['non_member_accuracy']:.2f} | {r['auc']:.3f} | {_pct(r['tprs'][0])} | "
                     f"{_pct(r['tprs'][1])} | {'yes' if met else '**no**'} | {fv['auc']:.3f}, {_pct(fv['tprs'][0])}, "
                     f"{_pct(fv['tprs'][1])} | {r['seconds']:.0f} |")
    lines += _student_table(b_rows, runs, b_src)
    lines += ["", f"## (c) White-box audit of the votes (Confident-GNMax, worst-case neighbours, {trials:,} trials per world)", "",
              "N = 250 teachers, C = 26 classes, T = 0.3·N = 75, σ₁ = σ₂ = σ(ε, Q = 200, δ = 1e-5); one query: "
              "audited ε lower bound (95 %) vs the proven ε of one query (ledger, δ = 1e-5).", "",
              "| ε (Q = 200) | σ | proven ε / query | audited ε_lb / query | worst neighbours | event | ≤ proven? | s |",
              "|---|---|---|---|---|---|---|---|"]
    for r in c_rows:
        lines.append(f"| {r['epsilon_target']:g} | {r['sigma']:.2f} | {r['proven_epsilon']:.4f} | {r['epsilon']:.4f} | "
                     f"{r['pair']} | {r['event']} ({r['direction']}) | {'**VIOLATION**' if r['violation'] else 'yes'} | {r['seconds']:.0f} |")
    lines += ["", "Caveats: in (a) and (b) the scored pairs share shadows (and, in (b), runs), so they are not independent "
              "draws; AUC/TPR are point estimates and (b)'s Clopper–Pearson intervals treat the pairs as independent. "
              "(b) attacks the student, which sees no private node: a flat ROC there does not test the ε (spec, row 9); "
              "(c) is the audit that does."]
    print("\n".join(lines))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        out.with_suffix(".json").write_text(json.dumps({"quick": q, "delta": DELTA, "prompts": a_rows, "student": b_rows,
                                                        "votes": c_rows}, indent=2, default=str) + "\n")
        print(f"wrote {out.with_suffix('.md')} and .json")
    return 3 if violation else 0


if __name__ == "__main__":
    sys.exit(main())
