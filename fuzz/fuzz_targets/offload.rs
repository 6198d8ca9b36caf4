//! A frame and virtio-net header as a guest hands them over (segmentation, checksum
//! completion), and frames from the wire offered to the coalescer.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vnet_offload::{complete_checksum, partial_checksum_hint, segment, Coalescer, PayloadRef, SegmentList, VirtioNetHdr};

fuzz_target!(|data: &[u8]| {
    let Ok(vh) = VirtioNetHdr::parse(data) else { return };
    let frame = &data[10..];
    let mut out = SegmentList::new();
    if segment(frame, &vh, &mut out).is_ok() {
        for i in 0..out.len() {
            let parts = out.parts(frame, i);
            assert!(parts[0].len() + parts[1].len() <= frame.len() + 128);
        }
    }
    let mut copy = frame.to_vec();
    let _ = complete_checksum(&mut copy, &vh);
    let _ = partial_checksum_hint(frame);
    // the same bytes cut into "datagrams" at a fuzzer-chosen size, offered in order
    let cut = (data[0] as usize % 200).max(14);
    let mut c = Coalescer::new();
    let mut emitted = 0usize;
    let mut off = 10;
    while off < data.len() {
        let end = (off + cut).min(data.len());
        let at = PayloadRef { buf: 0, start: off as u32, end: end as u32 };
        let _ = c.offer(&data[off..end], at, &mut |g| {
            for p in g.payloads {
                assert!(p.start <= p.end && (p.end as usize) <= data.len());
            }
            emitted += 1;
        });
        off = end;
    }
    c.flush(&mut |_| emitted += 1);
});
