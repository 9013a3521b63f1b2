"""A catalogue computed through a tower, under Keras 3: the tests of :mod:`tests.test_shared_computation`."""

from tests.test_shared_computation import (  # noqa: F401  (collected here, run under Keras 3)
    test_a_catalogue_computed_through_a_tower_is_refused_naming_the_layer, test_a_catalogue_read_from_the_table_trains,
    test_fixed_sizes_are_compared_when_traced)
