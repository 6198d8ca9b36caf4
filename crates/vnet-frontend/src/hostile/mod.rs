//! Hostile-frontend cases: negotiate normally, misbehave, and record what the backend did.
//!
//! Every variant runs on its own connection. Guest memory is a memfd twice the declared
//! region; the undeclared half holds a canary pattern and hostile descriptors/rings point into
//! it, so a backend that fails to bounds-check shows up as `canary_intact: false`. The
//! `mem_truncate` variants cut the memfd short under the backend (a backend that does not
//! survive the SIGBUS goes away); the memfd gets its size back before this side touches it.
//!
//! The parts: `session` (one connection and its normal operations), `requests` (the
//! misbehaviours), `variants` (the table of cases), `checks` (what is looked at afterwards),
//! `report` (the record and its verdict); this module runs them.

mod checks;
mod report;
mod requests;
mod session;
mod variants;

pub use report::CaseReport;
pub use session::HostileOpts;

use crate::device::Endpoint;
use anyhow::Result;
use checks::{check_canary, finish_live, finish_stream};
use report::verdict;
use session::{Sess, GUARD_BYTE, READONLY_BYTE, RX, TX};
use std::time::Duration;
use variants::{variants, Kind, Variant};

/// Case names for `--case` (each has several variants).
pub const CASES: &[&str] = &[
    "desc_out_of_memory",
    "desc_len_huge",
    "desc_loop",
    "desc_index_oob",
    "ring_size_bad",
    "ring_addr_outside",
    "mem_table_bad",
    "avail_idx_jump",
    "rx_desc_readonly",
    "rx_buf_tiny",
    "msg_garbage",
    "truncated",
    "mem_truncate",
];

fn run_variant(ep: &Endpoint, o: &HostileOpts, v: &Variant) -> CaseReport {
    let mut rep = CaseReport {
        case: v.case.into(),
        variant: v.name.into(),
        description: v.what.into(),
        canary_intact: true,
        ..Default::default()
    };
    let mut s = match Sess::connect(ep, o, v.name == "sealed_memfd") {
        Ok(s) => s,
        Err((connected, e)) => {
            rep.connected = connected;
            rep.verdict = if connected {
                "setup_failed"
            } else {
                "connect_failed"
            }
            .into();
            rep.setup_error = Some(format!("{e:#}"));
            return rep;
        }
    };
    rep.connected = true;
    if v.kind != Kind::Setup {
        let mut notes = Vec::new();
        // (Truncate too: the cut comes on running rings.)
        if let Err(e) = s.bring_up(&mut notes) {
            rep.verdict = "setup_failed".into();
            rep.setup_error = Some(format!("{e:#}"));
            return rep;
        }
        rep.notes.extend(notes);
    }
    if let Err(e) = (v.body)(&mut s, &mut rep) {
        rep.notes.push(format!("internal: {e:#}"));
    }
    match v.kind {
        Kind::Stream => finish_stream(&mut s, &mut rep),
        Kind::Data => {
            std::thread::sleep(if v.rx { o.rx_wait } else { o.settle });
            let ring = if v.rx { RX } else { TX };
            let used = s.collect_used(ring);
            rep.used_entries = Some(used.len());
            rep.used_lens = used.iter().take(8).map(|e| e.1).collect();
            if v.rx && used.is_empty() {
                rep.notes.push(
                    "no rx used entries: either the backend refused the buffers or no traffic arrived during --rx-wait".into(),
                );
            }
            finish_live(&mut s, &mut rep, true);
        }
        Kind::Setup => {
            std::thread::sleep(o.settle);
            finish_live(&mut s, &mut rep, false);
        }
        Kind::Truncate => {
            std::thread::sleep(if v.rx { o.rx_wait } else { o.settle });
            if let Err(e) = s.mem.set_file_size(s.mem.len()) {
                // Touching the memory now would be SIGBUS here: report and stop.
                rep.notes.push(format!("memfd size not restored: {e}"));
                rep.verdict = "setup_failed".into();
                return rep;
            }
            finish_live(&mut s, &mut rep, true);
        }
    }
    // Buffer checks for the rx cases.
    if v.case == "rx_desc_readonly" {
        let mut b = vec![0u8; 64 * 4096];
        s.mem.read(s.scratch, &mut b);
        rep.readonly_written = Some(b.iter().any(|&x| x != READONLY_BYTE));
    }
    if v.case == "rx_buf_tiny" {
        let mut b = vec![0u8; 63 * 64];
        s.mem.read(s.scratch, &mut b);
        let ok = b
            .chunks(64)
            .all(|c| c[4..].iter().all(|&x| x == GUARD_BYTE));
        rep.guard_intact = Some(ok);
    }
    if rep.mem_cut == Some(true) {
        rep.notes
            .push("canary not checked: the memfd was cut short (its bytes are zeros now)".into());
    } else {
        check_canary(&s, &mut rep);
    }
    rep.verdict = verdict(&rep);
    rep
}

/// Runs `case` ("all" for every case); returns one report per variant.
pub fn run(
    ep: &Endpoint,
    o: &HostileOpts,
    case: &str,
    mut progress: impl FnMut(&CaseReport),
) -> Result<Vec<CaseReport>> {
    let all = variants();
    let chosen: Vec<&Variant> = if case == "all" {
        all.iter().collect()
    } else {
        let (c, v) = case.split_once('/').unwrap_or((case, ""));
        let list: Vec<&Variant> = all
            .iter()
            .filter(|x| x.case == c && (v.is_empty() || x.name == v))
            .collect();
        if list.is_empty() {
            anyhow::bail!("unknown case {case:?}; cases: all, {}", CASES.join(", "));
        }
        list
    };
    let mut out = Vec::new();
    for v in chosen {
        let rep = run_variant(ep, o, v);
        progress(&rep);
        out.push(rep);
        // Let the backend notice the closed connection before the next one.
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(out)
}

/// "case/variant" names, for --list.
pub fn variant_names() -> Vec<String> {
    variants()
        .iter()
        .map(|v| format!("{}/{}: {}", v.case, v.name, v.what))
        .collect()
}
