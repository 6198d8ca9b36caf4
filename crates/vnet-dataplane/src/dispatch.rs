//! Dispatcher threads (VNET/P sections 4.5-4.6): each reads a share of the descriptors (TAP
//! queues, the VXLAN socket, packet sockets) and forwards what it reads.
//!
//! - guest-driven: block in `epoll_wait` until a descriptor is ready;
//! - polling: read every descriptor in turn without blocking; a pass that found nothing yields
//!   the core as the yield strategy says (immediate `sched_yield`, timed sleep, or adaptive:
//!   immediate until idle for T_nowork, then timed);
//! - adaptive: measure the frame rate over a window ω and switch with hysteresis, to polling
//!   above α_u and back below α_l; guest-driven and idle (no frame in the window), it blocks
//!   as guest-driven does (see [`ModeSwitch`]).
//!
//! A panic in a dispatcher's loop (a bug in a reader or in forwarding) must not stop
//! forwarding, and must not abort vnetd: it is caught, counted (`restarts`), logged, and the
//! loop starts again with fresh state on the same sources and settings. CPU numbers are checked
//! before they reach `libc::CPU_SET`, whose out-of-range panic cannot be caught.

use std::any::Any;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use thiserror::Error;
use tracing::{error, info, warn};
use vnet_control::status::DispatcherStatus;
use vnet_control::{DataPathSettings, DispatchMode, YieldStrategy};
use vnet_core::LockRecover;

use crate::forward::IDLE_TICK;
use crate::ingress::{RxWork, Source};
use crate::shared::Shared;
use crate::sys::{self, Epoll, EpollEvent, EventFd};

const WAKE_TOKEN: u64 = u64::MAX;
/// Pause after a caught panic, so a reader that panics on every read can neither spin a core
/// nor starve the dispatcher's other sources for long.
const PANIC_PAUSE: Duration = Duration::from_millis(10);

/// The adaptive mode's switch (VNET/P section 4.5): the frame rate over a window of ω, with
/// hysteresis between α_l and α_u. Pure: the caller passes the time.
///
/// A window measures a rate, so a window that saw no frame at all has nothing to decide while
/// the dispatcher is guest-driven (a rate of zero never crosses α_u): an idle dispatcher
/// blocks for its idle tick ([`ModeSwitch::wait`]) rather than waking at every ω, and the
/// next frames start a window of their own, so the switch reacts to traffic after a quiet
/// spell within one ω of its first frames, as it does within one ω of a window's start.
/// While polling, every window is judged, empty ones included (that is how polling ends).
#[derive(Debug, Clone)]
pub struct ModeSwitch {
    polling: bool,
    window_start: Instant,
    window_frames: u64,
}

impl ModeSwitch {
    pub fn new(polling: bool, now: Instant) -> ModeSwitch {
        ModeSwitch {
            polling,
            window_start: now,
            window_frames: 0,
        }
    }

    pub fn polling(&self) -> bool {
        self.polling
    }

    /// Forces the mode (the fixed modes); the window restarts.
    pub fn set(&mut self, polling: bool, now: Instant) {
        self.polling = polling;
        self.window_start = now;
        self.window_frames = 0;
    }

    /// Counts `frames` handled now; at the end of a window of `window`, switches to polling
    /// above `high` frames/s or back below `low`. Returns true when the mode changed.
    pub fn observe(
        &mut self,
        frames: u64,
        now: Instant,
        window: Duration,
        low: u32,
        high: u32,
    ) -> bool {
        let el = now.saturating_duration_since(self.window_start);
        if !self.polling && self.window_frames == 0 && el >= window {
            // The windows since the last frame were empty: nothing to decide. Frames now
            // start the next window.
            if frames > 0 {
                self.window_start = now;
                self.window_frames = frames;
            }
            return false;
        }
        self.window_frames = self.window_frames.saturating_add(frames);
        if el < window || el.is_zero() {
            return false;
        }
        let rate = self.window_frames as f64 / el.as_secs_f64();
        let was = self.polling;
        if !self.polling && rate > high as f64 {
            self.polling = true;
        } else if self.polling && rate < low as f64 {
            self.polling = false;
        }
        self.window_start = now;
        self.window_frames = 0;
        was != self.polling
    }

