//! One connection to vnetd's control port, with timeouts: `auth`, commands, atomic batches and
//! `show ... json`. The bytes are the grammar's ([`crate::protocol`]); this only moves them.
//!
//! A connection the daemon closed before it authenticated, to make room for newer ones
//! ([`protocol::EVICTED`]: someone floods the port with connections that never authenticate),
//! ran nothing: the client connects again and sends the same request, a few times.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::protocol::{self, read_answer, Request};
use crate::Error;

/// How many times a request the daemon closed unrun ([`protocol::EVICTED`]) is sent again.
const EVICTED_RETRIES: u32 = 8;

/// A connection to vnetd's control port.
pub struct Control {
    r: BufReader<TcpStream>,
    w: TcpStream,
    addr: SocketAddr,
    timeout: Duration,
    /// No answer came on this connection yet: a refusal as evicted means nothing ran.
    fresh: bool,
}

fn open(addr: SocketAddr, timeout: Duration) -> Result<(BufReader<TcpStream>, TcpStream), Error> {
    let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| Error::Unreachable(addr, e))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok((BufReader::new(s.try_clone()?), s))
}

impl Control {
    /// Connects within `timeout` (which also bounds every later read and write) and presents
    /// `token` when one is given.
    pub fn connect(
        addr: SocketAddr,
        timeout: Duration,
        token: Option<&str>,
    ) -> Result<Control, Error> {
        let (r, w) = open(addr, timeout)?;
        let mut c = Control {
            r,
            w,
            addr,
            timeout,
            fresh: true,
        };
        if let Some(t) = token {
            c.auth(t)?;
        }
        Ok(c)
    }

    /// Sends one request and reads its answer: the output lines. Sent again on a new
    /// connection when the daemon closed this one unrun (see the module's header).
    pub fn call(&mut self, request: &Request) -> Result<Vec<String>, Error> {
        let mut retries = 0;
        loop {
            self.w.write_all(request.as_bytes())?;
            match read_answer(&mut self.r) {
                Err(Error::Refused(m))
                    if m == protocol::EVICTED && self.fresh && retries < EVICTED_RETRIES =>
                {
                    retries += 1;
                    std::thread::sleep(Duration::from_millis(5 << retries.min(6)));
                    (self.r, self.w) = open(self.addr, self.timeout)?;
                }
                answer => {
                    self.fresh = false;
                    return answer;
                }
            }
        }
    }

    /// `auth TOKEN`.
    pub fn auth(&mut self, token: &str) -> Result<(), Error> {
        self.call(&Request::auth(token)?).map(drop)
    }

    /// One command; Ok is its output lines.
    pub fn command(&mut self, line: &str) -> Result<Vec<String>, Error> {
        self.call(&Request::command(line)?)
    }

    /// A script applied atomically (all of it or nothing); Ok is its output lines.
    pub fn batch<S: AsRef<str>>(&mut self, lines: &[S]) -> Result<Vec<String>, Error> {
        self.call(&Request::batch(lines)?)
    }

