//! The JSON of etcd's v3 gateway: request bodies and the decoding of answers. Pure: no I/O.
//!
//! The gateway speaks the protobuf messages of etcd's gRPC API in their canonical JSON form:
//! `bytes` fields (keys, values) are base64, 64-bit integers are usually decimal strings (but
//! numbers are accepted too), and fields at their default value are left out (so an event
//! without `type` is a PUT, a lease answer without `TTL` has TTL 0). Every answer is treated
//! as untrusted input: a malformed one is an error, never a panic.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Map, Value};

/// Why an answer could not be understood, or what error the server reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("answer is not JSON: {0}")]
    Json(String),
    #[error("answer has a bad field {0}")]
    Field(&'static str),
    #[error("answer has bad base64 in {0}")]
    Base64(&'static str),
    #[error("etcd error (code {code}): {message}")]
    Server { code: i64, message: String },
}

/// gRPC's status code for an expired or unknown auth token (and a failed authentication).
pub const CODE_UNAUTHENTICATED: i64 = 16;
/// gRPC's status code etcd uses for "permission denied" and, with auth on, for a bad token.
pub const CODE_INVALID_ARGUMENT: i64 = 3;

pub fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

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

pub fn range_request(key: &[u8], range_end: Option<&[u8]>) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), b64(key).into());
    if let Some(end) = range_end {
        m.insert("range_end".into(), b64(end).into());
    }
    Value::Object(m)
}

/// One page of a range: at most `limit` keys (0: no limit), read at `revision` (0: the
/// current one), so that the pages of one read are one consistent snapshot.
pub fn range_page_request(key: &[u8], range_end: &[u8], limit: i64, revision: i64) -> Value {
    let mut v = range_request(key, Some(range_end));
    if let Value::Object(m) = &mut v {
        if limit > 0 {
            m.insert("limit".into(), limit.to_string().into());
        }
        if revision > 0 {
            m.insert("revision".into(), revision.to_string().into());
        }
    }
    v
}

pub fn put_request(key: &[u8], value: &[u8], lease: i64) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), b64(key).into());
    m.insert("value".into(), b64(value).into());
    if lease != 0 {
        m.insert("lease".into(), lease.to_string().into());
    }
    Value::Object(m)
}

pub fn delete_request(key: &[u8], range_end: Option<&[u8]>) -> Value {
    range_request(key, range_end)
}

fn compare_json(c: &Compare) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), b64(&c.key).into());
    m.insert("result".into(), "EQUAL".into());
    match &c.target {
        CompareTarget::Value(v) => {
            m.insert("target".into(), "VALUE".into());
            m.insert("value".into(), b64(v).into());
        }
        CompareTarget::Version(v) => {
            m.insert("target".into(), "VERSION".into());
            m.insert("version".into(), v.to_string().into());
        }
        CompareTarget::ModRevision(v) => {
            m.insert("target".into(), "MOD".into());
            m.insert("mod_revision".into(), v.to_string().into());
        }
        CompareTarget::Lease(v) => {
            m.insert("target".into(), "LEASE".into());
            m.insert("lease".into(), v.to_string().into());
        }
    }
    Value::Object(m)
}

fn op_json(op: &TxnOp) -> Value {
    match op {
        TxnOp::Put { key, value, lease } => json!({"request_put": put_request(key, value, *lease)}),
        TxnOp::Delete { key, range_end } => {
            json!({"request_delete_range": delete_request(key, range_end.as_deref())})
        }
    }
}

pub fn txn_request(compare: &[Compare], success: &[TxnOp], failure: &[TxnOp]) -> Value {
    json!({
        "compare": compare.iter().map(compare_json).collect::<Vec<_>>(),
        "success": success.iter().map(op_json).collect::<Vec<_>>(),
        "failure": failure.iter().map(op_json).collect::<Vec<_>>(),
    })
}

pub fn lease_grant_request(ttl_secs: i64) -> Value {
    json!({"TTL": ttl_secs.to_string(), "ID": "0"})
}

