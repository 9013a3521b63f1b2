"""Independent cross-checks of the toolkit against the field's libraries.

Nothing here is used by training: these helpers run the same computation
through another implementation so that tests can compare the two.

* :mod:`tfdp_sparse.crosscheck.tf_privacy` — TensorFlow Privacy's ghost
  norms (``fast_gradient_clipping.clip_grads.compute_gradient_norms``) and its
  DP-SGD privacy statement (``compute_dp_sgd_privacy_lib``);
* :mod:`tfdp_sparse.crosscheck.recommenders` — TensorFlow Recommenders'
  ``tfrs.metrics.FactorizedTopK`` for retrieval recall@k.

Importing this package imports neither library; each module imports its
library when first used and raises :class:`CrossCheckUnavailable` with what
to install if it is missing.
"""

from tfdp_sparse.crosscheck.errors import CrossCheckUnavailable

__all__ = ["CrossCheckUnavailable"]
