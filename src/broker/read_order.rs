//! The order in which connections' sockets became readable, so the single
//! writer takes packets from several connections in the order they arrived
//! rather than in the order their tasks happened to run.
//!
//! Why it is needed. A client that SUBSCRIBEs on one connection while
//! another client PUBLISHes on a second connection a moment later expects
//! the subscription to take effect first, as a broker with one event loop
//! gives it (MQTT promises no order across connections, but scripts and
//! test suites assume it). The runtime breaks that order when both sockets
//! become readable in one poll of its I/O driver: it runs the task it woke
//! last first (tokio's multi-thread scheduler keeps the last task woken in
//! a slot of its own, ahead of its queue), so the PUBLISH was read and
//! handed to the state before the SUBSCRIBE's task was even polled.
//!
//! What is done. Each connection's socket is read through [`Stamped`],
//! which hands the I/O driver a waker of its own: the driver calls wakers
//! in the order the sockets became readable, so the stamp a wake takes
//! from one counter ([`next_stamp`]) is that order. A read the stamp led
//! to carries it ([`ReadOrder::last`]) in its `Event::Packets`. Bytes that
//! arrive while a reader is busy (between handing its last packets on and
//! its next read) wake nobody: the reader holds a stamp taken as it handed
//! on, the earliest they could have come, and the read that finds them
//! takes it. A stamp is held in a ring of slots ([`PENDING`], a slot per
//! stamp modulo its size, written and cleared with one atomic each: no
//! lock on the readers' path) until the reader has handed its packets on,
//! found nothing to read or was paused. The broker task, when a batch of
//! events holds packets and is not full, waits for the readers holding a
//! stamp older than the latest of them ([`Watermark::wait_before`]: a
//! reader releasing a stamp rings it while the broker task waits, and it
//! waits at most [`ORDER_WAIT`]), takes what they sent (and what a reader
//! that let go of its stamp as the batch was taken sent: a reader hands
//! its packets on before it lets go), and hands each run of packet events
//! to the state in stamp order ([`sort_packets`]). One connection's own
//! packets keep their order (its stamps only grow).
//!
//! What was not done. tokio's `Builder::disable_lifo_slot` would keep the
//! wake order, but it exists only under `--cfg tokio_unstable`; a
//! current-thread runtime keeps it too, at the cost of the second core
//! the connections' reads and writes use. A first version of this module
//! kept the stamps held in one `Mutex<BTreeSet>`, locked at every wake and
//! every read; the ring costs the readers an atomic or two instead.
//!
//! Its limits. A full batch (the broker behind its readers) is not waited
//! for: the wait is for packets arriving together, not for a backlog. A
//! stamp more than [`RING`] wakes older than the batch's latest is not
//! waited for (its slot was reused). A reader whose worker thread the
//! machine takes away for longer than [`ORDER_WAIT`] is passed over.

use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use super::state::Event;

/// The longest the broker task waits, for one batch, for readers woken
/// before the packets it holds. They are runnable and usually come within
/// microseconds; the bound is for a worker thread the machine took away
/// for a while.
pub const ORDER_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// Slots of the ring of stamps held: how far back a wake can be told.
pub const RING: usize = 4096;

/// One counter for every connection: each wake of a reader, and each read
/// no wake led to, takes the next value.
static READABLE: AtomicU64 = AtomicU64::new(1);

/// The stamps of readers woken whose packets have not been handed to the
/// state yet, each in slot `stamp % RING` (0: none).
static PENDING: [AtomicU64; RING] = [const { AtomicU64::new(0) }; RING];

fn slot(stamp: u64) -> &'static AtomicU64 {
    &PENDING[(stamp % RING as u64) as usize]
}

/// The next stamp, for packets that come from no socket (a bridge's local
/// connection) or a read that found its bytes without a wake.
pub fn next_stamp() -> u64 {
    READABLE.fetch_add(1, Relaxed)
}

/// `stamp` is held until its packets reach the state.
fn hold(stamp: u64) {
    slot(stamp).store(stamp, Release);
}

/// `stamp` (0: none) is no longer waited for. A slot a later stamp took
/// over is left alone. The broker task, when it waits, is told.
fn release(stamp: u64) {
    // Sequentially consistent on both sides: the broker task sets
    // WAITING and then looks at the slots, a reader clears its slot and
    // then looks at WAITING, so one of them sees the other.
    if stamp != 0
        && slot(stamp)
            .compare_exchange(stamp, 0, SeqCst, Relaxed)
            .is_ok()
        && WAITING.load(SeqCst)
    {
        HANDED_ON.notify_one();
    }
}

/// Set while the broker task waits for a held stamp.
static WAITING: AtomicBool = AtomicBool::new(false);

/// Rung when a held stamp is released while the broker task waits.
static HANDED_ON: Notify = Notify::const_new();

/// The broker task's place in the ring: below it, no stamp is waited for.
#[derive(Debug)]
pub struct Watermark(u64);

