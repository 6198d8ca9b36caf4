//! Big-endian field access at fixed offsets, shared by the views so each reads as its RFC's
//! diagram does (`u16_at(b, 2)` is "bytes 2-3"). The caller has checked the length: these
//! panic on a short buffer as slicing does, which a checked view rules out.

#[inline]
pub(crate) fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}

#[inline]
pub(crate) fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

#[inline]
pub(crate) fn set_u16(b: &mut [u8], i: usize, v: u16) {
    b[i..i + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn set_u32(b: &mut [u8], i: usize, v: u32) {
    b[i..i + 4].copy_from_slice(&v.to_be_bytes());
}
