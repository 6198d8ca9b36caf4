//! A frame and virtio-net header as a guest hands them over (segmentation with complete or
//! partial checksums, checksum completion), and frames from the wire offered to the coalescer,
//! checked and (as an encrypted link's receiver offers them) vouched for as partial.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vnet_offload::{
    complete_checksum, left_partial, partial_checksum_hint, segment_with, Coalescer, L4Checksum,
    PayloadRef, SegmentList, VirtioNetHdr,
};

fuzz_target!(|data: &[u8]| {
    let Ok(vh) = VirtioNetHdr::parse(data) else { return };
    let frame = &data[10..];
    let mut out = SegmentList::new();
    for l4 in [L4Checksum::Complete, L4Checksum::Partial] {
        if segment_with(frame, &vh, &mut out, l4).is_ok() {
            for i in 0..out.len() {
                let parts = out.parts(frame, i);
                assert!(parts[0].len() + parts[1].len() <= frame.len() + 128);
            }
        }
    }
    let mut copy = frame.to_vec();
    let _ = complete_checksum(&mut copy, &vh);
    let _ = partial_checksum_hint(frame);
    let _ = left_partial(frame);
    // the same bytes cut into "datagrams" at a fuzzer-chosen size, offered in order
    let cut = (data[0] as usize % 200).max(14);
    let vouched = data[1] & 1 == 1;
    let mut c = Coalescer::new();
    let mut emitted = 0usize;
    let mut off = 10;
    while off < data.len() {
        let end = (off + cut).min(data.len());
        let at = PayloadRef { buf: 0, start: off as u32, end: end as u32 };
        let _ = c.offer(&data[off..end], at, vouched, &mut |g| {
            for p in g.payloads {
                assert!(p.start <= p.end && (p.end as usize) <= data.len());
            }
            emitted += 1;
        });
        off = end;
    }
    c.flush(&mut |_| emitted += 1);
});
