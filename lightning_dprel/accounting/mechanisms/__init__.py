"""The generic mechanisms, registered on import (and the registry's API, re-exported).

* :mod:`.coupled` — the coupled edge-tuple sampling's ``freq_corrected``, ``freq_paper``, ``standard``, ``naive``, and
  the per-example ``poisson_gaussian``;
* :mod:`.releases` — ``gaussian`` (a noised statistic, not an optimizer step).

A method's own mechanisms and units are registered by its package (``lightning_dprel/methods/<m>/accounting.py``,
imported by the package); this list never names a method: a lookup of a name not registered yet imports the method
packages (:mod:`lightning_dprel.core.discovery`).
"""

from lightning_dprel.accounting.registry import *  # noqa: F401,F403
from lightning_dprel.accounting.registry import __all__ as _registry_all
from lightning_dprel.accounting.registry import _cached_rdp, _lookup, _orders_key  # noqa: F401 - the Accountant's fast path, its cache
from lightning_dprel.accounting.mechanisms.coupled import (  # noqa: F401
    EXAMPLE_PRIVACY_UNIT,
    MAX_ACCOUNTED_DEGREE,
    MECHANISMS,
    PAPER_EQ3_WARNING,
    accounted_degree,
    per_example_poisson_gaussian,
)
from lightning_dprel.accounting.mechanisms import releases  # noqa: F401

__all__ = [*_registry_all, "MECHANISMS", "PAPER_EQ3_WARNING", "EXAMPLE_PRIVACY_UNIT", "accounted_degree",
           "MAX_ACCOUNTED_DEGREE", "per_example_poisson_gaussian"]
