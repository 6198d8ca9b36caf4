//! A small synchronous etcd v3 client over etcd's gRPC API (HTTP/2, or TLS with a CA file and
//! an optional client certificate), for vnet's distributed control. It works the same against
//! etcd and against etcd's gRPC proxy (`etcd grpc-proxy start`), which coalesces the watches
//! and lease keep-alives of many clients into a few on etcd.
//!
//! What it does: ranges, puts, deletes, transactions with comparisons, leases (grant, one
//! keep-alive at a time, revoke), watches (a stream read message by message), and
//! user/password authentication (the token goes in the `token` metadata and is renewed once
//! when the server says it is no longer valid). Several endpoints may be given: a call that
//! cannot reach one tries the next, and the client remembers the last one that answered.
//!
//! Sync on top of async: each client has a small tokio runtime (current-thread: no thread of
//! its own; whichever caller waits drives the connections) and one lazily connected HTTP/2
//! channel per endpoint; every call blocks on its future with a deadline. The gRPC code is
//! generated from `proto/etcd.proto` ([`pb`]); [`codec`] converts between its messages and
//! this crate's types, and is pure; this module only moves messages.

#![forbid(unsafe_code)]

#[cfg(feature = "cli")]
mod cli;
mod codec;

/// etcd's gRPC messages and clients, generated at build time (see build.rs).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod pb {
    tonic::include_proto!("etcdserverpb");
}

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[cfg(feature = "cli")]
pub use cli::{EtcdAccess, OverlayArgs};
pub use codec::{
    prefix_end, CodecError, Compare, CompareTarget, EventKind, KeyValue, RangeResponse, TxnOp,
    WatchEvent, WatchMessage,
};
use tokio_stream::StreamExt as _;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};
use tracing::debug;

/// The largest unary answer read (a range of a whole overlay fits easily).
pub const MAX_ANSWER_LEN: u64 = 64 * 1024 * 1024;
/// How many times one page of [`Client::get_prefix_paged`] is asked, its timeout doubling.
pub const PAGE_TIMEOUT_STEPS: u32 = 4;
/// The largest single message of a watch stream.
pub const MAX_WATCH_MESSAGE_LEN: usize = 16 * 1024 * 1024;
/// HTTP/2 pings on a connection with a call open (a watch, mostly): a member that stops
/// answering them (frozen, cut off) ends the call within interval + timeout instead of
/// leaving a watch silently stale. etcd refuses pings more often than every 5 s, and pings
/// without a call open, so neither is done.
const PING_INTERVAL: Duration = Duration::from_secs(20);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No endpoint could be reached (the last transport error is given).
    #[error("etcd unreachable: {0}")]
    Unreachable(String),
    /// An endpoint answered, but with an error or something unreadable.
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("etcd TLS setup: {0}")]
    Tls(String),
    /// A password file that cannot be read or is not one line.
    #[error("etcd password file {0}")]
    Password(String),
    #[error("bad etcd endpoint {0:?}")]
    Endpoint(String),
    /// A watch stream ended or broke.
    #[error("watch stream ended: {0}")]
    WatchEnded(String),
    /// The client's runtime could not be made.
    #[error("etcd client runtime: {0}")]
    Runtime(String),
}

impl Error {
    /// Whether the store could not be reached at all (as opposed to answering with an error).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable(_) | Error::WatchEnded(_))
    }
}

/// Whether a gRPC status means the member was not reached or did not answer in time (try
/// another), rather than an answer: the transport's own errors (they carry their cause), and
/// the codes etcd uses when it cannot serve now (no leader, request timed out, stopping).
fn transport_failure(s: &Status) -> bool {
    use std::error::Error as _;
    matches!(
        s.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
    ) || s.source().is_some()
}

/// The error of a failed call to `endpoint`.
fn status_error(endpoint: &str, s: &Status) -> Error {
    if transport_failure(s) {
        use std::error::Error as _;
        let cause = s.source().map(|c| format!(" ({c})")).unwrap_or_default();
        return Error::Unreachable(format!("{endpoint}: {}{cause}", s.message()));
    }
    Error::Codec(CodecError::Server {
        code: s.code() as i64,
        message: s.message().to_string(),
    })
}

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` or `http(s)://host:port`; without a scheme, https when a CA is given.
    pub endpoints: Vec<String>,
    /// Connect timeout and whole-call timeout of unary calls.
    pub timeout: Duration,
    /// PEM file of the CA that signed the servers' certificates (enables TLS).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for servers that require client certificates.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// User name and password for etcd's authentication.
    pub user: Option<(String, String)>,
}

