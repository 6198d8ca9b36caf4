//! Reaching hosts wherever they are (issue #31): behind NATs, behind firewalls, over paths with
//! small MTUs. The design is `docs/design/reach.md`; this crate is its pure part: the messages
//! on the VXLAN socket (`wire`, `stun`), the keys that authenticate them (`keys`), what a host
//! knows of how the underlay sees it (`candidates`), the path to each peer (`path`) and its
//! MTU as probing finds it (`pmtu`), the relay's admission and accounting (`relay`), and the
//! host's whole machine (`machine`), which takes datagrams, peers and the time and says what to
//! send, which path each peer's links take and what to publish. No I/O: vnetd's `reach` thread
//! and the data path's VXLAN reader do the sockets; randomness comes in through [`Random`].

pub mod candidates;
pub mod endpoint;
pub mod keys;
pub mod machine;
pub mod path;
pub mod pmtu;
pub mod relay;
pub mod stun;
pub mod wire;

pub use candidates::{Candidate, CandidateKind, NatMapping, SelfView};
pub use endpoint::canonical;
pub use keys::{PairKey, Tag};
pub use machine::{
    Action, Path, PathUpdate, PeerInfo, PeerStatus, PmtuStatus, Reach, ReachConfig, ReachCounters,
    ReachStatus, SelfRecord,
};
pub use relay::{KernelPair, RelayRefusal, RelayTable};

/// Why a datagram of this crate's kinds was refused; each is counted by whoever read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReachError {
    #[error("too short")]
    Truncated,
    #[error("too long")]
    TooLong,
    #[error("not a reach message")]
    NotReach,
    #[error("unknown version")]
    BadVersion,
    #[error("malformed")]
    Malformed,
    #[error("sender is not a member of the overlay")]
    UnknownSender,
    #[error("authentication failed")]
    BadAuth,
    #[error("stale or replayed")]
    Replay,
    #[error("answers nothing this host asked")]
    Unsolicited,
}

/// The time, as the caller reads it: a monotonic clock for every schedule, the wall clock only
/// for a ping's freshness (hosts' monotonic clocks share no epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Now {
    /// Monotonic, microseconds (round trips are measured in them).
    pub mono_us: u64,
    /// Wall clock, milliseconds since the Unix epoch.
    pub wall_ms: u64,
}

impl Now {
    pub fn mono_ms(&self) -> u64 {
        self.mono_us / 1000
    }
}

/// Where a txid or a nonce comes from: the OS (vnetd) or a fixed sequence (tests).
pub trait Random {
    fn fill(&mut self, buf: &mut [u8]);
}

/// The operating system's random source (through ring).
pub struct OsRandom(ring::rand::SystemRandom);

impl OsRandom {
    pub fn new() -> OsRandom {
        OsRandom(ring::rand::SystemRandom::new())
    }
}

impl Default for OsRandom {
    fn default() -> Self {
        Self::new()
    }
}

impl Random for OsRandom {
    fn fill(&mut self, buf: &mut [u8]) {
        use ring::rand::SecureRandom;
        // The OS source does not fail on Linux once booted; were it to, zeros would only make
        // txids guessable by someone who can also forge the pair key's AEAD, which they cannot.
        let _ = self.0.fill(buf);
    }
}

/// A deterministic source for tests: a counter's bytes.
#[derive(Debug, Default, Clone)]
pub struct CountingRandom(pub u64);

impl Random for CountingRandom {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 = self.0.wrapping_add(1);
            let b = self.0.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
}
