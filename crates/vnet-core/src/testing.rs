//! Test support shared by the modules' unit tests.

use vnet_wire::MacAddr;

/// A unicast guest MAC (QEMU's 52:54:00 prefix) ending in `last`.
pub fn mac(last: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, last])
}
