"""Lightning callbacks of lightning_dprel."""

from callbacks.privacy import ACCOUNTING_LABELS, PAPER_EQ3_WARNING, PrivacyCallback

__all__ = ["PrivacyCallback", "ACCOUNTING_LABELS", "PAPER_EQ3_WARNING"]
