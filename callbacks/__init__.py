"""Lightning callbacks of lightning_dprel."""

from callbacks.privacy import ACCOUNTING_LABELS, PAPER_EQ3_WARNING, PrivacyCallback
from callbacks.selection import ValidationSelection

__all__ = ["PrivacyCallback", "ValidationSelection", "ACCOUNTING_LABELS", "PAPER_EQ3_WARNING"]
