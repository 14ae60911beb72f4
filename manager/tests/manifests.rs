//! deploy/ironhorn.yaml and deploy/examples/: every document parses into
//! its typed struct (k8s-openapi's, or the snapshot API's below) and
//! serialises back to the same value, so nothing unknown or misspelt is
//! silently dropped; every workload container has resources, a liveness
//! probe and a pinned image; the CRDs in the manifest are the types'.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Container, Namespace, PersistentVolumeClaim, Pod, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(file)
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

// The snapshot API (snapshot.storage.k8s.io/v1) is not in k8s-openapi;
// these carry every field the examples may use and refuse any other.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VolumeSnapshotClass {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    driver: String,
    deletion_policy: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parameters: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VolumeSnapshot {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: VolumeSnapshotSpec,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VolumeSnapshotSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    volume_snapshot_class_name: Option<String>,
    source: VolumeSnapshotSource,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VolumeSnapshotSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    persistent_volume_claim_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    volume_snapshot_content_name: Option<String>,
}

fn round_trip<T: Serialize + serde::de::DeserializeOwned>(doc: &Value, what: &str) -> T {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    assert!(
        &back == doc,
        "{what}: fields were dropped or changed by parsing (misspelt or unknown?)\n  file:  {doc}\n  typed: {back}"
    );
    typed
}

/// Parses one document by its apiVersion and kind; returns the pod specs
/// of workloads in it.
fn check(doc: &Value, file: &str) -> Vec<(String, PodSpec)> {
    let api = doc["apiVersion"].as_str().unwrap_or_else(|| panic!("{file}: a document without apiVersion: {doc}"));
    let kind = doc["kind"].as_str().unwrap_or_else(|| panic!("{file}: a document without kind: {doc}"));
    let name = doc["metadata"]["name"].as_str().unwrap_or("?");
    let what = format!("{file}: {kind} {name}");
    let pod = |spec: Option<PodSpec>| vec![(what.clone(), spec.expect("a pod spec"))];
    match (api, kind) {
        ("v1", "Namespace") => drop(round_trip::<Namespace>(doc, &what)),
        ("v1", "ServiceAccount") => drop(round_trip::<ServiceAccount>(doc, &what)),
        ("v1", "Service") => drop(round_trip::<Service>(doc, &what)),
        ("v1", "PersistentVolumeClaim") => drop(round_trip::<PersistentVolumeClaim>(doc, &what)),
        ("v1", "Pod") => return pod(round_trip::<Pod>(doc, &what).spec),
        ("apps/v1", "Deployment") => {
            return pod(round_trip::<Deployment>(doc, &what).spec.and_then(|s| s.template.spec));
        }
        ("apps/v1", "DaemonSet") => return pod(round_trip::<DaemonSet>(doc, &what).spec.and_then(|s| s.template.spec)),
        ("rbac.authorization.k8s.io/v1", "Role") => drop(round_trip::<Role>(doc, &what)),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => drop(round_trip::<RoleBinding>(doc, &what)),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => drop(round_trip::<ClusterRole>(doc, &what)),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => drop(round_trip::<ClusterRoleBinding>(doc, &what)),
        ("storage.k8s.io/v1", "CSIDriver") => drop(round_trip::<CSIDriver>(doc, &what)),
        ("storage.k8s.io/v1", "StorageClass") => drop(round_trip::<StorageClass>(doc, &what)),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            drop(round_trip::<CustomResourceDefinition>(doc, &what))
        }
        ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass") => drop(round_trip::<VolumeSnapshotClass>(doc, &what)),
        ("snapshot.storage.k8s.io/v1", "VolumeSnapshot") => drop(round_trip::<VolumeSnapshot>(doc, &what)),
        _ => panic!("{what}: no typed check for {api} {kind}; add one"),
    }
    Vec::new()
}

fn check_container(c: &Container, what: &str) {
    let what = format!("{what}, container {}", c.name);
    let image = c.image.as_deref().unwrap_or_else(|| panic!("{what}: no image"));
    let tag = image.rsplit_once(':').map(|(_, t)| t).filter(|t| !t.contains('/'));
    assert!(tag.is_some_and(|t| t != "latest"), "{what}: image {image} is not pinned to a version");
    let resources = c.resources.as_ref().unwrap_or_else(|| panic!("{what}: no resources"));
    assert!(resources.requests.as_ref().is_some_and(|r| r.contains_key("memory") && r.contains_key("cpu")));
    assert!(resources.limits.as_ref().is_some_and(|l| l.contains_key("memory")), "{what}: no memory limit");
    assert!(c.liveness_probe.is_some(), "{what}: no liveness probe");
}

