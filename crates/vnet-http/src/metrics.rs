//! `/metrics`: the daemon's status structs in the Prometheus/OpenMetrics text format.
//!
//! A fresh registry is filled from one snapshot per scrape, so a port that was removed
//! disappears from the next scrape and nothing is kept between scrapes. Names follow the
//! Prometheus conventions: prefix `vnet_`, counters end in `_total`, base units (bytes,
//! seconds), and bounded label sets: ports, links, dispatchers and drop reasons are as many
//! as the configuration has; guest MACs are never labels (the traffic matrix is in the live
//! view and `show matrix`).

//!
//! This file is the scrape as a whole (build info, ports, the VXLAN socket, the listener); each
//! other part of the status has its module (`datapath`, `agent`), all over `builder`.

use vnet_core::{DropReason, PortCountersSnapshot};

use crate::server::{HttpCounters, Refusal};
use crate::source::HostSnapshot;

mod agent;
mod builder;
mod datapath;
#[cfg(test)]
mod tests;

use builder::{port_labels, Builder, Field, FieldCounters, Labels, Unit};

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `vnet_build_info` says.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    pub version: String,
    /// Seconds since the Unix epoch when the daemon started.
    pub start_time: f64,
}

/// A port's traffic, by its [`PortCountersSnapshot`] field.
const PORT_TRAFFIC: &[Field<PortCountersSnapshot>] = &[
    (
        "port_receive_frames",
        "Frames vnet received from the port (from the guest, or from the link's peer).",
        None,
        |c| c.rx_frames,
    ),
    (
        "port_receive",
        "Bytes vnet received from the port.",
        Some(Unit::Bytes),
        |c| c.rx_bytes,
    ),
    (
        "port_transmit_frames",
        "Frames vnet sent to the port.",
        None,
        |c| c.tx_frames,
    ),
    (
        "port_transmit",
        "Bytes vnet sent to the port.",
        Some(Unit::Bytes),
        |c| c.tx_bytes,
    ),
];

/// The whole exposition for one snapshot.
pub fn render(snap: &HostSnapshot, http: &HttpCounters, info: &BuildInfo) -> String {
    let mut b = Builder::default();

    let build = b.gauge("build_info", "vnetd's version (always 1).", None);
    build.set(&Labels::of("version", &info.version), 1.0);
    b.gauge1(
        "start_time",
        "When vnetd started, seconds since the Unix epoch.",
        Some(Unit::Seconds),
        info.start_time,
    );

    // Ports: interfaces (frames from and to a guest) and links (from and to a peer host).
    let traffic = FieldCounters::new(&mut b, PORT_TRAFFIC);
    let drops = b.counter(
        "port_drops",
        "Frames dropped at the port, by reason (docs/control-language.md, show stats).",
        None,
    );
    let rate_limit = b.gauge(
        "port_rate_limit_bytes_per_second",
        "The port's token-bucket rate (ports with a rate only).",
        None,
    );
    let bucket = b.gauge(
        "port_rate_bucket",
        "Bytes the port's token bucket holds now (may be below zero by one frame).",
        Some(Unit::Bytes),
    );
    let reasons: Vec<Labels> = DropReason::ALL
        .iter()
        .map(|r| Labels::of("reason", r.as_str()))
        .collect();
    for p in &snap.stats.ports {
        let l = port_labels(p);
        traffic.set(&l, &p.counters);
        // Every reason, zeros included, so that rate() sees a drop's first occurrence.
        for (r, reason) in DropReason::ALL.iter().zip(&reasons) {
            let n = p.counters.drops.get(r.as_str()).copied().unwrap_or(0);
            drops.set_with(&l, reason, n);
        }
        if let Some(rate) = &p.policy.rate {
            rate_limit.set(&l, rate.mbit as f64 * 125_000.0);
            bucket.set(&l, rate.available_bytes as f64);
        }
    }

    // The VXLAN socket as a whole, and what was dropped before any port was known.
    let d = &snap.stats.daemon;
    b.counter1(
        "udp_received_datagrams",
        "Datagrams the VXLAN socket received, for all links.",
        None,
        d.rx_datagrams,
    );
    b.counter1(
        "udp_received",
        "Bytes of the datagrams the VXLAN socket received.",
        Some(Unit::Bytes),
        d.rx_bytes,
    );
    let unmatched_drops = b.counter(
        "unmatched_drops",
        "Datagrams and connections dropped before a port was known (unknown peer, bad VXLAN header), by reason.",
        None,
    );
    for r in DropReason::ALL {
        let n = d.drops.get(r.as_str()).copied().unwrap_or(0);
        unmatched_drops.set(&Labels::of("reason", r.as_str()), n);
    }
    b.counter1(
        "control_errors",
        "Refused control connections, bad control lines and failed authentications.",
        None,
        d.control_errors,
    );

    // The state directory: whether the configuration is being saved (issue 32).
    let st = &snap.stats.state;
    b.gauge1(
        "state_saving",
        "1 while the local configuration is being saved; 0 after a write to the state directory failed (changes are refused until one succeeds).",
        None,
        if st.failing { 0.0 } else { 1.0 },
    );
    b.gauge1(
        "state_unsaved",
        "1 while the running configuration has changes a restart would lose.",
        None,
        if st.unsaved { 1.0 } else { 0.0 },
    );
    b.counter1(
        "state_write_errors",
        "Writes to the state directory that failed.",
        None,
        st.errors,
    );
    b.gauge1(
        "state_pending_routes",
        "Routes of the local configuration waiting for their link (saved, not in effect).",
        None,
        st.pending_routes as f64,
    );
    b.gauge1(
        "control_token_required",
        "1 when the control port asks for a token; 0 when every local user controls the daemon.",
        None,
        if st.control_without_token { 0.0 } else { 1.0 },
    );

    datapath::links(&mut b, snap);
    datapath::kernel(&mut b, snap);
    datapath::dispatch(&mut b, snap);
    datapath::vhost(&mut b, snap);
    agent::agent(&mut b, snap);

    // The listener itself.
    let responses = b.counter(
        "http_responses",
        "Responses of the HTTP listener, by status code.",
        None,
    );
    for (code, n) in http.responses() {
        responses.set(&Labels::of("code", &code.to_string()), n);
    }
    let refused = b.counter(
        "http_refused",
        "Requests and connections the HTTP listener refused, by reason.",
        None,
    );
    for r in Refusal::ALL {
        refused.set(&Labels::of("reason", r.as_str()), http.refused(r));
    }
    b.counter1(
        "http_connections",
        "Connections the HTTP listener accepted.",
        None,
        http.accepted(),
    );
    b.gauge1(
        "http_active_connections",
        "Connections being served now.",
        None,
        http.active() as f64,
    );

    b.finish()
}
