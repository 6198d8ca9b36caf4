//! The daemon as the HTTP listener sees it (`vnet_http::Source`): typed snapshots of its
//! status, the etcd agent's state, and the traffic matrices the overlay's hosts publish.
//!
//! The agent's state is read in one place, [`agent_snapshot`], so that the listener does not
//! depend on how the agent keeps it. The published matrices are not part of what the agent
//! keeps (it skips them); they are read from etcd here, at most once a second and only while
//! someone looks at the overlay view.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vnet_cluster::{matrix_prefix, HostId, MatrixRecord, OverlayName};
use vnet_control::status::MatrixReport;
use vnet_core::LockRecover;
use vnet_http::{AgentSnapshot, HostSnapshot, OverlaySnapshot, Source};

use crate::daemon::Daemon;

/// How long one read of the published matrices is reused.
const MATRIX_READ_EVERY: Duration = Duration::from_millis(900);

/// The agent's state for the metrics and the view: what `show cluster` reports, and the age
/// of the last synchronisation.
pub fn agent_snapshot(daemon: &Daemon) -> Option<AgentSnapshot> {
    let status = daemon.cluster_status.lock_or_recover().clone()?;
    let last_sync_age = daemon.last_sync(|at, _| at.elapsed());
    Some(AgentSnapshot {
        status,
        last_sync_age,
    })
}

/// One read of the published matrices: when, and what it gave.
type MatrixRead = (Instant, Result<Vec<MatrixRecord>, String>);

/// Where the overlay's published matrices are read from.
pub struct MatrixReader {
    pub client: vnet_etcd::Client,
    pub overlay: OverlayName,
    pub host: HostId,
    cache: Mutex<Option<MatrixRead>>,
}

impl MatrixReader {
    pub fn new(client: vnet_etcd::Client, overlay: OverlayName, host: HostId) -> MatrixReader {
        MatrixReader {
            client,
            overlay,
            host,
            cache: Mutex::new(None),
        }
    }

    fn read(&self) -> Result<Vec<MatrixRecord>, String> {
        let mut cache = self.cache.lock_or_recover();
        if let Some((at, m)) = cache.as_ref() {
            if at.elapsed() < MATRIX_READ_EVERY {
                return m.clone();
            }
        }
        let prefix = matrix_prefix(&self.overlay);
        let m = self
            .client
            .get_prefix(prefix.as_bytes())
            .map_err(|e| e.to_string())
            .map(|r| {
                r.kvs
                    .iter()
                    .filter_map(|kv| MatrixRecord::decode(&kv.value).ok())
                    .collect()
            });
        *cache = Some((Instant::now(), m.clone()));
        m
    }
}

pub struct DaemonSource {
    pub daemon: Arc<Daemon>,
    pub matrices: Option<MatrixReader>,
}

impl Source for DaemonSource {
    fn host(&self) -> HostSnapshot {
        HostSnapshot {
            stats: self.daemon.stats(),
            links: self.daemon.links(),
            interfaces: self.daemon.interfaces(),
            agent: agent_snapshot(&self.daemon),
        }
    }

    fn matrix(&self) -> MatrixReport {
        self.daemon.matrix_report()
    }

    fn background(&self, work: &mut dyn FnMut()) {
        vnet_dataplane::sys::run_idle(work)
    }

    fn overlay(&self) -> Option<OverlaySnapshot> {
        let reader = self.matrices.as_ref()?;
        let state = self.daemon.last_sync(|_, s| s.clone());
        Some(OverlaySnapshot {
            local_host: reader.host.clone(),
            state,
            matrices: reader.read(),
        })
    }
}
