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
//!   leftovers and teardown;
//! - `cni-deleted/NAME`: interfaces the CNI plugin deleted while no vnetd ran (a deletion
//!   queue, as Cilium's CNI keeps one), taken out at the next start;
//! - `lock`: held (`flock`) for the daemon's life; a second vnetd refuses to start.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub const LOCAL: &str = "config.vnet";
pub const FILE: &str = "config-file.vnet";
pub const DERIVED: &str = "derived.vnet";
pub const RESOURCES: &str = "host.json";
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

    pub fn resources(&self) -> Result<Resources> {
        match self.read(RESOURCES)? {
            None => Ok(Resources::default()),
            Some(t) => serde_json::from_str(&t).with_context(|| format!("{RESOURCES} is damaged")),
        }
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
        for name in [LOCAL, FILE, DERIVED, RESOURCES] {
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

/// The pinned kernel objects' directory for a state directory: `/sys/fs/bpf/vnet` for the
/// default one, `/sys/fs/bpf/vnet-HASH` for any other (test labs run many daemons, each with
/// its own state directory, on one bpffs).
pub fn bpf_dir_for(state_dir: &Path) -> PathBuf {
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
    fn pin_directories_differ_by_state_directory() {
        assert_eq!(
            bpf_dir_for(Path::new("/var/lib/vnet")),
            PathBuf::from("/sys/fs/bpf/vnet")
        );
        let a = bpf_dir_for(Path::new("/tmp/a/state"));
        let b = bpf_dir_for(Path::new("/tmp/b/state"));
        assert_ne!(a, b);
        assert!(a.to_string_lossy().starts_with("/sys/fs/bpf/vnet-"));
    }
}
