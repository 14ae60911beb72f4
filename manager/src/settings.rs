//! Cluster settings: Longhorn's names where the meaning matches, each with a
//! default and a validator. Stored as Setting objects; an absent object means
//! the default.

use std::collections::HashMap;

use kube::ResourceExt;

use crate::crd::{Setting, SettingSpec};
use crate::datastore::{self, Datastore};

pub struct Definition {
    pub name: &'static str,
    pub default: &'static str,
    pub kind: Kind,
    pub description: &'static str,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bool,
    /// A non-negative integer.
    Int,
}

pub const DEFINITIONS: &[Definition] = &[
    Definition {
        name: "storage-over-provisioning-percentage",
        default: "100",
        kind: Kind::Int,
        description: "scheduled replica bytes on a disk may reach (maximum - reserved) times this percentage",
    },
    Definition {
        name: "storage-minimal-available-percentage",
        default: "25",
        kind: Kind::Int,
        description: "a disk takes a replica only if this percentage of its maximum stays available",
    },
    Definition {
        name: "replica-soft-anti-affinity",
        default: "false",
        kind: Kind::Bool,
        description: "allow replicas of one volume on the same node when no other node fits",
    },
    Definition {
        name: "replica-zone-soft-anti-affinity",
        default: "false",
        kind: Kind::Bool,
        description: "allow replicas of one volume in the same zone when no other zone fits",
    },
    Definition {
        name: "replica-disk-soft-anti-affinity",
        default: "false",
        kind: Kind::Bool,
        description: "allow replicas of one volume on the same disk when no other disk fits",
    },
    Definition {
        name: "default-replica-count",
        default: "3",
        kind: Kind::Int,
        description: "replicas of a volume created without --replicas",
    },
    Definition {
        name: "replica-replenishment-wait-interval",
        default: "600",
        kind: Kind::Int,
        description: "seconds a degraded volume waits for a failed replica to become reusable before a new one is created",
    },
    Definition {
        name: "concurrent-replica-rebuild-per-node-limit",
        default: "5",
        kind: Kind::Int,
        description: "rebuilds that may run at once with their target on one node (0 stops rebuilds)",
    },
    Definition {
        name: "replica-rebuild-retry-max",
        default: "5",
        kind: Kind::Int,
        description: "times one failed replica is reused before it is given up for a new one",
    },
    Definition {
        name: "replica-rebuild-backoff-initial",
        default: "60",
        kind: Kind::Int,
        description: "seconds before the second reuse of a failed replica; doubles per retry",
    },
    Definition {
        name: "replica-rebuild-backoff-max",
        default: "180",
        kind: Kind::Int,
        description: "longest wait, in seconds, between reuses of one failed replica",
    },
    Definition {
        name: "replica-rebuild-max-mib-per-sec",
        default: "0",
        kind: Kind::Int,
        description: "MiB/s a rebuild (and a scrub) may copy or read, so it does not starve the volume's own I/O \
                      (0: no limit; running engines take a change within a reconcile pass)",
    },
    Definition {
        name: "stale-replica-timeout",
        default: "172800",
        kind: Kind::Int,
        description: "seconds a failed, unreused replica is kept before it and its data are deleted \
                      (a volume's staleReplicaTimeout, in minutes, overrides it when set)",
    },
    Definition {
        name: "engine-replica-timeout",
        default: "8",
        kind: Kind::Int,
        description: "seconds a replica may take to answer the engine before it is marked ERR",
    },
    Definition {
        name: "default-write-majority",
        default: "false",
        kind: Kind::Bool,
        description: "engines of volumes whose writeQuorum is default refuse writes that fewer than a majority \
                      of their replicas acknowledged (false: one replica is enough)",
    },
    Definition {
        name: "scrub-interval-hours",
        default: "168",
        kind: Kind::Int,
        description: "hours between scheduled scrubs of an attached, healthy volume: every block of every replica \
                      read back and checked, bad ones repaired from a healthy replica (0: only on request)",
    },
    Definition {
        name: "node-heartbeat-timeout",
        default: "40",
        kind: Kind::Int,
        description: "seconds a registered node's heartbeat lease may go unrenewed before the node is not Ready \
                      (nodes without a heartbeat lease, as in `ironhorn up`, are judged by their instance manager)",
    },
];

