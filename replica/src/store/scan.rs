//! Read-only scans of the maps: allocation (which ranges hold data), a
//! layer's extents, and checksums for rebuild comparison. Large ranges are
//! scanned a slice at a time so other I/O gets the metadata lock between.

use super::*;

impl Store {
    /// Allocation of the volume as read within `[offset, offset+length)`:
    /// coalesced ranges, `zero` where it reads as zeroes without data.
    /// A large range is scanned a slice at a time (other I/O runs between).
    pub async fn allocation(&self, offset: u64, length: u64) -> Result<Vec<Extent>> {
        self.check_range(&self.meta(), offset, length)?;
        if length > MAX_ALLOCATION_BYTES {
            return Err(StoreError::InvalidArgument(format!(
                "allocation of {length} bytes asked; at most {MAX_ALLOCATION_BYTES} per request"
            )));
        }
        let mut out: Vec<Extent> = Vec::new();
        let end = (offset + length) / BLOCK_SIZE;
        let mut from = offset / BLOCK_SIZE;
        while from < end {
            let to = (from + SLICE_BLOCKS).min(end);
            {
                let meta = self.meta();
                let head = meta.head_index();
                for lba in from..to {
                    let zero = meta.resolve(head, lba).is_none();
                    match out.last_mut() {
                        Some(last) if last.zero == zero => last.length += BLOCK_SIZE,
                        _ => out.push(Extent { offset: lba * BLOCK_SIZE, length: BLOCK_SIZE, zero }),
                    }
                }
            }
            from = to;
            if from < end {
                tokio::task::yield_now().await;
            }
        }
        Ok(out)
    }

    /// A layer's mapped ranges, coalesced.
    pub fn extents(&self, layer: &str) -> Result<Vec<Extent>> {
        let meta = self.meta();
        let index = meta.layer_index(layer)?;
        let mut out: Vec<Extent> = Vec::new();
        for (lba, e) in meta.layers[index].map.iter() {
            let zero = e.pba == ZERO_PBA;
            let offset = lba * BLOCK_SIZE;
            match out.last_mut() {
                Some(last) if last.offset + last.length == offset && last.zero == zero => last.length += BLOCK_SIZE,
                _ => out.push(Extent { offset, length: BLOCK_SIZE, zero }),
            }
        }
        Ok(out)
    }

    /// One crc32 per `chunk` bytes of `[offset, offset+length)`, computed from
    /// the per-block checksums (no data is read). `layer` empty with `merged`
    /// covers the volume as read; otherwise one layer's own mapping.
    /// A large range is scanned a slice at a time (other I/O runs between).
    pub async fn checksums(&self, layer: &str, merged: bool, offset: u64, length: u64, chunk: u64) -> Result<Vec<u32>> {
        if chunk == 0 || chunk % BLOCK_SIZE != 0 || length % chunk != 0 {
            return Err(StoreError::InvalidArgument(format!(
                "chunk size {chunk} must be a positive multiple of {BLOCK_SIZE} dividing the length {length}"
            )));
        }
        if length / chunk > MAX_CHECKSUMS {
            return Err(StoreError::InvalidArgument(format!(
                "{} checksums asked; at most {MAX_CHECKSUMS} per request",
                length / chunk
            )));
        }
        let layer_id = {
            let meta = self.meta();
            self.check_range(&meta, offset, length)?;
            meta.layers[meta.layer_index(layer)?].id
        };
        let per_chunk = chunk / BLOCK_SIZE;
        let first = offset / BLOCK_SIZE;
        let chunks = length / chunk;
        let chunks_per_slice = (SLICE_BLOCKS / per_chunk).max(1);
        let mut out = Vec::with_capacity(chunks.min(1 << 20) as usize);
        let mut c = 0;
        while c < chunks {
            let until = (c + chunks_per_slice).min(chunks);
            {
                let meta = self.meta();
                let index = meta
                    .layers
                    .iter()
                    .position(|l| l.id == layer_id)
                    .ok_or_else(|| StoreError::NotFound(format!("layer {layer:?}")))?;
                for c in c..until {
                    let mut h = crc32fast::Hasher::new();
                    for lba in first + c * per_chunk..first + (c + 1) * per_chunk {
                        let (state, crc) = if merged {
                            (1u8, meta.resolve(index, lba).map_or(zero_block_crc(), |e| e.crc))
                        } else {
                            match meta.layers[index].map.get(lba) {
                                None => (0, 0),
                                Some(e) => (1, e.crc),
                            }
                        };
                        h.update(&[state]);
                        h.update(&crc.to_le_bytes());
                    }
                    out.push(h.finalize());
                }
            }
            c = until;
            if c < chunks {
                tokio::task::yield_now().await;
            }
        }
        Ok(out)
    }
}
