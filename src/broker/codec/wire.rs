//! MQTT data representations (MQTT 5 §1.5): two- and four-byte integers,
//! variable byte integers, length-prefixed strings and binary data. Reading
//! is bounds-checked against the packet body; no read indexes past it.

use bytes::{BufMut, Bytes, BytesMut};

use super::error::{DecodeError, EncodeError};
use super::primitives::{ByteStr, PacketType};

/// The largest value a variable byte integer can hold (4 bytes of 7 bits).
pub const MAX_VARIABLE_BYTE_INTEGER: u32 = 268_435_455;

/// A cursor over one packet body. `base` is the number of fixed-header bytes
/// before the body, so positions in errors count from the packet's first byte.
pub(crate) struct Reader {
    buf: Bytes,
    pos: usize,
    base: usize,
    pub(crate) packet: PacketType,
}

impl Reader {
    pub(crate) fn new(buf: Bytes, base: usize, packet: PacketType) -> Reader {
        Reader {
            buf,
            pos: 0,
            base,
            packet,
        }
    }

    /// Offset of the next byte, counted from the start of the packet.
    pub(crate) fn at(&self) -> usize {
        self.base + self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    fn truncated(&self, field: &'static str) -> DecodeError {
        DecodeError::Truncated {
            packet: self.packet,
            field,
            at: self.at(),
        }
    }

    /// Takes the next `len` bytes as a zero-copy slice.
    pub(crate) fn take(&mut self, len: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        if len > self.remaining() {
            return Err(self.truncated(field));
        }
        let out = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(out)
    }

    /// The rest of the body as a zero-copy slice.
    pub(crate) fn take_rest(&mut self) -> Bytes {
        let out = self.buf.slice(self.pos.min(self.buf.len())..);
        self.pos = self.buf.len();
        out
    }

    /// A sub-reader over the next `len` bytes (a property block).
    pub(crate) fn sub(&mut self, len: usize, field: &'static str) -> Result<Reader, DecodeError> {
        let base = self.at();
        let buf = self.take(len, field)?;
        Ok(Reader {
            buf,
            pos: 0,
            base,
            packet: self.packet,
        })
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| self.truncated(field))?;
        self.pos += 1;
        Ok(b)
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        let bytes: [u8; 2] = self
            .buf
            .get(self.pos..self.pos + 2)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| self.truncated(field))?;
        let v = u16::from_be_bytes(bytes);
        self.pos += 2;
        Ok(v)
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let bytes: [u8; 4] = self
            .buf
            .get(self.pos..self.pos + 4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| self.truncated(field))?;
        let v = u32::from_be_bytes(bytes);
        self.pos += 4;
        Ok(v)
    }

    /// A variable byte integer: at most 4 bytes, minimally encoded (§1.5.5).
    pub(crate) fn var_int(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let start = self.at();
        match parse_var_int(self.buf.get(self.pos..).unwrap_or_default()) {
            VarInt::Value { value, len } => {
                self.pos += len;
                Ok(value)
            }
            VarInt::Incomplete => Err(self.truncated(field)),
            VarInt::Malformed => Err(DecodeError::MalformedVariableByteInteger {
                packet: self.packet,
                field,
                at: start,
            }),
        }
    }

    /// Two-byte length then that many bytes.
    pub(crate) fn binary(&mut self, field: &'static str) -> Result<Bytes, DecodeError> {
        let len = self.u16(field)?;
        self.take(usize::from(len), field)
    }

    /// A UTF-8 encoded string (§1.5.4): valid UTF-8 (so no surrogates) and
    /// no U+0000. Zero-copy.
    pub(crate) fn byte_str(&mut self, field: &'static str) -> Result<ByteStr, DecodeError> {
        let at = self.at() + 2;
        let raw = self.binary(field)?;
        check_utf8(&raw, self.packet, field, at)?;
        Ok(ByteStr::from_validated(raw))
    }

    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let at = self.at() + 2;
        let raw = self.binary(field)?;
        check_utf8(&raw, self.packet, field, at)?;
        String::from_utf8(raw.to_vec()).map_err(|_| DecodeError::InvalidUtf8 {
            packet: self.packet,
            field,
            at,
        })
    }
}

fn check_utf8(
    raw: &[u8],
    packet: PacketType,
    field: &'static str,
    at: usize,
) -> Result<(), DecodeError> {
    let s = std::str::from_utf8(raw).map_err(|e| DecodeError::InvalidUtf8 {
        packet,
        field,
        at: at + e.valid_up_to(),
    })?;
    if let Some(i) = s.bytes().position(|b| b == 0) {
        return Err(DecodeError::NullCharacter {
            packet,
            field,
            at: at + i,
        });
    }
    Ok(())
}

