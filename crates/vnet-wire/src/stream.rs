//! The framing of a vnet TCP link.
//!
//! Each side first sends an 8-byte greeting: `b"VNET"`, version 1, and the link's 24-bit VNI.
//! Then every frame travels as a 4-byte big-endian length followed by that many bytes: a VXLAN
//! header and the Ethernet frame, so the same encapsulation code serves UDP and TCP links.

use crate::{WireError, ETHERNET_HEADER_LEN, MAX_FRAME_LEN, VNI_MAX, VXLAN_HEADER_LEN};

pub const STREAM_HELLO_LEN: usize = 8;
pub const STREAM_LEN_PREFIX: usize = 4;
const MAGIC: &[u8; 4] = b"VNET";
const VERSION: u8 = 1;
const MIN_RECORD: usize = VXLAN_HEADER_LEN + ETHERNET_HEADER_LEN;
const MAX_RECORD: usize = VXLAN_HEADER_LEN + MAX_FRAME_LEN;

/// The greeting at the start of a TCP link stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHello {
    pub vni: u32,
}

impl StreamHello {
    pub fn emit(&self) -> [u8; STREAM_HELLO_LEN] {
        let v = (self.vni & VNI_MAX).to_be_bytes();
        [
            MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], VERSION, v[1], v[2], v[3],
        ]
    }

    pub fn parse(b: &[u8]) -> Result<StreamHello, WireError> {
        if b.len() != STREAM_HELLO_LEN || &b[..4] != MAGIC || b[4] != VERSION {
            return Err(WireError::BadHello);
        }
        Ok(StreamHello {
            vni: u32::from_be_bytes([0, b[5], b[6], b[7]]),
        })
    }
}

/// The length prefix for a record of `len` bytes (VXLAN header + frame).
pub fn record_prefix(len: usize) -> [u8; STREAM_LEN_PREFIX] {
    (len as u32).to_be_bytes()
}

/// Splits a byte stream into records. Memory is bounded: it never holds more than one record
/// plus one read's worth of bytes, and a length outside [22, 8 + 65549] is an error that ends
/// the stream (a peer that lies about lengths cannot make it allocate more).
#[derive(Debug, Default)]
pub struct StreamDecoder {
    buf: Vec<u8>,
    start: usize,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the socket.
    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 64 * 1024 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next complete record, if any. The returned slice is valid until the next call.
    pub fn next_record(&mut self) -> Result<Option<&[u8]>, WireError> {
        Ok(self.next_range()?.map(|r| &self.buf[r]))
    }

    /// Like [`Self::next_record`], as a range of [`Self::buffer`]; ranges stay valid until the
    /// next `push`, so a reader can take every record of one read and forward them as a batch.
    pub fn next_range(&mut self) -> Result<Option<std::ops::Range<usize>>, WireError> {
        let avail = &self.buf[self.start..];
        if avail.len() < STREAM_LEN_PREFIX {
            return Ok(None);
        }
        let len = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]);
        if (len as usize) < MIN_RECORD || len as usize > MAX_RECORD {
            return Err(WireError::BadStreamLength(len));
        }
        let total = STREAM_LEN_PREFIX + len as usize;
        if avail.len() < total {
            return Ok(None);
        }
        let s = self.start + STREAM_LEN_PREFIX;
        self.start += total;
        Ok(Some(s..s + len as usize))
    }

    /// The bytes the ranges of [`Self::next_range`] index.
    pub fn buffer(&self) -> &[u8] {
        &self.buf
    }

    /// Bytes held that do not yet form a record.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

pub use record_prefix as stream_record_prefix;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(n: usize, fill: u8) -> Vec<u8> {
        let mut v = record_prefix(n).to_vec();
        v.extend(std::iter::repeat_n(fill, n));
        v
    }

    #[test]
    fn hello_roundtrip() {
        let h = StreamHello { vni: 77 };
        assert_eq!(StreamHello::parse(&h.emit()).unwrap(), h);
        assert!(StreamHello::parse(b"HTTP/1.1").is_err());
        assert!(StreamHello::parse(b"VNET").is_err());
    }

    #[test]
    fn splits_records_across_pushes() {
        let mut bytes = record(30, 1);
        bytes.extend(record(40, 2));
        let mut d = StreamDecoder::new();
        let mut got = vec![];
        for chunk in bytes.chunks(7) {
            d.push(chunk);
            while let Some(r) = d.next_record().unwrap() {
                got.push(r.to_vec());
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], vec![1; 30]);
        assert_eq!(got[1], vec![2; 40]);
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn refuses_bad_lengths() {
        let mut d = StreamDecoder::new();
        d.push(&[0, 0, 0, 5]);
        assert_eq!(d.next_record().unwrap_err(), WireError::BadStreamLength(5));
        let mut d = StreamDecoder::new();
        d.push(&u32::MAX.to_be_bytes());
        assert!(d.next_record().is_err());
    }

    proptest! {
        #[test]
        fn never_panics_and_stays_bounded(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..20)) {
            let mut d = StreamDecoder::new();
            for c in chunks {
                d.push(&c);
                loop {
                    match d.next_record() {
                        Ok(Some(r)) => prop_assert!(r.len() >= MIN_RECORD),
                        Ok(None) => break,
                        Err(_) => return Ok(()),
                    }
                }
                prop_assert!(d.pending() <= MAX_RECORD + STREAM_LEN_PREFIX + 200);
            }
        }
    }
}
