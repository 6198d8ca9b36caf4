//! vnet-etcd's types and their conversion to and from the protobuf messages of etcd's gRPC API
//! ([`crate::pb`]). Pure: no I/O.
//!
//! Every answer is treated as untrusted input: a message that does not make sense (an event
//! without its key, a lease granted with id 0) is an error, never a panic. protobuf leaves
//! fields at their default value out, so an absent header is revision 0 and an event without
//! a type is a PUT, as etcd means them.

use crate::pb;

/// Why an answer could not be understood, or what error the server reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("answer has a bad field {0}")]
    Field(&'static str),
    /// The server's gRPC status (`code` is gRPC's status code) or, with code -1, an error
    /// the answer carries in a field of its own.
    #[error("etcd error (code {code}): {message}")]
    Server { code: i64, message: String },
}

/// gRPC's status code for an expired or unknown auth token (and a failed authentication).
pub const CODE_UNAUTHENTICATED: i64 = 16;
/// gRPC's status code etcd uses for "permission denied" and, with auth on, for a bad token.
pub const CODE_INVALID_ARGUMENT: i64 = 3;

/// The end of the key range that holds every key starting with `prefix` (etcd's rule: the
/// prefix with its last byte below 0xff incremented, the rest dropped; `\0` for "to the end").
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// One stored key with its value and metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

/// The answer to a range request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeResponse {
    /// The store's revision when the range was read.
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    pub count: i64,
    /// The size of the answer as etcd sent it (its protobuf encoding; of a read in pages, of
    /// every page answered, a first page asked again included).
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventKind,
    pub kv: KeyValue,
}

/// One message of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMessage {
    /// The watch exists; events follow from the requested revision.
    Created { watch_id: i64, revision: i64 },
    /// Changes, in revision order; `revision` is the store's revision at the time.
    Events {
        revision: i64,
        events: Vec<WatchEvent>,
    },
    /// The server ended the watch (for example, the start revision was compacted away:
    /// `compact_revision` is then the oldest one still there). Re-read and watch again.
    Canceled {
        compact_revision: i64,
        reason: String,
    },
    /// No events, only the revision (a progress notification).
    Progress { revision: i64 },
}

/// What a comparison of a transaction looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    /// The value equals these bytes.
    Value(Vec<u8>),
    /// The key's version (0: the key does not exist).
    Version(i64),
    /// The key's modification revision.
    ModRevision(i64),
    /// The lease the key is attached to (0: none).
    Lease(i64),
}

/// One condition of a transaction: `key`'s target equals the given one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: Vec<u8>,
    pub target: CompareTarget,
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: i64,
    },
    Delete {
        key: Vec<u8>,
        range_end: Option<Vec<u8>>,
    },
}

// ---- requests ----

/// A range of keys from `key` up to `range_end` (or `key` alone): at most `limit` keys (0: no
/// limit), read at `revision` (0: the current one), so that the pages of one read are one
/// consistent snapshot. `serializable`: whatever the member holds, without asking the leader
/// whether it is current (and what etcd's gRPC proxy answers from its cache; see
/// [`crate::Client::snapshot_paged`]).
pub(crate) fn range_request(
    key: &[u8],
    range_end: Option<&[u8]>,
    limit: i64,
    revision: i64,
    serializable: bool,
) -> pb::RangeRequest {
    pb::RangeRequest {
        key: key.to_vec(),
        range_end: range_end.map(<[u8]>::to_vec).unwrap_or_default(),
        limit: limit.max(0),
        revision: revision.max(0),
        serializable,
        ..Default::default()
    }
}

/// How many keys there are from `key` up to `range_end`, linearizable: etcd counts them in its
/// index and reads no value.
pub(crate) fn count_request(key: &[u8], range_end: Option<&[u8]>) -> pb::RangeRequest {
    pb::RangeRequest {
        count_only: true,
        ..range_request(key, range_end, 0, 0, false)
    }
}

pub(crate) fn put_request(key: &[u8], value: &[u8], lease: i64) -> pb::PutRequest {
    pb::PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        lease,
        ..Default::default()
    }
}

pub(crate) fn delete_request(key: &[u8], range_end: Option<&[u8]>) -> pb::DeleteRangeRequest {
    pb::DeleteRangeRequest {
        key: key.to_vec(),
        range_end: range_end.map(<[u8]>::to_vec).unwrap_or_default(),
        prev_kv: false,
    }
}

