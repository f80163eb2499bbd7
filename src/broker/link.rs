//! What the broker state and one connection share: the connection's
//! outbound queue, its wake-up, the writer's counts and the reader's pause.
//!
//! One `Arc<ConnectionLink>` per connection, two ends over it:
//! [`ConnectionHandle`] (the state's, the only one that ends the queue) and
//! [`Outlet`] (the connection's, the only one that takes from it). It
//! stands in for a tokio unbounded channel, two watch channels and three
//! `Arc`'d counters, because an idle connection paid for all of them up
//! front (a channel header and a first block of 32 slots, two watch
//! headers, three allocations): here everything is inline in the one
//! allocation, and the queue holds no memory while it is empty.
//!
//! A module of its own, not inside the connection or the state: both
//! sides, and the bridge's in-process connection, use it, and its locking
//! is easier to check alone.
//!
//! # Locking and wake-ups
//!
//! The queue, its QoS 0 bytes, the task's waker and the `ended`/`closed`
//! flags sit under one `std::sync::Mutex`, held only to push one packet or
//! to swap the whole queue out (never across an await, never while
//! waking). The consumer
//! registers its waker *under the same lock* in which it finds the queue
//! empty (or the reader paused), and a producer takes the waker under the
//! lock in which it pushes (or lets the reader go): whichever comes first,
//! the other sees it, so a packet queued while the task goes to sleep is
//! never stranded. The waker is taken when used, so a burst of packets
//! wakes the task once; it registers again only when it finds nothing.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::ops::Deref;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use super::state::Outbound;

/// The shared part of one connection's link.
#[derive(Debug, Default)]
pub struct ConnectionLink {
    shared: Mutex<Shared>,
    /// Packets the connection's writer has taken from the queue so far;
    /// only the writer adds to it. What waits for the writer is what the
    /// state sent, plus `foreign`, less this: the state's hot path reads
    /// it and writes nothing shared. Each count is modulo 2^32, as the
    /// state's is: what waits is their wrapping difference (a word each,
    /// where two took the link to the allocator's next class).
    pub written: AtomicU32,
    /// Packets the connection itself put on the queue (re-authentication
    /// answers).
    pub foreign: AtomicU32,
    /// Set by the state when it waits for this connection's queue to
    /// drain; the writer then sends `Event::Drained` once it is below half.
    pub want_drained: AtomicBool,
    /// The reader stops reading while this is true (the client's own
    /// packets wait in the socket: backpressure). Written under the lock,
    /// so that letting the reader go and the reader going to sleep are
    /// ordered; read without it.
    paused: AtomicBool,
    /// The keep-alive timer found the client silent past its limit
    /// ([`super::keep_alive`]). Set before the timer takes the waker under
    /// the lock, read under it by the task that registers the waker.
    silent: AtomicBool,
    /// The keep-alive timer found the client quiet long enough to park
    /// its connection ([`super::parking`]). Set before the timer takes the
    /// waker, taken by the task once it finds nothing to do.
    park: AtomicBool,
    /// The round of the keep-alive timer's entry for this connection
    /// (above the lowest bit) and whether it told the connection to park
    /// (the lowest bit): a hearing after it was told starts a new round
    /// ([`super::keep_alive`]), and an entry of an earlier round is
    /// dropped. One word, where a flag and a count took the link to the
    /// allocator's next class.
    park_round: AtomicU32,
    /// When the connection last heard its client, in its keep-alive
    /// timer's time, or [`super::keep_alive::NOT_TIMED`] while the
    /// client's silence does not count. Written by the connection, read
    /// by the timer.
    pub heard: AtomicU64,
}

/// What the lock guards.
#[derive(Debug, Default)]
struct Shared {
    /// Packets for the writer, in the order queued. Empty, it holds no
    /// memory once the writer has gone to sleep on it.
    queue: VecDeque<Outbound>,
    /// The connection's task, when it found nothing to do.
    waker: Option<Waker>,
    /// The state let go of its handle: nothing more will be queued.
    ended: bool,
    /// The connection's outlet is gone: a send fails.
    closed: bool,
    /// What the QoS 0 deliveries on the queue count ([`qos0_bytes`]).
    queued_bytes: u32,
    /// What those the writer took last count: it takes more only once it
    /// has written all it took, so until then they wait too.
    taken_bytes: u32,
}

