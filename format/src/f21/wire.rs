//! The primitive encodings every format 21 body is made of (FORMAT.md §1):
//! little-endian integers, `u32`-length-prefixed byte strings, one-byte
//! booleans and presence tags, `u32` element counts.
//!
//! The reader never indexes or unwraps: every read is checked against the
//! bytes left before the checksum, every count against the smallest
//! encoding its elements can have before anything is allocated.

use std::io::{self, Read};
use std::marker::PhantomData;

use bytes::Bytes;

use super::error::DecodeError;

/// Appends primitive encodings to a buffer.
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn with_capacity(capacity: usize) -> Writer {
        Writer {
            buf: Vec::with_capacity(capacity),
        }
    }

    #[inline]
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    #[inline]
    pub(crate) fn bool(&mut self, v: bool) {
        self.buf.push(u8::from(v));
    }

    #[inline]
    pub(crate) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    #[inline]
    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    #[inline]
    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    #[inline]
    pub(crate) fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A count or a length. Nothing saguin holds in memory reaches 2^32
    /// elements or a 4 GiB string (MQTT caps a packet at 256 MiB), so a
    /// value that does is a caller's bug rather than data to write wrongly.
    #[inline]
    pub(crate) fn len(&mut self, n: usize) {
        let n = u32::try_from(n).expect("a format 21 length or count exceeds u32::MAX");
        self.u32(n);
    }

    #[inline]
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.len(v.len());
        self.buf.extend_from_slice(v);
    }

    #[inline]
    pub(crate) fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }

    #[inline]
    pub(crate) fn opt_str(&mut self, v: Option<&str>) {
        match v {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }

    #[inline]
    pub(crate) fn opt_bytes(&mut self, v: Option<&[u8]>) {
        match v {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.bytes(s);
            }
        }
    }

    #[inline]
    pub(crate) fn opt_u8(&mut self, v: Option<u8>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u8(x);
            }
        }
    }

    #[inline]
    pub(crate) fn opt_u32(&mut self, v: Option<u32>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u32(x);
            }
        }
    }
}

/// Reads primitive encodings from a body: bytes `pos..end` of a file,
/// where `end` is the start of the checksum trailer. Offsets are the
/// file's, whichever input holds the bytes. Generic over the input, so
/// that a whole file is read with nothing a stream needs in its way.
pub(crate) struct Reader<'a, I: Input<'a> = Whole<'a>> {
    input: I,
    pos: usize,
    end: usize,
    _bytes: PhantomData<&'a [u8]>,
}

/// Where a reader's bytes are: a whole file in memory ([`Whole`]) or a
/// file read as it is decoded ([`Stream`]).
pub(crate) trait Input<'a> {
    /// Bytes `start..stop` of the file (`stop` at most `end`, `start` at
    /// or after every byte asked for before). `None` when they are not
    /// there.
    fn span(&mut self, start: usize, stop: usize, end: usize) -> Option<&[u8]>;

    /// [`Input::span`] for as long as a whole input lives: `None` when
    /// streaming.
    fn in_place(&self, start: usize, stop: usize) -> Option<&'a [u8]>;

    /// Bytes `start..stop` as a zero-copy slice of a shared input, when
    /// the input is one.
    fn shared(&self, start: usize, stop: usize) -> Option<Bytes>;
}

/// The whole file, in memory. When `owner` is given, byte strings are
/// zero-copy slices of it; otherwise each is copied into its own
/// allocation, so no decoded record keeps the whole file alive.
pub(crate) struct Whole<'a> {
    buf: &'a [u8],
    owner: Option<&'a Bytes>,
}

impl<'a> Input<'a> for Whole<'a> {
    #[inline]
    fn span(&mut self, start: usize, stop: usize, _: usize) -> Option<&[u8]> {
        self.buf.get(start..stop)
    }

    #[inline]
    fn in_place(&self, start: usize, stop: usize) -> Option<&'a [u8]> {
        self.buf.get(start..stop)
    }

    #[inline]
    fn shared(&self, start: usize, stop: usize) -> Option<Bytes> {
        self.owner
            .filter(|owner| stop <= owner.len())
            .map(|owner| owner.slice(start..stop))
    }
}

