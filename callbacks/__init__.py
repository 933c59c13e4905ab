"""User-facing re-export of :mod:`lightning_dprel.callbacks` (the library itself never imports this package).

A project with its own top-level ``callbacks`` package shadows this one; import from
``lightning_dprel`` (``from lightning_dprel import PrivacyCallback``) to be safe.
"""

from lightning_dprel.callbacks import (
    ACCOUNTING_LABELS, PAPER_EQ3_WARNING, PrivacyCallback, PublicGradientSubspace, PublicInterleave, PublicWarmStart, ValidationSelection,
)

__all__ = ["PrivacyCallback", "ValidationSelection", "PublicWarmStart", "PublicGradientSubspace", "PublicInterleave", "ACCOUNTING_LABELS", "PAPER_EQ3_WARNING"]
