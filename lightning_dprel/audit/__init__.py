"""Empirical privacy audit (issue 15): canary entities by secret coins, membership scores, ε lower bounds.

Privacy unit audited: one entity (a node with all its relations), add/remove — the library's
:data:`~lightning_dprel.datamodules.edge_tuples.spec.PRIVACY_UNIT`. A lower bound above a proven ε is a violation: report it.
``python -m lightning_dprel.audit --config configs/audit_tiny.yaml``; docs/audit.md.

The LiRA and PATE audits load on first use (torchmetrics, DP-GPL): the command starts, and says so, seconds sooner.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_dprel.audit.bounds import (
    OneRunBound,
    TwoRunBound,
    clopper_pearson,
    one_run_audit,
    one_run_epsilon,
    one_run_p_value,
    two_run_audit,
)
from lightning_dprel.audit.canaries import CanaryGraph, canary_graph, secret_coins
from lightning_dprel.audit.runner import AuditRecord, audit_setting, proven_epsilons
from lightning_dprel.audit.whitebox import CanaryGrads, WhiteBoxSetting, canary_scores

_LAZY = {
    **dict.fromkeys(("DPCheck", "RocSummary", "TprCheck", "dp_tpr_check", "lira_scores", "logit_confidence",
                     "logit_confidence_from_logits", "roc_summary"), "lightning_dprel.audit.lira"),
    **dict.fromkeys(("PateAudit", "audit_confident_gnmax", "neighbouring_histograms"), "lightning_dprel.audit.pate"),
}

__all__ = [
    "AuditRecord",
    "CanaryGrads",
    "CanaryGraph",
    "OneRunBound",
    "TwoRunBound",
    "WhiteBoxSetting",
    "audit_setting",
    "canary_graph",
    "canary_scores",
    "clopper_pearson",
    "one_run_audit",
    "one_run_epsilon",
    "one_run_p_value",
    "proven_epsilons",
    "secret_coins",
    "two_run_audit",
    "DPCheck",
    "PateAudit",
    "RocSummary",
    "TprCheck",
    "audit_confident_gnmax",
    "dp_tpr_check",
    "lira_scores",
    "logit_confidence",
    "logit_confidence_from_logits",
    "neighbouring_histograms",
    "roc_summary",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lightning_dprel.audit' has no attribute {name!r}")