impl ClientConfig {
    pub fn new(endpoints: &str) -> ClientConfig {
        ClientConfig {
            endpoints: split_endpoints(endpoints),
            timeout: Duration::from_secs(3),
            ca_file: None,
            cert_file: None,
            key_file: None,
            user: None,
        }
    }
}

/// A password file's one line, without its line end.
pub fn read_password(path: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Password(format!("{}: {e}", path.display())))?;
    let p = text.trim_end_matches(['\n', '\r']);
    if p.is_empty() || p.contains('\n') {
        return Err(Error::Password(format!(
            "{} must hold one line",
            path.display()
        )));
    }
    Ok(p.to_string())
}

/// Splits a comma-separated endpoint list, dropping empty items.
pub fn split_endpoints(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect()
}

/// An endpoint as a base URL without a trailing slash.
fn endpoint_url(e: &str, tls: bool) -> Result<String, Error> {
    if tls && e.starts_with("http://") {
        // A CA or client certificate was given: never fall back to plain text silently.
        return Err(Error::Endpoint(format!(
            "{e} (http:// with TLS settings; use https:// or no scheme)"
        )));
    }
    let url = if e.starts_with("http://") || e.starts_with("https://") {
        e.trim_end_matches('/').to_string()
    } else {
        format!("{}://{}", if tls { "https" } else { "http" }, e)
    };
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or("");
    if rest.is_empty() || rest.contains(['/', ' ', '?', '#']) {
        return Err(Error::Endpoint(e.to_string()));
    }
    Ok(url)
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, Error> {
    let pem = std::fs::read(path).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
    // tonic reads the PEM only when it connects: a file that holds nothing of the kind is
    // refused here, where the mistake was made.
    if !String::from_utf8_lossy(&pem).contains(&format!("-----BEGIN {what}")) {
        return Err(Error::Tls(format!("{}: no {what}", path.display())));
    }
    Ok(pem)
}

/// The TLS settings of the channels: the CA to trust and, optionally, the client certificate.
fn tls_config(cfg: &ClientConfig, ca: &Path) -> Result<ClientTlsConfig, Error> {
    let tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem(ca, "CERTIFICATE")?));
    match (&cfg.cert_file, &cfg.key_file) {
        (Some(cert), Some(key)) => {
            let cert = read_pem(cert, "CERTIFICATE")?;
            let key_pem = read_pem(key, "")?;
            if !String::from_utf8_lossy(&key_pem).contains("PRIVATE KEY-----") {
                return Err(Error::Tls(format!("{}: no private key", key.display())));
            }
            Ok(tls.identity(Identity::from_pem(cert, key_pem)))
        }
        (None, None) => Ok(tls),
        _ => Err(Error::Tls(
            "a client certificate needs its key, and back".into(),
        )),
    }
}

/// A connection to an etcd cluster. Cheap to share between threads (`&Client` is enough).
pub struct Client {
    rt: Arc<tokio::runtime::Runtime>,
    endpoints: Vec<String>,
    /// One per endpoint, connected at its first call and again after a failure.
    channels: Vec<Channel>,
    /// The endpoint that answered last; calls start there.
    current: AtomicUsize,
    user: Option<(String, String)>,
    token: Mutex<Option<AsciiMetadataValue>>,
    /// The whole-call timeout of unary calls, milliseconds (see [`Client::set_call_timeout`]).
    timeout_ms: AtomicU64,
    base_timeout: Duration,
}

/// What a call sends besides its message.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Meta {
    /// The auth token, if there is one.
    Token,
    /// Nothing (authentication itself).
    None,
    /// The token and etcd's require-leader mark ("hasleader"): a member cut off from the
    /// cluster's majority ends the call (a watch) instead of leaving it silently stale.
    TokenLeader,
}

