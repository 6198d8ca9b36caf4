//! The engine's read side: [`EngineStatus`], an immutable handle on what the data path counts
//! (ports' counters and guards, the dispatchers, the kernel's maps through descriptors of
//! their own), which the engine's owner hands to readers after each change.
//!
//! Why apart from the [`Engine`]: the engine is changed by one owner (vnetd's), and a change
//! can take long (a device made, the kernel's table written). A reader (`show`, `/metrics`)
//! holding an [`EngineStatus`] reads live counters and never waits for that change; what it
//! sees of the ports is the set of the last publication. The ports' part is shared between
//! handles and made anew only when ports come or go or a setting changes what it reads.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use vnet_control::status::{
    CryptoStatus, DataPathKind, DispatchStatus, KernelPathStatus, KernelPortStatus, LinkReach,
    LinkState, PortRole, PortStatus,
};
use vnet_control::{DestKind, FastPathMode};
use vnet_core::{LockRecover, MatrixEntry, PortCounters, PortCountersSnapshot, PortId, PortInfo};
use vnet_fastpath::{CounterSlot, Readout};
use vnet_offload::VirtioNetHdr;

use super::Engine;
use crate::dispatch::DispatchReadout;
use crate::forward::FwdCtx;
use crate::guard::PortGuard;
use crate::ingress::guest::Ingress;
use crate::port::Port;
use crate::shared::Shared;
use crate::vxlan_socket::VxlanSocket;

/// One port as readers see it: its counters and guard, and the port itself only weakly. A
/// view a reader holds must not keep a removed port's device open: a script that removes an
/// interface and adds one of the same name (its TAP now with two queues) opens the device
/// again before the next view is published, and the old descriptors would make that fail.
#[derive(Clone)]
pub(crate) struct PortSource {
    pub id: PortId,
    pub info: PortInfo,
    pub counters: Arc<PortCounters>,
    pub guard: Arc<PortGuard>,
    pub port: Weak<dyn Port>,
    /// Where the kernel counts it, when the kernel serves it.
    pub kernel: Option<CounterSlot>,
    /// A reach link's path as of the last change of it.
    pub reach: Option<Arc<LinkReach>>,
}

/// The ports and the dispatchers as of the last change of either.
pub(crate) struct PortsStatus {
    interfaces: HashMap<String, PortSource>,
    links: HashMap<String, PortSource>,
    dispatch: DispatchReadout,
}

/// The kernel fast path's side of a status: its maps for the counters, and what its last
/// write left (a few numbers, taken at every publication).
#[derive(Clone)]
struct KernelSide {
    readout: Option<Arc<Readout>>,
    mode: FastPathMode,
    table_entries: u64,
    table_size: u64,
    table_left_out: u64,
    table_full: u64,
    matrix_size: u64,
}

/// What readers need of the data path, read without the engine: see the module header.
#[derive(Clone)]
pub struct EngineStatus {
    ports: Arc<PortsStatus>,
    shared: Arc<Shared>,
    udp: Arc<VxlanSocket>,
    kernel: Option<KernelSide>,
}

impl Engine {
    /// A read handle on the data path as it is now (cheap: the ports' part is made once per
    /// change of the ports).
    pub fn status(&mut self) -> EngineStatus {
        let ports = match &self.ports_status {
            Some(p) => p.clone(),
            None => {
                let p = Arc::new(self.ports_status());
                self.ports_status = Some(p.clone());
                p
            }
        };
        let kernel = self.kernel.as_ref().map(|k| {
            if self.kernel_readout.is_none() {
                self.kernel_readout = k.readout().map(Arc::new);
            }
            let c = k.config();
            KernelSide {
                readout: self.kernel_readout.clone(),
                mode: k.mode(),
                table_entries: k.table_len() as u64,
                table_size: c.max_table as u64,
                table_left_out: k.left_out as u64,
                table_full: k.table_full(),
                matrix_size: c.max_matrix as u64,
            }
        });
        EngineStatus {
            ports,
            shared: self.shared.clone(),
            udp: self.udp.clone(),
            kernel,
        }
    }

    /// The ports' part is made anew at the next [`Engine::status`].
    pub(super) fn ports_changed(&mut self) {
        self.ports_status = None;
    }

