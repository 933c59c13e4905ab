"""The relational method's clipping, unit and mechanisms, registered on import (like every method's
``accounting``).

* clipping ``"freq"``: FREQ-CLIP, Algorithm 1 (:mod:`.clipping`, the method's own);
* unit ``entity`` and the coupled mechanisms (``freq_corrected``, ``freq_paper``, ``standard``,
  ``naive``), with the mechanism each (clipping, accounting) pair selects: the coupled edge-tuple
  sampling's, which AdvSGM shares, so they are registered by that sampling
  (:mod:`lightning_dprel.datamodules.edge_tuples.accounting`, light enough for the accounting
  command line) and imported here.
"""

from __future__ import annotations

from lightning_dprel.datamodules.edge_tuples.accounting import MECHANISMS, PAPER_EQ3_WARNING
from lightning_dprel.datamodules.edge_tuples.spec import ENTITY, PRIVACY_UNIT, EdgeTuples
from lightning_dprel.methods.relational.clipping import FREQ

__all__ = ["ENTITY", "PRIVACY_UNIT", "EdgeTuples", "FREQ", "MECHANISMS", "PAPER_EQ3_WARNING"]
