//! What an acknowledging consumer costs a publisher: eight QoS 1
//! publishers append 128-byte records to an append channel while 0, 4 or 50
//! consumers of it acknowledge every delivery, on a memory and on a sqlite
//! provider. Beside them, in the same run, the same publishers to a
//! broadcast topic with four QoS 1 subscribers (the memory channel with four
//! consumers and this row run twice each, as channel, broadcast, broadcast,
//! channel, and compared by their means), and the PUBACK latency of a
//! sqlite channel with the publishers paced to 5,000 publishes a second,
//! and of a memory channel with four consumers at that pace without and
//! with background snapshot generations (snapshot_debounce 250ms,
//! snapshot_max_delay 2s), run as without, with, with, without.
//!
//! `cargo bench --bench consumers` (release). Each row starts its own
//! `saguin serve` on a fresh directory, over 127.0.0.1; the clients are raw
//! MQTT 3.1.1 clients on the project's codec, in this process. Every
//! consumer must receive every record (each is told apart by its payload);
//! a missing one fails the run. The publishers of a row publish for a set
//! time, or until a set number of deliveries if that comes first; its
//! publishes/s counts from the first publish to the moment every publish
//! is acknowledged and every consumer has every record, so with consumers
//! it is the rate they keep up with.
//!
//! Environment: `SAGUIN_BENCH_SCALE` (default 1.0) scales how long each
//! row publishes and how much; `SAGUIN_BENCH_ONLY` runs only the rows
//! whose name contains it (or one of its `|`-separated parts); `SAGUIN_BENCH_BASELINE` names an earlier saguin
//! binary, and every row then runs under both builds back to back, the
//! order turning from one pair to the next (this, baseline; baseline,
//! this; ...), `SAGUIN_BENCH_ROUNDS` times (default 1), and each row's
//! rate is compared by the means of its runs.

mod bench_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bench_support::{cpu_time, stop, Conn, CpuTimes, Error};
use bytes::{BufMut, Bytes, BytesMut};
use saguin::broker::codec::{
    ByteStr, Disconnect, Packet, PubAck, Publish, PublishProperties, QoS, ReasonCode, Subscribe,
    SubscribeFilter, SubscribeProperties, SubscriptionOptions,
};

const PUBLISHERS: usize = 8;
const PAYLOAD: usize = 128;
/// Publishes each publisher keeps unacknowledged, and the broker's
/// `limits.receive_maximum`: what bounds the deliveries in flight to each
/// MQTT 3.1.1 consumer.
const WINDOW: usize = 64;
/// How long the publishers of a throughput row publish at scale 1; its
/// readers then take what time they need to catch up.
const PUBLISH_SECS: f64 = 3.0;
/// At most this many publishes per publisher in a row at scale 1, so a
/// broadcast subscriber's queue of them, which the broker is configured to
/// hold whole, stays a bounded size however fast the publishers are.
const MAX_PER_PUBLISHER: f64 = 100_000.0;
/// At most this many deliveries in a row at scale 1: publishers outrun
/// their readers, and without a bound the readers' catching up would take
/// longer the faster the publishers are.
const MAX_DELIVERIES: f64 = 2_000_000.0;
/// The paced rows' total rate, and how long they run at scale 1.
const PACED_RATE: f64 = 5_000.0;
/// Long enough to hold many of the sqlite provider's checkpoints (one a
/// second), so their cost is in the percentiles.
const PACED_SECS: f64 = 10.0;
/// No PUBACK or no delivery for this long is a stall, and fails the row.
const STALL: Duration = Duration::from_secs(30);
const CHANNEL: &str = "telemetry";
const BROADCAST_TOPIC: &str = "bench/x";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Provider {
    Memory,
    Sqlite,
}

impl Provider {
    fn name(self) -> &'static str {
        match self {
            Provider::Memory => "memory",
            Provider::Sqlite => "sqlite",
        }
    }
}

/// Where the publishes go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The append channel `telemetry`; its readers are consumers.
    Channel,
    /// A broadcast topic; its readers are QoS 1 subscribers.
    Broadcast,
}

#[derive(Clone)]
struct Case {
    name: String,
    /// The saguin binary run: `None` for this build's, else an earlier
    /// build (`SAGUIN_BENCH_BASELINE`).
    baseline: Option<PathBuf>,
    provider: Provider,
    target: Target,
    readers: usize,
    /// How long the publishers publish.
    secs: f64,
    /// The most each publisher publishes.
    max_per_publisher: u32,
    /// Publishes a second over all publishers; `None`: as fast as the
    /// window allows.
    rate: Option<f64>,
    /// The reference figures the storage layer was designed against,
    /// publishes a second, low and high of five runs.
    rfc: Option<(f64, f64)>,
    /// A memory provider writes background snapshot generations (250 ms
    /// quiet, at most 2 s) into a directory of the row's.
    snapshots: bool,
}

