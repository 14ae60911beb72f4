//! The CSI driver driven over its unix sockets the way the kubelet and the
//! sidecars drive it, against a standalone cluster, with real mounts, mkfs
//! and fio on the published block device.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ironhorn_proto::csi;
use ironhorn_proto::csi::controller_client::ControllerClient;
use ironhorn_proto::csi::identity_client::IdentityClient;
use ironhorn_proto::csi::node_client::NodeClient;
use ironhorn_proto::csi::volume_capability::access_mode::Mode;
use ironhorn_proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use ironhorn_tests::*;
use tonic::Code;
use tonic::transport::Channel;

/// One `ironhorn csi` process per node, as the DaemonSet runs them; node
/// n-1's also serves the controller (mode all), as the hostpath driver does.
struct Driver {
    rt: tokio::runtime::Runtime,
    dir: PathBuf,
    api: String,
    plugins: HashMap<String, Process>,
}

impl Driver {
    fn start(cluster: &StandaloneCluster, nodes: &[&str]) -> Driver {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = cluster.dir.path().join("csi");
        std::fs::create_dir_all(&dir).unwrap();
        let mut driver = Driver { rt, dir, api: cluster.api.clone(), plugins: HashMap::new() };
        for node in nodes {
            driver.start_plugin(node);
        }
        driver
    }

    fn socket(&self, node: &str) -> PathBuf {
        self.dir.join(node).join("csi.sock")
    }

    fn start_plugin(&mut self, node: &str) {
        let mode = if node == "n-1" { "all" } else { "node" };
        let args: Vec<String> = [
            "--api",
            &self.api,
            "csi",
            "--endpoint",
            &format!("unix://{}", self.socket(node).display()),
            "--node-id",
            node,
            "--mode",
            mode,
            "--state-dir",
            self.dir.join(node).join("state").to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let process =
            Process::start(&format!("csi-{node}"), &binary("ironhorn"), &args, &self.dir).expect("csi plugin");
        self.plugins.insert(node.to_string(), process);
    }

    fn restart_plugin(&mut self, node: &str) {
        let mut old = self.plugins.remove(node).expect("plugin running");
        old.kill9();
        self.start_plugin(node);
    }

    fn channel(&self, node: &str) -> Channel {
        self.rt.block_on(unix_channel(&self.socket(node)))
    }

    fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel("n-1"))
    }

    fn node(&self, node: &str) -> NodeClient<Channel> {
        NodeClient::new(self.channel(node))
    }

    fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        self.rt.block_on(f).map(tonic::Response::into_inner)
    }
}

/// Unmounts, by exact path, whatever a test mounted, even when it fails
/// half-way (declared after the cluster, so it runs before the cluster
/// stops the engines).
struct Mounts(Vec<PathBuf>);

impl Drop for Mounts {
    fn drop(&mut self) {
        for path in self.0.iter().rev() {
            let p = path.to_str().unwrap();
            // A process killed a moment ago may still hold it briefly.
            let mut tries = 0;
            while run("mountpoint", &["-q", p]).is_ok() {
                if run("umount", &[p]).is_err() {
                    tries += 1;
                    if tries == 50 {
                        eprintln!("{p} stays busy; detaching it lazily");
                        let _ = run("umount", &["-l", p]);
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

/// A child process killed if the test fails while it runs (it would keep
/// the mount busy).
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn mount_cap(fs: &str) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume { fs_type: fs.into(), ..Default::default() })),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    }
}

fn block_cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    }
}

fn create_request(name: &str, bytes: i64, replicas: u32, cap: csi::VolumeCapability) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
        volume_capabilities: vec![cap],
        parameters: [("numberOfReplicas".to_string(), replicas.to_string())].into(),
        ..Default::default()
    }
}

fn publish(d: &Driver, volume: &str, node: &str, cap: &csi::VolumeCapability) -> HashMap<String, String> {
    let reply = d
        .call(d.controller().controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: volume.into(),
            node_id: node.into(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        }))
        .expect("ControllerPublishVolume");
    reply.publish_context
}

fn stage_and_publish(
    d: &Driver,
    volume: &str,
    node: &str,
    cap: &csi::VolumeCapability,
    context: &HashMap<String, String>,
    staging: &Path,
    target: &Path,
) {
    d.call(d.node(node).node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: volume.into(),
        publish_context: context.clone(),
        staging_target_path: staging.to_str().unwrap().into(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    }))
    .expect("NodeStageVolume");
    d.call(d.node(node).node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: volume.into(),
        publish_context: context.clone(),
        staging_target_path: staging.to_str().unwrap().into(),
        target_path: target.to_str().unwrap().into(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    }))
    .expect("NodePublishVolume");
}

fn unpublish_and_unstage(d: &Driver, volume: &str, node: &str, staging: &Path, target: &Path) {
    d.call(d.node(node).node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: volume.into(),
        target_path: target.to_str().unwrap().into(),
    }))
    .expect("NodeUnpublishVolume");
    d.call(d.node(node).node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.to_str().unwrap().into(),
    }))
    .expect("NodeUnstageVolume");
    d.call(d.controller().controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        ..Default::default()
    }))
    .expect("ControllerUnpublishVolume");
}

fn is_mounted(path: &Path) -> bool {
    run("mountpoint", &["-q", path.to_str().unwrap()]).is_ok()
}

/// Files of distinct sizes and contents, written and fsynced.
fn write_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    use std::io::Write;
    let mut out = Vec::new();
    for (i, size) in [1usize, 4096, 100_000, 3 << 20].into_iter().enumerate() {
        let data: Vec<u8> = (0..size).map(|j| ((j * 31 + i * 7) % 251) as u8).collect();
        let path = dir.join(format!("file-{i}"));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        out.push((path, data));
    }
    out
}

