//! The space a rebuild's join snapshot may pin. While a rebuild copies, its
//! join snapshot keeps every block the volume's writes replace, on every
//! replica; a store has room for only a fraction of the volume beyond its
//! data (a quarter by default), so a long rebuild under heavy overwrites ran
//! the replicas out of space. Each byte written after the join pins at most
//! one byte, so the engine counts the bytes written since the join point and
//! moves the join point forward (a new rebuild snapshot, the old one merged
//! into it, which frees what the new one shadows) before the count reaches
//! the room the replicas had when the copy started. Writes that would pass
//! the budget wait for that move; normally the rebuild moves at half the
//! budget and no write waits.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// Share of the smallest free room kept as the budget: the rest is slack
/// for metadata, checkpoints and zero markers.
const BUDGET_SHARE: u64 = 2;
/// A budget never below this, so a nearly full store does not move its
/// join point after every few writes.
const MIN_BUDGET: u64 = 1 << 20;

/// The budget for the bytes written between two join points, from the free
/// room of each RW replica when the copy starts.
pub(super) fn budget(free: &[u64]) -> u64 {
    let least = free.iter().copied().min().unwrap_or(0);
    (least / BUDGET_SHARE).max(MIN_BUDGET)
}

/// Whether the rebuild should move its join point now.
pub(super) fn wants_move(written: u64, budget: u64) -> bool {
    budget > 0 && written >= budget / 2
}

/// Whether a write of `bytes` may go now (else it waits for a move).
pub(super) fn admits(written: u64, bytes: u64, budget: u64) -> bool {
    budget == 0 || written == 0 || written + bytes <= budget
}

#[derive(Default)]
pub(super) struct JoinWindow {
    /// 0: no rebuild copying.
    budget: AtomicU64,
    written: AtomicU64,
    /// The rebuild waits on this between chunks.
    wanted: Notify,
    /// Writes held back wait on this.
    moved: Notify,
}

impl JoinWindow {
    /// A rebuild's copy starts with `budget`.
    pub(super) fn open(&self, budget: u64) {
        self.written.store(0, Ordering::SeqCst);
        self.budget.store(budget, Ordering::SeqCst);
    }

    /// The copy ended (done or failed): nothing is pinned any more.
    pub(super) fn close(&self) {
        self.budget.store(0, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    /// The join point moved: the count starts again (called with I/O
    /// paused, so no write straddles the move).
    pub(super) fn reset(&self) {
        self.written.store(0, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    pub(super) fn wants_move(&self) -> bool {
        wants_move(self.written.load(Ordering::SeqCst), self.budget.load(Ordering::SeqCst))
    }

    /// Resolves when a write asked for a move (or at once if one is due).
    pub(super) async fn move_wanted(&self) {
        let wanted = self.wanted.notified();
        tokio::pin!(wanted);
        wanted.as_mut().enable();
        if self.wants_move() {
            return;
        }
        wanted.await;
    }

    /// Counts a write of `bytes`, waiting first while it would pass the
    /// budget. Called before the write takes the pause lock.
    pub(super) async fn admit(&self, bytes: u64) {
        loop {
            let budget = self.budget.load(Ordering::SeqCst);
            if budget == 0 {
                // No rebuild copying: the write path pays one atomic load.
                return;
            }
            let written = self.written.load(Ordering::SeqCst);
            if admits(written, bytes, budget) {
                // Counted only if nobody counted in between, so writes
                // racing for the last of the budget cannot all pass.
                let counted =
                    self.written.compare_exchange(written, written + bytes, Ordering::SeqCst, Ordering::SeqCst);
                if counted.is_err() {
                    continue;
                }
                if wants_move(written + bytes, budget) {
                    self.wanted.notify_one();
                }
                return;
            }
            // Registered before looking again, so a move or a close between
            // the look above and the wait below is not missed.
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if self.budget.load(Ordering::SeqCst) == 0 || self.written.load(Ordering::SeqCst) != written {
                continue;
            }
            self.wanted.notify_one();
            moved.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_budget_is_half_the_least_free_room_and_never_tiny() {
        assert_eq!(budget(&[64 << 20, 16 << 20, 80 << 20]), 8 << 20);
        assert_eq!(budget(&[100]), MIN_BUDGET);
        assert_eq!(budget(&[]), MIN_BUDGET);
    }

    #[test]
    fn a_move_is_wanted_at_half_the_budget_and_writes_wait_past_it() {
        assert!(!wants_move(3, 8));
        assert!(wants_move(4, 8));
        assert!(!wants_move(100, 0), "no rebuild, no move");
        assert!(admits(7, 1, 8));
        assert!(!admits(7, 2, 8));
        assert!(admits(0, 100, 8), "one write larger than the budget still goes after a move");
        assert!(admits(100, 100, 0));
    }

    #[tokio::test]
    async fn a_write_past_the_budget_waits_for_the_move() {
        let w = Arc::new(JoinWindow::default());
        w.open(8);
        w.admit(4).await;
        assert!(w.wants_move());
        w.admit(4).await;
        let blocked = tokio::spawn({
            let w = w.clone();
            async move { w.admit(1).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!blocked.is_finished(), "the ninth byte waits");
        w.move_wanted().await;
        w.reset();
        tokio::time::timeout(Duration::from_secs(5), blocked).await.expect("released by the move").unwrap();
        assert!(!w.wants_move());
        w.close();
        w.admit(1 << 30).await;
    }
}
