//! What one direction of the emulated path does to frames, and its textual form on the command
//! line (`delay=10ms,jitter=1ms,loss=0.5%,rate=100mbit,limit=1000`). Pure: parsed and checked
//! here so the forwarder never sees an impossible setting.

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;

/// The impairment of one direction.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Impairment {
    /// Fixed one-way delay added to every frame.
    #[serde(serialize_with = "as_us")]
    pub delay: Duration,
    /// Each frame's delay varies uniformly in `delay ± jitter` (clamped at zero).
    #[serde(serialize_with = "as_us")]
    pub jitter: Duration,
    /// Probability (0..=1) that a frame is dropped, independently of the others.
    pub loss: f64,
    /// The bottleneck's rate in bit/s (`None`: no rate limit).
    pub rate_bps: Option<u64>,
    /// Frames may leave in the order of their (jittered) departure times, not arrival order.
    pub reorder: bool,
    /// At most this many frames held (waiting for the bottleneck or in the delay line).
    pub limit_packets: usize,
    /// At most this many bytes held.
    pub limit_bytes: usize,
}

fn as_us<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e6)
}

impl Default for Impairment {
    fn default() -> Self {
        Impairment {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            loss: 0.0,
            rate_bps: None,
            reorder: false,
            limit_packets: 10_000,
            limit_bytes: 32 << 20,
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum SpecError {
    #[error("`{0}` is not KEY=VALUE")]
    NotKeyValue(String),
    #[error("unknown key `{0}` (delay, jitter, loss, rate, limit, limit-bytes, reorder)")]
    UnknownKey(String),
    #[error("bad duration `{0}` (a number with ns, us, ms or s)")]
    Duration(String),
    #[error("bad loss `{0}` (a fraction 0..1 or a percentage such as 0.5%)")]
    Loss(String),
    #[error("bad rate `{0}` (a number with bit, kbit, mbit or gbit)")]
    Rate(String),
    #[error("bad number `{0}`")]
    Number(String),
    #[error("limits must be at least 1 frame and 1 byte")]
    ZeroLimit,
}

/// Parses `KEY=VALUE,...` over `base` (keys not named keep `base`'s values).
pub fn parse(spec: &str, base: &Impairment) -> Result<Impairment, SpecError> {
    let mut imp = base.clone();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = match item.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None if item == "reorder" => ("reorder", "on"),
            None => return Err(SpecError::NotKeyValue(item.to_string())),
        };
        match k {
            "delay" => imp.delay = duration(v)?,
            "jitter" => imp.jitter = duration(v)?,
            "loss" => imp.loss = loss(v)?,
            "rate" => imp.rate_bps = rate(v)?,
            "limit" => imp.limit_packets = number(v)?,
            "limit-bytes" => imp.limit_bytes = number(v)?,
            "reorder" => {
                imp.reorder = match v {
                    "on" | "yes" | "true" | "1" => true,
                    "off" | "no" | "false" | "0" => false,
                    _ => return Err(SpecError::NotKeyValue(item.to_string())),
                }
            }
            _ => return Err(SpecError::UnknownKey(k.to_string())),
        }
    }
    if imp.limit_packets == 0 || imp.limit_bytes == 0 {
        return Err(SpecError::ZeroLimit);
    }
    Ok(imp)
}

fn split_unit(s: &str) -> (&str, &str) {
    let i = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    (&s[..i], s[i..].trim())
}

/// `10ms`, `500us`, `1.5s`, `250ns`; a bare number is milliseconds (as in netem).
pub fn duration(s: &str) -> Result<Duration, SpecError> {
    let bad = || SpecError::Duration(s.to_string());
    let (n, unit) = split_unit(s);
    let n: f64 = n.parse().map_err(|_| bad())?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" | "" => 1e-3,
        "s" => 1.0,
        _ => return Err(bad()),
    };
    let secs = n * scale;
    if !secs.is_finite() || !(0.0..=3600.0).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `0.5%` or `0.005`.
pub fn loss(s: &str) -> Result<f64, SpecError> {
    let bad = || SpecError::Loss(s.to_string());
    let p = match s.strip_suffix('%') {
        Some(pct) => pct.trim().parse::<f64>().map_err(|_| bad())? / 100.0,
        None => s.parse::<f64>().map_err(|_| bad())?,
    };
    if !(0.0..=1.0).contains(&p) {
        return Err(bad());
    }
    Ok(p)
}

/// `100mbit`, `1gbit`, `64kbit`, `5000bit`; `0` or `none` for no limit.
pub fn rate(s: &str) -> Result<Option<u64>, SpecError> {
    if s == "0" || s == "none" {
        return Ok(None);
    }
    let bad = || SpecError::Rate(s.to_string());
    let (n, unit) = split_unit(s);
    let n: f64 = n.parse().map_err(|_| bad())?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "bit" | "bps" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        _ => return Err(bad()),
    };
    let bps = n * scale;
    if !bps.is_finite() || !(1.0..=1e12).contains(&bps) {
        return Err(bad());
    }
    Ok(Some(bps as u64))
}

