//! The record of one hostile variant: what the backend did, and the verdict drawn from it.
//! Kept apart from the session and the cases so the report (serialised as JSON by the binary)
//! has one owner.

use crate::conn::ConnError;
use crate::proto::req;
use serde::Serialize;

/// What happened in one variant.
#[derive(Debug, Default, Serialize)]
pub struct CaseReport {
    pub case: String,
    pub variant: String,
    pub description: String,
    pub connected: bool,
    /// The normal part (negotiation / bring-up) failed.
    pub setup_error: Option<String>,
    /// Sending the misbehaviour failed (typically: the connection was already closed).
    pub send_error: Option<String>,
    /// Requests the backend explicitly rejected (REPLY_ACK status != 0).
    pub nacks: Vec<String>,
    pub connection_closed: bool,
    /// Did the backend answer GET_FEATURES after the misbehaviour?
    pub answers_after: Option<bool>,
    /// "answered", "closed", "timeout" or an error.
    pub probe: Option<String>,
    /// Used entries the backend produced on the hostile ring (and the first few lengths).
    pub used_entries: Option<usize>,
    pub used_lens: Vec<u32>,
    /// GET_VRING_BASE of the tx ring before re-initialising it.
    pub vring_base_after: Option<u32>,
    /// A valid frame queued behind the hostile ones was consumed (ring still processed).
    pub ring_continues: Option<bool>,
    /// After re-initialising the ring (or after a valid setup), a valid frame was consumed.
    pub works_after_reinit: Option<bool>,
    /// rx cases: hostile read-only buffers written / guard bytes around tiny buffers damaged.
    pub readonly_written: Option<bool>,
    pub guard_intact: Option<bool>,
    /// The undeclared half of the memfd still holds the canary.
    pub canary_intact: bool,
    pub canary_damage: Option<String>,
    /// truncated: the backend closed its side after our EOF.
    pub closed_after_eof: Option<bool>,
    /// mem_truncate: the memfd was cut short (false: refused, e.g. sealed by the backend).
    pub mem_cut: Option<bool>,
    /// survived | closed | hung | corrupted | connect_failed | setup_failed
    pub verdict: String,
    pub notes: Vec<String>,
}

impl CaseReport {
    /// Verdicts that mean the backend misbehaved (or could not be tested).
    pub fn is_failure(&self) -> bool {
        matches!(
            self.verdict.as_str(),
            "corrupted" | "hung" | "connect_failed" | "setup_failed"
        )
    }

    pub(super) fn conn_err(&mut self, what: &str, e: ConnError) {
        match e {
            ConnError::Closed => self.connection_closed = true,
            ConnError::Nack { request, status } => self
                .nacks
                .push(format!("{what}: {} status {status:#x}", req::name(request))),
            other => {
                self.send_error.get_or_insert(format!("{what}: {other}"));
            }
        }
    }
}

/// The verdict of a finished variant (worst finding first).
pub(super) fn verdict(r: &CaseReport) -> String {
    if !r.canary_intact || r.readonly_written == Some(true) || r.guard_intact == Some(false) {
        "corrupted"
    } else if r.closed_after_eof == Some(false) {
        "hung"
    } else if r.connection_closed {
        "closed"
    } else if r.probe.as_deref() == Some("timeout") {
        "hung"
    } else {
        "survived"
    }
    .into()
}
