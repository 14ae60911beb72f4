//! The CSI Node service: stage (format when empty, mount), publish (bind
//! mount a directory, or the device node onto a file), and their undoing,
//! each idempotent and each deciding from the mount table alone, so a node
//! plugin that restarted answers exactly as the one before it. Ephemeral
//! inline volumes are created, attached and staged under the plugin's state
//! directory at publish, and deleted at unpublish.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ironhorn_proto::csi;
use ironhorn_proto::csi::node_server::Node;
use ironhorn_proto::csi::node_service_capability::Rpc;
use ironhorn_proto::csi::node_service_capability::rpc::Type as CapType;
use tonic::{Request, Response, Status};

use super::controller::{create_and_wait, volume_condition};
use super::mounts;
use super::params::{self, AccessType, EPHEMERAL_KEY, RequestError};
use super::{Busy, TOPOLOGY_KEY, required, volumes};

/// Volumes one node takes (each is a loop device and an engine here).
const MAX_VOLUMES_PER_NODE: i64 = 128;
/// How long stage waits for the engine's device node to appear.
const DEVICE_WAIT: Duration = Duration::from_secs(30);
const DEFAULT_FS: &str = "ext4";

pub struct NodeService {
    pub api: String,
    pub node_id: String,
    pub state_dir: PathBuf,
    pub busy: Busy,
}

fn device_of(volume: &str, publish_context: &std::collections::HashMap<String, String>) -> PathBuf {
    match publish_context.get("devicePath") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(format!("/dev/ironhorn/{volume}")),
    }
}

fn internal(e: String) -> Status {
    Status::internal(e)
}

