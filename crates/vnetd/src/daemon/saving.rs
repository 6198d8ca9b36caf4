//! The daemon's side of the state directory (`persist.rs` writes it): what a change leaves to
//! save, and when a change may be acknowledged (issue 32).
//!
//! The owner thread appends a change's journal record right after the change (records go in
//! the order of the changes); a record that cannot be written undoes the change and refuses
//! the command. The sync happens on the caller's thread after the owner has moved on
//! ([`Common::saved`]): a change is acknowledged only once its record is durable; a record
//! that cannot be synced is saved by a whole write instead, and when that fails too the
//! command fails saying the change is in effect and not saved. The owner never syncs and
//! never waits for the writer (the writer asks the owner to render the configuration for a
//! compaction, so the reverse would deadlock).

use std::sync::atomic::Ordering::Relaxed;

use vnet_control::Change;

use super::owner::{Common, Owner, State};
use crate::delta::local_delta;
use crate::journal::{self, Kind};
use crate::persist::{Appended, Saver};

/// What is left to do for the state directory after a change of the local configuration,
/// on the caller's thread: its journal record synced (before the change is acknowledged), and
/// the devices made for it recorded when ports changed.
pub struct Saving {
    appended: Option<Appended>,
    ports: Option<Ports>,
}

/// The devices vnetd made and the forwarding values it changed (for `host.json`).
pub struct Ports {
    made: Vec<vnet_dataplane::made::MadeDevice>,
    forwarding: Vec<vnet_fastpath::ForwardingOriginal>,
}

impl Ports {
    fn of(st: &State) -> Ports {
        Ports {
            made: st.engine.made_devices(),
            forwarding: st.engine.kernel_forwarding_originals(),
        }
    }
}

/// The whole local configuration with the journal cut at `seq` (a start, a compaction).
pub struct Whole {
    seq: u64,
    script: String,
    ports: Ports,
}

impl Owner {
    /// Appends a change of the local configuration to the journal, right after the change.
    /// `extra`: lines the changes do not say (waiting routes deleted). `ports`: the change
    /// made or removed devices. Err: the record could not be written (the caller undoes the
    /// change).
    pub fn journal(
        &self,
        changes: &[Change],
        extra: &str,
        ports: bool,
    ) -> Result<Option<Saving>, String> {
        let Some(saver) = self.common.saver.as_ref() else {
            return Ok(None);
        };
        let st = &self.st;
        let delta = local_delta(changes, &|r| st.derived.has_route(r), &|l| {
            st.derived.has_link(l)
        })
        .map(|mut t| {
            t.push_str(extra);
            t
        });
        let appended = match delta {
            Some(text) if text.is_empty() => None,
            // A change whose lines would not fit a record (a batch replacing 100,000 routes)
            // is saved as the whole configuration, which always fits.
            Some(text) if text.len() < journal::MAX_PAYLOAD => {
                Some(saver.append(Kind::Delta, &text)?)
            }
            _ => Some(saver.append(Kind::Snapshot, &st.local_script())?),
        };
        Ok(Some(Saving {
            appended,
            ports: ports.then(|| Ports::of(st)),
        }))
    }

    /// The whole local configuration, the journal cut where it is.
    pub fn whole(&self) -> Option<Whole> {
        let saver = self.common.saver.as_ref()?;
        let script = self.st.local_script();
        Some(Whole {
            seq: saver.cut(script.len()),
            script,
            ports: Ports::of(&self.st),
        })
    }

    /// The local configuration rendered for a compaction, the journal cut where it is.
    pub fn render_local(&self) -> Option<(u64, String)> {
        let saver = self.common.saver.as_ref()?;
        let script = self.st.local_script();
        Some((saver.cut(script.len()), script))
    }

    /// The derived configuration rendered now, with a new generation.
    pub fn derived_snapshot(&self) -> Option<(u64, String)> {
        self.common.saver.as_ref()?;
        let g = self.common.derived_generation.fetch_add(1, Relaxed) + 1;
        let mut text = String::new();
        for c in self.st.derived.commands() {
            if let Some(l) = vnet_cluster::render_command(&c) {
                text.push_str(&l);
                text.push('\n');
            }
        }
        Some((g, text))
    }
}

impl Common {
    /// The change's record on disk (then it may be acknowledged), and its devices recorded.
    pub fn saved(&self, saving: Option<Saving>) -> Result<(), String> {
        let (Some(saver), Some(s)) = (&self.saver, saving) else {
            return Ok(());
        };
        let synced = s.appended.map_or(Ok(()), |a| saver.sync(a));
        if let Some(p) = s.ports {
            record_ports(saver, p);
        }
        synced
    }

    pub fn save_whole(&self, w: Option<Whole>) -> Result<(), String> {
        let (Some(saver), Some(w)) = (&self.saver, w) else {
            return Ok(());
        };
        let saved = saver.whole(w.seq, &w.script);
        record_ports(saver, w.ports);
        saved
    }

    pub fn save_derived(&self, snap: Option<(u64, String)>) {
        if let (Some(saver), Some((g, text))) = (&self.saver, snap) {
            saver.derived(g, text);
        }
    }
}

fn record_ports(saver: &Saver, p: Ports) {
    saver.update_resources(|r| {
        r.made = p.made.into_iter().map(|d| (d.netns, d.ifname)).collect();
        r.set_forwarding(&p.forwarding);
    });
}
