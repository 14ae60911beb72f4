//! Replica placement, as pure functions of a snapshot of the cluster.
//!
//! A disk can take a replica of `size` bytes when its node is ready and
//! schedulable, the disk is schedulable, the node and disk carry every tag the
//! volume selects, and
//!   size + scheduled ≤ (maximum − reserved) × overProvisioning% / 100, and
//!   available − size > maximum × minimalAvailable% / 100.
//! Anti-affinity (node, zone, disk) keeps replicas of one volume apart: hard
//! excludes a candidate that shares the node/zone/disk with another replica
//! of the volume; soft only ranks it lower. Among the candidates left, the one
//! with the fewest shared domains wins, then the most available space, then
//! the name (so the result is deterministic).
//!
//! When no disk fits, the error names the rule that removed the last
//! candidates: no ready node, tags, anti-affinity, or insufficient storage.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCandidate {
    pub node: String,
    pub disk: String,
    pub zone: String,
    pub node_ready: bool,
    pub node_allow_scheduling: bool,
    pub disk_ready: bool,
    pub disk_allow_scheduling: bool,
    pub node_tags: Vec<String>,
    pub disk_tags: Vec<String>,
    pub maximum: u64,
    pub available: u64,
    pub reserved: u64,
    /// Bytes the stores already placed on this disk take (not their
    /// volumes' sizes: a store is larger, see `Request::size`).
    pub scheduled: u64,
}

/// Where this volume's other replicas already are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placed {
    pub node: String,
    pub disk: String,
    pub zone: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Bytes the new replica's store takes on the disk: the volume plus the
    /// store's journal, checkpoints and snapshot headroom (about 1.25× and
    /// more for small volumes), so a placement that fits here also fits
    /// when the LV is created.
    pub size: u64,
    pub node_selector: Vec<String>,
    pub disk_selector: Vec<String>,
    pub node_soft: bool,
    pub zone_soft: bool,
    pub disk_soft: bool,
    pub placed: Vec<Placed>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub over_provisioning_percentage: u64,
    pub minimal_available_percentage: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { over_provisioning_percentage: 100, minimal_available_percentage: 25 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unschedulable {
    NoReadyNode,
    TagsNotFulfilled { node_selector: Vec<String>, disk_selector: Vec<String> },
    AntiAffinity,
    InsufficientStorage { size: u64 },
}

impl Unschedulable {
    /// Machine-readable reason for a condition.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoReadyNode => "NoReadyNode",
            Self::TagsNotFulfilled { .. } => "TagsNotFulfilled",
            Self::AntiAffinity => "ReplicaAntiAffinity",
            Self::InsufficientStorage { .. } => "InsufficientStorage",
        }
    }
}

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoReadyNode => write!(f, "no ready node with a schedulable disk"),
            Self::TagsNotFulfilled { node_selector, disk_selector } => {
                write!(
                    f,
                    "tags not fulfilled: no node with tags {node_selector:?} and disk with tags {disk_selector:?}"
                )
            }
            Self::AntiAffinity => {
                write!(f, "anti-affinity: every usable node (or zone, disk) already holds a replica of this volume")
            }
            Self::InsufficientStorage { size } => {
                write!(f, "insufficient storage: no disk can take {size} more bytes within its limits")
            }
        }
    }
}

pub fn has_tags(have: &[String], want: &[String]) -> bool {
    want.iter().all(|t| have.contains(t))
}

/// The space rule alone.
pub fn fits(candidate: &DiskCandidate, size: u64, limits: Limits) -> bool {
    let usable = candidate.maximum.saturating_sub(candidate.reserved) as u128;
    let ceiling = usable * limits.over_provisioning_percentage as u128 / 100;
    let scheduled_ok = size as u128 + candidate.scheduled as u128 <= ceiling;
    let floor = candidate.maximum as u128 * limits.minimal_available_percentage as u128 / 100;
    let available_ok = (candidate.available as u128) > floor + size as u128;
    scheduled_ok && available_ok
}

