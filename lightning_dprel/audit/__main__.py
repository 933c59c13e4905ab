"""``python -m lightning_dprel.audit --config configs/audit_tiny.yaml``."""

import sys

from lightning_dprel.audit.cli import main

sys.exit(main())
