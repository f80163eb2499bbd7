//! The primitive encodings every format 21 body is made of (FORMAT.md §1):
//! little-endian integers, `u32`-length-prefixed byte strings, one-byte
//! booleans and presence tags, `u32` element counts.
//!
//! The reader never indexes or unwraps: every read is checked against the
//! bytes left before the checksum, every count against the smallest
//! encoding its elements can have before anything is allocated.

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

/// Reads primitive encodings from `buf[pos..end]`, where `end` is the start
/// of the checksum trailer.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    /// When the input is shared, byte strings are zero-copy slices of it;
    /// otherwise each is copied into its own allocation, so no decoded
    /// record keeps the whole file alive.
    owner: Option<&'a Bytes>,
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    /// A reader whose byte strings share `buf`'s allocation.
    pub(crate) fn shared(buf: &'a Bytes, pos: usize, end: usize) -> Reader<'a> {
        Reader {
            buf,
            owner: Some(buf),
            pos,
            end,
        }
    }

    /// A reader whose byte strings are copied out of `buf`.
    pub(crate) fn copying(buf: &'a [u8], pos: usize, end: usize) -> Reader<'a> {
        Reader {
            buf,
            owner: None,
            pos,
            end,
        }
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
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], DecodeError> {
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
        let slice = self.buf.get(start..stop).ok_or_else(|| {
            DecodeError::corrupt(field, start, "reaches past the end of the file")
        })?;
        self.pos = stop;
        Ok(slice)
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

    /// A `u32` length and that many bytes: where they start, and the bytes.
    /// One bounds check covers both the declared length and the input.
    #[inline]
    fn length_prefixed(&mut self, field: &str) -> Result<(usize, &'a [u8]), DecodeError> {
        let len_at = self.pos;
        let len = self.u32(field)? as usize;
        let start = self.pos;
        let slice = start
            .checked_add(len)
            .filter(|&stop| stop <= self.end)
            .and_then(|stop| self.buf.get(start..stop));
        let Some(slice) = slice else {
            return Err(DecodeError::corrupt(
                field,
                len_at,
                format!(
                    "declared length {len} exceeds the {} bytes left before the checksum",
                    self.remaining()
                ),
            ));
        };
        self.pos = start + len; // in bounds: checked just above
        Ok((start, slice))
    }

    /// A `u32`-length-prefixed byte string: a slice of a shared input, or a
    /// copy of it.
    #[inline]
    pub(crate) fn bytes(&mut self, field: &str) -> Result<Bytes, DecodeError> {
        let (start, slice) = self.length_prefixed(field)?;
        Ok(match self.owner {
            Some(owner) => owner.slice(start..start + slice.len()),
            None => Bytes::copy_from_slice(slice),
        })
    }

    /// A `u32`-length-prefixed UTF-8 string.
    #[inline]
    pub(crate) fn str(&mut self, field: &str) -> Result<String, DecodeError> {
        self.text(field).map(str::to_owned)
    }

    /// [`Reader::str`] where it lies in the input, not copied.
    #[inline]
    pub(crate) fn text(&mut self, field: &str) -> Result<&'a str, DecodeError> {
        let (start, raw) = self.length_prefixed(field)?;
        std::str::from_utf8(raw)
            .map_err(|e| DecodeError::corrupt(field, start + e.valid_up_to(), "not valid UTF-8"))
    }

    /// True, consuming them, when the next `N` bytes are all zero: the
    /// common "every optional field absent" run of presence tags.
    #[inline]
    pub(crate) fn skip_zeros<const N: usize>(&mut self) -> bool {
        let all_zero = self
            .pos
            .checked_add(N)
            .filter(|&stop| stop <= self.end)
            .and_then(|stop| self.buf.get(self.pos..stop))
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
