//! LVM logical volumes as store byte ranges, through the LVM command-line tools.
//!
//! With device-mapper in the kernel an LV is opened as `/dev/VG/LV`. Without it
//! (this project's development kernel), LVM metadata still works with
//! `--driverloaded n`, and the LV's data is reached by reading its segment
//! table (`lvs -o seg_start_pe,seg_size_pe,seg_pe_ranges`) and mapping each
//! segment onto its PV at `pe_start + pe * extent_size`, which is exactly what
//! dm-linear does in the kernel. Both paths use real LVM metadata, so LVs made
//! here are ordinary LVs to any other LVM tool.

use std::fs::File;
use std::io;
use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use crate::device::{Segment, open_direct};

/// True when the kernel has device-mapper, so LVs can be activated.
pub fn device_mapper_present() -> bool {
    // /dev/mapper/control can exist (made by packaging) without the driver;
    // the kernel's misc device list is the truth.
    std::fs::read_to_string("/proc/misc").is_ok_and(|misc| misc.lines().any(|l| l.ends_with(" device-mapper")))
}

fn lvm_command(tool: &str) -> Command {
    let mut cmd = Command::new(tool);
    cmd.env("LVM_SUPPRESS_FD_WARNINGS", "1");
    if !device_mapper_present() && tool != "pvs" && tool != "vgs" && tool != "lvs" {
        cmd.arg("--driverloaded").arg("n");
    }
    cmd
}

fn run(mut cmd: Command) -> io::Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(e.kind(), "LVM tools not found: install lvm2".to_string())
        } else {
            e
        }
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let reason = stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("WARNING"))
            .collect::<Vec<_>>()
            .join("; ");
        return Err(io::Error::other(format!("{shown} failed: {reason}")));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[derive(Deserialize)]
struct Report<T> {
    report: Vec<T>,
}

#[derive(Deserialize)]
struct LvReport {
    lv: Vec<LvSegmentRow>,
}

#[derive(Deserialize)]
struct LvSegmentRow {
    seg_start_pe: String,
    seg_size_pe: String,
    seg_pe_ranges: String,
}

#[derive(Deserialize)]
struct PvReport {
    pv: Vec<PvRow>,
}

#[derive(Deserialize)]
struct PvRow {
    pv_name: String,
    pe_start: String,
    vg_extent_size: String,
}

#[derive(Deserialize)]
struct VgReport {
    vg: Vec<VgRow>,
}

#[derive(Deserialize)]
struct VgRow {
    vg_size: String,
    vg_free: String,
    vg_extent_size: String,
}

/// Size, free space and extent size of a volume group, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VgInfo {
    pub size_bytes: u64,
    pub free_bytes: u64,
    pub extent_bytes: u64,
}

fn number(field: &str, value: &str) -> io::Result<u64> {
    value.trim().parse().map_err(|_| io::Error::other(format!("LVM reported {field}={value:?}, not a number")))
}

pub fn vg_info(vg: &str) -> io::Result<VgInfo> {
    let mut cmd = lvm_command("vgs");
    cmd.args(["--reportformat", "json", "--units", "b", "--nosuffix", "-o", "vg_size,vg_free,vg_extent_size", vg]);
    let out = run(cmd).map_err(|e| io::Error::new(io::ErrorKind::NotFound, format!("volume group {vg}: {e}")))?;
    let report: Report<VgReport> = serde_json::from_str(&out).map_err(io::Error::other)?;
    let row = report
        .report
        .first()
        .and_then(|r| r.vg.first())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("volume group {vg} not found")))?;
    Ok(VgInfo {
        size_bytes: number("vg_size", &row.vg_size)?,
        free_bytes: number("vg_free", &row.vg_free)?,
        extent_bytes: number("vg_extent_size", &row.vg_extent_size)?,
    })
}

pub fn lv_exists(vg: &str, lv: &str) -> io::Result<bool> {
    vg_info(vg)?;
    let mut cmd = lvm_command("lvs");
    cmd.args(["--noheadings", "-o", "lv_name", &format!("{vg}/{lv}")]);
    Ok(run(cmd).is_ok())
}