    /// How long a guest-driven dispatcher may block before it must [`ModeSwitch::observe`]
    /// again: until the end of the window when the window has seen frames (its rate is judged
    /// then), else `idle` (a frame wakes it anyway). Zero while polling (it never blocks).
    pub fn wait(&self, now: Instant, window: Duration, idle: Duration) -> Duration {
        if self.polling {
            Duration::ZERO
        } else if self.window_frames > 0 {
            (self.window_start + window).saturating_duration_since(now)
        } else {
            idle
        }
    }
}

/// A wait as `epoll_wait` takes it: whole milliseconds, rounded up (a window that ends in
/// 0.3 ms is judged after it has ended, not 0.3 ms early by a busy loop of zero timeouts).
fn wait_ms(d: Duration) -> i32 {
    i32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
}

/// One dispatcher's shared state: its sources, and counters for `show stats`.
struct DState {
    index: usize,
    epoll: Epoll,
    wake: EventFd,
    stop: AtomicBool,
    sources: Mutex<Vec<Arc<Source>>>,
    gen: AtomicU64,
    seen: AtomicU64,
    polling: AtomicBool,
    switches: AtomicU64,
    wakeups: AtomicU64,
    frames: AtomicU64,
    /// Panics caught in the loop, each followed by a restart with fresh state.
    restarts: AtomicU64,
}

impl DState {
    fn new(index: usize) -> io::Result<DState> {
        let epoll = Epoll::new()?;
        let wake = sys::eventfd()?;
        sys::epoll_add(&epoll, std::os::fd::AsRawFd::as_raw_fd(&wake), WAKE_TOKEN)?;
        Ok(DState {
            index,
            epoll,
            wake,
            stop: AtomicBool::new(false),
            sources: Mutex::new(Vec::new()),
            gen: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            polling: AtomicBool::new(false),
            switches: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            frames: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
        })
    }

    fn count(&self) -> usize {
        self.sources.lock_or_recover().len()
    }

    fn add(&self, s: Arc<Source>) {
        if let Err(e) = sys::epoll_add(&self.epoll, s.reader.fd(), s.id) {
            warn!(dispatcher = self.index, "epoll add: {e}");
        }
        self.sources.lock_or_recover().push(s);
        self.gen.fetch_add(1, SeqCst);
        sys::signal(&self.wake);
    }

    /// Removes a source and waits (up to 2 s) until the thread no longer uses it.
    fn remove(&self, s: &Arc<Source>) -> bool {
        let mut v = self.sources.lock_or_recover();
        let Some(pos) = v.iter().position(|x| x.id == s.id) else {
            return false;
        };
        v.remove(pos);
        drop(v);
        let _ = sys::epoll_del(&self.epoll, s.reader.fd());
        let g = self.gen.fetch_add(1, SeqCst) + 1;
        sys::signal(&self.wake);
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.seen.load(SeqCst) < g && Instant::now() < deadline && !self.stop.load(SeqCst) {
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }
}

struct Slot {
    state: Arc<DState>,
    thread: Option<JoinHandle<()>>,
}

/// The dispatcher threads, and which sources each reads.
pub struct DispatcherSet {
    shared: Arc<Shared>,
    settings: Arc<ArcSwap<DataPathSettings>>,
    slots: Vec<Slot>,
    sources: Vec<Arc<Source>>,
}

impl DispatcherSet {
    pub fn new(shared: Arc<Shared>, settings: DataPathSettings) -> io::Result<DispatcherSet> {
        let mut d = DispatcherSet {
            shared,
            settings: Arc::new(ArcSwap::from_pointee(settings)),
            slots: Vec::new(),
            sources: Vec::new(),
        };
        d.start()?;
        Ok(d)
    }

    fn start(&mut self) -> io::Result<()> {
        let n = self.settings.load().dispatchers.max(1) as usize;
        for i in 0..n {
            let state = Arc::new(DState::new(i)?);
            let (st, sh, se) = (state.clone(), self.shared.clone(), self.settings.clone());
            let thread = std::thread::Builder::new()
                .name(format!("dispatch-{i}"))
                .spawn(move || run(st, sh, se))?;
            self.slots.push(Slot {
                state,
                thread: Some(thread),
            });
        }
        let sources = std::mem::take(&mut self.sources);
        for s in sources {
            self.add(s);
        }
        Ok(())
    }

