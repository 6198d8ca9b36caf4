//! The state directory (`--state-dir`, default `/var/lib/vnet`, the unit's `StateDirectory=`):
//! what the next vnetd needs to come back after a stop, a crash or an upgrade without cutting
//! any guest off (issue #17), and the lock that makes one vnetd per state directory.
//!
//! Files, each replaced atomically (written beside, fsynced, renamed, the directory fsynced),
//! so a crash at any instant leaves the old or the new version, never half of one (except the
//! journal's segments, below):
//!
//! - `config.vnet`: the local configuration in the control language (the config file plus
//!   every runtime change, a CNI container's interface included), with a first line that says
//!   how much of the journal it includes;
//! - `config.journal.<sequence>`: the journal's segments: each change of the local
//!   configuration since `config.vnet` was written, appended and synced before the change is
//!   acknowledged, folded into `config.vnet` in the background (`journal.rs`, `persist.rs`);
//!   not replaced but appended to, and a torn last record is ignored;
//! - `config-file.vnet`: the config file as it was last applied (rendered, with the MACs its
//!   interfaces got), so an edited file is applied as a difference on top of the state;
//! - `derived.vnet`: what the etcd agent applied (links and routes to other hosts), so the
//!   next vnetd forwards to them from its first instant, before etcd answers;
//! - `host.json`: what vnetd made or changed on the host ([`Resources`]), for adoption,
//!   leftovers and teardown; a damaged one is set aside (`host.json.damaged`) and the start
//!   goes on without it (the devices are still found by their alias);
//! - `instance`: this state directory's [`Instance`], made at its first start: in the alias of
//!   every device vnetd makes and in its pin directory's name, so a vnetd adopts and removes
//!   only its own (several may share a network namespace, each with its state directory);
//! - `cni-deleted/NAME`: interfaces the CNI plugin deleted while no vnetd ran (a deletion
//!   queue, as Cilium's CNI keeps one), taken out at the next start;
//! - `lock`: held (`flock`) for the daemon's life; a second vnetd refuses to start.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use vnet_dataplane::made::Instance;

pub const LOCAL: &str = "config.vnet";
pub const FILE: &str = "config-file.vnet";
pub const DERIVED: &str = "derived.vnet";
pub const RESOURCES: &str = "host.json";
/// Where a damaged `host.json` is set aside.
pub const RESOURCES_DAMAGED: &str = "host.json.damaged";
pub const INSTANCE: &str = "instance";
/// Where a damaged `instance` is set aside.
const INSTANCE_DAMAGED: &str = "instance.damaged";
pub const CNI_DELETED: &str = "cni-deleted";
const LOCK: &str = "lock";

/// What vnetd made or changed on the host, beyond its configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// The network namespace (its inode) the devices are in: a state directory used from
    /// another namespace finds none of them.
    #[serde(default)]
    pub netns: Option<u64>,
    /// Devices vnetd made: `(named namespace or none, device)`.
    #[serde(default)]
    pub made: Vec<(Option<String>, String)>,
    /// The etcd agent's lease (hex), kept alive by the next vnetd so the other hosts never see
    /// this one leave during a restart.
    #[serde(default)]
    pub etcd_lease: Option<String>,
    /// Where the kernel fast path is pinned (a teardown from outside the daemon's chroot or
    /// mount namespace finds it here).
    #[serde(default)]
    pub bpf_dir: Option<PathBuf>,
    /// Devices' IPv4 `forwarding` before the kernel fast path turned it on: `(ifindex, name,
    /// was on)`, put back when their port goes, at a teardown, or by the next vnetd.
    #[serde(default)]
    pub forwarding: Vec<(u32, String, bool)>,
}

impl Resources {
    pub fn forwarding_originals(&self) -> Vec<vnet_fastpath::ForwardingOriginal> {
        self.forwarding
            .iter()
            .map(
                |(ifindex, ifname, enabled)| vnet_fastpath::ForwardingOriginal {
                    ifindex: *ifindex,
                    ifname: ifname.clone(),
                    enabled: *enabled,
                },
            )
            .collect()
    }

    pub fn set_forwarding(&mut self, o: &[vnet_fastpath::ForwardingOriginal]) {
        self.forwarding = o
            .iter()
            .map(|x| (x.ifindex, x.ifname.clone(), x.enabled))
            .collect();
        self.forwarding.sort();
    }
}

