//! The one owner of the daemon's state: a thread that holds the configuration, the engine, the
//! etcd agent's record and the routes waiting for their link, and takes every change to them
//! over a channel ([`Inbox`]): from the control port (and so CNI), the etcd agent, the start's
//! restore, the reach thread, the state directory's writer. After each change it publishes a
//! [`View`] for the readers, which never take a lock that a change holds.
//!
//! Why one owner rather than a mutex: a change holds the state for as long as the engine works
//! (netlink, BPF map writes: seconds at worst for a device), and a mutex made every reader
//! either queue behind it or poll (`try_lock` and sleeps). Here no lock is held across a
//! syscall on the change path, changes are ordered by the channel (so journal records are in
//! the order of the changes), and readers load the last view.
//!
//! A request is a closure run on the owner thread; whoever waits for its answer gets it after
//! the view that includes the change is published (a `show` after an acknowledged change sees
//! it). The requests waiting when the owner takes one run one after the other before one
//! publication (up to 64): a storm of changes from many senders publishes per batch. A request
//! that panics is logged and its sender told; the owner goes on.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use vnet_control::{Change, Config, Route, RouteChange};
use vnet_core::LockRecover;
use vnet_dataplane::Engine;

use super::view::View;
use super::view_routes::RouteSlots;
use crate::derived::DerivedRecord;
use crate::pending::Pending;
use crate::persist::Saver;

/// The state the owner thread holds (nobody else touches it).
pub struct State {
    /// The running configuration: the local one (config file and control port) plus the
    /// objects derived from etcd (`derived`).
    pub cfg: Config,
    pub engine: Engine,
    /// What the etcd agent applied to `cfg` and has not taken back (empty without `--etcd`).
    pub derived: DerivedRecord,
    /// `derived` is exactly the agent's last derivation, and the local configuration has not
    /// changed since (the value of `local_changes` then): the agent's next delta applies to
    /// it as it is. None after a refused command, a restore, or before the first sync.
    pub derived_in_step: Option<u64>,
    /// Routes of the local configuration waiting for their link (`pending.rs`): saved with
    /// it, not in `cfg`.
    pub pending: Pending,
    /// Called by a change that reaches the engine, before it does (tests: a slow change).
    #[cfg(test)]
    pub before_engine: Option<Box<dyn FnMut() + Send>>,
}

impl State {
    /// The local configuration alone: the running one without the derived objects.
    #[cfg(test)]
    pub fn local_config(&self) -> Config {
        self.derived.local_config(&self.cfg)
    }

    /// The local configuration's script, rendered from the running one (no copy of it), with
    /// the routes waiting for their link after it: what is saved.
    pub fn local_script(&self) -> String {
        let mut s = self.derived.local_script(&self.cfg);
        s.push_str(&self.pending.script());
        s
    }
}

/// What the owner thread and the daemon's other threads share.
pub struct Common {
    /// The state directory's writer (None without one: unit tests).
    pub saver: Option<Saver>,
    /// Bumped by every change of the local configuration, so the etcd agent re-derives and
    /// re-publishes.
    pub local_changes: AtomicU64,
    /// Generation of the derived configuration's snapshots handed to the saver.
    pub derived_generation: AtomicU64,
    /// What readers see.
    pub view: ArcSwap<View>,
    /// Views published (tests: a batch of waiting changes publishes once).
    pub views_published: AtomicU64,
}

/// The owner: the state, and the parts of the view it keeps up to date change by change.
pub struct Owner {
    pub st: State,
    pub common: Arc<Common>,
    /// The running configuration without its routes, as the view has it.
    ports: Arc<Config>,
    ports_stale: bool,
    /// The routes, as the view has them: changed where a change names (`view_routes.rs`).
    routes: RouteSlots,
    routes_stale: bool,
}

impl Owner {
    /// The changes applied to the configuration: the view's parts follow (the routes at
    /// their positions; anything but a route makes the ports' part anew).
    pub fn note(&mut self, changes: &[Change]) {
        for c in changes {
            let Change::Route(rc) = c else {
                self.ports_stale = true;
                continue;
            };
            if self.routes_stale {
                continue;
            }
            match rc {
                RouteChange::Added(r) => self.routes.push(r),
                RouteChange::Removed { route, at } => self.take_route(*at, route),
                RouteChange::Replaced { old, at, new } => {
                    self.take_route(*at, old);
                    self.routes.push(new);
                }
            }
        }
    }

    fn take_route(&mut self, at: usize, route: &Route) {
        if !self.routes.remove(at, route) || self.routes.sparse() {
            // An undo (no position), a list out of step, or more empty slots than routes:
            // laid out anew from the configuration at the next publication.
            self.routes_stale = true;
        }
    }