    pub fn stop(&mut self) {
        for s in &self.slots {
            s.state.stop.store(true, SeqCst);
            sys::signal(&s.state.wake);
        }
        for s in self.slots.iter_mut() {
            if let Some(t) = s.thread.take() {
                let _ = t.join();
            }
        }
        self.slots.clear();
    }

    /// Gives a source to the dispatcher with the fewest.
    pub fn add(&mut self, s: Arc<Source>) {
        if let Some(slot) = self
            .slots
            .iter()
            .min_by_key(|sl| (sl.state.count(), sl.state.index))
        {
            slot.state.add(s.clone());
        }
        self.sources.push(s);
    }

    pub fn remove(&mut self, s: &Arc<Source>) {
        self.sources.retain(|x| x.id != s.id);
        for slot in &self.slots {
            if slot.state.remove(s) {
                break;
            }
        }
    }

    pub fn contains(&self, s: &Arc<Source>) -> bool {
        self.sources.iter().any(|x| x.id == s.id)
    }

    pub fn settings(&self) -> DataPathSettings {
        (**self.settings.load()).clone()
    }

    /// Applies new settings; the number of dispatchers and their CPUs take a restart of the
    /// threads (a few milliseconds without forwarding), everything else applies at once.
    pub fn configure(&mut self, new: DataPathSettings) -> io::Result<()> {
        let old = self.settings.load_full();
        let restart = old.dispatchers != new.dispatchers || old.cpus != new.cpus;
        self.settings.store(Arc::new(new));
        if restart {
            info!("restarting dispatchers");
            self.stop();
            self.start()?;
        } else {
            // Wake dispatchers blocked in epoll_wait so a new mode applies at once.
            for sl in &self.slots {
                sys::signal(&sl.state.wake);
            }
        }
        Ok(())
    }

    pub fn status(&self) -> Vec<DispatcherStatus> {
        self.readout().status()
    }

    /// What a reader on another thread needs for the dispatchers' status (shared, not
    /// copied: it stays current until the threads restart, which a change of the settings
    /// does).
    pub fn readout(&self) -> DispatchReadout {
        DispatchReadout {
            settings: self.settings.clone(),
            states: self.slots.iter().map(|s| s.state.clone()).collect(),
        }
    }
}

/// The dispatchers' settings and counters, read without the [`DispatcherSet`].
#[derive(Clone)]
pub struct DispatchReadout {
    settings: Arc<ArcSwap<DataPathSettings>>,
    states: Vec<Arc<DState>>,
}

impl DispatchReadout {
    pub fn settings(&self) -> DataPathSettings {
        (**self.settings.load()).clone()
    }

