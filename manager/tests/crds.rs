//! deploy/crds.yaml is generated from the Rust types; this fails when they drift.
//! Regenerate with `cargo run -p ironhorn-manager --bin ironhorn -- crds > deploy/crds.yaml`.

use ironhorn_manager::crd;

#[test]
fn deploy_crds_yaml_matches_the_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds.yaml");
    let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        on_disk == crd::crds_yaml(),
        "deploy/crds.yaml differs from the types in manager/src/crd.rs; regenerate it with \
         `cargo run -p ironhorn-manager --bin ironhorn -- crds > deploy/crds.yaml`"
    );
}

#[test]
fn every_kind_is_in_group_ironhorn_io_with_printer_columns() {
    let crds = crd::all_crds();
    let kinds: Vec<_> = crds.iter().map(|c| c.spec.names.kind.clone()).collect();
    assert_eq!(kinds, ["Volume", "Engine", "Replica", "Node", "InstanceManager", "Setting", "Snapshot"]);
    for c in &crds {
        assert_eq!(c.spec.group, "ironhorn.io");
    }
    let volume = &crds[0].spec.versions[0];
    let columns: Vec<_> = volume
        .additional_printer_columns
        .as_ref()
        .expect("volume printer columns")
        .iter()
        .map(|c| (c.name.as_str(), c.json_path.as_str()))
        .collect();
    for expected in [
        ("State", ".status.state"),
        ("Robustness", ".status.robustness"),
        ("Size", ".spec.size"),
        ("Replicas", ".spec.numberOfReplicas"),
        ("Node", ".status.currentNodeID"),
    ] {
        assert!(columns.contains(&expected), "volume printer column {expected:?} missing from {columns:?}");
    }
    // Longhorn's field names where the meaning is the same.
    let yaml = crd::crds_yaml();
    for field in [
        "numberOfReplicas",
        "staleReplicaTimeout",
        "replicaAddressMap",
        "replicaModeMap",
        "healthyAt",
        "failedAt",
        "rebuildRetryCount",
        "storageReserved",
        "allowScheduling",
        "tags",
    ] {
        assert!(yaml.contains(&format!("{field}:")), "field {field} missing from the CRDs");
    }
}
