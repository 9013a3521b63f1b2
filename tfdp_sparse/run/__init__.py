"""The one run driver of private training, shared by ``fit`` and the trainers (issue 32, item 2).

A private run is the same whichever loop drives it: Keras' ``fit`` (through
:class:`~tfdp_sparse.keras.private_model.PrivateModel`) or the trainers'
step loop (:func:`trainers.loop.train_privately`, the parameter-server
trainer). What the guarantee depends on is written here once:

* :mod:`tfdp_sparse.run.batches` — :class:`RunSampler`: the batches a run
  draws (Poisson over examples or over users with at most ``k`` each, at a
  free or a fixed shape), one element layout ``(x, y[, mask][, user ids])``;
* :mod:`tfdp_sparse.run.budget` — :class:`RunBudget`: the ledger charged
  once per executed step, the not-private marks, the steps the target ε
  allows (σ's calibration reused, no search within it), the stop reason, ε;
* :mod:`tfdp_sparse.run.driver` — :class:`PrivateRun`: a run's life
  (``begin``: marks, fresh secret generators, allowed steps; ``record_to``;
  ``end``: no pending noise left; ``guarantee_fields``: the report's
  privacy fields);
* :mod:`tfdp_sparse.run.checkpoint` — one checkpoint format (mechanism,
  ledger, privacy record; :class:`~tfdp_sparse.run.checkpoint.RunState`):
  a resume continues the saved ledger as written and refuses other privacy
  settings, in ``fit``'s ``<weights>.private`` file and in the trainers'
  numbered checkpoints alike.

Each loop supplies only what differs: how a step is called, how progress is
shown (Keras callbacks, or the trainers' lines and TensorBoard) and where
the weights go (Keras' weights file beside the state, or the same checkpoint). This package imports downward only (accounting,
data, noise source, privacy unit); ``keras/`` and ``trainers/`` import it.

Example::

    sampler = RunSampler(num_examples=60_000, batch_size=256, noise=noise)
    run = PrivateRun(mechanism, RunBudget(ledger, step_accounting, target_epsilon=1.0))
    allowed = run.begin(noise, shuffled=False, planned=1000)   # None: no target, or no guarantee
    for t, (x, y) in enumerate(sampler.dataset(gather, num_steps=allowed or 1000)):
        ...                                                     # one private step
        run.record_to(t + 1)
    run.end(executed=allowed or 1000)
"""

from tfdp_sparse.run.batches import RunSampler, UserRows
from tfdp_sparse.run.budget import RunBudget
from tfdp_sparse.run.driver import PrivateRun, guarantee_fields, not_private_reasons

__all__ = ["PrivateRun", "RunBudget", "RunSampler", "UserRows", "guarantee_fields", "not_private_reasons"]
