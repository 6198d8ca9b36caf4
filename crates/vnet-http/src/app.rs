//! The listener's resources: the live view's page and its JSON, and `/metrics`; with the
//! token check (the control port's token, as `Authorization: Bearer`) and the loopback
//! `Host` check.
//!
//! The page, its script and its style hold no data and are served to anyone who reaches the
//! listener; the data (`/metrics`, `/api/*`) needs the token when one is set. The page takes
//! the token from the URL's fragment (`/#token=...`), which browsers never send to a server,
//! and presents it on every request of its own.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use vnet_control::status::{LinkStatus, MatrixReport, StatsReport};
use vnet_control::Interface;
use vnet_core::LockRecover;

use crate::metrics::{self, BuildInfo};
use crate::overlay::{overlay_view, MatrixTracker};
use crate::request::Request;
use crate::server::{Handler, HttpCounters, Refusal, Response};
use crate::source::{AgentSnapshot, Source};

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE_CSS: &str = include_str!("../assets/style.css");

/// Everything from this listener; nothing else (no CDN, no inline script).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub struct App {
    source: Arc<dyn Source>,
    token: Option<String>,
    /// The listener is on loopback: only loopback `Host` names are answered.
    loopback_only: bool,
    counters: Arc<HttpCounters>,
    info: BuildInfo,
    started: Instant,
    tracker: Mutex<MatrixTracker>,
}

/// `/api/host`.
#[derive(Serialize)]
struct HostApi<'a> {
    /// Milliseconds on the daemon's monotonic clock: rates are computed against it.
    now_ms: u64,
    version: &'a str,
    stats: &'a StatsReport,
    links: &'a [LinkStatus],
    interfaces: &'a [Interface],
    matrix: &'a MatrixReport,
    agent: Option<&'a AgentSnapshot>,
    /// `agent.synced`, precomputed.
    synced: Option<bool>,
}

/// Whether a presented token is the configured one (the HTTP listener's bearer token and the
/// control port's `auth`), compared in constant time so that timing does not reveal how much
/// of a guess was right (only whether its length was).
pub fn same_secret(expected: &str, given: &str) -> bool {
    subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), given.as_bytes()).into()
}

/// Whether a `Host` header names this machine's loopback (`localhost`, `127.x`, `[::1]`,
/// with or without a port). A missing header (HTTP/1.0) passes.
pub fn host_is_loopback(host: Option<&str>) -> bool {
    let Some(h) = host else {
        return true;
    };
    let name = if let Some(rest) = h.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inside, _)) => inside,
            None => return false,
        }
    } else {
        match h.rsplit_once(':') {
            Some((n, port)) if port.bytes().all(|c| c.is_ascii_digit()) => n,
            _ => h,
        }
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

impl App {
    pub fn new(
        source: Arc<dyn Source>,
        token: Option<String>,
        loopback_only: bool,
        counters: Arc<HttpCounters>,
        info: BuildInfo,
    ) -> App {
        App {
            source,
            token,
            loopback_only,
            counters,
            info,
            started: Instant::now(),
            tracker: Mutex::new(MatrixTracker::default()),
        }
    }

    fn authorized(&self, req: &Request) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        match req
            .authorization
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "))
        {
            Some(given) => same_secret(token, given.trim()),
            None => false,
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn json<T: Serialize>(v: &T) -> Response {
        match serde_json::to_vec(v) {
            Ok(body) => Response::new(200, "application/json", body),
            Err(e) => Response::error(500, &format!("encoding: {e}")),
        }
    }

    fn host_api(&self) -> Response {
        let snap = self.source.host();
        let matrix = self.source.matrix();
        Self::json(&HostApi {
            now_ms: self.now_ms(),
            version: &self.info.version,
            stats: &snap.stats,
            links: &snap.links,
            interfaces: &snap.interfaces,
            matrix: &matrix,
            agent: snap.agent.as_ref(),
            synced: snap.agent.as_ref().map(AgentSnapshot::synced),
        })
    }

    fn overlay_api(&self) -> Response {
        let Some(snap) = self.source.overlay() else {
            return Self::json(&serde_json::json!({"enabled": false}));
        };
        let Some(state) = &snap.state else {
            return Self::json(&serde_json::json!({
                "enabled": true, "local_host": snap.local_host.as_str(),
                "waiting": "the etcd agent has not synchronised yet"}));
        };
        let now = self.now_ms();
        let (rates, err) = {
            let mut t = self.tracker.lock_or_recover();
            let err = match &snap.matrices {
                Ok(m) => {
                    t.observe(now, m);
                    None
                }
                Err(e) => Some(e.clone()),
            };
            (t.rates(now), err)
        };
        Self::json(&overlay_view(&snap.local_host, state, &rates, err))
    }
}

impl Handler for App {
    fn handle(&self, req: &Request) -> Response {
        if self.loopback_only && !host_is_loopback(req.host.as_deref()) {
            return Response::error(403, "this listener answers loopback names only")
                .refused(Refusal::BadHost);
        }
        let page = |ct: &'static str, body: &str| {
            Response::new(200, ct, body.as_bytes().to_vec())
                .header("Content-Security-Policy", CSP)
                .header("X-Frame-Options", "DENY")
                .header("Referrer-Policy", "no-referrer")
        };
        match req.path.as_str() {
            "/" | "/index.html" => return page("text/html; charset=utf-8", INDEX_HTML),
            "/app.js" => return page("text/javascript; charset=utf-8", APP_JS),
            "/style.css" => return page("text/css; charset=utf-8", STYLE_CSS),
            "/favicon.ico" => return Response::new(204, "text/plain", Vec::new()),
            "/metrics" | "/api/host" | "/api/overlay" => {}
            _ => return Response::error(404, "not found"),
        }
        if !self.authorized(req) {
            return Response::error(401, "a bearer token is required")
                .header("WWW-Authenticate", "Bearer realm=\"vnet\"")
                .refused(Refusal::Unauthorized);
        }
        match req.path.as_str() {
            "/metrics" => {
                let snap = self.source.host();
                let mut body = String::new();
                self.source.background(&mut || {
                    body = metrics::render(&snap, &self.counters, &self.info);
                });
                Response::new(200, metrics::CONTENT_TYPE, body)
            }
            "/api/host" => self.host_api(),
            _ => self.overlay_api(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "LOCALHOST:9300",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]:9300",
            "[::1]",
        ] {
            assert!(host_is_loopback(Some(h)), "{h}");
        }
        for h in [
            "evil.example",
            "evil.example:9300",
            "10.0.0.1:9300",
            "[fe80::1]:1",
            "[::1",
            "localhost.evil",
        ] {
            assert!(!host_is_loopback(Some(h)), "{h}");
        }
        assert!(host_is_loopback(None));
    }

    #[test]
    fn secrets() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
        assert!(!same_secret("abc", "ab"));
        assert!(!same_secret("", "x"));
        assert!(!same_secret("x", ""));
    }
}