impl Case {
    /// The row's name, and which build ran it when two did.
    fn label(&self) -> String {
        match self.baseline {
            Some(_) => format!("{} [baseline]", self.name),
            None => self.name.clone(),
        }
    }
}

/// A broker holding every publish of the row for each broadcast
/// subscriber (`limits.max_queued_messages`), so that none is shed.
fn config(dir: &Path, case: &Case) -> Result<PathBuf, Error> {
    let (provider, target) = (case.provider, case.target);
    let queued = PUBLISHERS as u64 * u64::from(case.max_per_publisher);
    let (storage, name) = match provider {
        Provider::Memory if case.snapshots => (
            format!(
                "  - name: mem\n    kind: memory\n    snapshot_dir: {}\n    snapshot_debounce: 250ms\n    snapshot_max_delay: 2s\n",
                dir.join("snapshots").display()
            ),
            "mem",
        ),
        Provider::Memory => ("  - name: mem\n    kind: memory\n".to_owned(), "mem"),
        Provider::Sqlite => (
            format!(
                "  - name: db\n    kind: sqlite\n    file_path: {}\n",
                dir.join("saguin.db").display()
            ),
            "db",
        ),
    };
    let channels = match target {
        Target::Channel => {
            format!("channels:\n  - name: {CHANNEL}\n    kind: append\n    storage: {name}\n")
        }
        Target::Broadcast => String::new(),
    };
    let path = dir.join("saguin.yaml");
    std::fs::write(
        &path,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
             limits:\n  max_queued_messages: {queued}\n  receive_maximum: {WINDOW}\nlog:\n  level: info\n\
             storage:\n{storage}{channels}"
        ),
    )?;
    Ok(path)
}

/// A record's payload: which publisher sent it and its sequence number
/// there, so a consumer tells every record apart.
fn payload(publisher: u32, seq: u32) -> Bytes {
    let mut b = BytesMut::with_capacity(PAYLOAD);
    b.put_u32(publisher);
    b.put_u32(seq);
    b.resize(PAYLOAD, 0x5A);
    b.freeze()
}

fn record_of(payload: &[u8]) -> Option<(u32, u32)> {
    if payload.len() != PAYLOAD {
        return None;
    }
    let publisher = u32::from_be_bytes(payload.get(..4)?.try_into().ok()?);
    let seq = u32::from_be_bytes(payload.get(4..8)?.try_into().ok()?);
    Some((publisher, seq))
}

/// What one publisher measured.
struct Published {
    /// Each publish's time from being written to its PUBACK - paced, from
    /// when it fell due if a full window held it back - in the order the
    /// PUBACKs came; as many as it published.
    acks: Vec<Duration>,
    last_ack: Instant,
}

/// Publishes QoS 1 records on `topic` until `until` or `max` of them,
/// keeping up to [`WINDOW`] unacknowledged, then waits for the last
/// PUBACK; `rate` (publishes a second) paces them when set. Record `n` of
/// publisher `index` carries `payload(index, n)`.
async fn publish(
    mut conn: Conn,
    topic: String,
    index: u32,
    until: Instant,
    max: u32,
    rate: Option<f64>,
) -> Result<Published, Error> {
    let topic = ByteStr::from(topic);
    // By packet id: with at most WINDOW in flight, an id comes round again
    // only long after its PUBACK.
    let mut sent_at: Vec<Option<Instant>> = vec![None; usize::from(u16::MAX) + 1];
    let mut acks = Vec::new();
    let mut sent = 0u32;
    let mut inflight = 0usize;
    let mut packet_id = 0u16;
    let mut burst = Vec::with_capacity(WINDOW);
    let begun = Instant::now();
    let due = |sent: u32| match rate {
        Some(r) => begun + Duration::from_secs_f64(f64::from(sent) / r),
        None => begun,
    };
    let mut last_ack = begun;
    // Since when a full window has held back publishes that fell due.
    let mut full_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let open = now < until && sent < max;
        let before = sent;
        while open && sent < max && inflight < WINDOW && due(sent) <= now {
            // Paced, a publish a slow PUBACK held back is charged from when
            // it fell due, not from when the window let it go: otherwise a
            // stall would hide the very latencies it causes.
            let written = Instant::now();
            let charged_from = match full_since {
                Some(full) if rate.is_some() => due(sent).max(full).min(written),
                _ => written,
            };
            packet_id = packet_id.checked_add(1).unwrap_or(1);
            burst.push(Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: topic.clone(),
                packet_id,
                properties: PublishProperties::default(),
                payload: payload(index, sent),
            }));
            sent_at[usize::from(packet_id)] = Some(charged_from);
            sent += 1;
            inflight += 1;
        }
        if sent > before {
            full_since = None;
        }
        if inflight == WINDOW && full_since.is_none() {
            full_since = Some(now);
        }
        if !burst.is_empty() {
            conn.send_all(&burst).await?;
            burst.clear();
        }
        if !open && inflight == 0 {
            break;
        }
        // Paced with room in the window: the next publish falls due or a
        // PUBACK comes in, whichever is first.
        let paced = rate.is_some() && open && inflight < WINDOW;
        let first = if paced {
            tokio::select! {
                packet = conn.next() => Some(packet?),
                _ = tokio::time::sleep_until(due(sent).min(until).into()) => None,
            }
        } else {
            let next = tokio::time::timeout(STALL, conn.next()).await;
            let next = next.map_err(|_| {
                let acknowledged = acks.len();
                format!("no PUBACK for {STALL:?} with {inflight} unacknowledged, {acknowledged} acknowledged")
            })?;
            Some(next?)
        };
        let arrived = Instant::now();
        let mut packet = first;
        while let Some(p) = packet.take() {
            match p {
                Packet::PubAck(a) if !a.reason.is_error() => {
                    let at = sent_at
                        .get_mut(usize::from(a.packet_id))
                        .and_then(Option::take)
                        .ok_or_else(|| format!("PUBACK for {} not in flight", a.packet_id))?;
                    acks.push(arrived - at);
                    inflight -= 1;
                    last_ack = arrived;
                }
                Packet::PubAck(a) => {
                    return Err(format!("publish {} answered {:?}", a.packet_id, a.reason).into())
                }
                other => return Err(format!("publisher got {other:?}").into()),
            }
            packet = conn.try_next()?;
        }
    }
    conn.send(&Packet::Disconnect(Disconnect::new(ReasonCode::Success)))
        .await?;
    Ok(Published { acks, last_ack })
}

