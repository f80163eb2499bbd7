//! The MQTT server (`saguin serve`): MQTT 3.1.1 and 5.0 over TCP and TLS,
//! on the storage layer.
//!
//! ```text
//! TCP or TLS transport (server: semaphore permit, accept, handshake deadline),
//! one task per connection polling both sides:
//!   ├─ reader → codec::FrameDecoder → connection::adapt → event queue (bounded)
//!   └─ writer ← outbound queue (counted) ← BrokerState
//!                                    │  ▲
//!                         intents    ▼  │ Committed{ticket}
//!                 persister::Persisters - one per role: inline for a memory
//!                 provider, one thread per sqlite provider for all its
//!                 roles - writing through the providers' stores
//!                 (storage::contract)
//! ```
//!
//! - [`providers`]: every provider the broker names is locked, opened and
//!   recovered before anything listens; at a graceful stop the memory
//!   providers' snapshot directories are written, sqlite checkpointed, the
//!   locks let go.
//! - [`snapshots`]: each memory provider with a snapshot directory writes
//!   a generation of it in the background, `snapshot_debounce` after its
//!   last change and at most `snapshot_max_delay` after its first. The
//!   broker task notices changes (one atomic load a turn), keeps the
//!   schedule on its own clock and captures the changed stores at one
//!   moment of its order (counters, positions and record handles: no
//!   record copied); a thread of the provider's own writes them, and the
//!   broker task never waits for it.
//! - [`retention`]: one task sweeping the append channels by
//!   `retention_bytes` every second and by `retention_age` every tenth of
//!   the shortest one (at least a second), and the latest channels'
//!   deletion markers by `retention_deletions` and `retention_age` in the
//!   same two sweeps, on the blocking pool, one sweep at a time; stopped
//!   before the providers close.
//! - [`server`]: `prepare(config, sessions, retained)` rebuilds the state
//!   from the providers ([`persister::read_retained`] one message at a
//!   time, each lent as the broker serves it, read in batches on a thread
//!   of its own while the state is built from them, then
//!   [`persister::read_restored`]; a memory store lends its own handle on
//!   each retained message, which the state's index holds rather than a
//!   copy, as it does the handle a retained write on memory answers with) on the blocking pool, starts the
//!   persisters, then binds the listeners; `run(server, shutdown)` serves
//!   until `shutdown` completes, and returns an error when the broker task
//!   failed (the process then exits non-zero). One tokio runtime; a permit
//!   of the `max_connections` semaphore is taken before each accept. A
//!   listener asks the kernel to hold 4,096 unaccepted connections, not
//!   the 1,024 a listener gets by default: a site's devices reconnecting
//!   at once overflowed that, and each handshake dropped there waited on
//!   its client's retransmissions (10,000 sessions took 1.9-5.4 s to
//!   reconnect, now 0.7 s). An
//!   accepted transport is one boxed [`connection::Handshake`] handed to
//!   [`connection::serve`] (a TLS one to [`connection::serve_after`], its
//!   TLS handshake boxed with the rest of the start and gone once done),
//!   so nothing of the start sizes the connection's task for its life.
//! - [`connection`]: one task per connection, its reader and its writer
//!   polled together by one poll function whose state lives in the
//!   connection's box (the task, [`connection::ConnectionTask`], is
//!   polled by hand and holds a pointer to that box and one to its place
//!   under the cap: 128 B with what tokio puts around it), taking turns (a write the client
//!   does not take never stops the reads, and a read is handed on before
//!   the next batch is written); no read buffer held while the client is
//!   quiet (reads land on the stack and only a partial packet's bytes are
//!   kept) and at most 1 KiB of write buffer once the queue is drained. The
//!   reader decodes with the project's [`codec`], resolves topic aliases,
//!   notes when it last heard its client for keep alive (one
//!   [`keep_alive::KeepAliveTimer`] watches every connection's silence and
//!   wakes the one whose client was silent past its limit, so no
//!   connection holds a timer of its own), authenticates the CONNECT (and re-authenticates,
//!   [`auth`] deciding), and forwards the
//!   packets of one read as one event; it stops reading while the state has
//!   paused it. A PUBACK, PUBREC, PUBREL or PUBCOMP in its four-byte short
//!   form is taken off the buffer as it is
//!   ([`codec::FrameDecoder::decode_short_ack`]), no packet decoded for it:
//!   a subscriber's input is mostly these. The writer takes up to 256
//!   queued packets per wakeup, one by one into one buffer, writes it and
//!   counts them off the queue; a delivery is encoded straight from its
//!   shared message ([`codec::PublishRef`]), no packet of its own built and
//!   nothing of the message cloned. A message's MQTT 5 PUBLISH is encoded
//!   once per kind (with a packet identifier or without), by the first
//!   writer that sends it ([`message::WireForms`]); the writers after copy
//!   those bytes and write their own identifier and DUP, QoS and RETAIN
//!   bits over them. A delivery carrying something of its own (an
//!   outbound topic alias, Subscription Identifiers, the expiry left) is
//!   encoded for itself, and so is an MQTT 3.1.1 one: without properties
//!   its encoding is the copy, and a kept form would cost an allocation a
//!   message. A payload of 16 KiB or more is not copied at all: its
//!   header is encoded into the batch and the payload handed to the same
//!   vectored write from the message (`connection::SPLICE_MIN`; at 16 KiB
//!   2.1× less CPU a message, and the writer keeps up with a publisher
//!   it used to fall a GiB behind). A queued packet is 48 bytes: what few
//!   packets carry (a CONNACK's extras, AUTH data) is boxed.
//!   Acknowledgements are written by [`codec::encode_ack`], the same bytes
//!   as the packet's encoding, no packet built.
//! - [`parking`]: a plain TCP connection whose client has been quiet for
//!   half its keep alive (at most 10 s) and that has nothing to read,
//!   write or hand on ends its task and waits in the broker's own poll
//!   set, keeping only what serving it again takes (96 B, the
//!   state's link and entries unchanged). Whatever comes for it (its
//!   client's bytes or hang-up, a packet the state queues, a pause, its
//!   keep alive running out, a takeover, a shutdown) resumes it with a
//!   new task, as if it had never left: nothing the client sees changes.
//!   It parks once for each time its client is heard, so a subscriber
//!   that only listens is not parked and resumed at every delivery.
//!   Devices that speak more often than every 10 s keep their task. A TLS
//!   connection does not park (its session state is most of its cost and
//!   is not given up). `saguin_connections_parked` counts them.
//! - [`long_lived`]: what the broker makes to keep (a client's session
//!   and connection entries, client id and link, a parked connection, a
//!   session's subscriptions, a restored session) is asked for as
//!   long-lived, and the binary's allocator serves it from a heap of its
//!   own, so the short-lived blocks made beside it (a CONNECT's handshake,
//!   a connection's task and buffers) leave whole pages to give back when
//!   they are freed rather than pages kept resident by one block each.
//! - [`lazy`]: a part most values never use (a session's queues, a
//!   message's MQTT 5 properties), one pointer until first changed and
//!   read as empty until then.
//! - [`small_map`]: a map kept as a sorted vector while it holds a few
//!   entries and as a B-tree past that: a session's subscriptions and a
//!   subscription index level's children, most of which hold one (a
//!   device's own command topic), where a B-tree's first node has room
//!   for eleven.
//! - [`link`]: what the state and one connection share, in one allocation:
//!   the outbound queue (a deque under a mutex, swapped out whole by the
//!   writer, holding no memory while the connection sleeps), the task's
//!   waker, the writer's counts and the reader's pause. An idle
//!   connection's link is its `Arc` and nothing else.
//! - [`state`]: deterministic, no sockets, clocks or storage; events in,
//!   packets and intents out (see its module documentation for the order of
//!   answers and commits).
//! - [`persister`]: writes the state's intents, answers with
//!   `Event::Committed`, counts and logs failures. A publish group's answers
//!   travel a queue of their own that the broker task reads before the
//!   others', so a PUBACK does not wait behind a storm's CONNACKs. A sqlite
//!   provider's roles share one thread, and the publishes of all its
//!   channels share transactions: a thread for each channel cost 42 KB and
//!   a wake-up for each publish to another channel than the last.
//! - At most 10,000 channels are served (`config::MAX_SERVED_CHANNELS`,
//!   a dead-letter channel counted for each queue): the state numbers
//!   them in 16 bits, and 10,000 is the most measured
//!   (docs/benchmarks.md, "Channels in one broker"). A channel is a
//!   topic's first level; finer divisions are the levels below it.
//! - CONNECTs' passwords are checked on threads of their own, one for each
//!   CPU, in the order the CONNECTs came ([`auth::checks`]): on the
//!   runtime's blocking pool a storm of 10,000 devices with passwords
//!   started 113-184 threads the broker kept, and took twice as long.
//! - Past 100 channels served (`config::CHANNELS_STATED_ONE_BY_ONE`), the
//!   start states channels a provider at a time and a memory provider's
//!   stop sums up its files: each channel's and each file's line goes to
//!   the debug level. Ten thousand channels logged twenty thousand lines
//!   at a start and ten thousand at a stop, more than journald's default
//!   rate limit lets through in 30 s, which then drops what follows.
//! - [`views`]: what the metrics, `/readyz`, the bridges and the restore
//!   see of a store - counters, positions, health - read-only; the
//!   components that hold live store handles, and why, are listed there.
//! - [`retention`] tells the state each floor it raised
//!   (`Event::FloorRaised`, on the readers' answer queue), so no record it
//!   removed is handed on from what the state kept of earlier reads.
//! - The `saguin` binary allocates with mimalloc: a memory channel's heap
//!   is millions of records made on whichever thread runs the state, and
//!   glibc's per-thread arenas grew it a page range at a time (`mprotect`
//!   5% of the broker's CPU) and took their slowest path in `malloc` (15%)
//!   on the 4-consumer row of `cargo bench --bench consumers`, which
//!   mimalloc raised by 28-37% in alternating runs (docs/benchmarks.md).
//!   Once the state is restored it hands the allocator's free pages back
//!   (`release_free_memory` in `commands/allocator.rs`): the decoded copies a
//!   restart built its stores from, a few hundred bytes a record, stayed
//!   resident until a later purge, seconds later. It does not ask the
//!   kernel for transparent huge pages: where the kernel grants them on
//!   request (`madvise`, the usual default), each thread's first small
//!   allocations made a 2 MiB page resident. With them an empty broker
//!   held 23 MB instead of 14, and an idle connection 3.2 KB instead of
//!   1.1 at 1,000 of them and 2.0 KB instead of 0.65 at 5,000; a sqlite
//!   restart of a million retained messages was faster
//!   with them, by 10-20% (docs/benchmarks.md, "Idle connections"), and
//!   the hottest in-memory rows by 4-8%, each publish costing the broker
//!   5-10% more CPU without them (docs/benchmarks.md, "Append channels
//!   over MQTT"). Memory is what an edge site runs out of first, so the
//!   pages stay small. A block whose alignment a
//!   plain mimalloc block has (16 bytes, and no more than its size) is
//!   asked for through mimalloc's plain entry point: its aligned one served
//!   sizes between powers of two from the next class up (112 bytes from
//!   128, 160 from 192) whenever the right class had no free block at
//!   hand, which it never had when only aligned requests asked for it.
//!
//! Decisions where the specifications leave a choice:
//!
//! - The times the broker stores (receipt times, `saved_at`, a lease's
//!   end, a session's expiry) come from one receipt clock
//!   (`state::clock`): it follows the system clock forward within half a
//!   second (NTP setting a clock that started at 1970), never back within
//!   a run (a clock set back leaves it ahead, shown in
//!   `saguin_receipt_clock_ahead_seconds`), and never starts behind the
//!   latest time the storage holds (an append channel's newest record, a
//!   provider's lock's start or stop). Retention by age cuts at the
//!   system clock's now, so a receipt clock ahead removes records later,
//!   never sooner.
//! - An MQTT 3.1.1 session with clean session 0 lives `limits.max_session_expiry`
//!   after its connection ends (MQTT 3.1.1 keeps it forever; a bound is kept
//!   so abandoned client ids do not accumulate). MQTT 5 session expiry
//!   intervals are capped at the same bound; a capped value is returned in
//!   CONNACK.
//! - The outbound inflight window is `limits.max_inflight_messages`, which
//!   unless set is `limits.receive_maximum` (what the broker asks of
//!   clients, applied in return): a 3.1.1 client's whole window, and the
//!   most of a 5.0 client's Receive Maximum the broker uses. A 5.0 client
//!   that names none asks for 65,535, as most libraries do; honoured, one
//!   that read and did not acknowledge held 65,535 messages beside its
//!   queue's bounds (EMQX takes the lesser of a client's Receive Maximum
//!   and its own `max_inflight`, 32, the same way). A bridge's own
//!   connection keeps the window it asks for (its `max_inflight` and the
//!   records read ahead of the remote's window). Everything counts in
//!   that window from the moment it is promised: a queue's job while its
//!   lease is written (nothing else sent meanwhile may take its place),
//!   and on a resumed session each unfinished exchange resent. A client
//!   that comes back with a smaller Receive Maximum than its session's
//!   exchanges were sent under is resent what the new window takes (MQTT
//!   counts resent PUBLISHes and PUBRELs against it), the rest as it
//!   answers, before anything new, as Mosquitto does; a strict client
//!   sent more would disconnect and come back to the same resend for
//!   ever. Messages beyond the window wait in the
//!   session's queue, which holds at most `limits.max_queued_messages` QoS 1/2
//!   messages and, when set, `limits.max_queued_bytes` of their topics and
//!   payloads (the bytes a session holds on to; Mosquitto counts payloads),
//!   connected or not; a message beyond either is dropped and counted, one
//!   larger than the byte bound is never queued, and a smaller one after it
//!   may still fit. A restart owes a session what the stored log holds for
//!   it under the same two bounds. QoS 0 is not queued for a session
//!   without a connection.
//! - Outbound packet identifiers are handed out in turn from 1 up to twice
//!   the session's exchanges in flight, at least 256 (rumqttd cycles its
//!   100), skipping those in use, and wrap: the identifiers in use are a
//!   bitmap of a few words instead of a hash set, and an acknowledgement
//!   is found where its identifier puts it in the in-flight table (kept in
//!   the order the exchanges started, so a resume resends them in that
//!   order). An identifier is reused once its exchange ended, as MQTT
//!   allows (an identifier restored from storage above that range stays in
//!   use until its exchange ends).
//! - The acknowledgements of one read (a subscriber's PUBACKs, PUBRECs,
//!   PUBCOMPs) each end their exchange, and the session's waiting messages
//!   are moved into the window freed once, after the last of them and
//!   before any other packet of that read: the same messages in the same
//!   order as promoting after each (a PUBREL answering a PUBREC of that
//!   read may now go before them), one promotion per read.
//! - Maximum Packet Size announced and enforced on input:
//!   `limits.max_message_size + limits.max_header_bytes`. A message larger
//!   than a client's own Maximum Packet Size is dropped for that client and
//!   counted, as if delivered (MQTT 5 3.1.2.25).
//! - Topic Alias Maximum announced: 64 per connection. Towards an MQTT 5
//!   client that announces a Topic Alias Maximum the writer ([`alias`])
//!   gives each topic an alias the first time it sends it (it cannot know
//!   which topics repeat), sends the alias alone afterwards, and when all
//!   the client's aliases are taken gives the least recently sent topic's
//!   alias to the new one; a new connection starts with no aliases.
//!   `broker.topic_aliases: false` turns this off. A PUBLISH that would
//!   assign an alias but does not fit the client's Maximum Packet Size is
//!   dropped as before and its alias forgotten.
//! - An empty topic with a Topic Alias this connection has not mapped
//!   is DISCONNECT 0x94, like an alias of 0 or above the maximum (Mosquitto
//!   answers 0x82; MQTT 5 only says the mapping does not carry over).
//! - A PUBLISH topic name with a wildcard is DISCONNECT 0x90 (Mosquitto:
//!   0x82); a Response Topic with a wildcard, a property rule rather than
//!   the packet's topic, is a protocol error 0x82 (Mosquitto forwards it).
//! - A QoS 1/2 message resent on reconnect carries the expiry left; one
//!   that expired while in flight is still resent (its delivery had
//!   started, MQTT-4.4.0-1) with 0 left.
//! - QoS 2 inbound by method B: the first PUBLISH routes, its id is kept
//!   until PUBREL; a duplicate gets PUBREC only, and only once the first's
//!   writes are answered (its hold, its routing): a client back on a new
//!   connection while they wait is answered what they get, PUBREC 0x00 or
//!   the refusal, as the first connection would have been; an unknown PUBREL gets
//!   PUBCOMP (0x92 on MQTT 5). A 5.0 client with more unreleased QoS 2 ids
//!   than the Receive Maximum is disconnected with 0x93. An id not released
//!   within `broker.exactly_once.expires_after`, or before its session
//!   ends (a clean session's ends with the process too), is forgotten and
//!   counted (`saguin_dropped_messages_total{reason="exactly_once_expired"}`).
//! - ACL: a denied publish completes its handshake (MQTT 5: PUBACK/PUBREC
//!   0x87; 3.1.1: the normal acknowledgement) and is not routed; a denied
//!   subscription gets 0x87 (3.1.1: 0x80); every delivery is checked again
//!   against the topic. A user name without a password file is accepted
//!   only where anonymous clients are, and then names the principal.
//! - Will: published on keep-alive timeout, malformed input, protocol
//!   error, network loss, a failed session write and DISCONNECT 0x04;
//!   not on DISCONNECT with any other reason nor at server shutdown. With a
//!   Will Delay Interval it waits for the earlier of the delay and the
//!   session's end, and a new connection to the session cancels it. On
//!   takeover the old connection's Will is published unless its delay is
//!   running and the new connection resumes the session.
//! - Takeover: a CONNECT with clean start 0 resumes the session of a
//!   connected client only when that session outlives its connection
//!   (expiry > 0, or 3.1.1 clean session 0); a session with expiry 0 ends
//!   with the connection the takeover closes, so CONNACK says no session
//!   is present (as Mosquitto does).
//! - SUBSCRIBE: a filter that breaks the syntax of MQTT 4.7.1 (`#` not
//!   last, a wildcard inside a level) makes the packet malformed:
//!   DISCONNECT 0x81 and close, as Mosquitto does. A well-formed filter the
//!   broker refuses gets its own reason code in SUBACK and the packet's
//!   other filters are still granted: 0x8F for a `$share/` filter that is
//!   no valid shared subscription (`$share/g`, `$share//a`, MQTT-4.8.2-1/-2;
//!   Mosquitto takes it as an ordinary filter), 0x87 from the ACL, 0x97
//!   over the subscription quota, 0x83 for a filter on a channel whose
//!   `saguin-from` cannot be read or on a queue at QoS 0 (a job is leased
//!   until its PUBACK, so it goes at QoS 1, which a grant of QoS 0 would
//!   forbid); 3.1.1 clients get 0x80 for each. An MQTT 5 SUBACK refusing
//!   a channel's filter says why in its reason string (the first such
//!   reason of the packet), and the refusal is logged as a warning.
//! - Overlapping subscriptions of one client get one copy of a message, at
//!   the highest granted QoS, carrying the Subscription Identifiers of every
//!   matching subscription (MQTT-3.3.4-4). Shared subscriptions
//!   (`$share/...`) are also accepted from 3.1.1 clients.
//! - Keep alive: the client's value is used as given, 0 turning the check
//!   off, unless `limits.max_keep_alive` is set: an MQTT 5 client asking for
//!   more, or for 0, is told the cap as Server Keep Alive and held to it
//!   (closed, 0x8D, after one and a half times it without a packet); an
//!   MQTT 3.1.1 client, which cannot be told, is refused with return code 2
//!   (as Mosquitto does). One function, `state::KeepAlive::grant`, decides
//!   for the CONNACK and for the reader.
//! - The last word is delivered: after a DISCONNECT the broker sends (0x8B
//!   shutdown, 0x8E takeover, 0x93, 0x8D, protocol errors, ...) or a
//!   refusing CONNACK, the write side is shut down and what the client
//!   still sends is read and dropped until it closes, for at most 1 s or
//!   16 MiB, before the socket is closed: a close with unread input is a
//!   reset, which can discard the reason before the client reads it.
//! - Over `limits.max_connections` a connection is still accepted (up to
//!   32 such at once; beyond, newcomers wait in the listen queue), its
//!   CONNECT answered CONNACK 0x97 (3.1.1: return code 3, server
//!   unavailable) and logged with client id and user name, and closed.
//! - Every refused CONNECT is logged at info with client id, principal (the
//!   user name given; `(anonymous)` without) and reason code; never a
//!   password.
//! - Request Response Information = 1 is answered with Response
//!   Information `response/<client id>/`, a basis for response topics; the
//!   ACL applies to it as to any topic (grant `response/%c/#`).
//! - Enhanced authentication: `SCRAM-SHA-512` only ([`auth::scram`]), on
//!   the password file's `$7$` entries, whose PBKDF2-SHA512 hash is SCRAM's
//!   SaltedPassword; SCRAM-SHA-256 would need a SHA-256 derivation the file
//!   does not hold, so it and every other method get CONNACK 0x8C. A wrong
//!   proof, an unknown user or a `$6$` entry is CONNACK 0x86; no channel
//!   binding. The exchange runs within the listener's handshake timeout.
//!   Re-authentication (AUTH 0x19) is accepted on a SCRAM connection for
//!   the same user, other packets flowing meanwhile; a failed one is
//!   DISCONNECT 0x87 (0x86 is not a DISCONNECT reason). AUTH on a
//!   connection without enhanced authentication is DISCONNECT 0x82.
//!   Neither passwords nor proofs nor signatures are logged.
//! - A session belongs to the principal that created it: a CONNECT with
//!   the same client id from another principal (or anonymous) is refused
//!   with "not authorized" and the session is untouched.
//! - `$SYS/broker/...` (version, uptime, clients connected, messages
//!   received/sent, subscriptions, retained count) is published every 10
//!   seconds at QoS 0, and sent at once to a new `$SYS` subscription with
//!   RETAIN=1; it is not stored as retained and does not count itself.
//!   Clients may not publish to `$SYS/...` (answered like an ACL denial).
//! - A memory provider's crash window is its last committed snapshot
//!   generation: a generation is captured at one moment of the broker
//!   task's order, which is the one writer of a memory provider's stores,
//!   so a crash never restores one channel from one moment and another
//!   from a later one. A capture is due ahead of client events in the
//!   broker task's loop, so a broker kept busy still captures on time; one
//!   generation is written at a time, and changes during its write wait
//!   for the next (what a crash loses is at most `snapshot_max_delay` and
//!   one write). A failed generation is tried again no sooner than
//!   `snapshot_max_delay`, at least a second later, so a full disk is not
//!   hammered; only what changed is written, at the granularity of a
//!   channel file (a changed channel is rewritten whole). A generation's
//!   files are synced together, by one sync of their file system, rather
//!   than one by one: a generation of 10,000 small files is one flush of
//!   the disk instead of 10,000, and a site's crash window stops growing
//!   with its channels by seconds (format/FORMAT.md §4). The price is that
//!   a failed write-back the sync reports fails the whole generation (it
//!   cannot say whose it was), and that the sync writes back whatever else
//!   waits on that file system; a kernel that cannot report such a
//!   failure through the sync (before Linux 5.8) syncs each file.
//! - Packets of several connections are taken in the order their
//!   sockets became readable ([`read_order`]), as a broker with one event
//!   loop takes them: a SUBSCRIBE read before another client's PUBLISH
//!   takes effect first, though MQTT promises no order across connections
//!   (scripts and test suites, Paho's interoperability suite among them,
//!   assume it). The runtime would otherwise run the task it woke last
//!   first. A SUBSCRIBE takes effect in routing when it is handled, before
//!   anything is stored: a persistent session's subscription on sqlite is
//!   written before its SUBACK, and a message routed to it meanwhile may
//!   reach the client before the SUBACK (MQTT 5 allows it); should the
//!   write fail, the subscription is taken back and its SUBACK says 0x83
//!   (3.1.1: the connection is closed), and what it was sent meanwhile
//!   stays sent. Limits: the broker task waits for earlier readers at most
//!   10 ms a batch and not at all with a full batch (a backlog); a
//!   reader whose worker thread the machine took away just as its bytes
//!   came can still lose the race; packets from the same poll of the I/O
//!   driver or from a reader busy since its last read are ordered, later
//!   ones as they came.
//! - Storage: a packet's acknowledgement waits for the write it caused;
//!   the packets a connection sends after it are handled at once (their
//!   writes share the next transactions) but answered in order, so a
//!   client sees its answers, and subscribers its publishes, in the order
//!   it sent them. A CONNACK that waits makes the session's messages wait in
//!   its queue: nothing is sent before the CONNACK.
//! - An MQTT 3.1.1 client whose packet caused a failed write is
//!   disconnected without the acknowledgement (it has no reason code); an
//!   MQTT 5 client gets 0x83, or 0x97 when the provider or channel is full.
//! - A session connected when the broker stopped comes back detached, its
//!   expiry counted from the restart; its Will, when it had one and the
//!   stop was not graceful, is published after the Will delay unless the
//!   client reconnects first (a graceful stop suppresses Wills and stores
//!   none).
//! - A persistent session's broadcast-log cursor is the lowest log offset
//!   it still holds: an out-of-order acknowledgement behind an unfinished
//!   exchange does not move it, so after a crash that message can be sent
//!   again (at least once). In-flight tables are written every
//!   `ack_commit_interval`: an exchange started after the last write is
//!   sent again as a new delivery after a crash.
//! - QoS 0 to a client whose writer has `limits.max_queued_messages +
//!   limits.max_inflight_messages` (at least 1,024) packets queued is dropped and
//!   counted, and so is QoS 0 to a client whose writer has not yet written
//!   QoS 0 deliveries of `limits.max_queued_bytes` (their topics and
//!   payloads, as a session's queue counts them), where that is set: the
//!   byte bound an operator sets for a slow subscriber holds whatever QoS
//!   it subscribed with, as Mosquitto's does. That bound is at least 1 MiB
//!   (a `max_queued_bytes` of 0 keeps no session's queue, and must not
//!   drop a burst to a client that reads) and at most 1 GiB (the link
//!   counts it in a word); one delivery always goes to a writer with
//!   nothing waiting. Acknowledgements and QoS 1/2 deliveries are never
//!   dropped: the client's reader is paused until its writer catches up.
//! - A publisher is never slowed for a subscriber's sake: its PUBACK
//!   leaves once the message is routed (and stored, where it is kept),
//!   however long the queues of the sessions it went to. A slow subscriber
//!   holds its own queue, bounded by `limits.max_queued_messages` (and
//!   `limits.max_queued_bytes`) and dropped beyond it (counted as
//!   `queue_full`), as Mosquitto does;
//!   pausing every publisher of a topic while one of its subscribers lags
//!   would let one stalled device stop a site's telemetry. A client that
//!   must not lose messages to a slow peer uses a channel, which keeps
//!   them in storage rather than in a queue in memory. Measured
//!   (docs/benchmarks.md, "Broker throughput and latency"): with a queue
//!   allowed to grow to a million, four rumqttc publishers outrun one
//!   rumqttc subscriber and the broker spends a third of its CPU on the
//!   pages the backlog first touches; the figure that limits the rate is
//!   the subscriber's, both brokers measured leaving a third of the CPUs
//!   idle.
//!
//! Append channels ([`state`]'s `channel` module, [`reader`]):
//!
//! - A topic whose first level names an append channel is that channel's:
//!   a PUBLISH to it is a record (broker receipt time, User Properties in
//!   the publisher's order, the five publish properties, retain flag,
//!   client id, QoS) and never a broadcast: `#` subscribers do not get it
//!   and its retain flag is kept in the record, not in the retained
//!   store. A Will whose topic is a channel's is appended like a publish.
//! - A consumer is a session with a subscription whose filter's first
//!   level is the channel's name (reader `mqtt:<client id>`); several such
//!   filters of one session share one place in the channel, and a record
//!   goes at the highest QoS of the filters it matches, with their
//!   Subscription Identifiers. No Local skips the consumer's own records.
//!   A record matching none of its filters is passed over.
//! - Delivered records carry the User Property `saguin-offset` (decimal)
//!   after the publisher's own; an MQTT 3.1.1 consumer, which has no
//!   properties, gets the message as published. Its QoS is the lower of
//!   the record's and the subscription's; a QoS 0 consumer is never cut
//!   or dropped for being slow: it is sent what its writer takes and
//!   resumes as it drains (a log does not shed a reader's records).
//! - `saguin-from` on SUBSCRIBE (MQTT 5 User Property) applies to every
//!   channel filter of that packet: `earliest` is the oldest record held
//!   (no gap is reported for what retention removed before it), a decimal
//!   offset (0 is read as 1; below the floor, the records missed are
//!   reported as a gap), an RFC 3339 time (the earliest record received at
//!   or after it, every candidate looked at, since the receipt clock can
//!   step back; none: `next`). It moves a consumer that exists already;
//!   without it an existing consumer keeps its place and a new one starts
//!   at `next`. A value that is none of these refuses the filter with 0x83
//!   (logged with the value).
//! - A shared subscription over a channel (`$share/G/telemetry/#`) is one
//!   group with one place in the channel: each record matching its filter
//!   goes to one member, in turn among those connected with room; with
//!   none, the group waits at that record. A member whose session ends
//!   returns what it held and the group hands out again from the lowest
//!   offset returned (at least once). The group's position is stored as
//!   the reader `mqtt:$share/G/<filter>`, kept `limits.max_session_expiry`
//!   after it was last saved.
//! - Positions are kept for sessions that outlive their connection
//!   (expiry > 0): written every `ack_commit_interval`, when the client
//!   goes away and at shutdown, as the lowest offset sent and not
//!   acknowledged (QoS 1/2) or the next one. A session that ends takes its
//!   positions with it; a session with expiry 0 never writes one, and a
//!   consumer of one starts at `next` (or `saguin-from`) each time. After a
//!   restart a consumer resumes from its stored position; one whose
//!   session is gone has its position dropped.
//! - A new consumer's first position is written with its SUBSCRIBE when
//!   its start needs no read (`next`, an offset), so its SUBACK waits for
//!   it: killed before the first flush, the broker resumes it where it
//!   began, not at the `next` of the restart. A start that takes a read
//!   (`earliest`, a time) is written with its SUBSCRIBE as the first
//!   offset, and as what the read found the moment it finds it: killed in
//!   between, the broker resumes it from the floor (a time start then
//!   gets older records than it asked for, and retention's removals are
//!   told as a gap), never at `next`. A latest channel's new consumer
//!   owed its current values (Retain Handling 0, or 1 on a new
//!   subscription) is written with its SUBSCRIBE as the first offset
//!   until they are acknowledged: killed in between, the broker resumes it
//!   from there and sends every value again as a change, with the
//!   deletions since as empty payloads (at least once, never at `next`
//!   without them). One owed no values is written at `next`.
//! - A consumer's reads start at its `next`; a failed read is logged,
//!   counted in `saguin_storage_errors_total`, and tried again at the next
//!   tick (500 ms), never skipped. What it is sent is bounded by its free
//!   Receive Maximum (256 records a read for a QoS 0 consumer). What an
//!   append channel's reads found is kept by the channel, not by the
//!   consumer: the records of at most 16 reads and 1 MiB (accounted bytes;
//!   one read's more may stay past it), the least used let go first, each
//!   record with the message built for it once. A consumer whose `next`
//!   they hold is sent from them without a read, so consumers near each
//!   other share one read and one message a record; a read asks for more
//!   than the room of the consumer it is for (up to 256 records, as many
//!   as fit in 1 MiB at the channel's average record size), and what that
//!   consumer does not take now is there when its window opens again.
//!   A memory channel's read lends the records it keeps, as they are
//!   kept (`AppendStore::lend_from_n`): a read copies nothing, and the
//!   message a record's consumers receive is made from its parts once.
//!   Consumers at one place read once: a consumer whose `next` a read
//!   out already asks for waits for that read's answer instead of reading
//!   the same records again (a failed one is tried again at the tick for
//!   each of them). A record committed while the channel has consumers is
//!   kept with the message built for it at the end of the span ending at
//!   its offset, within the same 1 MiB (the tail span gives back its
//!   oldest quarter past it), so a consumer a little behind - its window
//!   was full when the record came - is sent it without a read. A
//!   consumer a week behind still costs one number: what the channel keeps
//!   is bounded whatever its consumers' distance. Retention tells the
//!   state every floor it raises, and what is kept below it is let go at
//!   once: a consumer behind it then reads, finds the floor and is told
//!   the gap (a record read before its removal may still be sent while
//!   the removal's word is on its way, as one in flight would be).
//! - A QoS 2 publish into a channel is held (no offset) in the channel's
//!   provider before PUBREC, whatever the publisher's session, and written
//!   at the next offset with the hold's removal in one transaction before
//!   PUBCOMP; a hold not released within `broker.exactly_once.expires_after`
//!   is dropped and counted, as is one whose session ends first or is gone
//!   at startup (a bridge's waits for its next connection).
//!
//! Latest channels ([`state`]'s `latest` module, [`reader`]):
//!
//! - A PUBLISH to a latest channel's topic replaces that topic's value and
//!   is answered after the commit, as an append is (0x97 at a bound, 0x83
//!   on a failed write); an empty payload deletes the value, and deleting
//!   a topic that holds none changes nothing and is delivered to nobody.
//!   Each set and deletion takes the channel's next offset.
//! - A consumer is a session subscribed under the channel's name, reader
//!   `mqtt:<client id>`, with a place in the channel's offsets as an append
//!   consumer has. A consumer with no place yet (none in memory, none
//!   stored) is first sent the current values under the SUBSCRIBE's
//!   filters as retained messages are: RETAIN set, Retain Handling
//!   honoured (0: sent; 1: sent when the subscription is new; 2: never),
//!   paced by its window, each carrying `saguin-offset`. Its changes start
//!   at the `next` the SUBSCRIBE found and wait until those values are
//!   sent, so a value that changed while they were read comes after them
//!   (possibly twice), never before an older one. Its stored position
//!   passes a value only once it is acknowledged (QoS 1/2) or sent (QoS
//!   0), so after a kill -9 or a connection that went away before all were
//!   sent, the resume sends what was not acknowledged again, as changes;
//!   once all are, a resume sends none of them. No position is stored
//!   while the values are still being read.
//! - A consumer with a place - its persistent session in memory, or its
//!   stored position after a restart - resumes with what changed since:
//!   each topic's latest change at or after the position, deletions as
//!   PUBLISHes with an empty payload, RETAIN clear, then live changes. A
//!   later SUBSCRIBE of the same session moves nothing and sends no values.
//!   A position below the channel's floor (deletions its retention
//!   forgot) is a full resync: the next delivery carries `saguin-gap:
//!   POSITION-(FLOOR-1)`, counted in `saguin_consumer_gap_total`, and the
//!   consumer reads every row again from the first offset - each current
//!   value, those set below the floor too, and the deletions the floor
//!   kept, as changes (RETAIN clear) in offset order - then goes on with
//!   the changes (`storage::contract::read_changes`). Reading them from the
//!   floor would miss values still current but set below it. Its position
//!   stays below the floor until the resync passes it, so a consumer
//!   killed during it starts it again; a floor that rises again during
//!   the resync past deletions it relied on starts it again with a new
//!   gap. A shared group over a latest channel does the same.
//! - A latest channel keeps every value; its deletion markers are kept as
//!   `retention_deletions` (how many) and `retention_age` (how long) say,
//!   unbounded without either. Retention forgets the oldest first and
//!   raises the floor past the last one forgotten in the same write; a
//!   marker with no timestamp is never too old and stops the age walk.
//! - The current values of a filter are read from the topic its literal
//!   prefix names (the levels before its first wildcard: `devices/site-7`
//!   for `devices/site-7/#`) and the range of topics under it
//!   (`devices/site-7/...`), in topic order in both providers, never every
//!   topic of the channel nor the siblings the prefix begins
//!   (`devices/site-70`); `devices/+/temp` reads the whole channel.
//!   Resuming reads the changes after the position, a window at a time (on
//!   sqlite a range of the index on a value's offset).
//!
//! Queue channels ([`state`]'s `queue` module):
//!
//! - A PUBLISH to a queue's topic enqueues a record, answered after the
//!   commit. A SUBSCRIBE under the queue's name (shared or not: a queue is
//!   already one group) makes the session a worker. A record goes to one
//!   connected worker whose filter matches its topic and whose Receive
//!   Maximum has room, the workers taking turns; the oldest available
//!   records first. It is delivered at QoS 1 whatever the subscription's
//!   QoS, with `saguin-offset` and `saguin-attempts` (this delivery's
//!   attempt, from 1).
//! - A worker holds at most the queue's `max_held_per_worker` records
//!   (64 unless set) being leased or sent and not yet answered, within
//!   its window. A worker's window wider than its share was leased a
//!   whole backlog while the others waited, and its going away counted
//!   an attempt on every job it held; the queue's bound is its own, so a
//!   site that widens the broker's window for its subscribers' sake does
//!   not widen every worker's, and a queue of long jobs can hand each
//!   worker one (`max_held_per_worker: 1`), which an MQTT 3.1.1 worker
//!   cannot ask for.
//! - Each delivery is a lease written (the attempt counted) before the
//!   PUBLISH is sent; the lease ends `lease` after on the broker's clock,
//!   looked at every tick (500 ms). PUBACK below 0x80 resolves the record
//!   (removed once its transaction commits); 0x80 or above, the lease running out,
//!   or the worker's connection ending releases it: available again after
//!   the `backoff` gap of that attempt, or, on its `max_attempts`th
//!   attempt, moved to `<queue>.dlq` in one transaction with
//!   `saguin-attempts`, `saguin-first-delivered`, `saguin-last-delivered`
//!   (RFC 3339) and `saguin-dlq-reason`. A worker's answer to a delivery
//!   whose lease ran out does nothing; its packet identifier stays in use
//!   until it answers. A persistent worker's deliveries are released when
//!   its connection ends and not sent again on resume.
//! - On sqlite a queue's writes are its persister's: the jobs it finds
//!   queued together are one group commit, the leases one transaction and
//!   the resolutions another, whatever else was queued between them (each
//!   was asked for once what it acts on had committed, so none depends on
//!   a neighbour). A resolution is kept out of the publishes'
//!   transactions, so a failed one never takes publishes with it; resolutions sharing one with each
//!   other are each still answered only after its commit, and when a
//!   shared one fails each runs again alone with the answer it would have
//!   had. A release (and a dead-letter move) keeps a transaction of its own.
//! - A resolution or release that fails (the provider full, the file
//!   unwritable) is tried again at the next tick; the record stays held,
//!   never handed to a second worker meanwhile, and a failed dead-letter
//!   move leaves it in the queue with its attempts and the dead-letter
//!   channel without a hole. A failed lease offers the record again.
//! - Who holds what is never stored (invariant 15). At startup every
//!   unresolved record is available with its attempts and delivery times;
//!   one whose attempts were spent before the stop is moved to the
//!   dead-letter channel then (`saguin-dlq-reason`: attempts spent before
//!   a restart) rather than delivered again.
//! - The dead-letter channel is served as an append channel of its own,
//!   bounded by `dlq_retention_bytes`; its records are read on its own
//!   topics (`jobs/email` arrives as `jobs.dlq/email`), so `jobs.dlq/#`
//!   consumes it like any append channel.
//! - Metrics: `saguin_queue_depth{channel}` (read from the store),
//!   `saguin_queue_in_flight`, `saguin_queue_attempts_total`,
//!   `saguin_queue_lease_expired_total` and
//!   `saguin_queue_dead_lettered_total`.
//!
//! Bridges ([`bridge`]):
//!
//! - A bridge's connection to the state is made inside the process (client
//!   id and principal `bridge:<name>`, MQTT 5, clean, Receive Maximum =
//!   `max_inflight` and 256 more); the ACL, when there is one, applies to
//!   that principal. The 256 are a reservoir: the remote's window (at
//!   most `max_inflight`) is refilled from it the moment a PUBACK arrives,
//!   while the acknowledgement goes round the state's queue, shared with
//!   every publisher. With the state's window as small as the remote's,
//!   each send waited for that round and the bridge's rate was its window
//!   over it. Memory: up to `max_inflight + 256` records held, as any
//!   subscriber with that Receive Maximum would make the state hold.
//! - Client ids beginning `bridge:` are the bridges' own: a network
//!   CONNECT with one is refused (MQTT 5 CONNACK 0x85, 3.1.1 return code
//!   0x02) before authentication, and logged with the peer and the id.
//!   The whole prefix, not only the names configured: a stranger under a
//!   bridge's id would take over its session, or hold one the bridge is
//!   then refused (another principal's), and a bridge added later would
//!   inherit a session a stranger left. A user name beginning `bridge:` is
//!   refused the same way (0x86, 3.1.1 0x04): without a password file a
//!   user name is the principal as given, and `bridge:<name>` would have
//!   that bridge's ACL (a password file's names end at their first `:`,
//!   so none is one). The rule lives where the network CONNECT is read
//!   (`connection.rs`); the bridge's own connection is made inside the
//!   process and never passes there.
//! - The bridge hands its acknowledgements to the state in batches of 64
//!   while the reservoir is at least half full (at once below that, and
//!   every 100 ms whatever their number): a consumer behind reads in
//!   windows of the room its acknowledgements made, so one at a time cost
//!   one read, on sqlite one read transaction, per record. The position
//!   lags by the batch at most, and never leads.
//! - Each bridge runs on a thread of its own with a runtime of its own (on
//!   the shared runtime only when the process cannot have one). With the
//!   remote's window full and records waiting it pauses an eighth of the
//!   measured round trip (at most 200 µs, none under 20 µs, timer slack
//!   1 µs) before reading the remote again: waiting on the socket, it was
//!   woken for every segment the remote wrote, which on a loaded machine
//!   made the remote spend a quarter more CPU a message (measured on
//!   Mosquitto) than with Mosquitto's own bridge, and that was the rate.
//! - A panic in a bridge's link is caught where the link is polled, logged
//!   at ERROR and counted (`saguin_bridge_failures_total`); the link's
//!   connection to the state is closed (nothing else would tell the state
//!   while the remote is away and the channels idle) and a new link starts
//!   after the reconnect backoff, from the stored position, until the stop.
//!   A bridge that ended silently left its channels unforwarded while the
//!   broker looked healthy.
//! - Remote down: the local connection stays and is simply not
//!   acknowledged, so the state's window fills and it stops sending; what
//!   the bridge holds is bounded by that window, the backlog is the
//!   channel. The sends in flight go again, DUP set and under the same
//!   packet ids, on the next connection.
//! - A delivery of a record published at QoS 0 is forwarded at QoS 0 (the
//!   delivery's QoS is the lower of the record's and the rule's), sent
//!   when the link is up and counted as skipped (`offline_qos0`) when not.
//! - The remote session is kept (clean start 0, MQTT 5 Session Expiry
//!   `session_expiry`) so `in` subscriptions and what they queue survive
//!   the link; `in` filters are subscribed again on each connection with
//!   Retain Handling 1 (MQTT 5), so a kept subscription does not resend
//!   retained messages.
//! - Inbound QoS 2 takes the held-publish path of any QoS 2 publisher: the
//!   remote gets PUBREC once the hold committed, and the record is written
//!   from the hold at the remote's PUBREL, so kill -9 at any point writes it
//!   once. The bridge publishes under the remote's packet id, so the
//!   remote's PUBREL names the hold; a bridge's holds outlive its session
//!   (which ends with each connection) and a restart, and the state names
//!   each again with a PUBREC when the bridge connects (a hold still being
//!   written when its connection ended, once the write is answered, and
//!   not at all if it fails). A remote that lost
//!   its session sends no PUBREL: its holds are released then. Holds of a
//!   bridge no longer configured are dropped at startup, and logged.
//! - A PUBACK >= 0x80 from the remote holds the position; the record is
//!   sent again after `reconnect.base` under a new packet id, so it may
//!   arrive after records sent later on the same topic.
//! - Addresses: without `round_robin` every reconnect starts at the first
//!   address (the primary) and tries the others in order, and while
//!   connected to another the bridge tries a TCP connection to the primary
//!   every `reconnect.cap` (off its loop); once one succeeds it leaves the
//!   secondary with DISCONNECT and reconnects, starting at the primary.
//!   With it, each starts at the one after the last that connected.
//!   Between failed rounds: `reconnect.base` doubling up to
//!   `reconnect.cap`, each wait drawn between half and all of it. A
//!   connection to another address than the last is taken as a remote
//!   that forgot the bridge's session, whatever it says: two addresses
//!   need not be one cluster.
//! - A latest channel forwarded out: every change goes out retained unless
//!   `retain: never`, a deletion as an empty retained publish. A bridge
//!   with no position in it subscribes for its current values (a latest
//!   channel has no `earliest`), one with a position for the changes
//!   after it only (Retain Handling 2).
//! - Loops between two saguins: a record carrying `saguin-channel` (put
//!   there by another saguin's outbound bridge, MQTT 5) is not sent out.

pub mod alias;
pub mod auth;
pub mod auth_files;
pub mod bench;
pub mod bridge;
pub mod codec;
pub mod connection;
pub mod health;
pub mod keep_alive;
pub mod lazy;
pub mod link;
pub mod logfmt;
pub mod long_lived;
pub mod message;
pub mod metrics;
pub mod notify;
pub mod parking;
pub mod persister;
pub mod places;
pub mod providers;
pub mod read_order;
pub mod reader;
pub mod retention;
pub mod server;
pub mod small_map;
pub mod snapshots;
pub mod state;
pub mod status;
pub mod subscriptions;
pub mod views;
pub mod workers;
