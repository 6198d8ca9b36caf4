//! Test support: a guest's memory and the frames the ring tests put in it.

use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::device::Mem;

/// The guest memory's size, and where the tests put their buffers.
pub const MEM: u64 = 0x10_0000;
pub const BUF: u64 = 0x8_0000;

pub fn mem() -> Mem {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM as usize)]).expect("guest memory")
}

/// An Ethernet frame of `len` bytes (IPv4 ethertype, a pattern).
pub fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    for (i, b) in f.iter_mut().enumerate().skip(14) {
        *b = i as u8;
    }
    f
}
