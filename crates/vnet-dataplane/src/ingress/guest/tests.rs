//! A guest's frames handed over in place (vhost-user cut-through) or copied, and the
//! cut-through receive's frames decided as every other ingress's.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vnet_control::{PortPolicy, RateLimit};
use vnet_core::PortId;
use vnet_offload::VirtioNetHdr;
use vnet_wire::MacAddr;

use super::{CutThrough, DecidedFrames, GuestFrame, Ingress};
use crate::forward::FwdCtx;
use crate::shared::Shared;
use crate::testing::*;

#[test]
fn empty_and_runt_guest_frames_are_counted() {
    let sh = shared();
    publish(
        &sh,
        vec![TestPort::interface(
            1,
            mac(1),
            Arc::new(Recorder::default()),
        )],
        vec![],
    );
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
    let runt = mem.get_slice(GuestAddress(0), 10).unwrap();
    let empty = mem.get_slice(GuestAddress(0), 0).unwrap();
    let ingress = Ingress {
        shared: sh.clone(),
        port: PortId(1),
    };
    ingress.forward_guest(
        &mut FwdCtx::new(),
        &[
            (VirtioNetHdr::default(), GuestFrame::Shared(runt)),
            (VirtioNetHdr::default(), GuestFrame::Shared(empty)),
        ],
    );
    let c = counters(&sh, 1);
    assert_eq!(c.drops.get("truncated"), Some(&1));
    assert_eq!(c.rx_frames, 1, "an empty frame is no frame");
}

/// A vhost-user interface (port 1, MAC 1) alone in VNI 1 with links 3 and 4, `any -> MAC 9`
/// through link 4, learning on: the cut-through receive's situation, on a fresh `Shared`.
fn cut_through_lab() -> (Arc<Shared>, [Arc<Recorder>; 3]) {
    let sh = shared();
    let r: [Arc<Recorder>; 3] = Default::default();
    publish(
        &sh,
        vec![
            TestPort::interface(1, mac(1), r[0].clone()),
            TestPort::link(3, r[1].clone()),
            TestPort::link(4, r[2].clone()),
        ],
        vec![route(mac(1), 1), route(mac(9), 4)],
    );
    sh.learning.store(true, Relaxed);
    (sh, r)
}

/// What a cut-through receive's batch arriving on link 3 sees: frames for the guest (one from
/// a MAC that sends nothing else; the first pair again at the end, a route-cache hit), a frame for another host, a broadcast and a
/// frame to an unknown MAC (flooded: to the guest alone, split horizon keeps them from link
/// 4), a frame to a MAC learned on link 3 itself (not sent back), a runt, and a frame too
/// large for the guest's receive buffers.
fn arrivals() -> Vec<(Vec<u8>, bool)> {
    vec![
        (frame(mac(1), mac(7), 100), true),
        (frame(mac(1), mac(7), 200), true),
        (frame(mac(1), mac(5), 120), true),
        (frame(mac(9), mac(7), 300), true),
        (frame(MacAddr::BROADCAST, mac(8), 60), true),
        (frame(mac(7), mac(8), 70), true),
        (frame(mac(6), mac(8), 80), true),
        (frame(mac(1), mac(7), 13), true),
        (frame(mac(1), mac(8), 1600), false),
        (frame(mac(1), mac(7), 100), true),
    ]
}

/// Everything the decision leaves behind, to compare two ways in: every port's counters,
/// what each port was handed (the guest's frames as bytes, whichever way they reached it),
/// what was learned, the thread's route-cache hits and misses, and the traffic matrix.
type Outcome = (
    Vec<vnet_core::PortCountersSnapshot>,
    Vec<Vec<Vec<u8>>>,
    Vec<Option<PortId>>,
    (u64, u64),
    Vec<vnet_core::MatrixEntry>,
);

fn outcome(sh: &Shared, r: &[Arc<Recorder>; 3], ctx: &mut FwdCtx, guest: Vec<Vec<u8>>) -> Outcome {
    ctx.flush(sh);
    // Sorted: the cut-through receive writes its guest's frames before it hands on the rest.
    let mut to_guest = guest;
    to_guest.extend(r[0].take().into_iter().map(|s| s.bytes));
    let mut handed = vec![
        to_guest,
        r[1].take().into_iter().map(|s| s.bytes).collect(),
        r[2].take().into_iter().map(|s| s.bytes).collect(),
    ];
    handed.iter_mut().for_each(|h| h.sort());
    (
        [1, 3, 4].iter().map(|p| counters(sh, *p)).collect(),
        handed,
        [7, 8, 5, 6]
            .iter()
            .map(|m| sh.learned(1, mac(*m)))
            .collect(),
        ctx.cache_stats(),
        sh.matrix.lock().unwrap().entries(),
    )
}

