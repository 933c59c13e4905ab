"""Lightning callbacks of lightning_dprel."""

from lightning_dprel.callbacks.privacy import ACCOUNTING_LABELS, PAPER_EQ3_WARNING, PrivacyCallback
from lightning_dprel.callbacks.public import PublicGradientSubspace, PublicInterleave, PublicWarmStart
from lightning_dprel.callbacks.resume import ResumeHint
from lightning_dprel.callbacks.selection import ValidationSelection

__all__ = ["PrivacyCallback", "ValidationSelection", "PublicWarmStart", "PublicGradientSubspace", "PublicInterleave", "ResumeHint", "ACCOUNTING_LABELS", "PAPER_EQ3_WARNING"]
