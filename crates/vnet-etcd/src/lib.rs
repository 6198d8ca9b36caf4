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
//! generated from `third_party/etcd/etcd.proto` ([`pb`]); [`codec`] converts between its messages and
//! this crate's types, and is pure; this module only moves messages: the client, its
//! channels and the call machinery (endpoint failover, deadlines, the auth token), with the
//! calls themselves by family in [`kv`], [`lease`] and [`watch`]; [`config`] says how to reach
//! etcd and [`error`] what went wrong.

#![forbid(unsafe_code)]

#[cfg(feature = "cli")]
mod cli;
mod codec;
mod config;
mod error;
mod held;
mod kv;
mod lease;
mod watch;

/// etcd's gRPC messages and clients, generated at build time (see build.rs).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod pb {
    tonic::include_proto!("etcdserverpb");
}

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[cfg(feature = "cli")]
pub use cli::{EtcdAccess, OverlayArgs};
pub use codec::{
    prefix_end, CodecError, Compare, CompareTarget, EventKind, KeyValue, RangeResponse, TxnOp,
    WatchEvent, WatchMessage,
};
use config::{endpoint_url, tls_config};
pub use config::{read_password, split_endpoints, ClientConfig};
use error::status_error;
pub use error::Error;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;
use tracing::debug;
pub use watch::Watch;

/// The largest unary answer read (a range of a whole overlay fits easily).
pub const MAX_ANSWER_LEN: u64 = 64 * 1024 * 1024;
/// How many times one page of a paged read is asked, its timeout doubling.
pub const PAGE_TIMEOUT_STEPS: u32 = 4;
/// The least time a page of a paged read is given before it is asked again (the call timeout
/// when that is longer). etcd serves every read it took even when its client has given up, so
/// a page asked again costs it twice: with 1,000 agents reading together, etcd logged 8,342
/// ranges that took over 3 s, the call timeout.
pub const PAGE_TIMEOUT: Duration = Duration::from_secs(15);
/// The largest single message of a watch stream.
pub const MAX_WATCH_MESSAGE_LEN: usize = 16 * 1024 * 1024;
/// HTTP/2 pings on a connection with a call open (a watch, mostly): a member that stops
/// answering them (frozen, cut off) ends the call within interval + timeout instead of
/// leaving a watch silently stale. etcd refuses pings more often than every 5 s, and pings
/// without a call open, so neither is done.
const PING_INTERVAL: Duration = Duration::from_secs(20);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// The stream of the last answered keep-alive, open until the next one is answered (see
    /// `lease.rs`).
    kept_alive: Mutex<Option<held::Held>>,
    /// What the client was made from, for [`Client::with_own_connection`].
    cfg: ClientConfig,
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
            kept_alive: Mutex::new(None),
            cfg: cfg.clone(),
        })
    }

    /// Another client of the same cluster (endpoints, TLS, user, and the token it holds) with
    /// a runtime and connections of its own. Why: this client's calls share one HTTP/2
    /// connection per endpoint and one runtime driven by whichever caller waits, so a small
    /// call waits behind a big one: its answer queues behind the big answer's bytes on the
    /// connection, and it is read only when the thread decoding the big answer gets the CPU.
    /// An agent renews its lease on a client of its own for that reason (at 1,000 agents
    /// starting together on 2 cores, keep-alives sharing the connection with the first read
    /// went unanswered for a whole TTL 146-208 times per bring-up, and leases expired).
    pub fn with_own_connection(&self) -> Result<Client, Error> {
        let c = Client::new(&self.cfg)?;
        c.set_token(self.token());
        c.set_call_timeout(self.call_timeout());
        c.current.store(self.current.load(Relaxed), Relaxed);
        Ok(c)
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