/// What `packet` counts toward the QoS 0 bytes waiting for a writer: a QoS
/// 0 delivery's topic and payload, as a session's queue counts them
/// against `limits.max_queued_bytes`; nothing for any other packet.
/// Modulo 2^32, as the link keeps the sum.
pub fn qos0_bytes(packet: &Outbound) -> u32 {
    match packet {
        Outbound::Publish {
            qos: 0, message, ..
        } => message.queued_bytes() as u32,
        _ => 0,
    }
}

/// What [`ConnectionLink::send_within`] did with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// The QoS 0 deliveries waiting already count the bound: not queued.
    Full,
    /// The connection is gone: not queued.
    Gone,
}

impl Shared {
    fn push(&mut self, packet: Outbound) {
        self.queued_bytes = self.queued_bytes.wrapping_add(qos0_bytes(&packet));
        self.queue.push_back(packet);
    }

    /// What the QoS 0 deliveries not yet written count: those queued and
    /// those the writer took last. Modulo 2^32, exact while what waits is
    /// below 4 GiB: a bounded client's live QoS 0 is refused past a bound
    /// below 2 GiB ([`ConnectionLink::send_within`]), and what else waits
    /// (retained messages owed, a consumer's deliveries) is bounded by the
    /// writer's packet count.
    fn qos0_waiting(&self) -> u32 {
        self.queued_bytes.wrapping_add(self.taken_bytes)
    }
}