#[test]
fn a_cut_through_frame_is_decided_as_any_other() {
    // The ordinary way in: each frame through `process`.
    let (sh, r) = cut_through_lab();
    let ingress = Ingress {
        shared: sh.clone(),
        port: PortId(1),
    };
    let mut ctx = FwdCtx::new();
    let frames: Vec<Vec<u8>> = arrivals().into_iter().map(|(f, _)| f).collect();
    ingress.forward_from(&mut ctx, PortId(3), &frames);
    let ordinary = outcome(&sh, &r, &mut ctx, vec![]);

    // The cut-through way in: the same frames through `cut_through`, the guest's written by
    // the caller, the rest handed on after the batch.
    let (sh, r) = cut_through_lab();
    let ingress = Ingress {
        shared: sh.clone(),
        port: PortId(1),
    };
    let mut ctx = FwdCtx::new();
    let mut later = DecidedFrames::default();
    let mut written = Vec::new();
    let mut outcomes = Vec::new();
    let batch = arrivals();
    for (k, (f, fits)) in batch.iter().enumerate() {
        let o = ingress.cut_through(&mut ctx, PortId(3), f, *fits, k, &mut later);
        if o == CutThrough::Guest {
            written.push(f.clone());
        }
        outcomes.push(o);
    }
    assert_eq!(later.len(), 2, "transit, too large");
    ingress.forward_decided(&mut ctx, &mut later, |k| &batch[k].0);
    assert!(later.is_empty());
    let cut = outcome(&sh, &r, &mut ctx, written);

    use CutThrough::*;
    assert_eq!(
        outcomes,
        [Guest, Guest, Guest, Elsewhere, Guest, Dropped, Guest, Dropped, Elsewhere, Guest]
    );
    assert_eq!(cut.0, ordinary.0, "counters of ports 1, 3, 4");
    assert!(
        cut.1 == ordinary.1,
        "what ports 1, 3, 4 were handed differs"
    );
    assert_eq!(cut.2, ordinary.2, "what was learned");
    // MAC 5 sent only frames the cut-through receive wrote into the guest's buffers.
    assert_eq!(
        cut.2,
        [Some(PortId(3)), Some(PortId(3)), Some(PortId(3)), None]
    );
    assert_eq!(cut.3, ordinary.3, "route-cache hits and misses");
    assert_eq!(cut.4, ordinary.4, "traffic matrix");
    // And the figures themselves, so the two cannot agree by both being wrong.
    assert_eq!(cut.3, (1, 8), "the repeated pair hit the cache");
    assert_eq!(cut.0[1].rx_frames, 10);
    assert_eq!(cut.0[1].drops.get("truncated"), Some(&1));
    assert_eq!(
        cut.0[1].drops.get("no_route"),
        Some(&1),
        "to MAC 7, learned on the link itself"
    );
    assert_eq!(
        cut.1[0].len(),
        7,
        "MAC 1 four times, the broadcast, the unknown, the large frame"
    );
}

#[test]
fn a_rate_limited_links_cut_through_frames_pay_its_bucket() {
    let (sh, _r) = cut_through_lab();
    let mut ports = vec![
        TestPort::interface(1, mac(1), Arc::new(Recorder::default())),
        TestPort::link(3, Arc::new(Recorder::default())),
    ];
    ports[1].policy = PortPolicy {
        any_source: false,
        rate: Some(RateLimit {
            mbit: 1,
            burst_kb: 1,
        }),
    };
    publish(&sh, ports, vec![route(mac(1), 1)]);
    let ingress = Ingress {
        shared: sh.clone(),
        port: PortId(1),
    };
    let (mut ctx, mut later) = (FwdCtx::new(), DecidedFrames::default());
    let f = frame(mac(1), mac(7), 1400);
    let got: Vec<CutThrough> = (0..20)
        .map(|k| ingress.cut_through(&mut ctx, PortId(3), &f, true, k, &mut later))
        .collect();
    // A 1 KB bucket at 1 Mbit/s: the first frame, then one per 11 ms at most.
    let passed = got.iter().filter(|o| **o == CutThrough::Guest).count();
    assert!((1..=3).contains(&passed), "{got:?}");
    assert_eq!(
        counters(&sh, 3).drops.get("rate_limited"),
        Some(&(20 - passed as u64))
    );
    assert_eq!(counters(&sh, 1).tx_frames, passed as u64);
}