/// Subscribes `conn` to `filter` at QoS 1, and waits for its SUBACK: the
/// reader receives every publish made after this returns.
async fn subscribe(conn: &mut Conn, filter: &str) -> Result<(), Error> {
    conn.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: filter.to_owned(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                ..SubscriptionOptions::default()
            },
        }],
        properties: SubscribeProperties::default(),
    }))
    .await?;
    match tokio::time::timeout(STALL, conn.next()).await?? {
        Packet::SubAck(ack) if ack.reasons == [ReasonCode::GrantedQoS1] => Ok(()),
        Packet::SubAck(ack) => Err(format!("SUBSCRIBE {filter} answered {:?}", ack.reasons).into()),
        other => Err(format!("expected SUBACK, got {other:?}").into()),
    }
}

/// What the readers are to wait for, known once the publishers are done.
#[derive(Clone)]
enum Expect {
    Unknown,
    /// Records published, by publisher.
    Counts(Vec<u64>),
    /// A publisher failed: what it published is not known.
    Nothing,
}

/// What one reader received.
struct Received {
    /// Records told apart by their payload.
    distinct: u64,
    duplicates: u64,
    out_of_order: u64,
    last: Option<Instant>,
    /// Why it stopped short of every record.
    short: Option<String>,
}

/// How a record came to a reader.
enum Arrival {
    /// After every earlier record of its publisher that has come.
    InOrder,
    /// Before one its publisher sent after it (MQTT 4.6: a publisher's
    /// messages on a topic reach a subscriber in the order sent).
    OutOfOrder,
    /// Once more.
    Again,
}

/// The records one reader has had, by publisher.
#[derive(Default)]
struct Seen {
    bits: Vec<Vec<u64>>,
    distinct: Vec<u64>,
    /// One past the highest sequence number seen, by publisher.
    end: Vec<u64>,
}

impl Seen {
    /// Marks record `seq` of `publisher`.
    fn mark(&mut self, publisher: usize, seq: u64) -> Arrival {
        if self.bits.len() <= publisher {
            self.bits.resize_with(publisher + 1, Vec::new);
            self.distinct.resize(publisher + 1, 0);
            self.end.resize(publisher + 1, 0);
        }
        let (word, mask) = ((seq / 64) as usize, 1u64 << (seq % 64));
        let bits = &mut self.bits[publisher];
        if bits.len() <= word {
            bits.resize(word + 1, 0);
        }
        if bits[word] & mask != 0 {
            return Arrival::Again;
        }
        bits[word] |= mask;
        self.distinct[publisher] += 1;
        let end = &mut self.end[publisher];
        if seq < *end {
            return Arrival::OutOfOrder;
        }
        *end = seq + 1;
        Arrival::InOrder
    }

    /// The lowest-numbered record not yet come, of the first publisher
    /// with one.
    fn first_missing(&self, counts: &[u64]) -> Option<(usize, u64)> {
        counts.iter().enumerate().find_map(|(p, &count)| {
            let bits = self.bits.get(p).map(Vec::as_slice).unwrap_or(&[]);
            (0..count)
                .find(|&seq| {
                    bits.get((seq / 64) as usize)
                        .is_none_or(|word| word & (1 << (seq % 64)) == 0)
                })
                .map(|seq| (p, seq))
        })
    }

    /// Whether exactly the records `counts` says were published have come:
    /// as many distinct ones as each publisher sent, none past its last.
    fn complete(&self, counts: &[u64]) -> bool {
        counts.iter().enumerate().all(|(p, &count)| {
            self.distinct.get(p).copied().unwrap_or(0) == count
                && self.end.get(p).copied().unwrap_or(0) == count
        })
    }
}