/// How many of (node, zone, disk) this candidate shares with placed replicas.
fn shared(candidate: &DiskCandidate, placed: &[Placed]) -> (bool, bool, bool) {
    let node = placed.iter().any(|p| p.node == candidate.node);
    let zone = !candidate.zone.is_empty() && placed.iter().any(|p| p.zone == candidate.zone);
    let disk = placed.iter().any(|p| p.node == candidate.node && p.disk == candidate.disk);
    (node, zone, disk)
}

/// Chooses a disk for one replica.
pub fn schedule_replica<'a>(
    request: &Request,
    candidates: &'a [DiskCandidate],
    limits: Limits,
) -> Result<&'a DiskCandidate, Unschedulable> {
    let ready: Vec<&DiskCandidate> = candidates
        .iter()
        .filter(|c| c.node_ready && c.node_allow_scheduling && c.disk_ready && c.disk_allow_scheduling)
        .collect();
    if ready.is_empty() {
        return Err(Unschedulable::NoReadyNode);
    }
    let tagged: Vec<&DiskCandidate> = ready
        .into_iter()
        .filter(|c| has_tags(&c.node_tags, &request.node_selector) && has_tags(&c.disk_tags, &request.disk_selector))
        .collect();
    if tagged.is_empty() {
        return Err(Unschedulable::TagsNotFulfilled {
            node_selector: request.node_selector.clone(),
            disk_selector: request.disk_selector.clone(),
        });
    }
    let apart: Vec<&DiskCandidate> = tagged
        .into_iter()
        .filter(|c| {
            let (node, zone, disk) = shared(c, &request.placed);
            !(node && !request.node_soft) && !(zone && !request.zone_soft) && !(disk && !request.disk_soft)
        })
        .collect();
    if apart.is_empty() {
        return Err(Unschedulable::AntiAffinity);
    }
    apart
        .into_iter()
        .filter(|c| fits(c, request.size, limits))
        .min_by(|a, b| {
            let rank = |c: &DiskCandidate| {
                let (node, zone, disk) = shared(c, &request.placed);
                node as u8 + zone as u8 + disk as u8
            };
            rank(a)
                .cmp(&rank(b))
                .then(b.available.cmp(&a.available))
                .then_with(|| (&a.node, &a.disk).cmp(&(&b.node, &b.disk)))
        })
        .ok_or(Unschedulable::InsufficientStorage { size: request.size })
}

/// Places `count` replicas, each seeing the ones placed before it (all or
/// nothing: the caller creates nothing when this fails).
pub fn schedule_replicas(
    request: &Request,
    count: usize,
    candidates: &[DiskCandidate],
    limits: Limits,
) -> Result<Vec<Placed>, Unschedulable> {
    let mut candidates = candidates.to_vec();
    let mut request = request.clone();
    let mut chosen = Vec::new();
    for _ in 0..count {
        let pick = schedule_replica(&request, &candidates, limits)?.clone();
        let placed = Placed { node: pick.node.clone(), disk: pick.disk.clone(), zone: pick.zone.clone() };
        for c in candidates.iter_mut().filter(|c| c.node == pick.node && c.disk == pick.disk) {
            c.scheduled += request.size;
            c.available = c.available.saturating_sub(request.size);
        }
        request.placed.push(placed.clone());
        chosen.push(placed);
    }
    Ok(chosen)
}

