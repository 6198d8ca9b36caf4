//! Changes to a running fast path: table applies (minimal, and a full table staying slow),
//! incremental updates of the touched destinations only,
//! the outer cache's invalidation, and rate rewrites under the bucket lock.

use crate::helpers::*;
use vnet_core::{ForwardingTable, PortId, PortInfo, PortKind, RouteRule};
use vnet_fastpath::*;
use vnet_wire::MacAddr;

#[test]
fn table_updates_are_minimal_and_a_full_table_stays_slow() {
    let Some(mut l) = lab_with(FastPathConfig {
        max_table: 5,
        ..FastPathConfig::default()
    }) else {
        return;
    };
    let ports = compile_ports(&[
        (PORT_A, Egress::FastPort),
        (PORT_B, Egress::FastPort),
        (LINK_C, Egress::UdpLink),
    ]);
    let mut rules = exact_routes(&[(A, PORT_A), (B, PORT_B), (C, LINK_C)]);
    // Same three destinations (D's entry goes): one delete, nothing rewritten.
    let r = l.fp.apply_table(&compile(&ports, &rules, false)).unwrap();
    assert_eq!((r.written, r.deleted, r.left_out), (0, 1, 0));
    // B moves to the link: one overwrite.
    rules[1].dest = LINK_C;
    let r = l.fp.apply_table(&compile(&ports, &rules, false)).unwrap();
    assert_eq!((r.written, r.deleted), (1, 0));
    let f = frame(B, A, 64);
    let out = l.run_from_a(&f);
    assert_eq!(out.data.len(), f.len() + 50, "B now goes out encapsulated");
    // Five more destinations into a table of five: two fit, three stay slow (counted).
    let more: Vec<_> = (0..5u8)
        .map(|i| (MacAddr([0x52, 0x54, 0, 0, 1, i]), PORT_B))
        .collect();
    rules.extend(exact_routes(&more));
    let r = l.fp.apply_table(&compile(&ports, &rules, false)).unwrap();
    assert_eq!((r.written, r.left_out), (2, 3));
    assert_eq!(l.fp.table_len(), 5);
    assert_eq!(l.fp.global_counters().unwrap().table_full, 3);
    let slow = frame(MacAddr([0x52, 0x54, 0, 0, 1, 4]), A, 64);
    let punted_before = l.fp.port_counters(PORT_A).unwrap().punted_frames;
    l.run_from_a(&slow);
    assert_eq!(
        l.fp.port_counters(PORT_A).unwrap().punted_frames,
        punted_before + 1
    );
    // Detaching port B turns its entries slow before its slot goes.
    l.fp.detach_port(PORT_B).unwrap();
    let r = l.run_from_a(&frame(MacAddr([0x52, 0x54, 0, 0, 1, 0]), A, 64));
    assert_eq!(r.verdict, TCX_REDIRECT);
    assert_eq!(
        l.fp.port_counters(PORT_A).unwrap().punted_frames,
        punted_before + 2
    );
}

