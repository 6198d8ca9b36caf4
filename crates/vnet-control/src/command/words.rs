//! The word cursor every command parser reads from, and the checks of the values they take
//! (names, device names, paths, numbers, addresses): one place for each rule and its error text.

use std::net::{IpAddr, SocketAddr};

use vnet_wire::{MacAddr, VNI_MAX};

use crate::command::{Keyword, ParseError};

pub(super) fn err<T>(msg: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError(msg.into()))
}

/// Shortens untrusted text before quoting it back in an error.
pub(super) fn quote(s: &str) -> String {
    let t: String = s.chars().take(40).collect();
    format!("{t:?}")
}

pub(super) struct Words<'a> {
    pub(super) words: Vec<&'a str>,
    pub(super) pos: usize,
}

impl<'a> Words<'a> {
    pub(super) fn next(&mut self, what: &str) -> Result<&'a str, ParseError> {
        let w = self.words.get(self.pos).copied();
        self.pos += 1;
        w.ok_or_else(|| ParseError(format!("missing {what}")))
    }

    pub(super) fn peek(&self) -> Option<&'a str> {
        self.words.get(self.pos).copied()
    }

    pub(super) fn end(&self) -> Result<(), ParseError> {
        match self.peek() {
            None => Ok(()),
            Some(w) => err(format!("unexpected {}", quote(w))),
        }
    }
}

/// The error for a keyword a parser does not know: `unknown WHAT "word" (CHOICES)`.
pub(super) fn unknown<T>(what: &str, word: &str, choices: &str) -> Result<T, ParseError> {
    err(format!("unknown {what} {} ({choices})", quote(word)))
}

/// The value of `T` written `word`, or the `unknown` error that lists `T`'s keywords.
pub(super) fn keyword<T: Keyword>(word: &str, what: &str) -> Result<T, ParseError> {
    match T::ALL.iter().find(|v| v.to_string() == word) {
        Some(&v) => Ok(v),
        None => {
            let choices: Vec<String> = T::ALL.iter().map(|v| v.to_string()).collect();
            unknown(what, word, &choices.join(", "))
        }
    }
}

pub(super) fn set_once<T>(slot: &mut Option<T>, v: T, opt: &str) -> Result<(), ParseError> {
    if slot.is_some() {
        return err(format!("option {opt} given twice"));
    }
    *slot = Some(v);
    Ok(())
}

/// `s` itself when `ok`, else the error `invalid WHAT 's'RULE`.
fn checked(s: &str, ok: bool, what: &str, rule: &str) -> Result<String, ParseError> {
    if ok {
        Ok(s.to_string())
    } else {
        err(format!("invalid {what} {}{rule}", quote(s)))
    }
}

pub(super) fn name(s: &str) -> Result<String, ParseError> {
    let ok = !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"_-.".contains(&c))
        && !matches!(
            s,
            "add" | "del" | "any" | "not" | "broadcast" | "interface" | "link"
        );
    checked(
        s,
        ok,
        "name",
        " (1 to 32 of A-Z a-z 0-9 _ - ., not a keyword)",
    )
}

/// One file name of at most `max` printable bytes (a device under `/sys/class/net`, a
/// namespace under `/run/netns`): never `.`, `..` or anything with a `/`.
fn file_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s != "."
        && s != ".."
        && s.bytes().all(|c| c.is_ascii_graphic() && c != b'/')
}

pub(super) fn ifname(s: &str) -> Result<String, ParseError> {
    let ok = file_name(s, 15) && !s.contains(':');
    checked(
        s,
        ok,
        "device name",
        " (1 to 15 printable characters, no / or :)",
    )
}

pub(super) fn socket_path(s: &str) -> Result<String, ParseError> {
    let ok = s.starts_with('/')
        && s.len() <= 107
        && !s.split('/').any(|c| c == "..")
        && s.bytes().all(|c| c.is_ascii_graphic());
    checked(
        s,
        ok,
        "socket path",
        " (absolute, at most 107 bytes, no ..)",
    )
}

pub(super) fn netns(s: &str) -> Result<String, ParseError> {
    checked(s, file_name(s, 64), "namespace name", "")
}

pub(super) fn mac(s: &str) -> Result<MacAddr, ParseError> {
    s.parse::<MacAddr>().map_err(|e| ParseError(e.to_string()))
}

pub(super) fn number(s: &str, what: &str, lo: u32, hi: u32) -> Result<u32, ParseError> {
    match s.parse::<u32>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => err(format!(
            "invalid {what} {} (must be {lo} to {hi})",
            quote(s)
        )),
    }
}

pub(super) fn mtu(s: &str) -> Result<u32, ParseError> {
    number(s, "MTU", 68, 65535)
}

pub(super) fn vni(s: &str) -> Result<u32, ParseError> {
    number(s, "VNI", 1, VNI_MAX)
}

pub(super) fn on_off(s: &str) -> Result<bool, ParseError> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        o => err(format!("expected on or off, not {}", quote(o))),
    }
}

pub(super) fn ip(s: &str) -> Result<IpAddr, ParseError> {
    let t = s.trim_start_matches('[').trim_end_matches(']');
    match t.parse::<IpAddr>() {
        Ok(a) if !a.is_unspecified() && !a.is_multicast() => Ok(a),
        _ => err(format!("invalid IP address {}", quote(s))),
    }
}

/// `IP:PORT`, or `IP` alone when a default port is given.
pub(super) fn socket_addr(s: &str, default_port: Option<u16>) -> Result<SocketAddr, ParseError> {
    let addr = match (s.parse::<SocketAddr>(), default_port) {
        (Ok(a), _) => a,
        (Err(_), Some(p)) => SocketAddr::new(ip(s)?, p),
        (Err(_), None) => return err(format!("invalid address {} (expected IP:PORT)", quote(s))),
    };
    if addr.port() == 0 || addr.ip().is_multicast() {
        return err(format!(
            "invalid address {} (port 0 or multicast IP)",
            quote(s)
        ));
    }
    Ok(addr)
}