fn compare(c: &Compare) -> pb::Compare {
    use pb::compare::{CompareResult, CompareTarget as T, TargetUnion as U};
    let (target, union) = match &c.target {
        CompareTarget::Value(v) => (T::Value, U::Value(v.clone())),
        CompareTarget::Version(v) => (T::Version, U::Version(*v)),
        CompareTarget::ModRevision(v) => (T::Mod, U::ModRevision(*v)),
        CompareTarget::Lease(v) => (T::Lease, U::Lease(*v)),
    };
    pb::Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key: c.key.clone(),
        target_union: Some(union),
        range_end: Vec::new(),
    }
}

fn request_op(op: &TxnOp) -> pb::RequestOp {
    use pb::request_op::Request;
    let request = match op {
        TxnOp::Put { key, value, lease } => Request::RequestPut(put_request(key, value, *lease)),
        TxnOp::Delete { key, range_end } => {
            Request::RequestDeleteRange(delete_request(key, range_end.as_deref()))
        }
    };
    pb::RequestOp {
        request: Some(request),
    }
}

pub(crate) fn txn_request(
    compares: &[Compare],
    success: &[TxnOp],
    failure: &[TxnOp],
) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: compares.iter().map(compare).collect(),
        success: success.iter().map(request_op).collect(),
        failure: failure.iter().map(request_op).collect(),
    }
}

/// One create request of a watch stream.
pub(crate) fn watch_create_request(
    key: &[u8],
    range_end: Option<&[u8]>,
    start_revision: i64,
) -> pb::WatchRequest {
    pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: key.to_vec(),
                range_end: range_end.map(<[u8]>::to_vec).unwrap_or_default(),
                start_revision: start_revision.max(0),
                ..Default::default()
            },
        )),
    }
}

// ---- answers ----

fn header_revision(h: Option<&pb::ResponseHeader>) -> i64 {
    h.map_or(0, |h| h.revision)
}

fn key_value(kv: pb::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key,
        value: kv.value,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
    }
}

pub(crate) fn range_response(r: pb::RangeResponse) -> RangeResponse {
    use prost::Message as _;
    RangeResponse {
        bytes: r.encoded_len() as u64,
        revision: header_revision(r.header.as_ref()),
        kvs: r.kvs.into_iter().map(key_value).collect(),
        more: r.more,
        count: r.count,
    }
}

/// A granted lease: its id and TTL in seconds.
pub(crate) fn lease_grant(r: &pb::LeaseGrantResponse) -> Result<(i64, i64), CodecError> {
    if !r.error.is_empty() {
        return Err(CodecError::Server {
            code: -1,
            message: r.error.clone(),
        });
    }
    if r.id == 0 {
        return Err(CodecError::Field("ID"));
    }
    Ok((r.id, r.ttl))
}

/// The token of an authentication: it goes into a metadata header, so it must be one line of
/// visible ASCII.
pub(crate) fn token(r: &pb::AuthenticateResponse) -> Result<String, CodecError> {
    let t = &r.token;
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CodecError::Field("token"));
    }
    Ok(t.clone())
}

pub(crate) fn watch_message(r: pb::WatchResponse) -> Result<WatchMessage, CodecError> {
    let revision = header_revision(r.header.as_ref());
    if r.canceled {
        return Ok(WatchMessage::Canceled {
            compact_revision: r.compact_revision,
            reason: r.cancel_reason,
        });
    }
    if r.created {
        return Ok(WatchMessage::Created {
            watch_id: r.watch_id,
            revision,
        });
    }
    if r.events.is_empty() {
        return Ok(WatchMessage::Progress { revision });
    }
    let mut events = Vec::with_capacity(r.events.len());
    for e in r.events {
        let kind = match pb::event::EventType::try_from(e.r#type) {
            Ok(pb::event::EventType::Put) => EventKind::Put,
            Ok(pb::event::EventType::Delete) => EventKind::Delete,
            Err(_) => return Err(CodecError::Field("type")),
        };
        let kv = e.kv.ok_or(CodecError::Field("kv"))?;
        events.push(WatchEvent {
            kind,
            kv: key_value(kv),
        });
    }
    Ok(WatchMessage::Events { revision, events })
}

