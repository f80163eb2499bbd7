//! A consumer: a session's place in one channel - the offset it looks at
//! next, what it was sent and has not acknowledged, where it starts - and
//! the user properties that speak of it on the wire. Plain values, moved
//! by the channel, group and latest code (`channel.rs`, `channel_share.rs`,
//! `latest.rs`).

use std::collections::VecDeque;

use super::reads::Seek;
use crate::broker::subscriptions::SubOptions;

pub use crate::broker::message::OFFSET_PROPERTY;
/// The user property telling a consumer which offsets retention removed
/// before it got them: `FROM-TO`, both inclusive.
pub const GAP_PROPERTY: &str = "saguin-gap";
/// The SUBSCRIBE user property choosing where a consumer without a
/// position starts: `earliest`, an offset, or an RFC 3339 time.
pub const FROM_PROPERTY: &str = "saguin-from";

/// One of a consumer's subscriptions on its channel.
#[derive(Debug, Clone)]
pub(super) struct ConsumerFilter {
    pub filter: String,
    /// `<channel>/#`: every record of the channel matches it, so no record
    /// is matched against it.
    pub whole_channel: bool,
    pub qos: u8,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub subscription_id: Option<u32>,
}

impl ConsumerFilter {
    /// Does a record on `topic` match it?
    pub(super) fn matches(&self, topic: &str) -> bool {
        self.whole_channel || crate::topic::filter_matches(&self.filter, topic)
    }

    /// What it asks of a record it matches, as the subscription index
    /// keeps it.
    pub(super) fn options(&self) -> SubOptions {
        SubOptions {
            qos: self.qos,
            no_local: self.no_local,
            retain_as_published: self.retain_as_published,
            retain_handling: 0,
            subscription_id: self.subscription_id,
        }
    }
}

/// A session's place in one channel.
#[derive(Debug)]
pub struct Consumer {
    pub(super) channel: u16,
    /// Tells a read's answer from one for an earlier consumer of the same
    /// session and channel.
    pub(super) generation: u64,
    pub(super) filters: Vec<ConsumerFilter>,
    /// The offset looked at next: everything below was sent or skipped.
    pub(super) next: u64,
    /// Offsets sent at QoS 1/2 and not acknowledged yet, and a latest
    /// channel's current values owed to it and not yet sent (QoS 0) or
    /// acknowledged.
    pub(super) unacked: Offsets,
    /// A latest channel's current values are being read for it (or are
    /// read again at the tick): what it is owed is not known yet, so no
    /// position is stored.
    pub(super) values_pending: bool,
    /// A read is out for it.
    pub(super) reading: bool,
    /// Where it starts, when that takes a read to find (earliest, a time).
    pub(super) seek: Option<Seek>,
    /// Offsets removed before it got them, announced on its next delivery.
    pub(super) gap: Option<(u64, u64)>,
    /// A latest channel's consumer reading every row again from the first
    /// offset: the floor that sent it there. Its reads rely on the
    /// deletion markers from there, not from its `next`, until it passes it.
    pub(super) resync: Option<u64>,
    /// The position last written.
    pub(super) stored: Option<u64>,
}

impl Consumer {
    /// What may be stored: it never passes an unacknowledged record.
    pub(super) fn position(&self) -> u64 {
        self.unacked.first().unwrap_or(self.next)
    }

    /// A current value at `offset` is owed to it: its position waits
    /// until the value is sent (QoS 0) or acknowledged.
    pub(super) fn owe(&mut self, offset: u64) {
        self.unacked.insert(offset);
    }

    /// The value at `offset` is no longer owed.
    pub(super) fn owed_done(&mut self, offset: u64) {
        self.unacked.remove(offset);
    }

    /// Values owed at `offsets` will not be sent where they were queued
    /// (the connection went away): it reads again from the lowest, where
    /// each topic's latest change since is what a resume reads, and any
    /// read of its out now is forgotten (`generation` is its new one).
    pub(super) fn rewind(&mut self, offsets: &[u64], generation: u64) {
        let Some(&lowest) = offsets.iter().min() else {
            return;
        };
        for offset in offsets {
            self.unacked.remove(*offset);
        }
        if lowest < self.next && !self.values_pending {
            self.next = lowest;
            self.generation = generation;
            self.reading = false;
        }
    }

    /// Start at `seek`: an offset at once, anything else once a read has
    /// found where it lies.
    pub(super) fn set_start(&mut self, seek: Seek) {
        match seek {
            Seek::Offset(offset) => {
                self.next = offset;
                self.seek = None;
            }
            other => self.seek = Some(other),
        }
    }
}

/// Offsets in ascending order, each once: what a consumer was sent and has
/// not acknowledged. Sent in ascending order and mostly acknowledged in
/// it, so an insert is a push at the back and a removal a pop at the front.
#[derive(Debug, Default)]
pub(super) struct Offsets(VecDeque<u64>);

impl Offsets {
    pub(super) fn first(&self) -> Option<u64> {
        self.0.front().copied()
    }

    pub(super) fn insert(&mut self, offset: u64) {
        if self.0.back().is_none_or(|&last| last < offset) {
            self.0.push_back(offset);
        } else if let Err(at) = self.0.binary_search(&offset) {
            self.0.insert(at, offset);
        }
    }

    pub(super) fn remove(&mut self, offset: u64) {
        if self.0.front() == Some(&offset) {
            self.0.pop_front();
        } else if let Ok(at) = self.0.binary_search(&offset) {
            self.0.remove(at);
        }
    }

