//! The batch's tests: sealing in place (over loopback sockets) and the run planner. A file of
//! its own because it uses `crate::testing`, which builds on the ports that import the batch.

use super::*;
use crate::crypto::{established_pair, OpenCache};
use crate::testing;
use vnet_crypto::Message;
use vnet_wire::VxlanRepr;

/// A batch mixing an encrypted link's datagrams (a cut frame: equal sizes, a shorter last
/// one; then another run; one frame in guest memory) with a plaintext link's: each
/// encrypted datagram arrives sealed under the next counter of one session and opens on
/// the peer to exactly the VXLAN datagram it carries; the plaintext one arrives as it was;
/// a replay is refused.
#[test]
fn an_encrypted_links_datagrams_are_sealed_in_place_and_open_on_the_peer() {
    let sh = testing::shared();
    let sock = sh.snapshot.load().udp.clone();
    let (a, b) = established_pair(sock.clone());
    let (plain, plain_rx) = testing::udp_link(&sh, 7);
    let (mut enc, enc_rx) = testing::udp_link(&sh, 7);
    Arc::get_mut(&mut enc).expect("sole owner").crypto = Some(a.clone());
    let sizes = [1000, 1000, 1000, 1000, 700, 1200, 1200, 64];
    let frames: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&n| testing::frame(testing::mac(2), testing::mac(1), n))
        .collect();
    let other = testing::frame(testing::mac(3), testing::mac(1), 300);
    // The third frame's rest lives in "guest memory" (read only through a volatile copy).
    let mut guest_mem = frames[2][12..].to_vec();
    let guest = VolatileSlice::from(&mut guest_mem[..]);
    let mut batch = TxBatch::default();
    for (k, f) in frames.iter().enumerate() {
        let rest = if k == 2 {
            Rest::Guest(guest)
        } else {
            Rest::Local(&f[12..])
        };
        batch.push(&enc, &[&f[..12]], rest);
        if k == 4 {
            batch.push(&plain, &[&other[..12]], Rest::Local(&other[12..]));
        }
    }
    batch.flush(&sh.offload, &sh.daemon, &sock);
    assert!(batch.is_empty());

    let vxlan = |f: &[u8]| {
        let mut d = VxlanRepr { vni: 7 }.header().to_vec();
        d.extend_from_slice(f);
        d
    };
    let mut buf = vec![0u8; 4096];
    let n = plain_rx.recv(&mut buf).expect("plaintext datagram");
    assert_eq!(buf[..n], vxlan(&other)[..]);
    let mut cache = OpenCache::default();
    let mut counters = Vec::new();
    let mut first = None;
    for f in &frames {
        let n = enc_rx.recv(&mut buf).expect("sealed datagram");
        assert_eq!(n, VXLAN_HEADER_LEN + f.len() + DATA_OVERHEAD);
        let Ok(Message::Data {
            receiver, counter, ..
        }) = Message::parse(&buf[..n])
        else {
            panic!("a data message");
        };
        counters.push(counter);
        first.get_or_insert_with(|| buf[..n].to_vec());
        let r = b
            .open_in_place(receiver, &mut buf[..n], &mut cache)
            .expect("opens");
        assert_eq!(buf[r], vxlan(f)[..]);
    }
    let c0 = counters[0];
    assert_eq!(counters, (c0..c0 + frames.len() as u64).collect::<Vec<_>>());
    assert_eq!(a.sealed.load(Relaxed), frames.len() as u64);
    let mut again = first.expect("one datagram");
    let Ok(Message::Data { receiver, .. }) = Message::parse(&again) else {
        panic!("a data message");
    };
    assert_eq!(
        b.open_in_place(receiver, &mut again, &mut cache),
        Err(vnet_crypto::CryptoError::Replay)
    );
}

fn runs(items: &[(usize, usize)]) -> Vec<Run> {
    plan_runs(items, |_, _| true)
}

#[test]
fn equal_sizes_to_one_link_make_one_run() {
    let items = vec![(1, 1000); 10];
    assert_eq!(
        runs(&items),
        vec![Run::Segmented {
            range: 0..10,
            size: 1000
        }]
    );
}

#[test]
fn a_shorter_datagram_ends_a_run_a_longer_one_starts_the_next() {
    let items = [(1, 1000), (1, 1000), (1, 400), (1, 1000), (1, 1200)];
    assert_eq!(
        runs(&items),
        vec![
            Run::Segmented {
                range: 0..3,
                size: 1000
            },
            Run::Singles(3..5),
        ]
    );
}