pub fn lease_id_request(id: i64) -> Value {
    json!({"ID": id.to_string()})
}

pub fn authenticate_request(name: &str, password: &str) -> Value {
    json!({"name": name, "password": password})
}

pub fn watch_create_request(key: &[u8], range_end: Option<&[u8]>, start_revision: i64) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), b64(key).into());
    if let Some(end) = range_end {
        m.insert("range_end".into(), b64(end).into());
    }
    if start_revision > 0 {
        m.insert("start_revision".into(), start_revision.to_string().into());
    }
    json!({ "create_request": Value::Object(m) })
}

// ---- decoding ----

/// Parses the first JSON value of `body`. What follows it is ignored: the gateway's error
/// answers may be followed by gRPC trailers rendered as text.
pub fn parse_json(body: &[u8]) -> Result<Value, CodecError> {
    let v: Value = serde_json::Deserializer::from_slice(body)
        .into_iter::<Value>()
        .next()
        .ok_or_else(|| CodecError::Json("empty answer".into()))?
        .map_err(|e| CodecError::Json(e.to_string()))?;
    if !v.is_object() {
        return Err(CodecError::Json("not an object".into()));
    }
    Ok(v)
}

/// A 64-bit integer field: a decimal string or a number; absent means 0 (proto3 default).
fn int_field(v: &Value, name: &'static str) -> Result<i64, CodecError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n.as_i64().ok_or(CodecError::Field(name)),
        Some(Value::String(s)) => s.parse().map_err(|_| CodecError::Field(name)),
        Some(_) => Err(CodecError::Field(name)),
    }
}

fn bool_field(v: &Value, name: &'static str) -> Result<bool, CodecError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(CodecError::Field(name)),
    }
}

fn bytes_field(v: &Value, name: &'static str) -> Result<Vec<u8>, CodecError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => B64.decode(s).map_err(|_| CodecError::Base64(name)),
        Some(_) => Err(CodecError::Field(name)),
    }
}

fn str_field<'a>(v: &'a Value, name: &'static str) -> Result<&'a str, CodecError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(CodecError::Field(name)),
    }
}

fn array_field<'a>(v: &'a Value, name: &'static str) -> Result<&'a [Value], CodecError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(CodecError::Field(name)),
    }
}

fn header_revision(v: &Value) -> Result<i64, CodecError> {
    match v.get("header") {
        None | Some(Value::Null) => Ok(0),
        Some(h @ Value::Object(_)) => int_field(h, "revision"),
        Some(_) => Err(CodecError::Field("header")),
    }
}

/// The error a gateway answer reports, if it is one: `{"error":..,"code":N,"message":..}` for
/// unary calls, `{"error":{"grpc_code":N,"message":..}}` inside streams.
pub fn server_error(v: &Value) -> Option<CodecError> {
    let e = v.get("error")?;
    if let Some(obj) = e.as_object() {
        let code = obj
            .get("grpc_code")
            .or(obj.get("code"))
            .and_then(Value::as_i64)
            .unwrap_or(-1);
        let message = obj
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        return Some(CodecError::Server { code, message });
    }
    let code = v.get("code").and_then(Value::as_i64).unwrap_or(-1);
    let message = v
        .get("message")
        .and_then(Value::as_str)
        .or(e.as_str())
        .unwrap_or("")
        .to_string();
    Some(CodecError::Server { code, message })
}

/// Parses a unary answer and turns a reported error into `Err`.
pub fn parse_answer(body: &[u8]) -> Result<Value, CodecError> {
    let v = parse_json(body)?;
    match server_error(&v) {
        Some(e) => Err(e),
        None => Ok(v),
    }
}

fn parse_kv(v: &Value) -> Result<KeyValue, CodecError> {
    if !v.is_object() {
        return Err(CodecError::Field("kv"));
    }
    Ok(KeyValue {
        key: bytes_field(v, "key")?,
        value: bytes_field(v, "value")?,
        create_revision: int_field(v, "create_revision")?,
        mod_revision: int_field(v, "mod_revision")?,
        version: int_field(v, "version")?,
        lease: int_field(v, "lease")?,
    })
}

