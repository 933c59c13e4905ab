"""The generic mechanisms, registered on import (and the registry's API, re-exported).

* :mod:`.per_example` — the per-example ``poisson_gaussian`` (the core's unit ``example``);
* :mod:`.releases` — ``gaussian`` (a noised statistic, not an optimizer step);
* :mod:`.banded` — ``banded_poisson_gaussian`` (banded correlated noise under cyclic Poisson sampling).

A method's own mechanisms and units are registered by its package
(``lightning_dprel/methods/<m>/accounting.py``, imported by the package; the coupled edge-tuple
sampling's by :mod:`lightning_dprel.datamodules.edge_tuples.accounting`); this list never names a
method: a lookup of a name not registered yet imports the method packages
(:mod:`lightning_dprel.core.discovery`).
"""

from lightning_dprel.accounting.registry import *  # noqa: F401,F403
from lightning_dprel.accounting.registry import __all__ as _registry_all
from lightning_dprel.accounting.registry import PLD_CURVES, _cached_rdp, _generation, _lookup, _orders_key  # noqa: F401 - the Accountant's fast path, its caches
from lightning_dprel.accounting.mechanisms.per_example import (  # noqa: F401
    EXAMPLE_PRIVACY_UNIT,
    per_example_poisson_gaussian,
)
from lightning_dprel.accounting.mechanisms import banded, releases  # noqa: F401

__all__ = [*_registry_all, "EXAMPLE_PRIVACY_UNIT", "per_example_poisson_gaussian"]