/// The file as it is read, a window at a time: what is behind the reader
/// is let go, so it holds about the largest element and a chunk, not the
/// file; and the checksum of all it read.
pub(crate) struct Stream<'a> {
    source: &'a mut dyn Read,
    /// Bytes `at..at + window.len()` of the file.
    window: Vec<u8>,
    at: usize,
    /// The checksum of every byte read from `source` so far (all of them
    /// before the trailer).
    crc: u32,
    /// Why `source` gave no more bytes, when it failed or ended early: the
    /// decode's verdict is then the read's, not the bytes'.
    failure: Option<io::Error>,
}

/// What a streaming reader reads from its source at once, at least. A few
/// bytes in this crate's tests and under the fuzzer, so that every element
/// of their files is read across a refill.
const STREAM_CHUNK: usize = if cfg!(any(test, fuzzing)) { 7 } else { 1 << 20 };

/// A string where it lies in a whole input, or a copy of it read from a
/// stream.
pub(crate) enum Text<'a> {
    InPlace(&'a str),
    Copied(String),
}

impl<'a> Reader<'a> {
    /// A reader whose byte strings share `buf`'s allocation.
    pub(crate) fn shared(buf: &'a Bytes, pos: usize, end: usize) -> Reader<'a> {
        let whole = Whole {
            buf,
            owner: Some(buf),
        };
        Reader::of(whole, pos, end)
    }

    /// A reader whose byte strings are copied out of `buf`.
    pub(crate) fn copying(buf: &'a [u8], pos: usize, end: usize) -> Reader<'a> {
        Reader::of(Whole { buf, owner: None }, pos, end)
    }
}

impl<'a> Reader<'a, Stream<'a>> {
    /// A reader of the bytes from `pos` (the file's first `pos` bytes
    /// already read from `source`, `crc` their checksum) up to `end`,
    /// reading them from `source` as they are needed. Its byte strings
    /// are copies.
    pub(crate) fn streaming(
        source: &'a mut dyn Read,
        pos: usize,
        crc: u32,
        end: usize,
    ) -> Reader<'a, Stream<'a>> {
        let stream = Stream {
            source,
            window: Vec::new(),
            at: pos,
            crc,
            failure: None,
        };
        Reader::of(stream, pos, end)
    }

    /// The source read on to `end` and then for `TRAILER` more bytes: the
    /// checksum of everything before `end`, and the trailer. `Err` is why
    /// the source could not give them (or why it failed before).
    pub(crate) fn finish_stream<const TRAILER: usize>(self) -> io::Result<(u32, [u8; TRAILER])> {
        let end = self.end;
        let mut stream = self.input;
        if let Some(failure) = stream.failure.take() {
            return Err(failure);
        }
        let mut fetched = stream.at + stream.window.len();
        let mut chunk = std::mem::take(&mut stream.window);
        chunk.resize(STREAM_CHUNK.min(end.saturating_sub(fetched)), 0);
        while fetched < end {
            let part = chunk
                .get_mut(..(end - fetched).min(STREAM_CHUNK))
                .unwrap_or_default();
            stream.source.read_exact(part)?;
            stream.crc = crc32c::crc32c_append(stream.crc, part);
            fetched += part.len();
        }
        let mut trailer = [0u8; TRAILER];
        stream.source.read_exact(&mut trailer)?;
        Ok((stream.crc, trailer))
    }
}

impl<'a, I: Input<'a>> Reader<'a, I> {
    fn of(input: I, pos: usize, end: usize) -> Reader<'a, I> {
        Reader {
            input,
            pos,
            end,
            _bytes: PhantomData,
        }
    }

    /// Bytes `start..stop` of the file, within the body: read from the
    /// source first when streaming. `None` when they are not there (a
    /// stream's source failed or ended early).
    #[inline]
    fn span(&mut self, start: usize, stop: usize) -> Option<&[u8]> {
        self.input.span(start, stop, self.end)
    }

    /// The byte offset of the next read, for error messages.
    #[inline]
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.end.saturating_sub(self.pos)
    }

    /// The next `n` bytes, or a `Corrupt` naming `field` when fewer remain.
    #[inline]
    fn take(&mut self, n: usize, field: &str) -> Result<&[u8], DecodeError> {
        let start = self.pos;
        let stop = start
            .checked_add(n)
            .filter(|&stop| stop <= self.end)
            .ok_or_else(|| {
                DecodeError::corrupt(
                    field,
                    start,
                    format!(
                        "needs {n} bytes but only {} remain before the checksum",
                        self.remaining()
                    ),
                )
            })?;
        self.pos = stop;
        self.declared(field, start, stop)
    }

    #[inline]
    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], DecodeError> {
        let at = self.pos;
        let slice = self.take(N, field)?;
        <[u8; N]>::try_from(slice)
            .map_err(|_| DecodeError::corrupt(field, at, "short fixed-size field"))
    }

    #[inline]
    pub(crate) fn u8(&mut self, field: &str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    #[inline]
    pub(crate) fn u16(&mut self, field: &str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    #[inline]
    pub(crate) fn u32(&mut self, field: &str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    #[inline]
    pub(crate) fn u64(&mut self, field: &str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    #[inline]
    pub(crate) fn i64(&mut self, field: &str) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array(field)?))
    }

    #[inline]
    pub(crate) fn fixed<const N: usize>(&mut self, field: &str) -> Result<[u8; N], DecodeError> {
        self.array(field)
    }

    /// A boolean byte: 0 or 1, nothing else.
    #[inline]
    pub(crate) fn bool(&mut self, field: &str) -> Result<bool, DecodeError> {
        let at = self.pos;
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::corrupt(
                field,
                at,
                format!("boolean byte is {other}, not 0 or 1"),
            )),
        }
    }

    /// A presence tag before an optional value: 0 absent, 1 present.
    #[inline]
    pub(crate) fn present(&mut self, field: &str) -> Result<bool, DecodeError> {
        let at = self.pos;
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::corrupt(
                field,
                at,
                format!("presence tag is {other}, not 0 (absent) or 1 (present)"),
            )),
        }
    }

    /// A `u32` length, checked against the bytes left: where the bytes it
    /// declares start and stop. One bounds check covers both the declared
    /// length and the input.
    #[inline]
    fn length_prefixed(&mut self, field: &str) -> Result<(usize, usize), DecodeError> {
        let len_at = self.pos;
        let len = self.u32(field)? as usize;
        let start = self.pos;
        let Some(stop) = start.checked_add(len).filter(|&stop| stop <= self.end) else {
            return Err(DecodeError::corrupt(
                field,
                len_at,
                format!(
                    "declared length {len} exceeds the {} bytes left before the checksum",
                    self.remaining()
                ),
            ));
        };
        self.pos = stop;
        Ok((start, stop))
    }

    /// Bytes `start..stop`, checked to lie in the body, or where they are
    /// missing from the input.
    #[inline]
    fn declared(&mut self, field: &str, start: usize, stop: usize) -> Result<&[u8], DecodeError> {
        self.span(start, stop)
            .ok_or_else(|| DecodeError::corrupt(field, start, "reaches past the end of the file"))
    }

    /// A `u32`-length-prefixed byte string: a slice of a shared input, or a
    /// copy of it.
    #[inline]
    pub(crate) fn bytes(&mut self, field: &str) -> Result<Bytes, DecodeError> {
        let (start, stop) = self.length_prefixed(field)?;
        if let Some(shared) = self.input.shared(start, stop) {
            return Ok(shared);
        }
        self.declared(field, start, stop)
            .map(Bytes::copy_from_slice)
    }

    /// A `u32`-length-prefixed UTF-8 string.
    #[inline]
    pub(crate) fn str(&mut self, field: &str) -> Result<String, DecodeError> {
        let (start, stop) = self.length_prefixed(field)?;
        let raw = self.declared(field, start, stop)?;
        utf8(raw, field, start).map(str::to_owned)
    }

    /// [`Reader::str`] where it lies in a whole input, not copied; a copy
    /// when streaming.
    #[inline]
    pub(crate) fn text(&mut self, field: &str) -> Result<Text<'a>, DecodeError> {
        let (start, stop) = self.length_prefixed(field)?;
        if let Some(raw) = self.input.in_place(start, stop) {
            return utf8(raw, field, start).map(Text::InPlace);
        }
        let raw = self.declared(field, start, stop)?;
        utf8(raw, field, start).map(|text| Text::Copied(text.to_owned()))
    }

    /// True, consuming them, when the next `N` bytes are all zero: the
    /// common "every optional field absent" run of presence tags.
    #[inline]
    pub(crate) fn skip_zeros<const N: usize>(&mut self) -> bool {
        let start = self.pos;
        let all_zero = start
            .checked_add(N)
            .filter(|&stop| stop <= self.end)
            .and_then(|stop| self.span(start, stop))
            .is_some_and(|run| run.iter().all(|&b| b == 0));
        if all_zero {
            self.pos += N; // in bounds: checked just above
        }
        all_zero
    }

    #[inline]
    pub(crate) fn opt_str(&mut self, field: &str) -> Result<Option<String>, DecodeError> {
        if self.present(field)? {
            self.str(field).map(Some)
        } else {
            Ok(None)
        }
    }

    #[inline]
    pub(crate) fn opt_bytes(&mut self, field: &str) -> Result<Option<Bytes>, DecodeError> {
        if self.present(field)? {
            self.bytes(field).map(Some)
        } else {
            Ok(None)
        }
    }

    #[inline]
    pub(crate) fn opt_u8(&mut self, field: &str) -> Result<Option<u8>, DecodeError> {
        if self.present(field)? {
            self.u8(field).map(Some)
        } else {
            Ok(None)
        }
    }

    #[inline]
    pub(crate) fn opt_u32(&mut self, field: &str) -> Result<Option<u32>, DecodeError> {
        if self.present(field)? {
            self.u32(field).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An element count, refused before anything is allocated when even
    /// the smallest encoding of that many elements (`min_size` bytes each)
    /// cannot fit in the bytes left.
    #[inline]
    pub(crate) fn count(&mut self, field: &str, min_size: usize) -> Result<usize, DecodeError> {
        let at = self.pos;
        let n = self.u32(field)? as usize;
        let needed = n.saturating_mul(min_size);
        if needed > self.remaining() {
            return Err(DecodeError::corrupt(
                field,
                at,
                format!(
                    "count {n} needs at least {needed} bytes but only {} remain before the checksum",
                    self.remaining()
                ),
            ));
        }
        Ok(n)
    }
}

/// `raw` as UTF-8, or a `Corrupt` naming `field` at the first bad byte.
fn utf8<'b>(raw: &'b [u8], field: &str, start: usize) -> Result<&'b str, DecodeError> {
    std::str::from_utf8(raw)
        .map_err(|e| DecodeError::corrupt(field, start + e.valid_up_to(), "not valid UTF-8"))
}

