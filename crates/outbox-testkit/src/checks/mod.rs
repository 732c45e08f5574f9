//! The conformance checks. Each is a plain `pub async fn(&H)` that opens
//! fresh stores through the [`Harness`](crate::Harness) and panics with a
//! message naming the contract bullet it checks when the adapter breaks it.
//!
//! The list in [`for_each_check!`](crate::for_each_check) is the single place
//! that names them; [`conformance_tests!`](crate::conformance_tests) expands it.
//! A check missing from it would silently never run, so `cargo xtask tidy`
//! fails when a `pub async fn` here whose signature names `Harness` is not
//! listed, when a listed name is no such function, or when a name is listed
//! twice. (Helpers shared by the checks are `pub(crate)`.)

mod admin;
mod end_to_end;
mod generations;
mod journal;
mod lease;
mod outbox;
mod partitions;
mod projection;
mod registry;
mod runs;
mod sinks;
mod support;
mod view;
mod watermark;

pub use admin::*;
pub use end_to_end::*;
pub use generations::*;
pub use journal::*;
pub use lease::*;
pub use outbox::*;
pub use partitions::*;
pub use projection::*;
pub use registry::*;
pub use runs::*;
pub use sinks::*;
pub use view::*;
pub use watermark::*;

/// Calls `$m!($arg; check_a, check_b, ...)` with every check's name.
#[doc(hidden)]
#[macro_export]
macro_rules! for_each_check {
    ($m:path, $arg:expr) => {
        $m!($arg;
            append_assigns_contiguous_seqs,
            append_enqueues_one_pending_row_per_event,
            append_without_enqueue_writes_no_rows,
            append_rejects_empty_batch,
            append_rejects_request_without_events,
            append_rejects_oversized_payload,
            append_rejects_too_many_events,
            append_conflict_no_stream_on_existing,
            append_conflict_exact_wrong_version,
            append_expected_versions_that_match,
            append_batch_is_all_or_nothing,
            concurrent_appends_succeed_or_conflict_one_by_one,
            append_batch_requests_see_each_other,
            append_seqs_stay_contiguous_after_failures,
            append_global_positions_increase,
            append_stamps_recorded_at_with_store_clock,
            load_returns_event_as_appended,
            load_unknown_is_not_found,
            corrupt_payload_is_reported,
            read_stream_honours_from_and_limit,
            read_stream_past_end_is_empty,
            read_runs_reads_each_range_in_order,
            read_global_pages_in_global_position_order,
            stream_head_tracks_last_seq,
            stream_heads_pages_by_stream_id,
            due_streams_returns_due_heads_oldest_first,
            due_streams_honours_limit,
            due_streams_excludes_not_yet_due_failed_head,
            due_streams_excludes_dead_head,
            due_streams_excludes_leased_stream_until_expiry,
            stale_processing_row_is_due_again,
            claim_with_stale_epoch_is_lease_lost,
            claim_with_other_owner_is_lease_lost,
            claim_with_expired_lease_is_lease_lost,
            claim_with_released_lease_is_lease_lost,
            claim_returns_contiguous_head_run_up_to_max,
            claim_is_empty_when_head_dead,
            claim_is_empty_when_head_not_due,
            claim_is_empty_without_rows,
            claim_after_takeover_reclaims_processing_rows,
            unfinished_claims_add_up_to_attempts,
            begin_attempt_marks_only_a_row_applied_alone_under_the_current_lease,
            concurrent_claimers_exactly_one_wins,
            failed_head_blocks_its_stream_only,
            dead_head_blocks_its_stream_only,
            fail_records_attempt_error_and_delay,
            fail_truncates_long_errors,
            fail_follows_default_schedule_and_dies_at_8,
            fail_follows_custom_schedule_and_dies_at_3,
            fail_delay_is_capped,
            fail_requires_current_lease,
            fail_needs_a_processing_row,
            fail_at_the_threshold_parks_at_once,
            finish_abandons_processing_rows_and_frees_the_stream,
            finish_under_a_lost_lease_abandons_nothing,
            complete_deletes_rows_whatever_status,
            complete_is_idempotent_and_needs_no_lease,
            complete_makes_next_head_due,
            complete_and_claim_completes_then_claims_the_next_run,
            complete_and_claim_with_a_lost_lease_completes_and_claims_nothing,
            acquire_and_claim_takes_the_lease_and_the_head_run,
            complete_and_release_completes_abandons_and_frees_the_stream,
            take_due_takes_oldest_due_streams_within_the_limits,
            take_due_reads_the_runs_events_as_read_runs_does,
            take_due_skips_held_dead_and_not_due_streams,
            take_due_with_nothing_due_or_bad_limits_takes_nothing,
            take_due_reclaims_an_unfinished_head_alone,
            sweeps_take_suspects_by_themselves_and_charge_none,
            enqueue_catch_up_puts_a_row_at_a_last_event_without_one,
            finish_ends_several_passes,
            finish_moves_the_heads_of_completed_streams,
            requeue_revives_dead_row,
            first_failure_is_kept_through_retries_and_cleared_by_requeue,
            requeue_of_live_row_is_invalid_state,
            requeue_of_missing_row_is_not_found,
            requeue_dead_oldest_first_with_limit,
            requeue_dead_breaks_ties_by_stream_and_seq,
            retry_makes_failed_row_due_now,
            retry_of_pending_row_keeps_an_earlier_due_time,
            retry_of_dead_or_processing_row_is_invalid_state,
            retry_of_missing_row_is_not_found,
            leases_lists_held_leases_by_stream_and_pages,
            break_lease_frees_and_keeps_the_epoch,
            break_lease_of_expired_lease,
            break_lease_of_free_stream_is_none,
            break_lease_makes_processing_rows_due_again,
            summary_counts_by_status,
            summary_names_oldest_retry_eligible_row,
            summary_oldest_applicable_skips_what_failures_hold_back,
            list_filters_orders_and_limits,
            row_returns_none_when_missing,
            sink_checkpoint_advances_by_compare_and_set,
            hold_sink_marks_only_an_ok_stream,
            skip_records_commit_with_their_apply_and_reapply_takes_them_once,
            consumers_register_list_and_retire,
            sink_failures_back_off_dead_letter_and_requeue,
            sink_cursors_advance_by_compare_and_set,
            advance_sink_with_more_keeps_the_stream_due,
            advance_sink_makes_a_failed_stream_ok_only_at_its_end,
            read_feed_sees_an_event_that_commits_after_a_later_one_was_read,
            read_feed_loses_nothing_to_many_late_commits,
            partition_sync_acquires_renews_and_releases,
            partition_held_by_another_waits_for_release_or_expiry,
            partition_sync_rejects_unknown_partitions,
            partitioned_claim_takes_only_held_partitions,
            partitioned_claim_and_load_takes_what_the_claim_takes_with_the_runs_events,
            partitioned_claim_takes_the_oldest_due_streams_of_held_partitions,
            partitioned_claim_is_fenced_by_the_partition_epoch,
            partitioned_pass_ends_without_releasing_the_partition,
            partitioned_plain_end_lets_the_rest_be_claimed_at_once,
            stream_and_partition_leases_exclude_each_other,
            partitions_report_rows_per_partition,
            lease_first_acquire_has_epoch_1,
            lease_of_unknown_stream_is_none,
            lease_acquire_refused_while_other_owner_holds_it,
            lease_same_owner_reacquire_keeps_epoch,
            lease_takeover_after_expiry_bumps_epoch,
            lease_takeover_after_release_bumps_epoch,
            lease_reacquire_after_release_bumps_epoch,
            lease_reacquire_after_expiry_bumps_epoch,
            lease_renew_extends_held_lease,
            lease_renew_of_expired_is_lease_lost,
            lease_renew_of_other_or_stale_is_lease_lost,
            lease_release_reports_whether_it_freed,
            lease_release_of_lost_lease_is_not_an_error,
            lease_epochs_never_decrease,
            lease_ttl_out_of_range_is_invalid_input,
            lease_concurrent_acquire_exactly_one_wins,
            apply_is_exactly_once,
            apply_partial_overlap_applies_only_tail,
            apply_gap_writes_nothing,
            apply_audit_only_advances_checkpoint,
            apply_failure_rolls_back_everything,
            apply_two_projections_with_different_checkpoints,
            apply_is_one_transaction_across_projections,
            apply_rejects_bad_runs,
            apply_runs_applies_runs_of_several_streams,
            apply_runs_failure_commits_nothing_for_any_stream,
            apply_runs_gap_stops_and_commits_nothing,
            apply_runs_rejects_two_runs_of_one_stream_and_bad_runs,
            checkpoint_is_per_projection_and_stream,
            reset_clears_projection_and_checkpoints,
            digest_tracks_state,
            digest_covers_checkpoints,
            setup_is_idempotent,
            view_put_then_get_round_trips_a_document,
            view_put_replaces_and_delete_reports_existence,
            view_scan_is_bytewise_ordered_and_pages,
            view_documents_are_namespaced_by_projection_and_table,
            view_tx_reads_its_own_uncommitted_writes,
            view_long_runs_commit_the_last_write_of_each_key,
            view_failed_apply_rolls_back_documents_and_checkpoint,
            view_reset_clears_documents_of_one_projection,
            view_digest_tracks_documents_not_write_order,
            view_invalid_names_keys_and_documents_write_nothing,
            view_digest_pages_through_every_table,
            view_running_digest_follows_puts_overwrites_deletes_and_clear,
            view_running_digest_rolls_back_with_a_failed_apply,
            view_running_digest_equals_a_scan_after_randomized_histories,
            view_running_digest_stays_exact_under_concurrent_applies,
            generation_swap_moves_readers_and_appliers_together,
            apply_resolved_before_a_swap_cannot_commit_to_the_old_generation,
            begin_generation_resumes_its_version_and_refuses_another,
            agreeing_swap_compares_checkpoints_and_running_digests,
            watermark_is_none_for_unsaved_stream,
            watermark_never_decreases,
            watermark_is_raised_by_apply,
            watermarks_page_by_stream_id,
            registry_heartbeat_inserts_worker,
            registry_heartbeat_refresh_keeps_started_at,
            registry_heartbeat_refuses_a_second_live_holder,
            registry_expired_workers_are_not_listed,
            registry_deregister_returns_whether_it_existed,
            registry_prune_deletes_only_long_expired,
            registry_ttl_out_of_range_is_invalid_input,
            registry_workers_ordered_by_id,
            registry_activity_sums_workers_per_minute,
            registry_activity_window_and_range,
            registry_prune_deletes_old_activity,
            drain_loop_applies_every_event_exactly_once,
            poison_event_dead_letters_then_requeue_applies_once,
            requeued_row_that_fails_again_is_parked_again,
            zombie_worker_commit_is_harmless,
            crash_between_apply_and_complete_is_recovered,
            concurrent_applies_commit_exactly_once,
            two_concurrent_workers_apply_exactly_once,
            worker_and_rebuild_digests_match,
            runs_admit_records_a_queued_run,
            runs_one_active_run_per_projection,
            runs_expired_claim_is_abandoned,
            runs_a_gone_owners_run_is_reclaimed,
            runs_refused_admissions_consume_no_ids,
            runs_update_records_progress_for_the_owner_only,
            runs_bounded_admission_records_since_and_refuses_bad_bounds,
            runs_progress_records_the_cursor_position,
            runs_finish_records_the_outcome,
            runs_finish_records_a_message_with_nul,
            runs_cancel_semantics,
            runs_listing_and_validation,
            runs_prune_deletes_only_long_finished,
        );
    };
}
