//! A volume's bad blocks and scrubs: what the engine reports is copied into
//! the volume's status, with an event when the engine found (and repaired)
//! more bad blocks or a scrub ended; a scrub is started when the volume asks
//! for one or the schedule says it is due (`scrub::decide`).

use ironhorn_proto::engine::StatusResponse;

use super::*;
use crate::scrub::{self, Decision};

use super::unix_ms_text as at;

impl<D: Datastore, C: Cluster> Controller<D, C> {
    pub(super) async fn reconcile_scrub(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        engine_address: &str,
        report: &StatusResponse,
        healthy: bool,
    ) -> Outcome {
        let name = volume.name_any();
        let old = volume.status.clone().unwrap_or_default();
        let engine_scrub = report.scrub.clone().unwrap_or_default();
        if report.bad_blocks_found > old.bad_blocks_found {
            let found = report.bad_blocks_found - old.bad_blocks_found;
            let repaired = report.bad_blocks_repaired.saturating_sub(old.bad_blocks_repaired);
            let message = format!(
                "{found} block(s) read back failing their checksum on a replica; {repaired} repaired in place \
                 from a healthy replica"
            );
            events::record(&self.store, &name, Warning, "BadBlocksRepaired", &message).await;
        }
        // A scrub of this engine (an engine that ran none reports nothing,
        // and the volume keeps the last one it knew of).
        let mut scrub = old.scrub.clone();
        if !engine_scrub.state.is_empty() {
            scrub.state = engine_scrub.state.clone();
            scrub.checked_bytes = engine_scrub.checked_bytes;
            scrub.total_bytes = engine_scrub.total_bytes;
            scrub.bad_blocks = engine_scrub.bad_blocks;
            scrub.repaired_blocks = engine_scrub.repaired_blocks;
            scrub.started_at = at(engine_scrub.started_unix_ms);
            scrub.finished_at = at(engine_scrub.finished_unix_ms);
            scrub.error = engine_scrub.error.clone();
        }
        if !scrub.finished_at.is_empty() && scrub.finished_at != old.scrub.finished_at {
            let message = format!(
                "scrub {}: {} MiB read back, {} bad block(s) found, {} repaired{}",
                scrub.state,
                scrub.checked_bytes >> 20,
                scrub.bad_blocks,
                scrub.repaired_blocks,
                if scrub.error.is_empty() { String::new() } else { format!(" ({})", scrub.error) }
            );
            let kind = if scrub.state == "done" && scrub.bad_blocks == 0 { Normal } else { Warning };
            events::record(&self.store, &name, kind, "ScrubFinished", &message).await;
        }
        let decision = scrub::decide(&scrub::Input {
            requested: volume.spec.scrub_requested,
            answered: old.scrub.requested,
            running: engine_scrub.state == "running",
            healthy,
            last_started: &scrub.started_at,
            created: volume.metadata.creation_timestamp.as_ref().map(|t| t.0),
            interval_hours: snapshot.settings.u64("scrub-interval-hours"),
            now: jiff::Timestamp::now(),
        });
        if let Some(decision) = decision {
            match self.cluster.engine_scrub(engine_address).await {
                Ok(()) => {
                    let why = match decision {
                        Decision::Requested => "asked for",
                        Decision::Scheduled => "scheduled",
                    };
                    events::record(&self.store, &name, Normal, "ScrubStarted", &format!("scrub started ({why})")).await;
                    scrub = ScrubStatus {
                        state: "running".into(),
                        requested: volume.spec.scrub_requested,
                        started_at: now(),
                        ..Default::default()
                    };
                }
                Err(e) => tracing::warn!(volume = %name, error = %e, "could not start a scrub"),
            }
        }
        let (found, repaired) = (report.bad_blocks_found, report.bad_blocks_repaired);
        self.set_volume_status(&name, |s| {
            s.scrub = scrub.clone();
            s.bad_blocks_found = found;
            s.bad_blocks_repaired = repaired;
        })
        .await
    }
}
