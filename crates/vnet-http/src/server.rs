//! The listener: a small blocking HTTP/1.1 server, bounded like the control port.
//!
//! One thread accepts; each connection gets a thread of its own, at most
//! `Limits::max_connections` at once (one more is answered 503 from the accepting thread and
//! closed). A connection has `head_timeout` for its whole request head (a client that trickles
//! bytes is cut off at the deadline, not at each read), at most `max_head_bytes` of it and
//! `max_headers` fields; it gets one response (`Connection: close`) written under
//! `write_timeout`. Every refusal is counted by reason ([`HttpCounters`]), and shows in
//! `/metrics`. Why not a crate: the resources are a few read-only GETs, and the servers that
//! work without an async runtime do not bound the head's size and time this way.

use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::request::{head_end, parse_head, HeadError, Method, Request};

/// The bounds of the listener.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_connections: usize,
    pub max_head_bytes: usize,
    pub max_headers: usize,
    /// The whole request head must arrive within this time of the connection's accept.
    pub head_timeout: Duration,
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 16,
            max_head_bytes: 8192,
            max_headers: 64,
            head_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
        }
    }
}

/// Why a request got no regular answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    TooManyConnections,
    HeadTooLarge,
    Timeout,
    BadRequest,
    /// The client closed (or reset) the connection before its head was complete.
    ClosedEarly,
    Unauthorized,
    MethodNotAllowed,
    /// A loopback listener asked for with a `Host` that is not a loopback name (DNS rebinding).
    BadHost,
}

impl Refusal {
    pub const ALL: [Refusal; 8] = [
        Refusal::TooManyConnections,
        Refusal::HeadTooLarge,
        Refusal::Timeout,
        Refusal::BadRequest,
        Refusal::ClosedEarly,
        Refusal::Unauthorized,
        Refusal::MethodNotAllowed,
        Refusal::BadHost,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Refusal::TooManyConnections => "too_many_connections",
            Refusal::HeadTooLarge => "head_too_large",
            Refusal::Timeout => "timeout",
            Refusal::BadRequest => "bad_request",
            Refusal::ClosedEarly => "closed_early",
            Refusal::Unauthorized => "unauthorized",
            Refusal::MethodNotAllowed => "method_not_allowed",
            Refusal::BadHost => "bad_host",
        }
    }

    fn index(&self) -> usize {
        Refusal::ALL.iter().position(|r| r == self).unwrap_or(0)
    }
}

/// Status codes the listener answers with (responses are counted by these).
pub const STATUS_CODES: [u16; 11] = [200, 204, 400, 401, 403, 404, 405, 408, 431, 500, 503];

/// What the listener did, for `/metrics`.
#[derive(Debug, Default)]
pub struct HttpCounters {
    accepted: AtomicU64,
    active: AtomicUsize,
    responses: [AtomicU64; STATUS_CODES.len()],
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl HttpCounters {
    pub fn refuse(&self, r: Refusal) {
        self.refused[r.index()].fetch_add(1, Relaxed);
    }

    pub fn refused(&self, r: Refusal) -> u64 {
        self.refused[r.index()].load(Relaxed)
    }

    fn respond(&self, status: u16) {
        if let Some(i) = STATUS_CODES.iter().position(|&c| c == status) {
            self.responses[i].fetch_add(1, Relaxed);
        }
    }

    /// (status code, responses sent with it).
    pub fn responses(&self) -> Vec<(u16, u64)> {
        STATUS_CODES
            .iter()
            .zip(&self.responses)
            .map(|(c, n)| (*c, n.load(Relaxed)))
            .collect()
    }

    pub fn accepted(&self) -> u64 {
        self.accepted.load(Relaxed)
    }

    pub fn active(&self) -> usize {
        self.active.load(Relaxed)
    }
}

/// One answer. `refusal` says that the handler refused the request (counted by reason).
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
    pub refusal: Option<Refusal>,
}

impl Response {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            content_type,
            body: body.into(),
            headers: Vec::new(),
            refusal: None,
        }
    }

    /// A short plain-text error.
    pub fn error(status: u16, msg: &str) -> Response {
        Response::new(status, "text/plain; charset=utf-8", format!("{msg}\n"))
    }

    pub fn refused(mut self, r: Refusal) -> Response {
        self.refusal = Some(r);
        self
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }
}

