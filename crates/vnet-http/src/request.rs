//! The head of an HTTP/1.1 request, parsed from bytes with hard limits (pure).
//!
//! The listener serves a few read-only GET resources, so it needs the request line and three
//! headers (`Host`, `Authorization`, `Accept`); everything else is skipped after a syntax
//! check. Anything a well-behaved client never sends (obsolete line folding, a header without
//! a colon, control characters, over-long lines, too many headers) is refused with an error
//! the listener answers and counts, never a panic or an unbounded buffer: the caller hands in
//! at most `Limits::max_head_bytes`.

use thiserror::Error;

/// The largest request target accepted (path and query).
pub const MAX_TARGET_LEN: usize = 2048;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    /// Any other valid method token (answered 405).
    Other,
}

/// What the listener needs of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: Method,
    /// The path, without the query (`/metrics`).
    pub path: String,
    /// The query string without `?` (empty when none).
    pub query: String,
    pub host: Option<String>,
    pub authorization: Option<String>,
    pub accept: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HeadError {
    #[error("bad request line")]
    RequestLine,
    #[error("unsupported HTTP version")]
    Version,
    #[error("request target too long or not absolute")]
    Target,
    #[error("malformed header line")]
    Header,
    #[error("too many header lines")]
    TooManyHeaders,
    #[error("header field given twice")]
    Duplicate,
    #[error("request head is not complete")]
    Incomplete,
}

/// Where the head ends: the index just past the blank line (`\r\n\r\n`, or `\n\n` from lax
/// clients), or None while it has not arrived.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == b'\n' {
            if buf.get(i + 1) == Some(&b'\n') {
                return Some(i + 2);
            }
            if buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// Parses a complete head (what [`head_end`] delimited) with at most `max_headers` fields.
