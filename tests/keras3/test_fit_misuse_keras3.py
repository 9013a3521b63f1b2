"""The misuse of ``fit`` and the per-example loss alignment, under Keras 3 (``tf.keras`` is Keras 3 here).

The tests are those of :mod:`tests.test_make_private_misuse` and
:mod:`tests.test_per_example_loss`, collected again in this process: a
repeated ``fit`` with the budget spent runs no step, ``train_on_batch`` and
``validation_split`` are refused, a list of inputs trains, and labels
``[B]`` against logits ``[B, 1]`` give one loss per example.
"""

from tests.test_make_private_misuse import (  # noqa: F401  (collected here, run under Keras 3)
    test_a_list_of_inputs_trains_like_keras, test_a_longer_fit_stops_at_the_target,
    test_a_repeated_fit_never_passes_the_target, test_train_on_batch_is_refused,
    test_validation_split_is_refused_and_validation_data_works,
    test_steps_per_execution_cannot_take_fit_past_the_target,
    test_a_loss_given_to_compile_after_fit_is_checked_for_coupling)
from tests.test_per_example_loss import (  # noqa: F401
    test_fit_trains_a_binary_model_with_rank_one_labels, test_loss_name_is_per_example_and_uncoupled,
    test_rank_one_labels_against_one_logit_give_one_loss_per_example)
