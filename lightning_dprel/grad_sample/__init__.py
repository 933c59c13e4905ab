"""Per-example gradient providers behind one protocol (:class:`~lightning_dprel.grad_sample.base.TupleGradients`): vmap (the reference), ghost clipping (only where exact), memory-sized chunks."""