impl ConnectionLink {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // Nothing under the lock panics but an allocation failure; what it
        // guards stays consistent in any case.
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queue `packet` behind what is queued, waking the connection's task
    /// if it sleeps. `Err` gives it back when the connection is gone.
    pub fn send(&self, packet: Outbound) -> Result<(), Outbound> {
        let waker = {
            let mut shared = self.lock();
            if shared.closed {
                return Err(packet);
            }
            shared.push(packet);
            shared.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }

    /// [`Self::send`] of a QoS 0 delivery, unless the QoS 0 deliveries
    /// waiting for the writer already count `bound` bytes or more
    /// ([`qos0_bytes`]); `None` is no bound. One delivery always goes to a
    /// writer that keeps up, and what waits stays below the bound and one
    /// delivery. `bound` is below 2 GiB, so the sum stays exact.
    pub fn send_within(&self, packet: Outbound, bound: Option<u32>) -> Sent {
        debug_assert!(bound.is_none_or(|b| b < 1 << 31));
        let waker = {
            let mut shared = self.lock();
            if shared.closed {
                return Sent::Gone;
            }
            if bound.is_some_and(|b| shared.qos0_waiting() >= b) {
                drop(shared);
                // Dropped outside the lock, as a queue let go is.
                drop(packet);
                return Sent::Full;
            }
            shared.push(packet);
            shared.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Sent::Queued
    }

    /// What the QoS 0 deliveries not yet written count ([`qos0_bytes`]).
    pub fn qos0_waiting(&self) -> u32 {
        self.lock().qos0_waiting()
    }

    /// [`Self::send`] of every packet of `packets`, in order, under one
    /// lock; `packets` is left empty. False when the connection is gone
    /// (the packets are dropped with it).
    pub fn send_all(&self, packets: &mut Vec<Outbound>) -> bool {
        let waker = {
            let mut shared = self.lock();
            if shared.closed {
                packets.clear();
                return false;
            }
            for packet in packets.drain(..) {
                shared.push(packet);
            }
            shared.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }

    /// Whether the reader is to stop reading.
    pub fn paused(&self) -> bool {
        self.paused.load(Acquire)
    }

    /// Pause or let go of the reader. Wakes it only when this changes it:
    /// most answers released leave an unpaused reader unpaused.
    pub fn set_paused(&self, paused: bool) {
        let waker = {
            let mut shared = self.lock();
            if self.paused.load(Acquire) == paused {
                return;
            }
            self.paused.store(paused, Release);
            shared.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Tell the connection its client was silent past its keep alive,
    /// waking its task.
    pub fn tell_silent(&self) {
        self.silent.store(true, Release);
        let waker = self.lock().waker.take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Tell the connection its client has been quiet long enough for it to
    /// park, waking its task.
    pub fn tell_park(&self) {
        self.park.store(true, Release);
        let waker = self.lock().waker.take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The keep-alive timer's round for this connection.
    pub fn park_round(&self) -> u32 {
        self.park_round.load(Relaxed) >> 1
    }

    /// The keep-alive timer told the connection to park, in this round.
    pub fn told_to_park(&self) {
        self.park_round.fetch_or(1, Relaxed);
    }

    /// The client was heard: when it was told to park since the round
    /// began, a new round begins, and this is it.
    pub fn next_park_round(&self) -> Option<u32> {
        let round = self.park_round.load(Relaxed);
        if round & 1 == 0 {
            return None;
        }
        let next = (round & !1).wrapping_add(2);
        self.park_round
            .compare_exchange(round, next, Relaxed, Relaxed)
            .ok()
            .map(|_| next >> 1)
    }

    /// Whether the connection was told to park; it is told once.
    pub fn take_park(&self) -> bool {
        // Read first: every poll that finds nothing to do asks, and a
        // swap would take the line from the state's core each time.
        self.park.load(Acquire) && self.park.swap(false, AcqRel)
    }

    /// Hand the connection's wake-ups to `waker` (the parked connection's)
    /// in place of its task's: only when its task sleeps with nothing
    /// owed to it. `false` when a wake-up was taken since the task
    /// registered (it is about to be polled again), a packet waits, the
    /// reader is paused, the client was told silent or the state let go:
    /// the task goes on.
    pub fn park_with(&self, waker: Waker) -> bool {
        let mut shared = self.lock();
        let idle = shared.waker.is_some()
            && shared.queue.is_empty()
            && !shared.ended
            && !shared.closed
            && !self.paused.load(Acquire)
            && !self.silent.load(Acquire);
        if idle {
            shared.waker = Some(waker);
        }
        idle
    }

    /// Whether the keep-alive timer told the connection its client was
    /// silent. Read after the task's waker was registered under the lock,
    /// it cannot miss the timer: the timer sets it before it takes the
    /// waker.
    pub fn silent(&self) -> bool {
        self.silent.load(Acquire)
    }

    /// Whether the keep-alive timer told the connection its client was
    /// silent, and it is no longer told so: the client was heard after
    /// all.
    pub fn take_silent(&self) -> bool {
        self.silent.swap(false, AcqRel)
    }

    /// Packets queued and not taken yet by the outlet.
    pub fn queued(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether the state let go of its handle.
    pub fn ended(&self) -> bool {
        self.lock().ended
    }

    /// Queue an answer of the connection's own, counted in `foreign`; not
    /// queued once the state let go (it alone decides when the queue ends)
    /// or the connection is gone.
    pub fn send_own(&self, packet: Outbound) -> bool {
        let waker = {
            let mut shared = self.lock();
            if shared.ended || shared.closed {
                return false;
            }
            shared.push(packet);
            // Counted before the lock is let go: the writer cannot have
            // taken it yet, so the state never sees it written and not
            // queued.
            self.foreign.fetch_add(1, Release);
            shared.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }
}

/// Register `cx`'s waker (once: the same task polls every time).
fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(waker) if waker.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

/// A new link: the state's end and the connection's.
pub fn link() -> (ConnectionHandle, Outlet) {
    let link = Arc::new(ConnectionLink::default());
    (ConnectionHandle { link: link.clone() }, Outlet { link })
}

/// The state's end of a connection's link. Dropping it ends the queue: the
/// writer writes what is queued and stops.
#[derive(Debug)]
pub struct ConnectionHandle {
    link: Arc<ConnectionLink>,
}

impl Deref for ConnectionHandle {
    type Target = ConnectionLink;

    fn deref(&self) -> &ConnectionLink {
        &self.link
    }
}

impl Drop for ConnectionHandle {
    fn drop(&mut self) {
        let waker = {
            let mut shared = self.link.lock();
            shared.ended = true;
            shared.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The connection's end of its link. Dropping it (the connection's task
/// ended) drops what is still queued and makes every later send fail, as
/// the receiver of a channel would.
#[derive(Debug)]
pub struct Outlet {
    link: Arc<ConnectionLink>,
}

impl Deref for Outlet {
    type Target = ConnectionLink;

    fn deref(&self) -> &ConnectionLink {
        &self.link
    }
}

impl Outlet {
    /// The shared link, for what queues the connection's own answers.
    pub fn link(&self) -> Arc<ConnectionLink> {
        self.link.clone()
    }

    /// Move everything queued into `into` (which must be empty) in one
    /// lock: `Ready(true)`. `Ready(false)` once the queue is empty and the
    /// state let go of it. Called only once everything taken before is
    /// written (or given up), so the QoS 0 bytes that counted no longer
    /// wait. Pending otherwise, the task's waker registered
    /// in the same lock as the queue was found empty, and the queue's
    /// memory (and `into`'s) given back: the task goes to sleep holding
    /// none.
    pub fn poll_take(&self, cx: &Context<'_>, into: &mut VecDeque<Outbound>) -> Poll<bool> {
        debug_assert!(into.is_empty());
        let mut shared = self.link.lock();
        // The writer asks again only once it has written all it took.
        shared.taken_bytes = std::mem::take(&mut shared.queued_bytes);
        if !shared.queue.is_empty() {
            // The writer's spent deque comes back as the queue: a busy
            // connection reuses the same two allocations.
            std::mem::swap(&mut shared.queue, into);
            return Poll::Ready(true);
        }
        if shared.ended {
            return Poll::Ready(false);
        }
        register(&mut shared.waker, cx);
        if shared.queue.capacity() > 0 {
            shared.queue = VecDeque::new();
        }
        drop(shared);
        if into.capacity() > 0 {
            *into = VecDeque::new();
        }
        Poll::Pending
    }

    /// Ready once the keep-alive timer told the connection its client was
    /// silent; Pending otherwise, the task's waker registered in the lock
    /// the timer takes it in.
    pub fn poll_silent(&self, cx: &Context<'_>) -> Poll<()> {
        let mut shared = self.link.lock();
        if self.link.silent.load(Acquire) {
            return Poll::Ready(());
        }
        register(&mut shared.waker, cx);
        Poll::Pending
    }

    /// Ready once the reader is no longer paused: `true`, or `false` when
    /// the state let go of the link while the reader was paused.
    pub fn poll_unpaused(&self, cx: &Context<'_>) -> Poll<bool> {
        let mut shared = self.link.lock();
        if !self.link.paused.load(Acquire) {
            return Poll::Ready(true);
        }
        if shared.ended {
            return Poll::Ready(false);
        }
        register(&mut shared.waker, cx);
        Poll::Pending
    }

    /// Wait until something is queued (moved into `into`), or `false` once
    /// the state let go.
    pub async fn take(&self, into: &mut VecDeque<Outbound>) -> bool {
        poll_fn(|cx| self.poll_take(cx, into)).await
    }
}

impl Drop for Outlet {
    fn drop(&mut self) {
        let left = {
            let mut shared = self.link.lock();
            shared.closed = true;
            shared.waker = None;
            std::mem::take(&mut shared.queue)
        };
        // Dropped outside the lock: a delivery's message may be the last
        // reference to a large payload.
        drop(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering::Relaxed;
    use std::task::Wake;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    fn counting() -> (Arc<Counting>, Waker) {
        let count = Arc::new(Counting::default());
        (count.clone(), Waker::from(count))
    }

    fn ping(id: u16) -> Outbound {
        Outbound::PubAck {
            packet_id: id,
            reason: crate::broker::codec::ReasonCode::Success,
        }
    }

    fn ids(queue: &VecDeque<Outbound>) -> Vec<u16> {
        queue
            .iter()
            .map(|o| match o {
                Outbound::PubAck { packet_id, .. } => *packet_id,
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    fn qos0(payload: usize) -> Outbound {
        let message = crate::broker::message::Message {
            topic: "t".into(),
            payload: bytes::Bytes::from(vec![0; payload]),
            qos: 0,
            retain: false,
            properties: Default::default(),
            received_at: tokio::time::Instant::now(),
            channel_offset: None,
            wire: Default::default(),
        };
        Outbound::Publish {
            packet_id: 0,
            qos: 0,
            retain: false,
            dup: false,
            message: Arc::new(message),
            subscription_ids: Vec::new(),
            expiry: None,
            sys: false,
        }
    }

    #[test]
    fn qos0_deliveries_count_their_bytes_until_written() {
        let (handle, outlet) = link();
        let (_, waker) = counting();
        let cx = Context::from_waker(&waker);
        handle.send(qos0(99)).unwrap();
        handle.send(ping(1)).unwrap();
        assert_eq!(
            handle.qos0_waiting(),
            100,
            "topic and payload; acks count none"
        );
        assert_eq!(handle.send_within(qos0(49), Some(101)), Sent::Queued);
        assert_eq!(handle.send_within(qos0(9), Some(150)), Sent::Full);
        let mut taken = VecDeque::new();
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Ready(true));
        assert_eq!(taken.len(), 3);
        assert_eq!(handle.qos0_waiting(), 150, "taken, not yet written");
        // The writer asks again once it has written them.
        taken.clear();
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Pending);
        assert_eq!(handle.qos0_waiting(), 0);
        assert_eq!(
            handle.send_within(qos0(9), Some(1)),
            Sent::Queued,
            "one always goes"
        );
        assert_eq!(handle.send_within(qos0(9), Some(1)), Sent::Full);
        drop(outlet);
        assert_eq!(handle.send_within(qos0(9), Some(1_000)), Sent::Gone);
    }

    #[test]
    fn packets_are_taken_in_the_order_they_were_queued() {
        let (handle, outlet) = link();
        let (_, waker) = counting();
        let cx = Context::from_waker(&waker);
        let mut taken = VecDeque::new();
        for id in 1..=5 {
            handle.send(ping(id)).unwrap();
        }
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Ready(true));
        assert_eq!(ids(&taken), [1, 2, 3, 4, 5]);
        taken.clear();
        handle.send(ping(6)).unwrap();
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Ready(true));
        assert_eq!(ids(&taken), [6]);
        assert_eq!(outlet.queued(), 0);
    }

    /// Packets sent together follow those sent before them, in their
    /// order, and wake a sleeping writer once; to a gone connection they
    /// fail and are dropped.
    #[test]
    fn packets_sent_together_are_queued_in_order_behind_the_others() {
        let (handle, outlet) = link();
        let (wakes, waker) = counting();
        let cx = Context::from_waker(&waker);
        let mut taken = VecDeque::new();
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Pending);
        handle.send(ping(1)).unwrap();
        let mut together = vec![ping(2), ping(3), ping(4)];
        assert!(handle.send_all(&mut together));
        assert!(together.is_empty());
        assert_eq!(wakes.0.load(Relaxed), 1, "one wake for the writer asleep");
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Ready(true));
        assert_eq!(ids(&taken), [1, 2, 3, 4]);
        drop(outlet);
        let mut late = vec![ping(5), ping(6)];
        assert!(!handle.send_all(&mut late));
        assert!(late.is_empty());
        assert_eq!(handle.queued(), 0);
    }

    #[test]
    fn a_send_after_the_connection_is_gone_fails_and_gives_the_packet_back() {
        let (handle, outlet) = link();
        handle.send(ping(1)).unwrap();
        drop(outlet);
        assert_eq!(handle.queued(), 0, "what was queued is dropped with it");
        let Err(Outbound::PubAck { packet_id: 2, .. }) = handle.send(ping(2)) else {
            panic!("a send to a gone connection must fail");
        };
        assert!(!handle.send_own(ping(3)));
    }

    #[test]
    fn the_queue_ends_after_what_was_queued_once_the_state_lets_go() {
        let (handle, outlet) = link();
        let (_, waker) = counting();
        let cx = Context::from_waker(&waker);
        let mut taken = VecDeque::new();
        handle.send(ping(1)).unwrap();
        drop(handle);
        assert!(!outlet.send_own(ping(9)), "the state alone ends the queue");
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Ready(true));
        assert_eq!(ids(&taken), [1]);
        taken.clear();
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Ready(false));
    }

    /// The task finds the queue empty and registers; a packet queued right
    /// after (before the task sleeps, or after) wakes it exactly once, and
    /// the packets queued while it is awake wake nobody.
    #[test]
    fn a_packet_queued_as_the_task_goes_to_sleep_wakes_it_once() {
        let (handle, outlet) = link();
        let (count, waker) = counting();
        let cx = Context::from_waker(&waker);
        let mut taken = VecDeque::new();
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Pending);
        handle.send(ping(1)).unwrap();
        handle.send(ping(2)).unwrap();
        assert_eq!(count.0.load(Relaxed), 1, "one wake for the burst");
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Ready(true));
        assert_eq!(ids(&taken), [1, 2]);
        taken.clear();
        // Awake and not registered: a send wakes nobody, and the packet is
        // found by the next look.
        handle.send(ping(3)).unwrap();
        assert_eq!(count.0.load(Relaxed), 1);
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Ready(true));
        assert_eq!(ids(&taken), [3]);
        taken.clear();
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Pending);
        drop(handle);
        assert_eq!(count.0.load(Relaxed), 2, "the end of the queue wakes it");
    }

    /// The race itself, on two threads: whichever of the send and the
    /// task's look takes the lock first, the packet is either found by the
    /// look or wakes the task. Repeated to cover both orders; no timing.
    #[test]
    fn a_send_racing_the_tasks_look_is_never_stranded() {
        for _ in 0..1000 {
            let (handle, outlet) = link();
            let (count, waker) = counting();
            let sender = std::thread::spawn(move || {
                handle.send(ping(1)).unwrap();
                handle
            });
            let cx = Context::from_waker(&waker);
            let mut taken = VecDeque::new();
            let found = outlet.poll_take(&cx, &mut taken);
            let handle = sender.join().unwrap();
            match found {
                Poll::Ready(true) => assert_eq!(ids(&taken), [1]),
                Poll::Pending => {
                    assert_eq!(count.0.load(Relaxed), 1, "slept and not woken");
                    assert_eq!(outlet.queued(), 1);
                }
                Poll::Ready(false) => panic!("the queue did not end"),
            }
            drop(handle);
        }
    }

    #[test]
    fn letting_a_paused_reader_go_wakes_it() {
        let (handle, outlet) = link();
        let (count, waker) = counting();
        let cx = Context::from_waker(&waker);
        assert_eq!(outlet.poll_unpaused(&cx), Poll::Ready(true));
        handle.set_paused(true);
        assert!(outlet.paused());
        assert_eq!(outlet.poll_unpaused(&cx), Poll::Pending);
        handle.set_paused(true);
        assert_eq!(count.0.load(Relaxed), 0, "no change, no wake");
        handle.set_paused(false);
        assert_eq!(count.0.load(Relaxed), 1);
        assert_eq!(outlet.poll_unpaused(&cx), Poll::Ready(true));
        handle.set_paused(true);
        assert_eq!(outlet.poll_unpaused(&cx), Poll::Pending);
        drop(handle);
        assert_eq!(outlet.poll_unpaused(&cx), Poll::Ready(false));
    }

    /// An idle connection's link is one allocation: the Arc's, with the
    /// queue holding no memory, even after packets went through it.
    #[test]
    fn an_idle_link_holds_no_memory_beyond_its_own() {
        assert!(
            std::mem::size_of::<ConnectionLink>() <= 96,
            "{}",
            std::mem::size_of::<ConnectionLink>()
        );
        let (handle, outlet) = link();
        let (_, waker) = counting();
        let cx = Context::from_waker(&waker);
        let mut taken = VecDeque::new();
        assert_eq!(handle.lock().queue.capacity(), 0);
        for id in 0..100 {
            handle.send(ping(id)).unwrap();
        }
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Ready(true));
        taken.clear();
        assert_eq!(outlet.poll_take(&cx, &mut taken), Poll::Pending);
        assert_eq!(handle.lock().queue.capacity(), 0);
        assert_eq!(taken.capacity(), 0);
    }
}
