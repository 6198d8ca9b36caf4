//! The probing machine against a simulated path: a true MTU (both directions), a round trip,
//! loss as a test chooses; which size it finds, how fast, and that it never claims more than
//! the path carries.

use super::*;
use crate::CountingRandom;

struct Sim {
    m: Pmtu,
    /// What the path carries (IP packet), now.
    path: usize,
    rtt_ms: u64,
    now_ms: u64,
    /// Pongs on their way back: (arrives at, txid, length).
    inflight: Vec<(u64, [u8; TXID_LEN], usize)>,
    rng: CountingRandom,
    /// Probes (and answers) the path drops besides those too big: given the n-th probe sent.
    drop: Box<dyn FnMut(u64) -> bool>,
    /// Answers shorter than asked (a peer that does not pad).
    short: bool,
    sent: u64,
    lost: u64,
    black_holes: u64,
}

impl Sim {
    fn new(endpoint: &str, path: usize, ceiling: Option<usize>) -> Sim {
        let mut m = Pmtu::new(endpoint.parse().unwrap(), 0);
        m.set_ceiling(ceiling);
        Sim {
            m,
            path,
            rtt_ms: 2,
            now_ms: 0,
            inflight: Vec::new(),
            rng: CountingRandom::default(),
            drop: Box::new(|_| false),
            short: false,
            sent: 0,
            lost: 0,
            black_holes: 0,
        }
    }

    fn rtt_us(&self) -> Option<u64> {
        Some(self.rtt_ms * 1000)
    }

    /// Runs 1 ms steps until `until_ms`, or until `stop` says so; returns the time then.
    fn run_until(&mut self, until_ms: u64, mut stop: impl FnMut(&Pmtu) -> bool) -> u64 {
        while self.now_ms < until_ms {
            self.now_ms += 1;
            let now = self.now_ms;
            let (arrived, rest): (Vec<_>, Vec<_>) =
                self.inflight.drain(..).partition(|(at, ..)| *at <= now);
            self.inflight = rest;
            for (_, txid, len) in arrived {
                assert!(self.m.on_pong(txid, len, now).is_some());
            }
            if now >= self.m.next_wake_ms(now, self.rtt_us()) {
                let d = self.m.due(now * 1000, self.rtt_us(), &mut self.rng);
                self.lost += d.lost;
                self.black_holes += d.black_hole as u64;
                for p in d.probes {
                    self.sent += 1;
                    assert_eq!(p.payload + overhead(self.m.endpoint()), p.size);
                    if p.size <= self.path && !(self.drop)(self.sent) {
                        let len = if self.short { p.payload - 1 } else { p.payload };
                        self.inflight.push((now + self.rtt_ms, p.txid, len));
                    }
                }
            }
            if stop(&self.m) {
                break;
            }
        }
        self.now_ms
    }

    fn run(&mut self, ms: u64) {
        let until = self.now_ms + ms;
        self.run_until(until, |_| false);
    }
}

/// The largest size the machine can find on `path` under `ceiling`: the largest candidate
/// (BASE, [`SIZES`], the ceiling) that fits.
fn expected(path: usize, ceiling: usize, base: usize) -> usize {
    let ceiling = ceiling.min(MAX_PLPMTU);
    std::iter::once(base)
        .chain(SIZES)
        .chain(std::iter::once(ceiling))
        .filter(|s| *s <= path.min(ceiling) && *s >= base)
        .max()
        .unwrap()
}

#[test]
fn a_path_that_carries_everything_is_known_after_one_round_trip() {
    let mut s = Sim::new("198.51.100.7:4789", 1500, Some(1500));
    assert_eq!(
        s.m.mtu(),
        Some(1500),
        "the kernel's figure until a probe says otherwise"
    );
    let t = s.run_until(2_000, |m| m.state_word() == "done");
    assert_eq!(s.m.probed(), Some(1500));
    assert!(t <= 1 + s.rtt_ms, "{t} ms");
    assert_eq!(s.lost, 0);
    assert!(s.m.search_ms().unwrap() <= 1 + s.rtt_ms);
}

