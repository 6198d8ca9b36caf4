//! vnetd's control port as a contract with one owner: its grammar ([`protocol`], which the
//! daemon encodes its answers with too), a client of it ([`Control`]) that vnetctl and
//! vnet-cni share, and which token a client presents ([`token`]). The grammar is written down
//! in docs/control-language.md ("The control port") and pinned by
//! `tests/vectors/control-port.txt`, which this crate's tests and the Python test helper's
//! mirror both check.

#![forbid(unsafe_code)]

mod client;
pub mod protocol;
pub mod token;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use client::Control;
pub use protocol::{Request, EVICTED, MAX_BATCH_BYTES, MAX_BATCH_LINES};
pub use token::{Token, TokenFile};

/// Why a call to vnetd failed, told apart as a caller reacts differently (vnet-cni answers
/// "try again" when vnetd is not running, "refused" when it said no).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing listens there (vnetd is not running), or the connection did not complete in time.
    #[error("vnetd is not reachable at {0}: {1}")]
    Unreachable(SocketAddr, std::io::Error),
    /// vnetd answered `error MESSAGE`.
    #[error("vnetd: {0}")]
    Refused(String),
    /// The token file cannot be used.
    #[error("token file {}: {reason}", path.display())]
    Token { path: PathBuf, reason: String },
    /// The request cannot go as it is (vnetd would refuse it).
    #[error("{0}")]
    Request(String),
    /// An answer outside the grammar.
    #[error("unexpected answer from vnetd: {0:?}")]
    BadAnswer(String),
    /// The connection failed or timed out after it was made.
    #[error("talking to vnetd: {0}")]
    Io(#[from] std::io::Error),
}
