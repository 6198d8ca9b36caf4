//! The kernel fast path from the engine's side: loading it, its mode, the end of a takeover
//! of an earlier vnetd's pinned maps, and the devices' `forwarding` values it changed. What
//! the kernel does per port and per route is in `crate::kernel`; how its table follows the
//! engine's, in `publish.rs`.

use vnet_control::FastPathMode;
use vnet_fastpath::FastPathConfig;

use super::Engine;
use crate::kernel::KernelPath;

impl Engine {
    /// Loads the kernel fast path (`vnet-fastpath`): veth and netdev interfaces and plain udp
    /// links opened from now on are forwarded in the kernel where the table decides. The error
    /// says why the kernel cannot (vnetd then runs everything in user space).
    pub fn enable_kernel_path(&mut self, mut cfg: FastPathConfig) -> Result<(), String> {
        cfg.vxlan_port = self.udp.local_addr().port();
        let k = KernelPath::open(&cfg, self.udp.local_addr().ip()).map_err(|e| e.to_string())?;
        self.kernel = Some(k);
        self.kernel_readout = None;
        self.ports_changed();
        Ok(())
    }

    /// Whether the kernel fast path is loaded, and its mode.
    pub fn kernel_mode(&self) -> FastPathMode {
        match &self.kernel {
            Some(k) => k.mode(),
            None => FastPathMode::Off,
        }
    }

    /// Ends a takeover of an earlier vnetd's kernel fast path, once the restored configuration
    /// is realized: see [`vnet_fastpath::FastPath::commit`].
    pub fn commit_kernel_takeover(&mut self) {
        if let Some(k) = &mut self.kernel {
            k.commit();
        }
    }

    /// Whether the kernel fast path is pinned: forwarding between fast-path ports and plain
    /// udp links goes on while no vnetd runs.
    pub fn kernel_pinned(&self) -> bool {
        self.kernel.as_ref().is_some_and(|k| k.pinned())
    }

    /// The `forwarding` sysctls the kernel fast path changed, as they were before.
    pub fn kernel_forwarding_originals(&self) -> Vec<vnet_fastpath::ForwardingOriginal> {
        self.kernel
            .as_ref()
            .map(|k| k.forwarding_originals())
            .unwrap_or_default()
    }

    /// Hands the kernel fast path the `forwarding` values an earlier vnetd recorded.
    pub fn set_kernel_forwarding_originals(&mut self, o: Vec<vnet_fastpath::ForwardingOriginal>) {
        if let Some(k) = &mut self.kernel {
            k.set_forwarding_originals(o);
        }
    }
}