/// Keeps the calling thread on one CPU (the outer cache is per CPU).
fn pin_to_one_cpu() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it, and
    // sched_getcpu / sched_setaffinity only read what we pass.
    unsafe {
        let cpu = libc::sched_getcpu().max(0) as usize;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

#[test]
fn invalidating_the_outer_cache_takes_a_changed_next_hop_at_once() {
    let Some(l) = lab() else { return };
    pin_to_one_cpu();
    let f = frame(C, A, 100);
    let dmac = |l: &Lab| {
        let r = l.run_from_a(&f);
        assert_eq!(r.verdict, TCX_REDIRECT);
        r.data[0..6].to_vec()
    };
    assert_eq!(dmac(&l), NEIGH_MAC);
    let moved = [0x02, 0, 0, 0, 0, 0x22];
    set_neighbour("02:00:00:00:00:22");
    // Cached for a second...
    assert_eq!(dmac(&l), NEIGH_MAC);
    // ...unless told: from another thread, as vnetd's netlink watcher does.
    let inv = l.fp.outer_cache_invalidator();
    std::thread::spawn(move || inv.invalidate().unwrap())
        .join()
        .unwrap();
    assert_eq!(dmac(&l), moved);
}

#[test]
fn rate_updates_take_the_buckets_lock() {
    let Some(mut l) = lab() else { return };
    let big = Rate {
        bits_per_sec: 8_000_000,
        burst_bytes: 1 << 20,
    };
    let small = Rate {
        bits_per_sec: 8_000,
        burst_bytes: 3000,
    };
    let policy = |rate| PortPolicy {
        any_source: false,
        rate: Some(rate),
    };
    l.fp.update_port(PORT_A, &policy(small)).unwrap();
    assert_eq!(l.fp.rate_available(PORT_A).unwrap(), Some(3000));
    // The guest sends as fast as it can while the bucket is rewritten, alternately full at
    // 1 MB and at 3000 bytes: read back under the lock right after a rewrite to 3000 bytes,
    // the bucket never holds more (an unlocked rewrite racing a program's update could leave
    // the program's view of the 1 MB bucket behind). A race: without BPF_F_LOCK this caught it
    // in about one run in four here; with it, never.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let sender = std::thread::spawn(move || {
        // SAFETY: plain socket(2); the fd is owned by the OwnedFd below.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                (libc::ETH_P_ALL as u16).to_be() as i32,
            )
        };
        assert!(fd >= 0, "packet socket");
        // SAFETY: fd was just returned by socket(2) and nothing else owns it.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data, valid all zero.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = ifindex("pa-g") as i32;
        sll.sll_halen = 6;
        let f = frame(B, A, 1000);
        // Batches of frames per system call, so the program runs as often as it can.
        let mut iov = libc::iovec {
            iov_base: f.as_ptr() as *mut libc::c_void,
            iov_len: f.len(),
        };
        // SAFETY: mmsghdr is plain data, valid all zero; its pointers are set below.
        let mut msgs: Vec<libc::mmsghdr> = (0..64).map(|_| unsafe { std::mem::zeroed() }).collect();
        for m in msgs.iter_mut() {
            m.msg_hdr.msg_name = (&mut sll as *mut libc::sockaddr_ll).cast();
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            m.msg_hdr.msg_iov = &mut iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        let mut n = 0u64;
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: every mmsghdr points at `sll` and `iov`, which point at live memory
            // (`f`) of the lengths given, for the duration of the call.
            let r = unsafe {
                libc::sendmmsg(
                    std::os::fd::AsRawFd::as_raw_fd(&fd),
                    msgs.as_mut_ptr(),
                    msgs.len() as u32,
                    0,
                )
            };
            n += r.max(0) as u64;
        }
        n
    });
    let t0 = std::time::Instant::now();
    let mut torn = 0;
    let mut rounds = 0;
    while t0.elapsed() < std::time::Duration::from_secs(2) {
        l.fp.update_port(PORT_A, &policy(big)).unwrap();
        l.fp.update_port(PORT_A, &policy(small)).unwrap();
        if l.fp.rate_available(PORT_A).unwrap().unwrap() > 3000 {
            torn += 1;
        }
        rounds += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = sender.join().unwrap();
    let a = l.fp.port_counters(PORT_A).unwrap();
    eprintln!("{rounds} rewrites, {sent} frames sent, {a:?}");
    assert!(a.rx_frames + a.drops.values().sum::<u64>() > 1000, "{a:?}");
    assert_eq!(
        torn, 0,
        "{torn} of {rounds} reads saw a bucket fuller than its cap"
    );
}

/// A route change written incrementally (`recompile` + `update_table`, as the engine does on
/// a route event): only the moved destination's entry is written, and frames follow it.
#[test]
fn an_incremental_update_writes_the_moved_destination_only() {
    let Some(mut l) = lab() else { return };
    let kinds = [
        (PORT_A, Egress::FastPort, PortKind::Interface),
        (PORT_B, Egress::FastPort, PortKind::Interface),
        (LINK_C, Egress::UdpLink, PortKind::OverlayLink),
        (LINK_D, Egress::UdpLink, PortKind::OverlayLink),
    ];
    let rules = exact_routes(&[(A, PORT_A), (B, PORT_B), (C, LINK_C), (D, LINK_D)]);
    let mut ft = ForwardingTable::new(
        1,
        kinds
            .iter()
            .map(|(id, _, k)| (*id, PortInfo { vni: 1, kind: *k })),
        rules.iter().copied(),
    );
    let cp: Vec<CompilePort> = kinds
        .iter()
        .map(|(id, e, _)| CompilePort {
            id: *id,
            vni: 1,
            egress: *e,
        })
        .collect();
    let port = |id: PortId| cp.iter().find(|p| p.id == id).copied();
    // B moves from port B to link C.
    let old = rules[1];
    let new = RouteRule {
        dest: LINK_C,
        ..old
    };
    assert!(ft.remove_route(&old) && ft.insert_route(new));
    let touched = [Touched::Dst(1, B)];
    let r =
        l.fp.update_table(|t| recompile(t, ft.routes(), &touched, port, false))
            .expect("update");
    assert_eq!((r.written, r.deleted, r.left_out), (1, 0, 0));
    assert_eq!(l.fp.table_len(), 4);
    let f = frame(B, A, 100);
    let out = l.run_from_a(&f);
    assert_eq!(out.verdict, TCX_REDIRECT);
    assert_eq!(out.data.len(), f.len() + 50, "encapsulated towards link C");
    assert_eq!(l.fp.link_counters(LINK_C).unwrap().tx_frames, 1);
    assert_eq!(l.fp.port_counters(PORT_B).unwrap().tx_frames, 0);
    // B goes: its entry is deleted, and its frames are punted.
    assert!(ft.remove_route(&new));
    let r =
        l.fp.update_table(|t| recompile(t, ft.routes(), &touched, port, false))
            .expect("update");
    assert_eq!((r.written, r.deleted), (0, 1));
    let punted = l.fp.port_counters(PORT_A).unwrap().punted_frames;
    let out = l.run_from_a(&f);
    assert_eq!(
        (out.verdict, out.data == f),
        (TCX_REDIRECT, true),
        "to the punt TAP, unchanged"
    );
    assert_eq!(
        l.fp.port_counters(PORT_A).unwrap().punted_frames,
        punted + 1
    );
}
