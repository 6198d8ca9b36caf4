//! Floods of forged handshake messages, by the `now` clock: two hosts keep rekeying on
//! schedule and their data keeps opening while an attacker who knows both public keys and
//! sees every message between them sends each, spoofing the other, 10 forged or replayed
//! messages per millisecond (initiations and responses of every version, with good `mac1`s,
//! to the pending initiation's index, verbatim replays of the hosts' own messages, forged and
//! replayed cookie replies); the X25519 work it causes stays within the budgets whatever its
//! rate. And the pieces one by one: what is refused unread and why, the separate budgets,
//! cookie replies' rate and size.

use std::collections::BTreeMap;

use super::*;
use crate::cookie::{add_macs, mac1_key};
use crate::peer::{
    COOKIE_REPLY_BURST, COOKIE_REPLY_REFILL_MS, INITIATION_BURST, INITIATION_REFILL_MS,
    RESPONSE_BURST, RESPONSE_REFILL_MS,
};
use crate::wire::{
    Version, COOKIE_REPLY_LEN, INITIATION_LEN, INITIATION_V2_LEN, INITIATION_V3_LEN,
    MSG_COOKIE_REPLY, MSG_INITIATION, MSG_INITIATION_V2, MSG_INITIATION_V3, MSG_RESPONSE_V2,
    MSG_RESPONSE_V3, RESPONSE_V2_LEN, RESPONSE_V3_LEN,
};
use crate::PublicKey;

/// A xorshift generator: the attacker's bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A message of type `kind` and length `len` for VNI 5, random after its header (with
/// `receiver` at 8..12 if given); v3 ones get a good `mac1` for `to` (the attacker knows every
/// public key) and no `mac2`.
fn forged(rng: &mut Rng, kind: u8, len: usize, receiver: Option<u32>, to: &PublicKey) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, 5];
    m.extend(rng.bytes(len - 4));
    if let Some(r) = receiver {
        m[8..12].copy_from_slice(&r.to_le_bytes());
    }
    if kind == MSG_INITIATION_V3 || kind == MSG_RESPONSE_V3 {
        add_macs(&mut m, &mac1_key(to), None);
    }
    m
}

/// What the attacker saw the two hosts send, per sender.
#[derive(Default, Clone)]
struct Seen {
    /// The index of the last initiation (a guess at the pending one); the first initiation
    /// (replayed, it passes mac2 as long as the cookie it was made with lasts, and it is
    /// answered if read: a link refuses it only for having seen it before) and the last
    /// response and cookie reply, for replaying.
    pending: Option<(u32, Version)>,
    initiation: Option<Vec<u8>>,
    response: Option<Vec<u8>>,
    cookie_reply: Option<Vec<u8>>,
}

fn observe(seen: &mut Seen, m: &[u8]) {
    match Message::parse(m) {
        Ok(Message::Initiation {
            sender, version, ..
        }) => {
            seen.pending = Some((sender, version));
            // the first one made with a cookie (v3 with a mac2)
            if seen.initiation.is_none() && version == Version::V3 && m[m.len() - 16..] != [0; 16] {
                seen.initiation = Some(m.to_vec());
            }
        }
        Ok(Message::Response { .. }) => seen.response = Some(m.to_vec()),
        Ok(Message::CookieReply { .. }) => seen.cookie_reply = Some(m.to_vec()),
        _ => {}
    }
}

/// The attacker's `i`-th message to `victim` (whose public key is `to`), spoofing the other
/// host, which it saw send `from` and `victim` send `victim_sent`.
fn attack(rng: &mut Rng, i: u64, to: &PublicKey, from: &Seen, victim_sent: &Seen) -> Vec<u8> {
    let pending = victim_sent.pending.map(|(index, _)| index);
    let pending_v2 = victim_sent.pending.map(|(index, _)| index);
    let r = match i % 10 {
        0 => Some(forged(rng, MSG_INITIATION_V3, INITIATION_V3_LEN, None, to)),
        1 => {
            let mut m = forged(rng, MSG_INITIATION_V3, INITIATION_V3_LEN, None, to);
            m[70] ^= 1; // a bad mac1
            Some(m)
        }
        2 => Some(forged(rng, MSG_INITIATION_V2, INITIATION_V2_LEN, None, to)),
        3 => Some(forged(rng, MSG_INITIATION, INITIATION_LEN, None, to)),
        4 => Some(forged(rng, MSG_RESPONSE_V3, RESPONSE_V3_LEN, pending, to)),
        5 => Some(forged(
            rng,
            MSG_RESPONSE_V2,
            RESPONSE_V2_LEN,
            pending_v2,
            to,
        )),
        6 => from.initiation.clone(),
        7 => from.response.clone(),
        8 => Some(forged(rng, MSG_COOKIE_REPLY, COOKIE_REPLY_LEN, None, to)),
        _ => from.cookie_reply.clone(),
    };
    r.unwrap_or_else(|| forged(rng, MSG_INITIATION_V3, INITIATION_V3_LEN, None, to))
}

/// What the flood did over the run.
#[derive(Debug)]
struct Outcome {
    handshakes: [u64; 2],
    /// The oldest a host's sending session got (ms), once the first handshake was done.
    max_session_age_ms: u64,
    data_sent: u64,
    data_opened: u64,
    /// Genuine data messages refused (none may be).
    data_refused: u64,
    forged_sent: u64,
}