#[test]
fn each_path_size_is_found_within_max_probes_timeouts() {
    for path in [1200, 1279, 1280, 1300, 1400, 1440, 1450, 1472, 1499] {
        let mut s = Sim::new("198.51.100.7:4789", path, Some(1500));
        let t = s.run_until(5_000, |m| m.state_word() == "done");
        assert_eq!(
            s.m.probed(),
            Some(expected(path, 1500, BASE_V4)),
            "path {path}"
        );
        assert_eq!(s.m.mtu(), Some(expected(path, 1500, BASE_V4)));
        // The smallest size too big was lost MAX_PROBES times, MIN_PROBE_TIMEOUT_MS apart.
        let bound = MAX_PROBES as u64 * (MIN_PROBE_TIMEOUT_MS + 1) + s.rtt_ms + 1;
        assert!(t <= bound, "path {path}: {t} ms > {bound}");
        // The confirmed size is known after one round trip.
        assert!(s.lost >= MAX_PROBES as u64);
    }
}

#[test]
fn the_largest_confirmed_size_is_used_while_the_search_goes_on() {
    let mut s = Sim::new("198.51.100.7:4789", 1400, Some(1500));
    s.run(s.rtt_ms + 2);
    assert_eq!(s.m.state_word(), "searching");
    assert_eq!(s.m.mtu(), Some(1400));
}

#[test]
fn the_kernel_figure_is_a_ceiling() {
    // A ceiling that is no candidate is probed itself.
    let mut s = Sim::new("198.51.100.7:4789", 1500, Some(1380));
    s.run_until(2_000, |m| m.state_word() == "done");
    assert_eq!(s.m.mtu(), Some(1380));
    // The kernel learns a smaller figure (an ICMP got through): it wins at once.
    s.m.set_ceiling(Some(1300));
    assert_eq!(s.m.mtu(), Some(1300));
    assert_eq!(s.m.probed(), Some(1300));
    // A ceiling below BASE: nothing probed, the kernel's figure.
    let mut s = Sim::new("198.51.100.7:4789", 1500, Some(1000));
    s.run(2_000);
    assert_eq!(s.sent, 0);
    assert_eq!(s.m.mtu(), Some(1000));
}

#[test]
fn without_a_ceiling_the_search_waits_for_it_then_goes_up_to_jumbo() {
    let mut s = Sim::new("198.51.100.7:4789", 9000, None);
    s.run(CEILING_WAIT_MS - 10);
    assert_eq!(s.sent, 0);
    assert_eq!(s.m.mtu(), None);
    s.run_until(CEILING_WAIT_MS + 100, |m| m.state_word() == "done");
    assert_eq!(s.m.mtu(), Some(MAX_PLPMTU));
    // Given at once, the ceiling starts it at once.
    let mut s = Sim::new("198.51.100.7:4789", 9000, None);
    s.run(5);
    s.m.set_ceiling(Some(4000));
    s.run_until(100, |m| m.state_word() == "done");
    assert_eq!(s.m.mtu(), Some(4000));
}

#[test]
fn a_path_that_shrinks_is_a_black_hole_found_and_searched_again() {
    let mut s = Sim::new("198.51.100.7:4789", 1500, Some(1500));
    s.run(3_000);
    assert_eq!(s.m.mtu(), Some(1500));
    // A route change: 1280 now, and no ICMP says so (the ceiling stays 1500).
    s.path = 1280;
    let t0 = s.now_ms;
    s.run_until(t0 + 10_000, |m| m.state_word() == "black-hole");
    assert_eq!(s.black_holes, 1);
    let noticed = s.now_ms - t0;
    let bound = CONFIRM_MS + MAX_PROBES as u64 * (MIN_PROBE_TIMEOUT_MS + 1) + 5;
    assert!(noticed <= bound, "{noticed} ms > {bound}");
    // BASE until a size is confirmed again; then the new size.
    assert_eq!(s.m.mtu(), Some(BASE_V4));
    s.run_until(t0 + 10_000, |m| m.state_word() == "done");
    assert_eq!(s.m.mtu(), Some(1280));
    let took = s.now_ms - t0;
    assert!(
        took <= bound + MAX_PROBES as u64 * (MIN_PROBE_TIMEOUT_MS + 1) + 10,
        "{took} ms"
    );
}

