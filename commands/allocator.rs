//! The binary's allocator: mimalloc, asked for a block the way its size
//! classes are filled.
//!
//! mimalloc's aligned entry point serves a size that is not a power of two
//! from the class of its size plus the alignment whenever that class's
//! page has no free block at hand, and a class that only aligned requests
//! ask for never gets a page of its own: every `Box` and `Arc` of 112
//! bytes came from the 128-byte class, every 160 from the 192, every 72
//! with 16-byte alignment from the 96. A block of mimalloc's plain entry
//! point is aligned to 16 bytes (8 in the 8-byte class), so a request
//! asking no more than that and no more than its size (a multiple of its
//! alignment, as every type's size is) takes it, as the system
//! allocator's own binding does; larger alignments keep the aligned entry
//! point.
//!
//! A block the broker asks for as long-lived (`saguin::broker::long_lived`:
//! a client's session and connection entries, its client id and link, a
//! parked connection) comes from a mimalloc heap of its own, whose pages
//! hold only such blocks, so that the short-lived blocks a CONNECT makes
//! beside them leave whole pages behind to give back when they are freed.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

use saguin::broker::long_lived;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

/// A mimalloc heap: blocks made from it lie in pages of its own.
#[repr(C)]
struct Heap {
    _opaque: [u8; 0],
}

extern "C" {
    // In the same library; its binding declares them only with features
    // this build does not need. A heap made by `mi_heap_new` may be
    // allocated from on any thread (mimalloc 3); its blocks are freed by
    // `mi_free` like any other.
    fn mi_collect(force: bool);
    fn mi_heap_new() -> *mut Heap;
    fn mi_heap_delete(heap: *mut Heap);
    fn mi_heap_collect(heap: *mut Heap, force: bool);
    fn mi_heap_malloc(heap: *mut Heap, size: usize) -> *mut c_void;
    fn mi_heap_zalloc(heap: *mut Heap, size: usize) -> *mut c_void;
    fn mi_heap_realloc(heap: *mut Heap, p: *mut c_void, newsize: usize) -> *mut c_void;
}

/// The heap of long-lived blocks, made when the first is asked for.
static LONG_LIVED: AtomicPtr<Heap> = AtomicPtr::new(null_mut());

/// The heap of long-lived blocks, made if it is not yet: null if mimalloc
/// could not make one (the block then comes from the plain heap).
fn long_lived_heap() -> *mut Heap {
    let heap = LONG_LIVED.load(Ordering::Acquire);
    if !heap.is_null() {
        return heap;
    }
    // SAFETY: takes nothing; allocates the heap's own data from mimalloc,
    // not through this allocator.
    let made = unsafe { mi_heap_new() };
    if made.is_null() {
        return made;
    }
    match LONG_LIVED.compare_exchange(null_mut(), made, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => made,
        Err(first) => {
            // Another thread made one first; this one holds no block yet.
            // SAFETY: `made` came from `mi_heap_new` and nothing was made
            // from it.
            unsafe { mi_heap_delete(made) };
            first
        }
    }
}

/// The long-lived heap, when the block being made is asked for as
/// long-lived (`long_lived::asked`) and the heap is at hand.
fn long_lived_asked() -> Option<*mut Heap> {
    if !long_lived::asked() {
        return None;
    }
    Some(long_lived_heap()).filter(|heap| !heap.is_null())
}

/// The alignment every block of mimalloc's plain entry point has, from
/// its 16-byte class up (`MI_MAX_ALIGN_SIZE`).
const PLAIN_ALIGNMENT: usize = 16;

/// mimalloc, each request through the entry point whose block fits it.
pub struct Allocator;

/// Whether a plain block of `size` bytes is aligned to `align`. On a
/// 64-bit target the 8-byte class is aligned to 8 and every larger one to
/// 16; on a 32-bit one a class between 32 and 64 bytes may be a multiple
/// of 8 only, which still aligns a size that is a multiple of its
/// alignment, as every type's is.
fn plain_fits(size: usize, align: usize) -> bool {
    align <= PLAIN_ALIGNMENT && align <= size && size % align == 0
}