/// Answers requests that arrived whole and well-formed.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: &Request) -> Response;
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// A response's status line and headers, up to the blank line that ends them.
pub fn head(resp: &Response) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n",
        resp.status,
        reason_phrase(resp.status),
        resp.content_type,
        resp.body.len()
    );
    for (k, v) in &resp.headers {
        // Values are the handler's own; strip line breaks all the same.
        let v: String = v.chars().filter(|c| *c != '\r' && *c != '\n').collect();
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// Writes a response: its head, then its body unless `head_only` (HEAD). The body is written
/// from where it is, not copied behind the head (a scrape at 1,000 links is 2 MB).
pub fn write_response(mut w: impl Write, resp: &Response, head_only: bool) -> std::io::Result<()> {
    let head = head(resp);
    let body: &[u8] = if head_only { &[] } else { &resp.body };
    let (mut a, mut b) = (&head[..], body);
    while !a.is_empty() || !b.is_empty() {
        let n = match w.write_vectored(&[IoSlice::new(a), IoSlice::new(b)]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_a = n.min(a.len());
        a = &a[from_a..];
        b = &b[n - from_a..];
    }
    Ok(())
}

/// Serves `listener` on a thread of its own until the process ends.
pub fn spawn(
    listener: TcpListener,
    handler: Arc<dyn Handler>,
    limits: Limits,
    counters: Arc<HttpCounters>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("http-accept".into())
        .spawn(move || accept_loop(listener, handler, limits, counters))
}

fn accept_loop(
    listener: TcpListener,
    handler: Arc<dyn Handler>,
    limits: Limits,
    counters: Arc<HttpCounters>,
) {
    let limits = Arc::new(limits);
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and the like: do not spin.
                debug!("http accept: {e}");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        counters.accepted.fetch_add(1, Relaxed);
        if counters.active.load(Relaxed) >= limits.max_connections {
            counters.refuse(Refusal::TooManyConnections);
            counters.respond(503);
            // A fresh socket's send buffer takes this at once; never block the accept loop.
            let _ = stream.set_nonblocking(true);
            let resp = Response::error(503, "too many connections");
            let _ = write_response(&stream, &resp, false);
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        counters.active.fetch_add(1, Relaxed);
        let (h, l, c) = (handler.clone(), limits.clone(), counters.clone());
        let spawned = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || {
                serve_connection(stream, &*h, &l, &c);
                c.active.fetch_sub(1, Relaxed);
            });
        if let Err(e) = spawned {
            counters.active.fetch_sub(1, Relaxed);
            warn!("http: no thread for a connection: {e}");
        }
    }
}

enum Head {
    Complete(Vec<u8>),
    Refused(Refusal),
}

/// Reads until the blank line that ends the head, within the limits.
fn read_head(stream: &mut TcpStream, limits: &Limits) -> Head {
    let deadline = Instant::now() + limits.head_timeout;
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Head::Refused(Refusal::Timeout);
        }
        let room = (limits.max_head_bytes - buf.len()).min(chunk.len());
        if room == 0 {
            return Head::Refused(Refusal::HeadTooLarge);
        }
        match stream.read(&mut chunk[..room]) {
            Ok(0) => return Head::Refused(Refusal::ClosedEarly),
            Ok(n) => {
                let from = buf.len().saturating_sub(3);
                buf.extend_from_slice(&chunk[..n]);
                if let Some(end) = head_end(&buf[from..]) {
                    buf.truncate(from + end);
                    return Head::Complete(buf);
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return Head::Refused(Refusal::Timeout)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Head::Refused(Refusal::ClosedEarly),
        }
    }
}

fn serve_connection(
    mut stream: TcpStream,
    handler: &dyn Handler,
    limits: &Limits,
    c: &HttpCounters,
) {
    let _ = stream.set_write_timeout(Some(limits.write_timeout));
    let _ = stream.set_nodelay(true);
    let (resp, head_only) = match read_head(&mut stream, limits) {
        Head::Refused(Refusal::ClosedEarly) => {
            c.refuse(Refusal::ClosedEarly);
            return;
        }
        Head::Refused(r) => {
            let status = if r == Refusal::HeadTooLarge { 431 } else { 408 };
            (
                Response::error(status, reason_phrase(status)).refused(r),
                false,
            )
        }
        Head::Complete(head) => match parse_head(&head, limits.max_headers) {
            Ok(req) if req.method == Method::Other => (
                Response::error(405, "only GET and HEAD")
                    .header("Allow", "GET, HEAD")
                    .refused(Refusal::MethodNotAllowed),
                false,
            ),
            Ok(req) => (handler.handle(&req), req.method == Method::Head),
            Err(HeadError::TooManyHeaders) => (
                Response::error(431, "too many header fields").refused(Refusal::HeadTooLarge),
                false,
            ),
            Err(e) => (
                Response::error(400, &e.to_string()).refused(Refusal::BadRequest),
                false,
            ),
        },
    };
    if let Some(r) = resp.refusal {
        c.refuse(r);
    }
    c.respond(resp.status);
    if let Err(e) = write_response(&stream, &resp, head_only) {
        debug!("http: writing the response: {e}");
        return;
    }
    // Close gracefully: unread bytes at close would reset the connection and could destroy
    // the response before the client read it (an oversized request is still arriving).
    // Drain briefly, bounded in time and bytes.
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = Instant::now() + DRAIN_TIME;
    let mut sink = [0u8; 16384];
    let mut drained = 0;
    while drained < DRAIN_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// How long, and how much, is read and discarded after a response before closing.
const DRAIN_TIME: Duration = Duration::from_millis(500);
const DRAIN_BYTES: usize = 2 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `max` bytes per call, as a socket with a full buffer does.
    struct Trickle {
        out: Vec<u8>,
        max: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.max);
            self.out.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_response_is_written_whole_however_the_socket_takes_it() {
        let resp = Response::new(200, "text/plain", b"0123456789".repeat(100));
        for max in [1, 7, 64, 100_000] {
            let mut w = Trickle {
                out: Vec::new(),
                max,
            };
            write_response(&mut w, &resp, false).unwrap();
            let head = head(&resp);
            assert_eq!(&w.out[..head.len()], &head[..]);
            assert_eq!(&w.out[head.len()..], &resp.body[..], "max {max}");
            let mut h = Trickle {
                out: Vec::new(),
                max,
            };
            write_response(&mut h, &resp, true).unwrap();
            assert_eq!(
                h.out, head,
                "HEAD: the head alone, its Content-Length the body's"
            );
        }
    }

    struct Hello;
    impl Handler for Hello {
        fn handle(&self, req: &Request) -> Response {
            Response::new(200, "text/plain", format!("hello {}", req.path))
        }
    }

    fn server(limits: Limits) -> (std::net::SocketAddr, Arc<HttpCounters>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = Arc::new(HttpCounters::default());
        spawn(l, Arc::new(Hello), limits, c.clone()).unwrap();
        (addr, c)
    }

    fn exchange(addr: std::net::SocketAddr, data: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(data).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn answers_and_refuses() {
        let (addr, c) = server(Limits {
            max_head_bytes: 256,
            head_timeout: Duration::from_millis(300),
            ..Limits::default()
        });
        let r = exchange(addr, b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.ends_with("hello /x"), "{r}");
        let r = exchange(addr, b"HEAD /x HTTP/1.1\r\n\r\n");
        assert!(
            r.contains("Content-Length: 8") && !r.contains("hello"),
            "{r}"
        );
        let r = exchange(addr, b"garbage\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        let r = exchange(addr, b"DELETE / HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405"), "{r}");
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(300));
        let r = exchange(addr, big.as_bytes());
        assert!(r.starts_with("HTTP/1.1 431"), "{r}");
        // A head that never ends: cut off at the deadline.
        let t = Instant::now();
        let r = exchange(addr, b"GET / HTTP/1.1\r\n");
        assert!(r.starts_with("HTTP/1.1 408"), "{r}");
        assert!(t.elapsed() < Duration::from_secs(3));
        assert_eq!(c.refused(Refusal::BadRequest), 1);
        assert_eq!(c.refused(Refusal::MethodNotAllowed), 1);
        assert_eq!(c.refused(Refusal::HeadTooLarge), 1);
        assert_eq!(c.refused(Refusal::Timeout), 1);
        assert!(c.responses().contains(&(200, 2)));
    }

    #[test]
    fn bounded_connections() {
        let (addr, c) = server(Limits {
            max_connections: 2,
            head_timeout: Duration::from_secs(2),
            ..Limits::default()
        });
        // Two idle connections hold both slots.
        let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let deadline = Instant::now() + Duration::from_secs(2);
        while c.active() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let r = exchange(addr, b"GET / HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert_eq!(c.refused(Refusal::TooManyConnections), 1);
        drop(idle);
        // Freed again: served.
        let deadline = Instant::now() + Duration::from_secs(3);
        while c.active() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let r = exchange(addr, b"GET / HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
}
