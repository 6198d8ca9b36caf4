//! The table of hostile variants: per case, what each variant does and how it finishes.
//! Adding a variant is one row here.

use super::report::CaseReport;
use super::requests::{
    bad_mem_table, bad_ring_addr, bad_ring_num, canary_gpa, cut, jump_avail_idx, post, raw,
    region_end_gpa, send_bytes,
};
use super::session::{Sess, GUARD_BYTE, READONLY_BYTE, RX, SCRATCH, TX};
use crate::proto::{self, req};
use crate::ring::{DESC_F_NEXT, DESC_F_WRITE};
use anyhow::Result;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// How a variant finishes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Misbehaves before/while setting up: recovery is a full, valid bring-up.
    Setup,
    /// Misbehaves on running rings: check the ring continues, then re-initialise tx.
    Data,
    /// Raw messages that desynchronise the stream: finish by EOF.
    Stream,
    /// Cuts guest memory short on running rings: the memfd gets its size back (zeros), then
    /// as `Data`; the canary is gone with the cut, so it is not checked.
    Truncate,
}

type Body = fn(&mut Sess, &mut CaseReport) -> Result<()>;

pub(super) struct Variant {
    pub(super) case: &'static str,
    pub(super) name: &'static str,
    pub(super) what: &'static str,
    pub(super) kind: Kind,
    /// Needs rx traffic during rx_wait.
    pub(super) rx: bool,
    pub(super) body: Body,
}

macro_rules! v {
    ($case:expr, $name:expr, $what:expr, $kind:expr, $rx:expr, $body:expr) => {
        Variant {
            case: $case,
            name: $name,
            what: $what,
            kind: $kind,
            rx: $rx,
            body: $body,
        }
    };
}

