//! A client of vnetd's control port (docs/control-language.md, "The control port"): one
//! connection, optional `auth`, commands and atomic batches, with timeouts.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

const TIMEOUT: Duration = Duration::from_secs(10);
/// The longest answer line read (a `show` of a big configuration stays far below).
const MAX_LINE: u64 = 1 << 20;

#[derive(Debug, Error)]
pub enum CtlError {
    /// Nothing listens there (vnetd is not running).
    #[error("vnetd is not reachable at {0}: {1}")]
    Unreachable(SocketAddr, std::io::Error),
    #[error("talking to vnetd: {0}")]
    Io(#[from] std::io::Error),
    #[error("vnetd: {0}")]
    Refused(String),
    #[error("token file {0}: {1}")]
    Token(String, String),
}

pub struct Control {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

/// The token file the package makes (readable by root, as the plugin runs).
pub const DEFAULT_TOKEN_FILE: &str = "/etc/vnet/token";
/// Names a token file when the configuration has no `tokenFile`.
pub const TOKEN_FILE_ENV: &str = "VNET_TOKEN_FILE";

/// The token file to use, as vnetctl chooses it: the configuration's `tokenFile`, then
/// `$VNET_TOKEN_FILE` (unless empty), then the default when it exists; None: no token.
pub fn token_file(
    configured: Option<&Path>,
    env: Option<&OsStr>,
    default: &Path,
    default_exists: bool,
) -> Option<PathBuf> {
    if let Some(p) = configured {
        return Some(p.to_path_buf());
    }
    match env.filter(|e| !e.is_empty()) {
        Some(e) => Some(PathBuf::from(e)),
        None => default_exists.then(|| default.to_path_buf()),
    }
}

/// The token in a token file (one word).
pub fn read_token(path: &Path) -> Result<String, CtlError> {
    let t = std::fs::read_to_string(path)
        .map_err(|e| CtlError::Token(path.display().to_string(), e.to_string()))?;
    let t = t.trim();
    if t.is_empty() || t.contains(char::is_whitespace) {
        return Err(CtlError::Token(
            path.display().to_string(),
            "must hold one word".into(),
        ));
    }
    Ok(t.to_string())
}

impl Control {
    pub fn connect(addr: SocketAddr, token: Option<&str>) -> Result<Control, CtlError> {
        let s = TcpStream::connect_timeout(&addr, TIMEOUT)
            .map_err(|e| CtlError::Unreachable(addr, e))?;
        s.set_read_timeout(Some(TIMEOUT))?;
        s.set_write_timeout(Some(TIMEOUT))?;
        let mut c = Control {
            r: BufReader::new(s.try_clone()?),
            w: s,
        };
        if let Some(t) = token {
            c.command(&format!("auth {t}"))?;
        }
        Ok(c)
    }

    fn line(&mut self) -> Result<String, CtlError> {
        let mut buf = Vec::new();
        let n = Read::take(&mut self.r, MAX_LINE).read_until(b'\n', &mut buf)?;
        if n == 0 || buf.last() != Some(&b'\n') {
            return Err(CtlError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "vnetd closed the connection",
            )));
        }
        buf.pop();
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    fn answer(&mut self) -> Result<Vec<String>, CtlError> {
        let status = self.line()?;
        if let Some(msg) = status.strip_prefix("error ") {
            return Err(CtlError::Refused(msg.to_string()));
        }
        let n: usize = status
            .strip_prefix("ok ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| CtlError::Refused(format!("unexpected answer {status:?}")))?;
        (0..n).map(|_| self.line()).collect()
    }

    /// One command; Ok is its output lines.
    pub fn command(&mut self, line: &str) -> Result<Vec<String>, CtlError> {
        self.w.write_all(format!("{line}\n").as_bytes())?;
        self.answer()
    }

    /// A script applied atomically: all of it or nothing.
    pub fn batch(&mut self, lines: &[String]) -> Result<(), CtlError> {
        let mut text = format!("batch {}\n", lines.len());
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        self.w.write_all(text.as_bytes())?;
        self.answer().map(|_| ())
    }

    /// A `show ... json` answer, parsed.
    pub fn show_json(&mut self, what: &str) -> Result<serde_json::Value, CtlError> {
        let out = self.command(&format!("show {what} json"))?.join("\n");
        serde_json::from_str(&out).map_err(|e| CtlError::Refused(format!("show {what}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_wins_then_the_environment_then_an_existing_default() {
        let d = Path::new(DEFAULT_TOKEN_FILE);
        let (conf, env) = (Path::new("/x/conf"), OsStr::new("/x/env"));
        for exists in [true, false] {
            assert_eq!(
                token_file(Some(conf), Some(env), d, exists),
                Some(conf.into())
            );
            assert_eq!(token_file(Some(conf), None, d, exists), Some(conf.into()));
            assert_eq!(token_file(None, Some(env), d, exists), Some(env.into()));
        }
        assert_eq!(token_file(None, None, d, true), Some(d.into()));
        assert_eq!(token_file(None, None, d, false), None);
        assert_eq!(
            token_file(None, Some(OsStr::new("")), d, true),
            Some(d.into())
        );
    }
}