#[test]
fn another_link_ends_a_run() {
    let items = [(1, 100), (1, 100), (2, 100), (2, 100), (1, 100)];
    assert_eq!(
        runs(&items),
        vec![
            Run::Segmented {
                range: 0..2,
                size: 100
            },
            Run::Segmented {
                range: 2..4,
                size: 100
            },
            Run::Singles(4..5),
        ]
    );
}

#[test]
fn runs_are_bounded_by_count_and_bytes() {
    let items = vec![(1, 100); 150];
    let r = runs(&items);
    assert_eq!(
        r[0],
        Run::Segmented {
            range: 0..GSO_MAX_SEGMENTS,
            size: 100
        }
    );
    let items = vec![(1, 9000); 20];
    let per = GSO_MAX_BYTES / 9000;
    assert_eq!(
        runs(&items)[0],
        Run::Segmented {
            range: 0..per,
            size: 9000
        }
    );
    // Every datagram is in exactly one run, in order.
    let mut next = 0;
    for run in runs(&vec![(1, 9000); 20]) {
        let r = match run {
            Run::Segmented { range, .. } | Run::Singles(range) => range,
        };
        assert_eq!(r.start, next);
        next = r.end;
    }
    assert_eq!(next, 20);
}

#[test]
fn no_segmentation_means_one_batch_of_singles() {
    let items = [(1, 100), (1, 100), (2, 50), (2, 50)];
    assert_eq!(plan_runs(&items, |_, _| false), vec![Run::Singles(0..4)]);
    // refused only for link 2 (items 2 and 3)
    assert_eq!(
        plan_runs(&items, |first, _| items[first].0 == 1),
        vec![
            Run::Segmented {
                range: 0..2,
                size: 100
            },
            Run::Singles(2..4)
        ]
    );
}

#[test]
fn hostile_sizes_do_not_panic() {
    let items = [(1, 0), (1, 0), (1, usize::MAX), (1, 65535), (1, 1)];
    let r = runs(&items);
    let covered: usize = r
        .iter()
        .map(|x| match x {
            Run::Segmented { range, .. } | Run::Singles(range) => range.len(),
        })
        .sum();
    assert_eq!(covered, items.len());
}

/// A thread's batches reuse one set of vectors: after the first batch, a second as large
/// sends all its datagrams and allocates none of the batch's vectors anew (each keeps its
/// buffer; `recycle` moves a vector's buffer between lifetimes without a copy).
#[test]
fn batches_reuse_the_threads_vectors() {
    let sh = testing::shared();
    let sock = sh.snapshot.load().udp.clone();
    let (link, rx) = testing::udp_link(&sh, 7);
    let frames: Vec<Vec<u8>> = (0..20)
        .map(|k| testing::frame(testing::mac(2), testing::mac(1), 200 + k))
        .collect();
    let mut spare = TxSpare::default();
    let send = |spare: &mut TxSpare| {
        let mut batch = TxBatch::reusing(spare);
        for f in &frames {
            batch.push(&link, &[&f[..12]], Rest::Local(&f[12..]));
        }
        batch.flush(&sh.offload, &sh.daemon, &sock);
        batch.give_back(spare);
    };
    send(&mut spare);
    let buffers = |s: &TxSpare| {
        (
            s.udp.as_ptr() as usize,
            s.heads.as_ptr() as usize,
            s.work.items.as_ptr() as usize,
            s.work.singles.as_ptr() as usize,
            s.work.keys.as_ptr() as usize,
            s.work.path_of.as_ptr() as usize,
        )
    };
    let first = buffers(&spare);
    assert!(spare.udp.capacity() >= frames.len() && spare.work.items.capacity() >= frames.len());
    send(&mut spare);
    assert_eq!(buffers(&spare), first, "a vector was allocated anew");
    let mut buf = vec![0u8; 4096];
    for k in 0..2 * frames.len() {
        let n = rx.recv(&mut buf).expect("datagram");
        assert_eq!(n, VXLAN_HEADER_LEN + frames[k % frames.len()].len());
    }
    let v: Vec<u64> = Vec::with_capacity(64);
    let p = v.as_ptr() as usize;
    let w: Vec<u64> = recycle(v);
    assert_eq!((w.as_ptr() as usize, w.capacity()), (p, 64));
}