impl Default for Watermark {
    fn default() -> Self {
        Watermark(READABLE.load(Acquire))
    }
}

impl Watermark {
    /// Waits, at most until `deadline`, until every reader woken before
    /// `stamp` has handed its packets on (`Event::Packets` queued to the
    /// broker task). Past the deadline what is still held below `stamp`
    /// is not waited for again.
    pub async fn wait_before(&mut self, stamp: u64, deadline: tokio::time::Instant) {
        loop {
            let rung = HANDED_ON.notified();
            tokio::pin!(rung);
            rung.as_mut().enable();
            WAITING.store(true, SeqCst);
            if !self.woken_before(stamp) {
                break;
            }
            if tokio::time::timeout_at(deadline, rung).await.is_err() {
                self.0 = self.0.max(stamp);
                break;
            }
        }
        WAITING.store(false, Relaxed);
    }

    /// Was a reader woken before `stamp` whose packets have not reached
    /// the state? (Its task has not run yet, or is reading them now.)
    pub fn woken_before(&mut self, stamp: u64) -> bool {
        self.0 = self.0.max(stamp.saturating_sub(RING as u64));
        while self.0 < stamp {
            if slot(self.0).load(SeqCst) == self.0 {
                return true;
            }
            self.0 += 1;
        }
        false
    }
}

/// One connection's stamps, shared by its transport, the waker the I/O
/// driver holds and its reader loop.
#[derive(Debug)]
struct Stamp {
    /// The stamp of the first wake since the last read; 0 when none.
    woken: AtomicU64,
    /// The stamp the last read took from a wake, held in [`PENDING`] until
    /// its packets are handed on; 0 when none.
    held: AtomicU64,
    /// The stamp of the last read that returned bytes.
    last: AtomicU64,
    /// Taken (and held) when the reader handed its packets on, until it
    /// next reads: bytes that arrive while it is busy wake nobody, and are
    /// found by that read with this stamp, as early as they could have
    /// come. 0 when none.
    busy: AtomicU64,
    /// The connection task's own waker.
    task: Mutex<Option<Waker>>,
}

impl Stamp {
    fn forget(stamp: u64) {
        release(stamp);
    }
}

impl Wake for Stamp {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.woken.load(Relaxed) == 0 {
            // Held before it is published, so a broker task that finds no
            // earlier stamp held has seen every wake before.
            let stamp = next_stamp();
            hold(stamp);
            if self
                .woken
                .compare_exchange(0, stamp, Relaxed, Relaxed)
                .is_err()
            {
                release(stamp);
            }
        }
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = task.as_ref() {
            task.wake_by_ref();
        }
    }
}

/// A connection's read order, as its reader loop sees it.
#[derive(Clone, Debug)]
pub struct ReadOrder(Arc<Stamp>);

impl ReadOrder {
    /// The stamp of the last read that returned bytes.
    pub fn last(&self) -> u64 {
        self.0.last.load(Relaxed)
    }

    /// The packets of the last read were handed to the state (or it held
    /// none): nobody waits for them any more. Until it reads again the
    /// reader is busy, and bytes arriving meanwhile wake nobody: it holds
    /// a stamp of this moment for them.
    pub fn handed_on(&self) {
        Stamp::forget(self.0.held.swap(0, Relaxed));
        let busy = next_stamp();
        hold(busy);
        Stamp::forget(self.0.busy.swap(busy, Relaxed));
    }

    /// The reader stops reading for a while (paused by the state, or gone):
    /// nothing of it is waited for meanwhile.
    pub fn set_aside(&self) {
        Stamp::forget(self.0.held.swap(0, Relaxed));
        Stamp::forget(self.0.busy.swap(0, Relaxed));
        Stamp::forget(self.0.woken.swap(0, Relaxed));
    }
}

/// A transport whose reads are stamped in the order its socket became
/// readable among every connection's. Writes pass through.
pub struct Stamped<S> {
    /// Dropped before the stamps are set aside: a wake the transport's
    /// registration gives while it goes would hold a stamp nobody lets go.
    inner: ManuallyDrop<S>,
    waker: Waker,
    order: ReadOrder,
}

impl<S> Stamped<S> {
    pub fn new(inner: S) -> Stamped<S> {
        let stamp = Arc::new(Stamp {
            woken: AtomicU64::new(0),
            held: AtomicU64::new(0),
            last: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            task: Mutex::new(None),
        });
        Stamped {
            inner: ManuallyDrop::new(inner),
            order: ReadOrder(stamp.clone()),
            waker: Waker::from(stamp),
        }
    }

    /// `inner`, readable as of now: its stamp is taken as a wake of the
    /// driver would take it (a parked connection its socket resumed, the
    /// lot having seen its bytes in the order they came).
    pub fn readable(inner: S) -> Stamped<S> {
        let stamped = Stamped::new(inner);
        stamped.waker.wake_by_ref();
        stamped
    }

