//! Growing a volume to its spec size, as a pure decision over what a pass
//! sees. An attached volume grows through its engine (which grows every
//! replica it serves, then its frontends); a detached one has each running
//! replica grown directly; a replica that is not running has only its
//! object's size raised, and its store grows when it next starts (the
//! replica's `--grow`). Nothing ever shrinks.

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineView {
    /// No engine (detached).
    Absent,
    /// Starting or stopping: wait for it to settle.
    Busy,
    Running {
        address: String,
        size: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaView {
    pub name: String,
    /// The size the replica object records for its store.
    pub size: u64,
    /// The replica's data address when its process runs.
    pub address: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub volume_size: u64,
    /// The epoch of the volume's last engine (0: never attached): what a
    /// replica grown directly is told, equal to its highest.
    pub epoch: u64,
    pub engine: EngineView,
    pub replicas: Vec<ReplicaView>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Grow through the engine; on success its object and every replica
    /// object record `size`.
    ExpandEngine { address: String, size: u64 },
    /// Grow a running replica of a detached volume; on success its object
    /// records `size`.
    ExpandReplica { name: String, address: String, size: u64, epoch: u64 },
    /// Record the size on a replica object whose store grows at next start
    /// (or already has).
    RecordReplicaSize { name: String, size: u64 },
}

/// Bytes per block: sizes are whole blocks.
pub const BLOCK: u64 = 4096;

pub fn decide(view: &View) -> Vec<Action> {
    let size = view.volume_size;
    // Sizes are whole blocks (the API and the CRD's schema refuse others;
    // an object written past them is left alone rather than half-grown).
    if size % BLOCK != 0 {
        return Vec::new();
    }
    let behind: Vec<&ReplicaView> = view.replicas.iter().filter(|r| r.size < size).collect();
    match &view.engine {
        EngineView::Busy => Vec::new(),
        EngineView::Running { address, size: engine_size } if *engine_size < size => {
            vec![Action::ExpandEngine { address: address.clone(), size }]
        }
        // The engine has the size: the objects catch up (its replicas grew
        // with it; the others grow when they next start).
        EngineView::Running { .. } => {
            behind.iter().map(|r| Action::RecordReplicaSize { name: r.name.clone(), size }).collect()
        }
        EngineView::Absent => behind
            .iter()
            .map(|r| match &r.address {
                Some(address) => {
                    Action::ExpandReplica { name: r.name.clone(), address: address.clone(), size, epoch: view.epoch }
                }
                None => Action::RecordReplicaSize { name: r.name.clone(), size },
            })
            .collect(),
    }
}

/// The size the volume's data has now: the running engine's, or else the
/// smallest replica's.
pub fn current_size(view: &View) -> u64 {
    match &view.engine {
        EngineView::Running { size, .. } => *size,
        _ => view.replicas.iter().map(|r| r.size).min().unwrap_or(view.volume_size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = BLOCK;

    fn replica(name: &str, size: u64, running: bool) -> ReplicaView {
        ReplicaView { name: name.into(), size, address: running.then(|| format!("{name}:1")) }
    }

    #[test]
    fn an_attached_volume_grows_through_its_engine_then_the_objects_catch_up() {
        let mut view = View {
            volume_size: 200 * B,
            epoch: 3,
            engine: EngineView::Running { address: "e:1".into(), size: 100 * B },
            replicas: vec![replica("a", 100 * B, true), replica("b", 100 * B, false)],
        };
        assert_eq!(decide(&view), vec![Action::ExpandEngine { address: "e:1".into(), size: 200 * B }]);
        assert_eq!(current_size(&view), 100 * B);
        view.engine = EngineView::Running { address: "e:1".into(), size: 200 * B };
        assert_eq!(
            decide(&view),
            vec![
                Action::RecordReplicaSize { name: "a".into(), size: 200 * B },
                Action::RecordReplicaSize { name: "b".into(), size: 200 * B }
            ]
        );
        view.replicas.iter_mut().for_each(|r| r.size = 200 * B);
        assert!(decide(&view).is_empty());
        assert_eq!(current_size(&view), 200 * B);
    }

    #[test]
    fn a_detached_volume_grows_running_replicas_directly_and_records_the_rest() {
        let view = View {
            volume_size: 200 * B,
            epoch: 3,
            engine: EngineView::Absent,
            replicas: vec![replica("a", 100 * B, true), replica("b", 100 * B, false), replica("c", 200 * B, true)],
        };
        assert_eq!(
            decide(&view),
            vec![
                Action::ExpandReplica { name: "a".into(), address: "a:1".into(), size: 200 * B, epoch: 3 },
                Action::RecordReplicaSize { name: "b".into(), size: 200 * B },
            ]
        );
        assert_eq!(current_size(&view), 100 * B);
    }

    #[test]
    fn a_size_of_no_whole_blocks_is_left_alone() {
        let view = View {
            volume_size: 200 * B + 512,
            epoch: 3,
            engine: EngineView::Running { address: "e:1".into(), size: 100 * B },
            replicas: vec![replica("a", 100 * B, true)],
        };
        assert!(decide(&view).is_empty());
    }

    #[test]
    fn nothing_happens_while_the_engine_settles_or_when_nothing_is_behind() {
        let view = View {
            volume_size: 200 * B,
            epoch: 1,
            engine: EngineView::Busy,
            replicas: vec![replica("a", 100 * B, true)],
        };
        assert!(decide(&view).is_empty());
        let view = View { engine: EngineView::Absent, volume_size: 100 * B, ..view };
        assert!(decide(&view).is_empty());
        assert_eq!(current_size(&view), 100 * B);
    }
}
