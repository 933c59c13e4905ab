"""The privacy callback's noise mode: independent Gaussian noise (DP-SGD), or banded correlated noise (banded MF).

``PrivacyCallback(noise="banded", bands=b)`` gives the model's one DP optimizer a
:class:`~lightning_dprel.core.correlated_noise.BandedNoise` before step 1, with the user's coefficients or the optimal
ones for the planned steps, after checking that the training data is drawn by the sampler the amplification is proven
for: a ``DPDataLoader(..., partitions=b)`` (cyclic Poisson, one example per unit). Any other sampler is refused here,
naming it; the ledger then accounts the run with ``banded_poisson_gaussian`` (⌈T/b⌉ Poisson Gaussian compositions).

References:
    Choquette-Choo et al. (Amplified) Banded Matrix Factorization, NeurIPS 2023 (arXiv 2306.08153), Section 4.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from lightning_dprel.accounting.mechanisms.banded import check_cyclic_sampling
from lightning_dprel.core.checks import check_int
from lightning_dprel.core.correlated_noise import BandedNoise, check_coefficients
from lightning_dprel.core.optim import DPOptimizer

__all__ = ["NOISE_MODES", "noise_mode", "install_noise", "refuse_for_releases", "one_step_per_batch"]

#: The callback's noise modes.
NOISE_MODES = ("independent", "banded")


def noise_mode(noise: str, bands: Optional[int], coefficients: Optional[Sequence[float]]) -> Optional[dict[str, Any]]:
    """The callback's noise arguments, checked: None for independent noise, else the banded mode's bands and c."""
    if noise not in NOISE_MODES:
        raise ValueError(f"`noise` must be one of {NOISE_MODES}, got {noise!r}.")
    if noise == "independent":
        if bands is not None or coefficients is not None:
            raise ValueError("`bands` and `coefficients` are for noise='banded'; pass noise='banded' or drop them.")
        return None
    if bands is None:
        raise ValueError("noise='banded' needs `bands` (b ≥ 1, the partitions of DPDataLoader(..., partitions=b)).")
    bands = check_int("bands", bands, 1)
    if coefficients is not None:
        coefficients = check_coefficients(coefficients)
        if len(coefficients) != bands:
            raise ValueError(f"`coefficients` must hold b = {bands} values c_0 = 1, …, c_{{b−1}}, got {len(coefficients)}.")
    return {"bands": bands, "coefficients": coefficients}


def refuse_for_releases(layer: Any, mode: Optional[dict[str, Any]]) -> None:
    """Refuse the banded mode for a model that releases otherwise than by DP-SGD steps (planned releases)."""
    if mode is not None:
        raise ValueError(f"noise='banded' correlates the noise of DP-SGD steps; {type(layer).__name__} plans releases "
                         "that are not optimizer steps. Use noise='independent' (the default).")


def one_step_per_batch(mode: Optional[dict[str, Any]], new_steps: int) -> int:
    """``new_steps``; in the banded mode a batch without exactly one step is refused before the next step (a drawn
    batch not released, or two steps on one, would bring a row's steps closer than b apart)."""
    if mode is not None and new_steps != 1:
        raise RuntimeError(
            f"noise='banded': a training batch made {new_steps} DP optimizer steps; the cyclic sampler's min-separation "
            "holds only with exactly one step per drawn batch. Step once in every training_step (private_step)."
        )
    return new_steps


def _describe(sampler: Any) -> str:
    """What draws the batches, in words (the refusal names it)."""
    from torch.utils.data import DataLoader, RandomSampler

    if isinstance(sampler, DataLoader) and not hasattr(sampler, "batches"):
        how = "shuffling" if isinstance(sampler.sampler, RandomSampler) else "fixed batches"
        return f"a DataLoader with {type(sampler.sampler).__name__} ({how})"
    return type(sampler).__name__


def _sampler(trainer: Any) -> Any:
    """The training loader (or datamodule) that draws the batches."""
    loaders = trainer.train_dataloader
    loaders = list(loaders.values()) if isinstance(loaders, dict) else loaders
    loaders = list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]
    return loaders[0] if len(loaders) == 1 else (trainer.datamodule or loaders)


def install_noise(trainer: Any, layer: Any, mode: Optional[dict[str, Any]]) -> None:
    """Give the layer's one DP optimizer the banded noise of ``mode`` (None: independent noise), before step 1; banded
    noise set on the optimizer otherwise is refused (its sampler and one-step-per-batch checks are this mode's)."""
    if mode is None:
        if getattr(getattr(layer, "_dp_optimizer", None), "correlation", None) is not None:
            raise ValueError(
                f"{type(layer).__name__}'s DP optimizer has banded correlated noise (set_correlated_noise), but the "
                "PrivacyCallback was built with noise='independent': the checks its amplification needs (cyclic "
                "Poisson batches, exactly one step per drawn batch) run only in the banded mode. Build the callback "
                "with noise='banded', bands=b (it installs the noise), or call set_correlated_noise(None).")
        return
    from lightning_dprel.datamodules.poisson import DPDataLoader

    bands = mode["bands"]
    sampler = _sampler(trainer)
    batches = getattr(sampler, "batches", None)
    if not isinstance(sampler, DPDataLoader) or batches.partitions is None:
        found = ("DPDataLoader without partitions (plain Poisson over all units)" if isinstance(sampler, DPDataLoader)
                 else type(trainer.datamodule).__name__ if trainer.datamodule is not None else _describe(sampler))
        raise ValueError(
            f"noise='banded' is proven only under cyclic Poisson (b-min-sep) sampling of one example per unit; the "
            f"training data comes from {found}, under which a unit can take part in steps closer than b apart (plain "
            "Poisson, shuffling, fixed batches) or appear in other partitions' steps (a coupled relational sampler's "
            f"negatives). Train on DPDataLoader(dataset, batch_size=B, partitions={bands}), or use noise='independent'."
        )
    check_cyclic_sampling(sampler.sampling_spec, bands)
    dps = [getattr(o, "optimizer", o) for o in trainer.optimizers]
    dp = getattr(layer, "_dp_optimizer", None)
    if len(dps) != 1 or not isinstance(dp, DPOptimizer) or dps[0] is not dp or int(layer.releases_per_sample) != 1:
        raise ValueError(
            f"noise='banded' needs a model whose steps are one DPOptimizer's, one release per batch; "
            f"{type(layer).__name__} has {len(dps)} optimizer(s) and {layer.releases_per_sample} release(s) per batch. "
            "Use a PrivateModule with one optimizer, or a plain LightningModule (the callback attaches DP-SGD)."
        )
    steps = max(1, int(min(trainer.estimated_stepping_batches, 10**4)) - int(trainer.global_step))  # T for c (capped)
    dp.set_correlated_noise(BandedNoise(bands, mode["coefficients"], steps=steps))