#[test]
fn a_path_that_grows_is_found_at_the_raise_timer() {
    let mut s = Sim::new("198.51.100.7:4789", 1280, Some(1500));
    let found = s.run_until(2_000, |m| m.state_word() == "done");
    assert_eq!(s.m.mtu(), Some(1280));
    s.path = 1500;
    s.run(found + RAISE_MS - 10 - s.now_ms);
    assert_eq!(s.m.mtu(), Some(1280), "not before the raise timer");
    s.run(20);
    assert_eq!(s.m.mtu(), Some(1500));
    // A path at its ceiling is not searched again (only confirmed).
    let sent = s.sent;
    s.run(RAISE_MS + 10);
    assert!(
        s.sent - sent <= (RAISE_MS + 10) / CONFIRM_MS + 1,
        "{}",
        s.sent - sent
    );
}

#[test]
fn one_lost_probe_is_not_a_size_too_big() {
    // Every second probe lost (and never the same size twice in a row in a round of ten).
    let mut s = Sim::new("198.51.100.7:4789", 1500, Some(1500));
    s.drop = Box::new(|n| n % 2 == 0);
    s.run_until(5_000, |m| m.state_word() == "done");
    assert_eq!(s.m.mtu(), Some(1500));
    // In the confirmations too: a loss is retried at once, two in a row are not a black hole.
    s.drop = Box::new(|n| n % 3 != 0);
    s.run(20_000);
    assert_eq!(s.black_holes, 0);
    assert_eq!(s.m.mtu(), Some(1500));
}

#[test]
fn a_dead_path_is_an_error_not_a_small_mtu() {
    let mut s = Sim::new("198.51.100.7:4789", 1500, Some(1500));
    s.drop = Box::new(|_| true);
    s.run(2_000);
    assert_eq!(s.m.state_word(), "error");
    // Nothing was ever confirmed: the kernel's figure stands (the reach machine gives the path
    // up, not this one).
    assert_eq!(s.m.mtu(), Some(1500));
    s.drop = Box::new(|_| false);
    s.run(ERROR_RETRY_MS);
    assert_eq!(s.m.mtu(), Some(1500));
    assert_eq!(s.m.state_word(), "done");
}

#[test]
fn short_answers_confirm_nothing() {
    let mut s = Sim::new("198.51.100.7:4789", 1500, Some(1500));
    s.short = true;
    s.run(2_000);
    assert_eq!(s.m.state_word(), "error");
    assert_eq!(s.m.probed(), None);
}

#[test]
fn unknown_answers_are_not_this_machines() {
    let mut s = Sim::new("198.51.100.7:4789", 1500, Some(1500));
    s.run(1);
    assert_eq!(s.m.on_pong([0xee; TXID_LEN], 1472, 1), None);
}

#[test]
fn ipv6_paths_start_at_1280_and_count_40_bytes_of_header() {
    let mut s = Sim::new("[2001:db8::7]:4789", 1400, Some(1500));
    assert_eq!(s.m.base(), BASE_V6);
    s.run_until(2_000, |m| m.state_word() == "done");
    assert_eq!(s.m.mtu(), Some(1400));
    let mut s = Sim::new("[2001:db8::7]:4789", 1279, Some(1500));
    s.run(2_000);
    assert_eq!(s.m.state_word(), "error");
}

proptest::proptest! {
    /// Whatever the path, the ceiling and the loss: a found size is never more than the path
    /// carries or the kernel's figure; without loss it is the largest candidate that fits.
    #[test]
    fn never_more_than_the_path(
        path in 1200usize..9200,
        ceiling in 1200usize..9200,
        loss in proptest::collection::vec(proptest::bool::weighted(0.2), 64),
        v6 in proptest::bool::ANY,
    ) {
        let ep = if v6 { "[2001:db8::7]:4789" } else { "198.51.100.7:4789" };
        let mut s = Sim::new(ep, path, Some(ceiling));
        let lossy = loss.iter().any(|l| *l);
        s.drop = Box::new(move |n| loss[(n as usize) % loss.len()]);
        s.run(4_000);
        let limit = path.min(ceiling).min(MAX_PLPMTU);
        if let Some(p) = s.m.probed() {
            proptest::prop_assert!(p <= limit, "probed {} > {}", p, limit);
        }
        if s.m.state_word() == "done" {
            proptest::prop_assert!(s.m.mtu().unwrap() <= limit);
        }
        if !lossy && limit >= s.m.base() {
            proptest::prop_assert_eq!(s.m.mtu(), Some(expected(path, ceiling, s.m.base())));
        }
    }
}
