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

/// How long a scrape renders under `SCHED_IDLE` before it goes on at normal priority, when
/// no other scrape did so within `PROMPT_SCRAPE_EVERY`: on a host whose cores a route storm
/// saturates, what such a scrape waits at most (a scrape at 1,000 links is about 7 ms of CPU).
const PROMPT_SCRAPE_IDLE: Duration = Duration::from_millis(50);

/// At most one scrape this often is moved to normal priority at `PROMPT_SCRAPE_IDLE`: two a
/// second, a Prometheus pair scraping every second. More scrapes than that (a scraper in a
/// loop) would take from the control port's and the data path's cores what the scraper
/// asks for; they wait under `SCHED_IDLE` for what those leave, up to `SLOW_SCRAPE_IDLE`.
const PROMPT_SCRAPE_EVERY: Duration = Duration::from_millis(500);

/// What a scrape beyond the prompt ones waits at most: Prometheus's default scrape timeout.
const SLOW_SCRAPE_IDLE: Duration = Duration::from_secs(10);

/// Which scrapes are prompt: at most one per `PROMPT_SCRAPE_EVERY`.
#[derive(Debug, Default)]
pub struct ScrapeBudget {
    last_prompt: Mutex<Option<Instant>>,
}

impl ScrapeBudget {
    /// How long the scrape starting `now` may render under `SCHED_IDLE`.
    pub fn idle_limit(&self, now: Instant) -> Duration {
        let mut last = self.last_prompt.lock_or_recover();
        match *last {
            Some(t) if now.saturating_duration_since(t) < PROMPT_SCRAPE_EVERY => SLOW_SCRAPE_IDLE,
            _ => {
                *last = Some(now);
                PROMPT_SCRAPE_IDLE
            }
        }
    }
}

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
    pub scrapes: ScrapeBudget,
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
        let limit = self.scrapes.idle_limit(Instant::now());
        vnet_dataplane::sys::run_idle_at_most(limit, work)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_scrape_per_period_is_prompt_the_rest_wait_for_idle_cores() {
        let b = ScrapeBudget::default();
        let t = Instant::now();
        // (a scrape this many ms after `t`, the limit it gets): one prompt scrape per period.
        for (ms, want) in [
            (0, PROMPT_SCRAPE_IDLE),
            (10, SLOW_SCRAPE_IDLE),
            (499, SLOW_SCRAPE_IDLE),
            (500, PROMPT_SCRAPE_IDLE),
            (600, SLOW_SCRAPE_IDLE),
        ] {
            assert_eq!(
                b.idle_limit(t + Duration::from_millis(ms)),
                want,
                "at {ms} ms"
            );
        }
        // Every second, as a Prometheus: every one prompt.
        for k in 2..10 {
            assert_eq!(b.idle_limit(t + Duration::from_secs(k)), PROMPT_SCRAPE_IDLE);
        }
    }
}