pub fn parse_range(body: &[u8]) -> Result<RangeResponse, CodecError> {
    let v = parse_answer(body)?;
    Ok(RangeResponse {
        revision: header_revision(&v)?,
        kvs: array_field(&v, "kvs")?
            .iter()
            .map(parse_kv)
            .collect::<Result<_, _>>()?,
        more: bool_field(&v, "more")?,
        count: int_field(&v, "count")?,
    })
}

/// The revision after a put or delete.
pub fn parse_revision(body: &[u8]) -> Result<i64, CodecError> {
    header_revision(&parse_answer(body)?)
}

/// Whether a transaction's comparisons held (its success branch ran).
pub fn parse_txn(body: &[u8]) -> Result<bool, CodecError> {
    bool_field(&parse_answer(body)?, "succeeded")
}

/// A granted lease: its id and TTL in seconds.
pub fn parse_lease_grant(body: &[u8]) -> Result<(i64, i64), CodecError> {
    let v = parse_answer(body)?;
    if let Some(e) = v
        .get("error")
        .and_then(Value::as_str)
        .filter(|e| !e.is_empty())
    {
        return Err(CodecError::Server {
            code: -1,
            message: e.to_string(),
        });
    }
    let id = int_field(&v, "ID")?;
    if id == 0 {
        return Err(CodecError::Field("ID"));
    }
    Ok((id, int_field(&v, "TTL")?))
}

/// The remaining TTL after a keep-alive (streamed as `{"result":{...}}`); 0 or less means the
/// lease is gone.
pub fn parse_lease_keepalive(body: &[u8]) -> Result<i64, CodecError> {
    let v = parse_answer(body)?;
    let inner = match v.get("result") {
        Some(r @ Value::Object(_)) => r,
        Some(_) => return Err(CodecError::Field("result")),
        None => &v,
    };
    int_field(inner, "TTL")
}

pub fn parse_token(body: &[u8]) -> Result<String, CodecError> {
    let v = parse_answer(body)?;
    let t = str_field(&v, "token")?;
    if t.is_empty() || t.contains(['\r', '\n']) {
        return Err(CodecError::Field("token"));
    }
    Ok(t.to_string())
}