/// The outcome of reading a variable byte integer from a byte prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VarInt {
    Value {
        value: u32,
        len: usize,
    },
    /// Every byte present has its continuation bit set and fewer than 4 are
    /// present: more input is needed.
    Incomplete,
    /// A fourth byte with the continuation bit, or a non-minimal encoding.
    Malformed,
}

pub(crate) fn parse_var_int(bytes: &[u8]) -> VarInt {
    let mut value: u32 = 0;
    for i in 0..4 {
        let Some(&b) = bytes.get(i) else {
            return VarInt::Incomplete;
        };
        value |= u32::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            // A last byte of 0 after the first means a shorter encoding
            // existed: MQTT requires the minimum number of bytes.
            if i > 0 && b == 0 {
                return VarInt::Malformed;
            }
            return VarInt::Value { value, len: i + 1 };
        }
    }
    VarInt::Malformed
}

/// Bytes a variable byte integer takes for `value` (≤ 268,435,455).
pub(crate) fn var_int_len(value: usize) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

pub(crate) fn put_var_int(buf: &mut BytesMut, mut value: usize) {
    loop {
        let mut byte = (value % 128) as u8;
        value /= 128;
        if value > 0 {
            byte |= 0x80;
        }
        buf.put_u8(byte);
        if value == 0 {
            break;
        }
    }
}

/// Checks a string or binary field fits its two-byte length.
pub(crate) fn check_len(
    packet: PacketType,
    field: &'static str,
    len: usize,
) -> Result<(), EncodeError> {
    if len > usize::from(u16::MAX) {
        return Err(EncodeError::FieldTooLong { packet, field, len });
    }
    Ok(())
}

/// Writes a two-byte length and the bytes; the length was checked by
/// [`check_len`] during validation before any byte is written.
pub(crate) fn put_binary(buf: &mut BytesMut, bytes: &[u8]) {
    let len = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
    buf.put_u16(len);
    buf.put_slice(bytes.get(..usize::from(len)).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn var_int_boundaries() {
        for (value, len) in [
            (0usize, 1usize),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (2_097_151, 3),
            (2_097_152, 4),
            (268_435_455, 4),
        ] {
            let mut buf = BytesMut::new();
            put_var_int(&mut buf, value);
            assert_eq!(buf.len(), len, "{value}");
            assert_eq!(var_int_len(value), len);
            assert_eq!(
                parse_var_int(&buf),
                VarInt::Value {
                    value: value as u32,
                    len
                }
            );
        }
        // The specification's table (MQTT 5 §1.5.5).
        let mut buf = BytesMut::new();
        put_var_int(&mut buf, 268_435_455);
        assert_eq!(&buf[..], &[0xFF, 0xFF, 0xFF, 0x7F]);
        let mut buf = BytesMut::new();
        put_var_int(&mut buf, 16_384);
        assert_eq!(&buf[..], &[0x80, 0x80, 0x01]);
    }

    #[test]
    fn var_int_refusals() {
        assert_eq!(
            parse_var_int(&[0xFF, 0xFF, 0xFF, 0xFF, 0x01]),
            VarInt::Malformed
        );
        assert_eq!(parse_var_int(&[0xFF, 0xFF, 0xFF, 0xFF]), VarInt::Malformed);
        assert_eq!(parse_var_int(&[0xFF, 0xFF]), VarInt::Incomplete);
        assert_eq!(parse_var_int(&[]), VarInt::Incomplete);
        assert_eq!(parse_var_int(&[0x80, 0x00]), VarInt::Malformed);
    }

    #[test]
    fn strings_refuse_nul_and_surrogates() {
        let mut r = Reader::new(
            Bytes::from_static(b"\x00\x03a\x00b"),
            2,
            PacketType::Publish,
        );
        assert_eq!(
            r.string("topic"),
            Err(DecodeError::NullCharacter {
                packet: PacketType::Publish,
                field: "topic",
                at: 5
            })
        );
        // U+D800 encoded as CESU bytes ED A0 80.
        let mut r = Reader::new(
            Bytes::from_static(b"\x00\x03\xED\xA0\x80"),
            0,
            PacketType::Publish,
        );
        assert!(matches!(
            r.string("topic"),
            Err(DecodeError::InvalidUtf8 { at: 2, .. })
        ));
        let mut r = Reader::new(Bytes::from_static(b"\x00\x05ab"), 0, PacketType::Publish);
        assert!(matches!(
            r.byte_str("topic"),
            Err(DecodeError::Truncated { .. })
        ));
    }
}
