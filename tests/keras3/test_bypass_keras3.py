"""The hidden-bypass tests of ``make_private`` (issue 18) under Keras 3 (issue 21): nothing bypasses it silently.

The test bodies are those of :mod:`tests.test_make_private` and
:mod:`tests.test_refused_layers`, collected again in this process, whose
``tf.keras`` is Keras 3: their models are ``keras.layers`` models, their
optimizer the stack's (:func:`tests.stack_optimizer.dp_optimizer`). Covered:
``mixed_float16`` (the ``LossScaleOptimizer`` that ``compile`` wraps around a DP
optimizer is refused; ``attach`` and ``make_private`` refuse autocast layers by
name on Keras 3, where tf-keras trains them), a custom ``train_step``, a recompiled
optimizer, weight regularizers (outside clipping, ``fit`` = ``PrivateStep``),
``activity_regularizer``, losses coupling examples, BatchNormalization and
state written in training, tied weights and direct gathers, LazyDP
checkpoints during ``fit``, layers created after ``attach``, a ``DPEmbedding``
nested in a user's layer (:mod:`tests.test_nested_tables`) and a loss the tape
did not record (:mod:`tests.test_unrecorded_loss`).
"""

import keras
import pytest
import tensorflow as tf

from tests.stack_optimizer import dp_optimizer
from tests.test_make_private import B, BCE, N, ctr_model, data, dp, zero_gradient_model
from tfdp_sparse.keras import UnprivatizedUpdateError, make_private
from tfdp_sparse.mechanisms import build
from tests.test_make_private import (  # noqa: F401  (collected here, run under Keras 3)
    test_activity_regularizer_is_refused_by_name,
    test_custom_train_step_calling_apply_gradients_is_refused, test_lazydp_checkpoints_during_fit_hold_no_pending_noise,
    test_losses_coupling_examples_are_refused,
    test_per_example_layers_pass_and_opt_out_is_labelled, test_recompiled_with_another_optimizer_is_refused_at_fit,
    test_regularizer_gradients_are_added_outside_clipping_the_same_in_fit_and_private_step)
from tests.test_refused_layers import (  # noqa: F401
    test_direct_gather_of_a_table_is_refused_statically_and_at_run_time, test_fit_refuses_batchnorm_without_gamma_beta,
    test_layer_with_state_written_in_training_is_refused, test_nonprivate_sgd_still_trains_batchnorm_statistics,
    test_private_step_refuses_batchnorm_naming_it, test_run_time_row_count_check_passes_for_lookups_only,
    test_table_read_under_stop_gradient_is_allowed_and_updates_only_looked_up_rows,
    test_tied_dense_kernel_is_refused_naming_the_layer, test_tied_weights_are_refused_by_fit,
    test_tied_weights_are_refused_naming_the_layer, test_untied_dense_passes_and_matches_brute_force)
from tests.test_layer_registry import (  # noqa: F401
    test_layers_created_after_attach_are_refused_by_name)
from tests.test_unrecorded_loss import (  # noqa: F401
    test_loss_not_recorded_by_the_tape_is_refused_and_changes_nothing,
    test_recorded_loss_passes_and_a_table_without_gradient_gets_dp_sgd_noise)
from tests.test_nested_tables import (  # noqa: F401
    test_make_private_trains_a_nested_table, test_nested_table_is_clipped_by_its_own_rule_and_matches_brute_force)


def test_mixed_float16_is_refused_by_layer_name():
    """Keras 3 reads autocast weights as cast tensors (no tf.Variable to tap): refused, naming the layers and fix."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = zero_gradient_model()
        with pytest.raises(ValueError, match=r"layers \['hidden', 'out'\] compute in another dtype.*float32"):
            make_private(model, dp(), num_examples=N, batch_size=B, steps=1, learning_rate=0.1, loss=BCE)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_loss_scale_optimizer_around_a_dp_optimizer_is_refused_not_silent():
    """``compile`` under ``mixed_float16`` wraps the optimizer in a ``LossScaleOptimizer``, which calls ``apply``
    (never ``apply_gradients``) of the optimizer it wraps: refused there. Before, it trained without noise."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = ctr_model()
        model.compile(optimizer=dp_optimizer(build(dp()), learning_rate=0.1, expected_batch_size=B),
                      loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none"))
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        before = model.get_weights()
        with pytest.raises(UnprivatizedUpdateError, match="mixed_float16"):
            model.fit(*data(), batch_size=B, epochs=1, verbose=0)
        assert all((a == b).all() for a, b in zip(before, model.get_weights()))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_a_direct_update_step_is_refused_and_changes_nothing():
    """Issue 31 item 5: ``Keras3DPOptimizer.update_step(g, v, lr)`` called directly updated the weight, unnoised."""
    model = ctr_model()
    opt = dp_optimizer(build(dp()), learning_rate=0.1, expected_batch_size=B)
    opt.attach(model)
    variable = model.trainable_variables[1]
    opt.build(model.trainable_variables)
    before = variable.numpy().copy()
    with pytest.raises(UnprivatizedUpdateError):
        opt.update_step(tf.ones_like(variable), variable, 0.1)
    assert (variable.numpy() == before).all()
