"""The trainers at the user level: user ids, user-level batches and the checks that refuse what cannot be protected.

At the user level (issue 20; Charles et al. 2024, "Fine-tuning LLMs with
user-level differential privacy", user-level sampling) a step samples
*users* by Poisson with rate ``q = B_users / N_users`` and takes at most
``k`` examples of each (:class:`tfdp_sparse.data.user_sampling.UserPoissonSampler`);
each user's summed gradient is clipped to ``C`` (the step gets the batch's
user ids); the accountant charges the Poisson-subsampled Gaussian with ``q``
over users. This module gives :func:`trainers.loop.train_privately`:

* :func:`check_user_level`: the settings and data the user level needs (a
  ``"user"`` column, Poisson sampling, the Keras backend), refused by name
  otherwise;
* :func:`dense_user_ids`: any integer user ids renumbered ``0 .. N_users - 1``.

The users' batches are drawn by the one sampler of every driver,
:class:`tfdp_sparse.run.RunSampler` (``make_private``'s ``fit`` too).

Example::

    users = dense_user_ids(arrays[USER_COLUMN])          # MovieLens userIds -> 0 .. N_users - 1
    sampler = RunSampler(len(users), 256, NoiseSource.secure(), PrivacyUnitConfig.user(5), user_ids=users)
    sampler.num_units, sampler.sampling_rate             # N_users, 256 / N_users
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import tensorflow as tf

from tfdp_sparse.layers.tpu.backend import EmbeddingBackend
from tfdp_sparse.privacy_unit import PrivacyUnitConfig
from trainers.lib.config import LoopConfig

__all__ = ["USER_COLUMN", "check_user_level", "dense_user_ids"]

#: The training array holding each example's user id (synthetic pCTR ``"user"``, MovieLens ``userId``).
USER_COLUMN = "user"


def dense_user_ids(user_ids: np.ndarray) -> np.ndarray:
    """The users renumbered ``0 .. N_users - 1`` in order of id (any integer ids, e.g. MovieLens ``userId``).

    Example: ``dense_user_ids(np.array([30, 10, 30]))`` is ``[1, 0, 1]``.
    """
    ids = np.asarray(user_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"user ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
    return np.unique(ids, return_inverse=True)[1].astype(np.int64).reshape(-1)


def check_user_level(unit: PrivacyUnitConfig, arrays: Mapping[str, np.ndarray], sampling: str,
                     loop: LoopConfig) -> None:
    """Refuses, with the reason, a user-level run this trainer cannot protect (nothing at the example level).

    * data without a ``"user"`` column (e.g. Criteo: a log line names no
      person, so no one's examples can be bounded together);
    * sampling other than Poisson (the user-level accountant assumes it);
    * ``embedding_backend=tpu`` (a TPU runs the program under a
      ``TPUStrategy``, whose replicas would clip their own share of a user;
      the TPU program on its CPU emulator, ``tpu_emulator``, clips each user's
      sum as the Keras backend does), and a ``tf.distribute`` strategy in
      scope (e.g. mirrored: replicas clip their own share of a user).

    The one place the trainers refuse the user level, on one machine and on
    parameter servers alike (:func:`trainers.lib.cluster.train_on_cluster`
    calls it before connecting: a cluster step is one worker's batch of
    whole users, clipped per user there, so the cluster adds no refusal).

    Example: ``check_user_level(PrivacyUnitConfig.user(5), {"cat": ..., "label": ...}, "poisson", loop)``
    raises ``ValueError: privacy_unit=user needs ... 'user' ...``.
    """
    if not isinstance(unit, PrivacyUnitConfig):
        raise TypeError(f"unit must be a PrivacyUnitConfig, got {type(unit).__name__}")
    if not unit.is_user_level:
        return
    if USER_COLUMN not in arrays:
        raise ValueError(
            f"privacy_unit=user needs each example's user id (a {USER_COLUMN!r} array), and this data has none "
            f"(arrays: {sorted(arrays)}): without user ids no one's examples can be bounded together. Criteo "
            "logs name no user; use synthetic data with users (--num_users) or MovieLens (userId), or "
            "privacy_unit=example")
    if sampling != "poisson":
        raise ValueError(f"privacy_unit=user samples users by Poisson (what its accountant assumes); "
                         f"sampling={sampling!r} is not supported")
    backend = loop.performance.embedding_backend
    if backend is EmbeddingBackend.TPU:
        raise ValueError(f"privacy_unit=user is not supported with embedding_backend={backend.value}: a TPU runs "
                         "the embedding program under a TPUStrategy, whose replicas would each clip their own share "
                         "of a user's examples (the program runs one replica and has no whole-user split); use "
                         "embedding_backend=tpu_emulator (the same program on CPU, clipping each user's sum) or keras")
    if tf.distribute.has_strategy():
        raise ValueError(f"privacy_unit=user is not supported under {type(tf.distribute.get_strategy()).__name__}: "
                         "replicas would clip their own share of a user's examples; train on one replica")