/// Acknowledges every delivery until each record the publishers report
/// has come, or none comes for [`STALL`] once they are done.
async fn consume(
    mut conn: Conn,
    mut expect: tokio::sync::watch::Receiver<Expect>,
) -> Result<Received, Error> {
    let mut seen = Seen::default();
    let mut received = Received {
        distinct: 0,
        duplicates: 0,
        out_of_order: 0,
        last: None,
        short: None,
    };
    let mut acks = Vec::with_capacity(WINDOW);
    loop {
        let counts = match &*expect.borrow_and_update() {
            Expect::Nothing => return Ok(received),
            Expect::Counts(counts) => Some(counts.clone()),
            Expect::Unknown => None,
        };
        if let Some(counts) = &counts {
            if seen.complete(counts) {
                return Ok(received);
            }
        }
        let next = tokio::select! {
            next = tokio::time::timeout(STALL, conn.next()) => next,
            changed = expect.changed(), if counts.is_none() => match changed {
                Ok(()) => continue,
                Err(_) => return Ok(received),
            },
        };
        let first = match next {
            Ok(packet) => packet?,
            // While they publish, a reader waits as long as they do.
            Err(_) if counts.is_none() => continue,
            Err(_) => {
                let counts = counts.unwrap_or_default();
                let expected: u64 = counts.iter().sum();
                let missing = seen
                    .first_missing(&counts)
                    .map(|(p, seq)| format!(", the first missing publisher-{p}'s #{seq}"))
                    .unwrap_or_default();
                received.short = Some(format!(
                    "{} of {expected} records, none for {} s{missing}",
                    received.distinct,
                    STALL.as_secs()
                ));
                return Ok(received);
            }
        };
        let arrived = Instant::now();
        let mut packet = Some(first);
        while let Some(p) = packet.take() {
            let Packet::Publish(p) = p else {
                return Err(format!("reader got {p:?}").into());
            };
            if p.qos != QoS::AtLeastOnce {
                return Err(format!("a delivery at {:?}, subscribed at QoS 1", p.qos).into());
            }
            let (publisher, seq) = record_of(&p.payload)
                .filter(|&(publisher, _)| (publisher as usize) < PUBLISHERS)
                .ok_or_else(|| format!("a delivery on {} no publisher sent", p.topic))?;
            match seen.mark(publisher as usize, u64::from(seq)) {
                Arrival::InOrder => received.distinct += 1,
                Arrival::OutOfOrder => {
                    received.distinct += 1;
                    received.out_of_order += 1;
                }
                Arrival::Again => received.duplicates += 1,
            }
            acks.push(Packet::PubAck(PubAck::new(p.packet_id)));
            packet = conn.try_next()?;
        }
        received.last = Some(arrived);
        // Every earlier delivery's PUBACK has been written, so these are
        // at most what the broker has in flight to this reader: more than
        // the window is the broker overrunning the Receive Maximum.
        if acks.len() > WINDOW {
            return Err(format!(
                "{} deliveries unacknowledged at once, past the receive maximum of {WINDOW}",
                acks.len()
            )
            .into());
        }
        conn.send_all(&acks).await?;
        acks.clear();
    }
}

struct Measured {
    published: u64,
    /// Seconds from the first publish to the last PUBACK.
    acked_secs: f64,
    /// Seconds from the first publish to the last PUBACK and every
    /// reader's last record.
    all_secs: f64,
    acks: Vec<Duration>,
    delivered: u64,
    expected_deliveries: u64,
    duplicates: u64,
    load_before: String,
    load_after: String,
    /// The share of the machine's CPU the hypervisor took while the row
    /// ran: time neither the broker nor its clients could have.
    stolen: Option<f64>,
    /// The broker's own CPU time (user and system) over the row: what a
    /// publish and its deliveries cost it, whatever its clients took.
    broker_cpu: Option<Duration>,
    error: Option<String>,
}

/// The 1, 5 and 15 minute load averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn one_minute(load: &str) -> &str {
    load.split_whitespace().next().unwrap_or("-")
}