/// Runs an LVM tool with `args` (`--driverloaded n` added where the kernel
/// lacks device-mapper); its stdout, or its error lines.
pub fn tool(tool: &str, args: &[&str]) -> io::Result<String> {
    let mut cmd = lvm_command(tool);
    cmd.args(args);
    run(cmd)
}

/// Names of the LVs in a volume group.
pub fn lv_list(vg: &str) -> io::Result<Vec<String>> {
    vg_info(vg)?;
    let mut cmd = lvm_command("lvs");
    cmd.args(["--noheadings", "-o", "lv_name", vg]);
    Ok(run(cmd)?.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect())
}

fn round_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}

/// Creates an LV whose first `zero_bytes` read as zeros, atomically: it is
/// made under a staging name, its head is zeroed, and only then renamed. LVs
/// are created without zeroing (`-Zn`: zeroing needs device-mapper), so new
/// extents can hold an earlier LV's bytes, including a valid store superblock;
/// a crash at any point leaves either no LV of this name or a zeroed one.
pub fn lv_create_zeroed(vg: &str, lv: &str, size_bytes: u64, zero_bytes: usize) -> io::Result<()> {
    let staging = format!("{lv}.new");
    if lv_exists(vg, &staging)? {
        lv_remove(vg, &staging)?;
    }
    lv_create(vg, &staging, size_bytes)?;
    let zeroed = (|| -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let (files, segments) = lv_map(vg, &staging)?;
        let zeros = crate::io::AlignedBuf::zeroed(zero_bytes);
        let mut done = 0u64;
        for seg in segments.iter().filter(|s| s.logical_start < zero_bytes as u64) {
            let len = seg.length.min(zero_bytes as u64 - seg.logical_start) as usize;
            files[seg.file].write_all_at(&zeros[..len], seg.physical_start)?;
            done += len as u64;
        }
        for f in &files {
            f.sync_all()?;
        }
        if done < zero_bytes as u64 {
            return Err(io::Error::other(format!("{vg}/{staging}: could only zero {done} of {zero_bytes} bytes")));
        }
        Ok(())
    })();
    if let Err(e) = zeroed {
        let _ = lv_remove(vg, &staging);
        return Err(e);
    }
    let mut cmd = lvm_command("lvrename");
    cmd.args([vg, &staging, lv]);
    run(cmd).map(drop)
}

pub fn lv_create(vg: &str, lv: &str, size_bytes: u64) -> io::Result<()> {
    let info = vg_info(vg)?;
    let size = round_up(size_bytes, info.extent_bytes);
    if size > info.free_bytes {
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!("volume group {vg} has {} bytes free, {size} needed for {lv}", info.free_bytes),
        ));
    }
    let mut cmd = lvm_command("lvcreate");
    cmd.args(["-y", "-Zn", "-n", lv, "-L", &format!("{size}b"), vg]);
    run(cmd).map(drop)
}

pub fn lv_extend(vg: &str, lv: &str, size_bytes: u64) -> io::Result<()> {
    let info = vg_info(vg)?;
    let mut cmd = lvm_command("lvextend");
    cmd.args(["-L", &format!("{}b", round_up(size_bytes, info.extent_bytes)), &format!("{vg}/{lv}")]);
    run(cmd).map(drop)
}

pub fn lv_remove(vg: &str, lv: &str) -> io::Result<()> {
    if !lv_exists(vg, lv)? {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("logical volume {vg}/{lv} not found")));
    }
    let mut cmd = lvm_command("lvremove");
    cmd.args(["-y", &format!("{vg}/{lv}")]);
    run(cmd).map(drop)
}

/// Parses `seg_pe_ranges` such as `/dev/loop0:0-1` into (pv, first, last).
fn parse_pe_range(ranges: &str) -> io::Result<(String, u64, u64)> {
    let bad =
        || io::Error::other(format!("unexpected seg_pe_ranges {ranges:?} (striped or mirrored LVs are not supported)"));
    if ranges.split_whitespace().count() != 1 {
        return Err(bad());
    }
    let (pv, span) = ranges.trim().rsplit_once(':').ok_or_else(bad)?;
    let (first, last) = span.split_once('-').ok_or_else(bad)?;
    let first: u64 = first.parse().map_err(|_| bad())?;
    let last: u64 = last.parse().map_err(|_| bad())?;
    if last < first {
        return Err(bad());
    }
    Ok((pv.to_string(), first, last))
}