    pub fn status(&self) -> Vec<DispatcherStatus> {
        self.states
            .iter()
            .map(|st| {
                let (w, f) = (st.wakeups.load(Relaxed), st.frames.load(Relaxed));
                DispatcherStatus {
                    index: st.index,
                    mode: if st.polling.load(Relaxed) {
                        "polling"
                    } else {
                        "guest-driven"
                    },
                    switches: st.switches.load(Relaxed),
                    wakeups: w,
                    frames: f,
                    frames_per_wakeup: if w > 0 {
                        (f as f64 / w as f64 * 100.0).round() / 100.0
                    } else {
                        0.0
                    },
                    sources: st.count(),
                    restarts: st.restarts.load(Relaxed),
                }
            })
            .collect()
    }
}

impl Drop for DispatcherSet {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why `set cpus` was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CpuError {
    #[error("CPU {cpu} does not exist or vnetd may not run on it (it may run on {allowed})")]
    NotAllowed { cpu: u32, allowed: String },
    #[error("cannot read the CPUs vnetd may run on: {0}")]
    Affinity(String),
}

/// Checks a `set cpus` list against the CPUs this process may run on, `allowed`.
pub fn check_cpus(cpus: &[u32], allowed: &[u32]) -> Result<(), CpuError> {
    match cpus.iter().find(|c| !allowed.contains(c)) {
        Some(&cpu) => Err(CpuError::NotAllowed {
            cpu,
            allowed: cpu_list(allowed),
        }),
        None => Ok(()),
    }
}

/// Checks a `set cpus` list against this machine: CPUs that exist and are in the process's
/// affinity mask.
pub fn check_cpus_here(cpus: &[u32]) -> Result<(), CpuError> {
    if cpus.is_empty() {
        return Ok(());
    }
    let allowed = sys::allowed_cpus().map_err(|e| CpuError::Affinity(e.to_string()))?;
    check_cpus(cpus, &allowed)
}

/// A CPU list as ranges, `0-3,6`; `none` when empty.
fn cpu_list(cpus: &[u32]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

fn pin_to_cpu(index: usize, cpu: u32) {
    if let Err(e) = sys::pin_thread(cpu) {
        warn!(dispatcher = index, cpu, "could not pin dispatcher: {e}");
    }
}

/// The text of a panic's payload (`panic!` with a literal or a formatted message).
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// Counts and logs a caught panic, then pauses (see [`PANIC_PAUSE`]).
fn restarted(st: &DState, payload: &(dyn Any + Send)) {
    let n = st.restarts.fetch_add(1, Relaxed) + 1;
    if n <= 10 || n.is_multiple_of(1000) {
        error!(
            dispatcher = st.index,
            restarts = n,
            "dispatcher panicked: {}; restarting it with fresh state",
            panic_message(payload)
        );
    }
    std::thread::sleep(PANIC_PAUSE);
}

fn run(st: Arc<DState>, shared: Arc<Shared>, settings: Arc<ArcSwap<DataPathSettings>>) {
    let first = settings.load_full();
    if !first.cpus.is_empty() {
        pin_to_cpu(st.index, first.cpus[st.index % first.cpus.len()]);
    }
    // The loop's state is rebuilt after a panic; what it shares (sources, counters, the
    // snapshot) is behind locks that recover from poisoning or is atomic.
    loop {
        match catch_unwind(AssertUnwindSafe(|| serve(&st, &shared, &settings))) {
            Ok(()) => return,
            Err(p) => restarted(&st, &*p),
        }
    }
}

/// The dispatcher's loop, until it is stopped.
fn serve(st: &DState, shared: &Arc<Shared>, settings: &ArcSwap<DataPathSettings>) {
    let first = settings.load_full();
    let mut w = RxWork::new(st.index);
    let mut read_errors = 0u64;
    let mut local: Vec<Arc<Source>> = Vec::new();
    let mut local_gen = u64::MAX;
    let mut events = vec![EpollEvent::default(); 64];
    let mut mode = ModeSwitch::new(first.mode == DispatchMode::Polling, Instant::now());
    let mut idle_since = Instant::now();
    let mut last_expire = Instant::now();
    let mut drain = |w: &mut RxWork, src: &Source| -> u64 {
        let snap = shared.snapshot.load_full();
        // Caught here rather than by `run`, so the pass still reads the other sources.
        match catch_unwind(AssertUnwindSafe(|| src.reader.drain(w, shared, &snap))) {
            Ok(Ok(n)) => n as u64,
            Err(p) => {
                restarted(st, &*p);
                // The batch in flight is lost; the buffers may be half-written.
                *w = RxWork::new(st.index);
                0
            }
            Ok(Err(e)) => {
                read_errors += 1;
                if read_errors == 1 || read_errors.is_multiple_of(1000) {
                    warn!("read: {e} ({read_errors} errors)");
                }
                // Back off so a descriptor that errors persistently cannot spin a core.
                std::thread::sleep(Duration::from_millis(1));
                0
            }
        }
    };
    while !st.stop.load(Relaxed) {
        let g = st.gen.load(SeqCst);
        if g != local_gen {
            local = st.sources.lock_or_recover().clone();
            local_gen = g;
            st.seen.store(g, SeqCst);
        }
        let s = settings.load();
        match s.mode {
            DispatchMode::GuestDriven if mode.polling() => mode.set(false, Instant::now()),
            DispatchMode::Polling if !mode.polling() => mode.set(true, Instant::now()),
            _ => {}
        }
        let mut n = 0u64;
        if mode.polling() {
            for src in &local {
                n += drain(&mut w, src);
            }
            if n > 0 {
                st.wakeups.fetch_add(1, Relaxed);
                idle_since = Instant::now();
            } else {
                let sleep = Duration::from_micros(s.yield_sleep_us as u64);
                match s.yield_strategy {
                    YieldStrategy::Immediate => std::thread::yield_now(),
                    YieldStrategy::Timed => std::thread::sleep(sleep),
                    YieldStrategy::Adaptive => {
                        if idle_since.elapsed() < Duration::from_micros(s.yield_nowork_us as u64) {
                            std::thread::yield_now()
                        } else {
                            std::thread::sleep(sleep)
                        }
                    }
                }
            }
        } else {
            let timeout = if s.mode == DispatchMode::Adaptive {
                let window = Duration::from_millis(s.adaptive_window_ms as u64);
                mode.wait(Instant::now(), window, IDLE_TICK)
            } else {
                IDLE_TICK
            };
            let k = sys::epoll_wait(&st.epoll, wait_ms(timeout), &mut events).unwrap_or(0);
            for ev in &events[..k] {
                let token = ev.data();
                if token == WAKE_TOKEN {
                    let _ = st.wake.read();
                    continue;
                }
                if let Some(src) = local.iter().find(|x| x.id == token) {
                    n += drain(&mut w, src);
                }
            }
            if n > 0 {
                st.wakeups.fetch_add(1, Relaxed);
            }
        }
        st.frames.fetch_add(n, Relaxed);
        if s.mode == DispatchMode::Adaptive
            && mode.observe(
                n,
                Instant::now(),
                Duration::from_millis(s.adaptive_window_ms as u64),
                s.adaptive_low,
                s.adaptive_high,
            )
        {
            st.switches.fetch_add(1, Relaxed);
        }
        st.polling.store(mode.polling(), Relaxed);
        // Publish this pass's traffic-matrix counts (a short uncontended lock per pass with
        // work, so `show matrix` lags by one pass at most).
        if n > 0 {
            w.flush_matrix(shared);
        }
        if st.index == 0 && last_expire.elapsed() >= Duration::from_secs(10) {
            last_expire = Instant::now();
            shared.expire_learned();
        }
    }
    w.flush_matrix(shared);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::Reader;
    use crate::shared::Snapshot;
    use std::os::fd::{AsRawFd, RawFd};
    use std::sync::atomic::AtomicU32;

    /// A test reader: its first `panics` reads panic (a bug; its descriptor stays readable),
    /// the others count the events signalled on its descriptor.
    struct TestReader {
        fd: EventFd,
        panics: AtomicU32,
        seen: AtomicU64,
    }

    impl TestReader {
        fn new(panics: u32) -> Arc<Self> {
            Arc::new(TestReader {
                fd: sys::eventfd().expect("eventfd"),
                panics: AtomicU32::new(panics),
                seen: AtomicU64::new(0),
            })
        }
    }

    impl Reader for TestReader {
        fn fd(&self) -> RawFd {
            self.fd.as_raw_fd()
        }
        fn drain(&self, _: &mut RxWork, _: &Shared, _: &Snapshot) -> io::Result<usize> {
            if self.panics.load(SeqCst) > 0 {
                self.panics.fetch_sub(1, SeqCst);
                panic!("a reader bug (test)");
            }
            match self.fd.read() {
                Ok(n) => {
                    self.seen.fetch_add(n, SeqCst);
                    Ok(n as usize)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                Err(e) => Err(e),
            }
        }
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn one_dispatcher(mode: DispatchMode) -> DispatcherSet {
        let settings = DataPathSettings {
            mode,
            dispatchers: 1,
            ..DataPathSettings::default()
        };
        DispatcherSet::new(crate::testing::shared(), settings).expect("dispatchers")
    }

    /// A reader that panics, on every read or a few times, is caught: the dispatcher counts
    /// each restart and keeps reading its other sources.
    #[test]
    fn a_panicking_reader_does_not_stop_the_dispatcher() {
        for (mode, panics) in [
            (DispatchMode::GuestDriven, u32::MAX),
            (DispatchMode::Polling, u32::MAX),
            (DispatchMode::GuestDriven, 3),
            (DispatchMode::Adaptive, 3),
        ] {
            let mut d = one_dispatcher(mode);
            let buggy = TestReader::new(panics);
            let good = TestReader::new(0);
            struct Shim<R>(Arc<R>);
            impl<R: Reader> Reader for Shim<R> {
                fn fd(&self) -> RawFd {
                    self.0.fd()
                }
                fn drain(&self, w: &mut RxWork, sh: &Shared, sn: &Snapshot) -> io::Result<usize> {
                    self.0.drain(w, sh, sn)
                }
            }
            d.add(Arc::new(Source::new(Box::new(Shim(buggy.clone())))));
            d.add(Arc::new(Source::new(Box::new(Shim(good.clone())))));
            sys::signal(&buggy.fd);
            wait_for("a restart", || d.status()[0].restarts >= 1);
            for i in 1..=5u64 {
                sys::signal(&good.fd);
                wait_for("the healthy source to be read", || {
                    good.seen.load(SeqCst) >= i
                });
            }
            let st = &d.status()[0];
            assert!(st.restarts >= 1, "{st:?}");
            assert_eq!(st.sources, 2, "{st:?}");
            if panics != u32::MAX {
                // Once the bug stops, so do the restarts.
                wait_for("the buggy reader to recover", || {
                    buggy.panics.load(SeqCst) == 0
                });
                let n = d.status()[0].restarts;
                assert_eq!(n, panics as u64);
                sys::signal(&buggy.fd);
                sys::signal(&good.fd);
                wait_for("the healthy source again", || good.seen.load(SeqCst) >= 6);
                assert_eq!(d.status()[0].restarts, n);
            }
            d.stop();
        }
    }

    #[test]
    fn cpus_are_checked_against_the_allowed_set() {
        assert_eq!(check_cpus(&[], &[0, 1]), Ok(()));
        assert_eq!(check_cpus(&[1, 0, 1], &[0, 1]), Ok(()));
        assert_eq!(
            check_cpus(&[0, 5, 9], &[0, 1, 2, 3, 6]),
            Err(CpuError::NotAllowed {
                cpu: 5,
                allowed: "0-3,6".into()
            })
        );
        let e = check_cpus(&[2000], &[0, 1]).unwrap_err().to_string();
        assert!(e.contains("CPU 2000") && e.contains("0-1"), "{e}");
        assert_eq!(cpu_list(&[]), "none");
        assert_eq!(cpu_list(&[7, 1, 2, 3, 5, 7, 9, 10]), "1-3,5,7,9-10");
    }

    #[test]
    fn this_machine_allows_some_cpus_and_not_others() {
        let allowed = sys::allowed_cpus().expect("sched_getaffinity");
        assert!(!allowed.is_empty());
        assert_eq!(check_cpus_here(&allowed), Ok(()));
        assert_eq!(check_cpus_here(&[]), Ok(()));
        // The parser's bound is the largest CPU a cpu_set_t can name.
        assert_eq!(vnet_control::MAX_CPU as usize + 1, sys::CPU_SETSIZE);
        let missing = (0..=vnet_control::MAX_CPU).find(|c| !allowed.contains(c));
        if let Some(c) = missing {
            assert!(matches!(
                check_cpus_here(&[c]),
                Err(CpuError::NotAllowed { cpu, .. }) if cpu == c
            ));
        }
    }

    /// Pinning to a CPU beyond a CPU set is an error, not an abort (libc::CPU_SET panics in
    /// an extern "C" function there).
    #[test]
    fn pinning_beyond_a_cpu_set_is_an_error() {
        let e = std::thread::spawn(|| sys::pin_thread(2000))
            .join()
            .expect("no panic");
        assert_eq!(e.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        let allowed = sys::allowed_cpus().expect("sched_getaffinity");
        let c = allowed[0];
        std::thread::spawn(move || sys::pin_thread(c))
            .join()
            .expect("no panic")
            .expect("pin to an allowed CPU");
    }

    const W: Duration = Duration::from_millis(5);

    #[test]
    fn adaptive_switches_with_hysteresis() {
        let t0 = Instant::now();
        let mut m = ModeSwitch::new(false, t0);
        // 100 frames in 5 ms = 20k/s > 10k: to polling at the end of the window, not before.
        assert!(!m.observe(100, t0 + Duration::from_millis(1), W, 1_000, 10_000));
        assert!(!m.polling());
        assert!(m.observe(0, t0 + W, W, 1_000, 10_000));
        assert!(m.polling());
        // 20 frames in 5 ms = 4k/s: between the thresholds, stays polling.
        assert!(!m.observe(20, t0 + 2 * W, W, 1_000, 10_000));
        assert!(m.polling());
        // 2 frames in 5 ms = 400/s < 1k: back to guest-driven.
        assert!(m.observe(2, t0 + 3 * W, W, 1_000, 10_000));
        assert!(!m.polling());
        // 4k/s again: stays guest-driven (below the upper threshold).
        assert!(!m.observe(20, t0 + 4 * W, W, 1_000, 10_000));
        assert!(!m.polling());
    }

    const IDLE: Duration = Duration::from_millis(100);

    /// Idle and guest-driven, the switch has nothing to decide: the dispatcher may block for
    /// its idle tick, however many empty windows go by.
    #[test]
    fn an_idle_switch_waits_for_the_idle_tick() {
        let t0 = Instant::now();
        let mut m = ModeSwitch::new(false, t0);
        assert_eq!(m.wait(t0, W, IDLE), IDLE);
        for k in 1..=100u32 {
            let t = t0 + k * IDLE;
            assert!(!m.observe(0, t, W, 1_000, 10_000));
            assert_eq!(m.wait(t, W, IDLE), IDLE, "after {k} idle ticks");
        }
        assert!(!m.polling());
    }

    /// Traffic after a quiet spell starts a window of its own: the dispatcher waits only for
    /// that window's end, and a rate above α_u switches to polling one ω after the first
    /// frames, as it would have with a wake-up every ω (the quiet spell does not dilute it).
    #[test]
    fn traffic_after_a_quiet_spell_is_judged_within_one_window() {
        let t0 = Instant::now();
        let mut m = ModeSwitch::new(false, t0);
        let t1 = t0 + Duration::from_secs(10);
        assert!(!m.observe(40, t1, W, 1_000, 10_000), "a window starts");
        assert_eq!(m.wait(t1, W, IDLE), W);
        let t2 = t1 + Duration::from_millis(2);
        assert!(!m.observe(40, t2, W, 1_000, 10_000));
        assert_eq!(
            m.wait(t2, W, IDLE),
            Duration::from_millis(3),
            "until the window's end"
        );
        // 80 frames in 5 ms = 16k/s > 10k.
        assert!(m.observe(0, t1 + W, W, 1_000, 10_000));
        assert!(m.polling());
        assert_eq!(
            m.wait(t1 + W, W, IDLE),
            Duration::ZERO,
            "polling never blocks"
        );
        // Polling, an empty window is judged (0/s < 1k): back to guest-driven.
        assert!(m.observe(0, t1 + 2 * W, W, 1_000, 10_000));
        assert!(!m.polling());
        assert_eq!(m.wait(t1 + 2 * W, W, IDLE), IDLE);
    }

    /// A trickle (one frame now and then) is judged one window per frame and never switches;
    /// a window's end that comes late (a busy machine) divides by the time that really passed.
    #[test]
    fn a_trickle_stays_guest_driven_and_late_windows_use_the_real_time() {
        let t0 = Instant::now();
        let mut m = ModeSwitch::new(false, t0);
        for k in 1..=50u32 {
            let t = t0 + k * Duration::from_millis(250);
            assert!(!m.observe(1, t, W, 1_000, 10_000));
            assert_eq!(m.wait(t, W, IDLE), W);
            assert!(!m.observe(0, t + W, W, 1_000, 10_000), "200/s: stays");
            assert_eq!(m.wait(t + W, W, IDLE), IDLE, "judged: idle again");
        }
        // 60 frames seen over 5 ms but judged 10 ms after the window began: 6k/s, stays.
        let t = t0 + Duration::from_secs(60);
        assert!(!m.observe(60, t, W, 1_000, 10_000));
        assert!(!m.observe(0, t + 2 * W, W, 1_000, 10_000));
        assert!(!m.polling());
        assert_eq!(wait_ms(Duration::from_micros(300)), 1, "rounded up");
        assert_eq!(wait_ms(Duration::ZERO), 0);
        assert_eq!(wait_ms(IDLE), 100);
    }

    #[test]
    fn a_clock_that_does_not_move_never_switches() {
        let t0 = Instant::now();
        let mut m = ModeSwitch::new(false, t0);
        for _ in 0..1000 {
            assert!(!m.observe(u64::MAX / 2000, t0, Duration::ZERO, 0, 0));
        }
        m.set(true, t0);
        assert!(m.polling());
    }
}