pub fn parse_head(head: &[u8], max_headers: usize) -> Result<Request, HeadError> {
    if head_end(head) != Some(head.len()) {
        return Err(HeadError::Incomplete);
    }
    // Without the final line break, the last line is the blank one.
    let body = &head[..head.len() - 1];
    let mut lines = body
        .split(|&c| c == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let first = lines.next().ok_or(HeadError::Incomplete)?;
    let mut parts = first.split(|&c| c == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::RequestLine);
    };
    if method.is_empty() || !method.iter().all(|&c| is_tchar(c)) {
        return Err(HeadError::RequestLine);
    }
    let method = match method {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        _ => Method::Other,
    };
    if version != b"HTTP/1.1" && version != b"HTTP/1.0" {
        return Err(HeadError::Version);
    }
    if target.is_empty()
        || target.len() > MAX_TARGET_LEN
        || target[0] != b'/'
        || !target.iter().all(|&c| c.is_ascii_graphic())
    {
        return Err(HeadError::Target);
    }
    // Graphic ASCII only, so this is valid UTF-8.
    let target = String::from_utf8_lossy(target);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target.to_string(), String::new()),
    };
    let mut req = Request {
        method,
        path,
        query,
        host: None,
        authorization: None,
        accept: None,
    };
    let mut count = 0;
    let mut ended = false;
    for line in lines {
        if line.is_empty() {
            ended = true;
            continue;
        }
        count += 1;
        if count > max_headers {
            return Err(HeadError::TooManyHeaders);
        }
        // Obsolete line folding (a line starting with white space) is refused (RFC 9112 5.2).
        let colon = line
            .iter()
            .position(|&c| c == b':')
            .ok_or(HeadError::Header)?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&c| is_tchar(c)) {
            return Err(HeadError::Header);
        }
        if !value
            .iter()
            .all(|&c| c == b'\t' || (0x20..0x7f).contains(&c) || c >= 0x80)
        {
            return Err(HeadError::Header);
        }
        let value = String::from_utf8_lossy(value).trim().to_string();
        let slot = if name.eq_ignore_ascii_case(b"host") {
            &mut req.host
        } else if name.eq_ignore_ascii_case(b"authorization") {
            &mut req.authorization
        } else if name.eq_ignore_ascii_case(b"accept") {
            &mut req.accept
        } else {
            continue;
        };
        if slot.is_some() {
            return Err(HeadError::Duplicate);
        }
        *slot = Some(value);
    }
    if !ended {
        return Err(HeadError::Incomplete);
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(s: &str) -> Result<Request, HeadError> {
        let b = s.as_bytes();
        let end = head_end(b).ok_or(HeadError::Incomplete)?;
        parse_head(&b[..end], 8)
    }

    #[test]
    fn a_plain_get() {
        let r = parse("GET /metrics?x=1 HTTP/1.1\r\nHost: 127.0.0.1:9300\r\nAuthorization: Bearer abc\r\nUser-Agent: t\r\n\r\n").unwrap();
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.path, "/metrics");
        assert_eq!(r.query, "x=1");
        assert_eq!(r.host.as_deref(), Some("127.0.0.1:9300"));
        assert_eq!(r.authorization.as_deref(), Some("Bearer abc"));
        assert_eq!(r.accept, None);
        let r = parse("HEAD / HTTP/1.0\n\n").unwrap();
        assert_eq!((r.method, r.path.as_str()), (Method::Head, "/"));
        assert_eq!(
            parse("POST / HTTP/1.1\r\n\r\n").unwrap().method,
            Method::Other
        );
    }

    #[test]
    fn the_end_of_the_head() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nbody"), Some(16));
        assert_eq!(head_end(b""), None);
    }

    #[test]
    fn refusals() {
        assert_eq!(parse("GET /\r\n\r\n"), Err(HeadError::RequestLine));
        assert_eq!(
            parse("GET  / HTTP/1.1\r\n\r\n"),
            Err(HeadError::RequestLine)
        );
        assert_eq!(parse("G(T / HTTP/1.1\r\n\r\n"), Err(HeadError::RequestLine));
        assert_eq!(parse("GET / HTTP/2\r\n\r\n"), Err(HeadError::Version));
        assert_eq!(parse("GET x HTTP/1.1\r\n\r\n"), Err(HeadError::Target));
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_TARGET_LEN));
        assert_eq!(parse(&long), Err(HeadError::Target));
        assert_eq!(
            parse("GET / HTTP/1.1\r\nNoColon\r\n\r\n"),
            Err(HeadError::Header)
        );
        assert_eq!(
            parse("GET / HTTP/1.1\r\n folded: x\r\n\r\n"),
            Err(HeadError::Header)
        );
        assert_eq!(
            parse("GET / HTTP/1.1\r\nA: \x01\r\n\r\n"),
            Err(HeadError::Header)
        );
        assert_eq!(
            parse("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"),
            Err(HeadError::Duplicate)
        );
        let many: String = (0..9).map(|i| format!("X-{i}: y\r\n")).collect();
        assert_eq!(
            parse(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
            Err(HeadError::TooManyHeaders)
        );
        assert_eq!(
            parse_head(b"GET / HTTP/1.1\r\n", 8),
            Err(HeadError::Incomplete)
        );
    }

    proptest! {
        // Whatever arrives, parsing ends in a request or an error.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Some(end) = head_end(&bytes) {
                let _ = parse_head(&bytes[..end], 8);
            }
            let _ = parse_head(&bytes, 8);
        }

        #[test]
        fn well_formed_heads_parse(path in "/[a-z0-9/._-]{0,40}", n in 0usize..8) {
            let headers: String = (0..n).map(|i| format!("X-H{i}: v{i}\r\n")).collect();
            let text = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n");
            let b = text.as_bytes();
            let r = parse_head(&b[..head_end(b).unwrap()], 9).unwrap();
            prop_assert_eq!(r.path, path);
            prop_assert_eq!(r.host.as_deref(), Some("localhost"));
        }
    }
}