/// The largest volume (a multiple of 4096 bytes) one replica of which could
/// still be placed on some disk of `candidates` that is ready, schedulable
/// and carries the tags, where `store_bytes(size)` is what the replica's
/// store takes on the disk for a volume of `size` (monotonic). 0: none.
/// What CSI's GetCapacity reports for a node or the whole cluster.
pub fn largest_volume(
    candidates: &[DiskCandidate],
    node_selector: &[String],
    disk_selector: &[String],
    limits: Limits,
    store_bytes: impl Fn(u64) -> u64,
) -> u64 {
    const BLOCK: u64 = 4096;
    candidates
        .iter()
        .filter(|c| c.node_ready && c.node_allow_scheduling && c.disk_ready && c.disk_allow_scheduling)
        .filter(|c| has_tags(&c.node_tags, node_selector) && has_tags(&c.disk_tags, disk_selector))
        .map(|c| {
            // Binary search over block counts: fits(store_bytes(n·BLOCK)).
            let (mut lo, mut hi) = (0u64, c.maximum / BLOCK + 1);
            while lo + 1 < hi {
                let mid = lo + (hi - lo) / 2;
                if fits(c, store_bytes(mid * BLOCK), limits) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            lo * BLOCK
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    fn disk(node: &str, zone: &str, maximum: u64, available: u64) -> DiskCandidate {
        DiskCandidate {
            node: node.into(),
            disk: "d".into(),
            zone: zone.into(),
            node_ready: true,
            node_allow_scheduling: true,
            disk_ready: true,
            disk_allow_scheduling: true,
            node_tags: vec![],
            disk_tags: vec![],
            maximum,
            available,
            reserved: 0,
            scheduled: 0,
        }
    }

    fn request(size: u64) -> Request {
        Request {
            size,
            node_selector: vec![],
            disk_selector: vec![],
            node_soft: false,
            zone_soft: true,
            disk_soft: true,
            placed: vec![],
        }
    }

    #[test]
    fn three_replicas_land_on_three_nodes() {
        let disks = [
            disk("n1", "", 10 * GIB, 10 * GIB),
            disk("n2", "", 10 * GIB, 10 * GIB),
            disk("n3", "", 10 * GIB, 10 * GIB),
        ];
        let placed = schedule_replicas(&request(GIB), 3, &disks, Limits::default()).unwrap();
        let mut nodes: Vec<_> = placed.iter().map(|p| p.node.clone()).collect();
        nodes.sort();
        assert_eq!(nodes, ["n1", "n2", "n3"]);
        // A fourth replica has nowhere to go under hard anti-affinity...
        assert_eq!(schedule_replicas(&request(GIB), 4, &disks, Limits::default()), Err(Unschedulable::AntiAffinity));
        // ...and shares a node when the volume asks for soft anti-affinity.
        let soft = Request { node_soft: true, ..request(GIB) };
        assert_eq!(schedule_replicas(&soft, 4, &disks, Limits::default()).unwrap().len(), 4);
    }

    #[test]
    fn reasons_name_the_rule() {
        let disks = [disk("n1", "", 10 * GIB, 10 * GIB)];
        assert_eq!(
            schedule_replica(&request(20 * GIB), &disks, Limits::default()),
            Err(Unschedulable::InsufficientStorage { size: 20 * GIB })
        );
        let tagged = Request { node_selector: vec!["ssd".into()], ..request(GIB) };
        assert!(matches!(
            schedule_replica(&tagged, &disks, Limits::default()),
            Err(Unschedulable::TagsNotFulfilled { .. })
        ));
        let mut down = disks.clone();
        down[0].node_ready = false;
        assert_eq!(schedule_replica(&request(GIB), &down, Limits::default()), Err(Unschedulable::NoReadyNode));
    }

    #[test]
    fn minimal_available_and_over_provisioning() {
        // 10 GiB disk, 25 % must stay available: 7 GiB leaves 3 > 2.5 → fits;
        // 8 GiB leaves 2 → does not.
        let d = disk("n1", "", 10 * GIB, 10 * GIB);
        assert!(fits(&d, 7 * GIB, Limits::default()));
        assert!(!fits(&d, 8 * GIB, Limits::default()));
        // Over-provisioning 200 % lets scheduled exceed the maximum while real
        // free space stays above the floor.
        let thin = DiskCandidate { scheduled: 9 * GIB, ..d.clone() };
        assert!(!fits(&thin, 2 * GIB, Limits::default()));
        assert!(fits(&thin, 2 * GIB, Limits { over_provisioning_percentage: 200, minimal_available_percentage: 25 }));
        // Reserved space comes off the maximum.
        let reserved = DiskCandidate { reserved: 5 * GIB, ..d };
        assert!(!fits(&reserved, 6 * GIB, Limits::default()));
    }

    #[test]
    fn zones_spread_when_possible() {
        let disks = [
            disk("a1", "za", 10 * GIB, 10 * GIB),
            disk("a2", "za", 10 * GIB, 10 * GIB),
            disk("b1", "zb", 10 * GIB, 9 * GIB),
        ];
        let placed = schedule_replicas(&request(GIB), 2, &disks, Limits::default()).unwrap();
        let zones: std::collections::BTreeSet<_> = placed.iter().map(|p| p.zone.clone()).collect();
        assert_eq!(zones.len(), 2, "{placed:?}");
        let hard = Request { zone_soft: false, ..request(GIB) };
        assert_eq!(schedule_replicas(&hard, 3, &disks, Limits::default()), Err(Unschedulable::AntiAffinity));
    }

    fn arb_candidate() -> impl Strategy<Value = DiskCandidate> {
        (
            0..5u8,
            0..2u8,
            0..3u8,
            any::<[bool; 4]>(),
            proptest::collection::vec(0..3u8, 0..3),
            proptest::collection::vec(0..3u8, 0..3),
            1..100u64,
            0..100u64,
            0..30u64,
            0..150u64,
        )
            .prop_map(|(node, disk, zone, ready, ntags, dtags, maximum, avail, reserved, scheduled)| {
                DiskCandidate {
                    node: format!("n{node}"),
                    disk: format!("d{disk}"),
                    zone: if zone == 0 { String::new() } else { format!("z{zone}") },
                    node_ready: ready[0] || ready[1],
                    node_allow_scheduling: ready[1] || ready[2],
                    disk_ready: true,
                    disk_allow_scheduling: ready[3] || ready[0],
                    node_tags: ntags.into_iter().map(|t| format!("t{t}")).collect(),
                    disk_tags: dtags.into_iter().map(|t| format!("t{t}")).collect(),
                    maximum: maximum * GIB,
                    available: avail.min(maximum) * GIB,
                    reserved: reserved * GIB,
                    scheduled: scheduled * GIB,
                }
            })
    }

    /// The rules restated plainly, one candidate at a time: the oracle.
    fn admissible(c: &DiskCandidate, r: &Request, limits: Limits) -> bool {
        let node_shared = r.placed.iter().any(|p| p.node == c.node);
        let zone_shared = !c.zone.is_empty() && r.placed.iter().any(|p| p.zone == c.zone);
        let disk_shared = r.placed.iter().any(|p| p.node == c.node && p.disk == c.disk);
        let usable = c.maximum.saturating_sub(c.reserved) as u128 * limits.over_provisioning_percentage as u128 / 100;
        c.node_ready
            && c.node_allow_scheduling
            && c.disk_ready
            && c.disk_allow_scheduling
            && r.node_selector.iter().all(|t| c.node_tags.contains(t))
            && r.disk_selector.iter().all(|t| c.disk_tags.contains(t))
            && (r.node_soft || !node_shared)
            && (r.zone_soft || !zone_shared)
            && (r.disk_soft || !disk_shared)
            && r.size as u128 + c.scheduled as u128 <= usable
            && c.available as u128
                > c.maximum as u128 * limits.minimal_available_percentage as u128 / 100 + r.size as u128
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// A placement exists exactly when the oracle admits some candidate,
        /// and the chosen one is always admissible.
        #[test]
        fn placement_matches_the_rules(
            candidates in proptest::collection::vec(arb_candidate(), 0..8),
            size in 1..40u64,
            node_selector in proptest::collection::vec(0..3u8, 0..2),
            disk_selector in proptest::collection::vec(0..3u8, 0..2),
            soft in any::<[bool; 3]>(),
            placed_idx in proptest::collection::vec(0..8usize, 0..3),
            over in prop_oneof![Just(100u64), Just(200u64)],
            minimal in prop_oneof![Just(25u64), Just(0u64), Just(10u64)],
        ) {
            let placed = placed_idx.iter().filter_map(|&i| candidates.get(i)).map(|c| Placed {
                node: c.node.clone(), disk: c.disk.clone(), zone: c.zone.clone(),
            }).collect();
            let request = Request {
                size: size * GIB,
                node_selector: node_selector.into_iter().map(|t| format!("t{t}")).collect(),
                disk_selector: disk_selector.into_iter().map(|t| format!("t{t}")).collect(),
                node_soft: soft[0], zone_soft: soft[1], disk_soft: soft[2],
                placed,
            };
            let limits = Limits { over_provisioning_percentage: over, minimal_available_percentage: minimal };
            let any_admissible = candidates.iter().any(|c| admissible(c, &request, limits));
            match schedule_replica(&request, &candidates, limits) {
                Ok(chosen) => {
                    prop_assert!(admissible(chosen, &request, limits), "chose an inadmissible disk {chosen:?}");
                    // Hard node anti-affinity is never broken.
                    if !request.node_soft {
                        prop_assert!(request.placed.iter().all(|p| p.node != chosen.node));
                    }
                }
                Err(reason) => {
                    prop_assert!(!any_admissible, "refused ({reason}) though a disk was admissible");
                }
            }
        }

        /// Placing several replicas never puts two on one node under hard
        /// anti-affinity, and never schedules past a disk's limits.
        #[test]
        fn multi_placement_keeps_limits(
            candidates in proptest::collection::vec(arb_candidate(), 1..8),
            size in 1..20u64,
            count in 1..5usize,
        ) {
            // One candidate per (node, disk), as in a real cluster.
            let mut seen = std::collections::BTreeSet::new();
            let candidates: Vec<_> = candidates.into_iter().filter(|c| seen.insert((c.node.clone(), c.disk.clone()))).collect();
            let request = Request { size: size * GIB, ..request(0) };
            if let Ok(placed) = schedule_replicas(&request, count, &candidates, Limits::default()) {
                prop_assert_eq!(placed.len(), count);
                let nodes: std::collections::BTreeSet<_> = placed.iter().map(|p| &p.node).collect();
                prop_assert_eq!(nodes.len(), count);
                for c in &candidates {
                    let here = placed.iter().filter(|p| p.node == c.node && p.disk == c.disk).count() as u64;
                    let usable = c.maximum.saturating_sub(c.reserved);
                    prop_assert!(here == 0 || c.scheduled + here * request.size <= usable);
                }
            }
        }
    }

    #[test]
    fn the_largest_volume_is_the_biggest_that_still_fits_and_one_block_more_does_not() {
        let gib = 1u64 << 30;
        let mut small = disk("n-1", "", gib, gib);
        small.scheduled = gib / 4;
        let big = disk("n-2", "", 4 * gib, 4 * gib);
        let limits = Limits::default();
        let store = |size: u64| size + size / 4 + (8 << 20);
        let both = largest_volume(&[small.clone(), big.clone()], &[], &[], limits, store);
        let on_small = largest_volume(std::slice::from_ref(&small), &[], &[], limits, store);
        assert_eq!(both, largest_volume(std::slice::from_ref(&big), &[], &[], limits, store));
        for (c, size) in [(&small, on_small), (&big, both)] {
            assert!(size > 0 && size % 4096 == 0);
            assert!(fits(c, store(size), limits), "{size} fits");
            assert!(!fits(c, store(size + 4096), limits), "{size} + 4096 does not");
        }
        let mut not_ready = big;
        not_ready.node_ready = false;
        assert_eq!(largest_volume(&[not_ready], &[], &[], limits, store), 0);
        assert_eq!(largest_volume(&[small], &["ssd".into()], &[], limits, store), 0, "tags");
    }
}
