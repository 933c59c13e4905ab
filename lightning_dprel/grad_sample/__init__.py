"""Per-example gradients behind one protocol (:class:`~lightning_dprel.grad_sample.base.TupleGradients`) and one entry point
(:class:`~lightning_dprel.grad_sample.dispatch.GradSampler`): vmap (the reference), ghost clipping (only where exact),
a per-example loop, stacked copies; memory-sized chunks; norms and re-weighted sums of formed gradients (``sums``)."""
