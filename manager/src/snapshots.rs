//! Volume snapshots: what to do about a volume's Snapshot objects, given
//! what its running engine holds. A pure function of both; the controller
//! applies the actions through the engine.
//!
//! - An object not deleted and not on the engine → take it.
//! - An object on the engine but not ready → mark it ready (time, size).
//! - An object being deleted that the engine holds → delete it there.
//! - An object being deleted that the engine does not hold → release it
//!   (drop the finalizer; the object goes).
//!
//! Engine snapshots no object names (the engine's own rebuild snapshots,
//! those taken with the engine's CLI) are left alone.

use std::collections::BTreeMap;

/// One Snapshot object as the decision sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub name: String,
    pub deleting: bool,
    pub ready: bool,
}

/// What the engine holds: snapshot name → (created, Unix ms; size, bytes).
pub type Held = BTreeMap<String, (u64, u64)>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Take(String),
    MarkReady { name: String, created_unix_ms: u64, size: u64 },
    Delete(String),
    Release(String),
}

pub fn decide(objects: &[Object], held: &Held) -> Vec<Action> {
    let mut actions = Vec::new();
    for o in objects {
        let on_engine = held.get(&o.name);
        match (o.deleting, on_engine) {
            (false, None) => actions.push(Action::Take(o.name.clone())),
            (false, Some(&(created_unix_ms, size))) if !o.ready => {
                actions.push(Action::MarkReady { name: o.name.clone(), created_unix_ms, size })
            }
            (false, Some(_)) => {}
            (true, Some(_)) => actions.push(Action::Delete(o.name.clone())),
            (true, None) => actions.push(Action::Release(o.name.clone())),
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, deleting: bool, ready: bool) -> Object {
        Object { name: name.into(), deleting, ready }
    }

    #[test]
    fn each_object_gets_what_it_lacks_and_engine_only_snapshots_are_left_alone() {
        let held: Held =
            [("s-ready".to_string(), (5, 64)), ("s-new-on-engine".into(), (7, 64)), ("cli".into(), (1, 64))]
                .into_iter()
                .collect();
        let objects = [
            object("s-missing", false, false),
            object("s-new-on-engine", false, false),
            object("s-ready", false, true),
            object("s-gone", true, true),
        ];
        assert_eq!(
            decide(&objects, &held),
            vec![
                Action::Take("s-missing".into()),
                Action::MarkReady { name: "s-new-on-engine".into(), created_unix_ms: 7, size: 64 },
                Action::Release("s-gone".into()),
            ]
        );
        let deleting = [object("s-ready", true, true)];
        assert_eq!(decide(&deleting, &held), vec![Action::Delete("s-ready".into())]);
    }
}
