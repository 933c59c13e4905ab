"""Entry point of ``python -m lightning_dprel.accounting`` (see :mod:`lightning_dprel.accounting.cli`)."""

import sys

from lightning_dprel.accounting.cli import main

sys.exit(main())