/// Asserts the files `write_files` wrote read back byte for byte under `dir`.
fn assert_files(dir: &Path, files: &[(PathBuf, Vec<u8>)]) {
    for (path, data) in files {
        let here = dir.join(path.file_name().unwrap());
        assert!(std::fs::read(&here).unwrap() == *data, "{} differs", here.display());
    }
}

fn delete_volume(d: &Driver, name: &str) {
    d.call(d.controller().delete_volume(csi::DeleteVolumeRequest { volume_id: name.into(), ..Default::default() }))
        .expect("DeleteVolume");
}

/// The size `df` reports for the filesystem at `path`, in bytes.
fn df(path: &Path) -> u64 {
    let out = run("df", &["-B1", "--output=size", path.to_str().unwrap()]).unwrap();
    out.lines().nth(1).unwrap().trim().parse().unwrap()
}

fn lvs_of(cluster: &StandaloneCluster, volume: &str) -> Vec<String> {
    ["n-1", "n-2", "n-3"].iter().flat_map(|n| cluster.lvs(n)).filter(|lv| lv.starts_with(volume)).collect()
}

#[test]
fn the_kubelets_flow_moves_a_filesystem_between_nodes_byte_for_byte_and_delete_removes_every_lv() {
    require_tool("mkfs.ext4", "e2fsprogs");
    require_tool("blkid", "util-linux");
    let cluster = StandaloneCluster::start("csi-flow", 3, 30000, "1GiB");
    let d = Driver::start(&cluster, &["n-1", "n-2"]);
    let work = cluster.dir.path().join("kubelet");
    let (staging_a, target_a) = (work.join("a/staging"), work.join("a/target"));
    let (staging_b, target_b) = (work.join("b/staging"), work.join("b/target"));
    let _mounts = Mounts(vec![staging_a.clone(), target_a.clone(), staging_b.clone(), target_b.clone()]);
    std::fs::create_dir_all(work.join("a")).unwrap();
    std::fs::create_dir_all(work.join("b")).unwrap();

    let cap = mount_cap("ext4");
    let name = "pvc-0b6e5a3c-1c1f-4f0e-9a59-1c2d3e4f5a6b";
    let created = d.call(d.controller().create_volume(create_request(name, 60 << 20, 3, cap.clone()))).unwrap();
    let volume = created.volume.unwrap();
    assert_eq!(volume.volume_id, name);
    assert_eq!(volume.capacity_bytes, 60 << 20);
    assert_eq!(cluster.replicas_of(name).len(), 3, "numberOfReplicas 3");

    let context = publish(&d, name, "n-1", &cap);
    assert_eq!(context["devicePath"], format!("/dev/ironhorn/{name}"));
    stage_and_publish(&d, name, "n-1", &cap, &context, &staging_a, &target_a);
    assert!(is_mounted(&staging_a) && is_mounted(&target_a));
    let fs = run("findmnt", &["-n", "-o", "FSTYPE", target_a.to_str().unwrap()]).unwrap();
    assert_eq!(fs.trim(), "ext4");
    let files = write_files(&target_a);
    unpublish_and_unstage(&d, name, "n-1", &staging_a, &target_a);
    assert!(!is_mounted(&target_a) && !is_mounted(&staging_a));
    assert!(!target_a.exists(), "unpublish removes the target it made");
    assert_eq!(cluster.volume(name)["status"]["state"], "detached");

    let context = publish(&d, name, "n-2", &cap);
    stage_and_publish(&d, name, "n-2", &cap, &context, &staging_b, &target_b);
    assert_files(&target_b, &files);
    unpublish_and_unstage(&d, name, "n-2", &staging_b, &target_b);

    assert!(!lvs_of(&cluster, name).is_empty(), "the volume's LVs exist before DeleteVolume");
    delete_volume(&d, name);
    assert!(lvs_of(&cluster, name).is_empty(), "every LV is gone: {:?}", lvs_of(&cluster, name));
    assert!(cluster.cli(&["volume", "get", name]).is_err(), "the volume is gone");
}

#[test]
fn a_raw_block_volume_passes_fio_verify_through_the_published_device_file() {
    require_tool("fio", "fio");
    let cluster = StandaloneCluster::start("csi-block", 3, 30500, "1GiB");
    let d = Driver::start(&cluster, &["n-1"]);
    let work = cluster.dir.path().join("kubelet");
    std::fs::create_dir_all(&work).unwrap();
    let (staging, target) = (work.join("staging"), work.join("device"));
    let _mounts = Mounts(vec![target.clone()]);
    let cap = block_cap();
    let name = "pvc-block-1";
    d.call(d.controller().create_volume(create_request(name, 48 << 20, 2, cap.clone()))).unwrap();
    let context = publish(&d, name, "n-1", &cap);
    stage_and_publish(&d, name, "n-1", &cap, &context, &staging, &target);
    let meta = std::fs::metadata(&target).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type()), "the target is the device node");
    assert!(!is_mounted(&staging), "a block volume stages no filesystem");
    let out = Command::new("fio")
        .args([
            "--name=csi-block",
            &format!("--filename={}", target.display()),
            "--direct=1",
            "--ioengine=psync",
            "--rw=randwrite",
            "--bs=4k",
            "--size=40M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fio verify failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stats = d
        .call(d.node("n-1").node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: name.into(),
            volume_path: target.to_str().unwrap().into(),
            ..Default::default()
        }))
        .unwrap();
    assert_eq!(stats.usage[0].total, 48 << 20, "a block volume's stats are its bytes");
    assert!(!stats.volume_condition.unwrap().abnormal);
    unpublish_and_unstage(&d, name, "n-1", &staging, &target);
    assert!(!target.exists());
    delete_volume(&d, name);
    assert!(lvs_of(&cluster, name).is_empty());
}

fn code_of<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(s) => {
            assert!(!s.message().is_empty(), "every error says why");
            s.code()
        }
    }
}

