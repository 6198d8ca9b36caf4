//! A small synchronous etcd v3 client over etcd's JSON gateway (`/v3/...` over HTTP/1.1, or
//! HTTPS with a CA file and an optional client certificate), for vnet's distributed control.
//!
//! What it does: ranges, puts, deletes, transactions with comparisons, leases (grant, one
//! keep-alive at a time, revoke), watches (a streamed HTTP answer read line by line), and
//! user/password authentication (the token goes in the `Authorization` header and is renewed
//! once when the server says it is no longer valid). Several endpoints may be given: a call
//! that cannot reach one tries the next, and the client remembers the last one that answered.
//!
//! The JSON is built and parsed in [`codec`], which is pure and tested on its own; this module
//! only moves bytes.

#![forbid(unsafe_code)]

#[cfg(feature = "cli")]
mod cli;
pub mod codec;

use std::io::{BufRead, BufReader, Read};
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
use serde_json::Value;
use tracing::debug;

/// The largest unary answer read (a range of a whole overlay fits easily).
pub const MAX_ANSWER_LEN: u64 = 64 * 1024 * 1024;
/// How many times one page of [`Client::get_prefix_paged`] is asked, its timeout doubling.
pub const PAGE_TIMEOUT_STEPS: u32 = 4;
/// The largest single message of a watch stream.
pub const MAX_WATCH_MESSAGE_LEN: usize = 16 * 1024 * 1024;

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
}

impl Error {
    /// Whether the store could not be reached at all (as opposed to answering with an error).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable(_) | Error::WatchEnded(_))
    }
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

fn read_pem(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))
}

fn tls_config(cfg: &ClientConfig, ca: &Path) -> Result<Arc<rustls::ClientConfig>, Error> {
    let mut roots = rustls::RootCertStore::empty();
    let pem = read_pem(ca)?;
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| Error::Tls(format!("{}: {e}", ca.display())))?;
        roots
            .add(cert)
            .map_err(|e| Error::Tls(format!("{}: {e}", ca.display())))?;
    }
    if roots.is_empty() {
        return Err(Error::Tls(format!("{}: no certificate", ca.display())));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_root_certificates(roots);
    let config = match (&cfg.cert_file, &cfg.key_file) {
        (Some(cert), Some(key)) => {
            let pem = read_pem(cert)?;
            let chain = rustls_pemfile::certs(&mut pem.as_slice())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| Error::Tls(format!("{}: {e}", cert.display())))?;
            let pem = read_pem(key)?;
            let key_der = rustls_pemfile::private_key(&mut pem.as_slice())
                .map_err(|e| Error::Tls(format!("{}: {e}", key.display())))?
                .ok_or_else(|| Error::Tls(format!("{}: no private key", key.display())))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| Error::Tls(e.to_string()))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(Error::Tls(
                "a client certificate needs its key, and back".into(),
            ))
        }
    };
    Ok(Arc::new(config))
}

/// A connection to an etcd cluster. Cheap to share between threads (`&Client` is enough).
pub struct Client {
    agent: ureq::Agent,
    /// Without a read timeout: a watch may stay quiet for as long as the overlay does.
    stream_agent: ureq::Agent,
    endpoints: Vec<String>,
    /// The endpoint that answered last; calls start there.
    current: AtomicUsize,
    user: Option<(String, String)>,
    token: Mutex<Option<String>>,
    /// The whole-call timeout of unary calls, milliseconds (see [`Client::set_call_timeout`]).
    timeout_ms: AtomicU64,
    base_timeout: Duration,
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
        let build = |read: Option<Duration>| {
            let mut b = ureq::AgentBuilder::new()
                .timeout_connect(cfg.timeout)
                .timeout_write(cfg.timeout)
                .max_idle_connections_per_host(2);
            if let Some(r) = read {
                b = b.timeout_read(r);
            }
            if let Some(t) = &tls {
                b = b.tls_config(t.clone());
            }
            b.build()
        };
        let client = Client {
            agent: build(Some(cfg.timeout)),
            stream_agent: build(None),
            endpoints,
            current: AtomicUsize::new(0),
            user: cfg.user.clone(),
            token: Mutex::new(None),
            timeout_ms: AtomicU64::new(cfg.timeout.as_millis() as u64),
            base_timeout: cfg.timeout,
        };
        Ok(client)
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

