"""The built-in mechanisms, grouped by method, registered on import (and the registry's API, re-exported).

* :mod:`.relational` — ``freq_corrected``, ``freq_paper``, ``standard``, ``naive``, ``poisson_gaussian``;
* :mod:`.dp_gcn` — ``subgraph_replace`` (provable, replace-one), ``gcn_paper`` (as published; under-states ε);
* :mod:`.advsgm` — ``skipgram_public_ids`` (provable, node ids public), ``advsgm_paper`` (Theorem 7 as published; warns);
* :mod:`.dp_gpl` — ``labelled_node_gaussian`` (DP-SGD prompt tuning, one example per labelled node);
* :mod:`.releases` — ``gaussian`` (a noised statistic, not an optimizer step).
"""

from lightning_dprel.accounting.registry import *  # noqa: F401,F403
from lightning_dprel.accounting.registry import __all__ as _registry_all
from lightning_dprel.accounting.registry import _cached_rdp, _lookup, _orders_key  # noqa: F401 - the Accountant's fast path, its cache
from lightning_dprel.accounting.mechanisms.relational import (  # noqa: F401
    EXAMPLE_PRIVACY_UNIT,
    MAX_ACCOUNTED_DEGREE,
    MECHANISMS,
    PAPER_EQ3_WARNING,
    accounted_degree,
)
from lightning_dprel.accounting.mechanisms.dp_gcn import GCN_PAPER_WARNING, SUBGRAPH_PRIVACY_UNIT  # noqa: F401
from lightning_dprel.accounting.mechanisms.advsgm import ADVSGM_PAPER_WARNING  # noqa: F401
from lightning_dprel.accounting.mechanisms import releases  # noqa: F401
from lightning_dprel.accounting.mechanisms import dp_gpl  # noqa: F401

__all__ = [*_registry_all, "MECHANISMS", "PAPER_EQ3_WARNING", "EXAMPLE_PRIVACY_UNIT", "accounted_degree",
           "MAX_ACCOUNTED_DEGREE", "SUBGRAPH_PRIVACY_UNIT", "GCN_PAPER_WARNING", "ADVSGM_PAPER_WARNING"]
