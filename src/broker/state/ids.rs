//! Maps and sets keyed by the integers the broker allocates (session keys,
//! connection generations, tickets) and by packet identifiers.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A fast hasher for the integer keys the broker allocates (session keys,
/// connection generations) and for packet identifiers (at most 65535 per
/// session): a multiply-rotate mix instead of SipHash on the hot path.
/// Strings a client chooses (client ids) keep the standard hasher.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

const ID_HASH_K: u64 = 0x517c_c1b7_2722_0a95;

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(ID_HASH_K);
        }
    }
    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(ID_HASH_K);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Maps and sets keyed by broker-allocated integers or packet ids.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;
