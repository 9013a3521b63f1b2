"""``training_metrics`` under Keras 3 (``tf.keras`` is Keras 3 here): the tests of :mod:`tests.test_training_metrics`."""

from tests.test_training_metrics import (  # noqa: F401  (collected here, run under Keras 3)
    test_a_bad_training_metrics_value_is_refused, test_by_default_no_statistic_of_a_private_batch_is_reported,
    test_raw_training_metrics_are_an_explicit_labelled_release, test_validation_metrics_are_named_outside_the_guarantee)
