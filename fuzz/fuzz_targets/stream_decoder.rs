//! Bytes of a TCP link stream, cut into reads at positions the fuzzer chooses.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vnet_wire::{StreamDecoder, StreamHello};

fuzz_target!(|data: &[u8]| {
    if data.len() >= 8 {
        let _ = StreamHello::parse(&data[..8]);
    }
    let mut d = StreamDecoder::new();
    let cut = data.first().copied().unwrap_or(1).max(1) as usize;
    for chunk in data.chunks(cut) {
        d.push(chunk);
        loop {
            match d.next_record() {
                Ok(Some(r)) => assert!(r.len() >= 22),
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(d.pending() <= 65_557 + 4 + 256);
    }
});
