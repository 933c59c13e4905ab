"""Recipe 1's step time: a plain LightningModule made private by ``PrivacyCallback`` + ``DPDataLoader``, beside itself
trained non-privately (the same module, ``DataLoader(batch_size=b, shuffle=True)``, no callback), on CPU.

The private step is example-level DP-SGD (Abadi et al. 2016, Alg. 1) as the callback attaches it
(:class:`~lightning_dprel.core.attached.AttachedDPSGD`): per-example gradients of the user's ``training_step``, each
example alone, by ``torch.func.vmap`` (ghost norms for its ``nn.Linear`` layers) (the user's training logs are private and not computed unless asked for), clip → sum → noise → ÷ b → the
user's optimizer, the ledger's charge, the update watch (a clone of the parameters after each step, compared at batch
start and end) and the callback's ε after every step.

Models: (1) an MLP classifier, 64 features → 256 → 256 → 10, b = 256; (2) a transformer encoder classifier
(``nn.TransformerEncoder``, 2 layers, d_model 64, 4 heads, 32 tokens, mean pool → 10 classes), b = 64.

Timing: the wall time from the first callback's ``on_train_batch_start`` to the last callback's ``on_train_batch_end``
(so the privacy callback's own per-step work counts; loading the batch does not, it is reported apart as the loop
period), warm-up steps dropped, median over the steps of every round; non-private and private fits alternate, each in a
fresh Trainer, so a shared machine's load falls on both. The breakdown comes from one more private fit in which library
functions are wrapped by timers here (exclusive times, median per step; the library is not edited). 

Usage: ``python benchmarks/bench_made_private.py [--quick] [--threads 1] [--out PATH]``. Writes
``benchmarks/results/made_private_cpu.json``. ``benchmarks/bench_against_commit.py`` runs it against an earlier commit's
library, side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results" / "made_private_cpu.json"
NUM_CLASSES = 10


# --------------------------------------------------------------------------- the user's project (no lightning_dprel)
def _modules():
    import pytorch_lightning as pl
    import torch.nn.functional as F
    from torch import nn

    class Classifier(pl.LightningModule):
        """A user's classifier: cross-entropy, ``self.log``, SGD with momentum."""

        def __init__(self, net: nn.Module):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    class TokenClassifier(nn.Module):
        """Token embedding + learned positions → TransformerEncoder → mean pool → linear head."""

        def __init__(self, vocab: int, seq_len: int, d_model: int = 64, heads: int = 4, layers: int = 2):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
            # dropout 0: with attention dropout (nn.MultiheadAttention's float `dropout`, not an nn.Dropout) the
            # callback's one-off reduction check still samples masks and refuses the module (reported, issue 33)
            layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, NUM_CLASSES)

        def forward(self, ids):
            return self.head(self.encoder(self.embed(ids) + self.pos).mean(-2))

    def mlp():
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, NUM_CLASSES))

    return Classifier, mlp, TokenClassifier


def _task(name: str):
    """(module factory, dataset, b) for ``name``; N = 40·b rows, so an epoch has 40 steps."""
    from torch.utils.data import TensorDataset

    Classifier, mlp, TokenClassifier = _modules()
    g = torch.Generator().manual_seed(0)
    if name == "mlp":
        b, seq_len = 256, None
        x = torch.randn(40 * b, 64, generator=g)
        y = (x[:, :NUM_CLASSES] * torch.randn(NUM_CLASSES, generator=g)).argmax(-1)
        return (lambda: Classifier(mlp())), TensorDataset(x, y), b
    b, seq_len, vocab = 64, 32, 1000
    ids = torch.randint(0, vocab, (40 * b, seq_len), generator=g)
    y = ids[:, 0] % NUM_CLASSES
    return (lambda: Classifier(TokenClassifier(vocab, seq_len))), TensorDataset(ids, y), b


LABELS = {"mlp": "MLP 64→256→256→10, b = 256", "transformer": "TransformerEncoder 2×(d 64, 4 heads), 32 tokens, b = 64"}


