//! The API does not show stale status as current: with the embedded store
//! on a tmpfs that fills up, a status write fails and the volume reads
//! `unknown` with a condition saying why; once writes land again, the
//! stored status is shown as it is.

use std::path::PathBuf;
use std::process::Command;

use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use ironhorn_manager::crd::{Volume, VolumeSpec, VolumeStatus};
use ironhorn_manager::datastore::embedded::EmbeddedStore;
use ironhorn_manager::datastore::health::Recorded;
use ironhorn_manager::datastore::{Datastore, update_status};
use serde_json::Value;
use tower::ServiceExt;

struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test mounts a tmpfs: run it as root");
        let dir = std::env::temp_dir().join(format!("ironhorn-dshealth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", dir.to_str().unwrap()])
            .output()
            .expect("mount");
        assert!(out.status.success(), "mount tmpfs: {}", String::from_utf8_lossy(&out.stderr));
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

async fn get_volume(router: &axum::Router, name: &str) -> Value {
    let request = Request::get(format!("/v1/volumes/{name}")).body(Body::empty()).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    assert!(response.status().is_success(), "GET volume: {}", response.status());
    serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap()
}

fn set_robustness(volume: &mut Volume, robustness: &str) -> bool {
    volume.status.get_or_insert_default().robustness = robustness.into();
    true
}

#[tokio::test]
async fn status_is_not_shown_as_current_while_datastore_writes_fail() {
    let fs = Tmpfs::mount("1m");
    let store = Recorded::new(EmbeddedStore::open(&fs.0.join("store")).unwrap());
    let router = ironhorn_manager::api::router(store.clone(), ironhorn_manager::leader::Gate::always());
    let mut volume = Volume::new("v1", VolumeSpec { size: 1 << 30, number_of_replicas: 3, ..Default::default() });
    volume.status = Some(VolumeStatus { state: "attached".into(), robustness: "healthy".into(), ..Default::default() });
    store.create(&volume).await.unwrap();
    update_status::<Volume, _>(&store, "v1", |v| set_robustness(v, "healthy")).await.unwrap();
    assert_eq!(get_volume(&router, "v1").await["status"]["robustness"], "healthy");

    // Fill the filesystem; the next status write (a replica failed) fails.
    let filler = fs.0.join("filler");
    let out = Command::new("dd").args(["if=/dev/zero", &format!("of={}", filler.display()), "bs=64k"]).output();
    assert!(out.is_ok(), "dd");
    let failed = update_status::<Volume, _>(&store, "v1", |v| set_robustness(v, "degraded")).await;
    assert!(failed.is_err(), "a write to a full filesystem succeeded");
    let shown = get_volume(&router, "v1").await;
    assert_eq!(shown["status"]["robustness"], "unknown", "stale status shown as current: {shown}");
    let condition = shown["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "StatusCurrent")
        .expect("a condition says why")
        .clone();
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "DatastoreWriteFailed");
    assert!(condition["message"].as_str().unwrap().contains("No space left"), "{condition}");

    // Space again: the write lands and the status is current.
    std::fs::remove_file(&filler).unwrap();
    update_status::<Volume, _>(&store, "v1", |v| set_robustness(v, "degraded")).await.unwrap();
    let shown = get_volume(&router, "v1").await;
    assert_eq!(shown["status"]["robustness"], "degraded");
    assert!(shown["status"]["conditions"].as_array().is_none_or(|c| c.iter().all(|c| c["type"] != "StatusCurrent")));
}