impl Client {
    /// Sets up the client (and authenticates, when a user is configured). Does not require
    /// the store to be up, unless authentication is configured.
    pub fn new(cfg: &ClientConfig) -> Result<Client, Error> {
        if cfg.endpoints.is_empty() {
            return Err(Error::Endpoint(String::new()));
        }
        let tls = match &cfg.ca_file {
            Some(ca) => Some(tls_config(cfg, ca)?),
            None if cfg.cert_file.is_some() || cfg.key_file.is_some() => {
                return Err(Error::Tls("a client certificate needs a CA file".into()))
            }
            None => None,
        };
        let endpoints = cfg
            .endpoints
            .iter()
            .map(|e| endpoint_url(e, tls.is_some()))
            .collect::<Result<Vec<_>, _>>()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Runtime(e.to_string()))?;
        // The channels' workers are tasks of this runtime.
        let channels = {
            let _in_runtime = rt.enter();
            endpoints
                .iter()
                .map(|url| {
                    let mut e = Endpoint::from_shared(url.clone())
                        .map_err(|_| Error::Endpoint(url.clone()))?
                        .connect_timeout(cfg.timeout)
                        .http2_keep_alive_interval(PING_INTERVAL)
                        .keep_alive_timeout(PING_TIMEOUT)
                        .keep_alive_while_idle(false);
                    if let Some(t) = &tls {
                        e = e
                            .tls_config(t.clone())
                            .map_err(|e| Error::Tls(format!("{url}: {e}")))?;
                    }
                    Ok(e.connect_lazy())
                })
                .collect::<Result<Vec<_>, Error>>()?
        };
        Ok(Client {
            rt: Arc::new(rt),
            endpoints,
            channels,
            current: AtomicUsize::new(0),
            user: cfg.user.clone(),
            token: Mutex::new(None),
            timeout_ms: AtomicU64::new(cfg.timeout.as_millis() as u64),
            base_timeout: cfg.timeout,
        })
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The whole-call timeout of unary calls now.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Relaxed))
    }

    /// The timeout the client was configured with.
    pub fn base_timeout(&self) -> Duration {
        self.base_timeout
    }

    /// Changes the whole-call timeout of unary calls (the connect timeout stays): an agent
    /// whose calls time out on an overloaded etcd waits longer the next time rather than
    /// giving up and asking again, which would only add to the load.
    pub fn set_call_timeout(&self, timeout: Duration) {
        self.timeout_ms
            .store(timeout.as_millis().max(1) as u64, Relaxed);
    }

    fn token(&self) -> Option<AsciiMetadataValue> {
        self.token.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_token(&self, t: Option<AsciiMetadataValue>) {
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = t;
    }

    /// `message` as a request with the metadata `meta` asks for.
    fn request<T>(&self, message: T, meta: Meta) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if meta != Meta::None {
            if let Some(t) = self.token() {
                r.metadata_mut().insert("token", t);
            }
        }
        if meta == Meta::TokenLeader {
            r.metadata_mut()
                .insert("hasleader", AsciiMetadataValue::from_static("true"));
        }
        r
    }

    /// One call at endpoint `i`, waiting at most `timeout`; an endpoint that answers (even
    /// with an error) becomes the one later calls start with.
    fn call_at<T, F, Fut>(&self, i: usize, timeout: Duration, rpc: &F) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let (Some(base), Some(channel)) = (self.endpoints.get(i), self.channels.get(i)) else {
            return Err(Error::Endpoint(format!("#{i}")));
        };
        let answer = self
            .rt
            .block_on(async { tokio::time::timeout(timeout, rpc(channel.clone())).await });
        match answer {
            Ok(Ok(v)) => {
                self.current.store(i, Relaxed);
                Ok(v)
            }
            Ok(Err(s)) => {
                let e = status_error(base, &s);
                if e.is_unreachable() {
                    debug!(endpoint = %base, "etcd call failed: {e}");
                } else {
                    self.current.store(i, Relaxed);
                }
                Err(e)
            }
            Err(_) => {
                debug!(endpoint = %base, ?timeout, "etcd call timed out");
                Err(Error::Unreachable(format!(
                    "{base}: no answer within {timeout:?}"
                )))
            }
        }
    }

    /// One call at the first endpoint that answers, starting with the one that answered
    /// last: `Ok` is its answer, an error answer [`Error::Codec`], and no endpoint answering
    /// [`Error::Unreachable`] (the last one's error).
    fn call<T, F, Fut>(&self, timeout: Duration, rpc: F) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let start = self.current.load(Relaxed);
        let n = self.endpoints.len();
        let mut last = String::new();
        for k in 0..n {
            match self.call_at((start + k) % n, timeout, &rpc) {
                Err(Error::Unreachable(e)) => last = e,
                r => return r,
            }
        }
        Err(Error::Unreachable(last))
    }

    /// A call with the token: when the server refuses the token, one fresh token and one
    /// retry. `rpc` makes the call on a channel with a request carrying the token.
    fn authed<M, T, F, Fut>(&self, message: &M, timeout: Duration, rpc: F) -> Result<T, Error>
    where
        M: Clone,
        F: Fn(Channel, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        if self.user.is_some() && self.token().is_none() {
            self.authenticate()?;
        }
        let once = || {
            self.call(timeout, |ch| {
                rpc(ch, self.request(message.clone(), Meta::Token))
            })
        };
        match once() {
            Err(Error::Codec(CodecError::Server { code, message }))
                if self.user.is_some() && codec::token_refused(code, &message) =>
            {
                debug!("etcd token refused ({message}); authenticating again");
                self.set_token(None);
                self.authenticate()?;
                once()
            }
            r => r,
        }
    }

    /// The index of the endpoint calls start with (the one that answered last).
    pub fn current_endpoint(&self) -> usize {
        self.current.load(Relaxed)
    }

    /// Makes later calls start with the endpoint after `i` (one found silent).
    pub fn avoid_endpoint(&self, i: usize) {
        let n = self.endpoints.len();
        if n > 1 && self.current.load(Relaxed) == i {
            self.current.store((i + 1) % n, Relaxed);
        }
    }

    /// Renews a lease once through endpoint `i` only, waiting at most `timeout`: a member that
    /// does not answer in time is reported unreachable rather than skipped. The agent sends
    /// its keep-alives to the member that serves its watch, so the keep-alive doubles as a
    /// probe of that member (a frozen or partitioned member fails it; a watch alone would
    /// just stay silent).
    pub fn lease_keepalive_via(&self, id: i64, i: usize, timeout: Duration) -> Result<i64, Error> {
        self.call_at(i, timeout, &|ch| {
            keepalive_once(ch, self.request((), Meta::Token), id)
        })
    }

    /// Authenticates (when a user is configured) and keeps the token for later calls.
    pub fn authenticate(&self) -> Result<(), Error> {
        let Some((name, password)) = &self.user else {
            return Ok(());
        };
        let message = pb::AuthenticateRequest {
            name: name.clone(),
            password: password.clone(),
        };
        let answer = self.call(self.call_timeout(), |ch| {
            let r = self.request(message.clone(), Meta::None);
            async move {
                let a = pb::auth_client::AuthClient::new(ch).authenticate(r).await?;
                Ok(a.into_inner())
            }
        })?;
        let token = codec::token(&answer)?;
        let value =
            AsciiMetadataValue::try_from(token.as_str()).map_err(|_| CodecError::Field("token"))?;
        self.set_token(Some(value));
        Ok(())
    }

    /// A range read waiting at most `timeout`.
    fn range_within(
        &self,
        request: &pb::RangeRequest,
        timeout: Duration,
    ) -> Result<RangeResponse, Error> {
        let answer = self.authed(request, timeout, |ch, r| async move {
            let a = pb::kv_client::KvClient::new(ch)
                .max_decoding_message_size(MAX_ANSWER_LEN as usize)
                .range(r)
                .await?;
            Ok(a.into_inner())
        })?;
        Ok(codec::range_response(answer))
    }

    /// The keys from `key` up to `range_end` (exclusive), or `key` alone.
    pub fn range(&self, key: &[u8], range_end: Option<&[u8]>) -> Result<RangeResponse, Error> {
        self.range_within(
            &codec::range_request(key, range_end, 0, 0),
            self.call_timeout(),
        )
    }

    pub fn get_prefix(&self, prefix: &[u8]) -> Result<RangeResponse, Error> {
        self.range(prefix, Some(&prefix_end(prefix)))
    }

    /// Every key starting with `prefix`, as one snapshot read in pages of at most `page` keys
    /// (each page at the first page's revision, continuing after the last key read).
    ///
    /// Why: a thousand hosts' overlay is megabytes; in one answer, under load, that is what
    /// exceeds a call timeout and makes an agent read it all again. A page is small enough to
    /// finish, etcd serves other calls between pages, and a page that times out is asked
    /// again with twice the timeout (up to [`PAGE_TIMEOUT_STEPS`] times) instead of starting
    /// over. A snapshot revision compacted away meanwhile is an error (read again from the
    /// start).
    pub fn get_prefix_paged(&self, prefix: &[u8], page: i64) -> Result<RangeResponse, Error> {
        let end = prefix_end(prefix);
        let mut from = prefix.to_vec();
        let mut all = RangeResponse::default();
        loop {
            let request = codec::range_request(&from, Some(&end), page, all.revision);
            let mut timeout = self.call_timeout();
            let mut attempt = 1;
            let r = loop {
                match self.range_within(&request, timeout) {
                    Err(e) if e.is_unreachable() && attempt < PAGE_TIMEOUT_STEPS => {
                        debug!(attempt, ?timeout, "etcd: range page failed: {e}");
                        timeout *= 2;
                        attempt += 1;
                    }
                    r => break r?,
                }
            };
            if all.revision == 0 {
                all.revision = r.revision;
                all.count = r.count;
            }
            let Some(last) = r.kvs.last() else {
                return Ok(all);
            };
            // The next page starts just after the last key (keys are ordered bytewise).
            from = last.key.clone();
            from.push(0);
            let more = r.more && page > 0;
            all.kvs.extend(r.kvs);
            if !more {
                return Ok(all);
            }
        }
    }

    /// Puts `value` at `key`, attached to `lease` (0: none). Returns the new revision.
    pub fn put(&self, key: &[u8], value: &[u8], lease: i64) -> Result<i64, Error> {
        let request = codec::put_request(key, value, lease);
        let answer = self.authed(&request, self.call_timeout(), |ch, r| async move {
            Ok(pb::kv_client::KvClient::new(ch).put(r).await?.into_inner())
        })?;
        Ok(answer.header.map_or(0, |h| h.revision))
    }

    /// Deletes `key` (or the range up to `range_end`). Returns the new revision.
    pub fn delete(&self, key: &[u8], range_end: Option<&[u8]>) -> Result<i64, Error> {
        let request = codec::delete_request(key, range_end);
        let answer = self.authed(&request, self.call_timeout(), |ch, r| async move {
            Ok(pb::kv_client::KvClient::new(ch)
                .delete_range(r)
                .await?
                .into_inner())
        })?;
        Ok(answer.header.map_or(0, |h| h.revision))
    }

    /// Runs `success` if every comparison holds, else `failure`, atomically. Returns whether
    /// the comparisons held.
    pub fn txn(
        &self,
        compare: &[Compare],
        success: &[TxnOp],
        failure: &[TxnOp],
    ) -> Result<bool, Error> {
        let request = codec::txn_request(compare, success, failure);
        let answer = self.authed(&request, self.call_timeout(), |ch, r| async move {
            Ok(pb::kv_client::KvClient::new(ch).txn(r).await?.into_inner())
        })?;
        Ok(answer.succeeded)
    }

    /// Puts `value` at `key` (under `lease`, 0 for none) only if the key's `target` holds;
    /// returns whether it did.
    pub fn put_if(
        &self,
        key: &[u8],
        target: CompareTarget,
        value: &[u8],
        lease: i64,
    ) -> Result<bool, Error> {
        let compare = Compare {
            key: key.to_vec(),
            target,
        };
        let put = TxnOp::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
        };
        self.txn(&[compare], &[put], &[])
    }

    /// Deletes `key` only if its `target` holds; returns whether it did.
    pub fn delete_if(&self, key: &[u8], target: CompareTarget) -> Result<bool, Error> {
        let compare = Compare {
            key: key.to_vec(),
            target,
        };
        let delete = TxnOp::Delete {
            key: key.to_vec(),
            range_end: None,
        };
        self.txn(&[compare], &[delete], &[])
    }

    /// Grants a lease of `ttl_secs`; returns its id and granted TTL.
    pub fn lease_grant(&self, ttl_secs: i64) -> Result<(i64, i64), Error> {
        let request = pb::LeaseGrantRequest {
            ttl: ttl_secs,
            id: 0,
        };
        let answer = self.authed(&request, self.call_timeout(), |ch, r| async move {
            Ok(pb::lease_client::LeaseClient::new(ch)
                .lease_grant(r)
                .await?
                .into_inner())
        })?;
        Ok(codec::lease_grant(&answer)?)
    }

    /// Renews a lease once; returns its remaining TTL, 0 or less when it has expired.
    pub fn lease_keepalive(&self, id: i64) -> Result<i64, Error> {
        self.lease_keepalive_within(id, self.call_timeout())
    }

    /// [`Client::lease_keepalive`] waiting up to `timeout` for the answer.
    pub fn lease_keepalive_within(&self, id: i64, timeout: Duration) -> Result<i64, Error> {
        self.authed(&(), timeout, |ch, r| keepalive_once(ch, r, id))
    }

    /// Revokes a lease: the keys attached to it are deleted at once.
    pub fn lease_revoke(&self, id: i64) -> Result<(), Error> {
        let request = pb::LeaseRevokeRequest { id };
        self.authed(&request, self.call_timeout(), |ch, r| async move {
            pb::lease_client::LeaseClient::new(ch)
                .lease_revoke(r)
                .await?;
            Ok(())
        })
    }

    /// Watches the keys from `key` up to `range_end` from `start_revision` (0: from now).
    pub fn watch(
        &self,
        key: &[u8],
        range_end: Option<&[u8]>,
        start_revision: i64,
    ) -> Result<Watch, Error> {
        let end = range_end.map(<[u8]>::to_vec);
        self.watch_ranges(&[(key.to_vec(), end)], start_revision)
    }

    /// Watches several key ranges on one stream (one create request each), so a watcher can
    /// leave out keys it has no use for without a stream per range. The call waits (at most
    /// the call timeout, per endpoint) for the server to take the stream.
    pub fn watch_ranges(
        &self,
        ranges: &[(Vec<u8>, Option<Vec<u8>>)],
        start_revision: i64,
    ) -> Result<Watch, Error> {
        if self.user.is_some() && self.token().is_none() {
            self.authenticate()?;
        }
        let creates: Vec<pb::WatchRequest> = ranges
            .iter()
            .map(|(k, e)| codec::watch_create_request(k, e.as_deref(), start_revision))
            .collect();
        let start = self.current.load(Relaxed);
        let n = self.endpoints.len();
        let mut last = String::new();
        for k in 0..n {
            let i = (start + k) % n;
            let started = self.call_at(i, self.call_timeout(), &|ch| {
                // The request side stays open (pending) for as long as the watch: a stream
                // closed by its client is one etcd's gRPC proxy tears down.
                let requests = tokio_stream::iter(creates.clone()).chain(tokio_stream::pending());
                let r = self.request(requests, Meta::TokenLeader);
                async move {
                    let s = pb::watch_client::WatchClient::new(ch)
                        .max_decoding_message_size(MAX_WATCH_MESSAGE_LEN)
                        .watch(r)
                        .await?;
                    Ok(s.into_inner())
                }
            });
            match started {
                Ok(stream) => {
                    return Ok(Watch {
                        rt: self.rt.clone(),
                        stream,
                        endpoint: i,
                        base: self.endpoints[i].clone(),
                    })
                }
                Err(Error::Unreachable(e)) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unreachable(last))
    }
}

