//! A part of a table entry that most entries never use, allocated the first
//! time it is changed.
//!
//! The state's session and connection tables hold an entry per client, and
//! most clients (idle devices, QoS 0 publishers) never fill their queues,
//! in-flight tables or QoS 2 holds; most messages carry no MQTT 5
//! properties ([`crate::broker::message::MessageProperties`]). Inline, each
//! of those is 24-160 bytes of every entry or message; lazily boxed, it is
//! one pointer until it is first changed. It reads as its type (empty
//! while unallocated), so the flows that use it read the same either way.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// `T`, boxed the first time it is changed; reading an unallocated one
/// reads [`Empty::empty`].
#[derive(Clone)]
pub struct Lazy<T>(Option<Box<T>>);

/// A type with one shared, never changed empty value, read in place of a
/// [`Lazy`] that was never allocated.
pub trait Empty: Default + 'static {
    fn empty() -> &'static Self;
}

/// `impl Empty for $ty`, its empty value the `static` `$value`.
macro_rules! empty {
    ($ty:ty, $value:expr) => {
        impl $crate::broker::lazy::Empty for $ty {
            fn empty() -> &'static Self {
                static EMPTY: $ty = $value;
                &EMPTY
            }
        }
    };
}
pub(crate) use empty;

impl<T> Lazy<T> {
    /// Holds no memory of its own.
    pub const fn new() -> Self {
        Lazy(None)
    }

    /// It was changed at some point (and holds memory since).
    pub fn is_allocated(&self) -> bool {
        self.0.is_some()
    }

    /// The value, if it was ever changed: for a flow that changes it only
    /// when it holds something (a resume draining its queue).
    pub fn allocated_mut(&mut self) -> Option<&mut T> {
        self.0.as_deref_mut()
    }

    /// Takes the value, leaving it unallocated.
    pub fn take(&mut self) -> Option<T> {
        self.0.take().map(|boxed| *boxed)
    }

    /// The value as owned: the empty one when it was never changed.
    pub fn into_inner(self) -> T
    where
        T: Default,
    {
        self.0.map(|boxed| *boxed).unwrap_or_default()
    }

    /// `value` as it is, boxed: for a value known to hold something.
    pub fn boxed(value: T) -> Self {
        Lazy(Some(Box::new(value)))
    }
}

/// Equal when they read the same: one changed and then emptied again
/// equals one never changed.
impl<T: Empty + PartialEq> PartialEq for Lazy<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Empty + Eq> Eq for Lazy<T> {}

impl<T> Default for Lazy<T> {
    fn default() -> Self {
        Lazy::new()
    }
}

impl<T: Empty> Deref for Lazy<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.0.as_deref().unwrap_or_else(|| T::empty())
    }
}

impl<T: Empty> DerefMut for Lazy<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.get_or_insert_with(Box::default)
    }
}

impl<T: Empty + fmt::Debug> fmt::Debug for Lazy<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        T::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq)]
    struct Counts {
        values: Vec<u32>,
    }
    empty!(Counts, Counts { values: Vec::new() });

    #[test]
    fn reading_allocates_nothing_and_a_change_allocates_once() {
        let mut lazy: Lazy<Counts> = Lazy::new();
        assert_eq!(std::mem::size_of_val(&lazy), 8);
        assert!(lazy.values.is_empty());
        assert!(!lazy.is_allocated());
        assert!(lazy.allocated_mut().is_none());
        lazy.values.push(7);
        assert!(lazy.is_allocated());
        assert_eq!(lazy.values, [7]);
        assert_eq!(lazy.take(), Some(Counts { values: vec![7] }));
        assert!(!lazy.is_allocated());
    }
}