async fn run(case: &Case, dir: &Path) -> Result<Measured, Error> {
    let config = config(dir, case)?;
    let broker = match &case.baseline {
        Some(bin) => bench_support::start_binary(bin, &config, &[]).await?,
        None => bench_support::start(&config).await?,
    };
    let addr = broker.addr;
    let filter = match case.target {
        Target::Channel => format!("{CHANNEL}/#"),
        Target::Broadcast => BROADCAST_TOPIC.to_owned(),
    };
    let topic = |p: usize| match case.target {
        Target::Channel => format!("{CHANNEL}/p{p}"),
        Target::Broadcast => BROADCAST_TOPIC.to_owned(),
    };
    let mut readers = Vec::with_capacity(case.readers);
    for r in 0..case.readers {
        let (mut conn, _) = Conn::connect(addr, &format!("reader-{r}"), true).await?;
        subscribe(&mut conn, &filter)
            .await
            .map_err(|e| format!("reader-{r}: {e}"))?;
        readers.push(conn);
    }
    let mut publishers = Vec::with_capacity(PUBLISHERS);
    for p in 0..PUBLISHERS {
        publishers.push(
            Conn::connect(addr, &format!("publisher-{p}"), true)
                .await?
                .0,
        );
    }
    let load_before = load_average();
    let cpu_before = CpuTimes::now();
    let broker_pid = broker.child.id();
    let broker_cpu_before = broker_pid.and_then(|pid| cpu_time(pid).ok());
    let (tell, expect) = tokio::sync::watch::channel(Expect::Unknown);
    let reading: Vec<_> = readers
        .into_iter()
        .map(|conn| tokio::spawn(consume(conn, expect.clone())))
        .collect();
    let begun = Instant::now();
    let until = begun + Duration::from_secs_f64(case.secs);
    let rate = case.rate.map(|r| r / PUBLISHERS as f64);
    let publishing: Vec<_> = publishers
        .into_iter()
        .enumerate()
        .map(|(p, conn)| {
            tokio::spawn(publish(
                conn,
                topic(p),
                p as u32,
                until,
                case.max_per_publisher,
                rate,
            ))
        })
        .collect();
    let mut error = None;
    let mut acks = Vec::new();
    let mut counts = Vec::with_capacity(PUBLISHERS);
    let mut last = begun;
    for (p, task) in publishing.into_iter().enumerate() {
        match task.await? {
            Ok(published) => {
                counts.push(published.acks.len() as u64);
                acks.extend(published.acks);
                last = last.max(published.last_ack);
            }
            Err(e) => {
                error.get_or_insert(format!("publisher-{p}: {e}"));
            }
        }
    }
    let published: u64 = counts.iter().sum();
    let _ = tell.send(if error.is_none() {
        Expect::Counts(counts)
    } else {
        Expect::Nothing
    });
    let acked_secs = (last - begun).as_secs_f64();
    let (mut delivered, mut duplicates) = (0, 0);
    for (r, task) in reading.into_iter().enumerate() {
        match task.await? {
            Ok(received) => {
                delivered += received.distinct;
                duplicates += received.duplicates;
                last = last.max(received.last.unwrap_or(begun));
                if let Some(short) = received.short {
                    error.get_or_insert(format!("reader-{r}: {short}"));
                }
                if received.out_of_order > 0 {
                    error.get_or_insert(format!(
                        "reader-{r}: {} records came after a later one of their publisher",
                        received.out_of_order
                    ));
                }
            }
            Err(e) => {
                error.get_or_insert(format!("reader-{r}: {e}"));
            }
        }
    }
    let all_secs = (last - begun).as_secs_f64();
    let load_after = load_average();
    let stolen = cpu_before
        .zip(CpuTimes::now())
        .and_then(|(b, a)| a.stolen_since(b));
    let broker_cpu = broker_pid
        .and_then(|pid| cpu_time(pid).ok())
        .zip(broker_cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    if let Err(e) = stop(broker).await {
        error.get_or_insert(format!("stopping the broker: {e}"));
    }
    Ok(Measured {
        published,
        acked_secs,
        all_secs,
        acks,
        delivered,
        expected_deliveries: published * case.readers as u64,
        duplicates,
        load_before,
        load_after,
        stolen,
        broker_cpu,
        error,
    })
}

fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    let last = sorted.len().checked_sub(1)?;
    sorted.get((last as f64 * q).round() as usize).copied()
}

fn millis(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.2} ms", d.as_secs_f64() * 1000.0))
        .unwrap_or_else(|| "-".into())
}

fn percent(share: Option<f64>) -> String {
    share.map_or_else(|| "-".into(), |s| format!("{:.0}%", s * 100.0))
}

fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn span(range: Option<(f64, f64)>, factor: f64) -> String {
    range
        .map(|(lo, hi)| format!("{}–{}", thousands(lo * factor), thousands(hi * factor)))
        .unwrap_or_else(|| "-".into())
}

