//! The traffic-matrix record a host publishes at `/vnet/O/matrix/<host-id>` ([`key_for_matrix`])
//! for `vnetctl suggest` and vnetd's overlay view. One type with its encoding and its decoding,
//! so that the writer (the agent) and the readers cannot drift apart.
//!
//! [`key_for_matrix`]: crate::key_for_matrix

use serde::{Deserialize, Serialize};
use vnet_core::MatrixEntry;
use vnet_wire::MacAddr;

use crate::schema::{encode, mac_text, HostId, SchemaError};

/// The most (VNI, source, destination) pairs a host publishes: its heaviest.
pub const MAX_MATRIX_PAIRS: usize = 512;

/// The value of `/vnet/O/matrix/<host-id>`:
/// `{"host_id":..,"pairs":[{"vni","src","dst","frames","bytes"},..]}`, counters cumulative
/// since the host's daemon started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixRecord {
    pub host_id: HostId,
    pub pairs: Vec<MatrixEntry>,
}

#[derive(Serialize)]
struct WireOut<'a> {
    host_id: &'a HostId,
    pairs: &'a [MatrixEntry],
}

#[derive(Deserialize)]
struct WireIn {
    host_id: HostId,
    /// Decoded one by one: a pair that does not decode is skipped, not the record.
    pairs: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct WirePair {
    vni: u32,
    #[serde(with = "mac_text")]
    src: MacAddr,
    #[serde(with = "mac_text")]
    dst: MacAddr,
    frames: u64,
    bytes: u64,
}

impl MatrixRecord {
    /// The record of `host`'s matrix: its heaviest [`MAX_MATRIX_PAIRS`] pairs, in (VNI,
    /// source, destination) order, so that an unchanged matrix encodes to the same bytes.
    pub fn heaviest(host_id: HostId, mut pairs: Vec<MatrixEntry>) -> MatrixRecord {
        pairs.sort_by_key(|p| std::cmp::Reverse(p.bytes));
        pairs.truncate(MAX_MATRIX_PAIRS);
        pairs.sort_by_key(|p| (p.vni, p.src.0, p.dst.0));
        MatrixRecord { host_id, pairs }
    }

    /// The value to put (compact JSON).
    pub fn encode(&self) -> Vec<u8> {
        encode(&WireOut {
            host_id: &self.host_id,
            pairs: &self.pairs,
        })
    }

    /// Decodes a value read from the store (untrusted): a value that is not such a record is
    /// an error; pairs that do not decode are skipped.
    pub fn decode(value: &[u8]) -> Result<MatrixRecord, SchemaError> {
        let w: WireIn = serde_json::from_slice(value).map_err(|e| {
            let mut msg = e.to_string();
            msg.truncate(200);
            SchemaError::BadValue(msg)
        })?;
        let pairs = w
            .pairs
            .into_iter()
            .filter_map(|v| serde_json::from_value::<WirePair>(v).ok())
            .map(|p| MatrixEntry {
                vni: p.vni,
                src: p.src,
                dst: p.dst,
                frames: p.frames,
                bytes: p.bytes,
            })
            .collect();
        Ok(MatrixRecord {
            host_id: w.host_id,
            pairs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }

    fn pair(vni: u32, src: u8, dst: u8, bytes: u64) -> MatrixEntry {
        MatrixEntry {
            vni,
            src: mac(src),
            dst: mac(dst),
            frames: bytes / 100,
            bytes,
        }
    }

    fn host(h: &str) -> HostId {
        h.parse().expect("host id")
    }

    #[test]
    fn a_record_survives_its_encoding() {
        let r = MatrixRecord::heaviest(
            host("a"),
            vec![
                pair(2, 1, 2, 300),
                pair(1, 3, 4, u64::MAX),
                pair(1, 1, 2, 0),
            ],
        );
        assert_eq!(MatrixRecord::decode(&r.encode()), Ok(r.clone()));
        let empty = MatrixRecord::heaviest(host("b"), vec![]);
        assert_eq!(MatrixRecord::decode(&empty.encode()), Ok(empty));
    }

    #[test]
    fn the_encoding_is_the_documented_one() {
        let r = MatrixRecord::heaviest(host("a"), vec![pair(1, 1, 2, 300)]);
        assert_eq!(
            String::from_utf8(r.encode()).unwrap(),
            r#"{"host_id":"a","pairs":[{"vni":1,"src":"52:54:00:00:00:01","dst":"52:54:00:00:00:02","frames":3,"bytes":300}]}"#
        );
    }

    #[test]
    fn the_heaviest_pairs_are_kept_in_key_order() {
        let pairs: Vec<MatrixEntry> = (0..MAX_MATRIX_PAIRS as u64 + 10)
            .map(|i| pair((i % 7) as u32, (i % 251) as u8, (i / 251) as u8, i))
            .collect();
        let r = MatrixRecord::heaviest(host("a"), pairs);
        assert_eq!(r.pairs.len(), MAX_MATRIX_PAIRS);
        // The 10 lightest (bytes 0..10) are the ones left out.
        assert!(r.pairs.iter().all(|p| p.bytes >= 10));
        let keys: Vec<_> = r.pairs.iter().map(|p| (p.vni, p.src.0, p.dst.0)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn bad_pairs_are_skipped_and_bad_records_refused() {
        let v = br#"{"host_id":"a","pairs":[{"vni":1,"src":"52:54:00:00:00:01","dst":"52:54:00:00:00:02","frames":3,"bytes":300},{"vni":"x"},{"vni":1,"src":"bad","dst":"52:54:00:00:00:02","frames":1,"bytes":1},{"vni":4294967296,"src":"52:54:00:00:00:01","dst":"52:54:00:00:00:02","frames":1,"bytes":1}]}"#;
        let m = MatrixRecord::decode(v).unwrap();
        assert_eq!(m.host_id, host("a"));
        assert_eq!(m.pairs, vec![pair(1, 1, 2, 300)]);
        for bad in [
            &b"[]"[..],
            b"not json",
            br#"{"pairs":[]}"#,
            br#"{"host_id":"no spaces","pairs":[]}"#,
            br#"{"host_id":"a"}"#,
        ] {
            assert!(MatrixRecord::decode(bad).is_err(), "{bad:?}");
        }
    }
}