pub fn definition(name: &str) -> Option<&'static Definition> {
    DEFINITIONS.iter().find(|d| d.name == name)
}

/// Checks a value for a known setting; returns it normalised.
pub fn validate(name: &str, value: &str) -> Result<String, String> {
    let def = definition(name).ok_or_else(|| format!("unknown setting {name:?}"))?;
    let value = value.trim();
    match def.kind {
        Kind::Bool => match value {
            "true" | "false" => Ok(value.to_string()),
            _ => Err(format!("setting {name}: {value:?} is not true or false")),
        },
        Kind::Int => value
            .parse::<u64>()
            .map(|v| v.to_string())
            .map_err(|_| format!("setting {name}: {value:?} is not a non-negative integer")),
    }
}

/// Every setting's value, read with one list: a reconcile pass reads them
/// once, not once per use (a GET each on Kubernetes).
#[derive(Clone, Debug, Default)]
pub struct Values(HashMap<String, String>);

impl Values {
    pub async fn load<D: Datastore>(store: &D) -> datastore::Result<Values> {
        let all: Vec<Setting> = store.list().await?;
        Ok(Values(all.into_iter().map(|s| (s.name_any(), s.spec.value)).collect()))
    }

    /// A defined setting's value, or its default when unset.
    pub fn get(&self, name: &str) -> &str {
        let def = definition(name).expect("settings are read by their defined names");
        self.0.get(name).map_or(def.default, String::as_str)
    }

    /// An integer setting; a stored value that does not parse (written
    /// around the validator) reads as the default.
    pub fn u64(&self, name: &str) -> u64 {
        self.get(name)
            .parse()
            .unwrap_or_else(|_| definition(name).expect("defined").default.parse().expect("default parses"))
    }

    pub fn bool(&self, name: &str) -> bool {
        self.get(name) == "true"
    }
}

/// Reads one setting's value, falling back to its default.
pub async fn get<D: Datastore>(store: &D, name: &str) -> datastore::Result<String> {
    let def = definition(name).expect("settings are read by their defined names");
    Ok(store.get::<Setting>(name).await?.map(|s| s.spec.value).unwrap_or_else(|| def.default.to_string()))
}

pub async fn get_u64<D: Datastore>(store: &D, name: &str) -> datastore::Result<u64> {
    let value = get(store, name).await?;
    Ok(Values(HashMap::from([(name.to_string(), value)])).u64(name))
}

/// Sets a setting (validated), creating its object when needed.
pub async fn set<D: Datastore>(store: &D, name: &str, value: &str) -> Result<String, String> {
    let value = validate(name, value)?;
    let v = value.clone();
    let updated = datastore::update::<Setting, D>(store, name, |s| {
        let changed = s.spec.value != v;
        s.spec.value = v.clone();
        changed
    })
    .await
    .map_err(|e| e.to_string())?;
    if updated.is_none() {
        store.create(&Setting::new(name, SettingSpec { value: value.clone() })).await.map_err(|e| e.to_string())?;
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        for d in DEFINITIONS {
            assert_eq!(validate(d.name, d.default).as_deref(), Ok(d.default), "{}", d.name);
        }
        assert!(validate("nope", "1").is_err());
        assert!(validate("storage-minimal-available-percentage", "-3").is_err());
        assert!(validate("replica-soft-anti-affinity", "yes").is_err());
    }

    #[test]
    fn values_fall_back_to_defaults() {
        let values = Values(HashMap::from([
            ("replica-rebuild-retry-max".to_string(), "7".to_string()),
            ("replica-soft-anti-affinity".to_string(), "true".to_string()),
            ("engine-replica-timeout".to_string(), "junk".to_string()),
        ]));
        assert_eq!(values.u64("replica-rebuild-retry-max"), 7);
        assert!(values.bool("replica-soft-anti-affinity"));
        assert_eq!(values.u64("engine-replica-timeout"), 8, "an unparsable value reads as the default");
        assert_eq!(values.u64("replica-replenishment-wait-interval"), 600);
        assert!(!values.bool("replica-zone-soft-anti-affinity"));
    }
}