/// One lease keep-alive on a stream of its own: the request side stays open until the answer
/// is in (etcd's gRPC proxy drops a stream its client has closed before answering it), and
/// the stream goes when the answer is read.
async fn keepalive_once(ch: Channel, r: tonic::Request<()>, id: i64) -> Result<i64, Status> {
    let requests =
        tokio_stream::iter([pb::LeaseKeepAliveRequest { id }]).chain(tokio_stream::pending());
    let (meta, ext, ()) = r.into_parts();
    let r = tonic::Request::from_parts(meta, ext, requests);
    let mut answers = pb::lease_client::LeaseClient::new(ch)
        .lease_keep_alive(r)
        .await?
        .into_inner();
    match answers.message().await? {
        Some(a) => Ok(a.ttl),
        None => Err(Status::unavailable(
            "keep-alive stream closed without an answer",
        )),
    }
}

/// An open watch: each [`Watch::next_message`] blocks until the server sends something.
pub struct Watch {
    rt: Arc<tokio::runtime::Runtime>,
    stream: tonic::Streaming<pb::WatchResponse>,
    endpoint: usize,
    /// The endpoint's URL, for errors.
    base: String,
}

impl Watch {
    /// The index (in [`Client::endpoints`]) of the endpoint serving this watch.
    pub fn endpoint(&self) -> usize {
        self.endpoint
    }

