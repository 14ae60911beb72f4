//! What a CSI request asks for, checked as pure functions: StorageClass
//! parameters (Longhorn's names), capacity ranges, access modes, and the
//! names ironhorn gives volumes and snapshots for CSI names. Every refusal is
//! a typed error naming the field, so the gRPC layer maps it to
//! INVALID_ARGUMENT / OUT_OF_RANGE without reading messages.

use std::collections::HashMap;

use ironhorn_proto::csi::volume_capability::access_mode::Mode;
use ironhorn_proto::csi::{CapacityRange, VolumeCapability, volume_capability};

/// Volumes are whole 4 KiB blocks.
pub const BLOCK: u64 = 4096;
/// What a volume gets when the request gives no capacity (Longhorn's too).
pub const DEFAULT_SIZE: u64 = 1 << 30;
/// The volume context key the kubelet sets for CSI ephemeral inline volumes.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{0} is required")]
    Missing(&'static str),
    #[error("parameter {key}: {why}")]
    BadParameter { key: String, why: String },
    #[error("parameter {0} is not one ironhorn knows (known: {KNOWN})")]
    UnknownParameter(String),
    #[error("capacity_range: {0}")]
    OutOfRange(String),
    #[error("{0}")]
    Unsupported(String),
}

/// The parameter names `parse_parameters` understands, for messages.
const KNOWN: &str = "numberOfReplicas, staleReplicaTimeout, dataLocality, diskSelector, nodeSelector, \
    replicaSoftAntiAffinity, writeQuorum, iopsLimit, bandwidthLimit, fsType, csi.storage.k8s.io/fstype, and Longhorn's fromBackup, \
    dataEngine, disableRevisionCounter, unmapMarkSnapChainRemoved, replicaAutoBalance, \
    replicaZoneSoftAntiAffinity, replicaDiskSoftAntiAffinity, backupTargetName, migratable, encrypted, \
    recurringJobSelector, nfsOptions, freezeFilesystemForSnapshot at their defaults";

/// Longhorn parameters ironhorn accepts only at values that ask for nothing
/// it does not do (their defaults, or what ironhorn does anyway).
const LONGHORN_AT_DEFAULT: &[(&str, &[&str])] = &[
    ("fromBackup", &[""]),
    ("dataEngine", &["", "v1"]),
    // ironhorn has no revision counter: its election uses flush stamps.
    ("disableRevisionCounter", &["", "true"]),
    ("unmapMarkSnapChainRemoved", &["", "ignored", "disabled"]),
    ("replicaAutoBalance", &["", "ignored", "disabled"]),
    ("replicaZoneSoftAntiAffinity", &["", "ignored"]),
    ("replicaDiskSoftAntiAffinity", &["", "ignored"]),
    ("backupTargetName", &["", "default"]),
    ("migratable", &["", "false"]),
    ("encrypted", &["", "false"]),
    ("recurringJobSelector", &["", "[]"]),
    ("nfsOptions", &[""]),
    ("freezeFilesystemForSnapshot", &["", "ignored"]),
];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataLocality {
    #[default]
    Disabled,
    BestEffort,
}

/// A StorageClass's parameters (or an ephemeral volume's attributes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeParams {
    pub number_of_replicas: Option<u32>,
    /// Minutes.
    pub stale_replica_timeout: Option<u64>,
    pub data_locality: DataLocality,
    pub disk_selector: Vec<String>,
    pub node_selector: Vec<String>,
    /// "enabled" / "disabled"; None: the cluster setting.
    pub replica_soft_anti_affinity: Option<&'static str>,
    /// "one" / "majority"; None: the cluster setting.
    pub write_quorum: Option<&'static str>,
    /// ext4 or xfs; None: not given.
    pub fs_type: Option<&'static str>,
    /// An ephemeral inline volume's size (its `size` attribute).
    pub size: Option<u64>,
    /// Requests and bytes per second (None: unlimited).
    pub iops_limit: Option<u64>,
    pub bandwidth_limit: Option<u64>,
    /// The claim it is made for, when the provisioner says (metrics labels).
    pub pvc_name: String,
    pub pvc_namespace: String,
}

