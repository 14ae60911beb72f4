//! What `ironhorn volume get NAME --watch` (and `volume attach`) show while
//! a volume changes: its state, robustness, replicas in RW and each running
//! rebuild's progress, from its Volume and Engine objects. Pure: the CLI
//! fetches the objects, asks for a [`View`] and prints it as a line (not a
//! terminal) or as bars (a terminal).

use std::fmt;

use ironhorn_proto::units::format_size;
use kube::ResourceExt;

use crate::crd::{Engine, Volume};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rebuild {
    pub replica: String,
    pub method: String,
    pub percent: u32,
    /// Work done of `total` bytes (see `RebuildProgress::done_bytes`).
    pub done: u64,
    pub total: u64,
    /// Bytes copied per second since it started.
    pub rate: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub name: String,
    pub state: String,
    pub robustness: String,
    /// Replicas the engine reports read-write, of `wanted`.
    pub rw: usize,
    pub wanted: u32,
    /// Running rebuilds, by replica name.
    pub rebuilds: Vec<Rebuild>,
}

/// The volume as seen at `now` (its engine only counts while it serves it).
pub fn view(volume: &Volume, engine: Option<&Engine>, now: jiff::Timestamp) -> View {
    let status = volume.status.clone().unwrap_or_default();
    let engine_status = engine.filter(|e| e.spec.volume_name == volume.name_any()).and_then(|e| e.status.as_ref());
    let serving = status.state == "attached";
    let (rw, rebuilds) = match engine_status {
        Some(es) if serving => {
            let rw = es.replica_mode_map.values().filter(|m| *m == "RW").count();
            let rebuilds = es
                .rebuild_progress
                .iter()
                .filter(|(_, p)| p.state == "running")
                .map(|(replica, p)| Rebuild {
                    replica: replica.clone(),
                    method: p.method.clone(),
                    percent: p.percent(),
                    done: p.done_bytes(),
                    total: p.total_bytes,
                    rate: p.rate(now),
                })
                .collect();
            (rw, rebuilds)
        }
        _ => (0, Vec::new()),
    };
    View {
        name: volume.name_any(),
        state: status.state,
        robustness: status.robustness,
        rw,
        wanted: volume.spec.number_of_replicas,
        rebuilds,
    }
}

impl View {
    /// The view's state and robustness, without the rebuilds.
    pub fn summary(&self) -> String {
        let mut line = format!("{} {}", self.name, or_dash(&self.state));
        if !self.robustness.is_empty() {
            line += &format!(" {}", self.robustness);
        }
        if self.state == "attached" {
            line += &format!(", {}/{} replicas RW", self.rw, self.wanted);
        }
        line
    }

    /// Whether a further change is expected without anyone acting: a
    /// rebuild runs or the volume is between states.
    pub fn settled(&self) -> bool {
        self.rebuilds.is_empty()
            && matches!(self.state.as_str(), "attached" | "detached")
            && self.robustness != "degraded"
    }
}

impl fmt::Display for Rebuild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rebuilding {}: {}% ({}, {} of {}, {}/s)",
            self.replica,
            self.percent,
            self.method,
            format_size(self.done),
            format_size(self.total),
            format_size(self.rate)
        )
    }
}

/// One line: the summary and each running rebuild.
impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.summary())?;
        for r in &self.rebuilds {
            write!(f, "; {r}")?;
        }
        Ok(())
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{EngineSpec, EngineStatus, RebuildProgress, VolumeSpec, VolumeStatus};

    fn volume(state: &str, robustness: &str) -> Volume {
        let mut v = Volume::new("v1", VolumeSpec { number_of_replicas: 3, ..Default::default() });
        v.status = Some(VolumeStatus { state: state.into(), robustness: robustness.into(), ..Default::default() });
        v
    }

    fn engine(modes: &[(&str, &str)], progress: &[(&str, RebuildProgress)]) -> Engine {
        let mut e = Engine::new("v1-e", EngineSpec { volume_name: "v1".into(), ..Default::default() });
        e.status = Some(EngineStatus {
            replica_mode_map: modes.iter().map(|(r, m)| (r.to_string(), m.to_string())).collect(),
            rebuild_progress: progress.iter().map(|(r, p)| (r.to_string(), p.clone())).collect(),
            ..Default::default()
        });
        e
    }

    #[test]
    fn a_running_rebuild_shows_its_percent_bytes_and_rate() {
        let p = RebuildProgress {
            state: "running".into(),
            method: "dirty-map".into(),
            copied_bytes: 64 << 20,
            total_bytes: 256 << 20,
            started_at: "2026-12-05T10:00:00Z".into(),
            ..Default::default()
        };
        let done = RebuildProgress { state: "done".into(), ..p.clone() };
        let e = engine(&[("r-a", "RW"), ("r-b", "RW"), ("r-c", "WO")], &[("r-c", p), ("r-a", done)]);
        let now: jiff::Timestamp = "2026-12-05T10:00:04Z".parse().unwrap();
        let v = view(&volume("attached", "degraded"), Some(&e), now);
        assert_eq!(v.rw, 2);
        assert_eq!(v.rebuilds.len(), 1, "only the running one: {v:?}");
        assert_eq!(
            v.to_string(),
            "v1 attached degraded, 2/3 replicas RW; rebuilding r-c: 25% (dirty-map, 64MiB of 256MiB, 16MiB/s)"
        );
        assert!(!v.settled());
    }

    #[test]
    fn checksum_rebuilds_count_what_they_compared() {
        let p = RebuildProgress {
            state: "running".into(),
            method: "checksums".into(),
            compared_bytes: 3 << 20,
            copied_bytes: 1 << 20,
            total_bytes: 4 << 20,
            ..Default::default()
        };
        assert_eq!(p.percent(), 75);
        assert_eq!(p.done_bytes(), 3 << 20);
        assert_eq!(p.rate(jiff::Timestamp::now()), 0, "no start time, no rate");
    }

    #[test]
    fn healthy_and_detached_volumes_are_settled_and_show_no_engine_figures() {
        let e = engine(&[("r-a", "RW"), ("r-b", "RW"), ("r-c", "RW")], &[]);
        let v = view(&volume("attached", "healthy"), Some(&e), jiff::Timestamp::now());
        assert_eq!(v.to_string(), "v1 attached healthy, 3/3 replicas RW");
        assert!(v.settled());
        let v = view(&volume("detached", "unknown"), Some(&e), jiff::Timestamp::now());
        assert_eq!(v.to_string(), "v1 detached unknown");
        assert!(v.settled());
        let v = view(&volume("attaching", ""), None, jiff::Timestamp::now());
        assert_eq!(v.to_string(), "v1 attaching");
        assert!(!v.settled());
    }
}
