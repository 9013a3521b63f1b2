"""``make_private`` at the user level (issue 20) under Keras 3 (issue 21): the same tests, this process's stack.

The bodies are those of :mod:`tests.test_make_private_users`, collected again in
this process, whose ``tf.keras`` is Keras 3: user sampling with ``fit(user_ids=)``,
ε over users, one user with many examples moving the weights by at most C
(both clipping methods), the refusals, the unit kept across a resume, and the
private selection with users counted per row.
"""

from tests.test_make_private_users import (  # noqa: F401  (collected here, run under Keras 3)
    test_a_release_of_another_unit_is_refused_and_one_of_the_run_unit_is_charged,
    test_one_user_with_many_examples_moves_the_weights_by_at_most_c,
    test_private_selection_at_the_user_level_takes_user_counts_and_refuses_example_counts,
    test_resuming_with_another_unit_is_refused, test_the_ledger_records_the_user_unit,
    test_user_level_fit_reports_the_unit_and_epsilon_over_users, test_user_level_needs_user_ids_and_refuses_datasets)