fn bad(key: &str, why: impl Into<String>) -> RequestError {
    RequestError::BadParameter { key: key.to_string(), why: why.into() }
}

fn tag_list(key: &str, value: &str) -> Result<Vec<String>, RequestError> {
    let tags: Vec<String> = value.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_string).collect();
    for t in &tags {
        if !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.') {
            return Err(bad(key, format!("tag {t:?}: use letters, digits, '-', '_' and '.'")));
        }
    }
    Ok(tags)
}

pub fn fs_type(key: &str, value: &str) -> Result<Option<&'static str>, RequestError> {
    match value {
        "" => Ok(None),
        "ext4" => Ok(Some("ext4")),
        "xfs" => Ok(Some("xfs")),
        other => Err(bad(key, format!("{other:?}: ironhorn formats ext4 or xfs"))),
    }
}

/// Parses StorageClass parameters. `ephemeral` also allows `size` (an
/// inline volume has no capacity range) and the kubelet's own keys.
pub fn parse_parameters(params: &HashMap<String, String>, ephemeral: bool) -> Result<VolumeParams, RequestError> {
    let mut out = VolumeParams::default();
    let mut keys: Vec<&String> = params.keys().collect();
    keys.sort();
    for key in keys {
        let value = params[key].as_str();
        match key.as_str() {
            "numberOfReplicas" => {
                let n: u32 = value.parse().map_err(|_| bad(key, format!("{value:?} is not a number")))?;
                if !(1..=20).contains(&n) {
                    return Err(bad(key, format!("{n}: must be 1 to 20")));
                }
                out.number_of_replicas = Some(n);
            }
            "staleReplicaTimeout" => {
                let minutes: u64 =
                    value.parse().map_err(|_| bad(key, format!("{value:?} is not a number of minutes")))?;
                out.stale_replica_timeout = Some(minutes);
            }
            "dataLocality" => {
                out.data_locality = match value {
                    "" | "disabled" => DataLocality::Disabled,
                    "best-effort" => DataLocality::BestEffort,
                    "strict-local" => {
                        return Err(bad(key, "strict-local is not supported by ironhorn (use best-effort)"));
                    }
                    other => return Err(bad(key, format!("{other:?}: use disabled or best-effort"))),
                }
            }
            "diskSelector" => out.disk_selector = tag_list(key, value)?,
            "nodeSelector" => out.node_selector = tag_list(key, value)?,
            "replicaSoftAntiAffinity" => {
                out.replica_soft_anti_affinity = match value {
                    "" | "ignored" => None,
                    "enabled" | "true" => Some("enabled"),
                    "disabled" | "false" => Some("disabled"),
                    other => return Err(bad(key, format!("{other:?}: use ignored, enabled or disabled"))),
                }
            }
            "writeQuorum" => {
                out.write_quorum = match value {
                    "" => None,
                    "one" => Some("one"),
                    "majority" => Some("majority"),
                    other => return Err(bad(key, format!("{other:?}: use one or majority"))),
                }
            }
            "fsType" | "csi.storage.k8s.io/fstype" => {
                let fs = fs_type(key, value)?;
                if fs.is_some() {
                    out.fs_type = fs;
                }
            }
            "size" if ephemeral => {
                let bytes = ironhorn_proto::units::parse_size(value).map_err(|e| bad(key, e))?;
                out.size = Some(bytes.div_ceil(BLOCK) * BLOCK);
            }
            "iopsLimit" => {
                let n: u64 =
                    value.parse().map_err(|_| bad(key, format!("{value:?} is not a number of requests per second")))?;
                out.iops_limit = Some(n);
            }
            "bandwidthLimit" => {
                out.bandwidth_limit = Some(ironhorn_proto::units::parse_size(value).map_err(|e| bad(key, e))?);
            }
            "csi.storage.k8s.io/pvc/name" => out.pvc_name = value.to_string(),
            "csi.storage.k8s.io/pvc/namespace" => out.pvc_namespace = value.to_string(),
            // What the sidecars and the kubelet add (the PV's name, the
            // ephemeral marker, the pod's identity).
            k if k.starts_with("csi.storage.k8s.io/") => {}
            k => match LONGHORN_AT_DEFAULT.iter().find(|(name, _)| *name == k) {
                Some((_, allowed)) if allowed.contains(&value) => {}
                Some((_, allowed)) => {
                    return Err(bad(
                        key,
                        format!("{value:?} asks for something ironhorn does not do; accepted: {allowed:?}"),
                    ));
                }
                None => return Err(RequestError::UnknownParameter(k.to_string())),
            },
        }
    }
    if ephemeral && out.size.is_none() {
        out.size = Some(DEFAULT_SIZE);
    }
    Ok(out)
}