#[test]
fn each_rpc_answers_twice_the_same_and_bad_requests_get_the_specs_codes() {
    require_tool("mkfs.ext4", "e2fsprogs");
    let cluster = StandaloneCluster::start("csi-codes", 3, 31000, "1GiB");
    let d = Driver::start(&cluster, &["n-1", "n-2"]);
    let work = cluster.dir.path().join("kubelet");
    std::fs::create_dir_all(&work).unwrap();
    let (staging, target) = (work.join("staging"), work.join("target"));
    let _mounts = Mounts(vec![staging.clone(), target.clone()]);
    let mut ctl = d.controller();
    let cap = mount_cap("ext4");

    // Identity.
    let info = d.call(IdentityClient::new(d.channel("n-1")).get_plugin_info(csi::GetPluginInfoRequest {})).unwrap();
    assert_eq!(info.name, "driver.ironhorn.io");
    let probe = d.call(IdentityClient::new(d.channel("n-2")).probe(csi::ProbeRequest {})).unwrap();
    assert_eq!(probe.ready, Some(true));
    let node_info = d.call(d.node("n-2").node_get_info(csi::NodeGetInfoRequest {})).unwrap();
    assert_eq!(node_info.node_id, "n-2");
    assert_eq!(node_info.accessible_topology.unwrap().segments["topology.ironhorn.io/node"], "n-2");

    // CreateVolume: twice the same; an incompatible second → ALREADY_EXISTS.
    let name = "pvc-codes-1";
    let first = d.call(ctl.create_volume(create_request(name, 20 << 20, 2, cap.clone()))).unwrap();
    let again = d.call(ctl.create_volume(create_request(name, 20 << 20, 2, cap.clone()))).unwrap();
    assert_eq!(first.volume, again.volume);
    assert_eq!(cluster.replicas_of(name).len(), 2, "the second call made nothing more");
    assert_eq!(code_of(d.call(ctl.create_volume(create_request(name, 40 << 20, 2, cap.clone())))), Code::AlreadyExists);
    assert_eq!(code_of(d.call(ctl.create_volume(create_request(name, 20 << 20, 3, cap.clone())))), Code::AlreadyExists);
    // Capacity: rounded up to whole blocks; a limit below that → OUT_OF_RANGE.
    let odd = d
        .call(ctl.create_volume(csi::CreateVolumeRequest {
            capacity_range: Some(csi::CapacityRange { required_bytes: (8 << 20) + 1, limit_bytes: 0 }),
            ..create_request("pvc-codes-odd", 0, 1, cap.clone())
        }))
        .unwrap();
    assert_eq!(odd.volume.unwrap().capacity_bytes, (8 << 20) + 4096);
    let over = csi::CreateVolumeRequest {
        capacity_range: Some(csi::CapacityRange { required_bytes: (8 << 20) + 1, limit_bytes: (8 << 20) + 100 }),
        ..create_request("pvc-codes-range", 0, 1, cap.clone())
    };
    assert_eq!(code_of(d.call(ctl.create_volume(over))), Code::OutOfRange);
    // Parameters: unknown, bad value, something ironhorn does not do.
    for (key, value) in [("replicaCount", "2"), ("numberOfReplicas", "many"), ("dataEngine", "v2"), ("fsType", "ntfs")]
    {
        let mut req = create_request("pvc-codes-param", 8 << 20, 1, cap.clone());
        req.parameters.insert(key.into(), value.into());
        let err = d.call(ctl.create_volume(req)).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{key}={value}: {err:?}");
        assert!(err.message().contains(key), "the message names {key}: {}", err.message());
    }
    // Missing name / capabilities; multi-node access modes.
    assert_eq!(code_of(d.call(ctl.create_volume(create_request("", 8 << 20, 1, cap.clone())))), Code::InvalidArgument);
    let mut no_caps = create_request("pvc-codes-nocaps", 8 << 20, 1, cap.clone());
    no_caps.volume_capabilities.clear();
    assert_eq!(code_of(d.call(ctl.create_volume(no_caps))), Code::InvalidArgument);
    let mut multi = mount_cap("ext4");
    multi.access_mode = Some(AccessMode { mode: Mode::MultiNodeMultiWriter as i32 });
    let err = d.call(ctl.create_volume(create_request("pvc-codes-multi", 8 << 20, 1, multi))).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("not supported"), "{}", err.message());
    // Cannot be placed: RESOURCE_EXHAUSTED with the scheduler's reason, and
    // nothing left behind.
    let err = d.call(ctl.create_volume(create_request("pvc-codes-huge", 64 << 30, 1, cap.clone()))).unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("insufficient storage"), "{}", err.message());
    assert!(cluster.cli(&["volume", "get", "pvc-codes-huge"]).is_err(), "nothing half-created stays");
    let mut tagged = create_request("pvc-codes-tags", 8 << 20, 1, cap.clone());
    tagged.parameters.insert("diskSelector".into(), "nvme".into());
    let err = d.call(ctl.create_volume(tagged)).unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("tags"), "{}", err.message());

    // Publish: twice the same; a second node while attached → FAILED_PRECONDITION;
    // unknown volume → NOT_FOUND; missing node → INVALID_ARGUMENT.
    let ctx = publish(&d, name, "n-1", &cap);
    assert_eq!(publish(&d, name, "n-1", &cap), ctx);
    let to_b = csi::ControllerPublishVolumeRequest {
        volume_id: name.into(),
        node_id: "n-2".into(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    assert_eq!(code_of(d.call(ctl.controller_publish_volume(to_b.clone()))), Code::FailedPrecondition);
    let unknown = csi::ControllerPublishVolumeRequest { volume_id: "pvc-nope".into(), ..to_b.clone() };
    assert_eq!(code_of(d.call(ctl.controller_publish_volume(unknown))), Code::NotFound);
    let no_node = csi::ControllerPublishVolumeRequest { node_id: String::new(), ..to_b.clone() };
    assert_eq!(code_of(d.call(ctl.controller_publish_volume(no_node))), Code::InvalidArgument);
    // Deleting a published volume: FAILED_PRECONDITION.
    let del = csi::DeleteVolumeRequest { volume_id: name.into(), ..Default::default() };
    assert_eq!(code_of(d.call(ctl.delete_volume(del.clone()))), Code::FailedPrecondition);

    // Node calls twice; wrong input.
    let mut node = d.node("n-1");
    for _ in 0..2 {
        stage_and_publish(&d, name, "n-1", &cap, &ctx, &staging, &target);
    }
    assert_eq!(
        run("findmnt", &["-n", "-o", "TARGET", target.to_str().unwrap()]).unwrap().lines().count(),
        1,
        "publishing twice mounts once"
    );
    let stage_no_path = csi::NodeStageVolumeRequest {
        volume_id: name.into(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    assert_eq!(code_of(d.call(node.node_stage_volume(stage_no_path))), Code::InvalidArgument);
    let stage_no_cap = csi::NodeStageVolumeRequest {
        volume_id: name.into(),
        staging_target_path: staging.to_str().unwrap().into(),
        ..Default::default()
    };
    assert_eq!(code_of(d.call(node.node_stage_volume(stage_no_cap))), Code::InvalidArgument);
    let publish_no_target = csi::NodePublishVolumeRequest {
        volume_id: name.into(),
        staging_target_path: staging.to_str().unwrap().into(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    assert_eq!(code_of(d.call(node.node_publish_volume(publish_no_target))), Code::InvalidArgument);
    let stats_missing = csi::NodeGetVolumeStatsRequest {
        volume_id: name.into(),
        volume_path: work.join("nowhere").to_str().unwrap().into(),
        ..Default::default()
    };
    assert_eq!(code_of(d.call(node.node_get_volume_stats(stats_missing))), Code::NotFound);
    let mut stats_of_target = || {
        d.call(node.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: name.into(),
            volume_path: target.to_str().unwrap().into(),
            ..Default::default()
        }))
        .unwrap()
    };
    let stats = stats_of_target();
    assert_eq!(stats.usage.len(), 2, "bytes and inodes for a filesystem");
    assert!(stats.usage[0].total > 0 && stats.usage[1].total > 0);
    assert!(!stats.volume_condition.unwrap().abnormal);
    // Degraded (a replica wanted that three nodes cannot place apart): the
    // stats say so, with why.
    cluster.cli(&["volume", "update", name, "--replicas", "4"]).unwrap();
    cluster.wait(Duration::from_secs(30), "the volume is degraded", || {
        cluster.volume(name)["status"]["robustness"] == "degraded"
    });
    let stats = stats_of_target();
    let condition = stats.volume_condition.unwrap();
    assert!(condition.abnormal && condition.message.contains("degraded"), "{condition:?}");
    cluster.cli(&["volume", "update", name, "--replicas", "2"]).unwrap();
    cluster
        .wait(Duration::from_secs(30), "healthy again", || cluster.volume(name)["status"]["robustness"] == "healthy");
    // Read-only publish: a second target that refuses writes.
    let ro_target = work.join("target-ro");
    let _ro = Mounts(vec![ro_target.clone()]);
    d.call(node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: name.into(),
        publish_context: ctx.clone(),
        staging_target_path: staging.to_str().unwrap().into(),
        target_path: ro_target.to_str().unwrap().into(),
        volume_capability: Some(cap.clone()),
        readonly: true,
        ..Default::default()
    }))
    .unwrap();
    let refused = std::fs::write(ro_target.join("nope"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    std::fs::write(target.join("yes"), b"x").expect("the read-write target still writes");
    d.call(node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: name.into(),
        target_path: ro_target.to_str().unwrap().into(),
    }))
    .unwrap();
    // A call for a volume while another for it is in flight: ABORTED. (The
    // first waits for a device that never comes: the volume is not
    // published on n-2.)
    let waiting = {
        let socket = d.socket("n-2");
        let staging = work.join("staging-n2");
        let cap = cap.clone();
        let volume = name.to_string();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let mut node = NodeClient::new(unix_channel(&socket).await);
                node.node_stage_volume(csi::NodeStageVolumeRequest {
                    volume_id: volume,
                    publish_context: [("devicePath".to_string(), "/dev/ironhorn/not-here".to_string())].into(),
                    staging_target_path: staging.to_str().unwrap().into(),
                    volume_capability: Some(cap),
                    ..Default::default()
                })
                .await
            })
        })
    };
    let mut node_b = d.node("n-2");
    let second = csi::NodeUnstageVolumeRequest {
        volume_id: name.into(),
        staging_target_path: work.join("staging-n2").to_str().unwrap().into(),
    };
    let mut aborted = false;
    for _ in 0..100 {
        match d.call(node_b.node_unstage_volume(second.clone())) {
            Err(e) if e.code() == Code::Aborted => {
                aborted = true;
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    assert!(aborted, "a second call while the first is in flight is ABORTED");
    let first = waiting.join().unwrap().unwrap_err();
    assert_eq!(first.code(), Code::FailedPrecondition, "{first:?}");

    // Snapshots: twice the same; the same name of another volume →
    // ALREADY_EXISTS; missing source → INVALID_ARGUMENT; unknown source → NOT_FOUND.
    let snap_req = csi::CreateSnapshotRequest {
        source_volume_id: name.into(),
        name: "snapshot-codes-1".into(),
        ..Default::default()
    };
    let snap = d.call(ctl.create_snapshot(snap_req.clone())).unwrap().snapshot.unwrap();
    assert_eq!(snap.source_volume_id, name);
    cluster.wait(Duration::from_secs(60), "the snapshot is ready to use", || {
        d.call(ctl.create_snapshot(snap_req.clone())).unwrap().snapshot.unwrap().ready_to_use
    });
    let snap = d.call(ctl.create_snapshot(snap_req.clone())).unwrap().snapshot.unwrap();
    assert!(snap.creation_time.is_some());
    let other = csi::CreateSnapshotRequest { source_volume_id: "pvc-codes-odd".into(), ..snap_req.clone() };
    assert_eq!(code_of(d.call(ctl.create_snapshot(other))), Code::AlreadyExists);
    let no_source = csi::CreateSnapshotRequest { source_volume_id: String::new(), ..snap_req.clone() };
    assert_eq!(code_of(d.call(ctl.create_snapshot(no_source))), Code::InvalidArgument);
    let unknown = csi::CreateSnapshotRequest { source_volume_id: "pvc-nope".into(), ..snap_req.clone() };
    assert_eq!(code_of(d.call(ctl.create_snapshot(unknown))), Code::NotFound);
    let listed = d
        .call(ctl.list_snapshots(csi::ListSnapshotsRequest { source_volume_id: name.into(), ..Default::default() }))
        .unwrap();
    assert_eq!(listed.entries.len(), 1);
    let bad_token = csi::ListSnapshotsRequest { starting_token: "99".into(), ..Default::default() };
    assert_eq!(code_of(d.call(ctl.list_snapshots(bad_token))), Code::Aborted);
    for _ in 0..2 {
        d.call(ctl.delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: "snapshot-codes-1".into(),
            ..Default::default()
        }))
        .unwrap();
    }
    cluster.wait(Duration::from_secs(60), "the snapshot is gone", || {
        d.call(ctl.list_snapshots(csi::ListSnapshotsRequest { source_volume_id: name.into(), ..Default::default() }))
            .unwrap()
            .entries
            .is_empty()
    });

    // ListVolumes pages; GetVolume; Validate; GetCapacity per node.
    let page1 =
        d.call(ctl.list_volumes(csi::ListVolumesRequest { max_entries: 1, starting_token: String::new() })).unwrap();
    assert_eq!(page1.entries.len(), 1);
    let page2 =
        d.call(ctl.list_volumes(csi::ListVolumesRequest { max_entries: 1, starting_token: page1.next_token })).unwrap();
    assert_eq!(page2.entries.len(), 1);
    assert_ne!(
        page1.entries[0].volume.as_ref().unwrap().volume_id,
        page2.entries[0].volume.as_ref().unwrap().volume_id
    );
    let bad_token = csi::ListVolumesRequest { max_entries: 1, starting_token: "nope".into() };
    assert_eq!(code_of(d.call(ctl.list_volumes(bad_token))), Code::Aborted);
    let got = d.call(ctl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: name.into() })).unwrap();
    assert_eq!(got.status.unwrap().published_node_ids, vec!["n-1".to_string()]);
    assert_eq!(
        code_of(d.call(ctl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: "pvc-nope".into() }))),
        Code::NotFound
    );
    let validate = |caps: Vec<csi::VolumeCapability>, id: &str| csi::ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: caps,
        ..Default::default()
    };
    let ok = d.call(ctl.validate_volume_capabilities(validate(vec![cap.clone(), block_cap()], name))).unwrap();
    assert!(ok.confirmed.is_some());
    let mut ro_many = mount_cap("ext4");
    ro_many.access_mode = Some(AccessMode { mode: Mode::MultiNodeReaderOnly as i32 });
    let no = d.call(ctl.validate_volume_capabilities(validate(vec![ro_many], name))).unwrap();
    assert!(no.confirmed.is_none() && no.message.contains("not supported"));
    assert_eq!(
        code_of(d.call(ctl.validate_volume_capabilities(validate(vec![cap.clone()], "pvc-nope")))),
        Code::NotFound
    );
    assert_eq!(code_of(d.call(ctl.validate_volume_capabilities(validate(vec![], name)))), Code::InvalidArgument);
    let mut capacity = |node: &str| {
        d.call(ctl.get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![cap.clone()],
            accessible_topology: Some(csi::Topology {
                segments: [("topology.ironhorn.io/node".to_string(), node.to_string())].into(),
            }),
            ..Default::default()
        }))
        .unwrap()
        .available_capacity
    };
    let (on_1, on_2) = (capacity("n-1"), capacity("n-2"));
    assert!(on_1 > 64 << 20 && on_1 < 1 << 30, "n-1 can take a volume short of its 1 GiB disk: {on_1}");
    assert!(on_2 > 0);
    assert_eq!(capacity("n-9"), 0, "an unknown node has no capacity");

    // Undo, twice each; unknown targets and volumes are fine.
    for _ in 0..2 {
        unpublish_and_unstage(&d, name, "n-1", &staging, &target);
    }
    d.call(node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: "pvc-nope".into(),
        target_path: work.join("never").to_str().unwrap().into(),
    }))
    .unwrap();
    for id in [name, name, "pvc-nope", "pvc-codes-odd"] {
        d.call(ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.into(), ..Default::default() })).unwrap();
    }
    assert_eq!(code_of(d.call(ctl.delete_volume(csi::DeleteVolumeRequest::default()))), Code::InvalidArgument);
    assert!(lvs_of(&cluster, "pvc-codes").is_empty());
}