    /// The configuration changed other than by noted changes (an undo, a restore): the view
    /// is made anew from it.
    pub fn renew(&mut self) {
        self.ports_stale = true;
        self.routes_stale = true;
    }

    /// Publishes the view of the state as it is now.
    pub fn publish_view(&mut self) {
        if self.ports_stale {
            let routes = std::mem::take(&mut self.st.cfg.routes);
            self.ports = Arc::new(self.st.cfg.clone());
            self.st.cfg.routes = routes;
            self.ports_stale = false;
        }
        if self.routes_stale {
            self.routes = RouteSlots::from_routes(self.st.cfg.routes.iter());
            self.routes_stale = false;
        }
        let view = View {
            ports: self.ports.clone(),
            routes: self.routes.view(),
            derived: self.st.derived.index().clone(),
            pending: Arc::new(self.st.pending.clone()),
            engine: self.st.engine.status(),
        };
        #[cfg(all(test, debug_assertions))]
        assert!(
            view.running_config().routes == self.st.cfg.routes,
            "the view's routes follow the configuration's"
        );
        self.common.view.store(Arc::new(view));
        self.common
            .views_published
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What a request leaves to do once the view with its change is published (its answer).
type Then = Box<dyn FnOnce() + Send>;

/// A request to the owner.
type Job = Box<dyn FnOnce(&mut Owner) -> Option<Then> + Send>;

/// At most this many requests that were waiting run before one publication (their answers
/// wait for it).
const BATCH: usize = 64;

/// The owner's inbox: requests go in, the owner thread runs them in order.
pub struct Inbox {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Inbox {
    /// Starts the owner thread with `engine` and an empty configuration; its first view is
    /// published before this returns.
    pub fn start(engine: Engine, common: Arc<Common>) -> Inbox {
        let (tx, rx) = mpsc::channel::<Job>();
        let mut owner = Owner {
            st: State {
                cfg: Config::default(),
                engine,
                derived: DerivedRecord::default(),
                derived_in_step: None,
                pending: Pending::default(),
                #[cfg(test)]
                before_engine: None,
            },
            common,
            ports: Arc::new(Config::default()),
            ports_stale: true,
            routes: RouteSlots::default(),
            routes_stale: true,
        };
        owner.publish_view();
        let thread = std::thread::Builder::new()
            .name("vnetd-owner".into())
            .spawn(move || {
                let mut then: Vec<Then> = Vec::with_capacity(BATCH);
                while let Ok(first) = rx.recv() {
                    // Every request already waiting runs before one publication: a storm
                    // publishes per batch, not per change.
                    let mut next = Some(first);
                    let mut ran = 0;
                    while let Some(job) = next.take() {
                        ran += 1;
                        match catch_unwind(AssertUnwindSafe(|| job(&mut owner))) {
                            Ok(t) => then.extend(t),
                            Err(_) => {
                                tracing::error!("a change panicked in the daemon's owner thread");
                                owner.renew();
                            }
                        }
                        if ran < BATCH {
                            next = rx.try_recv().ok();
                        }
                    }
                    owner.publish_view();
                    for t in then.drain(..) {
                        t();
                    }
                }
            })
            .ok();
        if thread.is_none() {
            tracing::error!("cannot start the daemon's owner thread");
        }
        Inbox {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(thread),
        }
    }

    fn send(&self, job: Job) -> bool {
        let tx = self.tx.lock_or_recover();
        tx.as_ref().is_some_and(|tx| tx.send(job).is_ok())
    }

    /// Runs `f` on the owner and waits for its answer, given once the view with what it did
    /// is published. Err: the owner is gone, or `f` panicked.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Owner) -> T + Send + 'static,
    ) -> Result<T, String> {
        let (tx, rx) = mpsc::sync_channel(1);
        let sent = self.send(Box::new(move |o: &mut Owner| {
            let t = f(o);
            Some(Box::new(move || {
                let _ = tx.send(t);
            }) as Then)
        }));
        if !sent {
            return Err("the daemon's owner thread is gone".into());
        }
        rx.recv()
            .map_err(|_| "the daemon's owner thread failed on this change".into())
    }

    /// Runs `f` on the owner without waiting for it (the reach thread's path changes: it must
    /// never wait for a change in progress).
    pub fn post(&self, f: impl FnOnce(&mut Owner) + Send + 'static) {
        self.send(Box::new(move |o: &mut Owner| {
            f(o);
            None
        }));
    }

    /// Stops the owner thread once it has run what it was sent (the state, and the engine
    /// with it, dropped there).
    pub fn stop(&self) {
        self.tx.lock_or_recover().take();
        let t = self.thread.lock_or_recover().take();
        if let Some(t) = t {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}