# --------------------------------------------------------------------------- timing
class _StepClock:
    """Shared by the first and the last callback: batch start → batch end, and batch start → next batch start."""

    def __init__(self, warmup: int, profiler: "_Profiler | None" = None):
        self.warmup, self.profiler = warmup, profiler
        self.steps: list[float] = []
        self.periods: list[float] = []
        self.parts: list[dict[str, float]] = []
        self._t0 = self._last_start = None
        self._seen = 0

    def callbacks(self):
        from pytorch_lightning.callbacks import Callback

        clock = self

        class Start(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                now = time.perf_counter()
                if clock._last_start is not None and clock._seen > clock.warmup:
                    clock.periods.append(now - clock._last_start)
                clock._last_start = now
                if clock.profiler is not None:
                    clock.profiler.reset()
                clock._t0 = time.perf_counter()

        class End(Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                dt = time.perf_counter() - clock._t0
                clock._seen += 1
                if clock._seen > clock.warmup:
                    clock.steps.append(dt)
                    if clock.profiler is not None:
                        clock.parts.append(dict(clock.profiler.totals))

        return Start(), End()


class _Profiler:
    """Exclusive wall time per label of wrapped functions (a child's time is taken off its caller's)."""

    def __init__(self):
        self.stack: list[list] = []  # [label, child time]
        self.totals: dict[str, float] = {}

    def reset(self):
        self.totals = {}

    def wrap(self, fn, label: str, *, transparent_under: tuple[str, ...] = ()):
        prof = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if any(frame[0] in transparent_under for frame in prof.stack):
                return fn(*args, **kwargs)  # e.g. the user's step run by vmap: part of the per-example gradients
            prof.stack.append([label, 0.0])
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                _, child = prof.stack.pop()
                prof.totals[label] = prof.totals.get(label, 0.0) + dt - child
                if prof.stack:
                    prof.stack[-1][1] += dt

        return timed


PARTS = {
    "vmap": "per-example gradients (the user's step, each example alone)",
    "noise": "Gaussian noise draw (keyed CSPRNG)",
    "clip": "clip + sum + scale (DPOptimizer.pre_step)",
    "optim": "user's optimizer step (+ DPOptimizer.step glue)",
    "record": "record + AttachedDPSGD.training_step glue",
    "ledger": "ledger charge (step hook)",
    "watch": "update watch (clone after step, compares)",
    "epsilon": "ε after every step (callback's batch end)",
}


@contextlib.contextmanager
def _instrumented(prof: _Profiler):
    """Wrap the private path's library functions with ``prof``'s timers (class and module attributes, restored)."""
    from lightning_dprel.callbacks import privacy
    from lightning_dprel.core import attached, optim, privacy_layer, update_watch

    A, D, W, P = attached.AttachedDPSGD, optim.DPOptimizer, update_watch.UpdateWatch, privacy.PrivacyCallback
    L = privacy_layer.PrivacyLayer  # the layer's charge is the protocol's
    quiet = ("vmap", "check_reduction")
    originals = [(attached, "user_step_grads"), (attached, "user_step_tapped_grads"), (A, "training_step"), (A, "check_reduction"), (L, "_charge"),
                 (D, "draw_noise"), (D, "pre_step"), (D, "step"), (W, "check"), (W, "rebase"), (P, "on_train_batch_end")]
    saved = [(obj, name, obj.__dict__[name] if isinstance(obj, type) else getattr(obj, name)) for obj, name in originals]
    attached.user_step_grads = prof.wrap(attached.user_step_grads, "vmap")
    attached.user_step_tapped_grads = prof.wrap(attached.user_step_tapped_grads, "vmap")
    A.training_step = prof.wrap(A.training_step, "record")
    A.check_reduction = prof.wrap(A.check_reduction, "check_reduction")
    L._charge = prof.wrap(L._charge, "ledger")
    D.draw_noise = prof.wrap(D.draw_noise, "noise")
    D.pre_step = prof.wrap(D.pre_step, "clip")
    D.step = prof.wrap(D.step, "optim")
    W.check = prof.wrap(W.check, "watch")
    W.rebase = prof.wrap(W.rebase, "watch")
    P.on_train_batch_end = prof.wrap(P.on_train_batch_end, "epsilon")
    try:
        yield
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)


def fit(task: str, private: bool, steps: int, warmup: int, profiler: _Profiler | None = None) -> _StepClock:
    """One fit of ``warmup + steps`` training steps; the clock holds the timed steps."""
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader

    from lightning_dprel import DPDataLoader, PrivacyCallback

    make, data, b = _task(task)
    torch.manual_seed(0)
    model = make()
    clock = _StepClock(warmup, profiler)
    start, end = clock.callbacks()
    if private:
        loader = DPDataLoader(data, batch_size=b)
        callbacks = [start, PrivacyCallback(clip_norm=1.0, noise_multiplier=1.0, delta=1e-5), end]
    else:
        loader = DataLoader(data, batch_size=b, shuffle=True)
        callbacks = [start, end]
    trainer = pl.Trainer(max_steps=warmup + steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=callbacks)
    with _instrumented(profiler) if profiler is not None else contextlib.nullcontext():
        trainer.fit(model, train_dataloaders=loader)
    if private:
        privacy = next(c for c in trainer.callbacks if isinstance(c, PrivacyCallback))
        assert privacy.steps == warmup + steps, "every step should be a charged private step"
    return clock


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round, fewer steps (< 40 s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on a shared box)")
    parser.add_argument("--models", default="mlp,transformer")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"the JSON to write (default {RESULTS})")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*(does not have many workers|enable_nested_tensor|LeafSpec).*")
    # vmap has no batching rule for CPU flash attention and loops over examples there (part of the transformer's cost)
    warnings.filterwarnings("ignore", message=".*not yet implemented the batching rule.*")
    import logging

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    rounds, warmup = (1, 3) if args.quick else (5, 5)
    steps = {"mlp": 20 if args.quick else 40, "transformer": 8 if args.quick else 20}
    t_start = time.perf_counter()
    load = os.getloadavg()
    where = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), {args.threads} torch thread(s)"
    print(f"{where}; torch {torch.__version__}; load average {load[0]:.2f}")
    print(f"median step (first callback's batch start → last callback's batch end), {warmup} warm-up steps dropped; "
          f"{rounds} round(s), non-private and private fits alternating\n")
    record = {"device": where, "torch": torch.__version__, "threads": args.threads, "quick": args.quick,
              "rounds": rounds, "warmup_steps": warmup, "load_average_start": load[0], "models": {}}
    for task in args.models.split(","):
        runs = {False: [], True: []}
        for r in range(rounds):
            for private in ((False, True) if r % 2 == 0 else (True, False)):
                runs[private].append(fit(task, private, steps[task], warmup))
        prof = _Profiler()
        shimmed = fit(task, True, steps[task], warmup, profiler=prof)
        plain_ms = _median_ms([s for c in runs[False] for s in c.steps])
        priv_ms = _median_ms([s for c in runs[True] for s in c.steps])
        per_round = [_median_ms(p.steps) / _median_ms(n.steps) for n, p in zip(runs[False], runs[True])]
        period = {k: _median_ms([s for c in runs[k] for s in c.periods]) for k in (False, True)}
        parts = {k: statistics.median([p.get(k, 0.0) for p in shimmed.parts]) * 1e3 for k in PARTS}
        shim_total = _median_ms(shimmed.steps)
        parts["rest"] = max(shim_total - sum(parts.values()), 0.0)
        ratio = priv_ms / plain_ms
        print(f"{LABELS[task]}: {steps[task]} timed steps a fit")
        print(f"  non-private step {plain_ms:8.2f} ms   private step {priv_ms:8.2f} ms   ratio {ratio:.2f} "
              f"(per round {', '.join(f'{x:.2f}' for x in per_round)})")
        print(f"  loop period incl. loading the batch: non-private {period[False]:.2f} ms, private {period[True]:.2f} ms "
              f"(ratio {period[True] / period[False]:.2f})")
        print(f"  private step, broken down (timers wrapped round library functions; this fit's median {shim_total:.2f} ms):")
        for key, ms in parts.items():
            label = PARTS.get(key, "rest: Lightning's loop, zero_grad, the user's step glue")
            print(f"    {label:<55} {ms:7.2f} ms  {100 * ms / shim_total:5.1f} %")
        record["models"][task] = {
            "label": LABELS[task], "timed_steps_per_fit": steps[task],
            "nonprivate_step_ms": plain_ms, "private_step_ms": priv_ms, "ratio": ratio, "ratio_per_round": per_round,
            "loop_period_ms": {"nonprivate": period[False], "private": period[True]},
            "breakdown_ms": parts, "breakdown_fit_step_ms": shim_total, "breakdown_labels": PARTS,
        }
        print()
    record["load_average_end"] = os.getloadavg()[0]
    record["wall_s"] = time.perf_counter() - t_start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1, ensure_ascii=False))
    print(f"wall {record['wall_s']:.0f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
