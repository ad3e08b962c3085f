//! The protobuf wire format, read only: fields of a message as (number, value).

use base64::Engine;
use serde_json::{Map, Value as Json};

/// Malformed protobuf.
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("a varint longer than 10 bytes at byte {0}")]
    LongVarint(usize),
    #[error("field {field} has wire type {wire_type}, which Kubernetes does not use")]
    WireType { field: u64, wire_type: u64 },
    #[error("field {0} is not the type its message declares")]
    Type(u64),
    #[error("a string that is not UTF-8")]
    Utf8,
}

/// One field's value.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(&'a [u8]),
}

impl<'a> Value<'a> {
    /// A `string` field.
    ///
    /// # Errors
    /// `Utf8`, or `Type` (as field 0) when the field is not length-delimited.
    pub fn string(self) -> Result<String, WireError> {
        match self {
            Value::Bytes(b) => std::str::from_utf8(b).map(str::to_owned).map_err(|_| WireError::Utf8),
            _ => Err(WireError::Type(0)),
        }
    }

    /// A `bytes` field or embedded message.
    ///
    /// # Errors
    /// `Type` (as field 0) when the field is not length-delimited.
    pub fn bytes(self) -> Result<&'a [u8], WireError> {
        match self {
            Value::Bytes(b) => Ok(b),
            _ => Err(WireError::Type(0)),
        }
    }

    /// An `int64`, `int32` or `bool` field.
    ///
    /// # Errors
    /// `Type` (as field 0) when the field is not a varint.
    pub fn varint(self) -> Result<u64, WireError> {
        match self {
            Value::Varint(v) => Ok(v),
            _ => Err(WireError::Type(0)),
        }
    }
}

/// The fields of one message, in order.
pub struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> Fields<'a> {
    #[must_use]
    pub fn new(buf: &'a [u8]) -> Self {
        Fields { buf, pos: 0, failed: false }
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let start = self.pos;
        let mut v = 0u64;
        for i in 0..10 {
            let b = *self.buf.get(self.pos).ok_or(WireError::Truncated(self.pos))?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError::LongVarint(start))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len()).ok_or(WireError::Truncated(self.pos))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn field(&mut self) -> Result<(u64, Value<'a>), WireError> {
        let tag = self.varint()?;
        let (field, wire_type) = (tag >> 3, tag & 7);
        let value = match wire_type {
            0 => Value::Varint(self.varint()?),
            1 => Value::Fixed64(u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| WireError::Truncated(self.pos))?)),
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| WireError::Truncated(self.pos))?;
                Value::Bytes(self.take(len)?)
            }
            5 => Value::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| WireError::Truncated(self.pos))?)),
            _ => return Err(WireError::WireType { field, wire_type }),
        };
        Ok((field, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        let r = self.field();
        self.failed = r.is_err();
        Some(r)
    }
}

/// A `map<string, string>` entry (key 1, value 2) into `out`.
///
/// # Errors
/// As [`Fields`], or a key or value that is not a UTF-8 string.
pub fn string_entry(entry: &[u8], out: &mut Map<String, Json>) -> Result<(), WireError> {
    let (k, v) = entry_of(entry)?;
    out.insert(k, Json::String(v.map(|b| Value::Bytes(b).string()).transpose()?.unwrap_or_default()));
    Ok(())
}

/// A `map<string, bytes>` entry into `out`, the value base64-encoded as Kubernetes' JSON has it.
///
/// # Errors
/// As [`Fields`], or a key that is not a UTF-8 string.
pub fn bytes_entry(entry: &[u8], out: &mut Map<String, Json>) -> Result<(), WireError> {
    let (k, v) = entry_of(entry)?;
    out.insert(k, Json::String(base64::engine::general_purpose::STANDARD.encode(v.unwrap_or_default())));
    Ok(())
}

fn entry_of(entry: &[u8]) -> Result<(String, Option<&[u8]>), WireError> {
    let (mut key, mut value) = (String::new(), None);
    for f in Fields::new(entry) {
        match f? {
            (1, v) => key = v.string().map_err(|_| WireError::Type(1))?,
            (2, v) => value = Some(v.bytes().map_err(|_| WireError::Type(2))?),
            _ => {}
        }
    }
    Ok((key, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_and_junk_input_is_an_error_not_a_panic() {
        for junk in [&[0x0a, 0x05, b'a'][..], &[0xff; 12][..], &[0x0b][..], &[0x08][..], &[0x09, 1, 2][..]] {
            assert!(Fields::new(junk).any(|f| f.is_err()), "{junk:?}");
        }
        let ok: Vec<_> = Fields::new(&[0x08, 0x96, 0x01, 0x12, 0x01, b'x']).collect::<Result<_, _>>().unwrap_or_default();
        assert!(matches!(ok[..], [(1, Value::Varint(150)), (2, Value::Bytes(b"x"))]));
    }
}
