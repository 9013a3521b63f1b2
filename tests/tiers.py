"""The two test tiers: which tests run only in ``make test-all``, and which fast test proves the same property.

``make test`` runs every test not listed here (the fast tier: within 15
minutes on 2 cores, each file under 60 s); ``make test-all`` runs the fast
tier and then these. ``tests/conftest.py`` marks each listed test ``full``
at collection, and ``tests/test_tiers.py`` checks the table itself: every key
and every cover names a test function that exists, and no cover is itself in
the full tier. So nothing tested becomes untested (test-all runs it), and no
property leaves the fast tier without a named fast proof.

A key is ``path::function`` (every parametrisation) or ``path::function[id]``
(one). Example::

    >>> full_only("tests/test_make_private.py::test_target_epsilon_calibrates_sigma_for_every_mechanism")
    True
    >>> full_only("tests/test_make_private.py::test_resumed_fit_continues_epsilon")
    False
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Moved:
    """A test run by ``make test-all`` only: the fast tests that prove its property, and why it moved."""

    covered_by: tuple[str, ...]
    why: str


_PCTR = "tests/test_train_pctr.py::"
_PCTR_PRIVACY = "tests/test_train_pctr_privacy.py::"
_PCTR_INPUTS = "tests/test_train_pctr_inputs.py::"
_K3 = "tests/keras3/"

FULL_ONLY: dict[str, Moved] = {
    # -- make_private (tf-keras) ---------------------------------------------------------------
    "tests/test_make_private.py::test_target_epsilon_calibrates_sigma_for_every_mechanism": Moved(
        ("tests/test_readme_example.py::test_readme_bring_your_own_model_runs_on_tf_keras",
         "tests/test_accounting.py::test_calibrate_round_trip",
         "tests/test_mechanism_contract.py::test_calibrating_builds_no_mechanism"),
        "three PLD calibrations and fits (50 s); make_private's calibration to a target runs in the README example"),
    "tests/test_make_private_misuse.py::test_a_longer_fit_stops_at_the_target": Moved(
        ("tests/test_make_private_misuse.py::test_a_repeated_fit_never_passes_the_target",
         "tests/test_make_private.py::test_budget_stops_fit_before_the_step_that_would_exceed_the_target"),
        "14 s; the budget stop of fit is proved by the repeated and the planned fit"),
    # -- private by default ----------------------------------------------------------------------
    "tests/test_private_by_default.py::test_same_command_twice_gives_other_noise_and_other_batches": Moved(
        ("tests/test_private_by_default.py::test_secure_generators_never_repeat_and_reproducible_ones_do",
         "tests/test_private_by_default.py::test_every_registered_mechanism_is_secure_by_default",
         "tests/test_private_by_default.py::test_batch_sampler_secret_by_default_and_reproducible_with_noise_seed"),
        "four trainer runs (39 s); secure noise and secret batches are proved per generator and per mechanism"),
    "tests/test_private_by_default.py::test_reproducible_run_is_flagged_and_repeats": Moved(
        ("tests/test_private_by_default.py::test_noise_source_labels_and_bad_seeds",
         "tests/test_private_by_default.py::test_batch_sampler_secret_by_default_and_reproducible_with_noise_seed"),
        "shares the four trainer runs"),
    "tests/test_private_by_default.py::test_reproducible_run_says_so_in_the_progress_log": Moved(
        ("tests/test_private_by_default.py::test_noise_source_labels_and_bad_seeds",),
        "shares the four trainer runs"),
    "tests/test_private_by_default.py::test_delta_above_one_over_n_warns_in_the_json_line": Moved(
        ("tests/test_private_by_default.py::test_default_delta_is_well_below_one_over_n",),
        "shares the four trainer runs"),
    "tests/test_private_by_default.py::test_adafest_line_shows_sigma1_sigma2_and_the_effective_sigma": Moved(
        ("tests/test_mechanism_contract.py::TestAdaFESTContract::test_map_noise_matches_reported_sigma1",
         _PCTR + "test_metrics_line_has_required_fields"),
        "a trainer run with calibration (22 s); the σ1/σ2 split is proved on the mechanism"),
    "tests/test_private_by_default.py::test_shuffle_sampling_is_not_labelled_private": Moved(
        ("tests/test_private_by_default.py::test_eana_is_not_labelled_private",
         "tests/test_one_private_step.py::test_both_paths_refuse_a_target_for_a_mechanism_without_guarantee"),
        "a trainer run (12 s); the not-private label of a trainer run is proved with EANA"),
    # -- the pCTR trainer --------------------------------------------------------------------------
    _PCTR_PRIVACY + "test_budget_stop_before_exceeding_target": Moved(
        ("tests/test_make_private.py::test_budget_stops_fit_before_the_step_that_would_exceed_the_target",
         "tests/test_accounting.py::test_budget_checks_stop_before_exceeding",
         _PCTR_PRIVACY + "test_budget_too_small_for_one_step"),
        "a trainer run to the budget (15 s)"),
    _PCTR_PRIVACY + "test_eana_reports_no_epsilon": Moved(
        ("tests/test_private_by_default.py::test_eana_is_not_labelled_private",),
        "a trainer run (14 s); the same EANA run without ε is checked there"),
    _PCTR_PRIVACY + "test_dpfest_private_selection_is_made_and_charged": Moved(
        (_PCTR_PRIVACY + "test_dpfest_private_selection_requires_rdp",
         "tests/test_make_private_releases.py::test_private_selection_needs_counts_and_charges_the_selection"),
        "a trainer run (13 s)"),
    _PCTR_INPUTS + "test_criteo_tsv_counts_and_reports_malformed_lines": Moved(
        ("tests/test_data_criteo_lines.py::test_parse_file_records_each_kind_with_its_line_number",
         "tests/test_train_pctr_prepared.py::test_prepared_days_train_exactly_like_the_tsv_reference"),
        "a trainer run (9 s); malformed lines are counted by the parser, TSV training runs in the prepared test"),
    _PCTR_INPUTS + "test_command_line_prints_one_json_line": Moved(
        (_PCTR_INPUTS + "test_command_line_bad_setting_exits_with_message",
         "tests/test_cli_help.py::test_trainer_help_lists_privacy_flags_and_delta_default",
         _PCTR + "test_metrics_line_has_required_fields"),
        "a trainer subprocess (13 s); the entry point runs as a subprocess in the other two, the JSON line in process"),
    "tests/test_tensorboard.py::test_trainer_entry_point_prints_no_tensorflow_startup_lines": Moved(
        (_PCTR_INPUTS + "test_command_line_bad_setting_exits_with_message",
         "tests/test_tensorboard.py::test_quiet_startup_sets_level_3_only_when_the_user_chose_none"),
        "a second trainer subprocess (12 s): one CLI subprocess per entry point stays"),
    "tests/test_trainer_table_optimizer.py::test_sgd_run_keeps_the_dp_optimizers_own_sgd": Moved(
        ("tests/test_trainer_table_optimizer.py::test_adagrad_run_names_its_rule_and_keeps_slots",
         "tests/test_trainer_table_optimizer.py::test_rule_of_each_name"),
        "a trainer run (12 s)"),
    "tests/test_train_pctr_prepared.py::test_epochs_work_for_every_data_source": Moved(
        ("tests/test_train_pctr_prepared.py::test_prepared_days_train_exactly_like_the_tsv_reference",),
        "three trainer runs (25 s)"),
    "tests/test_streaming_periods.py::test_target_epsilon_calibrates_the_worst_period_and_epochs_are_per_period": Moved(
        ("tests/test_streaming_periods.py::test_epsilon_is_the_max_over_periods_of_an_independent_computation",
         "tests/test_accounting.py::test_calibrate_round_trip"),
        "a calibrated streaming run (17 s)"),
    "tests/test_trainers_user_level.py::test_example_level_run_is_unchanged_and_says_example": Moved(
        (_PCTR + "test_metrics_line_has_required_fields",
         "tests/test_trainers_user_level.py::test_run_identity_includes_the_unit_only_at_the_user_level"),
        "a trainer run (13 s)"),
    "tests/test_trainers_user_level.py::test_adafest_plus_trains_at_the_user_level_with_users_counted_in_its_selection":
        Moved(("tests/test_mech_user_level.py::test_adafest_plus_at_the_user_level_filters_users_inside_the_kept_rows",
               "tests/test_trainers_user_level.py::test_user_selection_counts_count_each_user_once_per_bucket"),
              "a trainer run (18 s)"),
    # -- resume and checkpoints --------------------------------------------------------------------
    "tests/test_resume_privacy.py::test_seeded_run_stays_not_private_after_resume_without_seed": Moved(
        ("tests/test_resume_privacy.py::test_refresh_noise_keeps_lazydp_history_and_reseeds_only_secure_generators",
         "tests/test_train_pctr_resume.py::test_resume_continues_steps_epsilon_and_weights_exactly"),
        "two trainer runs (21 s)"),
    "tests/test_resume_privacy.py::test_secure_run_resumed_securely_is_private": Moved(
        ("tests/test_resume_privacy.py::test_refresh_noise_keeps_lazydp_history_and_reseeds_only_secure_generators",
         "tests/test_train_pctr_resume.py::test_resume_continues_steps_epsilon_and_weights_exactly"),
        "two trainer runs (20 s)"),
    "tests/test_resume_privacy.py::test_two_resumes_of_one_checkpoint_add_different_noise": Moved(
        ("tests/test_resume_privacy.py::test_refresh_noise_keeps_lazydp_history_and_reseeds_only_secure_generators",),
        "three trainer runs (29 s)"),
    "tests/test_trainer_old_lazydp_checkpoint.py::test_old_lazydp_trainer_checkpoint_resumes_bit_exactly": Moved(
        ("tests/test_lazydp_old_checkpoint.py::test_old_checkpoint_resumed_at_its_step_continues_exactly",),
        "two trainer resumes (27 s); the same old LazyDP record resumes exactly at the mechanism"),
    "tests/test_trainer_old_lazydp_checkpoint.py::test_a_new_lazydp_checkpoint_still_needs_its_record": Moved(
        ("tests/test_lazydp_old_checkpoint.py::test_old_checkpoint_without_resume_is_refused_before_anything_changes",
         "tests/test_lazydp_old_checkpoint.py::test_resume_at_refuses_a_record_already_set_or_behind_the_histories"),
        "trainer runs (25 s)"),
    # -- one private step --------------------------------------------------------------------------
    "tests/test_one_private_step.py::test_trainer_and_fit_end_equal[dpsgd]": Moved(
        ("tests/test_one_private_step.py::test_trainer_and_fit_end_equal[lazydp]",),
        "a trainer and a fit (21 s); the same comparison runs with LazyDP"),
    "tests/test_tpu_trainers.py::test_fixed_shape_run_on_the_emulator_equals_the_poisson_run_on_keras": Moved(
        ("tests/test_tpu_static_batch.py::test_emulator_on_padded_batches_equals_keras_path_on_the_batches",
         "tests/test_tpu_static_batch.py::test_the_fixed_shape_driver_has_no_free_dimension",
         "tests/test_one_private_step.py::test_fixed_shape_batches_train_alike_on_both_drivers_and_as_poisson_batches"),
        "two traces of the 26-table pCTR model (25 s) put tests/test_tpu_trainers.py at 48 s of the 60 s budget; the "
        "emulator on padded batches, LazyDP's look-ahead and the fixed-shape driver are pinned fast on a small model"),
    "tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[adafest]": Moved(
        ("tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[dpsgd]",
         "tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[lazydp]",
         "tests/test_xla_adafest.py::test_compiled_steps_equal_the_steps_without_xla"),
        "two emulator runs with a compiled TensorCore half (14-26 s); the compiled TPU half is pinned with DP-SGD "
        "and LazyDP, DP-AdaFEST's compiled step on the Keras path"),
    "tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[dpfest]": Moved(
        ("tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[dpsgd]",
         "tests/test_static_batch.py::test_xla_traces_once_on_a_static_signature_and_equals_the_step_without_xla"),
        "two emulator runs (10-15 s); DP-FEST's compiled step is pinned on the Keras path"),
    "tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[adafest_plus]": Moved(
        ("tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[dpsgd]",
         "tests/test_xla_adafest.py::test_compiled_steps_equal_the_steps_without_xla"),
        "two emulator runs (20 s); DP-AdaFEST+'s compiled step is pinned on the Keras path"),
    "tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[dpfest_lazy]": Moved(
        ("tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[lazydp]",
         "tests/test_xla_lazy.py::test_make_private_compiles_once_and_equals_the_run_without_xla"),
        "two emulator runs (16 s); lazy DP-FEST's compiled catch-up is pinned on the Keras path, the TPU "
        "look-ahead with LazyDP"),
    "tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[eana]": Moved(
        ("tests/test_tpu_xla.py::test_compiled_tensor_core_half_equals_the_emulator[dpsgd]",
         "tests/test_static_batch.py::test_xla_traces_once_on_a_static_signature_and_equals_the_step_without_xla",
         "tests/test_tpu_xla.py::test_static_packing_sums_repeats_like_the_packing_and_fails_closed_on_overflow"),
        "two emulator runs (10 s); EANA's compiled step on the Keras path, and the static packing its slots need"),
    # -- examples, experiments, benchmarks ---------------------------------------------------------
    "tests/test_examples.py::test_example_smoke_prints_epsilon_and_utility[tfrs_retrieval.py]": Moved(
        ("tests/test_examples.py::test_example_smoke_prints_epsilon_and_utility[custom_ctr.py]",
         "tests/test_examples.py::test_tfrs_in_batch_softmax_is_refused",
         "tests/test_make_private_tfrs.py::test_tfrs_in_batch_retrieval_is_refused_by_the_coupling_check"),
        "an example subprocess (19 s); one example smoke per stack stays, TFRS refusal stays"),
    "tests/test_frontier.py::test_tiny_report_rows_have_finite_numbers": Moved(
        ("tests/test_frontier.py::test_plan_runs_every_algorithm_in_order",
         "tests/test_frontier.py::test_epsilon_curve_equals_dp_accounting_of_each_prefix"),
        "the tiny frontier run (34 s)"),
    "tests/test_frontier.py::test_tiny_report_epsilon_curve_is_the_accountants": Moved(
        ("tests/test_frontier.py::test_epsilon_curve_equals_dp_accounting_of_each_prefix",),
        "shares the tiny frontier run"),
    "tests/test_frontier.py::test_tiny_report_files_and_references": Moved(
        ("tests/test_frontier.py::test_plan_runs_every_algorithm_in_order",), "shares the tiny frontier run"),
    "tests/test_frontier.py::test_without_the_flag_no_heatmap": Moved(
        ("tests/test_frontier.py::test_plan_runs_every_algorithm_in_order",), "shares the tiny frontier run"),
    "tests/test_frontier_table_optimizers.py::test_rows_one_per_accepted_pair": Moved(
        ("tests/test_frontier_table_optimizers.py::test_parse_and_plan",), "the tiny frontier run (29 s)"),
    "tests/test_frontier_table_optimizers.py::test_report_has_the_column_and_the_skipped_note": Moved(
        ("tests/test_frontier_table_optimizers.py::test_parse_and_plan",), "shares the tiny frontier run"),
    "tests/test_sweep.py::test_tiny_sweep_rows": Moved(
        ("tests/test_sweep.py::test_plan_and_scale", "tests/test_sweep.py::test_aggregate_over_seeds"),
        "the tiny sweep (30 s)"),
    "tests/test_sweep.py::test_tiny_sweep_outputs": Moved(
        ("tests/test_sweep.py::test_plan_and_scale",), "shares the tiny sweep"),
    "tests/test_secret_sharer.py::test_cli_writes_exposure_json_and_png": Moved(
        ("tests/test_secret_sharer.py::test_tiny_run_memorises_repeated_canaries_and_unseen_canaries_score_the_null",
         "tests/test_secret_sharer.py::test_scoring_gives_exact_exposures"),
        "the secret-sharer CLI (10 s)"),
    "tests/test_benchmark_paired.py::test_the_pctr_model_pairs_at_a_vocabulary_scale": Moved(
        ("tests/test_benchmark_paired.py::test_pairs_give_a_line_each_and_a_flatness_line",),
        "the pCTR pairs (12 s); the same pairing runs on the micro model"),
    "tests/test_tpu_benchmark.py::test_emulator_next_to_keras_with_ratio_lines": Moved(
        ("tests/test_tpu_equivalence.py::test_emulator_equals_keras_path",),
        "the TPU benchmark (13 s); the emulator path itself is proved equal to Keras"),
    # -- parameter servers ------------------------------------------------------------------------
    "tests/distributed/ps/test_ps_trainer.py::test_target_epsilon_calibrates_on_the_cluster": Moved(
        ("tests/distributed/ps/test_ps_trainer.py::test_train_pctr_on_local_cluster",
         "tests/test_accounting.py::test_calibrate_round_trip"),
        "a calibrated cluster run (24 s); the cluster run and the calibration are proved apart"),
    # -- Keras 3 -----------------------------------------------------------------------------------
    _K3 + "test_train_pctr_keras3.py::test_tiny_run_on_keras_3_prints_its_stack_auc_and_epsilon[adafest-1-extra2]":
        Moved((_K3 + "test_make_private_keras3.py::test_sigma_zero_and_positive_differ[adafest-extra2]",
               _K3 + "test_train_pctr_keras3.py::test_tiny_run_on_keras_3_prints_its_stack_auc_and_epsilon"
                     "[dpsgd-0-extra0]"),
              "a Keras 3 trainer run (26 s)"),
    _K3 + "test_train_pctr_keras3.py::test_tiny_run_on_keras_3_prints_its_stack_auc_and_epsilon[lazydp-0-extra1]":
        Moved((_K3 + "test_dp_embedding_keras3.py::test_lazydp_trains_a_dp_embedding_model_and_noises_every_row_by_the_end_of_fit",
               _K3 + "test_train_pctr_keras3.py::test_tiny_run_on_keras_3_prints_its_stack_auc_and_epsilon"
                     "[dpsgd-0-extra0]"),
              "a Keras 3 trainer run (18 s)"),
    _K3 + "test_train_pctr_keras3.py::test_tiny_run_on_keras_3_prints_its_stack_auc_and_epsilon[dpsgd-0-extra3]":
        Moved((_K3 + "test_train_pctr_keras3.py::test_tiny_run_on_keras_3_prints_its_stack_auc_and_epsilon"
                     "[dpsgd-0-extra0]",),
              "a Keras 3 trainer run (13 s)"),
    _K3 + "test_train_pctr_keras3.py::test_tf_keras_run_says_tf_keras": Moved(
        (_PCTR_INPUTS + "test_command_line_bad_setting_exits_with_message",
         "tests/test_keras_check.py::test_package_names"),
        "a tf-keras trainer subprocess (12 s)"),
    _K3 + "test_dp_embedding_keras3.py::test_rows_no_example_looks_up_stay_bitwise_unchanged[adafest-extra1]": Moved(
        (_K3 + "test_keras_rs_embedding.py::test_rows_no_example_looks_up_stay_unchanged",
         _K3 + "test_dp_embedding_keras3.py::test_rows_no_example_looks_up_stay_bitwise_unchanged[dpsgd-extra0]"),
        "22 s; the same rows stay unchanged with DP-AdaFEST on keras-rs tables"),
    _K3 + "test_fit_misuse_keras3.py::test_a_list_of_inputs_trains_like_keras": Moved(
        ("tests/test_make_private_misuse.py::test_a_list_of_inputs_trains_like_keras",
         _K3 + "test_make_private_keras3.py::test_sequential_and_subclassed_models_train_privately"),
        "12 s; nested inputs are batched by the code shared with tf-keras, whose test stays"),
    _K3 + "test_fit_misuse_keras3.py::test_a_longer_fit_stops_at_the_target": Moved(
        (_K3 + "test_fit_misuse_keras3.py::test_a_repeated_fit_never_passes_the_target",),
        "as on tf-keras"),
    # -- the user level on parameter servers ------------------------------------------------------
    **{f"tests/distributed/ps/test_ps_user_level.py::test_user_level_cluster_steps_equal_one_machine_on_the_same_batches"
       f"[{name}]": Moved(
           ("tests/distributed/ps/test_ps_user_level.py::test_user_level_cluster_steps_equal_one_machine_on_the_same"
            "_batches[dpsgd]", "tests/test_mech_user_level.py::test_adafest_step_at_the_user_level_keeps_only_rows_"
            "looked_up"),
           "a cluster step per mechanism (3-9 s each, the PS tier runs serially); the cluster's user-level step is "
           "the one-machine step for DP-SGD, and each mechanism's user level is proved on one machine")
       for name in ("eana", "adafest", "lazydp")},
    "tests/distributed/ps/test_ps_user_level.py::test_trainer_user_level_on_the_cluster_charges_what_one_machine_charges":
        Moved(("tests/distributed/ps/test_ps_user_level.py::test_ledger_is_charged_per_executed_step_over_users_at_the"
               "_user_unit", "tests/test_trainers_user_level.py::test_mirrored_refuses_the_user_level_by_name_and_"
               "parameter_servers_take_it"),
              "a subprocess with its own cluster (8 s); the cluster's ledger at the user unit and the trainers' "
              "acceptance are proved fast"),
    # -- adaptive clipping -----------------------------------------------------------------------
    "tests/test_quantile_clipping.py::test_the_pctr_trainer_takes_adaptive_clipping_flags": Moved(
        ("tests/test_quantile_clipping.py::test_the_dual_encoder_trainer_takes_adaptive_clipping_at_both_units",),
        "a trainer run (10 s); both trainers read the same common flags, proved on the dual-encoder trainer"),
    "tests/test_quantile_clipping.py::test_fit_moves_the_bound_and_charges_the_count[user]": Moved(
        ("tests/keras3/test_quantile_clipping_keras3.py::test_fit_moves_the_bound_and_charges_the_count_on_keras3",
         "tests/test_quantile_clipping.py::test_a_user_counts_once_however_many_examples_exceed"),
        "8 s; the same fit at the user level runs on Keras 3 (one step core), the user count is proved directly"),
    "tests/test_adaptive_clipping_experiment.py::test_an_adaptive_run_reports_its_bound_and_the_table_lays_out_the_"
    "settings": Moved(
        ("tests/test_defaults_table.py::test_smoke_writes_rows_table_and_plot",
         "tests/test_quantile_clipping.py::test_make_private_planned_at_the_default_"
         "rate_adapts_and_a_set_rate_does_not"),
        "10 s; the experiment's runs are the defaults table's (its smoke runs), adaptive make_private is proved"),
    "tests/test_quantile_clipping.py::test_a_compiled_fixed_shape_fit_adapts_too": Moved(
        ("tests/test_quantile_clipping.py::test_fit_moves_the_bound_and_charges_the_count",
         "tests/test_xla_trainers.py::test_trainer_with_jit_and_static_batch_equals_fit_and_charges_alike"),
        "an XLA compilation (19 s); the bound's update is the same graph code as in the uncompiled fit"),
    # -- issue 32 (stop 40): the TPU program's user level, trainer-level duplicates ---------------
    "tests/test_tpu_user_level.py::test_fixed_shape_user_level_run_on_the_emulator_equals_keras": Moved(
        ("tests/test_tpu_user_level.py::test_emulator_user_level_equals_keras_user_level[dpsgd]",
         "tests/test_one_private_step.py::test_the_tpu_program_trains_as_fit_does",
         "tests/test_tpu_user_level.py::test_train_privately_at_the_user_level_runs_on_the_emulator"),
        "a fixed-shape trainer run on both backends (13 s); the emulator's user-level step equals Keras', and a "
        "trainer runs it, in the fast tier"),
    "tests/test_tpu_user_level.py::test_compiled_half_on_fixed_shape_user_batches_equals_keras": Moved(
        ("tests/test_tpu_user_level.py::test_emulator_user_level_equals_keras_user_level[dpsgd]",
         "tests/test_tpu_user_level.py::test_compiled_user_level_with_a_free_batch_dimension_is_refused_by_name_on_"
         "every_backend"),
        "an XLA compile of the TPU program (6 s); the uncompiled step's equality and the compiled refusal stay fast"),
    "tests/test_tpu_user_level.py::test_emulator_user_level_equals_keras_user_level[lazydp]": Moved(
        ("tests/test_tpu_user_level.py::test_emulator_user_level_equals_keras_user_level[dpsgd]",
         "tests/test_tpu_equivalence.py::test_emulator_equals_keras_path"),
        "the user-level clipping is the mechanism's input, shared by all; LazyDP's emulator path is pinned per "
        "example in the fast tier"),
    "tests/test_tpu_user_level.py::test_emulator_user_level_equals_keras_user_level[adafest]": Moved(
        ("tests/test_tpu_user_level.py::test_emulator_user_level_equals_keras_user_level[dpsgd]",
         "tests/test_tpu_equivalence.py::test_emulator_equals_keras_path"),
        "as LazyDP's: one mechanism at the user level proves the clipping, each mechanism is pinned per example"),
    "tests/test_private_by_default.py::test_saved_model_holds_no_generator_state_or_lazy_history": Moved(
        ("tests/test_lazy_reads.py::test_pctr_export_refuses_pending_then_exports_flushed_tables_without_noise_state",
         "tests/test_mech_lazydp.py::test_export_equals_flushed_table_and_refuses_pending"),
        "a LazyDP trainer run and export (19 s); the export's contents and its refusal of pending noise are fast"),
    "tests/test_tensorboard.py::test_pctr_run_writes_training_and_auc_scalars": Moved(
        ("tests/test_tensorboard.py::test_dual_encoder_run_writes_training_and_retrieval_scalars",
         "tests/test_tensorboard.py::test_training_log_round_trips_exact_values_and_leaves_out_what_is_not_there"),
        "both trainers publish through trainers/lib/publish.py now: the dual encoder's run proves the path (17 s)"),
    "tests/distributed/ps/test_ps_trainer.py::test_train_dual_encoder_on_local_cluster": Moved(
        ("tests/distributed/ps/test_ps_trainer.py::test_train_pctr_on_local_cluster",
         "tests/distributed/ps/test_ps_parity.py::test_adaptive_clipping_on_the_cluster_equals_one_machine"),
        "a second trainer subprocess on a cluster (18 s, serial tier); both trainers reach the cluster through "
        "trainers.lib.cluster.train_on_cluster and publish through trainers/lib/publish.py"),
    "tests/test_static_batch.py::test_xla_traces_once_on_a_static_signature_and_equals_the_step_without_xla"
    "[dpfest_sigma0]": Moved(
        ("tests/test_static_batch.py::test_xla_traces_once_on_a_static_signature_and_equals_the_step_without_xla"
         "[dpsgd_sigma0]",
         "tests/test_static_batch.py::test_xla_traces_once_on_a_static_signature_and_equals_the_step_without_xla"
         "[eana_sigma0]",
         "tests/test_xla_lazy.py::test_make_private_compiles_once_and_equals_the_run_without_xla[dpfest]"),
        "DP-FEST's XLA compile (10 s); one trace on a static signature is proved by DP-SGD and EANA, DP-FEST under "
        "XLA by its own fast test"),
    _K3 + "test_examples_keras3.py::test_example_smoke_on_keras_3[private_retrieval.py]": Moved(
        ("tests/test_examples.py::test_example_smoke_prints_epsilon_and_utility[private_retrieval.py]",
         _K3 + "test_retrieval_keras3.py::test_sampled_negatives_drawn_in_the_step_pass_the_coupling_check_in_"
               "training_mode"),
        "the retrieval example on Keras 3 (13 s); its smoke runs on tf-keras and its Keras 3 recipe in the fast tier"),
    _K3 + "test_examples_keras3.py::test_example_smoke_on_keras_3[custom_ctr.py]": Moved(
        ("tests/test_examples.py::test_example_smoke_prints_epsilon_and_utility[custom_ctr.py]",
         _K3 + "test_make_private_keras3.py::test_epsilon_in_history_and_report_fields"),
        "the custom CTR example on Keras 3 (8 s); its smoke runs on tf-keras and make_private's fit on Keras 3"),
    _K3 + "test_static_batch_keras3.py::test_user_level_padded_slots_change_nothing[adafest-UserClipMethod.GROUP_NORM]":
        Moved((_K3 + "test_static_batch_keras3.py::test_user_level_padded_slots_change_nothing"
                     "[dpsgd-UserClipMethod.GROUP_NORM]",
               "tests/test_static_batch_users.py::test_user_level_padded_slots_change_nothing"),
              "DP-AdaFEST's user-level padding on Keras 3 (4 s); DP-SGD's on Keras 3 and every case on tf-keras stay"),
    _K3 + "test_static_batch_keras3.py::test_user_level_padded_slots_change_nothing"
          "[adafest-UserClipMethod.EXAMPLE_SHARE]":
        Moved((_K3 + "test_static_batch_keras3.py::test_user_level_padded_slots_change_nothing"
                     "[dpsgd-UserClipMethod.EXAMPLE_SHARE]",
               "tests/test_static_batch_users.py::test_user_level_padded_slots_change_nothing"),
              "as the group-norm case"),
    _K3 + "test_dpfest_keras_rs.py::test_steps_equal_the_dp_embedding_model[adafest_plus]": Moved(
        (_K3 + "test_dpfest_keras_rs.py::test_steps_equal_the_dp_embedding_model[dpfest]",
         _K3 + "test_dpfest_keras_rs.py::test_private_selection_is_charged_for_every_keras_rs_table"),
        "DP-AdaFEST+ on keras-rs tables (4 s); the private selection's binding to keras-rs tables is proved by "
        "DP-FEST"),
    # -- stop 41: the fast tier's margin (per-test timings of the whole fast tier, one run) ------------------
    "tests/test_trainer_planner.py::test_a_pctr_run_without_batch_size_or_steps_trains_at_the_planners_choice": Moved(
        ("tests/test_trainer_planner.py::test_planned_loop_is_the_planners_choice_for_public_inputs",
         "tests/test_trainer_planner.py::test_the_planner_runs_only_when_the_user_sets_neither_batch_size_nor_steps",
         "tests/test_planner.py::test_make_private_without_a_batch_size_trains_with_the_plan"),
        "a whole pCTR trainer run (28 s); the trainers' loop is the planner's choice for public inputs, the flags "
        "reach the planner only when neither batch size nor steps is set, and make_private trains at the plan"),
    "tests/test_example_private_retrieval.py::test_sampled_negatives_with_logq_correction_beat_chance": Moved(
        ("tests/test_examples.py::test_example_smoke_prints_epsilon_and_utility",
         "tests/test_sensitivity_negatives.py::test_sampled_negatives_follow_the_public_distribution",
         "tests/test_sensitivity_negatives.py::test_sampled_logits_by_hand",
         "tests/test_sensitivity_negatives.py::test_bounded_negatives_move_the_clipped_sum_by_at_most_c"),
        "a second run of the retrieval example (17 s); the example beats chance in its smoke, the sampled "
        "negatives' law, logits and sensitivity are proved directly"),
    "tests/test_benchmark_xla_ab.py::test_smoke_gives_a_pair_line_a_refusal_line_and_a_plan_line": Moved(
        ("tests/test_benchmark_xla_ab.py::test_plan_lines_are_the_smallest_size_within_the_share_and_match_the_binomial_tail",
         "tests/test_benchmark_paired.py::test_pairs_give_a_line_each_and_a_flatness_line",
         "tests/test_static_batch.py::test_xla_traces_once_on_a_static_signature_and_equals_the_step_without_xla"),
        "a benchmark's smoke (16 s); its plan lines are proved directly, paired lines by the paired benchmark, "
        "the compiled step it times by the XLA equality tests"),
    "tests/test_benchmark_recurrent.py::test_one_line_per_configuration_then_the_summary": Moved(
        ("tests/test_benchmark_recurrent.py::test_the_fallback_configuration_has_no_recurrent_rule",
         "tests/test_benchmark_recurrent.py::test_bad_settings_exit_2",
         "tests/test_clip_recurrent.py::test_make_private_trains_embedding_gru_dense_without_the_fallback"),
        "a benchmark's smoke (15 s, shared with its fields test); the configurations it times and make_private on "
        "the recurrent model are proved directly"),
    "tests/test_benchmark_recurrent.py::test_configuration_fields_and_summary": Moved(
        ("tests/test_benchmark_recurrent.py::test_the_fallback_configuration_has_no_recurrent_rule",),
        "shares the smoke above"),
    "tests/test_benchmark_make_private.py::test_one_line_per_configuration_then_the_coupling_check": Moved(
        ("tests/test_benchmark_make_private.py::test_bad_settings_exit_2",
         "tests/test_benchmark_step_time.py::test_one_line_per_config_with_the_documented_fields",
         "tests/test_coupling_check.py::test_the_check_runs_again_when_the_model_changes_and_not_otherwise"),
        "a benchmark's smoke (20 s, shared by three tests); the step-time benchmark's lines, the coupling check "
        "it times and the benchmark's refusals stay fast"),
    "tests/test_benchmark_make_private.py::test_configuration_fields": Moved(
        ("tests/test_benchmark_step_time.py::test_one_line_per_config_with_the_documented_fields",),
        "shares the smoke above"),
    "tests/test_benchmark_make_private.py::test_coupling_check_line": Moved(
        ("tests/test_coupling_check.py::test_the_check_runs_again_when_the_model_changes_and_not_otherwise",),
        "shares the smoke above"),
    "tests/test_benchmark_calibration_cost.py::test_one_calibration_line_then_one_end_to_end_line_per_config": Moved(
        ("tests/test_benchmark_calibration_cost.py::test_legacy_search_is_restored_after_use",
         "tests/test_benchmark_calibration_cost.py::test_bad_arguments",
         "tests/test_budget_certified.py::test_the_planned_fit_runs_without_a_budget_search"),
        "a benchmark's smoke (9 s, shared by three tests); what it measures, a planned fit without a budget "
        "search, is proved directly"),
    "tests/test_benchmark_calibration_cost.py::test_calibration_line_old_and_new_both_meet_the_target": Moved(
        ("tests/test_budget_certified.py::test_the_planned_fit_runs_without_a_budget_search",
         "tests/test_accounting.py::test_calibrate_round_trip"),
        "shares the smoke above"),
    "tests/test_benchmark_calibration_cost.py::test_end_to_end_lines": Moved(
        ("tests/test_budget_certified.py::test_the_planned_fit_runs_without_a_budget_search",),
        "shares the smoke above"),
    # the fresh-clone run of 5c10cee: make test in 15.7 min (distributed 58 s, parameter servers 117 s, main
    # 9 min 30 s, Keras 3 3 min 20 s) on a machine about a fifth slower than the last stop's
    "tests/test_progress_rate.py::test_last_progress_line_reports_the_json_examples_per_sec": Moved(
        ("tests/test_progress_rate.py::test_step_stats_rate_is_examples_per_second_of_step_time",),
        "a trainer run (13 s); the one figure both report is proved on StepStats directly"),
    "tests/test_train_pctr_vocab.py::test_hash_is_the_default_and_public": Moved(
        ("tests/test_train_pctr_vocab.py::test_vocab_flags",
         "tests/test_train_pctr_vocab.py::test_synthetic_data_has_nothing_outside_the_guarantee",
         "tests/test_train_pctr_vocab.py::test_public_vocabulary_file_is_named_outside_the_guarantee"),
        "a trainer run on TSV data (13 s); the flags' default and what each vocabulary puts outside the "
        "guarantee stay fast"),
    "tests/test_toy_mechanism.py::test_toy_trains_through_the_pctr_trainer": Moved(
        ("tests/test_toy_mechanism.py::test_toy_trains_through_the_dual_encoder_trainer",
         "tests/test_toy_mechanism.py::test_toy_noise_is_two_sigma_c_on_touched_rows"),
        "a trainer run (12 s); a registered mechanism reaches a trainer in the dual encoder's run"),
    "tests/test_benchmark_step_time.py::test_isolated_configurations_give_the_same_lines_and_a_dead_child_gives_an_"
    "error_line": Moved(
        ("tests/test_benchmark_step_time.py::test_one_line_per_config_with_the_documented_fields",
         "tests/test_benchmark_step_time.py::test_bad_algorithm_gives_an_error_line_and_the_run_continues"),
        "child processes of a benchmark (14 s); its lines and its error lines stay fast in process"),
    _K3 + "test_resume_keras3.py::test_a_resumed_fit_keeps_the_void_mark_of_reproducible_noise": Moved(
        ("tests/test_run_checkpoint.py::test_a_resumed_fit_keeps_the_void_mark_of_reproducible_noise",
         _K3 + "test_resume_keras3.py::test_lazydp_fit_resumed_from_save_weights_equals_the_uninterrupted_run"),
        "the shared continuation on Keras 3 (4 s); its Keras 3 state file is proved by the exact LazyDP resume"),
    _K3 + "test_resume_keras3.py::test_a_resumed_fit_with_another_sigma_is_refused": Moved(
        ("tests/test_run_checkpoint.py::test_a_resumed_fit_with_another_sigma_is_refused",
         _K3 + "test_resume_keras3.py::test_lazydp_fit_resumed_from_save_weights_equals_the_uninterrupted_run"),
        "as above"),
    _K3 + "test_fit_misuse_keras3.py::test_steps_per_execution_cannot_take_fit_past_the_target": Moved(
        ("tests/test_make_private_misuse.py::test_steps_per_execution_cannot_take_fit_past_the_target",
         _K3 + "test_fit_misuse_keras3.py::test_a_repeated_fit_never_passes_the_target"),
        "15 s on Keras 3; the budget stop is the one run driver's (tf-keras case fast), and Keras 3's own loop "
        "never passes the target in the repeated fit"),
    _K3 + "test_dpfest_keras_rs.py::test_steps_equal_the_dp_embedding_model[dpfest_lazy]": Moved(
        (_K3 + "test_dpfest_keras_rs.py::test_steps_equal_the_dp_embedding_model[dpfest]",
         _K3 + "test_lazydp_keras_rs.py::test_lazydp_steps_equal_the_dp_embedding_model_between_steps_and_after_the_"
               "flush"),
        "14 s; DP-FEST on keras-rs tables and the lazy catch-up on them are each proved"),
    _K3 + "test_examples_keras3.py::test_example_smoke_on_keras_3[tfrs_retrieval.py]": Moved(
        ("tests/test_examples.py::test_example_smoke_prints_epsilon_and_utility",
         _K3 + "test_examples_keras3.py::test_every_example_is_listed"),
        "11 s; the example's smoke on tf-keras stays (TFRS models run on tf-keras; its Keras 3 run checks the "
        "same output)"),
    _K3 + "test_lazydp_keras3.py::test_saving_flushes_first_and_stores_the_flushed_table[PrivateModel.save]": Moved(
        (_K3 + "test_lazydp_keras3.py::test_saving_flushes_first_and_stores_the_flushed_table",),
        "9 s; the other three ways to save (model.save, both save_weights) stay"),
    "tests/test_xla_trainers.py::test_the_dual_encoder_trainer_compiles_on_fixed_shapes[lazydp]": Moved(
        ("tests/test_xla_trainers.py::test_the_dual_encoder_trainer_compiles_on_fixed_shapes[dpsgd]",
         "tests/test_xla_trainers.py::test_trainer_with_jit_and_static_batch_equals_fit_and_charges_alike"),
        "9 s; the dual encoder compiles with DP-SGD, LazyDP compiles in the pCTR trainer"),
    "tests/test_tpu_trainers.py::test_pctr_trains_on_the_emulator": Moved(
        ("tests/test_tpu_trainers.py::test_dual_encoder_trains_on_the_emulator",
         "tests/test_tpu_equivalence.py::test_emulator_equals_keras_path"),
        "6-27 s per mechanism (each traces the 26-table model); a trainer runs on the emulator (the dual "
        "encoder's), whose steps equal the Keras path's for every mechanism"),
    "tests/test_dual_encoder.py::test_trainer_in_batch_reports_no_epsilon_and_lazydp_defaults_to_sampled": Moved(
        ("tests/test_dual_encoder.py::test_in_batch_run_is_recorded_not_private_and_refuses_a_budget",
         "tests/test_sensitivity_negatives.py::test_in_batch_negatives_exceed_c"),
        "9 s; the in-batch run's not-private record and its unbounded sensitivity stay fast"),
    # -- third cut (stop 42: the fresh-clone fast tier took 14.3 min on a slow day) -------------------
    "tests/test_run_checkpoint.py::test_fit_and_the_trainer_write_one_format": Moved(
        ("tests/test_run_checkpoint.py::test_a_resumed_fit_continues_the_saved_ledger",
         "tests/test_run_checkpoint.py::test_fits_state_file_holds_the_ledger_once",
         "tests/test_train_pctr_resume.py::test_resume_continues_steps_epsilon_and_weights_exactly"),
        "a fit and a trainer run (17 s); fit's file is read as the format (its record, the ledger once) and the "
        "trainer's resume reads the same format"),
    # -- once marked slow (run by neither tier before: now by make test-all) ---------------------
    "tests/test_tpu_trainers.py::test_emulator_run_equals_keras_run": Moved(
        ("tests/test_tpu_equivalence.py::test_emulator_equals_keras_path",
         "tests/test_tpu_static_batch.py::test_emulator_on_padded_batches_equals_keras_path_on_the_batches",
         "tests/test_tpu_lookahead.py::test_lookahead_equals_read_time_catch_up"),
        "36-38 s per mechanism (two 26-table traces); the emulator's steps equal the Keras path's on small models, "
        "LazyDP's look-ahead included"),
    "tests/test_accounting.py::test_docstring_examples": Moved(
        ("tests/test_accounting.py::test_calibrate_round_trip",
         "tests/test_accounting.py::test_ledger_json_round_trip",
         "tests/test_accounting.py::test_cli_calibrates_in_process"),
        "8 s of doctests of every accounting module; what the examples show (calibration, ledgers, the CLI) is "
        "pinned by the unit tests"),
    "tests/test_accounting_calibration.py::test_pinned_references_are_the_bisection": Moved(
        ("tests/test_accounting_calibration.py::test_sigma_meets_the_target_with_the_ledgers_function_close_to_the_reference",
         "tests/test_accounting_calibration.py::test_root_search_on_a_power_law"),
        "about 12 ledger evaluations per setting (24 s in all); the calibrated σ meets the target close to the "
        "pinned references"),
    "tests/test_user_level_experiments.py::test_step_time_smoke_lines": Moved(
        ("tests/test_user_level_experiments.py::test_step_time_summary_takes_the_median_of_same_round_ratios",
         "tests/test_user_level_experiments.py::test_step_time_model_size_flags_and_their_validation"),
        "six short trainer runs (100 s); the summary and the flags are pinned by unit tests"),
}


def full_only(nodeid: str) -> bool:
    """True iff the test `nodeid` runs in ``make test-all`` only."""
    return nodeid in FULL_ONLY or nodeid.split("[", 1)[0] in FULL_ONLY


def markdown_table() -> str:
    """The table of docs/TESTING.md: each full-tier test, why it moved, and the fast tests that cover it."""
    rows = ["| test (make test-all only) | why | proved in make test by |", "|---|---|---|"]
    for nodeid, moved in FULL_ONLY.items():
        covers = "<br>".join(f"`{c}`" for c in moved.covered_by)
        rows.append(f"| `{nodeid}` | {moved.why} | {covers} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
