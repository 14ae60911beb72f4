//! The instance manager against real replica processes: states, pids and exit
//! status; nothing restarted behind the manager's back; and what happens to
//! running instances when the instance manager itself is killed and
//! restarted (they keep running and are re-adopted).

use std::time::{Duration, Instant};

use ironhorn_proto::instance::instance_manager_client::InstanceManagerClient;
use ironhorn_proto::instance::*;
use ironhorn_proto::replica::InfoRequest;
use ironhorn_tests::*;
use tonic::transport::Channel;

fn start_im(dir: &std::path::Path, ports: &str) -> Process {
    let args: Vec<String> = [
        "serve",
        "--data-dir",
        dir.join("im").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--port-range",
        ports,
        "--stop-grace-secs",
        "5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Process::start("im", &binary("ironhorn-instance-manager"), &args, dir).expect("instance manager")
}

async fn client(im: &Process) -> InstanceManagerClient<Channel> {
    InstanceManagerClient::connect(format!("http://{}", im.address)).await.expect("connect")
}

fn replica_request(name: &str, store: &std::path::Path) -> CreateRequest {
    CreateRequest {
        name: name.into(),
        spec: Some(create_request::Spec::Replica(ReplicaSpec {
            store: format!("file:{}", store.display()),
            size_bytes: 16 << 20,
        })),
    }
}

async fn wait_state(c: &mut InstanceManagerClient<Channel>, name: &str, state: InstanceState) -> Instance {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let i = c.get(GetRequest { name: name.into() }).await.expect("get").into_inner();
        if i.state == state as i32 {
            return i;
        }
        assert!(Instant::now() < deadline, "{name} never reached {state:?}: {i:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z")
}

async fn replica_answers(address: &str) -> bool {
    match ironhorn_proto::replica::replica_client::ReplicaClient::connect(format!("http://{address}")).await {
        Ok(mut c) => c.info(InfoRequest {}).await.is_ok(),
        Err(_) => false,
    }
}

#[test]
fn instances_are_supervised_not_restarted_and_survive_an_instance_manager_restart() {
    let dir = TempDir::new("im");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut im = start_im(dir.path(), "26000-26049");
    let mut leftover = Vec::new();
    rt.block_on(async {
        let mut c = client(&im).await;
        for name in ["r1", "r2", "r3"] {
            c.create(replica_request(name, &dir.path().join(format!("{name}.img")))).await.expect("create");
        }
        let r1 = wait_state(&mut c, "r1", InstanceState::Running).await;
        let r2 = wait_state(&mut c, "r2", InstanceState::Running).await;
        let r3 = wait_state(&mut c, "r3", InstanceState::Running).await;
        assert!(r1.pid > 0 && alive(r1.pid));
        assert!(r1.address.starts_with("127.0.0.1:260"), "{}", r1.address);
        assert!(replica_answers(&r1.address).await);
        // The same name and spec again: the running instance, unchanged.
        let again = c.create(replica_request("r1", &dir.path().join("r1.img"))).await.unwrap().into_inner();
        assert_eq!(again.pid, r1.pid);
        // The same name with another spec, or a store in use: refused.
        let clash = c.create(replica_request("r1", &dir.path().join("other.img"))).await.unwrap_err();
        assert_eq!(clash.code(), tonic::Code::AlreadyExists);
        let clash = c.create(replica_request("r9", &dir.path().join("r1.img"))).await.unwrap_err();
        assert_eq!(clash.code(), tonic::Code::AlreadyExists);

        // A process that dies is reported with its exit status, not restarted.
        let mut watch = c.watch(WatchRequest {}).await.unwrap().into_inner();
        kill9(r2.pid);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), watch.message()).await.unwrap().unwrap().unwrap();
            if event.name == "r2" && event.state == InstanceState::Error as i32 {
                assert!(event.exited);
                assert_eq!(event.exit_signal, 9);
                assert!(event.error_message.contains("killed by signal 9"), "{}", event.error_message);
                break;
            }
            assert!(Instant::now() < deadline, "no error event for r2");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r2_now = c.get(GetRequest { name: "r2".into() }).await.unwrap().into_inner();
        assert_eq!(r2_now.state, InstanceState::Error as i32, "still error: not restarted");

        // The instance manager dies; its instances do not.
        im.kill9();
        assert!(alive(r1.pid) && replica_answers(&r1.address).await, "r1 serves without its instance manager");
        // One dies while nobody watches.
        kill9(r3.pid);
        tokio::time::sleep(Duration::from_millis(300)).await;

        im = start_im(dir.path(), "26000-26049");
        let mut c = client(&im).await;
        let r1_after = c.get(GetRequest { name: "r1".into() }).await.unwrap().into_inner();
        assert_eq!(r1_after.state, InstanceState::Running as i32, "re-adopted: {r1_after:?}");
        assert_eq!(r1_after.pid, r1.pid, "the same process");
        let r3_after = c.get(GetRequest { name: "r3".into() }).await.unwrap().into_inner();
        assert_eq!(r3_after.state, InstanceState::Error as i32);
        assert!(r3_after.error_message.contains("while the instance manager was down"), "{}", r3_after.error_message);
        let r2_after = c.get(GetRequest { name: "r2".into() }).await.unwrap().into_inner();
        assert_eq!(r2_after.state, InstanceState::Error as i32);
        // A new instance gets a port no adopted one holds.
        c.create(replica_request("r4", &dir.path().join("r4.img"))).await.unwrap();
        let r4 = wait_state(&mut c, "r4", InstanceState::Running).await;
        assert_ne!(r4.address, r1.address);

        // An adopted process that dies is seen too (its status is unknown:
        // it is not our child any more).
        kill9(r1.pid);
        let r1_dead = wait_state(&mut c, "r1", InstanceState::Error).await;
        assert!(r1_dead.error_message.contains("unknown"), "{}", r1_dead.error_message);

        // Asked to, the manager starts it again (same store, data kept).
        c.create(replica_request("r1", &dir.path().join("r1.img"))).await.unwrap();
        let r1_new = wait_state(&mut c, "r1", InstanceState::Running).await;
        assert_ne!(r1_new.pid, r1.pid);
        // Delete stops it and, with remove_data, removes its store.
        let gone = c.delete(DeleteRequest { name: "r1".into(), remove_data: true }).await.unwrap().into_inner();
        assert_eq!(gone.state, InstanceState::Stopped as i32);
        assert!(!alive(r1_new.pid));
        assert!(!dir.path().join("r1.img").exists(), "store removed");
        assert_eq!(c.get(GetRequest { name: "r1".into() }).await.unwrap_err().code(), tonic::Code::NotFound);
        assert_eq!(
            c.delete(DeleteRequest { name: "nope".into(), remove_data: false }).await.unwrap_err().code(),
            tonic::Code::NotFound
        );
        // A store in use cannot be deleted underneath its replica.
        let busy =
            c.delete_store(DeleteStoreRequest { store: format!("file:{}", dir.path().join("r4.img").display()) }).await;
        assert_eq!(busy.unwrap_err().code(), tonic::Code::FailedPrecondition);
        let log = c.log(LogRequest { name: "r4".into(), max_bytes: 0 }).await.unwrap().into_inner();
        assert!(log.text.contains("listening on"), "{}", log.text);

        // Bad requests: clear errors, nothing started.
        for bad in [
            CreateRequest { name: "x".into(), spec: None },
            CreateRequest { name: "bad name".into(), spec: replica_request("x", &dir.path().join("x.img")).spec },
            CreateRequest {
                name: "x".into(),
                spec: Some(create_request::Spec::Replica(ReplicaSpec { store: "disk:/x".into(), size_bytes: 4096 })),
            },
            CreateRequest {
                name: "x".into(),
                spec: Some(create_request::Spec::Engine(EngineSpec {
                    volume: "v".into(),
                    size_bytes: 1 << 20,
                    epoch: 1,
                    ..Default::default()
                })),
            },
        ] {
            let e = c.create(bad).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        }
        let disk = c
            .disk_status(DiskStatusRequest { disk: format!("file:{}", dir.path().display()) })
            .await
            .unwrap()
            .into_inner();
        assert!(disk.total_bytes > 0 && disk.stores.iter().any(|s| s.ends_with("r4.img")), "{disk:?}");

        // SIGTERM stops the instance manager only.
        leftover.push(r4.pid);
    });
    assert_eq!(im.stop(Duration::from_secs(10)), Some(0));
    for pid in leftover {
        assert!(alive(pid), "instances outlive a stopped instance manager");
        // SAFETY: one exact pid started by this test.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
}