    fn ports_status(&self) -> PortsStatus {
        let mut interfaces = HashMap::new();
        let mut links = HashMap::new();
        for ((kind, name), rt) in &self.ports {
            let src = PortSource {
                id: rt.id,
                info: rt.entry.info,
                counters: rt.entry.counters.clone(),
                guard: rt.entry.guard.clone(),
                port: Arc::downgrade(&rt.entry.port),
                kernel: match (rt.kernel, &self.kernel) {
                    (true, Some(k)) => k.counter_slot(rt.id),
                    _ => None,
                },
                reach: rt.reach.map(|(key, configured)| {
                    let p = self.reach_paths.get(&key);
                    Arc::new(LinkReach {
                        path: p
                            .map(|p| p.kind)
                            .filter(|k| !k.is_empty())
                            .unwrap_or("unknown")
                            .to_string(),
                        to: p
                            .and_then(|p| p.direct.or(p.relay))
                            .or(Some(configured))
                            .map(|a| a.to_string()),
                        mtu: p.and_then(|p| p.mtu),
                    })
                }),
            };
            match kind {
                DestKind::Interface => interfaces.insert(name.clone(), src),
                DestKind::Link => links.insert(name.clone(), src),
            };
        }
        PortsStatus {
            interfaces,
            links,
            dispatch: self.dispatchers.readout(),
        }
    }
}

impl EngineStatus {
    fn port(&self, kind: DestKind, name: &str) -> Option<&PortSource> {
        match kind {
            DestKind::Interface => self.ports.interfaces.get(name),
            DestKind::Link => self.ports.links.get(name),
        }
    }

    fn readout(&self) -> Option<&Readout> {
        self.kernel.as_ref()?.readout.as_deref()
    }

    /// Whether the kernel fast path is loaded, and its mode.
    pub fn kernel_mode(&self) -> FastPathMode {
        self.kernel.as_ref().map_or(FastPathMode::Off, |k| k.mode)
    }

    /// Counters of one port.
    pub fn port_status(&self, kind: DestKind, name: &str) -> Option<PortStatus> {
        let p = self.port(kind, name)?;
        let mut counters = p.counters.snapshot();
        let mut policy = p.guard.status();
        let kernel = match (p.kernel, self.readout()) {
            (Some(slot), Some(r)) => r.counters(slot).ok().map(|c| {
                merge_kernel_counters(&mut counters, &c);
                // The kernel's bucket is the one that counts for what the kernel forwards.
                if let (Some(rate), Ok(Some(avail))) =
                    (policy.rate.as_mut(), r.rate_available(slot))
                {
                    rate.available_bytes = avail;
                }
                KernelPortStatus {
                    rx_frames: c.rx_frames,
                    rx_bytes: c.rx_bytes,
                    tx_frames: c.tx_frames,
                    tx_bytes: c.tx_bytes,
                    punted_frames: c.punted_frames,
                    from_vnetd_frames: c.slow_tx_frames,
                    neigh_miss: c.neigh_miss,
                    encap_fail: c.encap_fail,
                    gro_passed: c.gro_passed,
                    bad_length: c.bad_length,
                }
            }),
            _ => None,
        };
        Some(PortStatus {
            kind: match kind {
                DestKind::Interface => PortRole::Interface,
                DestKind::Link => PortRole::Link,
            },
            name: name.to_string(),
            vni: p.info.vni,
            path: if kernel.is_some() && self.kernel_mode() == FastPathMode::Kernel {
                DataPathKind::Kernel
            } else {
                DataPathKind::User
            },
            counters,
            kernel,
            nic: p.port.upgrade().and_then(|port| port.nic_status()),
            policy,
        })
    }

    /// Whether a link can carry frames now (TCP: connected; encrypted: a session); other
    /// links are connectionless and always up.
    pub fn link_state(&self, name: &str) -> LinkState {
        match self.port(DestKind::Link, name) {
            Some(p) => p
                .port
                .upgrade()
                .map_or(LinkState::Down, |port| port.state()),
            None => LinkState::Down,
        }
    }

    /// A link's state, whether it is encrypted and its reach path, with one look-up: what
    /// `show links`' text says of a link that its configuration does not.
    pub fn link_state_encrypted(&self, name: &str) -> (LinkState, bool, Option<Arc<LinkReach>>) {
        match self.port(DestKind::Link, name) {
            Some(p) => {
                let port = p.port.upgrade();
                (
                    port.as_ref().map_or(LinkState::Down, |port| port.state()),
                    port.as_ref()
                        .and_then(|port| port.as_udp())
                        .is_some_and(|u| u.crypto.is_some()),
                    p.reach.clone(),
                )
            }
            None => (LinkState::Down, false, None),
        }
    }