async fn wait_for_device(device: &Path) -> Result<(), Status> {
    let deadline = tokio::time::Instant::now() + DEVICE_WAIT;
    while !device.exists() {
        if tokio::time::Instant::now() >= deadline {
            return Err(Status::failed_precondition(format!(
                "{} does not exist: is the volume published (attached) on this node?",
                device.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Whether the mount at `at` shows `device` (same device number).
fn shows_device(at: &mounts::MountEntry, device: &Path) -> Result<bool, Status> {
    Ok(at.device_number == mounts::device_number(device).map_err(internal)?)
}

/// Formats the device when it holds no filesystem (never otherwise) and
/// mounts it at `staging`.
async fn stage_filesystem(device: &Path, staging: &Path, fs: Option<&str>, flags: &[String]) -> Result<(), Status> {
    std::fs::create_dir_all(staging).map_err(|e| internal(format!("{}: {e}", staging.display())))?;
    if let Some(m) = mounts::mount_at(staging).map_err(internal)? {
        if shows_device(&m, device)? {
            return Ok(());
        }
        return Err(Status::already_exists(format!(
            "{} already has {} mounted, not this volume",
            staging.display(),
            m.source
        )));
    }
    let fs = match (mounts::filesystem(device).await.map_err(internal)?, fs) {
        (None, want) => {
            let fs = want.unwrap_or(DEFAULT_FS);
            mounts::mkfs(device, fs).await.map_err(internal)?;
            fs.to_string()
        }
        (Some(have), Some(want)) if have != want => {
            return Err(Status::failed_precondition(format!(
                "the volume holds a {have} filesystem, not {want}; ironhorn never reformats a volume with data"
            )));
        }
        (Some(have), _) => have,
    };
    mounts::mount(device, staging, Some(&fs), flags).await.map_err(internal)
}

/// Bind mounts `source` at `target` (a directory, or a file for a block
/// device), read-only when asked; already there is success.
async fn bind(source: &Path, target: &Path, device: &Path, block: bool, readonly: bool) -> Result<(), Status> {
    if block {
        if !target.exists() {
            std::fs::File::create(target).map_err(|e| internal(format!("{}: {e}", target.display())))?;
        }
    } else {
        std::fs::create_dir_all(target).map_err(|e| internal(format!("{}: {e}", target.display())))?;
    }
    if let Some(m) = mounts::mount_at(target).map_err(internal)? {
        if shows_device(&m, device)? {
            return Ok(());
        }
        return Err(Status::already_exists(format!("{} already has {} mounted", target.display(), m.source)));
    }
    let mut options = vec!["bind".to_string()];
    if readonly {
        options.push("ro".into());
    }
    mounts::mount(source, target, None, &options).await.map_err(internal)
}

/// Removes what publish made at `target` once nothing is mounted there.
fn remove_target(target: &Path) -> Result<(), Status> {
    let removed = match std::fs::symlink_metadata(target) {
        Err(_) => Ok(()),
        Ok(m) if m.is_dir() => std::fs::remove_dir(target),
        Ok(_) => std::fs::remove_file(target),
    };
    removed.map_err(|e| internal(format!("remove {}: {e}", target.display())))
}

impl NodeService {
    fn ephemeral_staging(&self, volume: &str) -> PathBuf {
        self.state_dir.join("ephemeral").join(volume)
    }

    /// Creates, attaches here and stages an ephemeral inline volume; on
    /// failure, undoes what it did.
    async fn ephemeral_up(
        &self,
        name: &str,
        context: &std::collections::HashMap<String, String>,
    ) -> Result<PathBuf, Status> {
        let p = params::parse_parameters(context, true)?;
        let size = p.size.unwrap_or(params::DEFAULT_SIZE);
        let result = async {
            create_and_wait(&self.api, name, size, &p, "").await?;
            let device = PathBuf::from(volumes::attach(&self.api, name, &self.node_id).await?);
            wait_for_device(&device).await?;
            let staging = self.ephemeral_staging(name);
            stage_filesystem(&device, &staging, p.fs_type, &[]).await?;
            Ok::<_, Status>(staging)
        }
        .await;
        if result.is_err() {
            let _ = self.ephemeral_down(name).await;
        }
        result
    }

    /// Unstages, detaches and deletes an ephemeral volume (each step only
    /// when still needed).
    async fn ephemeral_down(&self, name: &str) -> Result<(), Status> {
        let staging = self.ephemeral_staging(name);
        mounts::unmount(&staging).await.map_err(internal)?;
        let _ = std::fs::remove_dir(&staging);
        if volumes::get(&self.api, name).await?.is_none() {
            return Ok(());
        }
        volumes::detach(&self.api, name, true).await?;
        volumes::delete(&self.api, name).await?;
        Ok(())
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        let volume = required(&req.volume_id, "volume_id")?;
        let staging = PathBuf::from(required(&req.staging_target_path, "staging_target_path")?);
        let cap = req.volume_capability.as_ref().ok_or(RequestError::Missing("volume_capability"))?;
        let access = params::check_capability(cap)?;
        let _guard = self.busy.claim(volume)?;
        let device = device_of(volume, &req.publish_context);
        wait_for_device(&device).await?;
        if let AccessType::Mount(fs) = access {
            let flags = match &cap.access_type {
                Some(csi::volume_capability::AccessType::Mount(m)) => m.mount_flags.clone(),
                _ => Vec::new(),
            };
            stage_filesystem(&device, &staging, fs, &flags).await?;
        }
        // A block volume needs nothing staged: publish binds the device.
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        let volume = required(&req.volume_id, "volume_id")?;
        let staging = PathBuf::from(required(&req.staging_target_path, "staging_target_path")?);
        let _guard = self.busy.claim(volume)?;
        mounts::unmount(&staging).await.map_err(internal)?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let volume = required(&req.volume_id, "volume_id")?;
        let target = PathBuf::from(required(&req.target_path, "target_path")?);
        let cap = req.volume_capability.as_ref().ok_or(RequestError::Missing("volume_capability"))?;
        let access = params::check_capability(cap)?;
        let _guard = self.busy.claim(volume)?;
        if req.volume_context.get(EPHEMERAL_KEY).is_some_and(|v| v == "true") {
            if access == AccessType::Block {
                return Err(Status::invalid_argument("ephemeral inline volumes are filesystems, not block volumes"));
            }
            let name = params::volume_name(volume);
            let staging = match mounts::mount_at(&self.ephemeral_staging(&name)).map_err(internal)? {
                Some(_) => self.ephemeral_staging(&name),
                None => self.ephemeral_up(&name, &req.volume_context).await?,
            };
            let device = PathBuf::from(format!("/dev/ironhorn/{name}"));
            bind(&staging, &target, &device, false, req.readonly).await?;
            return Ok(Response::new(csi::NodePublishVolumeResponse {}));
        }
        let staging = PathBuf::from(required(&req.staging_target_path, "staging_target_path")?);
        let device = device_of(volume, &req.publish_context);
        wait_for_device(&device).await?;
        match access {
            AccessType::Block => bind(&device, &target, &device, true, req.readonly).await?,
            AccessType::Mount(_) => {
                match mounts::mount_at(&staging).map_err(internal)? {
                    Some(m) if shows_device(&m, &device)? => {}
                    _ => {
                        return Err(Status::failed_precondition(format!(
                            "volume {volume} is not staged at {}; call NodeStageVolume first",
                            staging.display()
                        )));
                    }
                }
                bind(&staging, &target, &device, false, req.readonly).await?;
            }
        }
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let volume = required(&req.volume_id, "volume_id")?;
        let target = PathBuf::from(required(&req.target_path, "target_path")?);
        let _guard = self.busy.claim(volume)?;
        mounts::unmount(&target).await.map_err(internal)?;
        remove_target(&target)?;
        let name = params::volume_name(volume);
        let staging = self.ephemeral_staging(&name);
        if staging.exists() {
            self.ephemeral_down(&name).await?;
        }
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        use csi::volume_usage::Unit;
        let req = request.into_inner();
        let volume = required(&req.volume_id, "volume_id")?;
        let path = PathBuf::from(required(&req.volume_path, "volume_path")?);
        let meta = std::fs::metadata(&path)
            .map_err(|_| Status::not_found(format!("volume path {} does not exist", path.display())))?;
        if mounts::mount_at(&path).map_err(internal)?.is_none() {
            return Err(Status::not_found(format!("nothing is published at {}", path.display())));
        }
        let usage = if std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type()) {
            let total = mounts::device_size(&path).map_err(internal)? as i64;
            vec![csi::VolumeUsage { available: 0, total, used: 0, unit: Unit::Bytes as i32 }]
        } else {
            let ((total, free, used), (itotal, ifree, iused)) = mounts::fs_usage(&path).map_err(internal)?;
            vec![
                csi::VolumeUsage {
                    available: free as i64,
                    total: total as i64,
                    used: used as i64,
                    unit: Unit::Bytes as i32,
                },
                csi::VolumeUsage {
                    available: ifree as i64,
                    total: itotal as i64,
                    used: iused as i64,
                    unit: Unit::Inodes as i32,
                },
            ]
        };
        let condition = match volumes::get(&self.api, &params::volume_name(volume)).await {
            Ok(Some(v)) => volume_condition(&v),
            Ok(None) => {
                csi::VolumeCondition { abnormal: true, message: format!("volume {volume} is unknown to the manager") }
            }
            Err(e) => {
                csi::VolumeCondition { abnormal: true, message: format!("cannot ask the manager: {}", e.message()) }
            }
        };
        Ok(Response::new(csi::NodeGetVolumeStatsResponse { usage, volume_condition: Some(condition) }))
    }

    /// Grows the filesystem on a published volume to fill its device (the
    /// engine grew the device at ControllerExpandVolume). A block volume
    /// has nothing to grow here.
    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        let volume = required(&req.volume_id, "volume_id")?;
        let path = PathBuf::from(required(&req.volume_path, "volume_path")?);
        let _guard = self.busy.claim(volume)?;
        let mount = mounts::mount_at(&path)
            .map_err(internal)?
            .ok_or_else(|| Status::not_found(format!("nothing is published at {}", path.display())))?;
        let device = PathBuf::from(format!("/dev/ironhorn/{}", params::volume_name(volume)));
        if !device.exists() || !shows_device(&mount, &device)? {
            return Err(Status::not_found(format!("volume {volume} is not what is published at {}", path.display())));
        }
        let size = mounts::device_size(&device).map_err(internal)?;
        let required_bytes = req.capacity_range.as_ref().map(|r| r.required_bytes.max(0) as u64).unwrap_or(0);
        if size < required_bytes {
            return Err(Status::failed_precondition(format!(
                "the device is {size} bytes, short of {required_bytes}: call ControllerExpandVolume first"
            )));
        }
        let block = std::fs::metadata(&path)
            .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
            .unwrap_or(false);
        if !block {
            mounts::grow(&device, &path, &mount.fs_type).await.map_err(internal)?;
        }
        Ok(Response::new(csi::NodeExpandVolumeResponse { capacity_bytes: size as i64 }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        let caps = [
            CapType::StageUnstageVolume,
            CapType::GetVolumeStats,
            CapType::VolumeCondition,
            CapType::SingleNodeMultiWriter,
        ]
        .into_iter()
        .map(|t| csi::NodeServiceCapability {
            r#type: Some(csi::node_service_capability::Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities: caps }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: MAX_VOLUMES_PER_NODE,
            accessible_topology: Some(csi::Topology {
                segments: [(TOPOLOGY_KEY.to_string(), self.node_id.clone())].into(),
            }),
        }))
    }
}
