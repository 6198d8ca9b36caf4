//! An attacker for the encrypted-link flood test (`tests/system/test_crypto.py`): sends forged
//! handshake messages to one host's VXLAN port at a set rate, with a forged source address (a
//! raw IP socket, so it needs root, as the test has), and prints what it really sent.
//!
//! ```text
//! handshake_flood --src 10.99.0.1 --dst 10.99.0.2 --vni 1 --key <dst's public key> \
//!     --rate 10000 --secs 12 [--index-base N] [--index-span 32] [--sport 4789]
//! ```
//!
//! The attacker knows the target's public key (public keys are not secret; etcd publishes
//! them), so its v3 messages carry good `mac1`s: they reach the checks that come after it. Of
//! every ten messages: two v3 initiations with a good `mac1`, one with a bad one, a v2 and a
//! v1 initiation, two v3 responses with a good `mac1`, a v2 and a v1 response (responses go
//! to receiver indexes `--index-base` .. `+ --index-span`: indexes are handed out in order, so
//! one seen on the wire makes the next ones easy to guess), and a cookie reply; all random
//! beyond their headers (a fresh ephemeral key each time). Paced in 1 ms steps, catching up
//! when late. Prints one JSON line: messages sent, failed sends, seconds, the rate achieved.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use vnet_crypto::cookie::{add_macs, mac1_key};
use vnet_crypto::wire::{
    COOKIE_REPLY_LEN, INITIATION_LEN, INITIATION_V2_LEN, INITIATION_V3_LEN, MSG_COOKIE_REPLY,
    MSG_INITIATION, MSG_INITIATION_V2, MSG_INITIATION_V3, MSG_RESPONSE, MSG_RESPONSE_V2,
    MSG_RESPONSE_V3, RESPONSE_LEN, RESPONSE_V2_LEN, RESPONSE_V3_LEN,
};
use vnet_crypto::PublicKey;

struct Args {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    vni: u32,
    key: PublicKey,
    rate: u64,
    secs: f64,
    index_base: u32,
    index_span: u32,
    sport: u16,
}

fn parse() -> Result<Args, String> {
    let mut a: Vec<String> = std::env::args().skip(1).collect();
    let mut take = |name: &str| -> Result<Option<String>, String> {
        match a.iter().position(|x| x == name) {
            Some(i) if i + 1 < a.len() => {
                let v = a.remove(i + 1);
                a.remove(i);
                Ok(Some(v))
            }
            Some(_) => Err(format!("{name} needs a value")),
            None => Ok(None),
        }
    };
    fn need<T: std::str::FromStr>(name: &str, v: Option<String>) -> Result<T, String> {
        let v = v.ok_or(format!("{name} is required"))?;
        v.parse().map_err(|_| format!("{name}: bad value {v:?}"))
    }
    fn or<T: std::str::FromStr>(name: &str, v: Option<String>, d: T) -> Result<T, String> {
        match v {
            Some(_) => need(name, v),
            None => Ok(d),
        }
    }
    let args = Args {
        src: need("--src", take("--src")?)?,
        dst: need("--dst", take("--dst")?)?,
        vni: need("--vni", take("--vni")?)?,
        key: PublicKey::parse(&take("--key")?.ok_or("--key is required")?)
            .map_err(|e| format!("--key: {e}"))?,
        rate: need("--rate", take("--rate")?)?,
        secs: need("--secs", take("--secs")?)?,
        index_base: or("--index-base", take("--index-base")?, 0)?,
        index_span: or("--index-span", take("--index-span")?, 32)?,
        sport: or("--sport", take("--sport")?, 4789)?,
    };
    if let Some(x) = a.first() {
        return Err(format!("unknown argument {x:?}"));
    }
    Ok(args)
}

/// xorshift64: the forged bytes.
struct Rng(u64);

impl Rng {
    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            c.copy_from_slice(&self.0.to_le_bytes()[..c.len()]);
        }
    }
}

/// The `i`-th forged message (see the module's header) into `out`.
fn forge(a: &Args, mac1: &[u8; 32], rng: &mut Rng, i: u64, out: &mut Vec<u8>) {
    let (kind, len, response) = match i % 10 {
        0..=2 => (MSG_INITIATION_V3, INITIATION_V3_LEN, false),
        3 => (MSG_INITIATION_V2, INITIATION_V2_LEN, false),
        4 => (MSG_INITIATION, INITIATION_LEN, false),
        5 | 6 => (MSG_RESPONSE_V3, RESPONSE_V3_LEN, true),
        7 => (MSG_RESPONSE_V2, RESPONSE_V2_LEN, true),
        8 => (MSG_RESPONSE, RESPONSE_LEN, true),
        _ => (MSG_COOKIE_REPLY, COOKIE_REPLY_LEN, false),
    };
    out.clear();
    out.resize(len, 0);
    rng.fill(&mut out[4..]);
    let v = a.vni.to_be_bytes();
    out[..4].copy_from_slice(&[kind, v[1], v[2], v[3]]);
    if response {
        let index = a
            .index_base
            .wrapping_add((i / 10) as u32 % a.index_span.max(1));
        out[8..12].copy_from_slice(&index.to_le_bytes());
    }
    if kind == MSG_INITIATION_V3 || kind == MSG_RESPONSE_V3 {
        add_macs(out, mac1, None);
        if i % 10 == 2 {
            out[len - 20] ^= 0x40; // a bad mac1
        }
    }
}

/// `payload` in a UDP datagram in an IPv4 packet from `src` (checksums: the kernel fills the
/// IP header's; UDP's is left 0, none).
fn packet(a: &Args, payload: &[u8], id: u16, out: &mut Vec<u8>) {
    let udp_len = 8 + payload.len();
    let total = 20 + udp_len;
    out.clear();
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&(total as u16).to_be_bytes());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0, 0, 64, 17, 0, 0]);
    out.extend_from_slice(&a.src.octets());
    out.extend_from_slice(&a.dst.octets());
    out.extend_from_slice(&a.sport.to_be_bytes());
    out.extend_from_slice(&4789u16.to_be_bytes());
    out.extend_from_slice(&(udp_len as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(payload);
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("handshake_flood: {e}");
            std::process::exit(2);
        }
    };
    // IPPROTO_RAW: the packet carries its own IP header.
    let sock = match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(255))) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("handshake_flood: raw socket: {e} (needs root)");
            std::process::exit(1);
        }
    };
    let to = SockAddr::from(SocketAddrV4::new(a.dst, 0));
    let mac1 = mac1_key(&a.key);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    let mut rng = Rng(seed);
    let (mut msg, mut pkt) = (Vec::new(), Vec::new());
    let (mut sent, mut failed) = (0u64, 0u64);
    let start = Instant::now();
    let end = Duration::from_secs_f64(a.secs);
    loop {
        let elapsed = start.elapsed();
        if elapsed >= end {
            break;
        }
        // Due by now, at the rate (at most 100 ms of backlog at once).
        let due = (elapsed.as_secs_f64() * a.rate as f64) as u64;
        let burst = due.saturating_sub(sent + failed).min(a.rate / 10 + 1);
        for _ in 0..burst {
            let i = sent + failed;
            forge(&a, &mac1, &mut rng, i, &mut msg);
            packet(&a, &msg, i as u16, &mut pkt);
            match sock.send_to(&pkt, &to) {
                Ok(_) => sent += 1,
                Err(_) => failed += 1,
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"sent\": {sent}, \"failed\": {failed}, \"secs\": {secs:.3}, \"rate\": {:.0}}}",
        sent as f64 / secs
    );
}