/// Two hosts and, from `flood_from_ms` on, the attacker: 10 messages per ms to each host.
/// Each host sends a data message every 10 ms. The wire delays everything by 1 ms.
fn run(a: Peer, b: Peer, end_ms: u64, flood_from_ms: u64) -> ([Peer; 2], Outcome) {
    let mut p = [a, b];
    let public = [p[1].remote(), p[0].remote()]; // a's key (b's remote), b's key
                                                 // (arrival, sequence) -> (to, datagram, genuine)
    let mut wire: BTreeMap<(u64, u64), (usize, Vec<u8>, bool)> = BTreeMap::new();
    let mut seq = 0u64;
    let mut seen = [Seen::default(), Seen::default()];
    let mut rng = Rng(0x243f_6a88_85a3_08d3);
    let mut out = Outcome {
        handshakes: [0; 2],
        max_session_age_ms: 0,
        data_sent: 0,
        data_opened: 0,
        data_refused: 0,
        forged_sent: 0,
    };
    for now in 0..end_ms {
        let mut to_send: Vec<(usize, Vec<u8>)> = vec![];
        while let Some(e) = wire.first_entry() {
            if e.key().0 > now {
                break;
            }
            let (to, d, genuine) = e.remove();
            let is_data = d.first() == Some(&crate::wire::MSG_DATA);
            match receive(&mut p[to], d, now) {
                Ok(Got::Plain(plain)) if !plain.is_empty() => out.data_opened += 1,
                Ok(Got::Reply(reply)) if !reply.is_empty() => to_send.push((1 - to, reply)),
                Err(e) if genuine && is_data => {
                    out.data_refused += 1;
                    eprintln!("{now} ms: host {to} refused a genuine data message: {e}");
                }
                _ => {}
            }
            if let Some(c) = p[to].take_cookie_reply() {
                to_send.push((1 - to, c));
            }
        }
        // (b ticks half a tick after a: hosts' timers are never in step)
        for (i, q) in p.iter_mut().enumerate() {
            if now % 100 == 50 * i as u64 {
                if let Some(m) = q.tick(at(now)) {
                    to_send.push((1 - i, m));
                }
            }
        }
        if now % 10 == 0 {
            for (i, q) in p.iter().enumerate() {
                if q.sending_session(now).is_some() {
                    to_send.push((1 - i, seal(q, b"data", now)));
                    out.data_sent += 1;
                }
            }
        }
        if now >= flood_from_ms {
            for victim in 0..2 {
                for k in 0..10 {
                    let m = attack(
                        &mut rng,
                        now * 10 + k,
                        &public[victim],
                        &seen[1 - victim],
                        &seen[victim],
                    );
                    seq += 1;
                    wire.insert((now + 1, seq), (victim, m, false));
                    out.forged_sent += 1;
                }
            }
        }
        for (to, m) in to_send {
            observe(&mut seen[1 - to], &m);
            seq += 1;
            wire.insert((now + 1, seq), (to, m, true));
        }
        if p.iter().all(|q| q.stats.handshakes_completed > 0) {
            for q in &p {
                let age = q.current().map_or(u64::MAX, |s| s.age_ms(now));
                out.max_session_age_ms = out.max_session_age_ms.max(age);
            }
        }
    }
    out.handshakes = [
        p[0].stats.handshakes_completed,
        p[1].stats.handshakes_completed,
    ];
    (p, out)
}

/// The handshake messages a host read (two X25519 operations each) over `ms`, at most: every
/// budget spent in full.
fn read_bound(ms: u64) -> u64 {
    2 * (INITIATION_BURST + ms / INITIATION_REFILL_MS)
        + 2 * (RESPONSE_BURST + ms / RESPONSE_REFILL_MS)
}

fn reads(p: &Peer) -> u64 {
    p.stats.handshakes_read
}

#[test]
fn a_link_keeps_rekeying_under_a_flood_of_forged_handshake_messages() {
    let t = Timers {
        rekey_after_ms: 1_500,
        ..Timers::default()
    };
    let (a, b) = pair_with(Ciphers::ALL, Ciphers::ALL, t);
    let end = 30_000;
    let (p, o) = run(a, b, end, 0);
    eprintln!("{o:?}\na: {:?}\nb: {:?}", p[0].stats, p[1].stats);
    // The link came up under the flood and rekeyed on schedule: the initiator's session every
    // 1.5 s (the responder waits 10 s more), within a retry or two.
    assert!(o.handshakes[0] >= end / 2_000, "{o:?}");
    assert!(
        o.max_session_age_ms < 1_500 + 2_000,
        "a session aged {} ms",
        o.max_session_age_ms
    );
    for q in &p {
        assert_eq!(q.current().unwrap().version(), Version::V3);
        assert!(q.peer_speaks_v3());
    }
    // No genuine data message was refused, and all but those in flight at the end arrived.
    assert_eq!(o.data_refused, 0);
    assert!(o.data_opened + 4 >= o.data_sent, "{o:?}");
    assert_eq!(o.forged_sent, 2 * 10 * end);
    for q in &p {
        let s = q.stats;
        // The X25519 work the flood caused stays within the budgets, whatever its rate.
        assert!(reads(q) <= read_bound(end), "{} reads: {s:?}", reads(q));
        // Cookie replies: within their budget, and they did their work.
        assert!(s.cookie_replies_sent <= COOKIE_REPLY_BURST + end / COOKIE_REPLY_REFILL_MS);
        assert!(
            s.cookie_replies_sent > 0 && s.cookie_replies_received > 0,
            "{s:?}"
        );
        // Each kind of refusal happened.
        assert!(s.bad_macs > 0 && s.cookies_required > 0, "{s:?}");
        assert!(s.initiations_throttled > 0, "{s:?}");
    }
    // (only the responder sees the initiator's initiations replayed)
    assert!(p[1].stats.initiations_replayed > 0);
}
