"""Lightning callbacks of lightning_dprel."""

from lightning_dprel.callbacks.privacy import ACCOUNTING_LABELS, PAPER_EQ3_WARNING, PrivacyCallback
from lightning_dprel.callbacks.public import PublicGradientSubspace, PublicInterleave, PublicWarmStart
from lightning_dprel.callbacks.resume import ResumeHint
from lightning_dprel.callbacks.selection import ValidationSelection
from lightning_dprel.core.update_watch import public_update

__all__ = ["PrivacyCallback", "ValidationSelection", "PublicWarmStart", "PublicGradientSubspace", "PublicInterleave", "ResumeHint", "public_update", "ACCOUNTING_LABELS", "PAPER_EQ3_WARNING"]