    /// The stream read through.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Where this stream's reads stand among every connection's.
    pub fn order(&self) -> &ReadOrder {
        &self.order
    }
}

impl<S> Drop for Stamped<S> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, and never used again.
        unsafe { ManuallyDrop::drop(&mut self.inner) };
        self.order.set_aside();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Stamped<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let stamp = &this.order.0;
        {
            let mut task = stamp.task.lock().unwrap_or_else(|e| e.into_inner());
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let before = buf.filled().len();
        // The wakes before this poll; one that comes while it polls (the
        // bytes arriving just after the socket was found empty) stays for
        // the read it wakes the task for.
        let woken = stamp.woken.swap(0, Relaxed);
        let busy = stamp.busy.swap(0, Relaxed);
        let mut ours = Context::from_waker(&this.waker);
        let polled = Pin::new(&mut *this.inner).poll_read(&mut ours, buf);
        if let Poll::Ready(Ok(())) = &polled {
            if buf.filled().len() > before {
                // A wake says when the bytes came; without one they came
                // while the reader was busy, since it last handed on.
                let (read, spare) = match (woken, busy) {
                    (0, 0) => match stamp.woken.swap(0, Relaxed) {
                        0 => (next_stamp(), 0),
                        during => (during, 0),
                    },
                    (0, busy) => (busy, 0),
                    (woken, busy) => (woken, busy),
                };
                Stamp::forget(spare);
                stamp.last.store(read, Relaxed);
                // Held until the reader hands the packets on.
                Stamp::forget(stamp.held.swap(read, Relaxed));
                return polled;
            }
        }
        // Nothing read (the reader waits for a wake), the end of the
        // stream or an error: nothing is waited for.
        Stamp::forget(woken);
        Stamp::forget(busy);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Stamped<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Hands each run of consecutive packet events to the state in the order
/// their sockets became readable. Only packet events move, and only among
/// each other: a connection's close or connect stays where it was, and a
/// connection's own packet events keep their order (its stamps grow).
pub fn sort_packets(batch: &mut [Event]) {
    let stamp = |e: &Event| match e {
        Event::Packets { read_order, .. } => Some(*read_order),
        _ => None,
    };
    let mut start = 0;
    while start < batch.len() {
        if stamp(&batch[start]).is_none() {
            start += 1;
            continue;
        }
        let mut end = start + 1;
        while end < batch.len() && stamp(&batch[end]).is_some() {
            end += 1;
        }
        if end - start > 1 {
            batch[start..end].sort_by_key(|e| stamp(e).unwrap_or(u64::MAX));
        }
        start = end;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::broker::metrics::CloseReason;
    use crate::broker::state::Inbound;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection's packets, read in `read_order`.
    pub(crate) fn packets(connection: u64, read_order: u64) -> Event {
        Event::Packets {
            connection,
            packets: vec![Inbound::PingReq],
            read_order,
        }
    }

    /// Each event's connection and read order, as the batch holds them.
    pub(crate) fn order(batch: &[Event]) -> Vec<(u64, u64)> {
        batch
            .iter()
            .map(|e| match e {
                Event::Packets {
                    connection,
                    read_order,
                    ..
                } => (*connection, *read_order),
                Event::Closed { connection, .. } => (*connection, 0),
                _ => (u64::MAX, 0),
            })
            .collect()
    }

    #[test]
    fn packet_events_go_in_the_order_their_sockets_became_readable_and_nothing_else_moves() {
        let mut batch = vec![
            packets(2, 11),
            packets(1, 10),
            Event::Closed {
                connection: 3,
                reason: CloseReason::Network,
                disconnect_reason: None,
            },
            packets(3, 14),
            packets(1, 12),
            packets(4, 13),
        ];
        sort_packets(&mut batch);
        assert_eq!(
            order(&batch),
            vec![(1, 10), (2, 11), (3, 0), (1, 12), (4, 13), (3, 14)]
        );
    }

    #[tokio::test]
    async fn a_read_is_stamped_in_the_order_its_socket_was_woken() {
        let (a, mut a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        let mut a = Stamped::new(a);
        let mut b = Stamped::new(b);
        let mut buf = [0u8; 8];
        // Both readers wait; a's bytes come first, then b's.
        let reads = async {
            let (ra, rb) = tokio::join!(a.read(&mut buf[..4]), async {
                let mut other = [0u8; 4];
                b.read(&mut other).await
            });
            (ra.unwrap(), rb.unwrap())
        };
        let writes = async {
            tokio::task::yield_now().await;
            a_peer.write_all(b"a").await.unwrap();
            b_peer.write_all(b"b").await.unwrap();
        };
        let ((na, nb), ()) = tokio::join!(reads, writes);
        assert_eq!((na, nb), (1, 1));
        let (a, b) = (a.order().last(), b.order().last());
        assert!(a < b, "a {a} b {b}");
    }
}
