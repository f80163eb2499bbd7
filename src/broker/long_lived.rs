//! Blocks made to outlive the burst they are made in: a client's session
//! and connection entries, its client id and link, a parked connection.
//!
//! A CONNECT makes these few among many short-lived blocks of the same
//! sizes (its handshake, its connection's task, state and socket
//! registration, its read buffers), and the allocator fills a page of a
//! size class with whatever that class is asked for next. Once the
//! connection goes quiet and parks, the short-lived blocks are freed, but
//! a page that still holds one long-lived block stays resident: a session
//! entry of 128 B sharing its pages with connection tasks of 128 B kept
//! about as much of them as it saved by shrinking. What is made within
//! [`make`] is asked for with [`asked`] set, and the binary's allocator
//! (`commands/allocator.rs`) gives it pages that hold only such blocks.

use std::cell::Cell;

thread_local! {
    /// Set while [`make`] runs on this thread.
    static ASKED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `make`, its allocations asked for as long-lived: only what makes
/// the long-lived value itself (a `Box::new`, an `Arc::from`), since a
/// temporary made here would be placed among them too.
pub fn make<T>(make: impl FnOnce() -> T) -> T {
    /// Clears the hint again however `make` ends.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = ASKED.try_with(|asked| asked.set(self.0));
        }
    }
    let _restore = Restore(ASKED.with(|asked| asked.replace(true)));
    make()
}

/// Whether the allocation being made is asked for as long-lived. Never
/// allocates: the flag is a constant-initialised cell.
#[inline]
pub fn asked() -> bool {
    ASKED.try_with(Cell::get).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_holds_only_while_the_value_is_made() {
        assert!(!asked());
        let inside = make(|| {
            let nested = make(asked);
            (asked(), nested)
        });
        assert_eq!(inside, (true, true));
        assert!(!asked());
        let unwound = std::panic::catch_unwind(|| make(|| panic!("made nothing")));
        assert!(unwound.is_err());
        assert!(!asked(), "a panic while making clears the hint");
    }
}