#[test]
fn an_ephemeral_inline_volume_lives_from_publish_to_unpublish_and_a_restarted_plugin_loses_nothing() {
    require_tool("mkfs.ext4", "e2fsprogs");
    let cluster = StandaloneCluster::start("csi-eph", 3, 31500, "1GiB");
    let mut d = Driver::start(&cluster, &["n-1"]);
    let work = cluster.dir.path().join("kubelet");
    std::fs::create_dir_all(&work).unwrap();
    let eph_target = work.join("pod-1-inline");
    let (staging, target) = (work.join("staging"), work.join("target"));
    let eph_staging = d.dir.join("n-1/state/ephemeral/csi-inline-1");
    let _mounts = Mounts(vec![eph_staging.clone(), eph_target.clone(), staging.clone(), target.clone()]);

    // Ephemeral: NodePublish with the kubelet's marker creates, attaches,
    // formats and mounts a volume; NodeUnpublish deletes it.
    let inline = csi::NodePublishVolumeRequest {
        volume_id: "csi-inline-1".into(),
        target_path: eph_target.to_str().unwrap().into(),
        volume_capability: Some(mount_cap("")),
        volume_context: [
            ("csi.storage.k8s.io/ephemeral".to_string(), "true".to_string()),
            ("size".to_string(), "24MiB".to_string()),
            ("numberOfReplicas".to_string(), "2".to_string()),
            ("csi.storage.k8s.io/pod.name".to_string(), "pod-1".to_string()),
        ]
        .into(),
        ..Default::default()
    };
    d.call(d.node("n-1").node_publish_volume(inline.clone())).expect("ephemeral NodePublishVolume");
    assert!(is_mounted(&eph_target));
    let v = cluster.volume("csi-inline-1");
    assert_eq!(v["spec"]["size"], 24 << 20);
    assert_eq!(v["spec"]["numberOfReplicas"], 2);
    assert_eq!(v["status"]["currentNodeID"], "n-1");
    let files = write_files(&eph_target);
    // The plugin restarts between publish and unpublish: the same publish
    // again is still a success and changes nothing.
    d.restart_plugin("n-1");
    d.call(d.node("n-1").node_publish_volume(inline.clone())).expect("publish again after a restart");
    assert_files(&eph_target, &files);
    d.call(d.node("n-1").node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: "csi-inline-1".into(),
        target_path: eph_target.to_str().unwrap().into(),
    }))
    .expect("ephemeral NodeUnpublishVolume");
    assert!(!is_mounted(&eph_target) && !is_mounted(&eph_staging));
    assert!(cluster.cli(&["volume", "get", "csi-inline-1"]).is_err(), "the inline volume is deleted");
    assert!(lvs_of(&cluster, "csi-inline-1").is_empty());

    // A persistent volume: the plugin restarts between stage/publish and
    // unpublish/unstage; the new one finds the mounts and undoes them.
    let cap = mount_cap("ext4");
    let name = "pvc-restart-1";
    d.call(d.controller().create_volume(create_request(name, 24 << 20, 2, cap.clone()))).unwrap();
    let ctx = publish(&d, name, "n-1", &cap);
    stage_and_publish(&d, name, "n-1", &cap, &ctx, &staging, &target);
    let files = write_files(&target);
    d.restart_plugin("n-1");
    stage_and_publish(&d, name, "n-1", &cap, &ctx, &staging, &target);
    assert_files(&target, &files);
    unpublish_and_unstage(&d, name, "n-1", &staging, &target);
    assert!(!is_mounted(&target) && !is_mounted(&staging));
    // And the data survived the whole trip: publish once more and read.
    let ctx = publish(&d, name, "n-1", &cap);
    stage_and_publish(&d, name, "n-1", &cap, &ctx, &staging, &target);
    assert_files(&target, &files);
    unpublish_and_unstage(&d, name, "n-1", &staging, &target);
    delete_volume(&d, name);
}