/// A block for `layout`: `plain`'s where a plain block fits it, else
/// `aligned`'s.
///
/// # Safety
///
/// `layout` has a non-zero size.
#[inline]
unsafe fn block(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
    long_lived: unsafe extern "C" fn(*mut Heap, usize) -> *mut c_void,
) -> *mut u8 {
    let fits = plain_fits(layout.size(), layout.align());
    if let Some(heap) = fits.then(long_lived_asked).flatten() {
        // SAFETY: a live heap and a non-zero size; its blocks are aligned
        // as plain ones are.
        return unsafe { long_lived(heap, layout.size()) }.cast();
    }
    // SAFETY: both take any non-zero size and a power-of-two alignment,
    // which a layout's is.
    unsafe {
        match fits {
            true => plain(layout.size()),
            false => aligned(layout.size(), layout.align()),
        }
        .cast()
    }
}

// SAFETY: every block comes from mimalloc and goes back to it: `mi_free`
// and `mi_realloc*` take a block of either entry point, and a block is
// aligned as its layout asks ([`plain_fits`], else the aligned entry
// point).
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller gives a layout of non-zero size.
        unsafe { block(layout, mi_malloc, mi_malloc_aligned, mi_heap_malloc) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { block(layout, mi_zalloc, mi_zalloc_aligned, mi_heap_zalloc) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` is a block of this allocator.
        unsafe { mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` is a block of this allocator and `new_size` is not
        // zero; the new block is aligned as the layout asks.
        unsafe {
            if !plain_fits(new_size, layout.align()) {
                return mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast();
            }
            match long_lived_asked() {
                // A long-lived value's growth (a session's subscriptions)
                // stays among long-lived blocks.
                Some(heap) => mi_heap_realloc(heap, ptr.cast(), new_size),
                None => mi_realloc(ptr.cast(), new_size),
            }
            .cast()
        }
    }
}