impl<'a> Input<'a> for Stream<'a> {
    #[inline]
    fn span(&mut self, start: usize, stop: usize, end: usize) -> Option<&[u8]> {
        if stop > self.at + self.window.len() {
            self.fetch(start, stop, end)?;
        }
        self.window
            .get(start.checked_sub(self.at)?..stop.checked_sub(self.at)?)
    }

    #[inline]
    fn in_place(&self, _: usize, _: usize) -> Option<&'a [u8]> {
        None
    }

    #[inline]
    fn shared(&self, _: usize, _: usize) -> Option<Bytes> {
        None
    }
}

impl Stream<'_> {
    /// Lets go of what lies before `start` and reads from the source as
    /// far as `stop`, at least [`STREAM_CHUNK`] at a time (never past
    /// `end`). `None`, the failure kept, when the source cannot give them.
    #[cold]
    fn fetch(&mut self, start: usize, stop: usize, end: usize) -> Option<()> {
        if self.failure.is_some() || start < self.at {
            return None;
        }
        let fetched = self.at + self.window.len();
        // Bytes between what was read and `start` (none a decoder skips)
        // are read all the same: the checksum covers them.
        let behind = (start - self.at).min(self.window.len());
        self.window.drain(..behind);
        self.at += behind;
        let target = stop.max(fetched.saturating_add(STREAM_CHUNK)).min(end);
        if target < stop {
            return None;
        }
        self.window.resize(target - self.at, 0);
        let fresh = self.window.get_mut(fetched - self.at..)?;
        if let Err(e) = self.source.read_exact(fresh) {
            self.failure = Some(e);
            self.window.truncate(fetched - self.at);
            return None;
        }
        self.crc = crc32c::crc32c_append(self.crc, fresh);
        Some(())
    }
}
