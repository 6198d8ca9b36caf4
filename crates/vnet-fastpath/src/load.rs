//! Loading: opens the compiled object through its skeleton, sizes the maps and writes the
//! settings (`.rodata`, typed) from [`FastPathConfig`], reuses an earlier vnetd's pinned maps
//! when they are of the same layout and size, loads and verifies the programs, and says in
//! words why it could not ([`Unavailable`]). Also [`FastPath::test_run`].

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapHandle, PrintLevel};
use vnet_core::LockRecover;

use crate::attach::held_links;
use crate::compile::CompiledTable;
use crate::error::{Error, Unavailable};
use crate::fastpath::{FastPath, OuterCacheInvalidator, Pins};
use crate::layout;
use crate::maps::{open_maps, FastpathSkelBuilder, Maps};
use crate::pin;
use crate::progs::{self, Progs};
use crate::spec::{FastPathConfig, Program, TestRun};
use crate::takeover::Earlier;

/// libbpf's messages while loading (its print callback is process-wide and takes a plain fn).
static LOAD_LOG: Mutex<String> = Mutex::new(String::new());

fn collect_log(_level: PrintLevel, msg: String) {
    let mut log = LOAD_LOG.lock_or_recover();
    // Bounded: a verifier log can be long; keep its end, where the reason is.
    if log.len() > 256 * 1024 {
        let cut = log.len() - 128 * 1024;
        let cut = (cut..log.len())
            .find(|i| log.is_char_boundary(*i))
            .unwrap_or(0);
        log.replace_range(..cut, "");
    }
    log.push_str(&msg);
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// (major, minor) of a kernel release string such as "6.18.44-fc".
fn release_version(rel: &str) -> Option<(u32, u32)> {
    let mut it = rel.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Whether this process has the capabilities BPF needs (CAP_BPF 39 or CAP_SYS_ADMIN 21, and
/// CAP_NET_ADMIN 12), from /proc/self/status.
fn has_bpf_caps() -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    let eff = s
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |bit: u32| eff & (1u64 << bit) != 0;
    (has(39) || has(21)) && has(12)
}

fn invalid_data(msg: impl Into<String>) -> libbpf_rs::Error {
    libbpf_rs::Error::from(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        msg.into(),
    ))
}

impl FastPath {
    /// Loads and verifies every program with maps sized from `cfg`. Nothing is attached yet.
    pub fn open(cfg: &FastPathConfig) -> Result<FastPath, Unavailable> {
        let rel = kernel_release();
        if let Some(v) = release_version(&rel) {
            if v < (6, 6) {
                return Err(Unavailable::KernelTooOld(format!("running {rel}")));
            }
        }
        if cfg.max_ports == 0
            || cfg.max_links == 0
            || cfg.max_table == 0
            || cfg.max_matrix == 0
            || cfg.max_relay_pairs == 0
            || cfg.max_ports > 0x00ff_ffff
            || cfg.max_links > 0x00ff_ffff
        {
            return Err(Unavailable::Other(format!(
                "map sizes must be between 1 and 16777215: {cfg:?}"
            )));
        }
        let prev = libbpf_rs::get_print();
        LOAD_LOG.lock_or_recover().clear();
        libbpf_rs::set_print(Some((PrintLevel::Info, collect_log)));
        let res = Self::load(cfg);
        libbpf_rs::set_print(prev);
        let log = std::mem::take(&mut *LOAD_LOG.lock_or_recover());
        res.map_err(|e| classify(e, &log))
    }

    fn load(cfg: &FastPathConfig) -> Result<FastPath, libbpf_rs::Error> {
        let hash = layout::layout_hash(&crate::maps::signature());
        let maps_dir = layout::maps_dir_name(hash);
        let pin_dir = cfg.pin_dir.as_ref().and_then(|d| {
            match pin::ensure_dir(&d.join(&maps_dir)).and_then(|()| pin::ensure_dir(&d.join("links"))) {
                Ok(()) => Some(d.clone()),
                Err(e) => {
                    tracing::warn!(dir = %d.display(), "kernel fast path: cannot pin ({e}): forwarding stops whenever vnetd does");
                    None
                }
            }
        });
        let mut storage = MaybeUninit::uninit();
        let mut open = FastpathSkelBuilder::default().open(&mut storage)?;
        let settings = &mut open
            .maps
            .rodata_data
            .as_deref_mut()
            .ok_or_else(|| invalid_data("the object has no .rodata"))?
            .cfg;
        settings.outer_cache_ns = cfg.outer_cache.map_or(0, |d| d.as_nanos().max(1) as u64);
        settings.max_ports = cfg.max_ports;
        settings.vxlan_port_be = cfg.vxlan_port.to_be();
        let mut maps = open_maps(&mut open.maps, cfg);
        for (_, m, size) in &mut maps {
            if let Some(n) = size {
                m.set_max_entries(*n)?;
            }
        }
        // An earlier vnetd's pinned maps are reused when they are of this layout (the hash in
        // their directory's name, or the layout of every vnet before the hash for `maps/`) and
        // every one is there with the type and size this object asks for; otherwise the maps
        // are new (and the earlier ones go once the links run programs that use the new ones).
        let mut reused = false;
        if let Some(dir) = &pin_dir {
            let mut other = false;
            for sub in layout::reusable_maps_dirs(hash) {
                let mut found = Vec::new();
                for (name, m, _) in &maps {
                    let Ok(h) = MapHandle::from_pinned_path(dir.join(&sub).join(name)) else {
                        continue;
                    };
                    let same = h.map_type() == m.map_type()
                        && h.key_size() == m.key_size()
                        && h.value_size() == m.value_size()
                        && h.max_entries() == m.max_entries()
                        && h.info().is_ok_and(|i| i.info.map_flags == m.map_flags());
                    found.push((*name, h, same));
                }
                if found.len() == maps.len() && found.iter().all(|(_, _, same)| *same) {
                    for ((_, m, _), (_, h, _)) in maps.iter_mut().zip(&found) {
                        m.reuse_fd(h.as_fd())?;
                    }
                    reused = true;
                    if sub != maps_dir {
                        // Pinned before the hash: moved to where this layout's maps are.
                        if let Err(e) = pin::move_maps(dir, &sub, &maps_dir) {
                            tracing::warn!(dir = %dir.display(), "kernel fast path: the maps stay in {sub}: {e}");
                        }
                    }
                    break;
                }
                other |= !found.is_empty();
            }
            other |= !reused && pin::other_maps_dirs(dir, &maps_dir).next().is_some();
            if other {
                tracing::warn!(
                    "kernel fast path: the pinned maps are of another layout or size (another version of vnet, or changed --fastpath-* sizes): new maps, filled before the programs switch to them"
                );
            }
        }
        drop(maps);
        let skel = open.load()?;
        let maps = Maps::new(&skel.maps)?;
        let progs = Progs::new(&skel.progs).map_err(libbpf_rs::Error::from)?;
        // Everything is held by descriptors of its own from here on: the object goes.
        drop(skel);
        let epoch = OuterCacheInvalidator {
            epoch: Arc::new(Mutex::new(
                maps.outer_epoch
                    .try_clone()
                    .map_err(|e| invalid_data(e.to_string()))?,
            )),
        };
        let pins = pin_dir.map(|dir| {
            let earlier = if reused {
                Earlier::read(&maps.ports, &maps.links, &maps.fwd, cfg.max_links)
            } else {
                Earlier::default()
            };
            let held = held_links(&dir.join("links"));
            let holding = !earlier.is_empty() || !held.is_empty();
            if holding {
                tracing::info!(
                    ports = earlier.ports.len(),
                    links = earlier.links.len(),
                    entries = earlier.fwd.len(),
                    attachments = held.len(),
                    maps = if reused { "reused" } else { "new" },
                    "kernel fast path taken over from an earlier vnetd (it forwarded meanwhile)"
                );
            }
            Pins {
                dir,
                maps_dir,
                earlier,
                held,
                holding,
                maps_to_pin: !reused,
            }
        });
        let mut fp = FastPath {
            cfg: cfg.clone(),
            ports: BTreeMap::new(),
            links: BTreeMap::new(),
            underlays: BTreeMap::new(),
            table: CompiledTable::default(),
            current: BTreeMap::new(),
            table_full: 0,
            forwarding: BTreeMap::new(),
            epoch,
            pins,
            maps,
            progs,
        };
        // Nothing earlier to take over: the maps are pinned at once.
        if fp
            .pins
            .as_ref()
            .is_some_and(|p| !p.holding && p.maps_to_pin)
        {
            fp.pin_maps().map_err(|e| invalid_data(e.to_string()))?;
        }
        Ok(fp)
    }

    /// Pins the maps (replacing an earlier vnetd's pins of other maps), then lets go of the
    /// pins of maps of another layout (no program uses them any more).
    pub(crate) fn pin_maps(&mut self) -> std::io::Result<()> {
        let Some(p) = &mut self.pins else {
            return Ok(());
        };
        for (name, m) in self.maps.all() {
            pin::pin(m.as_fd(), &p.map_path(name))?;
        }
        p.maps_to_pin = false;
        let others: Vec<_> = pin::other_maps_dirs(&p.dir, &p.maps_dir).collect();
        for d in others {
            if let Err(e) = pin::remove_dir(&d) {
                tracing::warn!(dir = %d.display(), "kernel fast path: the maps of another layout stay pinned: {e}");
            }
        }
        Ok(())
    }

    /// Runs one program once on `frame` as if it arrived on `ifindex` (a device of the
    /// caller's network namespace), with `gso_size` set when non-zero (`BPF_PROG_TEST_RUN`:
    /// redirects are returned as verdicts, not done).
    pub fn test_run(
        &self,
        prog: Program,
        frame: &[u8],
        ifindex: u32,
        gso_size: u32,
    ) -> Result<TestRun, Error> {
        let (verdict, data, _) = self.run_repeated(prog, frame, ifindex, gso_size, 1)?;
        Ok(TestRun { verdict, data })
    }

    /// Runs one program `repeat` times on `frame` in the kernel, as [`FastPath::test_run`]
    /// does once, and returns the kernel's mean time of one run: what a measurement of the
    /// programs' own cost needs (the ignored timing tests of `tests/bpf`).
    pub fn time_runs(
        &self,
        prog: Program,
        frame: &[u8],
        ifindex: u32,
        repeat: u32,
    ) -> Result<Duration, Error> {
        let (_, _, ns) = self.run_repeated(prog, frame, ifindex, 0, repeat.max(1))?;
        Ok(Duration::from_nanos(ns.into()))
    }

    fn run_repeated(
        &self,
        prog: Program,
        frame: &[u8],
        ifindex: u32,
        gso_size: u32,
        repeat: u32,
    ) -> Result<(i32, Vec<u8>, u32), Error> {
        // struct __sk_buff (the kernel's UAPI): ifindex at 40, gso_size at 176 (192 bytes).
        let mut ctx = [0u8; 192];
        ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
        if gso_size > 0 {
            ctx[176..180].copy_from_slice(&gso_size.to_ne_bytes());
        }
        progs::test_run(self.progs.fd(prog), frame, &ctx, repeat).map_err(|e| Error::Map {
            map: "test_run",
            source: e.into(),
        })
    }
}

/// Turns a load failure into words a user understands.
fn classify(e: libbpf_rs::Error, log: &str) -> Unavailable {
    let msg = e.to_string();
    if log.contains("BEGIN PROG LOAD LOG") {
        let program = log
            .lines()
            .find_map(|l| {
                let i = l.find("prog '")?;
                let rest = &l[i + 6..];
                Some(rest[..rest.find('\'')?].to_string())
            })
            .unwrap_or_else(|| "?".into());
        return Unavailable::Verifier {
            program,
            log: log.to_string(),
        };
    }
    match e.kind() {
        libbpf_rs::ErrorKind::PermissionDenied => {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let root = unsafe { libc::geteuid() } == 0;
            if !root || !has_bpf_caps() {
                Unavailable::NoPrivilege(msg)
            } else {
                let lockdown =
                    std::fs::read_to_string("/sys/kernel/security/lockdown").unwrap_or_default();
                Unavailable::Disallowed(format!("{msg}; lockdown: {}", lockdown.trim()))
            }
        }
        libbpf_rs::ErrorKind::Unsupported => {
            Unavailable::KernelTooOld(format!("{msg} (running {})", kernel_release()))
        }
        _ => {
            let tail: String = log
                .lines()
                .rev()
                .take(8)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            Unavailable::Other(format!("{msg}\n{tail}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_failures_are_told_in_words() {
        let log = "libbpf: prog 'port_ingress': BPF program load failed: Permission denied\n\
                   libbpf: prog 'port_ingress': -- BEGIN PROG LOAD LOG --\n\
                   misaligned stack access off 0+0+-154 size 4\n-- END PROG LOAD LOG --\n";
        let e = libbpf_rs::Error::from(std::io::Error::from_raw_os_error(libc::EACCES));
        match classify(e, log) {
            Unavailable::Verifier { program, log } => {
                assert_eq!(program, "port_ingress");
                assert!(log.contains("misaligned"));
            }
            other => panic!("{other:?}"),
        }
        let e = libbpf_rs::Error::from(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        assert!(matches!(classify(e, ""), Unavailable::KernelTooOld(_)));
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(release_version("6.18.44-fc-v782"), Some((6, 18)));
        assert_eq!(release_version("5.10.0-28-amd64"), Some((5, 10)));
        assert!(release_version("6.18.44").unwrap() >= (6, 6));
        assert_eq!(release_version("garbage"), None);
    }
}
