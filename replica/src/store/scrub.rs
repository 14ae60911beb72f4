//! Reading data back to check it: a scrub reads every data block mapped in
//! any layer within a range and compares it with the crc its map entry
//! holds, and names the blocks that fail. It changes nothing: the engine
//! repairs a bad block from a healthy replica with `write_layer`.
//!
//! Also the bit-rot fault for tests: flipping a bit of chosen data blocks
//! on the device, behind the map's back.

use super::*;

/// Largest range one scrub request covers (its data is read a slice at a
/// time, so this bounds the time of one call, not memory).
pub const MAX_SCRUB_BYTES: u64 = 1 << 30;

/// A data block whose bytes do not match their crc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadBlock {
    /// The snapshot whose own map holds the block; empty for the head.
    pub layer: String,
    pub offset: u64,
}

/// One mapped data block of one layer.
struct Mapped {
    layer: usize,
    lba: u64,
    entry: Entry,
}

/// Pieces of a scrub's answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub bad: Vec<BadBlock>,
    pub checked_bytes: u64,
}

impl Store {
    /// Every data block mapped in any layer within `[offset, offset+length)`,
    /// read from the device and checked against its crc.
    pub async fn scrub(&self, offset: u64, length: u64) -> Result<ScrubReport> {
        self.check_range(&self.meta(), offset, length)?;
        if length > MAX_SCRUB_BYTES {
            return Err(StoreError::InvalidArgument(format!(
                "scrub of {length} bytes asked; at most {MAX_SCRUB_BYTES} per request"
            )));
        }
        let _gate = self.gate.read().await;
        let mut report = ScrubReport::default();
        let end = (offset + length) / BLOCK_SIZE;
        let mut from = offset / BLOCK_SIZE;
        while from < end {
            let to = (from + SLICE_BLOCKS).min(end);
            let (ticket, mapped, names) = {
                let mut meta = self.meta();
                meta.check_usable()?;
                let mapped = Self::mapped(&meta, from..to);
                let names = Self::layer_names(&meta);
                (meta.begin_read(), mapped, names)
            };
            let result = self.check_blocks(&mapped).await;
            self.meta().finish_read(ticket);
            for m in result? {
                report.bad.push(BadBlock { layer: names[m.layer].clone(), offset: m.lba * BLOCK_SIZE });
            }
            report.checked_bytes += mapped.len() as u64 * BLOCK_SIZE;
            from = to;
        }
        if !report.bad.is_empty() {
            tracing::error!(bad = report.bad.len(), offset, length, "scrub found blocks failing their checksum");
        }
        Ok(report)
    }

    /// Names of the layers by index, the head's empty (as requests name it).
    fn layer_names(meta: &Meta) -> Vec<String> {
        let head = meta.head_index();
        meta.layers.iter().enumerate().map(|(i, l)| if i == head { String::new() } else { l.name.clone() }).collect()
    }

    /// The data blocks mapped in `lbas`, every layer, in device order.
    fn mapped(meta: &Meta, lbas: std::ops::Range<u64>) -> Vec<Mapped> {
        let mut out: Vec<Mapped> = meta
            .layers
            .iter()
            .enumerate()
            .flat_map(|(layer, l)| {
                l.map.range(lbas.clone()).filter(|(_, e)| e.pba != ZERO_PBA).map(move |(lba, entry)| Mapped {
                    layer,
                    lba,
                    entry,
                })
            })
            .collect();
        out.sort_by_key(|m| m.entry.pba);
        out
    }

    /// Reads `mapped` (in device order, runs of adjacent blocks at once)
    /// and returns those failing their crc.
    async fn check_blocks<'a>(&self, mapped: &'a [Mapped]) -> Result<Vec<&'a Mapped>> {
        const RUN: usize = 256;
        let device = self.device();
        let mut bad = Vec::new();
        let mut i = 0;
        while i < mapped.len() {
            let mut n = 1;
            while i + n < mapped.len() && n < RUN && mapped[i + n].entry.pba == mapped[i].entry.pba + n as u64 {
                n += 1;
            }
            let buf = AlignedBuf::zeroed(n * BLOCK);
            let buf = device.read(mapped[i].entry.pba * BLOCK_SIZE, buf).await.map_err(io_err("scrub read"))?;
            for (k, block) in buf.chunks(BLOCK).enumerate() {
                if format::crc32(block) != mapped[i + k].entry.crc {
                    bad.push(&mapped[i + k]);
                }
            }
            i += n;
        }
        Ok(bad)
    }

    /// Bit rot on demand (tests): flips one bit in each of `blocks` data
    /// blocks picked by `seed` among those mapped in `[offset, offset+length)`
    /// (length 0: the whole volume), on the device, leaving the crcs alone;
    /// with `sealed_only`, only blocks of snapshots (no write replaces them).
    pub async fn flip_bits(
        &self,
        blocks: usize,
        seed: u64,
        offset: u64,
        length: u64,
        sealed_only: bool,
    ) -> Result<Vec<BadBlock>> {
        let length = if length == 0 { self.info().size_bytes.saturating_sub(offset) } else { length };
        self.check_range(&self.meta(), offset, length)?;
        let _gate = self.gate.write().await;
        let (mut mapped, names) = {
            let meta = self.meta();
            (Self::mapped(&meta, offset / BLOCK_SIZE..(offset + length) / BLOCK_SIZE), Self::layer_names(&meta))
        };
        if sealed_only {
            mapped.retain(|m| !names[m.layer].is_empty());
        }
        if mapped.len() < blocks {
            return Err(StoreError::InvalidArgument(format!(
                "{blocks} blocks to flip asked, {} data blocks mapped in range",
                mapped.len()
            )));
        }
        let mut state = seed.max(1);
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut picked: Vec<usize> = Vec::with_capacity(blocks);
        while picked.len() < blocks {
            let i = (next() % mapped.len() as u64) as usize;
            if !picked.contains(&i) {
                picked.push(i);
            }
        }
        let device = self.device();
        let mut out = Vec::with_capacity(blocks);
        for i in picked {
            let m = &mapped[i];
            let at = m.entry.pba * BLOCK_SIZE;
            let mut buf = device.read(at, AlignedBuf::zeroed(BLOCK)).await.map_err(io_err("read to flip"))?;
            let bit = (next() % (BLOCK as u64 * 8)) as usize;
            buf[bit / 8] ^= 1 << (bit % 8);
            device.write(at, buf).await.map_err(io_err("write flipped"))?;
            out.push(BadBlock { layer: names[m.layer].clone(), offset: m.lba * BLOCK_SIZE });
        }
        device.sync().await.map_err(io_err("sync flipped"))?;
        tracing::warn!(blocks = out.len(), "bits flipped on the device (fault injection)");
        Ok(out)
    }
}
