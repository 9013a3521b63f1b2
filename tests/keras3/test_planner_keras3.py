"""The planner in ``make_private`` under Keras 3: the tests of :mod:`tests.test_planner` that build models."""

from tests.test_planner import (  # noqa: F401  (collected here, run under Keras 3)
    test_make_private_without_a_batch_size_trains_with_the_plan, test_what_the_user_sets_wins)