/// Opens an LV: `/dev/VG/LV` with device-mapper, else its PVs with the
/// segment table that maps the LV's bytes onto them.
pub fn lv_map(vg: &str, lv: &str) -> io::Result<(Vec<File>, Vec<Segment>)> {
    if device_mapper_present() {
        let path = format!("/dev/{vg}/{lv}");
        let file = open_direct(Path::new(&path))?;
        let length = lv_size_bytes(vg, lv)?;
        return Ok((vec![file], vec![Segment { logical_start: 0, length, file: 0, physical_start: 0 }]));
    }
    let mut cmd = lvm_command("lvs");
    cmd.args([
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        "lv_name,seg_start_pe,seg_size_pe,seg_pe_ranges",
        &format!("{vg}/{lv}"),
    ]);
    let out =
        run(cmd).map_err(|e| io::Error::new(io::ErrorKind::NotFound, format!("logical volume {vg}/{lv}: {e}")))?;
    let report: Report<LvReport> = serde_json::from_str(&out).map_err(io::Error::other)?;
    let rows = report.report.into_iter().flat_map(|r| r.lv).collect::<Vec<_>>();

    let mut cmd = lvm_command("pvs");
    cmd.args([
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        "pv_name,pe_start,vg_extent_size",
        "-S",
        &format!("vg_name={vg}"),
    ]);
    let pvs: Report<PvReport> = serde_json::from_str(&run(cmd)?).map_err(io::Error::other)?;
    let pvs = pvs.report.into_iter().flat_map(|r| r.pv).collect::<Vec<_>>();

    let mut files: Vec<File> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut segments = Vec::new();
    for row in rows {
        let (pv, first, last) = parse_pe_range(&row.seg_pe_ranges)?;
        let start_pe = number("seg_start_pe", &row.seg_start_pe)?;
        let size_pe = number("seg_size_pe", &row.seg_size_pe)?;
        if size_pe != last - first + 1 {
            return Err(io::Error::other(format!(
                "segment of {vg}/{lv} has {size_pe} extents but range {first}-{last}"
            )));
        }
        let pv_row = pvs
            .iter()
            .find(|p| p.pv_name == pv)
            .ok_or_else(|| io::Error::other(format!("PV {pv} of {vg}/{lv} not reported by pvs")))?;
        let extent = number("vg_extent_size", &pv_row.vg_extent_size)?;
        let pe_start = number("pe_start", &pv_row.pe_start)?;
        let file = match names.iter().position(|n| *n == pv) {
            Some(i) => i,
            None => {
                files.push(
                    open_direct(Path::new(&pv)).map_err(|e| io::Error::new(e.kind(), format!("open PV {pv}: {e}")))?,
                );
                names.push(pv);
                files.len() - 1
            }
        };
        segments.push(Segment {
            logical_start: start_pe * extent,
            length: size_pe * extent,
            file,
            physical_start: pe_start + first * extent,
        });
    }
    segments.sort_by_key(|s| s.logical_start);
    let mut at = 0;
    for s in &segments {
        if s.logical_start != at {
            return Err(io::Error::other(format!("segments of {vg}/{lv} leave a hole at {at}")));
        }
        at += s.length;
    }
    if segments.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("logical volume {vg}/{lv} not found")));
    }
    Ok((files, segments))
}

fn lv_size_bytes(vg: &str, lv: &str) -> io::Result<u64> {
    let mut cmd = lvm_command("lvs");
    cmd.args(["--noheadings", "--units", "b", "--nosuffix", "-o", "lv_size", &format!("{vg}/{lv}")]);
    number("lv_size", &run(cmd)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pe_ranges() {
        assert_eq!(parse_pe_range("/dev/loop0:4-5").unwrap(), ("/dev/loop0".into(), 4, 5));
        for bad in ["", "/dev/loop0", "/dev/loop0:5-4", "/dev/loop0:0-1 /dev/loop1:0-1", "/dev/loop0:a-b"] {
            assert!(parse_pe_range(bad).is_err(), "{bad:?}");
        }
    }
}