/// The state directory, locked.
pub struct StateDir {
    dir: PathBuf,
    _lock: File,
}

impl StateDir {
    /// Creates the directory (mode 0700) if needed and takes its lock; refuses when another
    /// vnetd holds it. Nothing else on the host is touched before this succeeds.
    pub fn open(dir: &Path) -> Result<StateDir> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("state directory {}", dir.display()))?;
        let path = dir.join(LOCK);
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("{}", path.display()))?;
        if let Err(e) = try_lock_exclusive(&lock) {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            let holder = holder.trim();
            bail!(
                "another vnetd{} uses the state directory {} ({e}): one vnetd per host; stop it first, or give this one its own --state-dir",
                if holder.is_empty() { String::new() } else { format!(" (pid {holder})") },
                dir.display()
            );
        }
        lock.set_len(0)?;
        write!(lock, "{}", std::process::id())?;
        Ok(StateDir {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// A state file's text, `None` when there is none.
    pub fn read(&self, name: &str) -> Result<Option<String>> {
        match fs::read_to_string(self.dir.join(name)) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("{}", self.dir.join(name).display())),
        }
    }

    /// Replaces a state file atomically.
    pub fn write(&self, name: &str, text: &str) -> Result<()> {
        write_atomic(&self.dir, name, text.as_bytes())
    }

    /// Starts a journal segment (appended to; an earlier file of that name, which can only
    /// hold a record whose write failed, is emptied).
    pub fn create_segment(&self, name: &str) -> std::io::Result<File> {
        OpenOptions::new()
            .append(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.dir.join(name))
            .and_then(|f| f.set_len(0).map(|()| f))
    }

    /// Makes the directory's entries (a new segment) durable.
    pub fn sync_dir(&self) -> std::io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    /// The journal's segments: (first sequence, bytes), in no order.
    pub fn read_segments(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        for (first, path) in self.segments()? {
            let bytes = fs::read(&path).with_context(|| format!("{}", path.display()))?;
            out.push((first, bytes));
        }
        Ok(out)
    }

    /// Removes the segments whose records `config.vnet` includes (those starting at or
    /// before `seq`: a segment is started at each compaction's cut, after the records the
    /// compacted file includes).
    pub fn remove_segments_through(&self, seq: u64) -> Result<()> {
        for (first, path) in self.segments()? {
            if first <= seq {
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e).with_context(|| format!("{}", path.display())),
                }
            }
        }
        Ok(())
    }

    fn segments(&self) -> Result<Vec<(u64, PathBuf)>> {
        let entries = fs::read_dir(&self.dir).with_context(|| format!("{}", self.dir.display()))?;
        Ok(entries
            .flatten()
            .filter_map(|e| {
                let first = crate::journal::segment_first(e.file_name().to_str()?)?;
                Some((first, e.path()))
            })
            .collect())
    }

    #[cfg(test)]
    pub fn resources(&self) -> Result<Resources> {
        match self.read(RESOURCES)? {
            None => Ok(Resources::default()),
            Some(t) => serde_json::from_str(&t).with_context(|| format!("{RESOURCES} is damaged")),
        }
    }

    /// `host.json`; a damaged one (it is rewritten whole, so only a fault outside vnetd
    /// damages it) is set aside as `host.json.damaged`, with why, and the start goes on
    /// without it: what it would have told (devices made, the lease, the pin directory, the
    /// devices' `forwarding`) is then found by the devices' alias or starts afresh.
    pub fn resources_or_set_aside(&self) -> Result<(Resources, Option<String>)> {
        let Some(t) = self.read(RESOURCES)? else {
            return Ok((Resources::default(), None));
        };
        match serde_json::from_str(&t) {
            Ok(r) => Ok((r, None)),
            Err(e) => {
                let (from, to) = (self.dir.join(RESOURCES), self.dir.join(RESOURCES_DAMAGED));
                fs::rename(&from, &to).with_context(|| {
                    format!("{RESOURCES} is damaged ({e}) and cannot be set aside")
                })?;
                Ok((
                    Resources::default(),
                    Some(format!(
                        "{} is damaged ({e}): set aside as {}; starting without it",
                        from.display(),
                        to.display()
                    )),
                ))
            }
        }
    }

    /// This state directory's instance, made (64 random bits) and kept at its first start; a
    /// damaged file is set aside (its devices are then no one's: left alone) with a note.
    pub fn instance(&self) -> Result<(Instance, Option<String>)> {
        let note = match self.read(INSTANCE)? {
            Some(t) => match t.trim().parse::<Instance>() {
                Ok(i) => return Ok((i, None)),
                Err(e) => {
                    fs::rename(self.dir.join(INSTANCE), self.dir.join(INSTANCE_DAMAGED))
                        .with_context(|| format!("{INSTANCE} is damaged ({e})"))?;
                    Some(format!("{INSTANCE} is damaged ({e}): set aside as {INSTANCE_DAMAGED}; the devices it marked are left alone, this state directory has a new instance"))
                }
            },
            None => None,
        };
        let mut bits = [0u8; 8];
        File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bits))
            .context("a new instance: /dev/urandom")?;
        let i = Instance::from_bits(u64::from_ne_bytes(bits));
        self.write(INSTANCE, &format!("{i}\n"))?;
        Ok((i, note))
    }

    pub fn write_resources(&self, r: &Resources) -> Result<()> {
        let text = serde_json::to_string_pretty(r)?;
        self.write(RESOURCES, &text)
    }

    /// The interfaces the CNI plugin deleted while no vnetd ran. Their records stay until
    /// [`StateDir::remove_cni_deletions`], once the configuration without them is saved (a
    /// crash before that must find them again).
    pub fn cni_deletions(&self) -> Result<Vec<String>> {
        let dir = self.dir.join(CNI_DELETED);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(e).with_context(|| format!("{}", dir.display())),
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Removes the deletion queue's records of `names` (taken out of a saved configuration).
    pub fn remove_cni_deletions(&self, names: &[String]) {
        for n in names {
            let _ = fs::remove_file(self.dir.join(CNI_DELETED).join(n));
        }
    }

    /// Removes every state file (a teardown); the lock stays until the process ends.
    pub fn clear(&self) -> Result<()> {
        for name in [
            LOCAL,
            FILE,
            DERIVED,
            RESOURCES,
            RESOURCES_DAMAGED,
            INSTANCE,
            INSTANCE_DAMAGED,
        ] {
            match fs::remove_file(self.dir.join(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {name}")),
            }
        }
        self.remove_segments_through(u64::MAX)?;
        let _ = fs::remove_dir_all(self.dir.join(CNI_DELETED));
        Ok(())
    }
}

/// `flock(LOCK_EX | LOCK_NB)` (`File::try_lock`): released by the kernel when the process
/// ends, however it ends.
fn try_lock_exclusive(f: &File) -> std::io::Result<()> {
    f.try_lock().map_err(|e| match e {
        std::fs::TryLockError::WouldBlock => {
            std::io::Error::new(std::io::ErrorKind::WouldBlock, "locked by another process")
        }
        std::fs::TryLockError::Error(e) => e,
    })
}

/// Writes `dir/name` atomically: a temporary file beside it, fsynced, renamed over it, and the
/// directory fsynced so the rename itself is durable.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("{}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, dir.join(name)).with_context(|| format!("{}", dir.join(name).display()))?;
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// The inode of this process's network namespace (what tells one host namespace from another).
pub fn netns_inode() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self/ns/net").ok().map(|m| m.ino())
}

