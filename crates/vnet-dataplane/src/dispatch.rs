//! Dispatcher threads (VNET/P sections 4.5-4.6): each reads a share of the descriptors (TAP
//! queues, the VXLAN socket, packet sockets) and forwards what it reads.
//!
//! - guest-driven: block in `epoll_wait` until a descriptor is ready;
//! - polling: read every descriptor in turn without blocking; a pass that found nothing yields
//!   the core as the yield strategy says (immediate `sched_yield`, timed sleep, or adaptive:
//!   immediate until idle for T_nowork, then timed);
//! - adaptive: measure the frame rate over a window ω and switch with hysteresis, to polling
//!   above α_u and back below α_l.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tracing::{info, warn};
use vnet_control::status::DispatcherStatus;
use vnet_control::{DataPathSettings, DispatchMode, YieldStrategy};

use crate::forward::IDLE_TICK;
use crate::ingress::{Reader, RxWork};
use crate::shared::Shared;
use crate::sys::{self, Epoll, EpollEvent, EventFd};

const WAKE_TOKEN: u64 = u64::MAX;

static NEXT_SOURCE: AtomicU64 = AtomicU64::new(1);

/// A descriptor a dispatcher reads (a [`Reader`]), with an identity for epoll and removal.
pub struct Source {
    id: u64,
    reader: Box<dyn Reader>,
}

impl Source {
    pub fn new(reader: Box<dyn Reader>) -> Source {
        Source {
            id: NEXT_SOURCE.fetch_add(1, Relaxed),
            reader,
        }
    }
}

/// The adaptive mode's switch (VNET/P section 4.5): the frame rate over a window of ω, with
/// hysteresis between α_l and α_u. Pure: the caller passes the time.
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
        self.window_frames = self.window_frames.saturating_add(frames);
        let el = now.saturating_duration_since(self.window_start);
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
        })
    }

    fn count(&self) -> usize {
        self.sources.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn add(&self, s: Arc<Source>) {
        if let Err(e) = sys::epoll_add(&self.epoll, s.reader.fd(), s.id) {
            warn!(dispatcher = self.index, "epoll add: {e}");
        }
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s);
        self.gen.fetch_add(1, SeqCst);
        sys::signal(&self.wake);
    }

    /// Removes a source and waits (up to 2 s) until the thread no longer uses it.
    fn remove(&self, s: &Arc<Source>) -> bool {
        let mut v = self.sources.lock().unwrap_or_else(|p| p.into_inner());
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
        self.slots
            .iter()
            .map(|s| {
                let st = &s.state;
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

fn pin_to_cpu(cpu: u32) {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            warn!(
                cpu,
                "could not pin dispatcher: {}",
                io::Error::last_os_error()
            );
        }
    }
}

fn run(st: Arc<DState>, shared: Arc<Shared>, settings: Arc<ArcSwap<DataPathSettings>>) {
    let first = settings.load_full();
    if !first.cpus.is_empty() {
        pin_to_cpu(first.cpus[st.index % first.cpus.len()]);
    }
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
        match src.reader.drain(w, &shared, &snap) {
            Ok(n) => n as u64,
            Err(e) => {
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
            local = st.sources.lock().unwrap_or_else(|p| p.into_inner()).clone();
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
                s.adaptive_window_ms as i32
            } else {
                IDLE_TICK.as_millis() as i32
            };
            let k = sys::epoll_wait(&st.epoll, timeout, &mut events).unwrap_or(0);
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
            w.flush_matrix(&shared);
        }
        if st.index == 0 && last_expire.elapsed() >= Duration::from_secs(10) {
            last_expire = Instant::now();
            shared.expire_learned();
        }
    }
    w.flush_matrix(&shared);
}

#[cfg(test)]
mod tests {
    use super::*;

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