#[test]
fn a_mounted_volume_grows_online_under_io_and_fio_verify_passes() {
    require_tool("fio", "fio");
    require_tool("xfs_growfs", "xfsprogs");
    // xfs: growing a mounted ext4 takes CAP_SYS_RESOURCE, which this
    // machine's root lacks (a kubelet's node plugin has it); xfs_growfs
    // needs CAP_SYS_ADMIN only. mkfs.xfs wants 300 MiB at least.
    let cluster = StandaloneCluster::start("csi-grow", 3, 32000, "2GiB");
    let d = Driver::start(&cluster, &["n-1"]);
    let work = cluster.dir.path().join("kubelet");
    std::fs::create_dir_all(&work).unwrap();
    let (staging, target) = (work.join("staging"), work.join("target"));
    let _mounts = Mounts(vec![staging.clone(), target.clone()]);
    let cap = mount_cap("xfs");
    let name = "pvc-grow-1";
    d.call(d.controller().create_volume(create_request(name, 320 << 20, 2, cap.clone()))).unwrap();
    let ctx = publish(&d, name, "n-1", &cap);
    stage_and_publish(&d, name, "n-1", &cap, &ctx, &staging, &target);
    let before = df(&target);
    assert!(before <= 320 << 20, "{before}");

    // fio writes and later verifies 80 MiB at a bounded rate (≥ 10 s), so
    // the expansion happens while its writes are in flight.
    let fio = Command::new("fio")
        .args([
            "--name=grow",
            &format!("--directory={}", target.display()),
            "--size=80M",
            "--rw=randwrite",
            "--bs=4k",
            "--direct=1",
            "--ioengine=psync",
            "--rate_iops=2000",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut fio = KillOnDrop(Some(fio));
    let engine =
        cluster.json(&["engine", "list"])[0]["status"]["address"].as_str().expect("engine address").to_string();
    wait_for_writes_in_flight(&engine, fio.0.as_mut().unwrap(), 1000, Duration::from_secs(60));

    let grown = d
        .call(d.controller().controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: name.into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 512 << 20, limit_bytes: 0 }),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        }))
        .expect("ControllerExpandVolume");
    assert_eq!(grown.capacity_bytes, 512 << 20);
    assert!(grown.node_expansion_required, "a filesystem needs NodeExpandVolume");
    let node_grown = d
        .call(d.node("n-1").node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: name.into(),
            volume_path: target.to_str().unwrap().into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 512 << 20, limit_bytes: 0 }),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        }))
        .expect("NodeExpandVolume");
    assert_eq!(node_grown.capacity_bytes, 512 << 20);
    assert!(fio.0.as_mut().unwrap().try_wait().unwrap().is_none(), "fio was still writing when the expansion finished");
    let after = df(&target);
    assert!(after >= before + (180 << 20), "df shows the new size: {before} -> {after}");
    let out = fio.0.take().unwrap().wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio verify failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(cluster.volume(name)["status"]["currentSize"], 512 << 20);
    for r in cluster.replicas_of(name) {
        assert_eq!(r["spec"]["volumeSize"], 512 << 20, "replica objects record the new size");
    }
    // Expanding to the same size again is a no-op; shrinking is refused.
    let again = d
        .call(d.controller().controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: name.into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 512 << 20, limit_bytes: 0 }),
            ..Default::default()
        }))
        .unwrap();
    assert_eq!(again.capacity_bytes, 512 << 20);
    let err = cluster.cli(&["volume", "expand", name, "--size", "64MiB"]).unwrap_err();
    assert!(err.contains("never shrink"), "{err}");
    unpublish_and_unstage(&d, name, "n-1", &staging, &target);
    delete_volume(&d, name);
}

