//! The control port: line-oriented text over TCP (docs/control-language.md, "The control port").

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};
use vnet_control::{MAX_LINE_LEN, MAX_SCRIPT_LINES};

use crate::daemon::Daemon;

const MAX_CONNECTIONS: usize = 32;
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

pub fn serve(listener: TcpListener, daemon: Arc<Daemon>, token: Option<String>) {
    let active = Arc::new(AtomicUsize::new(0));
    let token = Arc::new(token);
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        if active.load(SeqCst) >= MAX_CONNECTIONS {
            daemon.control_errors.fetch_add(1, Relaxed);
            let _ = (&stream).write_all(b"error too many control connections\n");
            continue;
        }
        active.fetch_add(1, SeqCst);
        let (d, t, a) = (daemon.clone(), token.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                let peer = stream.peer_addr().ok();
                if let Err(e) = handle(stream, &d, t.as_deref()) {
                    debug!(?peer, "control connection ended: {e}");
                }
                a.fetch_sub(1, SeqCst);
            });
        if spawned.is_err() {
            active.fetch_sub(1, SeqCst);
        }
    }
}

enum Line {
    Text(String),
    Eof,
    TooLong,
    NotUtf8,
}

fn read_line(r: &mut impl BufRead) -> std::io::Result<Line> {
    let mut buf = Vec::new();
    let n = r
        .by_ref()
        .take(MAX_LINE_LEN as u64 + 1)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(Line::Eof);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    } else if buf.len() > MAX_LINE_LEN {
        return Ok(Line::TooLong);
    }
    Ok(match String::from_utf8(buf) {
        Ok(s) => Line::Text(s),
        Err(_) => Line::NotUtf8,
    })
}

fn reply(w: &mut impl Write, r: Result<String, String>) -> std::io::Result<()> {
    match r {
        Ok(out) => {
            let lines: Vec<&str> = out.lines().collect();
            let mut s = format!("ok {}\n", lines.len());
            for l in lines {
                s.push_str(l);
                s.push('\n');
            }
            w.write_all(s.as_bytes())
        }
        Err(e) => w.write_all(format!("error {}\n", e.replace('\n', " ")).as_bytes()),
    }
}

/// Compares without an early exit, so timing does not reveal how much of a guess was right.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

fn handle(stream: TcpStream, daemon: &Daemon, token: Option<&str>) -> std::io::Result<()> {
    let peer: Option<SocketAddr> = stream.peer_addr().ok();
    stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    let mut authed = token.is_none();
    let bad = |what: &str| {
        daemon.control_errors.fetch_add(1, Relaxed);
        warn!(?peer, "control: {what}");
    };
    loop {
        let line = match read_line(&mut r)? {
            Line::Eof => return Ok(()),
            Line::TooLong => {
                bad("line too long; closing");
                return reply(
                    &mut w,
                    Err(format!("line longer than {MAX_LINE_LEN} bytes")),
                );
            }
            Line::NotUtf8 => {
                bad("line is not UTF-8");
                reply(&mut w, Err("line is not UTF-8 text".into()))?;
                continue;
            }
            Line::Text(t) => t,
        };
        let mut words = line.split_whitespace();
        let first = words.next();
        if first == Some("auth") {
            let given = words.next().unwrap_or("");
            match token {
                Some(t) if !same_secret(t, given) => {
                    bad("authentication failed");
                    return reply(&mut w, Err("authentication failed".into()));
                }
                _ => {
                    authed = true;
                    reply(&mut w, Ok(String::new()))?;
                }
            }
            continue;
        }
        if !authed {
            bad("command before authentication");
            return reply(&mut w, Err("authentication failed".into()));
        }
        let result = if first == Some("batch") {
            let n = match words.next().map(str::parse::<usize>) {
                Some(Ok(n)) if n <= MAX_SCRIPT_LINES => n,
                _ => {
                    bad("bad batch header");
                    reply(
                        &mut w,
                        Err(format!("batch needs a line count up to {MAX_SCRIPT_LINES}")),
                    )?;
                    continue;
                }
            };
            let mut script = String::new();
            for _ in 0..n {
                match read_line(&mut r)? {
                    Line::Text(t) => {
                        script.push_str(&t);
                        script.push('\n');
                    }
                    Line::Eof => return Ok(()),
                    Line::TooLong | Line::NotUtf8 => {
                        bad("bad line in batch; closing");
                        return reply(
                            &mut w,
                            Err("bad line in batch (too long or not UTF-8)".into()),
                        );
                    }
                }
            }
            daemon.execute_script(&script)
        } else {
            daemon.execute_line(&line)
        };
        if result.is_err() {
            daemon.control_errors.fetch_add(1, Relaxed);
        }
        reply(&mut w, result)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert!(!same_secret("", "x"));
    }

    #[test]
    fn bounded_lines() {
        let mut r = std::io::Cursor::new(b"show stats\r\nx\n".to_vec());
        assert!(matches!(read_line(&mut r).unwrap(), Line::Text(t) if t == "show stats"));
        assert!(matches!(read_line(&mut r).unwrap(), Line::Text(t) if t == "x"));
        assert!(matches!(read_line(&mut r).unwrap(), Line::Eof));
        let mut r = std::io::Cursor::new(vec![b'a'; MAX_LINE_LEN + 10]);
        assert!(matches!(read_line(&mut r).unwrap(), Line::TooLong));
        let mut r = std::io::Cursor::new(vec![0xff, b'\n']);
        assert!(matches!(read_line(&mut r).unwrap(), Line::NotUtf8));
    }
}
