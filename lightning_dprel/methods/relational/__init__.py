"""Entity-level DP relational learning (Huang et al.): coupled sampling, per-tuple gradients, FREQ-CLIP, Theorem C.1."""