/// An LVM disk's status is cached between polls (two LVM commands each),
/// but never past a change: a replica's store shows once the replica runs,
/// is gone once the replica is deleted with its data, and an LV made by
/// hand shows within the cache's 5 s.
#[test]
fn an_lvm_disk_status_follows_its_stores() {
    let dir = TempDir::new("im-lvm");
    let vg = VolumeGroup::new(dir.path(), 256 << 20);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut im = start_im(dir.path(), "17500-17509");
    rt.block_on(async {
        let mut c = client(&im).await;
        let disk = format!("lvm:{}", vg.name);
        let status = |mut c: InstanceManagerClient<Channel>, disk: String| async move {
            c.disk_status(DiskStatusRequest { disk }).await.expect("disk status").into_inner()
        };
        let before = status(c.clone(), disk.clone()).await;
        assert!(before.stores.is_empty() && before.total_bytes > 0, "{before:?}");
        assert_eq!(status(c.clone(), disk.clone()).await.free_bytes, before.free_bytes);

        let store = format!("lvm:{}/r1", vg.name);
        let request = CreateRequest {
            name: "r1".into(),
            spec: Some(create_request::Spec::Replica(ReplicaSpec { store: store.clone(), size_bytes: 16 << 20 })),
        };
        c.create(request).await.expect("create");
        wait_state(&mut c, "r1", InstanceState::Running).await;
        let with = status(c.clone(), disk.clone()).await;
        assert_eq!(with.stores, vec![store.clone()], "the running replica's store is listed at once");
        assert!(with.free_bytes < before.free_bytes, "{with:?}");

        c.delete(DeleteRequest { name: "r1".into(), remove_data: true }).await.expect("delete");
        let without = status(c.clone(), disk.clone()).await;
        assert!(without.stores.is_empty(), "the deleted store is gone at once: {without:?}");
        assert_eq!(without.free_bytes, before.free_bytes);

        vg.create_lv("byhand", "8M");
        let t = Instant::now();
        loop {
            let now = status(c.clone(), disk.clone()).await;
            if now.stores.contains(&format!("lvm:{}/byhand", vg.name)) {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "an LV made by hand never showed: {now:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    assert_eq!(im.stop(Duration::from_secs(10)), Some(0));
}
