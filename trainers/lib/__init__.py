"""The stages of a private training run, composed by :func:`trainers.loop.train_privately`.

``config`` (run settings) -> ``privacy`` (δ, σ calibrated on plans, the
accountant) -> ``checkpoints`` (resume a run with the same settings) ->
``prepare`` (optimizer and mechanism, the opened ledger) -> ``budget`` (the
steps the budget allows) -> ``steps`` (one ledger entry per executed step,
progress, checkpoints) -> ``result``.
"""
