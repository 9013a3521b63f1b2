"""The private step every backend shares (DESIGN §3): losses on a tape, clip, privatize, scale, apply.

* :mod:`~tfdp_sparse.step.losses` — per-example float32 losses under a tape,
  non-finite and masked examples contributing nothing;
* :mod:`~tfdp_sparse.step.update` — clip (:func:`private_update`) and the
  shared half :func:`noised_update` (mechanism, ``1/B``, regularizers);
* :mod:`~tfdp_sparse.step.train_step` — the whole step of a tape-driven
  backend (Keras, parameter servers);
* :mod:`~tfdp_sparse.step.optimizer` (``DPOptimizer``, tf-keras) and
  :mod:`~tfdp_sparse.step.optimizer_keras3` (``Keras3DPOptimizer``): the
  optimizers whose ``private_step`` runs the shared step and apply its
  pairs; :mod:`~tfdp_sparse.step.attachment` (a model's taps);
* :mod:`~tfdp_sparse.step.regularization`, :mod:`~tfdp_sparse.step.non_finite`.

This package sits below ``keras`` (``make_private``, ``PrivateStep``),
``distribute`` and ``layers.tpu`` and imports none of them: the backends reach
the optimizer here, not up into ``keras``.
"""
