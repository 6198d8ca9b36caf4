//! What an earlier run of this vnetd left behind, and what becomes of it: who that vnetd was
//! (its state directory's instance and `host.json`), its devices and its pinned kernel objects,
//! adopted at a takeover, removed when nothing uses them any more, or all removed by
//! `vnetd --teardown`. Start-up (`main.rs`) decides when; this module knows what is vnet's
//! (a device's alias, a pin directory's name and contents) and touches nothing else.

use std::path::Path;

use anyhow::{Context, Result};
use tracing::{info, warn};

use crate::reach;
use crate::state::{self, StateDir};

/// `--teardown`: what a stopped vnetd left (devices, pinned kernel objects, state files) goes.
pub fn teardown_offline(state_dir: &Path) -> Result<()> {
    let state = StateDir::open(state_dir)
        .context("teardown (a running vnetd tears down with `vnetctl teardown`)")?;
    let (resources, instance) = identify(&state)?;
    let removed = remove_made(&resources, &[])?;
    // This instance's pins in this namespace, and wherever host.json says they are (a daemon
    // in a chroot, another mount or network namespace), each only if it is vnet's.
    let legacy = state::legacy_pin_dir(state_dir);
    let own = state::pin_dir(instance, state::netns_id());
    remove_pin_dir(&own, instance, &legacy);
    if let Some(d) = resources.bpf_dir.as_ref().filter(|d| **d != own) {
        remove_pin_dir(d, instance, &legacy);
    }
    // The programs are gone: no device keeps forwarding for them.
    if resources.netns.is_none() || resources.netns == state::netns_inode() {
        for o in resources.forwarding_originals() {
            vnet_fastpath::restore_forwarding(&o);
        }
    }
    state.clear()?;
    reach::remove_key(state_dir).context("removing the probe key")?;
    info!(devices = removed, state_dir = %state_dir.display(), "torn down");
    Ok(())
}

/// Who this vnetd is (issue #32): its state directory's instance, and what an earlier vnetd
/// of it recorded (`host.json`, set aside when damaged). Sets the process's owner of devices
/// (`made::set_owner`): the instance, and the devices recorded as made here, which it may
/// adopt when they carry the alias of a vnetd from before instances (an upgrade).
pub fn identify(state: &StateDir) -> Result<(state::Resources, vnet_dataplane::made::Instance)> {
    let (instance, note) = state.instance()?;
    if let Some(n) = note {
        warn!("{n}");
    }
    let (resources, note) = state.resources_or_set_aside()?;
    if let Some(n) = note {
        warn!("{n}");
    }
    let here = resources.netns.is_none() || resources.netns == state::netns_inode();
    let recorded = resources
        .made
        .iter()
        .filter(|_| here)
        .map(|(netns, ifname)| vnet_dataplane::made::MadeDevice::new(netns.as_deref(), ifname));
    vnet_dataplane::made::set_owner(vnet_dataplane::made::Owner::new(instance, recorded));
    Ok((resources, instance))
}

/// Removes a pin directory of this state directory's (by its name: `state::pin_dir_name`)
/// that holds only what vnet pins on a bpffs (`pin::not_a_pin_dir`); anything else that a
/// state file names is left alone, and said so.
pub fn remove_pin_dir(dir: &Path, instance: vnet_dataplane::made::Instance, legacy: &Path) {
    let mut why: Vec<String> = vnet_fastpath::pin::not_a_pin_dir(dir).into_iter().collect();
    if let state::PinDirName::Foreign(w) = state::pin_dir_name(dir, instance, legacy) {
        why.push(w);
    }
    if !why.is_empty() {
        warn!(dir = %dir.display(), "not removing {}: {}", dir.display(), why.join("; "));
    } else if dir.exists() {
        vnet_dataplane::kernel::remove_pinned(dir);
    }
}

/// Moves the pins of a vnetd from before instances (`host.json` names the directory it used
/// for this state directory, in this network namespace) to this instance's directory, so the
/// takeover finds them there: frames go on flowing, the pins are the same objects.
pub fn adopt_legacy_pins(
    earlier: &state::Resources,
    here: bool,
    state_dir: &Path,
    instance: vnet_dataplane::made::Instance,
    pin_dir: &Path,
) {
    let Some(old) = &earlier.bpf_dir else {
        return;
    };
    let legacy = state::legacy_pin_dir(state_dir);
    if !here
        || old == pin_dir
        || state::pin_dir_name(old, instance, &legacy) != state::PinDirName::Legacy
        || !old.exists()
    {
        return;
    }
    if let Some(why) = vnet_fastpath::pin::not_a_pin_dir(old) {
        warn!(dir = %old.display(), "the pins of the vnetd before this version are left where they are: {why}");
        return;
    }
    if pin_dir.exists() {
        warn!(dir = %old.display(), own = %pin_dir.display(), "the pins of the vnetd before this version are left where they are: this vnetd's pin directory exists already");
        return;
    }
    match std::fs::rename(old, pin_dir) {
        Ok(()) => {
            info!(from = %old.display(), to = %pin_dir.display(), "the pins of the vnetd before this version moved to this vnetd's pin directory")
        }
        Err(e) => {
            warn!(dir = %old.display(), "the pins of the vnetd before this version could not be moved to {}: {e}", pin_dir.display())
        }
    }
}

/// Removes the devices an earlier run of this vnetd made (`resources.made`, and any device of
/// this namespace with its alias) except `keep`, what this one has adopted: only devices
/// whose alias says they are this vnetd's (`made::remove_leftover`). Returns how many.
pub fn remove_made(
    resources: &state::Resources,
    keep: &[vnet_dataplane::made::MadeDevice],
) -> Result<usize> {
    use vnet_dataplane::made::{marked_here, remove_leftover, MadeDevice};
    let here = resources.netns.is_none() || resources.netns == state::netns_inode();
    // Devices of another namespace's vnetd (a state directory used from elsewhere) are not
    // ours to look for here.
    if !here {
        return Ok(0);
    }
    let mut candidates: Vec<MadeDevice> = resources
        .made
        .iter()
        .map(|(netns, ifname)| MadeDevice {
            netns: netns.clone(),
            ifname: ifname.clone(),
        })
        .collect();
    candidates.extend(marked_here().context("listing devices")?);
    candidates.sort();
    candidates.dedup();
    let mut n = 0;
    for d in candidates.iter().filter(|d| !keep.contains(d)) {
        match remove_leftover(d) {
            Ok(true) => {
                info!(device = %d.ifname, netns = ?d.netns, "removed a device this vnetd made that no interface uses any more");
                n += 1;
            }
            Ok(false) => {}
            Err(e) => warn!(device = %d.ifname, netns = ?d.netns, "could not remove: {e}"),
        }
    }
    Ok(n)
}