fn cases(scale: f64) -> Vec<Case> {
    let max_per_publisher = |readers: usize| {
        let by_deliveries = MAX_DELIVERIES / (PUBLISHERS * readers.max(1)) as f64;
        (MAX_PER_PUBLISHER.min(by_deliveries) * scale)
            .round()
            .max(1.0) as u32
    };
    let mut cases = Vec::new();
    let throughput = [
        (Provider::Memory, 0, None),
        (Provider::Memory, 4, Some((29_332.0, 31_621.0))),
        (Provider::Memory, 50, Some((3_048.0, 3_161.0))),
        (Provider::Sqlite, 0, Some((40_827.0, 41_081.0))),
        (Provider::Sqlite, 4, Some((19_578.0, 20_193.0))),
        (Provider::Sqlite, 50, Some((2_991.0, 3_226.0))),
    ];
    for (provider, readers, rfc) in throughput {
        let channel = |again: &str| Case {
            name: format!("{} channel, {readers} consumers{again}", provider.name()),
            baseline: None,
            provider,
            target: Target::Channel,
            readers,
            secs: PUBLISH_SECS * scale,
            max_per_publisher: max_per_publisher(readers),
            rate: None,
            rfc,
            snapshots: false,
        };
        if provider == Provider::Memory && readers == 4 {
            // What the memory channel's four consumers answer to, run
            // beside it as channel, broadcast, broadcast, channel: the
            // share of the CPUs the host leaves this guest changes from
            // one row to the next, and a drift across the four falls on
            // both sides alike.
            let broadcast = |again: &str| Case {
                name: format!("memory broadcast {BROADCAST_TOPIC}, 4 subscribers{again}"),
                baseline: None,
                provider,
                target: Target::Broadcast,
                readers,
                secs: PUBLISH_SECS * scale,
                max_per_publisher: max_per_publisher(readers),
                rate: None,
                rfc: None,
                snapshots: false,
            };
            cases.extend([
                channel(""),
                broadcast(""),
                broadcast(" (again)"),
                channel(" (again)"),
            ]);
        } else {
            cases.push(channel(""));
        }
    }
    // What PUBACK latency this machine allows with no store on the path:
    // beside it, the channel rows' p99 tells the store's share from the
    // machine's.
    cases.push(Case {
        name: "memory broadcast, 0 subscribers @5k/s".into(),
        baseline: None,
        provider: Provider::Memory,
        target: Target::Broadcast,
        readers: 0,
        secs: PACED_SECS * scale,
        max_per_publisher: max_per_publisher(0),
        rate: Some(PACED_RATE),
        rfc: None,
        snapshots: false,
    });
    for readers in [0, 4] {
        cases.push(Case {
            name: format!("sqlite channel, {readers} consumers @5k/s"),
            baseline: None,
            provider: Provider::Sqlite,
            target: Target::Channel,
            readers,
            secs: PACED_SECS * scale,
            max_per_publisher: max_per_publisher(readers),
            rate: Some(PACED_RATE),
            rfc: None,
            snapshots: false,
        });
    }
    // What background snapshot generations cost a publisher's PUBACK:
    // without, with, with, without, compared by their means, so a drift
    // in the host's share falls on both sides.
    for (snapshots, again) in [
        (false, ""),
        (true, ""),
        (true, " (again)"),
        (false, " (again)"),
    ] {
        cases.push(Case {
            baseline: None,
            name: format!(
                "memory channel, 4 consumers @5k/s, {}{again}",
                if snapshots {
                    "background snapshots"
                } else {
                    "no snapshots"
                }
            ),
            provider: Provider::Memory,
            target: Target::Channel,
            readers: 4,
            secs: PACED_SECS * scale,
            max_per_publisher: max_per_publisher(4),
            rate: Some(PACED_RATE),
            rfc: None,
            snapshots,
        });
    }
    cases
}

struct Row {
    case: Case,
    measured: Result<Measured, String>,
}

