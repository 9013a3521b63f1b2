"""Retrieval losses through ``make_private`` under Keras 3: the make_private tests of :mod:`tests.test_retrieval`."""

from tests.test_retrieval import (  # noqa: F401  (collected here, run under Keras 3)
    test_in_batch_negatives_are_still_refused_with_the_generator_replayed,
    test_sampled_negatives_drawn_in_the_step_pass_the_coupling_check_in_training_mode)