fn number(s: &str) -> Result<usize, SpecError> {
    s.parse().map_err(|_| SpecError::Number(s.to_string()))
}

impl fmt::Display for Impairment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "delay {:?} jitter {:?} loss {:.3}% rate {} limit {} frames / {} bytes{}",
            self.delay,
            self.jitter,
            self.loss * 100.0,
            self.rate_bps
                .map(|r| format!("{r} bit/s"))
                .unwrap_or_else(|| "unlimited".into()),
            self.limit_packets,
            self.limit_bytes,
            if self.reorder { " reorder" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key() {
        let i = parse(
            "delay=10ms, jitter=500us,loss=0.5%,rate=100mbit,limit=50,limit-bytes=9000,reorder",
            &Impairment::default(),
        )
        .unwrap();
        assert_eq!(i.delay, Duration::from_millis(10));
        assert_eq!(i.jitter, Duration::from_micros(500));
        assert!((i.loss - 0.005).abs() < 1e-12);
        assert_eq!(i.rate_bps, Some(100_000_000));
        assert_eq!(
            (i.limit_packets, i.limit_bytes, i.reorder),
            (50, 9000, true)
        );
    }

    #[test]
    fn keeps_the_base_for_keys_not_named() {
        let base = parse("delay=5ms,loss=0.1", &Impairment::default()).unwrap();
        let i = parse("jitter=1ms", &base).unwrap();
        assert_eq!(i.delay, Duration::from_millis(5));
        assert!((i.loss - 0.1).abs() < 1e-12);
        assert_eq!(i.jitter, Duration::from_millis(1));
    }

    #[test]
    fn refuses_nonsense() {
        let d = Impairment::default();
        assert!(matches!(parse("delay", &d), Err(SpecError::NotKeyValue(_))));
        assert!(matches!(
            parse("speed=1", &d),
            Err(SpecError::UnknownKey(_))
        ));
        assert!(matches!(
            parse("delay=-1ms", &d),
            Err(SpecError::Duration(_))
        ));
        assert!(matches!(
            parse("delay=10h", &d),
            Err(SpecError::Duration(_))
        ));
        assert!(matches!(
            parse("delay=1e400s", &d),
            Err(SpecError::Duration(_))
        ));
        assert!(matches!(parse("loss=101%", &d), Err(SpecError::Loss(_))));
        assert!(matches!(parse("loss=2", &d), Err(SpecError::Loss(_))));
        assert!(matches!(parse("rate=fast", &d), Err(SpecError::Rate(_))));
        assert!(matches!(parse("limit=0", &d), Err(SpecError::ZeroLimit)));
        assert!(matches!(parse("limit=-3", &d), Err(SpecError::Number(_))));
    }

    #[test]
    fn units() {
        assert_eq!(duration("3").unwrap(), Duration::from_millis(3));
        assert_eq!(duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(duration("250ns").unwrap(), Duration::from_nanos(250));
        assert_eq!(rate("64kbit").unwrap(), Some(64_000));
        assert_eq!(rate("1gbit").unwrap(), Some(1_000_000_000));
        assert_eq!(rate("none").unwrap(), None);
    }
}