#[tokio::main]
async fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`.
    if !std::env::args().any(|a| a == "--bench") {
        println!("consumers: run with `cargo bench --bench consumers`");
        return;
    }
    let scale: f64 = std::env::var("SAGUIN_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let only = std::env::var("SAGUIN_BENCH_ONLY").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_default();
    println!(
        "saguin acknowledging consumers: {cpus} CPU(s) {model}; load average {}",
        load_average()
    );
    println!(
        "{PUBLISHERS} publishers, QoS 1, {PAYLOAD} B payloads, {WINDOW} in flight each (and the broker's receive_maximum); \
         MQTT 3.1.1 clients in this process, sharing its CPUs with the broker"
    );
    let baseline = match bench_support::baseline() {
        Ok(baseline) => baseline,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let rounds: usize = std::env::var("SAGUIN_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let wanted: Vec<Case> = cases(scale)
        .into_iter()
        .filter(|case| only.split('|').any(|part| case.name.contains(part)))
        .collect();
    let mut runs = Vec::new();
    match &baseline {
        Some(bin) => {
            println!("each row beside the baseline {}, {rounds} round(s), the order turning from one pair to the next", bin.display());
            let mut pair = 0usize;
            for _ in 0..rounds {
                for case in &wanted {
                    let earlier = Case {
                        baseline: Some(bin.clone()),
                        ..case.clone()
                    };
                    if pair % 2 == 0 {
                        runs.extend([case.clone(), earlier]);
                    } else {
                        runs.extend([earlier, case.clone()]);
                    }
                    pair += 1;
                }
            }
        }
        None => {
            for _ in 0..rounds {
                runs.extend(wanted.iter().cloned());
            }
        }
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut rows = Vec::new();
    for (i, case) in runs.into_iter().enumerate() {
        let row_dir = dir.path().join(format!("row-{i}"));
        let measured = match std::fs::create_dir_all(&row_dir) {
            Ok(()) => run(&case, &row_dir).await.map_err(|e| e.to_string()),
            Err(e) => Err(format!("creating {}: {e}", row_dir.display())),
        };
        // A row's database is not needed past it, and a whole run's would
        // add up.
        let _ = std::fs::remove_dir_all(&row_dir);
        match &measured {
            Ok(m) => eprintln!(
                "{:<52} {:>8.0} publishes/s, {}/{} delivered, load {} -> {}{}",
                case.label(),
                m.published as f64 / m.all_secs,
                m.delivered,
                m.expected_deliveries,
                m.load_before,
                m.load_after,
                m.error
                    .as_ref()
                    .map(|e| format!(": FAIL {e}"))
                    .unwrap_or_default()
            ),
            Err(e) => eprintln!("{:<52} FAIL {e}", case.label()),
        }
        rows.push(Row { case, measured });
    }

    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    table.set_header([
        "row",
        "publishes/s",
        "PUBACKed/s",
        "PUBACK p50",
        "p99",
        "max",
        "deliveries/s",
        "broker CPU µs a publish",
        "received",
        "reference (Ryzen)",
        "target 1.5×",
        "load (1 min) before → after",
        "CPU stolen",
        "result",
    ]);
    let mut failed = false;
    for row in &mut rows {
        let case = &row.case;
        match &mut row.measured {
            Ok(m) => {
                m.acks.sort_unstable();
                let received = if m.duplicates > 0 {
                    format!(
                        "{}/{} (+{} again)",
                        thousands(m.delivered as f64),
                        thousands(m.expected_deliveries as f64),
                        m.duplicates
                    )
                } else {
                    format!(
                        "{}/{}",
                        thousands(m.delivered as f64),
                        thousands(m.expected_deliveries as f64)
                    )
                };
                failed |= m.error.is_some();
                table.add_row([
                    case.label(),
                    thousands(m.published as f64 / m.all_secs),
                    thousands(m.published as f64 / m.acked_secs),
                    millis(quantile(&m.acks, 0.5)),
                    millis(quantile(&m.acks, 0.99)),
                    millis(m.acks.last().copied()),
                    thousands(m.delivered as f64 / m.all_secs),
                    m.broker_cpu.map_or_else(
                        || "-".into(),
                        |cpu| format!("{:.1}", cpu.as_secs_f64() * 1e6 / m.published.max(1) as f64),
                    ),
                    received,
                    span(case.rfc, 1.0),
                    span(case.rfc, 1.5),
                    format!(
                        "{} → {}",
                        one_minute(&m.load_before),
                        one_minute(&m.load_after)
                    ),
                    percent(m.stolen),
                    m.error
                        .as_ref()
                        .map_or_else(|| "ok".into(), |e| format!("FAIL {e}")),
                ]);
            }
            Err(e) => {
                failed = true;
                let mut cells = vec![case.label()];
                cells.extend(std::iter::repeat_n("-".to_owned(), 8));
                cells.extend([
                    span(case.rfc, 1.0),
                    span(case.rfc, 1.5),
                    "-".into(),
                    "-".into(),
                ]);
                cells.push(format!("FAIL {e}"));
                table.add_row(cells);
            }
        }
    }
    println!("{table}");
    println!(
        "reference: the Go broker on a Ryzen 7 260 pinned to 4 physical cores, consumers in the broker's process; \
         publishes/s here counts until every consumer has every record"
    );
    print_targets(&rows);
    print_against_baseline(&rows);
    if failed {
        // `exit` runs no destructor: the brokers' directory goes first.
        drop(dir);
        std::process::exit(1);
    }
}

/// What a memory channel with 4 consumers is to run at, at least, as a
/// share of broadcast QoS 1 with 4 subscribers.
const CHANNEL_OF_BROADCAST: f64 = 0.6;

/// The two targets that compare rows of this run with each other.
fn print_targets(rows: &[Row]) {
    let measured = |target: Target, provider: Provider, readers: usize, paced: bool| {
        rows.iter().filter_map(move |r| {
            let c = &r.case;
            let m = r.measured.as_ref().ok()?;
            (c.baseline.is_none()
                && c.target == target
                && c.provider == provider
                && c.readers == readers
                && c.rate.is_some() == paced
                && m.error.is_none())
            .then_some(m)
        })
    };
    let rate = |target, provider, readers, paced| measured(target, provider, readers, paced).next();
    // Each side's rows, and their mean.
    let side = |target| {
        let rates: Vec<f64> = measured(target, Provider::Memory, 4, false)
            .map(|m| m.published as f64 / m.all_secs)
            .collect();
        let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        let each = rates.iter().map(|r| thousands(*r)).collect::<Vec<_>>();
        (mean, each.join(" and "))
    };
    let (channel, channel_rows) = side(Target::Channel);
    let (broadcast, broadcast_rows) = side(Target::Broadcast);
    if channel > 0.0 && broadcast > 0.0 {
        let ratio = channel / broadcast;
        println!(
            "memory channel with 4 consumers / broadcast with 4 QoS 1 subscribers, the mean of their rows \
             ({channel_rows} / {broadcast_rows}): {} / {} = {ratio:.2} (target >= {CHANNEL_OF_BROADCAST}: {})",
            thousands(channel),
            thousands(broadcast),
            if ratio >= CHANNEL_OF_BROADCAST { "met" } else { "not met" }
        );
    }
    let floor = rate(Target::Broadcast, Provider::Memory, 0, true)
        .map(|m| {
            format!(
                "; broadcast with no store: {}",
                millis(quantile(&m.acks, 0.99))
            )
        })
        .unwrap_or_default();
    // Background snapshots against none, each side the mean of its rows'
    // p99.
    let p99s = |snapshots: bool| -> Vec<f64> {
        rows.iter()
            .filter(|r| {
                let c = &r.case;
                c.baseline.is_none()
                    && c.provider == Provider::Memory
                    && c.target == Target::Channel
                    && c.rate.is_some()
                    && c.snapshots == snapshots
            })
            .filter_map(|r| r.measured.as_ref().ok())
            .filter(|m| m.error.is_none())
            .filter_map(|m| quantile(&m.acks, 0.99))
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect()
    };
    let (with, without) = (p99s(true), p99s(false));
    if !with.is_empty() && !without.is_empty() {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let ratio = mean(&with) / mean(&without);
        let each = |v: &[f64]| {
            v.iter()
                .map(|p| format!("{p:.2} ms"))
                .collect::<Vec<_>>()
                .join(" and ")
        };
        println!(
            "memory channel at {} publishes/s, 4 consumers: PUBACK p99 with background snapshots {} / without {} = {ratio:.2} (target <= 1.5: {})",
            thousands(PACED_RATE),
            each(&with),
            each(&without),
            if ratio <= 1.5 { "met" } else { "not met" }
        );
    }
    for readers in [0, 4] {
        if let Some(m) = rate(Target::Channel, Provider::Sqlite, readers, true) {
            let p99 = quantile(&m.acks, 0.99);
            println!(
                "sqlite channel at {} publishes/s, {readers} consumers: PUBACK p99 {} (target <= 2 ms: {}{floor}; CPU stolen by the host during the row: {})",
                thousands(PACED_RATE),
                millis(p99),
                if p99.is_some_and(|d| d <= Duration::from_millis(2)) {
                    "met"
                } else {
                    "not met"
                },
                percent(m.stolen)
            );
        }
    }
}

/// Each row's rate under this build against the baseline's, by the means
/// of their runs, and each pair's ratio in the order they ran.
fn print_against_baseline(rows: &[Row]) {
    let rate = |row: &Row| {
        let m = row.measured.as_ref().ok()?;
        (m.error.is_none() && m.all_secs > 0.0).then(|| m.published as f64 / m.all_secs)
    };
    let mut names: Vec<&str> = Vec::new();
    for row in rows.iter().filter(|r| r.case.baseline.is_some()) {
        if !names.contains(&row.case.name.as_str()) {
            names.push(&row.case.name);
        }
    }
    for name in names {
        let of = |baseline: bool| -> Vec<f64> {
            rows.iter()
                .filter(|r| r.case.name == name && r.case.baseline.is_some() == baseline)
                .filter_map(rate)
                .collect()
        };
        let (this, earlier) = (of(false), of(true));
        if this.is_empty() || earlier.is_empty() {
            println!("{name}: no complete pair against the baseline");
            continue;
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let pairs: Vec<String> = this
            .iter()
            .zip(&earlier)
            .map(|(a, b)| format!("{:.2}", a / b))
            .collect();
        println!(
            "{name}: this build {} / baseline {} = {:.2} by the means (each pair: {})",
            thousands(mean(&this)),
            thousands(mean(&earlier)),
            mean(&this) / mean(&earlier),
            pairs.join(", ")
        );
        // What a publish and its deliveries cost the broker itself: the
        // comparison a rate cannot make where the clients take the CPUs.
        let cpu_of = |baseline: bool| -> Vec<f64> {
            rows.iter()
                .filter(|r| r.case.name == name && r.case.baseline.is_some() == baseline)
                .filter_map(|r| {
                    let m = r.measured.as_ref().ok()?;
                    let cpu = m.broker_cpu?;
                    (m.error.is_none() && m.published > 0)
                        .then(|| cpu.as_secs_f64() * 1e6 / m.published as f64)
                })
                .collect()
        };
        let (this, earlier) = (cpu_of(false), cpu_of(true));
        if !this.is_empty() && !earlier.is_empty() {
            println!(
                "{name}: the broker's CPU a publish, this build {:.1} µs / baseline {:.1} µs: {:.2}× less",
                mean(&this),
                mean(&earlier),
                mean(&earlier) / mean(&this)
            );
        }
    }
}