fn pod_specs(file: &str, docs: &[Value]) -> Vec<(String, PodSpec)> {
    docs.iter().flat_map(|d| check(d, file)).collect()
}

#[test]
fn every_document_of_the_install_manifest_and_the_examples_round_trips_through_its_type() {
    let mut checked = 0;
    let mut specs = Vec::new();
    let mut files = vec![deploy("ironhorn.yaml")];
    let mut examples: Vec<PathBuf> = std::fs::read_dir(deploy("examples"))
        .expect("deploy/examples")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    examples.sort();
    assert!(examples.len() >= 3, "examples: {examples:?}");
    files.extend(examples);
    for path in &files {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let docs = documents(path);
        checked += docs.len();
        specs.extend(pod_specs(&file, &docs));
    }
    assert!(checked > 30, "only {checked} documents");
    assert!(specs.len() >= 8, "workloads: {:?}", specs.iter().map(|(w, _)| w).collect::<Vec<_>>());
    for (what, spec) in &specs {
        for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
            check_container(c, what);
        }
    }
}

#[test]
fn the_install_manifest_has_every_component_and_the_crds_of_the_types() {
    let docs = documents(&deploy("ironhorn.yaml"));
    let has = |kind: &str, name: &str| docs.iter().any(|d| d["kind"] == kind && d["metadata"]["name"] == name);
    for (kind, name) in [
        ("Namespace", "ironhorn-system"),
        ("Deployment", "ironhorn-manager"),
        ("Service", "ironhorn-manager"),
        ("DaemonSet", "ironhorn-instance-manager"),
        ("CSIDriver", "driver.ironhorn.io"),
        ("Deployment", "ironhorn-csi-controller"),
        ("DaemonSet", "ironhorn-csi-node"),
        ("StorageClass", "ironhorn"),
        ("VolumeSnapshotClass", "ironhorn"),
    ] {
        assert!(has(kind, name), "deploy/ironhorn.yaml lacks {kind} {name}");
    }
    let manager: Deployment = serde_json::from_value(
        docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "ironhorn-manager").unwrap().clone(),
    )
    .unwrap();
    assert_eq!(manager.spec.unwrap().replicas, Some(2), "two managers, one leading");
    let driver: CSIDriver =
        serde_json::from_value(docs.iter().find(|d| d["kind"] == "CSIDriver").unwrap().clone()).unwrap();
    let spec = driver.spec;
    assert_eq!(spec.attach_required, Some(true));
    assert_eq!(spec.pod_info_on_mount, Some(true));
    assert_eq!(spec.storage_capacity, Some(true));
    assert_eq!(spec.volume_lifecycle_modes, Some(vec!["Persistent".into(), "Ephemeral".into()]));
    assert!(spec.fs_group_policy.is_some());
    let class: StorageClass = serde_json::from_value(
        docs.iter().find(|d| d["kind"] == "StorageClass" && d["metadata"]["name"] == "ironhorn").unwrap().clone(),
    )
    .unwrap();
    assert_eq!(class.parameters.unwrap()["numberOfReplicas"], "3");
    assert_eq!(class.allow_volume_expansion, Some(true));

    // The CRD documents are exactly the generated ones, in order.
    let crds: Vec<CustomResourceDefinition> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .map(|d| serde_json::from_value(d.clone()).unwrap())
        .collect();
    assert!(
        crds == ironhorn_manager::crd::all_crds(),
        "the CRDs in deploy/ironhorn.yaml differ from the types; run scripts/manifest.sh"
    );
    let on_disk = std::fs::read_to_string(deploy("ironhorn.yaml")).unwrap();
    let parts = std::fs::read_to_string(deploy("install.yaml")).unwrap() + &ironhorn_manager::crd::crds_yaml();
    assert!(on_disk == parts, "deploy/ironhorn.yaml is not install.yaml + the CRDs; run scripts/manifest.sh");
}

#[test]
fn a_misspelt_field_is_caught() {
    // The check itself: a typo k8s-openapi would drop must fail the round trip.
    let doc: Value = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": { "name": "x" },
        "provisioner": "driver.ironhorn.io", "allowVolumeExpanson": true
    });
    let caught = std::panic::catch_unwind(|| check(&doc, "inline"));
    assert!(caught.is_err(), "allowVolumeExpanson was dropped silently");
}