/// The volume size for a capacity range: `required_bytes` rounded up to a
/// whole block (the default size when none is given), and never above
/// `limit_bytes`.
pub fn size_for(range: Option<&CapacityRange>) -> Result<u64, RequestError> {
    let (required, limit) = range.map(|r| (r.required_bytes, r.limit_bytes)).unwrap_or((0, 0));
    if required < 0 || limit < 0 {
        return Err(RequestError::OutOfRange(format!("negative bytes (required {required}, limit {limit})")));
    }
    let (required, limit) = (required as u64, limit as u64);
    let size = match (required, limit) {
        (0, 0) => DEFAULT_SIZE,
        (0, l) => l.min(DEFAULT_SIZE) / BLOCK * BLOCK,
        (r, _) => r.div_ceil(BLOCK) * BLOCK,
    };
    if size == 0 {
        return Err(RequestError::OutOfRange(format!("limit_bytes {limit} is below one {BLOCK}-byte block")));
    }
    if limit != 0 && size > limit {
        return Err(RequestError::OutOfRange(format!(
            "required_bytes {required} rounds up to {size} (whole {BLOCK}-byte blocks), above limit_bytes {limit}"
        )));
    }
    Ok(size)
}

/// Whether an existing volume of `size` satisfies a capacity range.
pub fn size_fits(size: u64, range: Option<&CapacityRange>) -> bool {
    let (required, limit) =
        range.map(|r| (r.required_bytes.max(0) as u64, r.limit_bytes.max(0) as u64)).unwrap_or((0, 0));
    size >= required && (limit == 0 || size <= limit)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessType {
    Block,
    /// A filesystem (its type when the capability names one).
    Mount(Option<&'static str>),
}

/// Checks one capability: an access type and a single-node access mode.
pub fn check_capability(cap: &VolumeCapability) -> Result<AccessType, RequestError> {
    let mode =
        cap.access_mode.as_ref().map(|m| m.mode()).ok_or(RequestError::Missing("volume_capability.access_mode"))?;
    match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => {}
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter => {
            return Err(RequestError::Unsupported(format!(
                "access mode {}: ironhorn volumes are attached to one node at a time; multi-node access modes are not supported",
                mode.as_str_name()
            )));
        }
        Mode::Unknown => return Err(RequestError::Unsupported("access mode UNKNOWN: give one".into())),
    }
    match &cap.access_type {
        Some(volume_capability::AccessType::Block(_)) => Ok(AccessType::Block),
        Some(volume_capability::AccessType::Mount(m)) => Ok(AccessType::Mount(fs_type("fs_type", &m.fs_type)?)),
        None => Err(RequestError::Missing("volume_capability.access_type (block or mount)")),
    }
}

pub fn check_capabilities(caps: &[VolumeCapability]) -> Result<Vec<AccessType>, RequestError> {
    if caps.is_empty() {
        return Err(RequestError::Missing("volume_capabilities"));
    }
    caps.iter().map(check_capability).collect()
}

/// A DNS-1123 label of at most `max` bytes.
fn is_label(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// FNV-1a, 64 bits: a stable short digest for names that cannot be used as
/// they are.
fn digest(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The volume name for a CSI name: the name itself when it is a valid
/// volume name (`pvc-<uuid>` is), otherwise `csi-` and a digest of it, so
/// the same CSI name always maps to the same volume.
pub fn volume_name(csi_name: &str) -> String {
    if is_label(csi_name, 40) && crate::api::valid_volume_name(csi_name) {
        csi_name.to_string()
    } else {
        format!("csi-{:016x}", digest(csi_name))
    }
}

/// The snapshot name for a CSI snapshot name, the same way.
pub fn snapshot_name(csi_name: &str) -> String {
    if is_label(csi_name, 63) && !csi_name.starts_with("ironhorn-rebuild-") {
        csi_name.to_string()
    } else {
        format!("csi-snap-{:016x}", digest(csi_name))
    }
}

/// A page of `total` entries from `starting_token` (an index this plugin
/// handed out), at most `max_entries` (0 = all): (start, end, next token).
pub fn page(total: usize, max_entries: i32, starting_token: &str) -> Result<(usize, usize, String), String> {
    if max_entries < 0 {
        return Err(format!("max_entries {max_entries} is negative"));
    }
    let start = if starting_token.is_empty() {
        0
    } else {
        match starting_token.parse::<usize>() {
            Ok(n) if n <= total => n,
            _ => return Err(format!("starting_token {starting_token:?} is not one this plugin handed out")),
        }
    };
    let end = if max_entries == 0 { total } else { (start + max_entries as usize).min(total) };
    let next = if end < total { end.to_string() } else { String::new() };
    Ok((start, end, next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironhorn_proto::csi::volume_capability::{AccessMode, AccessType as Pb, BlockVolume, MountVolume};

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn longhorns_default_storage_class_parameters_are_accepted() {
        let p = parse_parameters(
            &params(&[
                ("numberOfReplicas", "3"),
                ("staleReplicaTimeout", "2880"),
                ("fromBackup", ""),
                ("fsType", "ext4"),
                ("dataLocality", "disabled"),
                ("unmapMarkSnapChainRemoved", "ignored"),
                ("disableRevisionCounter", "true"),
                ("dataEngine", "v1"),
                ("csi.storage.k8s.io/pvc/name", "data"),
            ]),
            false,
        )
        .unwrap();
        assert_eq!(p.number_of_replicas, Some(3));
        assert_eq!(p.stale_replica_timeout, Some(2880));
        assert_eq!(p.fs_type, Some("ext4"));
        assert_eq!(p.data_locality, DataLocality::Disabled);
        assert_eq!(p.pvc_name, "data");
    }

    #[test]
    fn io_limits_are_read_and_bad_ones_named() {
        let p = parse_parameters(&params(&[("iopsLimit", "500"), ("bandwidthLimit", "100MiB")]), false).unwrap();
        assert_eq!((p.iops_limit, p.bandwidth_limit), (Some(500), Some(100 << 20)));
        for (key, value) in [("iopsLimit", "lots"), ("bandwidthLimit", "fast")] {
            let e = parse_parameters(&params(&[(key, value)]), false).unwrap_err();
            assert!(e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn what_ironhorn_does_not_do_is_refused_by_name() {
        for (key, value) in [
            ("dataEngine", "v2"),
            ("fromBackup", "s3://bucket?backup=b1"),
            ("migratable", "true"),
            ("encrypted", "true"),
            ("dataLocality", "strict-local"),
            ("numberOfReplicas", "0"),
            ("numberOfReplicas", "three"),
            ("fsType", "btrfs"),
            ("diskSelector", "ssd;fast"),
        ] {
            let err = parse_parameters(&params(&[(key, value)]), false).unwrap_err();
            assert!(matches!(&err, RequestError::BadParameter { key: k, .. } if k == key), "{key}={value}: {err}");
        }
        let err = parse_parameters(&params(&[("replicaCount", "3")]), false).unwrap_err();
        assert_eq!(err, RequestError::UnknownParameter("replicaCount".into()));
        assert!(parse_parameters(&params(&[("size", "1Gi")]), false).is_err(), "size is for inline volumes");
    }

    #[test]
    fn selectors_and_inline_sizes_parse() {
        let p = parse_parameters(&params(&[("diskSelector", "ssd, fast"), ("nodeSelector", "")]), false).unwrap();
        assert_eq!(p.disk_selector, vec!["ssd".to_string(), "fast".to_string()]);
        assert!(p.node_selector.is_empty());
        let p = parse_parameters(&params(&[("size", "10MiB"), (EPHEMERAL_KEY, "true")]), true).unwrap();
        assert_eq!(p.size, Some(10 << 20));
        assert_eq!(parse_parameters(&params(&[]), true).unwrap().size, Some(DEFAULT_SIZE));
    }

    #[test]
    fn capacity_rounds_up_to_blocks_and_honours_the_limit() {
        let range = |r, l| Some(CapacityRange { required_bytes: r, limit_bytes: l });
        assert_eq!(size_for(None).unwrap(), DEFAULT_SIZE);
        assert_eq!(size_for(range(1, 0).as_ref()).unwrap(), BLOCK);
        assert_eq!(size_for(range(4097, 8192).as_ref()).unwrap(), 8192);
        assert_eq!(size_for(range(0, 10_000).as_ref()).unwrap(), 8192);
        assert!(matches!(size_for(range(4097, 5000).as_ref()), Err(RequestError::OutOfRange(_))));
        assert!(matches!(size_for(range(0, 100).as_ref()), Err(RequestError::OutOfRange(_))));
        assert!(matches!(size_for(range(-1, 0).as_ref()), Err(RequestError::OutOfRange(_))));
        assert!(size_fits(8192, range(4097, 0).as_ref()));
        assert!(!size_fits(8192, range(0, 4096).as_ref()));
    }

    #[test]
    fn single_node_modes_of_either_access_type_pass_and_multi_node_ones_do_not() {
        let cap = |mode: Mode, block: bool| VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(if block {
                Pb::Block(BlockVolume {})
            } else {
                Pb::Mount(MountVolume { fs_type: "xfs".into(), ..Default::default() })
            }),
        };
        assert_eq!(check_capability(&cap(Mode::SingleNodeWriter, true)).unwrap(), AccessType::Block);
        assert_eq!(check_capability(&cap(Mode::SingleNodeMultiWriter, false)).unwrap(), AccessType::Mount(Some("xfs")));
        for mode in [Mode::MultiNodeReaderOnly, Mode::MultiNodeSingleWriter, Mode::MultiNodeMultiWriter] {
            let err = check_capability(&cap(mode, false)).unwrap_err();
            assert!(matches!(&err, RequestError::Unsupported(m) if m.contains("not supported")), "{err}");
        }
        let mut no_type = cap(Mode::SingleNodeWriter, true);
        no_type.access_type = None;
        assert!(matches!(check_capability(&no_type), Err(RequestError::Missing(_))));
        assert!(matches!(check_capabilities(&[]), Err(RequestError::Missing("volume_capabilities"))));
    }

    #[test]
    fn csi_names_map_to_valid_stable_names() {
        assert_eq!(volume_name("pvc-0b6e5a3c-1c1f-4f0e-9a59-1c2d3e4f5a6b"), "pvc-0b6e5a3c-1c1f-4f0e-9a59-1c2d3e4f5a6b");
        let odd = volume_name("My Volume/Ω");
        assert!(crate::api::valid_volume_name(&odd), "{odd}");
        assert_eq!(odd, volume_name("My Volume/Ω"));
        assert_ne!(odd, volume_name("My Volume/Ω2"));
        assert_eq!(snapshot_name("snapshot-1234"), "snapshot-1234");
        assert!(snapshot_name("ironhorn-rebuild-x").starts_with("csi-snap-"));
    }

    #[test]
    fn pages_hand_out_tokens_and_refuse_strange_ones() {
        assert_eq!(page(5, 2, "").unwrap(), (0, 2, "2".into()));
        assert_eq!(page(5, 2, "4").unwrap(), (4, 5, String::new()));
        assert_eq!(page(5, 0, "").unwrap(), (0, 5, String::new()));
        assert!(page(5, 2, "6").is_err());
        assert!(page(5, 2, "x").is_err());
        assert!(page(5, -1, "").is_err());
    }
}
