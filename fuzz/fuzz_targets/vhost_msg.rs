//! vhost-user requests from a frontend: header and payload decoded, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vnet_vhost::msg::{parse, Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_LEN + 1 {
        return;
    }
    let fds = (data[0] % 10) as usize;
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(&data[1..1 + HEADER_LEN]);
    let Ok(hdr) = Header::parse(&h) else { return };
    let body = &data[1 + HEADER_LEN..];
    let _ = parse(&hdr, body, fds);
});