    fn token(&self) -> Option<String> {
        self.token.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_token(&self, t: Option<String>) {
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = t;
    }

    /// One POST to the first endpoint that answers; `Ok` holds the body of a 2xx answer, an
    /// error answer becomes [`Error::Codec`].
    fn post_raw(
        &self,
        path: &str,
        body: &Value,
        with_token: bool,
        timeout: Duration,
    ) -> Result<Vec<u8>, Error> {
        let token = if with_token { self.token() } else { None };
        let (resp, _) = self.send(path, &body.to_string(), token.as_deref(), |url| {
            self.agent.post(url).timeout(timeout)
        })?;
        read_body(resp)
    }

    /// Sends `payload` to `path` on the first endpoint that answers, starting with the one that
    /// answered last; `request` makes the request for a URL. `Ok` is a 2xx answer; an error
    /// answer becomes [`Error::Codec`], and no endpoint answering [`Error::Unreachable`].
    fn send(
        &self,
        path: &str,
        payload: &str,
        token: Option<&str>,
        request: impl Fn(&str) -> ureq::Request,
    ) -> Result<(ureq::Response, usize), Error> {
        let start = self.current.load(Relaxed);
        let n = self.endpoints.len();
        let mut last = String::new();
        for k in 0..n {
            let i = (start + k) % n;
            match self.send_to(i, path, payload, token, &request) {
                Err(Error::Unreachable(e)) => last = e,
                Ok(resp) => return Ok((resp, i)),
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unreachable(last))
    }

    /// One attempt at endpoint `i` (see [`Client::send`]); an endpoint that answers becomes
    /// the one later calls start with.
    fn send_to(
        &self,
        i: usize,
        path: &str,
        payload: &str,
        token: Option<&str>,
        request: impl Fn(&str) -> ureq::Request,
    ) -> Result<ureq::Response, Error> {
        let Some(base) = self.endpoints.get(i) else {
            return Err(Error::Endpoint(format!("#{i}")));
        };
        let url = format!("{base}{path}");
        let mut req = request(&url).set("Content-Type", "application/json");
        if let Some(t) = token {
            req = req.set("Authorization", t);
        }
        match req.send_string(payload) {
            Ok(resp) => {
                self.current.store(i, Relaxed);
                Ok(resp)
            }
            Err(ureq::Error::Status(code, resp)) => {
                self.current.store(i, Relaxed);
                let body = read_error_body(resp);
                Err(match codec::parse_answer(&body) {
                    Err(e @ CodecError::Server { .. }) => e.into(),
                    _ => CodecError::Server {
                        code: -i64::from(code),
                        message: http_error_text(code, &url, &body),
                    }
                    .into(),
                })
            }
            Err(e) => {
                debug!(endpoint = %base, "etcd call failed: {e}");
                Err(Error::Unreachable(format!("{base}: {e}")))
            }
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
        let token = self.token();
        let payload = codec::lease_id_request(id).to_string();
        let resp = self.send_to(
            i,
            "/v3/lease/keepalive",
            &payload,
            token.as_deref(),
            |url| self.agent.post(url).timeout(timeout),
        )?;
        let body = read_body(resp)?;
        let first = body.split(|b| *b == b'\n').next().unwrap_or(&[]);
        Ok(codec::parse_lease_keepalive(first)?)
    }

    /// Authenticates (when a user is configured) and keeps the token for later calls.
    pub fn authenticate(&self) -> Result<(), Error> {
        let Some((name, password)) = &self.user else {
            return Ok(());
        };
        let body = self.post_raw(
            "/v3/auth/authenticate",
            &codec::authenticate_request(name, password),
            false,
            self.call_timeout(),
        )?;
        self.set_token(Some(codec::parse_token(&body)?));
        Ok(())
    }

    /// A call with the token; an answer saying the token is bad gets one fresh token and one
    /// retry.
    fn post(&self, path: &str, body: &Value) -> Result<Vec<u8>, Error> {
        self.post_within(path, body, self.call_timeout())
    }

    /// [`Client::post`] with a call timeout of its own.
    fn post_within(&self, path: &str, body: &Value, timeout: Duration) -> Result<Vec<u8>, Error> {
        if self.user.is_some() && self.token().is_none() {
            self.authenticate()?;
        }
        match self.post_raw(path, body, true, timeout) {
            Err(Error::Codec(CodecError::Server { code, message }))
                if self.user.is_some()
                    && (code == codec::CODE_UNAUTHENTICATED
                        || (code == codec::CODE_INVALID_ARGUMENT && message.contains("token"))) =>
            {
                debug!("etcd token refused ({message}); authenticating again");
                self.set_token(None);
                self.authenticate()?;
                self.post_raw(path, body, true, timeout)
            }
            r => r,
        }
    }

    /// The keys from `key` up to `range_end` (exclusive), or `key` alone.
    pub fn range(&self, key: &[u8], range_end: Option<&[u8]>) -> Result<RangeResponse, Error> {
        let body = self.post("/v3/kv/range", &codec::range_request(key, range_end))?;
        Ok(codec::parse_range(&body)?)
    }

    pub fn get_prefix(&self, prefix: &[u8]) -> Result<RangeResponse, Error> {
        self.range(prefix, Some(&prefix_end(prefix)))
    }

    /// Every key starting with `prefix`, as one snapshot read in pages of at most `page` keys
    /// (each page at the first page's revision, continuing after the last key read).
    ///
    /// Why: a thousand hosts' overlay is megabytes of JSON, and the gateway's encoding of it
    /// costs etcd about 15 µs per key; in one answer, under load, that is what exceeds a call
    /// timeout and makes an agent read it all again. A page is small enough to finish, etcd
    /// serves other calls between pages, and a page that times out is asked again with twice
    /// the timeout (up to [`PAGE_TIMEOUT_STEPS`] times) instead of starting over. A snapshot
    /// revision compacted away meanwhile is an error (read again from the start).
    pub fn get_prefix_paged(&self, prefix: &[u8], page: i64) -> Result<RangeResponse, Error> {
        let end = prefix_end(prefix);
        let mut from = prefix.to_vec();
        let mut all = RangeResponse::default();
        loop {
            let request = codec::range_page_request(&from, &end, page, all.revision);
            let mut timeout = self.call_timeout();
            let mut attempt = 1;
            let body = loop {
                match self.post_within("/v3/kv/range", &request, timeout) {
                    Err(e) if e.is_unreachable() && attempt < PAGE_TIMEOUT_STEPS => {
                        debug!(attempt, ?timeout, "etcd: range page failed: {e}");
                        timeout *= 2;
                        attempt += 1;
                    }
                    r => break r?,
                }
            };
            let r = codec::parse_range(&body)?;
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
        let body = self.post("/v3/kv/put", &codec::put_request(key, value, lease))?;
        Ok(codec::parse_revision(&body)?)
    }

    /// Deletes `key` (or the range up to `range_end`). Returns the new revision.
    pub fn delete(&self, key: &[u8], range_end: Option<&[u8]>) -> Result<i64, Error> {
        let body = self.post("/v3/kv/deleterange", &codec::delete_request(key, range_end))?;
        Ok(codec::parse_revision(&body)?)
    }

    /// Runs `success` if every comparison holds, else `failure`, atomically. Returns whether
    /// the comparisons held.
    pub fn txn(
        &self,
        compare: &[Compare],
        success: &[TxnOp],
        failure: &[TxnOp],
    ) -> Result<bool, Error> {
        let body = self.post("/v3/kv/txn", &codec::txn_request(compare, success, failure))?;
        Ok(codec::parse_txn(&body)?)
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
        let body = self.post("/v3/lease/grant", &codec::lease_grant_request(ttl_secs))?;
        Ok(codec::parse_lease_grant(&body)?)
    }

    /// Renews a lease once; returns its remaining TTL, 0 or less when it has expired.
    pub fn lease_keepalive(&self, id: i64) -> Result<i64, Error> {
        self.lease_keepalive_within(id, self.call_timeout())
    }

    /// [`Client::lease_keepalive`] waiting up to `timeout` for the answer.
    pub fn lease_keepalive_within(&self, id: i64, timeout: Duration) -> Result<i64, Error> {
        let body =
            self.post_within("/v3/lease/keepalive", &codec::lease_id_request(id), timeout)?;
        // The gateway streams: the first line is the answer.
        let first = body.split(|b| *b == b'\n').next().unwrap_or(&[]);
        Ok(codec::parse_lease_keepalive(first)?)
    }

    /// Revokes a lease: the keys attached to it are deleted at once.
    pub fn lease_revoke(&self, id: i64) -> Result<(), Error> {
        self.post("/v3/lease/revoke", &codec::lease_id_request(id))?;
        Ok(())
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

    /// Watches several key ranges on one stream (one create request each, newline-separated
    /// in the request body; the gateway hands each to the server's watch stream), so a
    /// watcher can leave out keys it has no use for without a connection per range.
    pub fn watch_ranges(
        &self,
        ranges: &[(Vec<u8>, Option<Vec<u8>>)],
        start_revision: i64,
    ) -> Result<Watch, Error> {
        if self.user.is_some() && self.token().is_none() {
            self.authenticate()?;
        }
        let payload: Vec<String> = ranges
            .iter()
            .map(|(k, e)| codec::watch_create_request(k, e.as_deref(), start_revision).to_string())
            .collect();
        // require-leader (etcd's "hasleader" metadata): a member cut off from the cluster's
        // majority ends the watch instead of leaving it silently stale.
        let (resp, endpoint) = self.send(
            "/v3/watch",
            &payload.join("\n"),
            self.token().as_deref(),
            |url| {
                self.stream_agent
                    .post(url)
                    .set("Grpc-Metadata-hasleader", "true")
            },
        )?;
        Ok(Watch {
            reader: BufReader::new(resp.into_reader()),
            endpoint,
        })
    }
}

/// An error answer that is not the gateway's JSON (a plain-text refusal, say), for humans.
fn http_error_text(code: u16, url: &str, body: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(&body[..body.len().min(200)])
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.trim().is_empty() {
        format!("HTTP {code} from {url}")
    } else {
        format!("HTTP {code} from {url}: {}", text.trim())
    }
}

/// The body of an error answer, as much of it as can be read: the gateway ends those with
/// gRPC trailers in a chunked encoding that the HTTP client may refuse after the JSON.
fn read_error_body(resp: ureq::Response) -> Vec<u8> {
    let mut body = Vec::new();
    let _ = resp
        .into_reader()
        .take(MAX_ANSWER_LEN)
        .read_to_end(&mut body);
    body
}

fn read_body(resp: ureq::Response) -> Result<Vec<u8>, Error> {
    let mut body = Vec::new();
    resp.into_reader()
        .take(MAX_ANSWER_LEN)
        .read_to_end(&mut body)
        .map_err(|e| Error::Unreachable(format!("reading the answer: {e}")))?;
    Ok(body)
}

/// An open watch: each [`Watch::next_message`] blocks until the server sends something.
pub struct Watch {
    reader: BufReader<Box<dyn Read + Send + Sync + 'static>>,
    endpoint: usize,
}

impl Watch {
    /// The index (in [`Client::endpoints`]) of the endpoint serving this watch.
    pub fn endpoint(&self) -> usize {
        self.endpoint
    }

    /// The next message; an error when the stream broke, ended or sent something bad (the
    /// watch is then useless: re-read and watch again).
    pub fn next_message(&mut self) -> Result<WatchMessage, Error> {
        loop {
            let mut line = Vec::new();
            let n = (&mut self.reader)
                .take(MAX_WATCH_MESSAGE_LEN as u64 + 1)
                .read_until(b'\n', &mut line)
                .map_err(|e| Error::WatchEnded(e.to_string()))?;
            if n == 0 {
                return Err(Error::WatchEnded("closed by the server".into()));
            }
            if line.len() > MAX_WATCH_MESSAGE_LEN {
                return Err(Error::WatchEnded("message too long".into()));
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Ok(codec::parse_watch_message(&line)?);
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
    fn http_errors_are_readable() {
        assert_eq!(http_error_text(400, "u", b""), "HTTP 400 from u");
        assert_eq!(
            http_error_text(400, "u", b"CommonName ignored\n\x1b"),
            "HTTP 400 from u: CommonName ignored"
        );
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
    }

    #[test]
    fn unreachable_is_an_error() {
        // Port 1 on loopback: nothing listens there, the connection is refused at once.
        let mut c = ClientConfig::new("127.0.0.1:1,127.0.0.1:1");
        c.timeout = Duration::from_millis(500);
        let client = Client::new(&c).unwrap();
        let e = client.range(b"/x", None).unwrap_err();
        assert!(e.is_unreachable(), "{e}");
    }
}
