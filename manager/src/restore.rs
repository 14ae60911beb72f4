//! Filling a new volume from a source before its first attach, as a pure
//! decision over what a pass sees. A volume made from a snapshot
//! (`snapshot://NAME`) is copied from that snapshot on a replica of its
//! volume; one made from another volume (`volume://NAME`) first has a
//! snapshot of the source taken (`<volume>-clone`: by the source's engine,
//! so the copy is the source at one point of its write stream, or on its
//! replicas while it is detached), copied the
//! same way, and deleted once the copy is done. The volume is not attached
//! before its copy is done.

/// Where a new volume's data comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Snapshot(String),
    Volume(String),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("dataSource {0:?}: use snapshot://NAME or volume://NAME")]
pub struct BadSource(pub String);

impl Source {
    /// "" → None.
    pub fn parse(text: &str) -> Result<Option<Source>, BadSource> {
        if text.is_empty() {
            return Ok(None);
        }
        let (kind, name) = text.split_once("://").ok_or_else(|| BadSource(text.into()))?;
        if name.is_empty() || name.contains('/') {
            return Err(BadSource(text.into()));
        }
        match kind {
            "snapshot" => Ok(Some(Source::Snapshot(name.into()))),
            "volume" => Ok(Some(Source::Volume(name.into()))),
            _ => Err(BadSource(text.into())),
        }
    }
}

/// The snapshot a clone of `volume` is copied from.
pub fn clone_snapshot_name(volume: &str) -> String {
    format!("{volume}-clone")
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotView {
    pub volume: String,
    pub ready: bool,
    /// The volume's size when it was taken.
    pub size: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub volume: String,
    pub source: Source,
    /// The restore is recorded as done.
    pub done: bool,
    /// A copy task runs for this volume in this manager.
    pub copying: bool,
    /// The snapshot the copy reads (by the name `snapshot_to_read`), if it exists.
    pub snapshot: Option<SnapshotView>,
    /// Running replicas of the snapshot's volume (data addresses).
    pub source_replicas: Vec<String>,
    /// This volume's replicas: (data address if running). All must run.
    pub targets: Vec<Option<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Waiting, and why (for status).
    Wait(String),
    /// Ask the source volume's engine for the clone snapshot.
    TakeCloneSnapshot {
        name: String,
        of: String,
    },
    Copy {
        source: String,
        snapshot: String,
        targets: Vec<String>,
        bytes: u64,
    },
    /// The copy is done; a clone's snapshot goes.
    DeleteCloneSnapshot {
        name: String,
    },
    Failed(String),
}

/// The snapshot a volume's copy reads.
pub fn snapshot_to_read(volume: &str, source: &Source) -> String {
    match source {
        Source::Snapshot(name) => name.clone(),
        Source::Volume(_) => clone_snapshot_name(volume),
    }
}

pub fn decide(view: &View) -> Step {
    let snapshot_name = snapshot_to_read(&view.volume, &view.source);
    if view.done {
        return match (&view.source, &view.snapshot) {
            (Source::Volume(_), Some(_)) => Step::DeleteCloneSnapshot { name: snapshot_name },
            _ => Step::Nothing,
        };
    }
    if view.copying {
        return Step::Nothing;
    }
    let snapshot = match (&view.snapshot, &view.source) {
        (Some(s), Source::Volume(of)) if s.volume != *of => {
            return Step::Failed(format!("snapshot {snapshot_name} exists but is of volume {}, not {of}", s.volume));
        }
        (Some(s), _) => s,
        (None, Source::Volume(of)) => return Step::TakeCloneSnapshot { name: snapshot_name, of: of.clone() },
        (None, Source::Snapshot(name)) => return Step::Failed(format!("snapshot {name} does not exist")),
    };
    if !snapshot.ready {
        return Step::Wait(format!("waiting for snapshot {snapshot_name} of volume {} to be taken", snapshot.volume));
    }
    let Some(source) = view.source_replicas.first() else {
        return Step::Wait(format!("waiting for a running replica of volume {}", snapshot.volume));
    };
    let targets: Vec<String> = view.targets.iter().flatten().cloned().collect();
    if targets.is_empty() || targets.len() != view.targets.len() {
        return Step::Wait("waiting for every replica of this volume to run".into());
    }
    Step::Copy { source: source.clone(), snapshot: snapshot_name, targets, bytes: snapshot.size }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(source: Source) -> View {
        View {
            volume: "new".into(),
            source,
            done: false,
            copying: false,
            snapshot: None,
            source_replicas: vec!["s:1".into()],
            targets: vec![Some("t:1".into()), Some("t:2".into())],
        }
    }

    #[test]
    fn sources_parse_and_bad_ones_are_refused() {
        assert_eq!(Source::parse("").unwrap(), None);
        assert_eq!(Source::parse("snapshot://s1").unwrap(), Some(Source::Snapshot("s1".into())));
        assert_eq!(Source::parse("volume://v1").unwrap(), Some(Source::Volume("v1".into())));
        for bad in ["s1", "backup://b", "snapshot://", "volume://a/b"] {
            assert!(Source::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_restore_copies_a_ready_snapshot_once_every_replica_runs() {
        let mut v = view(Source::Snapshot("s1".into()));
        assert!(matches!(decide(&v), Step::Failed(_)), "no such snapshot");
        v.snapshot = Some(SnapshotView { volume: "src".into(), ready: false, size: 64 });
        assert!(matches!(decide(&v), Step::Wait(_)));
        v.snapshot = Some(SnapshotView { volume: "src".into(), ready: true, size: 64 });
        v.targets[1] = None;
        assert!(matches!(decide(&v), Step::Wait(_)), "a replica is not running");
        v.targets[1] = Some("t:2".into());
        assert_eq!(
            decide(&v),
            Step::Copy {
                source: "s:1".into(),
                snapshot: "s1".into(),
                targets: vec!["t:1".into(), "t:2".into()],
                bytes: 64
            }
        );
        v.copying = true;
        assert_eq!(decide(&v), Step::Nothing, "one copy at a time");
        v.done = true;
        assert_eq!(decide(&v), Step::Nothing, "a restore keeps the user's snapshot");
    }

    #[test]
    fn a_clone_takes_its_own_snapshot_copies_it_and_deletes_it() {
        let mut v = view(Source::Volume("src".into()));
        assert_eq!(decide(&v), Step::TakeCloneSnapshot { name: "new-clone".into(), of: "src".into() });
        v.snapshot = Some(SnapshotView { volume: "other".into(), ready: true, size: 64 });
        assert!(matches!(decide(&v), Step::Failed(_)), "a same-named snapshot of another volume is not used");
        v.snapshot = Some(SnapshotView { volume: "src".into(), ready: true, size: 64 });
        assert!(matches!(decide(&v), Step::Copy { .. }));
        v.source_replicas.clear();
        assert!(matches!(decide(&v), Step::Wait(_)));
        v.done = true;
        assert_eq!(decide(&v), Step::DeleteCloneSnapshot { name: "new-clone".into() });
        v.snapshot = None;
        assert_eq!(decide(&v), Step::Nothing);
    }
}
