"""Entity-level privacy accounting for Algorithm 3 (Eq. 3, Theorem C.1, Theorem D.1 of the paper).

Pure mathematics (``analysis/``, ``profiles``, ``conversion``) is apart from bookkeeping (``Accountant``);
``mechanisms`` maps names to per-step RDP functions; ``curves`` gives ε over time as data (and a plot).
Each mechanism states the privacy unit its bound is proven for; the relational method's unit (the
entity) and mechanisms are the coupled edge-tuple sampling's
(:mod:`lightning_dprel.datamodules.edge_tuples.accounting`).
"""

from lightning_dprel.accounting.accountant import Accountant
from lightning_dprel.accounting.calibration import epsilon_for, max_steps_for, noise_multiplier_for
from lightning_dprel.accounting.conversion import rdp_to_epsilon
from lightning_dprel.accounting.curves import epsilon_curve, plot_epsilon_curve
from lightning_dprel.accounting.mechanisms import (
    Mechanism,
    get_mechanism,
    per_step_rdp,
    register_mechanism,
    registered_mechanisms,
)
from lightning_dprel.accounting.orders import DEFAULT_ORDERS
from lightning_dprel.accounting.profiles import freq_corrected_profile, paper_profile, standard_profile

__all__ = [
    "DEFAULT_ORDERS",
    "Accountant",
    "Mechanism",
    "epsilon_curve",
    "epsilon_for",
    "freq_corrected_profile",
    "get_mechanism",
    "max_steps_for",
    "noise_multiplier_for",
    "paper_profile",
    "per_step_rdp",
    "plot_epsilon_curve",
    "rdp_to_epsilon",
    "register_mechanism",
    "registered_mechanisms",
    "standard_profile",
]
