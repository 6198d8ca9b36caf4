//! The control port's grammar (docs/control-language.md, "The control port"), both ways, in
//! one place: the daemon encodes its answers here, the client encodes its requests and reads
//! the answers here, and `tests/vectors/control-port.txt` pins it for the Python mirror
//! (`vnetlab/control.py`'s `ControlClient`) too.
//!
//! A request is a line: a command, `auth TOKEN`, or `batch N` and the N lines of a script.
//! An answer is `ok N` and N lines of output, or `error MESSAGE` (one line).

use std::io::{BufRead, Read};

use crate::Error;

/// The most bytes of one batch's lines (newlines included) the daemon takes.
pub const MAX_BATCH_BYTES: usize = 1 << 20;
/// The most lines of one batch the daemon takes (`vnet_control::MAX_SCRIPT_LINES`).
pub const MAX_BATCH_LINES: usize = 100_000;
/// The daemon's refusal of a connection it closed while the connection waited to
/// authenticate (or, without a token, to send its first line), to make room for newer ones:
/// nothing the connection sent was run, so a client connects again and sends it again.
pub const EVICTED: &str =
    "closed while waiting to authenticate (too many connections waiting): connect again";

/// The longest answer line the client reads (a `show ... json` is one line; a big
/// configuration's stays far below).
pub const MAX_ANSWER_LINE: usize = 64 << 20;

/// The bytes of one request, checked before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request(String);

impl Request {
    /// One command (one line).
    pub fn command(line: &str) -> Result<Request, Error> {
        if line.contains('\n') {
            return Err(Error::Request("a command is one line".into()));
        }
        Ok(Request(format!("{line}\n")))
    }

    /// `auth TOKEN`: the token is one word.
    pub fn auth(token: &str) -> Result<Request, Error> {
        if token.is_empty() || token.contains(char::is_whitespace) {
            return Err(Error::Request("a token is one word".into()));
        }
        Ok(Request(format!("auth {token}\n")))
    }

    /// `batch N` and the script's lines, applied by the daemon all or nothing; refused here
    /// when the daemon would refuse it (it would then read the lines as single commands).
    pub fn batch<S: AsRef<str>>(lines: &[S]) -> Result<Request, Error> {
        let bytes: usize = lines.iter().map(|l| l.as_ref().len() + 1).sum();
        if bytes > MAX_BATCH_BYTES {
            return Err(Error::Request(format!(
                "the script is {bytes} bytes; vnetd takes at most {MAX_BATCH_BYTES} (1 MiB) at once: split it"
            )));
        }
        if lines.len() > MAX_BATCH_LINES {
            return Err(Error::Request(format!(
                "the script has {} lines; vnetd takes at most {MAX_BATCH_LINES} at once: split it",
                lines.len()
            )));
        }
        let mut text = format!("batch {}\n", lines.len());
        for l in lines {
            let l = l.as_ref();
            if l.contains('\n') {
                return Err(Error::Request("a script line is one line".into()));
            }
            text.push_str(l);
            text.push('\n');
        }
        Ok(Request(text))
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// The daemon's answer to one request: `ok N` and the output's lines, or `error MESSAGE`
/// (a message of several lines joined into one).
pub fn answer(result: Result<&str, &str>) -> String {
    match result {
        Ok(out) => {
            let lines: Vec<&str> = out.lines().collect();
            let mut s = format!("ok {}\n", lines.len());
            for l in lines {
                s.push_str(l);
                s.push('\n');
            }
            s
        }
        Err(e) => format!("error {}\n", e.replace('\n', " ")),
    }
}

/// What an answer's first line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// `ok N`: N lines of output follow.
    Ok(usize),
    /// `error MESSAGE`.
    Refused(String),
}

/// Reads a status line (without its newline).
pub fn status(line: &str) -> Result<Status, Error> {
    if let Some(msg) = line.strip_prefix("error ") {
        return Ok(Status::Refused(msg.to_string()));
    }
    match line.strip_prefix("ok ") {
        // Digits only: `+1` or ` 1` are not the daemon's.
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => n
            .parse()
            .map(Status::Ok)
            .map_err(|_| Error::BadAnswer(line.to_string())),
        _ => Err(Error::BadAnswer(line.to_string())),
    }
}

/// Reads one answer line (at most `max` bytes, its newline taken off).
fn line(r: &mut impl BufRead, max: usize) -> Result<String, Error> {
    let mut buf = Vec::new();
    let n = r.take(max as u64 + 1).read_until(b'\n', &mut buf)?;
    if buf.last() != Some(&b'\n') {
        if n > max {
            return Err(Error::BadAnswer(format!("a line longer than {max} bytes")));
        }
        return Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "vnetd closed the connection",
        )));
    }
    buf.pop();
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Reads one answer: its output lines, or the daemon's refusal.
pub fn read_answer(r: &mut impl BufRead) -> Result<Vec<String>, Error> {
    read_answer_within(r, MAX_ANSWER_LINE)
}

