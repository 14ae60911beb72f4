//! The fence: which engine may use the store. Every request carries its
//! engine's epoch; [`Store::admit`] checks it under the read side of the
//! gate, and raising the epoch takes the write side, so a raise waits for
//! every request admitted under an older epoch and none is admitted after
//! it. Flush stamps (the engine's volume-wide flush sequence) are made
//! durable with the flush they belong to; the engine elects its source by
//! them (see `docs/rebuild-and-fencing.md`).

use super::*;

impl Store {
    /// Whether `epoch` is newer than the highest seen; an older one is
    /// refused.
    pub(super) fn is_newer_epoch(&self, epoch: u64) -> Result<bool> {
        let highest = self.meta().sb.highest_epoch;
        if epoch < highest {
            return Err(StoreError::Fenced { epoch, highest });
        }
        Ok(epoch > highest)
    }

    /// Raises the fencing epoch to `epoch`, durable before it returns. It
    /// first drains every request admitted under the older epoch (they hold
    /// the gate shared), so once this returns nothing of an older engine
    /// can still land. An older epoch is refused. (SetEpoch.)
    pub async fn raise_epoch(&self, epoch: u64) -> Result<()> {
        if !self.is_newer_epoch(epoch)? {
            return Ok(());
        }
        let _gate = self.gate.write().await;
        let _commit = self.commit.lock().await;
        self.raise_epoch_locked(epoch).await
    }

    /// The check and the raise, with the gate held exclusively and `commit`.
    pub(super) async fn raise_epoch_locked(&self, epoch: u64) -> Result<()> {
        let sb = {
            let meta = self.meta();
            meta.check_usable()?;
            if epoch < meta.sb.highest_epoch {
                return Err(StoreError::Fenced { epoch, highest: meta.sb.highest_epoch });
            }
            if epoch == meta.sb.highest_epoch {
                return Ok(());
            }
            Superblock { sequence: meta.sb.sequence + 1, highest_epoch: epoch, ..meta.sb.clone() }
        };
        self.write_superblock(&sb).await?;
        tracing::info!(epoch, "fencing epoch raised");
        self.meta().sb = sb;
        Ok(())
    }

    /// Admits one data request of `epoch`: returns the gate held shared with
    /// the epoch checked under it, so an epoch raise (which takes the gate
    /// exclusively) either waits for this request to finish or is seen by
    /// it. A newer epoch is raised first.
    pub(super) async fn admit(&self, epoch: u64) -> Result<tokio::sync::OwnedRwLockReadGuard<()>> {
        loop {
            let gate = self.gate.clone().read_owned().await;
            if !self.is_newer_epoch(epoch)? {
                return Ok(gate);
            }
            drop(gate);
            self.raise_epoch(epoch).await?;
        }
    }

    /// An engine's flush: every write completed before it is made durable,
    /// and with `stamp` the store records that it holds everything the
    /// engine acknowledged before sending that flush. The stamp is journaled
    /// after the data it covers is synced, so a durable stamp never claims
    /// data that is not. `FlushStamp::NONE` withdraws the claim (a rebuild
    /// target, until it is complete).
    pub async fn flush_stamped(&self, epoch: u64, stamp: Option<FlushStamp>) -> Result<()> {
        let _gate = self.admit(epoch).await?;
        let _commit = self.commit.lock().await;
        if let Some(stamp) = stamp {
            let mut meta = self.meta();
            meta.check_usable()?;
            if meta.stamp != stamp {
                meta.stamp = stamp;
                meta.pending.push(Record::Stamp(stamp));
            }
        }
        self.commit_locked(false, false).await
    }
}
