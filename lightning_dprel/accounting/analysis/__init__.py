"""Pure RDP mathematics (no state): sampled Gaussian, coupled-sampling mixtures, the binomial expectation.

The PATE kernels (:mod:`.pate`, scipy.stats) are imported where used, not here: the accounting CLI stays light."""

from lightning_dprel.accounting.analysis.binomial import BinomialPlan, binomial_plan
from lightning_dprel.accounting.analysis.coupled_rdp import (
    coupled_rdp,
    log_psi_forward_exact,
    log_psi_quadrature,
    mixture_log_weights,
)
from lightning_dprel.accounting.analysis.sampled_gaussian import eq3_rdp, log_a, log_a_orders

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