/// The pinned kernel objects' directory of vnetd `instance` in the network namespace
/// `netns` (its cookie): `/sys/fs/bpf/vnet-INSTANCE-NETNS`. Its own, whatever the state
/// directory's path, and one per namespace: a tcx link's device is an ifindex, which means
/// something in one namespace only (a state directory used from another namespace starts
/// afresh there and leaves the first one's pins alone).
pub fn pin_dir(instance: Instance, netns: u64) -> PathBuf {
    Path::new(vnet_fastpath::pin::BPFFS).join(format!("vnet-{instance}-{netns:x}"))
}

/// The identity of this process's network namespace for [`pin_dir`]: its cookie, or else (a
/// kernel before 5.14) its inode.
pub fn netns_id() -> u64 {
    vnet_fastpath::pin::netns_cookie()
        .ok()
        .or_else(netns_inode)
        .unwrap_or(0)
}

/// The pin directory a vnetd from before instances used for a state directory:
/// `/sys/fs/bpf/vnet` for the default one, `/sys/fs/bpf/vnet-HASH` for any other.
pub fn legacy_pin_dir(state_dir: &Path) -> PathBuf {
    let canonical = fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    if canonical == Path::new(crate::DEFAULT_STATE_DIR) {
        return PathBuf::from("/sys/fs/bpf/vnet");
    }
    // FNV-1a, 48 bits: stable across runs and versions.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.as_os_str().as_encoded_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    PathBuf::from(format!("/sys/fs/bpf/vnet-{:012x}", h & 0xffff_ffff_ffff))
}

