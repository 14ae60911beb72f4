//! The workload's blocks and the verdict on each one read back.
//!
//! Every 4 KiB write carries a stamp: a magic, the block number, a sequence
//! number unique over the whole run, and a crc32 of everything else in the
//! block, whose body is a pattern derived from (block, sequence). Reading a
//! block back tells which write it holds, or that it holds none (torn,
//! garbage, another block's data).

use crate::BLOCK;

const MAGIC: &[u8; 8] = b"IHCHAOS1";
const CRC_AT: usize = 24;
const BODY_AT: usize = 28;

/// The block `block` as write `seq` leaves it.
pub fn stamp(block: u64, seq: u64) -> Vec<u8> {
    let mut data = vec![0u8; BLOCK];
    data[..8].copy_from_slice(MAGIC);
    data[8..16].copy_from_slice(&block.to_le_bytes());
    data[16..24].copy_from_slice(&seq.to_le_bytes());
    let mut x = block.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seq;
    for chunk in data[BODY_AT..].chunks_mut(8) {
        x = crate::chaos::rng::splitmix(x);
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let crc = checksum(&data);
    data[CRC_AT..BODY_AT].copy_from_slice(&crc.to_le_bytes());
    data
}

fn checksum(data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&data[..CRC_AT]);
    h.update(&data[BODY_AT..]);
    h.finalize()
}

/// What a block read back holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// All zeroes: never written (or trimmed).
    Zero,
    /// Write `seq` to `block`, intact.
    Write { block: u64, seq: u64 },
    /// Anything else: a torn block, garbage.
    Garbage(String),
}

pub fn parse(data: &[u8]) -> Found {
    if data.iter().all(|b| *b == 0) {
        return Found::Zero;
    }
    if data.len() != BLOCK || &data[..8] != MAGIC {
        return Found::Garbage(format!("no stamp (first bytes {:02x?})", &data[..data.len().min(8)]));
    }
    let block = u64::from_le_bytes(data[8..16].try_into().expect("8 bytes"));
    let seq = u64::from_le_bytes(data[16..24].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(data[CRC_AT..BODY_AT].try_into().expect("4 bytes"));
    if crc != checksum(data) {
        return Found::Garbage(format!("stamp of block {block} write {seq} with a wrong checksum (torn)"));
    }
    Found::Write { block, seq }
}

/// Every write the workload sent to one block, in order.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// (sequence, acknowledged): a write not acknowledged had an error or a
    /// dropped connection, and may or may not have landed.
    pub writes: Vec<(u64, bool)>,
    /// The last write a completed FLUSH covered.
    pub flushed: Option<u64>,
}

impl History {
    pub fn last_acked(&self) -> Option<u64> {
        self.writes.iter().rev().find(|(_, acked)| *acked).map(|(seq, _)| *seq)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The last acknowledged write (or nothing, where nothing was acknowledged).
    Good,
    /// A write after the last acknowledged one, sent but not acknowledged:
    /// it landed, which it may.
    UnackedLanded,
    /// An older state that a crash of every replica may leave: a write
    /// acknowledged but never flushed was lost. Allowed only then.
    RolledBack,
    /// Data loss.
    Lost { expected: String, found: String },
}

/// The verdict on block `block` holding `found`, given its history;
/// `crash_all`: every replica was killed at once at some point (power
/// loss), so acknowledged but unflushed writes may be gone.
pub fn classify(block: u64, history: &History, found: &Found, crash_all: bool) -> Verdict {
    let last_acked = history.last_acked();
    let expected = || match last_acked {
        Some(seq) => format!("write {seq}"),
        None => "zeroes or an unacknowledged write".to_string(),
    };
    let lost = |found: String| Verdict::Lost { expected: expected(), found };
    // Under a crash of everything, anything written at or after the last
    // flushed write may be what survived.
    let survives_crash = |seq: u64| crash_all && history.flushed.is_none_or(|f| seq >= f);
    match found {
        Found::Zero => match last_acked {
            None => Verdict::Good,
            Some(_) if crash_all && history.flushed.is_none() => Verdict::RolledBack,
            Some(_) => lost("zeroes".into()),
        },
        Found::Garbage(what) => lost(what.clone()),
        Found::Write { block: other, seq } if *other != block => lost(format!("block {other}'s write {seq}")),
        Found::Write { seq, .. } => {
            let Some(&(_, acked)) = history.writes.iter().find(|(s, _)| s == seq) else {
                return lost(format!("write {seq}, never sent to this block"));
            };
            match last_acked {
                Some(last) if *seq == last => Verdict::Good,
                Some(last) if *seq > last && !acked => Verdict::UnackedLanded,
                None if !acked => Verdict::UnackedLanded,
                _ if survives_crash(*seq) => Verdict::RolledBack,
                _ => lost(format!(
                    "write {seq} ({})",
                    if acked { "an older one" } else { "an unacknowledged older one" }
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(writes: &[(u64, bool)], flushed: Option<u64>) -> History {
        History { writes: writes.to_vec(), flushed }
    }

    #[test]
    fn a_stamp_reads_back_and_any_changed_byte_is_garbage() {
        let data = stamp(7, 42);
        assert_eq!(parse(&data), Found::Write { block: 7, seq: 42 });
        for at in [0, 9, 17, 25, 100, 4095] {
            let mut bad = data.clone();
            bad[at] ^= 0x10;
            assert!(matches!(parse(&bad), Found::Garbage(_)), "byte {at} flipped");
        }
        let mut torn = data.clone();
        torn[2048..].copy_from_slice(&stamp(7, 41)[2048..]);
        assert!(matches!(parse(&torn), Found::Garbage(_)), "half of one write, half of another");
        assert_eq!(parse(&[0u8; BLOCK]), Found::Zero);
    }

    #[test]
    fn verdicts() {
        let h = history(&[(3, true), (9, true), (12, false)], Some(3));
        let at = |seq| Found::Write { block: 5, seq };
        assert_eq!(classify(5, &h, &at(9), false), Verdict::Good);
        assert_eq!(classify(5, &h, &at(12), false), Verdict::UnackedLanded);
        assert!(matches!(classify(5, &h, &at(3), false), Verdict::Lost { .. }), "an older write");
        assert_eq!(classify(5, &h, &at(3), true), Verdict::RolledBack, "flushed at 3, so 3 may survive a crash");
        assert!(matches!(classify(5, &h, &at(4), true), Verdict::Lost { .. }), "never sent");
        assert!(matches!(classify(5, &h, &Found::Write { block: 6, seq: 9 }, false), Verdict::Lost { .. }));
        assert!(matches!(classify(5, &h, &Found::Zero, true), Verdict::Lost { .. }), "3 was flushed");
        let unflushed = history(&[(3, true)], None);
        assert_eq!(classify(5, &unflushed, &Found::Zero, true), Verdict::RolledBack);
        assert!(matches!(classify(5, &unflushed, &Found::Zero, false), Verdict::Lost { .. }));
        assert_eq!(classify(5, &History::default(), &Found::Zero, false), Verdict::Good);
        let resurrected = history(&[(3, false), (9, true)], None);
        assert!(matches!(classify(5, &resurrected, &at(3), false), Verdict::Lost { .. }), "a stale write over 9");
        let flushed_later = history(&[(3, true), (9, true)], Some(9));
        assert!(matches!(classify(5, &flushed_later, &at(3), true), Verdict::Lost { .. }), "9 was flushed");
    }
}