#[test]
fn a_detached_volume_grows_offline_and_attaches_at_its_new_size_with_its_data() {
    require_tool("qemu-io", "qemu-utils");
    require_tool("nbdinfo", "libnbd-bin");
    let cluster = StandaloneCluster::start("csi-grow-off", 3, 20000, "1GiB");
    cluster.cli(&["volume", "create", "g1", "--size", "32MiB", "--replicas", "3"]).unwrap();
    let endpoint = cluster.cli(&["volume", "attach", "g1", "--node", "n-1"]).unwrap().trim().to_string();
    run("qemu-io", &["-f", "raw", &endpoint, "-c", "write -P 0x5a 0 1M", "-c", "write -P 0xa5 31M 1M"]).unwrap();
    cluster.cli(&["volume", "detach", "g1"]).unwrap();
    // Detached: each replica's store is grown directly.
    cluster.cli(&["volume", "expand", "g1", "--size", "64MiB"]).unwrap();
    assert_eq!(cluster.volume("g1")["status"]["currentSize"], 64 << 20);
    let endpoint = cluster.cli(&["volume", "attach", "g1", "--node", "n-2"]).unwrap().trim().to_string();
    assert_eq!(run("nbdinfo", &["--size", &endpoint]).unwrap().trim(), (64u64 << 20).to_string());
    run(
        "qemu-io",
        &["-f", "raw", &endpoint, "-c", "read -P 0x5a 0 1M", "-c", "read -P 0xa5 31M 1M", "-c", "read -P 0 32M 32M"],
    )
    .expect("old data kept, new space zero");
    // Attached, through the engine (the NBD size a new client sees).
    cluster.cli(&["volume", "expand", "g1", "--size", "96MiB"]).unwrap();
    assert_eq!(run("nbdinfo", &["--size", &endpoint]).unwrap().trim(), (96u64 << 20).to_string());
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &endpoint,
            "-c",
            "read -P 0xa5 31M 1M",
            "-c",
            "write -P 0x77 95M 1M",
            "-c",
            "read -P 0x77 95M 1M",
        ],
    )
    .unwrap();
}