pub(super) fn variants() -> Vec<Variant> {
    use Kind::*;
    vec![
        // --- descriptors pointing outside guest memory ---
        v!("desc_out_of_memory", "tx_beyond_region", "tx descriptor addr in the undeclared (canary) half of the memfd", Data, false, |s, _| {
            let a = canary_gpa(s);
            post(s, TX, &[(0, a, 1500, 0, 0)], &[0])
        }),
        v!("desc_out_of_memory", "tx_straddling_end", "tx descriptor starting 64 bytes before the region end, 4096 long", Data, false, |s, _| {
            let a = region_end_gpa(s) - 64;
            post(s, TX, &[(0, a, 4096, 0, 0)], &[0])
        }),
        v!("desc_out_of_memory", "tx_addr_wraps", "tx descriptor at 0xffff_ffff_ffff_f000 (addr+len overflows)", Data, false, |s, _| {
            post(s, TX, &[(0, 0xffff_ffff_ffff_f000, 0x2000, 0, 0)], &[0])
        }),
        v!("desc_out_of_memory", "rx_beyond_region", "writable rx descriptors in the canary half (needs rx traffic)", Data, true, |s, _| {
            let a = canary_gpa(s);
            let d: Vec<_> = (0..16u16).map(|i| (i, a + i as u64 * 4096, 4096, DESC_F_WRITE, 0)).collect();
            let h: Vec<u16> = (0..16).collect();
            post(s, RX, &d, &h)
        }),
        v!("desc_out_of_memory", "rx_straddling_end", "writable rx descriptor 64 bytes before the region end, 4096 long (needs rx traffic)", Data, true, |s, _| {
            let a = region_end_gpa(s) - 64;
            post(s, RX, &[(0, a, 4096, DESC_F_WRITE, 0)], &[0])
        }),
        // --- huge lengths ---
        v!("desc_len_huge", "tx_len_max", "tx descriptor of len 0xffffffff inside memory", Data, false, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, TX, &[(0, a, u32::MAX, 0, 0)], &[0])
        }),
        v!("desc_len_huge", "tx_chain_len_overflow", "tx chain of two 0x80000000-byte descriptors (total overflows u32)", Data, false, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, TX, &[(0, a, 0x8000_0000, DESC_F_NEXT, 1), (1, a, 0x8000_0000, 0, 0)], &[0])
        }),
        v!("desc_len_huge", "rx_len_max", "writable rx descriptor of len 0xffffffff 4 KiB before the region end (needs rx traffic)", Data, true, |s, _| {
            let a = region_end_gpa(s) - 4096;
            post(s, RX, &[(0, a, u32::MAX, DESC_F_WRITE, 0)], &[0])
        }),
        // --- loops ---
        v!("desc_loop", "self_loop", "tx descriptor whose NEXT points to itself", Data, false, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, TX, &[(0, a, 64, DESC_F_NEXT, 0)], &[0])
        }),
        v!("desc_loop", "cycle", "tx chain 0 -> 1 -> 2 -> 0", Data, false, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, TX, &[(0, a, 64, DESC_F_NEXT, 1), (1, a, 64, DESC_F_NEXT, 2), (2, a, 64, DESC_F_NEXT, 0)], &[0])
        }),
        v!("desc_loop", "rx_cycle", "rx chain 0 -> 1 -> 0 of writable descriptors (needs rx traffic)", Data, true, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, RX, &[(0, a, 8, DESC_F_WRITE | DESC_F_NEXT, 1), (1, a + 64, 8, DESC_F_WRITE | DESC_F_NEXT, 0)], &[0])
        }),
        // --- indices out of range ---
        v!("desc_index_oob", "head_oob", "avail ring entry (head) = ring size + 5", Data, false, |s, _| {
            let n = s.num();
            post(s, TX, &[], &[n + 5])
        }),
        v!("desc_index_oob", "next_oob", "tx descriptor NEXT = ring size", Data, false, |s, _| {
            let (a, n) = (s.mem.gpa(s.scratch), s.num());
            post(s, TX, &[(0, a, 64, DESC_F_NEXT, n)], &[0])
        }),
        v!("desc_index_oob", "next_max", "tx descriptor NEXT = 0xffff", Data, false, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, TX, &[(0, a, 64, DESC_F_NEXT, 0xffff)], &[0])
        }),
        // --- avail index jumps ---
        v!("avail_idx_jump", "jump_1000", "tx avail idx advanced by 1000 at once (ring of --ring-size)", Data, false, |s, _| jump_avail_idx(s, 1000)),
        v!("avail_idx_jump", "jump_0x8000", "tx avail idx advanced by 0x8000", Data, false, |s, _| jump_avail_idx(s, 0x8000)),
        // --- rx buffers the backend must not use as such ---
        v!("rx_desc_readonly", "readonly", "rx descriptors without the WRITE flag (needs rx traffic)", Data, true, |s, _| {
            let base = s.scratch;
            s.mem.fill(base, SCRATCH, READONLY_BYTE);
            let d: Vec<_> = (0..64u16).map(|i| (i, s.mem.gpa(base + i as usize * 4096), 4096, 0, 0)).collect();
            let h: Vec<u16> = (0..64).collect();
            post(s, RX, &d, &h)
        }),
        v!("rx_buf_tiny", "tiny", "rx buffers of 4 bytes (guard bytes after each; one at the region end) (needs rx traffic)", Data, true, |s, _| {
            let base = s.scratch;
            s.mem.fill(base, SCRATCH, GUARD_BYTE);
            let mut d: Vec<_> = (0..63u16).map(|i| (i, s.mem.gpa(base + i as usize * 64), 4, DESC_F_WRITE, 0)).collect();
            d.push((63, region_end_gpa(s) - 4, 4, DESC_F_WRITE, 0));
            let h: Vec<u16> = (0..64).collect();
            post(s, RX, &d, &h)
        }),
        // --- ring setup ---
        v!("ring_size_bad", "num_0", "SET_VRING_NUM 0 on the tx ring, then start it and queue a frame", Setup, false, |s, rep| bad_ring_num(s, rep, 0)),
        v!("ring_size_bad", "num_3", "SET_VRING_NUM 3 (not a power of two), then start it and queue a frame", Setup, false, |s, rep| bad_ring_num(s, rep, 3)),
        v!("ring_size_bad", "num_65536", "SET_VRING_NUM 65536 (above 32768), then start it and queue a frame", Setup, false, |s, rep| bad_ring_num(s, rep, 65536)),
        v!("ring_addr_outside", "desc_outside", "tx desc table in the canary half, then a kick", Setup, false, |s, rep| {
            let l = s.layouts[TX];
            let out = s.mem.uva(s.mem.region_size()) + 0x1000;
            bad_ring_addr(s, rep, out, s.mem.uva(l.used), s.mem.uva(l.avail), true)
        }),
        v!("ring_addr_outside", "used_outside", "tx used ring in the canary half, a valid frame queued", Setup, false, |s, rep| {
            let l = s.layouts[TX];
            let out = s.mem.uva(s.mem.region_size()) + 0x1000;
            bad_ring_addr(s, rep, s.mem.uva(l.desc), out, s.mem.uva(l.avail), true)
        }),
        v!("ring_addr_outside", "avail_unmapped", "tx avail ring at address 0x1000 (no region there)", Setup, false, |s, rep| {
            let l = s.layouts[TX];
            bad_ring_addr(s, rep, s.mem.uva(l.desc), s.mem.uva(l.used), 0x1000, true)
        }),
        v!("ring_addr_outside", "desc_straddle", "tx desc table starting 64 bytes before the region end", Setup, false, |s, rep| {
            let l = s.layouts[TX];
            let d = s.mem.uva(s.mem.region_size()) - 64;
            bad_ring_addr(s, rep, d, s.mem.uva(l.used), s.mem.uva(l.avail), true)
        }),
        // --- memory tables ---
        v!("mem_table_bad", "size_zero", "one region of size 0", Setup, false, |s, rep| {
            let mut r = s.mem.region();
            r.memory_size = 0;
            bad_mem_table(s, rep, 1, &[r], 1)
        }),
        v!("mem_table_bad", "gpa_overflow", "region whose guest address + size overflows", Setup, false, |s, rep| {
            let mut r = s.mem.region();
            r.guest_phys_addr = u64::MAX - 0xfff;
            bad_mem_table(s, rep, 1, &[r], 1)
        }),
        v!("mem_table_bad", "uaddr_overflow", "region whose userspace address + size overflows", Setup, false, |s, rep| {
            let mut r = s.mem.region();
            r.userspace_addr = u64::MAX - 0xfff;
            bad_mem_table(s, rep, 1, &[r], 1)
        }),
        v!("mem_table_bad", "beyond_file", "mmap_offset + size beyond the memfd's size (a mapping that SIGBUSes), then rings in it", Setup, false, |s, rep| {
            let mut r = s.mem.region();
            r.mmap_offset = s.mem.len() as u64;
            bad_mem_table(s, rep, 1, &[r], 1)
        }),
        v!("mem_table_bad", "fd_count_short", "two regions declared, one fd", Setup, false, |s, rep| {
            let r = s.mem.region();
            let mut r2 = r;
            r2.guest_phys_addr += r.memory_size;
            r2.userspace_addr += r.memory_size;
            bad_mem_table(s, rep, 2, &[r, r2], 1)
        }),
        v!("mem_table_bad", "fd_count_extra", "one region, three fds", Setup, false, |s, rep| {
            let r = s.mem.region();
            bad_mem_table(s, rep, 1, &[r], 3)
        }),
        v!("mem_table_bad", "no_fd", "one region, no fd", Setup, false, |s, rep| {
            let r = s.mem.region();
            bad_mem_table(s, rep, 1, &[r], 0)
        }),
        v!("mem_table_bad", "nregions_huge", "region count 0xffff with one region of payload", Setup, false, |s, rep| {
            let r = s.mem.region();
            bad_mem_table(s, rep, 0xffff, &[r], 1)
        }),
        v!("mem_table_bad", "nregions_zero", "region count 0 (and no fd)", Setup, false, |s, rep| {
            bad_mem_table(s, rep, 0, &[], 0)
        }),
        // --- garbage messages (on a running device) ---
        v!("msg_garbage", "unknown_request", "request code 0x7fff0000 with an 8-byte payload", Data, false, |s, rep| {
            raw(s, rep, 0x7fff_0000, proto::FLAG_VERSION_1, &[0u8; 8], &[])
        }),
        v!("msg_garbage", "request_zero", "request code 0", Data, false, |s, rep| {
            raw(s, rep, 0, proto::FLAG_VERSION_1, &[], &[])
        }),
        v!("msg_garbage", "size_over_max", "SET_FEATURES with a complete 4097-byte payload (over the 4096 limit)", Data, false, |s, rep| {
            raw(s, rep, req::SET_FEATURES, proto::FLAG_VERSION_1, &[0u8; 4097], &[])
        }),
        v!("msg_garbage", "bad_version", "GET_FEATURES with protocol version 2 in the flags", Data, false, |s, rep| {
            raw(s, rep, req::GET_FEATURES, 0x2, &[], &[])
        }),
        v!("msg_garbage", "reply_flag", "SET_VRING_NUM carrying the REPLY flag", Data, false, |s, rep| {
            let n = s.num() as u32;
            raw(s, rep, req::SET_VRING_NUM, proto::FLAG_VERSION_1 | proto::FLAG_REPLY, &proto::vring_state(0, n), &[])
        }),
        v!("msg_garbage", "short_payload", "SET_VRING_NUM with a 4-byte payload (needs 8)", Data, false, |s, rep| {
            raw(s, rep, req::SET_VRING_NUM, proto::FLAG_VERSION_1, &[0u8; 4], &[])
        }),
        v!("msg_garbage", "long_payload", "SET_VRING_BASE with a 16-byte payload", Data, false, |s, rep| {
            raw(s, rep, req::SET_VRING_BASE, proto::FLAG_VERSION_1, &[0u8; 16], &[])
        }),
        v!("msg_garbage", "vring_index_oob", "SET_VRING_NUM/ENABLE/KICK for ring indices 200 and 255", Data, false, |s, rep| {
            let fd = s.queues[TX].as_ref().map(|q| q.kick.as_raw_fd());
            raw(s, rep, req::SET_VRING_NUM, proto::FLAG_VERSION_1, &proto::vring_state(200, 256), &[])?;
            raw(s, rep, req::SET_VRING_ENABLE, proto::FLAG_VERSION_1, &proto::vring_state(200, 1), &[])?;
            match fd {
                Some(fd) => raw(s, rep, req::SET_VRING_KICK, proto::FLAG_VERSION_1, &proto::u64_payload(255), &[fd]),
                None => Ok(()),
            }
        }),
        v!("msg_garbage", "unexpected_fds", "GET_FEATURES with three fds attached", Data, false, |s, rep| {
            let fd = s.mem.fd();
            raw(s, rep, req::GET_FEATURES, proto::FLAG_VERSION_1, &[], &[fd, fd, fd])?;
            // Our GET_FEATURES gets a reply: consume it so the probe is not confused.
            if let Err(e) = s.conn.recv_reply(req::GET_FEATURES) {
                rep.notes.push(format!("no reply to GET_FEATURES with fds: {e}"));
            }
            Ok(())
        }),
        v!("msg_garbage", "too_many_fds", "SET_VRING_CALL with 40 fds attached (more than backends accept)", Data, false, |s, rep| {
            let fd = s.queues[TX].as_ref().map_or(s.mem.fd(), |q| q.call.as_raw_fd());
            let fds = vec![fd; 40];
            raw(s, rep, req::SET_VRING_CALL, proto::FLAG_VERSION_1, &proto::u64_payload(1), &fds)
        }),
        v!("msg_garbage", "noreply_ack_flag", "SET_VRING_ENABLE ring 1 with NEED_REPLY although REPLY_ACK may not be negotiated", Data, false, |s, rep| {
            raw(s, rep, req::SET_VRING_ENABLE, proto::FLAG_VERSION_1 | proto::FLAG_NEED_REPLY, &proto::vring_state(1, 1), &[])?;
            if let Ok(p) = s.conn.recv_reply(req::SET_VRING_ENABLE) {
                rep.notes.push(format!("backend acked with {} bytes", p.len()));
            }
            Ok(())
        }),
        // --- truncated messages: the backend must handle EOF mid-message ---
        v!("truncated", "header_partial", "6 bytes of a header, then EOF", Stream, false, |s, rep| {
            let h = proto::header(req::GET_FEATURES, proto::FLAG_VERSION_1, 0);
            send_bytes(s, rep, &h[..6])
        }),
        v!("truncated", "payload_missing", "SET_VRING_ADDR header (size 40) without payload, then EOF", Stream, false, |s, rep| {
            let h = proto::header(req::SET_VRING_ADDR, proto::FLAG_VERSION_1, 40);
            send_bytes(s, rep, &h)
        }),
        v!("truncated", "payload_partial", "SET_MEM_TABLE header (size 40) with 20 payload bytes and the fd, then EOF", Stream, false, |s, rep| {
            let mut b = proto::header(req::SET_MEM_TABLE, proto::FLAG_VERSION_1, 40).to_vec();
            b.extend_from_slice(&proto::mem_table(1, &[s.mem.region()])[..20]);
            if let Err(e) = s.conn.send_raw(&b, &[s.mem.fd()]) {
                rep.conn_err("send", e);
            }
            Ok(())
        }),
        v!("truncated", "size_huge", "SET_VRING_NUM header claiming a 256 MiB payload, 64 bytes sent, then EOF", Stream, false, |s, rep| {
            let mut b = proto::header(req::SET_VRING_NUM, proto::FLAG_VERSION_1, 0x1000_0000).to_vec();
            b.extend_from_slice(&[0xee; 64]);
            send_bytes(s, rep, &b)
        }),
        // --- guest memory cut short under the backend (SIGBUS when it touches it) ---
        v!("mem_truncate", "tx_kick", "memfd (not sealable) cut to 0 bytes on running rings, then a queued tx frame kicked", Truncate, false, |s, rep| {
            s.queue_valid_tx()?;
            cut(s, rep);
            for _ in 0..3 {
                s.kick(TX);
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        }),
        v!("mem_truncate", "rx_traffic", "memfd (not sealable) cut to 0 bytes while rx buffers are posted and traffic arrives (needs rx traffic)", Truncate, true, |s, rep| {
            let a = s.mem.gpa(s.scratch);
            let d: Vec<_> = (0..16u16).map(|i| (i, a + i as u64 * 4096, 4096, DESC_F_WRITE, 0)).collect();
            let h: Vec<u16> = (0..16).collect();
            post(s, RX, &d, &h)?;
            std::thread::sleep(s.opts.rx_wait / 4);
            cut(s, rep);
            s.kick(RX);
            Ok(())
        }),
        v!("mem_truncate", "sealed_memfd", "memfd made sealable: the backend seals it against shrinking, so the cut must be refused", Truncate, false, |s, rep| {
            s.queue_valid_tx()?;
            cut(s, rep);
            s.kick(TX);
            Ok(())
        }),
    ]
}
