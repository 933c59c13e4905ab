"""User-facing re-export of :mod:`lightning_dprel.datamodules.datasets` (configs may name ``datamodules.datasets.X``)."""

from lightning_dprel.datamodules.datasets import *  # noqa: F401,F403
from lightning_dprel.datamodules.datasets import __all__  # noqa: F401