    /// The next message; an error when the stream broke, ended or sent something bad (the
    /// watch is then useless: re-read and watch again).
    pub fn next_message(&mut self) -> Result<WatchMessage, Error> {
        match self.rt.block_on(self.stream.message()) {
            Ok(Some(m)) => Ok(codec::watch_message(m)?),
            Ok(None) => Err(Error::WatchEnded("closed by the server".into())),
            Err(s) => Err(match status_error(&self.base, &s) {
                Error::Unreachable(e) => Error::WatchEnded(e),
                e => e,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            split_endpoints(" 127.0.0.1:2379, http://h:1 ,,"),
            vec!["127.0.0.1:2379", "http://h:1"]
        );
        assert_eq!(
            endpoint_url("127.0.0.1:2379", false).unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(endpoint_url("h:1", true).unwrap(), "https://h:1");
        assert!(endpoint_url("http://h:1/", true).is_err());
        assert_eq!(endpoint_url("http://h:1/", false).unwrap(), "http://h:1");
        assert!(endpoint_url("http://", false).is_err());
        assert!(endpoint_url("h:1/x", false).is_err());
    }

    #[test]
    fn statuses() {
        // The member could not serve: another one may.
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::Cancelled] {
            assert!(status_error("e", &Status::new(code, "x")).is_unreachable());
        }
        // An answer: the same from every member.
        let e = status_error(
            "e",
            &Status::invalid_argument("etcdserver: authentication failed"),
        );
        assert!(!e.is_unreachable());
        assert!(e.to_string().contains("authentication failed"), "{e}");
        assert!(matches!(
            status_error(
                "e",
                &Status::unauthenticated("etcdserver: invalid auth token")
            ),
            Error::Codec(CodecError::Server { code: 16, .. })
        ));
    }

    #[test]
    fn config_errors() {
        assert!(Client::new(&ClientConfig::new("")).is_err());
        let mut c = ClientConfig::new("127.0.0.1:1");
        c.cert_file = Some("/nonexistent".into());
        assert!(matches!(Client::new(&c), Err(Error::Tls(_))));
        let mut c = ClientConfig::new("127.0.0.1:1");
        c.ca_file = Some("/nonexistent/ca.pem".into());
        assert!(matches!(Client::new(&c), Err(Error::Tls(_))));
        // A file that is not a certificate is refused at once, not at the first call.
        let mut c = ClientConfig::new("127.0.0.1:1");
        c.ca_file = Some("/etc/hostname".into());
        assert!(matches!(Client::new(&c), Err(Error::Tls(_))));
    }

    #[test]
    fn unreachable_is_an_error() {
        // Port 1 on loopback: nothing listens there, the connection is refused at once.
        let mut c = ClientConfig::new("127.0.0.1:1,127.0.0.1:1");
        c.timeout = Duration::from_millis(500);
        let client = Client::new(&c).unwrap();
        let e = client.range(b"/x", None).unwrap_err();
        assert!(e.is_unreachable(), "{e}");
        let e = client
            .watch(b"/x", None, 0)
            .err()
            .expect("no watch without etcd");
        assert!(e.is_unreachable(), "{e}");
    }
}