    /// A `show WHAT json` answer, parsed.
    pub fn show_json(&mut self, what: &str) -> Result<serde_json::Value, Error> {
        let out = self.command(&format!("show {what} json"))?.join("\n");
        serde_json::from_str(&out).map_err(|e| Error::BadAnswer(format!("show {what}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Read};
    use std::net::TcpListener;
    use std::thread::JoinHandle;

    /// A fake vnetd that answers each request line it reads from `script` (request line,
    /// answer), and returns what it read in all.
    fn fake(script: Vec<(&'static str, &'static str)>) -> (SocketAddr, JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let h = std::thread::spawn(move || {
            let (s, _) = l.accept().expect("accept");
            let mut w = s.try_clone().expect("clone");
            let mut r = BufReader::new(s);
            let mut seen = String::new();
            for (want, answer) in script {
                let mut line = String::new();
                r.read_line(&mut line).expect("read");
                assert_eq!(line.trim_end(), want);
                seen.push_str(&line);
                w.write_all(answer.as_bytes()).expect("answer");
            }
            let _ = r.read_to_string(&mut seen);
            seen
        });
        (addr, h)
    }

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn a_session_authenticates_then_commands_and_parses_json() {
        let (addr, server) = fake(vec![
            ("auth s3cret", "ok 0\n"),
            ("show interfaces json", "ok 1\n[{\"name\":\"vm1\"}]\n"),
            ("interface del vm9", "error no interface vm9\n"),
            ("show stats", "ok 2\na\nb\n"),
        ]);
        let mut c = Control::connect(addr, T, Some("s3cret")).expect("connect");
        let v = c.show_json("interfaces").expect("json");
        assert_eq!(v[0]["name"], "vm1");
        assert!(matches!(
            c.command("interface del vm9"),
            Err(Error::Refused(m)) if m == "no interface vm9"
        ));
        assert_eq!(c.command("show stats").expect("stats"), ["a", "b"]);
        drop(c);
        server.join().expect("server");
    }

    /// Closed unrun while waiting to authenticate: connected again, the same request sent
    /// again; once an answer came, such a refusal is the daemon's answer (nothing is resent).
    #[test]
    fn a_connection_closed_unrun_is_made_again() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let evicted = format!("error {}\n", protocol::EVICTED);
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for answer in [evicted.as_str(), evicted.as_str(), "ok 0\n"] {
                let (s, _) = l.accept().expect("accept");
                let mut w = s.try_clone().expect("clone");
                let mut r = BufReader::new(s);
                let mut line = String::new();
                r.read_line(&mut line).expect("read");
                seen.push(line);
                w.write_all(answer.as_bytes()).expect("answer");
                if answer == "ok 0\n" {
                    // The same connection: a refusal now is an answer.
                    let mut line = String::new();
                    r.read_line(&mut line).expect("read");
                    seen.push(line);
                    w.write_all(format!("error {}\n", protocol::EVICTED).as_bytes())
                        .expect("answer");
                }
            }
            seen
        });
        let mut c = Control::connect(addr, T, Some("s3cret")).expect("connect");
        assert!(matches!(
            c.command("show stats"),
            Err(Error::Refused(m)) if m == protocol::EVICTED
        ));
        assert_eq!(
            server.join().expect("server"),
            [
                "auth s3cret\n",
                "auth s3cret\n",
                "auth s3cret\n",
                "show stats\n"
            ]
        );
    }

    #[test]
    fn a_refused_token_is_a_refusal() {
        let (addr, server) = fake(vec![("auth wrong", "error authentication failed\n")]);
        assert!(matches!(
            Control::connect(addr, T, Some("wrong")),
            Err(Error::Refused(m)) if m == "authentication failed"
        ));
        server.join().expect("server");
    }

    #[test]
    fn nothing_listening_is_unreachable() {
        // A port that was just free: bound, then closed.
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("addr");
        assert!(matches!(
            Control::connect(addr, T, None),
            Err(Error::Unreachable(a, _)) if a == addr
        ));
    }

    #[test]
    fn a_silent_daemon_is_an_io_error_within_the_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let t0 = std::time::Instant::now();
        let mut c = Control::connect(addr, Duration::from_millis(200), None).expect("connect");
        assert!(matches!(c.command("show stats"), Err(Error::Io(_))));
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        drop(l);
    }

    #[test]
    fn an_oversized_batch_is_refused_before_a_byte_is_sent() {
        let (addr, server) = fake(vec![]);
        let mut c = Control::connect(addr, T, None).expect("connect");
        let big = vec!["x".repeat(4000); 300];
        assert!(matches!(c.batch(&big), Err(Error::Request(_))));
        drop(c);
        assert_eq!(server.join().expect("server"), "");
    }
}