/// Reads every file under `dir` into (name → bytes).
fn read_tree(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect()
}

#[test]
fn a_snapshot_restores_and_a_live_volume_clones_into_bigger_volumes_with_exactly_their_bytes() {
    require_tool("xfs_growfs", "xfsprogs");
    // xfs (see the online-growth test); the copies share the source's
    // filesystem UUID, so they mount with nouuid beside it.
    let cluster = StandaloneCluster::start("csi-clone", 3, 20500, "3GiB");
    let d = Driver::start(&cluster, &["n-1", "n-2", "n-3"]);
    let work = cluster.dir.path().join("kubelet");
    let paths = |tag: &str| (work.join(tag).join("staging"), work.join(tag).join("target"));
    let (src_staging, src_target) = paths("src");
    let (res_staging, res_target) = paths("restore");
    let (cl_staging, cl_target) = paths("clone");
    for dir in ["src", "restore", "clone"] {
        std::fs::create_dir_all(work.join(dir)).unwrap();
    }
    let _mounts = Mounts(vec![
        src_staging.clone(),
        src_target.clone(),
        res_staging.clone(),
        res_target.clone(),
        cl_staging.clone(),
        cl_target.clone(),
    ]);
    let cap = mount_cap("xfs");
    let mut copy_cap = mount_cap("xfs");
    if let Some(AccessType::Mount(m)) = &mut copy_cap.access_type {
        m.mount_flags = vec!["nouuid".into()];
    }
    let src = "pvc-src-1";
    d.call(d.controller().create_volume(create_request(src, 320 << 20, 2, cap.clone()))).unwrap();
    let ctx = publish(&d, src, "n-1", &cap);
    stage_and_publish(&d, src, "n-1", &cap, &ctx, &src_staging, &src_target);
    let before = write_files(&src_target);
    let snap = d
        .call(d.controller().create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: src.into(),
            name: "snapshot-src-1".into(),
            ..Default::default()
        }))
        .unwrap()
        .snapshot
        .unwrap();
    cluster.wait(Duration::from_secs(60), "the snapshot is ready", || {
        d.call(
            d.controller().list_snapshots(csi::ListSnapshotsRequest {
                snapshot_id: snap.snapshot_id.clone(),
                ..Default::default()
            }),
        )
        .unwrap()
        .entries
        .first()
        .is_some_and(|e| e.snapshot.as_ref().unwrap().ready_to_use)
    });
    // Written after the snapshot: in the clone, not in the restore.
    std::fs::write(src_target.join("after-snapshot"), vec![0x5au8; 200_000]).unwrap();
    std::fs::File::open(src_target.join("after-snapshot")).unwrap().sync_all().unwrap();
    std::fs::write(src_target.join("file-0"), b"changed after the snapshot").unwrap();
    std::fs::File::open(src_target.join("file-0")).unwrap().sync_all().unwrap();
    let at_clone = read_tree(&src_target);

    let from = |id: &str, snapshot: bool| csi::VolumeContentSource {
        r#type: Some(if snapshot {
            csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource {
                snapshot_id: id.into(),
            })
        } else {
            csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: id.into() })
        }),
    };
    let restore = "pvc-restore-1";
    let made = d
        .call(d.controller().create_volume(csi::CreateVolumeRequest {
            volume_content_source: Some(from(&snap.snapshot_id, true)),
            ..create_request(restore, 400 << 20, 2, cap.clone())
        }))
        .expect("CreateVolume from a snapshot");
    assert_eq!(made.volume.unwrap().content_source, Some(from(&snap.snapshot_id, true)));
    let clone = "pvc-clone-1";
    d.call(d.controller().create_volume(csi::CreateVolumeRequest {
        volume_content_source: Some(from(src, false)),
        ..create_request(clone, 448 << 20, 2, cap.clone())
    }))
    .expect("CreateVolume from a volume");
    // A source that does not exist: NOT_FOUND; a smaller new volume: OUT_OF_RANGE.
    let err = d
        .call(d.controller().create_volume(csi::CreateVolumeRequest {
            volume_content_source: Some(from("snapshot-nope", true)),
            ..create_request("pvc-restore-bad", 400 << 20, 1, cap.clone())
        }))
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = d
        .call(d.controller().create_volume(csi::CreateVolumeRequest {
            volume_content_source: Some(from(src, false)),
            ..create_request("pvc-clone-small", 64 << 20, 1, cap.clone())
        }))
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");

    let check = |volume: &str,
                 node: &str,
                 staging: &Path,
                 target: &Path,
                 want: &std::collections::BTreeMap<String, Vec<u8>>| {
        let ctx = publish(&d, volume, node, &copy_cap);
        stage_and_publish(&d, volume, node, &copy_cap, &ctx, staging, target);
        let got = read_tree(target);
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{volume}: the files");
        for (name, bytes) in want {
            assert!(got[name] == *bytes, "{volume}: {name} differs");
        }
        let small = df(target);
        let size = cluster.volume(volume)["spec"]["size"].as_i64().unwrap();
        d.call(d.node(node).node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: volume.into(),
            volume_path: target.to_str().unwrap().into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: size, limit_bytes: 0 }),
            ..Default::default()
        }))
        .expect("NodeExpandVolume");
        let grown = df(target);
        assert!(grown >= small + (64 << 20), "{volume}: the filesystem fills the bigger volume: {small} -> {grown}");
        assert_eq!(read_tree(target).len(), want.len());
    };
    let at_snapshot: std::collections::BTreeMap<String, Vec<u8>> =
        before.iter().map(|(p, b)| (p.file_name().unwrap().to_string_lossy().into_owned(), b.clone())).collect();
    check(restore, "n-2", &res_staging, &res_target, &at_snapshot);
    check(clone, "n-3", &cl_staging, &cl_target, &at_clone);
    let restored = cluster.volume(restore);
    assert_eq!(restored["status"]["restore"]["state"], "done");
    assert_eq!(restored["status"]["restore"]["bytesDone"], 320 << 20);
    cluster.wait(Duration::from_secs(30), "the clone's own snapshot is gone", || {
        cluster.cli(&["snapshot", "list", src]).unwrap().lines().all(|l| !l.contains("pvc-clone-1-clone"))
    });
    for (volume, node, staging, target) in [
        (restore, "n-2", &res_staging, &res_target),
        (clone, "n-3", &cl_staging, &cl_target),
        (src, "n-1", &src_staging, &src_target),
    ] {
        unpublish_and_unstage(&d, volume, node, staging, target);
    }
}