/// One line of a watch stream: `{"result":{...}}` or `{"error":{...}}`.
pub fn parse_watch_message(line: &[u8]) -> Result<WatchMessage, CodecError> {
    let v = parse_json(line)?;
    if let Some(e) = server_error(&v) {
        return Err(e);
    }
    let r = match v.get("result") {
        Some(r @ Value::Object(_)) => r,
        _ => return Err(CodecError::Field("result")),
    };
    let revision = header_revision(r)?;
    if bool_field(r, "canceled")? {
        return Ok(WatchMessage::Canceled {
            compact_revision: int_field(r, "compact_revision")?,
            reason: str_field(r, "cancel_reason")?.to_string(),
        });
    }
    if bool_field(r, "created")? {
        return Ok(WatchMessage::Created {
            watch_id: int_field(r, "watch_id")?,
            revision,
        });
    }
    let raw = array_field(r, "events")?;
    if raw.is_empty() {
        return Ok(WatchMessage::Progress { revision });
    }
    let mut events = Vec::with_capacity(raw.len());
    for e in raw {
        if !e.is_object() {
            return Err(CodecError::Field("events"));
        }
        let kind = match e.get("type") {
            None | Some(Value::Null) => EventKind::Put,
            Some(Value::String(s)) if s == "PUT" => EventKind::Put,
            Some(Value::String(s)) if s == "DELETE" => EventKind::Delete,
            Some(Value::Number(n)) if n.as_i64() == Some(0) => EventKind::Put,
            Some(Value::Number(n)) if n.as_i64() == Some(1) => EventKind::Delete,
            Some(_) => return Err(CodecError::Field("type")),
        };
        let kv = match e.get("kv") {
            Some(kv) => parse_kv(kv)?,
            None => return Err(CodecError::Field("kv")),
        };
        events.push(WatchEvent { kind, kv });
    }
    Ok(WatchMessage::Events { revision, events })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/vnet/a/"), b"/vnet/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn requests() {
        assert_eq!(
            range_request(b"/a", Some(b"/b")),
            json!({"key": "L2E=", "range_end": "L2I="})
        );
        assert_eq!(
            range_page_request(b"/a", b"/b", 500, 42),
            json!({"key": "L2E=", "range_end": "L2I=", "limit": "500", "revision": "42"})
        );
        assert_eq!(
            range_page_request(b"/a", b"/b", 0, 0),
            json!({"key": "L2E=", "range_end": "L2I="})
        );
        assert_eq!(
            put_request(b"k", b"v", 7),
            json!({"key": "aw==", "value": "dg==", "lease": "7"})
        );
        assert_eq!(
            put_request(b"k", b"", 0),
            json!({"key": "aw==", "value": ""})
        );
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
            &[],
        );
        assert_eq!(t["compare"][0]["target"], "VERSION");
        assert_eq!(t["compare"][0]["version"], "0");
        assert_eq!(t["success"][0]["request_put"]["key"], "aw==");
        assert_eq!(t["failure"], json!([]));
        assert_eq!(
            watch_create_request(b"k", None, 5),
            json!({"create_request": {"key": "aw==", "start_revision": "5"}})
        );
        assert_eq!(lease_id_request(-3), json!({"ID": "-3"}));
    }

    #[test]
    fn range_answers() {
        let body = br#"{"header":{"cluster_id":"1","revision":"12"},"kvs":[{"key":"L2E=","create_revision":"3","mod_revision":"12","version":"2","value":"eA==","lease":"99"}],"count":"1"}"#;
        let r = parse_range(body).unwrap();
        assert_eq!(r.revision, 12);
        assert_eq!(r.count, 1);
        assert_eq!(r.kvs.len(), 1);
        assert_eq!(r.kvs[0].key, b"/a");
        assert_eq!(r.kvs[0].value, b"x");
        assert_eq!(r.kvs[0].lease, 99);
        assert_eq!(r.kvs[0].version, 2);
        // No keys: the gateway leaves kvs out.
        let r = parse_range(br#"{"header":{"revision":5}}"#).unwrap();
        assert!(r.kvs.is_empty());
        assert_eq!(r.revision, 5);
    }

    #[test]
    fn errors_and_leases() {
        let e = parse_range(br#"{"error":"etcdserver: user name is empty","code":3,"message":"etcdserver: user name is empty"}"#);
        assert_eq!(
            e,
            Err(CodecError::Server {
                code: 3,
                message: "etcdserver: user name is empty".into()
            })
        );
        assert_eq!(
            parse_lease_grant(br#"{"header":{},"ID":"7587","TTL":"5"}"#),
            Ok((7587, 5))
        );
        assert!(parse_lease_grant(br#"{"header":{},"TTL":"5"}"#).is_err());
        assert_eq!(
            parse_lease_keepalive(br#"{"result":{"header":{},"ID":"7587","TTL":"5"}}"#),
            Ok(5)
        );
        assert_eq!(
            parse_lease_keepalive(br#"{"result":{"header":{},"ID":"7587"}}"#),
            Ok(0)
        );
        assert_eq!(parse_txn(br#"{"header":{},"succeeded":true}"#), Ok(true));
        assert_eq!(parse_txn(br#"{"header":{}}"#), Ok(false));
        assert_eq!(
            parse_token(br#"{"header":{},"token":"abc.1"}"#),
            Ok("abc.1".into())
        );
        assert!(parse_token(br#"{"header":{}}"#).is_err());
        assert!(parse_range(b"[1]").is_err());
        assert!(parse_range(b"").is_err());
        // An error answer followed by trailers rendered as text.
        assert!(matches!(
            parse_token(br#"{"error":"etcdserver: authentication failed, invalid user ID or password","message":"etcdserver: authentication failed, invalid user ID or password","code":3}Grpc-Trailer-Content-Type: application/grpc"#),
            Err(CodecError::Server { code: 3, .. })
        ));
        assert!(parse_range(br#"{"kvs":[{"key":"!!"}]}"#).is_err());
        assert!(parse_range(br#"{"header":{"revision":"x"}}"#).is_err());
    }

    #[test]
    fn watch_messages() {
        assert_eq!(
            parse_watch_message(br#"{"result":{"header":{"revision":"4"},"created":true}}"#),
            Ok(WatchMessage::Created {
                watch_id: 0,
                revision: 4
            })
        );
        let m = parse_watch_message(br#"{"result":{"header":{"revision":"6"},"events":[{"kv":{"key":"YQ==","value":"Yg==","mod_revision":"5"}},{"type":"DELETE","kv":{"key":"YQ==","mod_revision":"6"}}]}}"#).unwrap();
        let WatchMessage::Events { revision, events } = m else {
            panic!("not events: {m:?}");
        };
        assert_eq!(revision, 6);
        assert_eq!(events[0].kind, EventKind::Put);
        assert_eq!(events[0].kv.value, b"b");
        assert_eq!(events[1].kind, EventKind::Delete);
        assert_eq!(
            parse_watch_message(br#"{"result":{"header":{},"canceled":true,"compact_revision":"9","cancel_reason":"compacted"}}"#),
            Ok(WatchMessage::Canceled {
                compact_revision: 9,
                reason: "compacted".into()
            })
        );
        assert!(matches!(
            parse_watch_message(
                br#"{"error":{"grpc_code":14,"http_code":503,"message":"unavailable"}}"#
            ),
            Err(CodecError::Server { code: 14, .. })
        ));
        assert!(
            parse_watch_message(br#"{"result":{"events":[{"type":"BOOM","kv":{}}]}}"#).is_err()
        );
        assert!(parse_watch_message(br#"{"result":{"events":[{"type":"PUT"}]}}"#).is_err());
    }

    proptest! {
        #[test]
        fn bad_input_is_an_error_not_a_panic(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_range(&body);
            let _ = parse_txn(&body);
            let _ = parse_lease_grant(&body);
            let _ = parse_lease_keepalive(&body);
            let _ = parse_token(&body);
            let _ = parse_watch_message(&body);
            let _ = parse_revision(&body);
        }

        #[test]
        fn json_shaped_garbage_is_an_error_not_a_panic(
            rev in prop_oneof![Just("\"12\"".to_string()), Just("-1".to_string()), Just("\"x\"".to_string()), Just("1e99".to_string()), Just("[]".to_string())],
            key in "[A-Za-z0-9+/=!]{0,12}",
            kind in prop_oneof![Just("\"PUT\"".to_string()), Just("\"DELETE\"".to_string()), Just("7".to_string()), Just("{}".to_string())],
        ) {
            let line = format!(r#"{{"result":{{"header":{{"revision":{rev}}},"events":[{{"type":{kind},"kv":{{"key":"{key}","mod_revision":{rev}}}}}]}}}}"#);
            let _ = parse_watch_message(line.as_bytes());
            let range = format!(r#"{{"header":{{"revision":{rev}}},"kvs":[{{"key":"{key}","value":"{key}","lease":{rev}}}]}}"#);
            let _ = parse_range(range.as_bytes());
        }

        #[test]
        fn keys_round_trip(key in proptest::collection::vec(any::<u8>(), 0..64), value in proptest::collection::vec(any::<u8>(), 0..64)) {
            let body = json!({"header": {"revision": "3"}, "kvs": [{"key": b64(&key), "value": b64(&value)}]}).to_string();
            let r = parse_range(body.as_bytes()).unwrap();
            prop_assert_eq!(&r.kvs[0].key, &key);
            prop_assert_eq!(&r.kvs[0].value, &value);
        }
    }
}
