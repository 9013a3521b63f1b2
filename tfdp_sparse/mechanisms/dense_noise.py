"""Dense-layer noise drawn before the rule runs: off the critical path of a private step.

A dense layer's Gaussian noise depends on no data. Drawn where a rule uses
it (:func:`tfdp_sparse.mechanisms.dpsgd.noise_dense`, after the backward
pass and, in the generator's order, behind the table noise the rule draws
first), the ~1.3 M Gaussians of the pCTR MLP (4 x 598) run after
everything else of the step. :meth:`DenseNoiseBlocks.draw` issues them
before the rule: inside a ``tf.function`` the draw then has no input but
the generator, so the executor runs it on the other core while the forward
and backward passes run (the step's LazyDP catch-up, drawn at the lookups,
stays first: same generator, earlier in program order).

Order, and each block used once:

* every block comes from the mechanism's one generator, per step in a fixed
  order: the forward pass's catch-up noise, then one block per dense
  (non-table) variable in variable order, then the rule's own draws;
* a block lives in the step that drew it: :meth:`DenseNoiseBlocks.take`
  hands it out once and forgets it, so a second request of one step draws
  afresh (as the synchronous path does); unclaimed blocks are dropped when
  the step ends. Nothing is stored in a variable, so a checkpoint holds no
  block and a resumed run can never reuse one (its generator is refreshed
  by :meth:`~tfdp_sparse.mechanisms.base.Mechanism.refresh_noise` as before).

Bit-identity. A block is ``generator.normal(shape)`` scaled as
``generator.normal(shape, stddev=s)`` scales it (``rnd * s + 0``), so with
reproducible seeds a model whose only noise is dense-layer noise (no table
draws) gets the synchronous path's noise bit for bit. With tables the rule's
row noise comes after the dense blocks instead of before: the same
distribution, other draws of the same stream.

Example::

    blocks = DenseNoiseBlocks.draw(mech.rng, variables, is_table)
    blocks.take(kernel, stddev=1.5)   # this step's N(0, 1.5^2) block of kernel
    blocks.take(kernel, stddev=1.5)   # None: a block is handed out once
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tfdp_sparse.tables import variable_key


class DenseNoiseBlocks:
    """One step's standard-normal blocks of its dense variables, each handed out once.

    Build it with :meth:`draw`; :meth:`take` returns a block scaled to a
    standard deviation and forgets it.
    """

    def __init__(self, blocks: dict):
        self._blocks = dict(blocks)

    @classmethod
    def draw(cls, generator: tf.random.Generator, variables: Sequence[tf.Variable],
             is_table: Sequence[bool]) -> "DenseNoiseBlocks":
        """``N(0, 1)`` blocks of the shape of every non-table variable, drawn in variable order from ``generator``.

        Example: for ``[table, kernel, bias]`` and ``[True, False, False]``
        it draws a kernel-shaped block, then a bias-shaped one.
        """
        blocks = {}
        for variable, table in zip(variables, is_table):
            if not table:
                blocks[variable_key(variable)] = generator.normal(variable.shape, dtype=tf.float32)
        return cls(blocks)

    @classmethod
    def empty(cls) -> "DenseNoiseBlocks":
        """No blocks: every request draws synchronously."""
        return cls({})

    def take(self, variable: tf.Variable, stddev: float) -> Optional[tf.Tensor]:
        """``variable``'s block as ``N(0, stddev^2)`` and forgotten, or ``None`` when none is left.

        Scaled as ``tf.random.Generator.normal(shape, stddev=stddev)`` scales
        its standard normals, so the values are those the generator would
        have returned for that draw.
        """
        block = self._blocks.pop(variable_key(variable), None)
        if block is None:
            return None
        return tf.math.add(block * tf.constant(stddev, tf.float32), tf.constant(0.0, tf.float32))

    def __len__(self) -> int:
        """Blocks not yet handed out."""
        return len(self._blocks)