/// Gives the pages the allocator holds free back to the system. A start
/// that loaded a snapshot directory freed the decoded copies its stores
/// were built from - a few hundred bytes a record - and mimalloc keeps freed
/// pages resident until a later call happens to purge them, seconds after
/// the start (an idle broker's 2,000,000-record start held 1.46 GB for
/// about ten seconds, then 0.90 GB).
pub fn release_free_memory() {
    // SAFETY: mi_collect takes no pointer and may be called from any
    // thread at any time; `force` also visits full pages and returns the
    // memory of abandoned threads' heaps. The long-lived heap, once made,
    // lives as long as the process.
    unsafe {
        mi_collect(true);
        let long_lived = LONG_LIVED.load(Ordering::Acquire);
        if !long_lived.is_null() {
            mi_heap_collect(long_lived, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        fn mi_usable_size(p: *const c_void) -> usize;
    }

    /// A block for each of `layouts`, its usable size, freed after.
    fn usable(layout: Layout, count: usize) -> Vec<usize> {
        let blocks: Vec<*mut u8> = (0..count)
            // SAFETY: the layouts below have a non-zero size.
            .map(|_| unsafe { Allocator.alloc(layout) })
            .collect();
        let sizes = blocks
            .iter()
            .map(|&p| {
                assert!(!p.is_null());
                assert_eq!(p as usize % layout.align(), 0, "{layout:?}");
                // SAFETY: `p` is a live block of mimalloc.
                unsafe { mi_usable_size(p.cast()) }
            })
            .collect();
        for p in blocks {
            // SAFETY: each block is freed once, with its layout.
            unsafe { Allocator.dealloc(p, layout) };
        }
        sizes
    }

    /// A `Box` or `Arc` of a size between mimalloc's powers of two takes
    /// its own class, not the next one up.
    #[test]
    fn a_block_takes_the_class_of_its_size() {
        for (size, align, class) in [
            (8, 8, 8),
            (72, 8, 80),
            (80, 16, 80),
            (112, 8, 112),
            (112, 16, 112),
            (160, 8, 160),
            (160, 16, 160),
        ] {
            let layout = Layout::from_size_align(size, align).unwrap();
            let sizes = usable(layout, 1_000);
            assert!(
                sizes.iter().all(|&s| s == class),
                "{size} B aligned to {align}: {:?}",
                sizes.iter().max()
            );
        }
    }

    /// A block asked for as long-lived lies in a page no other block
    /// shares, of the size its class gives, and is freed like any other.
    #[test]
    fn a_long_lived_block_takes_a_page_of_its_own() {
        extern "C" {
            fn mi_heap_contains(heap: *const Heap, p: *const c_void) -> bool;
        }
        let layout = Layout::from_size_align(128, 8).unwrap();
        // SAFETY: blocks of a non-zero size, each freed once with its
        // layout.
        unsafe {
            let before = Allocator.alloc(layout);
            let kept = long_lived::make(|| Allocator.alloc(layout));
            let after = Allocator.alloc(layout);
            let heap = LONG_LIVED.load(Ordering::Acquire);
            assert!(!heap.is_null());
            assert!(mi_heap_contains(heap, kept.cast()));
            assert!(!mi_heap_contains(heap, before.cast()));
            assert!(!mi_heap_contains(heap, after.cast()));
            assert_eq!(mi_usable_size(kept.cast()), 128);
            let zeroed = long_lived::make(|| Allocator.alloc_zeroed(layout));
            assert!(mi_heap_contains(heap, zeroed.cast()));
            assert!(std::slice::from_raw_parts(zeroed, 128)
                .iter()
                .all(|b| *b == 0));
            zeroed.write_bytes(7, 128);
            let grown = long_lived::make(|| Allocator.realloc(zeroed, layout, 4000));
            assert!(mi_heap_contains(heap, grown.cast()));
            assert!(std::slice::from_raw_parts(grown, 128)
                .iter()
                .all(|b| *b == 7));
            Allocator.dealloc(grown, Layout::from_size_align(4000, 8).unwrap());
            for p in [before, kept, after] {
                Allocator.dealloc(p, layout);
            }
        }
        release_free_memory();
    }

    /// Alignments past what a plain block has are still honoured, and a
    /// grown or shrunk block keeps its alignment and its bytes.
    #[test]
    fn larger_alignments_and_reallocations_are_kept() {
        for (size, align) in [(4, 4), (12, 8), (8, 16), (48, 32), (100, 64), (4096, 4096)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            let _ = usable(layout, 16);
        }
        let layout = Layout::from_size_align(40, 8).unwrap();
        // SAFETY: one block, written within its size, grown, shrunk and
        // freed with the layout of its last size.
        unsafe {
            let p = Allocator.alloc_zeroed(layout);
            assert!(std::slice::from_raw_parts(p, 40).iter().all(|b| *b == 0));
            p.write_bytes(7, 40);
            let p = Allocator.realloc(p, layout, 4000);
            assert_eq!(p as usize % 8, 0);
            assert!(std::slice::from_raw_parts(p, 40).iter().all(|b| *b == 7));
            let grown = Layout::from_size_align(4000, 8).unwrap();
            let p = Allocator.realloc(p, grown, 24);
            assert!(std::slice::from_raw_parts(p, 24).iter().all(|b| *b == 7));
            Allocator.dealloc(p, Layout::from_size_align(24, 8).unwrap());
        }
        let wide = Layout::from_size_align(64, 64).unwrap();
        // SAFETY: as above, with an alignment past a plain block's.
        unsafe {
            let p = Allocator.alloc(wide);
            let p = Allocator.realloc(p, wide, 640);
            assert_eq!(p as usize % 64, 0);
            Allocator.dealloc(p, Layout::from_size_align(640, 64).unwrap());
        }
    }
}
