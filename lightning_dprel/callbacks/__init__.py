"""Lightning callbacks of lightning_dprel."""

from lightning_dprel.callbacks.privacy import ACCOUNTING_LABELS, PAPER_EQ3_WARNING, PrivacyCallback
from lightning_dprel.callbacks.resume import ResumeHint
from lightning_dprel.callbacks.selection import ValidationSelection

__all__ = ["PrivacyCallback", "ValidationSelection", "ResumeHint", "ACCOUNTING_LABELS", "PAPER_EQ3_WARNING"]