fn read_answer_within(r: &mut impl BufRead, max: usize) -> Result<Vec<String>, Error> {
    match status(&line(r, max)?)? {
        Status::Refused(msg) => Err(Error::Refused(msg)),
        // Lines are read one by one: a lying count costs only what the daemon sends.
        Status::Ok(n) => (0..n).map(|_| line(r, max)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn requests_are_refused_before_anything_is_sent_when_vnetd_would_refuse_them() {
        assert!(matches!(Request::command("a\nb"), Err(Error::Request(_))));
        assert!(matches!(Request::auth("two words"), Err(Error::Request(_))));
        assert!(matches!(Request::auth(""), Err(Error::Request(_))));
        assert!(matches!(
            Request::batch(&["ok", "a\nb"]),
            Err(Error::Request(_))
        ));
        // Just at the byte bound it goes; one byte more does not.
        let line = "x".repeat(1023);
        let at = vec![line.as_str(); MAX_BATCH_BYTES / 1024];
        assert!(Request::batch(&at).is_ok());
        let mut over = at.clone();
        over.push("");
        let e = Request::batch(&over).unwrap_err();
        assert!(e.to_string().contains("1 MiB"), "{e}");
        // The line bound, with lines small enough to pass the byte bound.
        let many = vec![""; MAX_BATCH_LINES + 1];
        let e = Request::batch(&many).unwrap_err();
        assert!(e.to_string().contains("lines"), "{e}");
        assert!(Request::batch(&many[1..]).is_ok());
    }

    #[test]
    fn the_daemons_answer_reads_back() {
        for out in ["", "one\n", "one\ntwo\n", "no newline at the end"] {
            let a = answer(Ok(out));
            let back = read_answer(&mut Cursor::new(a.as_bytes())).expect("ok");
            assert_eq!(back, out.lines().collect::<Vec<_>>());
        }
        let a = answer(Err("two\nlines"));
        assert!(matches!(
            read_answer(&mut Cursor::new(a.as_bytes())),
            Err(Error::Refused(m)) if m == "two lines"
        ));
    }

    #[test]
    fn status_lines() {
        assert_eq!(status("ok 0").ok(), Some(Status::Ok(0)));
        assert_eq!(status("ok 12").ok(), Some(Status::Ok(12)));
        assert_eq!(
            status("error no such thing").ok(),
            Some(Status::Refused("no such thing".into()))
        );
        for bad in [
            "",
            "ok",
            "ok ",
            "ok +1",
            "ok -1",
            "ok 1 2",
            "ok 99999999999999999999999",
            "error",
            "OK 1",
        ] {
            assert!(matches!(status(bad), Err(Error::BadAnswer(_))), "{bad:?}");
        }
    }

    #[test]
    fn an_answer_cut_short_or_too_long_is_an_error_not_a_hang_or_a_heap() {
        for cut in ["", "ok 2\none\n", "ok 1\nno newline"] {
            assert!(
                matches!(read_answer(&mut Cursor::new(cut)), Err(Error::Io(_))),
                "{cut:?}"
            );
        }
        let long = format!("ok 1\n{}\n", "x".repeat(17));
        assert!(matches!(
            read_answer_within(&mut Cursor::new(long.as_str()), 16),
            Err(Error::BadAnswer(_))
        ));
        let fits = format!("ok 1\n{}\n", "x".repeat(16));
        assert!(read_answer_within(&mut Cursor::new(fits.as_str()), 16).is_ok());
    }
}