    /// A reach link's path (`show links`' PATH/MTU); `None` for other links.
    pub fn link_reach(&self, name: &str) -> Option<LinkReach> {
        self.port(DestKind::Link, name)?.reach.as_deref().cloned()
    }

    /// An encrypted link's session state and counters; `None` for other links.
    pub fn link_crypto(&self, name: &str) -> Option<CryptoStatus> {
        let port = self.port(DestKind::Link, name)?.port.upgrade()?;
        port.as_udp()
            .and_then(|u| u.crypto.as_ref())
            .map(|c| c.status())
    }

    /// Forwards frames as if the guest behind interface `name` had sent them (the gratuitous
    /// RARP/ARP a host sends after a migration). False when there is no such interface.
    pub fn inject_from_interface(&self, name: &str, frames: &[Vec<u8>]) -> bool {
        let Some(p) = self.port(DestKind::Interface, name) else {
            return false;
        };
        let ingress = Ingress {
            shared: self.shared.clone(),
            port: p.id,
        };
        let mut batch: Vec<(VirtioNetHdr, Vec<u8>)> = frames
            .iter()
            .map(|f| (VirtioNetHdr::default(), f.clone()))
            .collect();
        ingress.forward(&mut FwdCtx::new(), &mut batch);
        true
    }

    pub fn daemon_counters(&self) -> PortCountersSnapshot {
        self.shared.daemon.snapshot()
    }

    /// The dispatchers' modes and counters, and the offload counters.
    pub fn dispatch_status(&self) -> DispatchStatus {
        DispatchStatus {
            settings: self.ports.dispatch.settings(),
            dispatchers: self.ports.dispatch.status(),
            offload: self.shared.offload.snapshot(),
            udp_gso: self.udp.gso_enabled(),
            udp_gro: self.udp.gro_enabled(),
        }
    }

    /// The traffic matrix: vnetd's own, with the kernel's share merged in; and the frames of
    /// pairs either had no room for.
    pub fn matrix(&self) -> (Vec<MatrixEntry>, u64) {
        let m = self.shared.matrix.lock_or_recover();
        let (mut entries, mut overflow) = (m.entries(), m.overflow());
        drop(m);
        if let Some(r) = self.readout() {
            merge_matrix(&mut entries, r.matrix().unwrap_or_default());
            overflow += r.global_counters().map_or(0, |g| g.matrix_full);
        }
        (entries, overflow)
    }

    /// The kernel fast path's state for `show stats`.
    pub fn kernel_status(&self) -> Option<KernelPathStatus> {
        let k = self.kernel.as_ref()?;
        let g = self.readout().and_then(|r| r.global_counters().ok());
        Some(KernelPathStatus {
            mode: k.mode,
            table_entries: k.table_entries,
            table_size: k.table_size,
            table_left_out: k.table_left_out,
            matrix_size: k.matrix_size,
            unknown_link: g.as_ref().map_or(0, |g| g.unknown_link),
            not_vxlan: g.as_ref().map_or(0, |g| g.not_vxlan),
            fib_fail: g.as_ref().map_or(0, |g| g.fib_fail),
            vni_mismatch: g.as_ref().map_or(0, |g| g.vni_mismatch),
            table_full: k.table_full,
        })
    }
}

/// Adds what the kernel forwarded itself to a port's counters (as if one data path did it all);
/// frames it punted are counted by vnetd when it reads them.
fn merge_kernel_counters(c: &mut PortCountersSnapshot, k: &vnet_fastpath::Counters) {
    c.rx_frames += k.rx_frames;
    c.rx_bytes += k.rx_bytes;
    c.tx_frames += k.tx_frames;
    c.tx_bytes += k.tx_bytes;
    for (reason, n) in &k.drops {
        if *n > 0 {
            *c.drops.entry(reason.to_string()).or_default() += n;
        }
    }
}

/// Adds the kernel's pairs to vnetd's (the same pair from both sums).
fn merge_matrix(entries: &mut Vec<MatrixEntry>, kernel: Vec<MatrixEntry>) {
    for k in kernel {
        match entries
            .iter_mut()
            .find(|e| e.vni == k.vni && e.src == k.src && e.dst == k.dst)
        {
            Some(e) => {
                e.frames += k.frames;
                e.bytes += k.bytes;
            }
            None => entries.push(k),
        }
    }
}
