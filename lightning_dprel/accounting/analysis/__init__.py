"""Pure RDP mathematics (no state): sampled Gaussian, coupled-sampling mixtures, the binomial expectation."""

from lightning_dprel.accounting.analysis.binomial import BinomialPlan, binomial_plan
from lightning_dprel.accounting.analysis.coupled_rdp import (
    coupled_rdp,
    log_psi_forward_exact,
    log_psi_quadrature,
    mixture_log_weights,
)
from lightning_dprel.accounting.analysis.sampled_gaussian import eq3_rdp, log_a, log_a_orders
from lightning_dprel.accounting.analysis import pate  # noqa: F401  (PATE 2018 / Confident-GNMax kernels)

__all__ = [
    "BinomialPlan",
    "binomial_plan",
    "coupled_rdp",
    "eq3_rdp",
    "log_a",
    "log_a_orders",
    "log_psi_forward_exact",
    "log_psi_quadrature",
    "mixture_log_weights",
]