/// Whose a pin directory named in `host.json` is, by its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinDirName {
    /// This instance's (`vnet-INSTANCE-NETNS`, of any namespace).
    Own,
    /// Where a vnetd from before instances pinned for this state directory (`legacy`, or
    /// `/sys/fs/bpf/vnet`, the default state directory's: seen from inside a chroot).
    Legacy,
    /// Not a name vnet gives this state directory's pins: never removed.
    Foreign(String),
}

/// Whose the pin directory at `path` is for `instance` (pure: the name only; what is in it,
/// and whether it is on a bpffs, is `vnet_fastpath::pin::not_a_pin_dir`'s).
pub fn pin_dir_name(path: &Path, instance: Instance, legacy: &Path) -> PinDirName {
    if path == legacy || path == Path::new("/sys/fs/bpf/vnet") {
        return PinDirName::Legacy;
    }
    let own = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(&format!("vnet-{instance}-")))
        .is_some_and(|ns| {
            !ns.is_empty() && ns.len() <= 16 && ns.bytes().all(|c| c.is_ascii_hexdigit())
        });
    if own && path.is_absolute() {
        PinDirName::Own
    } else {
        PinDirName::Foreign(format!(
            "its name is not that of this state directory's pins (vnet-{instance}-NETNS, or {} from before instances)",
            legacy.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "vnetd-state-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        d
    }

    #[test]
    fn one_holder_at_a_time() {
        let d = tmp();
        let a = StateDir::open(&d).expect("first");
        let e = match StateDir::open(&d) {
            Ok(_) => panic!("a second holder was let in"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("another vnetd") && e.contains(&std::process::id().to_string()),
            "{e}"
        );
        drop(a);
        let b = StateDir::open(&d).expect("free again");
        drop(b);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn files_are_replaced_whole_and_cleared() {
        let d = tmp();
        let s = StateDir::open(&d).expect("open");
        assert_eq!(s.read(LOCAL).unwrap(), None);
        s.write(LOCAL, "set learn on\n").unwrap();
        s.write(LOCAL, "set mode polling\n").unwrap();
        assert_eq!(
            s.read(LOCAL).unwrap().as_deref(),
            Some("set mode polling\n")
        );
        let r = Resources {
            netns: Some(7),
            made: vec![(Some("g".into()), "vn-a".into()), (None, "vp-1".into())],
            etcd_lease: Some("abc".into()),
            bpf_dir: Some("/sys/fs/bpf/vnet-x".into()),
            forwarding: vec![(4, "vh-1".into(), false)],
        };
        s.write_resources(&r).unwrap();
        assert_eq!(s.resources().unwrap(), r);
        fs::create_dir_all(d.join(CNI_DELETED)).unwrap();
        fs::write(d.join(CNI_DELETED).join("cni-x"), "").unwrap();
        assert_eq!(s.cni_deletions().unwrap(), vec!["cni-x".to_string()]);
        assert_eq!(s.cni_deletions().unwrap(), vec!["cni-x".to_string()]);
        s.remove_cni_deletions(&["cni-x".to_string()]);
        assert!(s.cni_deletions().unwrap().is_empty());
        s.clear().unwrap();
        assert_eq!(s.read(LOCAL).unwrap(), None);
        assert_eq!(s.resources().unwrap(), Resources::default());
        drop(s);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn pin_directories_are_the_instances_in_its_namespace() {
        let (i, j) = (Instance::from_bits(0xa1), Instance::from_bits(0xb2));
        assert_eq!(
            pin_dir(i, 0x1f),
            PathBuf::from("/sys/fs/bpf/vnet-00000000000000a1-1f")
        );
        assert_ne!(pin_dir(i, 3), pin_dir(i, 4), "one per network namespace");
        assert_ne!(pin_dir(i, 3), pin_dir(j, 3), "one per instance");
        // Where vnetds from before instances pinned.
        assert_eq!(
            legacy_pin_dir(Path::new("/var/lib/vnet")),
            PathBuf::from("/sys/fs/bpf/vnet")
        );
        let a = legacy_pin_dir(Path::new("/tmp/a/state"));
        assert_ne!(a, legacy_pin_dir(Path::new("/tmp/b/state")));
        assert!(a.to_string_lossy().starts_with("/sys/fs/bpf/vnet-"));
    }

    #[test]
    fn a_teardown_knows_its_own_pin_directories_by_name() {
        let i = Instance::from_bits(0xa1);
        let legacy = PathBuf::from("/sys/fs/bpf/vnet-0123456789ab");
        assert_eq!(pin_dir_name(&pin_dir(i, 3), i, &legacy), PinDirName::Own);
        assert_eq!(
            pin_dir_name(
                Path::new("/elsewhere/bpf/vnet-00000000000000a1-1f"),
                i,
                &legacy
            ),
            PinDirName::Own,
            "a bpffs mounted elsewhere"
        );
        assert_eq!(pin_dir_name(&legacy, i, &legacy), PinDirName::Legacy);
        assert_eq!(
            pin_dir_name(Path::new("/sys/fs/bpf/vnet"), i, &legacy),
            PinDirName::Legacy
        );
        for foreign in [
            "/tmp/something",
            "/sys/fs/bpf",
            "/sys/fs/bpf/cilium",
            "/sys/fs/bpf/vnet-00000000000000b2-3",
            "/sys/fs/bpf/vnet-00000000000000a1-",
            "/sys/fs/bpf/vnet-00000000000000a1-3/..",
            "/sys/fs/bpf/vnet-00000000000000a1-zz",
            "vnet-00000000000000a1-3",
            "/sys/fs/bpf/vnet-012345678900",
        ] {
            assert!(
                matches!(
                    pin_dir_name(Path::new(foreign), i, &legacy),
                    PinDirName::Foreign(_)
                ),
                "{foreign}"
            );
        }
    }

    #[test]
    fn instances_are_made_once_and_kept() {
        let d = tmp();
        let s = StateDir::open(&d).expect("open");
        let (a, note) = s.instance().unwrap();
        assert!(note.is_none());
        assert_eq!(s.instance().unwrap().0, a, "kept");
        fs::write(d.join(INSTANCE), "garbage\n").unwrap();
        let (b, note) = s.instance().unwrap();
        assert_ne!(a, b);
        assert!(note.unwrap().contains("set aside"));
        assert_eq!(
            fs::read_to_string(d.join(INSTANCE_DAMAGED)).unwrap(),
            "garbage\n"
        );
        assert_eq!(s.instance().unwrap().0, b);
        s.clear().unwrap();
        assert!(!d.join(INSTANCE).exists() && !d.join(INSTANCE_DAMAGED).exists());
        drop(s);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_damaged_host_json_is_set_aside() {
        let d = tmp();
        let s = StateDir::open(&d).expect("open");
        assert_eq!(
            s.resources_or_set_aside().unwrap(),
            (Resources::default(), None)
        );
        s.write(RESOURCES, "{\"made\": [[null, \"vh-1\"]], trunc")
            .unwrap();
        assert!(s.resources().is_err());
        let (r, note) = s.resources_or_set_aside().unwrap();
        assert_eq!(r, Resources::default());
        let note = note.expect("a note");
        assert!(
            note.contains("damaged") && note.contains(RESOURCES_DAMAGED),
            "{note}"
        );
        assert!(!d.join(RESOURCES).exists());
        assert!(d.join(RESOURCES_DAMAGED).exists());
        // The next start finds nothing to set aside.
        assert_eq!(
            s.resources_or_set_aside().unwrap(),
            (Resources::default(), None)
        );
        drop(s);
        let _ = fs::remove_dir_all(&d);
    }
}
