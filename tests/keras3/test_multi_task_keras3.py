"""Multi-task losses under Keras 3 (``tf.keras`` is Keras 3 here): the tests of :mod:`tests.test_multi_task`."""

from tests.test_multi_task import (  # noqa: F401  (collected here, run under Keras 3)
    test_bad_loss_weights_are_refused, test_fit_trains_both_heads_privately,
    test_the_weighted_sum_per_example_is_clipped_like_brute_force, test_the_weights_are_applied_per_example,
    test_weights_without_a_dict_of_losses_and_missing_labels_are_refused)