/// Whether an error the server reported means "authenticate again": an expired or unknown
/// token (etcd 3.4 says invalid auth token with Unauthenticated, older ones InvalidArgument).
pub fn token_refused(code: i64, message: &str) -> bool {
    code == CODE_UNAUTHENTICATED || (code == CODE_INVALID_ARGUMENT && message.contains("token"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/vnet/a/"), b"/vnet/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn requests() {
        let r = range_request(b"/a", Some(b"/b"), 500, 42, true);
        assert_eq!((&r.key[..], &r.range_end[..]), (&b"/a"[..], &b"/b"[..]));
        assert_eq!((r.limit, r.revision, r.serializable), (500, 42, true));
        let r = range_request(b"/a", None, -1, -1, false);
        assert!(r.range_end.is_empty());
        assert_eq!((r.limit, r.revision, r.serializable), (0, 0, false));
        // A count asks the leader (linearizable) and for no key or value.
        let c = count_request(b"/a", Some(b"/b"));
        assert!(c.count_only && !c.serializable && !c.keys_only);
        assert_eq!((c.limit, c.revision, &c.range_end[..]), (0, 0, &b"/b"[..]));
        let p = put_request(b"k", b"v", 7);
        assert_eq!((p.key, p.value, p.lease), (b"k".to_vec(), b"v".to_vec(), 7));
        let t = txn_request(
            &[Compare {
                key: b"k".to_vec(),
                target: CompareTarget::Version(0),
            }],
            &[TxnOp::Put {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                lease: 0,
            }],
            &[TxnOp::Delete {
                key: b"k".to_vec(),
                range_end: Some(b"l".to_vec()),
            }],
        );
        assert_eq!(
            t.compare[0].target,
            pb::compare::CompareTarget::Version as i32
        );
        assert_eq!(
            t.compare[0].target_union,
            Some(pb::compare::TargetUnion::Version(0))
        );
        assert_eq!(
            t.compare[0].result,
            pb::compare::CompareResult::Equal as i32
        );
        assert!(matches!(
            &t.success[0].request,
            Some(pb::request_op::Request::RequestPut(p)) if p.key == b"k" && p.value == b"v"
        ));
        assert!(matches!(
            &t.failure[0].request,
            Some(pb::request_op::Request::RequestDeleteRange(d)) if d.range_end == b"l"
        ));
        for (target, want) in [
            (
                CompareTarget::Value(b"x".to_vec()),
                pb::compare::CompareTarget::Value,
            ),
            (
                CompareTarget::ModRevision(3),
                pb::compare::CompareTarget::Mod,
            ),
            (CompareTarget::Lease(9), pb::compare::CompareTarget::Lease),
        ] {
            let c = compare(&Compare {
                key: b"k".to_vec(),
                target,
            });
            assert_eq!(c.target, want as i32);
        }
        let w = watch_create_request(b"k", None, 5);
        let Some(pb::watch_request::RequestUnion::CreateRequest(c)) = w.request_union else {
            panic!("not a create request");
        };
        assert_eq!((c.key, c.start_revision), (b"k".to_vec(), 5));
    }

    #[test]
    fn answers() {
        let wire = pb::RangeResponse {
            header: Some(pb::ResponseHeader {
                revision: 12,
                ..Default::default()
            }),
            kvs: vec![pb::KeyValue {
                key: b"/a".to_vec(),
                value: b"x".to_vec(),
                create_revision: 3,
                mod_revision: 12,
                version: 2,
                lease: 99,
            }],
            more: true,
            count: 1,
        };
        let sent = wire.encode_to_vec().len() as u64;
        let r = range_response(wire);
        assert_eq!((r.revision, r.count, r.more), (12, 1, true));
        assert_eq!(r.kvs[0].key, b"/a");
        // The size of the answer as it came: header (4) + key-value (2 + 15) + more + count.
        assert_eq!(r.bytes, 4 + 17 + 2 + 2);
        assert_eq!(r.bytes, sent);
        assert_eq!((r.kvs[0].lease, r.kvs[0].version), (99, 2));
        // No header: revision 0 (protobuf's default), not an error.
        assert_eq!(range_response(pb::RangeResponse::default()).revision, 0);

        let grant = |id, ttl, error: &str| pb::LeaseGrantResponse {
            header: None,
            id,
            ttl,
            error: error.into(),
        };
        assert_eq!(lease_grant(&grant(7587, 5, "")), Ok((7587, 5)));
        assert_eq!(lease_grant(&grant(0, 5, "")), Err(CodecError::Field("ID")));
        assert!(matches!(
            lease_grant(&grant(7, 5, "lease exists")),
            Err(CodecError::Server { code: -1, .. })
        ));
        let auth = |t: &str| pb::AuthenticateResponse {
            header: None,
            token: t.into(),
        };
        assert_eq!(token(&auth("abc.1")), Ok("abc.1".into()));
        assert!(token(&auth("")).is_err());
        assert!(token(&auth("a\nb")).is_err());
        assert!(token_refused(16, "etcdserver: invalid auth token"));
        assert!(token_refused(3, "etcdserver: invalid auth token"));
        assert!(!token_refused(3, "etcdserver: permission denied"));
    }

    #[test]
    fn watch_messages() {
        let header = |revision| {
            Some(pb::ResponseHeader {
                revision,
                ..Default::default()
            })
        };
        let created = pb::WatchResponse {
            header: header(4),
            created: true,
            ..Default::default()
        };
        assert_eq!(
            watch_message(created),
            Ok(WatchMessage::Created {
                watch_id: 0,
                revision: 4
            })
        );
        let kv = |k: &[u8], v: &[u8]| {
            Some(pb::KeyValue {
                key: k.to_vec(),
                value: v.to_vec(),
                ..Default::default()
            })
        };
        let m = watch_message(pb::WatchResponse {
            header: header(6),
            events: vec![
                pb::Event {
                    r#type: 0,
                    kv: kv(b"a", b"b"),
                    prev_kv: None,
                },
                pb::Event {
                    r#type: 1,
                    kv: kv(b"a", b""),
                    prev_kv: None,
                },
            ],
            ..Default::default()
        })
        .unwrap();
        let WatchMessage::Events { revision, events } = m else {
            panic!("not events: {m:?}");
        };
        assert_eq!(revision, 6);
        assert_eq!(
            (events[0].kind, &events[0].kv.value[..]),
            (EventKind::Put, &b"b"[..])
        );
        assert_eq!(events[1].kind, EventKind::Delete);
        assert_eq!(
            watch_message(pb::WatchResponse {
                canceled: true,
                created: true,
                compact_revision: 9,
                cancel_reason: "compacted".into(),
                ..Default::default()
            }),
            Ok(WatchMessage::Canceled {
                compact_revision: 9,
                reason: "compacted".into()
            })
        );
        assert_eq!(
            watch_message(pb::WatchResponse {
                header: header(8),
                ..Default::default()
            }),
            Ok(WatchMessage::Progress { revision: 8 })
        );
        let bad_type = pb::WatchResponse {
            events: vec![pb::Event {
                r#type: 7,
                kv: kv(b"a", b""),
                prev_kv: None,
            }],
            ..Default::default()
        };
        assert_eq!(watch_message(bad_type), Err(CodecError::Field("type")));
        let no_kv = pb::WatchResponse {
            events: vec![pb::Event::default()],
            ..Default::default()
        };
        assert_eq!(watch_message(no_kv), Err(CodecError::Field("kv")));
    }

    proptest! {
        /// Whatever bytes arrive as a message: decoding fails or gives something the
        /// conversions take without a panic.
        #[test]
        fn bad_input_is_an_error_not_a_panic(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(m) = pb::WatchResponse::decode(body.as_slice()) {
                let _ = watch_message(m);
            }
            if let Ok(m) = pb::RangeResponse::decode(body.as_slice()) {
                let _ = range_response(m);
            }
            if let Ok(m) = pb::LeaseGrantResponse::decode(body.as_slice()) {
                let _ = lease_grant(&m);
            }
            if let Ok(m) = pb::AuthenticateResponse::decode(body.as_slice()) {
                let _ = token(&m);
            }
        }

        #[test]
        fn keys_round_trip(key in proptest::collection::vec(any::<u8>(), 0..64), value in proptest::collection::vec(any::<u8>(), 0..64)) {
            let wire = pb::RangeResponse {
                kvs: vec![pb::KeyValue { key: key.clone(), value: value.clone(), ..Default::default() }],
                ..Default::default()
            }.encode_to_vec();
            let r = range_response(pb::RangeResponse::decode(wire.as_slice()).unwrap());
            prop_assert_eq!(&r.kvs[0].key, &key);
            prop_assert_eq!(&r.kvs[0].value, &value);
        }
    }
}
