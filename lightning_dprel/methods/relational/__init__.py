"""Entity-level DP relational learning (Huang et al.): coupled sampling, per-tuple gradients, FREQ-CLIP, Theorem C.1.

Its clipping ``"freq"``, unit ``entity`` and mechanisms are registered on import
(:mod:`.accounting`).
"""

from lightning_dprel.methods.relational import accounting  # noqa: F401 - registers its names
