//! `path`'s tests: one peer's endpoints over time (discovery's schedule, which endpoint carries
//! data, heartbeats and silence, a faster endpoint, tunnels), with a counting random source so
//! each schedule of pings is reproducible.

use super::*;
use crate::CountingRandom;

fn ep(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn cand(s: &str, kind: CandidateKind) -> Candidate {
    Candidate {
        endpoint: ep(s),
        kind,
    }
}

const MS: u64 = 1000;

/// Answers every outstanding ping to `to` after `rtt_ms`.
fn answer_all(p: &mut PeerPath, orders: &[PingOrder], to: &str, at_ms: u64) {
    for o in orders.iter().filter(|o| o.to == ep(to)) {
        p.on_pong(o.to, o.txid, at_ms * MS).unwrap();
    }
}

#[test]
fn discovery_pings_every_endpoint_on_its_schedule() {
    let mut rng = CountingRandom::default();
    let mut p = PeerPath::new(0);
    p.set_published(
        &[
            cand("203.0.113.1:4789", CandidateKind::Reflexive),
            cand("10.0.0.2:4789", CandidateKind::Local),
        ],
        0,
    );
    let mut rounds = Vec::new();
    for t in 0..12_000u64 {
        if t.is_multiple_of(50) {
            let o = p.due(t * MS, &mut rng);
            if !o.is_empty() {
                assert_eq!(o.len(), 2, "every endpoint at {t} ms");
                rounds.push(t);
            }
        }
    }
    assert_eq!(rounds, vec![0, 250, 500, 1000, 2000, 4000]);
    // Then every 10 s.
    let o = p.due(14_000 * MS, &mut rng);
    assert_eq!(o.len(), 2);
    assert!(p.due(14_050 * MS, &mut rng).is_empty());
}

#[test]
fn only_an_answered_endpoint_carries_data() {
    let mut rng = CountingRandom::default();
    let mut p = PeerPath::new(0);
    p.set_published(&[cand("203.0.113.1:4789", CandidateKind::Reflexive)], 0);
    // A ping from somewhere else is learned, not used.
    p.on_ping(ep("203.0.113.1:50000"), 0, false);
    assert_eq!(p.choose(0), None);
    let o = p.due(0, &mut rng);
    assert_eq!(o.len(), 2);
    // An answer with a txid never sent there is refused.
    assert_eq!(
        p.on_pong(ep("203.0.113.1:4789"), [0xee; 12], 1_000),
        Err(ReachError::Unsolicited)
    );
    let to_reflexive = o.iter().find(|x| x.to.port() == 50000).unwrap();
    assert_eq!(
        p.on_pong(ep("203.0.113.1:4789"), to_reflexive.txid, 1_000),
        Err(ReachError::Unsolicited),
        "a txid answered from another endpoint than it went to"
    );
    p.on_pong(to_reflexive.to, to_reflexive.txid, 3_000)
        .unwrap();
    // A replayed pong is nothing.
    assert_eq!(
        p.on_pong(to_reflexive.to, to_reflexive.txid, 4_000),
        Err(ReachError::Unsolicited)
    );
    assert_eq!(p.choose(3), Some(ep("203.0.113.1:50000")));
    assert!(p.chosen().unwrap().origin.punched());
    assert_eq!(p.accepted(3), vec![ep("203.0.113.1:50000")]);
}

#[test]
fn heartbeat_keeps_it_and_silence_loses_it() {
    let mut rng = CountingRandom::default();
    let mut p = PeerPath::new(0);
    p.set_published(&[cand("198.51.100.7:4789", CandidateKind::Advertised)], 0);
    let o = p.due(0, &mut rng);
    answer_all(&mut p, &o, "198.51.100.7:4789", 1);
    assert_eq!(p.choose(1), Some(ep("198.51.100.7:4789")));
    assert!(!p.chosen().unwrap().origin.punched());
    // Heartbeats every 2.5 s, answered: the path stays for a minute.
    let mut t = 1;
    let mut beats = 0;
    while t < 60_000 {
        t += 100;
        let o = p.due(t * MS, &mut rng);
        beats += o.len();
        answer_all(&mut p, &o, "198.51.100.7:4789", t + 1);
        assert_eq!(p.choose(t), Some(ep("198.51.100.7:4789")), "at {t}");
    }
    // 24 heartbeats, plus the slow discovery round of the other endpoints (none here).
    assert!((20..=30).contains(&beats), "{beats} pings in a minute");
    // No more answers: trusted for 6.5 s, then gone and discovery again.
    let last_answer = t + 1;
    let pings = loop {
        t += 100;
        let o = p.due(t * MS, &mut rng);
        if p.choose(t).is_none() {
            break o.len();
        }
    };
    assert!(
        t - last_answer <= TRUST_MS + 100,
        "lost after {} ms",
        t - last_answer
    );
    assert!(t - last_answer > TRUST_MS - 2_600);
    // Discovery restarted: a round at once, then its fast steps.
    assert_eq!(pings, 1);
    assert!(p.due(t * MS, &mut rng).is_empty());
    assert_eq!(p.due((t + 250) * MS, &mut rng).len(), 1);
}

#[test]
fn a_clearly_faster_endpoint_wins_an_equal_one_does_not() {
    let mut rng = CountingRandom::default();
    let mut p = PeerPath::new(0);
    p.set_published(
        &[
            cand("203.0.113.1:4789", CandidateKind::Reflexive),
            cand("10.0.0.2:4789", CandidateKind::Local),
        ],
        0,
    );
    let o = p.due(0, &mut rng);
    // The reflexive one answers first (10 ms), the local one later (9.5 ms round trip).
    answer_all(&mut p, &o, "203.0.113.1:4789", 10);
    assert_eq!(p.choose(10), Some(ep("203.0.113.1:4789")));
    p.on_pong(o[1].to, o[1].txid, 9_500).unwrap();
    assert_eq!(
        p.choose(10),
        Some(ep("203.0.113.1:4789")),
        "5 % better is not enough"
    );
    // Much faster answers from the local one (pinged in the slow rounds, every 10 s, while
    // the chosen one has its heartbeat): it wins within a few rounds.
    let mut t = 300;
    let mut switched = None;
    while t < 40_000 {
        let o = p.due(t * MS, &mut rng);
        for x in &o {
            let rtt = if x.to == ep("10.0.0.2:4789") {
                100
            } else {
                10_000
            };
            p.on_pong(x.to, x.txid, t * MS + rtt).unwrap();
        }
        if p.choose(t) == Some(ep("10.0.0.2:4789")) && switched.is_none() {
            switched = Some(t);
        }
        t += 300;
    }
    let at = switched.expect("the faster endpoint was never chosen");
    assert!((10_000..=31_000).contains(&at), "switched at {at} ms");
    assert_eq!(p.choose(t), Some(ep("10.0.0.2:4789")), "and kept");
}

#[test]
fn peer_reflexive_endpoints_are_bounded() {
    let mut p = PeerPath::new(0);
    for port in 0..100u16 {
        p.on_ping(
            SocketAddr::new("203.0.113.9".parse().unwrap(), 1000 + port),
            port as u64,
            false,
        );
    }
    let n = p
        .endpoints()
        .iter()
        .filter(|e| e.origin == Origin::PeerReflexive)
        .count();
    assert_eq!(n, MAX_PEER_REFLEXIVE);
    // The newest are kept.
    assert!(p.endpoints().iter().any(|e| e.endpoint.port() == 1099));
    assert!(!p.endpoints().iter().any(|e| e.endpoint.port() == 1000));
}

#[test]
fn new_candidates_restart_discovery_and_keep_what_is_known() {
    let mut rng = CountingRandom::default();
    let mut p = PeerPath::new(0);
    p.set_published(&[cand("10.0.0.2:4789", CandidateKind::Local)], 0);
    let o = p.due(0, &mut rng);
    answer_all(&mut p, &o, "10.0.0.2:4789", 1);
    assert!(p.choose(1).is_some());
    p.set_published(
        &[
            cand("10.0.0.2:4789", CandidateKind::Local),
            cand("203.0.113.1:4789", CandidateKind::Reflexive),
        ],
        5,
    );
    // The chosen endpoint stays chosen; the new one is pinged at once.
    assert_eq!(p.choose(5), Some(ep("10.0.0.2:4789")));
    let o = p.due(5 * MS, &mut rng);
    assert!(o.iter().any(|x| x.to == ep("203.0.113.1:4789")));
    // A candidate withdrawn is dropped, and so is the choice if it was that one.
    p.set_published(&[cand("203.0.113.1:4789", CandidateKind::Reflexive)], 6);
    assert_eq!(p.choose(6), None);
}

#[test]
fn the_wake_time_is_never_in_the_past_nor_a_busy_loop() {
    let mut rng = CountingRandom::default();
    let mut p = PeerPath::new(0);
    p.set_published(&[cand("10.0.0.2:4789", CandidateKind::Local)], 0);
    assert_eq!(p.next_wake_ms(0), 0, "a new endpoint is due at once");
    let o = p.due(0, &mut rng);
    answer_all(&mut p, &o, "10.0.0.2:4789", 1);
    p.choose(1);
    // A new choice is announced at once (one ping), then the heartbeat's pace.
    assert_eq!(p.next_wake_ms(1), 1);
    let o = p.due(MS, &mut rng);
    assert_eq!(o.len(), 1);
    let w = p.next_wake_ms(1);
    assert!(w > 1 && w <= 2_500, "{w}");
    // Long after everything expired the next wake is still ahead.
    let _ = p.due(100_000 * MS, &mut rng);
    p.choose(100_000);
    assert!(p.next_wake_ms(100_000) > 100_000);
}

/// Answers every outstanding ping to `to` at `at_ms` with a round trip of `rtt_ms`.
fn answer_after(p: &mut PeerPath, orders: &[PingOrder], to: SocketAddr, sent_ms: u64, rtt_ms: u64) {
    for o in orders.iter().filter(|o| o.to == to) {
        p.on_pong(o.to, o.txid, (sent_ms + rtt_ms) * MS).unwrap();
    }
}

#[test]
fn a_tunnel_carries_only_while_nothing_over_udp_answers() {
    let mut rng = CountingRandom::default();
    let udp = ep("198.51.100.7:4789");
    let tunnel = ep("10.9.0.1:41000");
    let mut p = PeerPath::new(0);
    p.set_published(&[cand("198.51.100.7:4789", CandidateKind::Local)], 0);
    // UDP never answers: down since the start.
    let o = p.due(0, &mut rng);
    assert_eq!(o.len(), 1);
    assert_eq!(p.choose(1_500), None);
    assert_eq!(p.udp_down_for_ms(1_500), 1_500);
    // The tunnel opens: pinged at once, carries once it answers.
    p.set_tunnel(Some(tunnel), 2_000);
    let o = p.due(2_000 * MS, &mut rng);
    assert!(o.iter().any(|o| o.to == tunnel), "{o:?}");
    answer_after(&mut p, &o, tunnel, 2_000, 5);
    assert_eq!(p.choose(2_005), Some(tunnel));
    assert_eq!(p.udp_down_for_ms(2_005), 2_005);
    // UDP answers, slower than the tunnel: UDP carries all the same.
    let o = p.due(3_000 * MS, &mut rng);
    answer_after(&mut p, &o, udp, 3_000, 40);
    assert_eq!(p.choose(3_040), Some(udp));
    assert_eq!(p.udp_down_for_ms(3_040), 0);
    // UDP stops answering (only the tunnel's heartbeats are answered): back to the tunnel
    // once UDP is no longer trusted.
    let mut t = 3_040;
    while t < 12_000 {
        t += 500;
        let o = p.due(t * MS, &mut rng);
        answer_after(&mut p, &o, tunnel, t, 5);
        p.choose(t + 5);
    }
    assert_eq!(p.choose(12_005), Some(tunnel));
    assert!(p.udp_down_for_ms(12_005) > 0);
    // Closed: the tunnel is forgotten, nothing carries.
    p.set_tunnel(None, 12_010);
    assert!(p.endpoints().iter().all(|e| e.origin != Origin::Tunnel));
    assert_eq!(p.choose(12_010), None);
}

#[test]
fn a_peer_that_comes_in_over_a_tunnel_is_learned_as_one() {
    let mut p = PeerPath::new(0);
    p.on_ping(ep("10.9.0.1:41000"), 0, true);
    assert_eq!(p.endpoints()[0].origin, Origin::Tunnel);
    assert!(!p.endpoints()[0].origin.punched());
    // A published candidate set that changes keeps the tunnel.
    p.set_published(&[cand("198.51.100.7:4789", CandidateKind::Local)], 10);
    assert!(p.endpoints().iter().any(|e| e.origin == Origin::Tunnel));
}
