//! A cap on pops waiting for messages: each holds a task and a timer, never a connection.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts pops that are waiting for messages, up to a cap.
pub(crate) struct WaitingPops {
    now: AtomicUsize,
    max: usize,
}

/// One waiting pop's place; given back when dropped.
pub(crate) struct WaitSlot<'a>(&'a WaitingPops);

impl WaitingPops {
    /// A counter admitting at most `max` waiting pops.
    pub(crate) fn new(max: usize) -> WaitingPops {
        WaitingPops {
            now: AtomicUsize::new(0),
            max,
        }
    }

    /// Pops waiting now, and the most that may.
    pub(crate) fn count(&self) -> (usize, usize) {
        (self.now.load(Ordering::Relaxed), self.max)
    }

    /// A place to wait, or `None` when all are taken.
    pub(crate) fn enter(&self) -> Option<WaitSlot<'_>> {
        let mut n = self.now.load(Ordering::Relaxed);
        loop {
            if n >= self.max {
                return None;
            }
            match self
                .now
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(WaitSlot(self)),
                Err(seen) => n = seen,
            }
        }
    }
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_pops_are_capped_and_places_come_back() {
        let w = WaitingPops::new(2);
        let a = w.enter().unwrap();
        let _b = w.enter().unwrap();
        assert!(w.enter().is_none());
        assert_eq!(w.count(), (2, 2));
        drop(a);
        assert_eq!(w.count(), (1, 2));
        assert!(w.enter().is_some());
    }
}