#[test]
fn best_effort_data_locality_moves_a_replica_to_the_node_the_volume_is_published_on() {
    require_tool("mkfs.ext4", "e2fsprogs");
    let cluster = StandaloneCluster::start("csi-local", 3, 19000, "1GiB");
    let work = cluster.dir.path().join("kubelet");
    std::fs::create_dir_all(&work).unwrap();
    let (staging, target) = (work.join("staging"), work.join("target"));
    let _mounts = Mounts(vec![staging.clone(), target.clone()]);
    let cap = mount_cap("ext4");
    let name = "pvc-local-1";
    let mut d = Driver::start(&cluster, &["n-1"]);
    let mut req = create_request(name, 48 << 20, 2, cap.clone());
    req.parameters.insert("dataLocality".into(), "best-effort".into());
    d.call(d.controller().create_volume(req)).unwrap();
    let nodes_of = || -> Vec<String> {
        let mut n: Vec<String> =
            cluster.replicas_of(name).iter().map(|r| r["spec"]["nodeID"].as_str().unwrap().to_string()).collect();
        n.sort();
        n
    };
    let first = nodes_of();
    let away = ["n-1", "n-2", "n-3"].into_iter().find(|n| !first.iter().any(|f| f == n)).unwrap();
    d.start_plugin(away);
    let ctx = publish(&d, name, away, &cap);
    stage_and_publish(&d, name, away, &cap, &ctx, &staging, &target);
    let files = write_files(&target);
    cluster.wait(Duration::from_secs(120), "a replica on the attached node, two in all, healthy", || {
        let nodes = nodes_of();
        let v = cluster.volume(name);
        nodes.len() == 2 && nodes.iter().any(|n| n == away) && v["status"]["robustness"] == "healthy"
    });
    assert_files(&target, &files);
    let events = cluster.cli(&["event", "list", "--volume", name]).unwrap();
    assert!(events.contains("data locality"), "{events}");
    unpublish_and_unstage(&d, name, away, &staging, &target);
    // The data holds on the replicas left: publish elsewhere and read.
    let ctx = publish(&d, name, "n-1", &cap);
    let (staging, target) = (work.join("staging-2"), work.join("target-2"));
    let _more = Mounts(vec![staging.clone(), target.clone()]);
    stage_and_publish(&d, name, "n-1", &cap, &ctx, &staging, &target);
    assert_files(&target, &files);
    unpublish_and_unstage(&d, name, "n-1", &staging, &target);
}
