"""The coupling check under Keras 3 (``tf.keras`` is Keras 3 here): the tests of :mod:`tests.test_coupling_check`.

Keras 3's dropout draws from seed-generator variables, which the check
restores before every evaluation; tf-keras' from the global seed, which it
sets. Both must pass per-example dropout and refuse coupling in training.
"""

from tests.test_coupling_check import (  # noqa: F401  (collected here, run under Keras 3)
    test_a_batchnorm_is_refused_naming_it_and_its_statistics_are_untouched,
    test_a_layer_writing_its_own_weight_from_the_batch_is_refused_by_name,
    test_coupling_the_old_check_missed_is_refused, test_dropout_and_gaussian_noise_pass_in_training_mode_by_replay,
    test_randomness_beyond_replay_is_checked_in_inference_mode_and_says_so,
    test_the_check_runs_again_when_the_model_changes_and_not_otherwise)
