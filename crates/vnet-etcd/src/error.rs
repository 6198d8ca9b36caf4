//! The client's one error type, and how a gRPC status becomes one: "unreachable, try
//! another member" or an answer. Apart so every call site (unary calls, watches) maps a status
//! the same way.

use crate::CodecError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No endpoint could be reached (the last transport error is given).
    #[error("etcd unreachable: {0}")]
    Unreachable(String),
    /// An endpoint answered, but with an error or something unreadable.
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("etcd TLS setup: {0}")]
    Tls(String),
    /// A password file that cannot be read or is not one line.
    #[error("etcd password file {0}")]
    Password(String),
    #[error("bad etcd endpoint {0:?}")]
    Endpoint(String),
    /// A watch stream ended or broke.
    #[error("watch stream ended: {0}")]
    WatchEnded(String),
    /// The client's runtime could not be made.
    #[error("etcd client runtime: {0}")]
    Runtime(String),
}

impl Error {
    /// Whether the store could not be reached at all (as opposed to answering with an error).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable(_) | Error::WatchEnded(_))
    }

    /// Whether a member refused a read at a revision it has not applied yet (etcd's
    /// `ErrFutureRev`): a serializable read does not wait for the member to catch up, so a
    /// snapshot's later pages, pinned at the revision another member answered the first one
    /// at, can meet this on a lagging member.
    pub fn is_future_revision(&self) -> bool {
        matches!(self, Error::Codec(CodecError::Server { message, .. })
            if message.contains("required revision is a future revision"))
    }
}

/// Whether a gRPC status means the member was not reached or did not answer in time (try
/// another), rather than an answer: the transport's own errors (they carry their cause), and
/// the codes etcd uses when it cannot serve now (no leader, request timed out, stopping).
pub(crate) fn transport_failure(s: &Status) -> bool {
    use std::error::Error as _;
    matches!(
        s.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
    ) || s.source().is_some()
}

/// The error of a failed call to `endpoint`.
pub(crate) fn status_error(endpoint: &str, s: &Status) -> Error {
    if transport_failure(s) {
        use std::error::Error as _;
        let cause = s.source().map(|c| format!(" ({c})")).unwrap_or_default();
        return Error::Unreachable(format!("{endpoint}: {}{cause}", s.message()));
    }
    Error::Codec(CodecError::Server {
        code: s.code() as i64,
        message: s.message().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        // The member could not serve: another one may.
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::Cancelled] {
            assert!(status_error("e", &Status::new(code, "x")).is_unreachable());
        }
        // A lagging member's answer to a read pinned beyond what it has applied.
        let future = status_error(
            "e",
            &Status::out_of_range("etcdserver: mvcc: required revision is a future revision"),
        );
        assert!(future.is_future_revision() && !future.is_unreachable());
        assert!(!status_error("e", &Status::out_of_range("x")).is_future_revision());
        // An answer: the same from every member.
        let e = status_error(
            "e",
            &Status::invalid_argument("etcdserver: authentication failed"),
        );
        assert!(!e.is_unreachable());
        assert!(e.to_string().contains("authentication failed"), "{e}");
        assert!(matches!(
            status_error(
                "e",
                &Status::unauthenticated("etcdserver: invalid auth token")
            ),
            Error::Codec(CodecError::Server { code: 16, .. })
        ));
    }
}