    pub(super) fn clear(&mut self) {
        self.0.clear();
    }
}

/// A SUBSCRIBE's filters on channels, to start once its SUBACK is sent.
#[derive(Debug, Clone)]
pub(super) struct ConsumerStart {
    pub channel: u16,
    /// `saguin-from`, when the SUBSCRIBE carried one.
    pub seek: Option<Seek>,
    /// A shared subscription: its raw filter and its filter.
    pub group: Option<(String, String)>,
    /// The position written with the SUBSCRIBE, for a new consumer of a
    /// session that keeps positions (see `BrokerState::stage_start`).
    pub stored: Option<u64>,
}

/// `saguin-from`'s value as a seek, or why it is none.
pub fn parse_from(value: &str) -> Result<Seek, String> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("earliest") {
        return Ok(Seek::Earliest);
    }
    if let Ok(offset) = value.parse::<u64>() {
        return Ok(Seek::Offset(
            offset.max(crate::storage::contract::FIRST_OFFSET),
        ));
    }
    match rfc3339(value) {
        Some(time) => {
            let nanos = time
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|_| format!("{FROM_PROPERTY} {value:?}: a time before 1970"))?
                .as_nanos();
            Ok(Seek::Time(i64::try_from(nanos).unwrap_or(i64::MAX)))
        }
        None => Err(format!(
            "{FROM_PROPERTY} {value:?}: neither `earliest`, an offset nor an RFC 3339 time"
        )),
    }
}

/// An RFC 3339 time at any offset (`Z`, `+01:00`, `-05:30`; `t` and `z`
/// in either case, as RFC 3339 allows), or with none, read as UTC.
fn rfc3339(value: &str) -> Option<std::time::SystemTime> {
    use std::time::Duration;

    let (local, east_of_utc) = match value.strip_suffix(['Z', 'z']) {
        Some(local) => (local, Some(0)),
        None => match value
            .len()
            .checked_sub(6)
            .map(|at| value.split_at_checked(at))
        {
            Some(Some((local, offset))) => match offset.as_bytes() {
                [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2]
                    if [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit()) =>
                {
                    let digit = |d: &u8| i64::from(d - b'0');
                    let minutes = (digit(h1) * 10 + digit(h2)) * 60 + digit(m1) * 10 + digit(m2);
                    (local, Some(if *sign == b'+' { minutes } else { -minutes }))
                }
                _ => (value, None),
            },
            _ => (value, None),
        },
    };
    // The separator may be a lower-case `t`; humantime reads `T` or a space.
    let local = match local.split_at_checked(10) {
        Some((date, rest)) if rest.starts_with('t') => format!("{date}T{}", &rest[1..]),
        _ => local.to_owned(),
    };
    let as_if_utc = humantime::parse_rfc3339_weak(&local).ok()?;
    let shift = Duration::from_secs(east_of_utc.unwrap_or(0).unsigned_abs() * 60);
    // A time east of UTC happened that much earlier than its digits read.
    if east_of_utc.unwrap_or(0) >= 0 {
        as_if_utc.checked_sub(shift)
    } else {
        as_if_utc.checked_add(shift)
    }
}

/// A SUBSCRIBE's `saguin-from`, for the filters of it on channels.
pub(super) fn seek_of(user_properties: &[(String, String)]) -> Result<Option<Seek>, String> {
    match user_properties.iter().find(|(k, _)| k == FROM_PROPERTY) {
        Some((_, v)) => parse_from(v).map(Some),
        None => Ok(None),
    }
}

/// A topic's or filter's first level.
pub(super) fn first_level(topic: &str) -> &str {
    topic.split('/').next().unwrap_or(topic)
}

#[cfg(test)]
mod tests {
    use super::{rfc3339, Offsets};
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn an_rfc3339_time_is_read_at_any_offset_as_the_same_instant() {
        let instant = UNIX_EPOCH + Duration::from_secs(1_796_407_140); // 2026-12-04T17:59:00Z
        for value in [
            "2026-12-04T17:59:00Z",
            "2026-12-04t17:59:00z",
            "2026-12-04T18:59:00+01:00",
            "2026-12-04T12:29:00-05:30",
            "2026-12-04T17:59:00+00:00",
            "2026-12-04T17:59:00-00:00",
            "2026-12-04 17:59:00Z",
            "2026-12-04T17:59:00",
        ] {
            assert_eq!(rfc3339(value), Some(instant), "{value}");
        }
        assert_eq!(
            rfc3339("2026-12-04T18:59:00.250+01:00"),
            Some(instant + Duration::from_millis(250))
        );
        for value in [
            "2026-12-04T17:59:00+1:00",
            "2026-12-04T17:59:00+01",
            "2026-12-04",
            "17:59:00Z",
            "",
            "\u{e9}\u{e9}\u{e9}\u{e9}",
        ] {
            assert_eq!(rfc3339(value), None, "{value}");
        }
    }

    #[test]
    fn offsets_stay_ascending_and_each_once_whatever_the_order() {
        let mut offsets = Offsets::default();
        for o in [5, 7, 6, 9, 7, 1] {
            offsets.insert(o);
        }
        assert_eq!(offsets.0, [1, 5, 6, 7, 9]);
        offsets.remove(6);
        offsets.remove(1);
        offsets.remove(42);
        assert_eq!(offsets.first(), Some(5));
        assert_eq!(offsets.0, [5, 7, 9]);
        offsets.clear();
        assert_eq!(offsets.first(), None);
    }
}
