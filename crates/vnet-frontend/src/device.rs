//! Connecting to a backend and bringing the device up the way QEMU does: features, owner,
//! protocol features, queue count, memory table, and each ring.

use crate::conn::{self, Conn, ConnError};
use crate::mem::{GuestMem, PAGE};
use crate::proto::{self, req};
use crate::ring::{DriverRing, RingLayout};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// How to reach the backend.
pub enum Endpoint {
    /// Connect to a listening backend.
    Connect(PathBuf),
    /// We listen; a backend in client mode connects (once per session).
    Listen(PathBuf, UnixListener),
}

impl Endpoint {
    pub fn new(path: PathBuf, listen: bool) -> Result<Self> {
        if listen {
            let l = conn::bind(&path).with_context(|| format!("bind {}", path.display()))?;
            Ok(Endpoint::Listen(path, l))
        } else {
            Ok(Endpoint::Connect(path))
        }
    }

    /// A new connection to the backend.
    pub fn open(&self, timeout: Duration) -> Result<UnixStream, ConnError> {
        match self {
            Endpoint::Connect(p) => conn::connect(p, timeout),
            Endpoint::Listen(_, l) => conn::accept(l, timeout),
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Endpoint::Listen(p, _) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What to ask for.
#[derive(Clone, Debug)]
pub struct SetupOpts {
    pub timeout: Duration,
    pub mem_mb: usize,
    pub gpa_base: u64,
    pub queue_pairs: u16,
    pub ring_size: u32,
    pub event_idx: bool,
    pub mrg_rxbuf: bool,
    pub offload: bool,
}

impl Default for SetupOpts {
    fn default() -> Self {
        SetupOpts {
            timeout: Duration::from_secs(10),
            mem_mb: 64,
            gpa_base: 0,
            queue_pairs: 1,
            ring_size: 256,
            event_idx: true,
            mrg_rxbuf: true,
            offload: false,
        }
    }
}

/// The outcome of feature negotiation.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Negotiated {
    pub backend_features: u64,
    pub acked_features: u64,
    pub backend_protocol_features: Option<u64>,
    pub acked_protocol_features: Option<u64>,
    /// GET_QUEUE_NUM's answer (only asked when protocol MQ is negotiated).
    pub queue_num: Option<u64>,
    pub reply_ack: bool,
    pub event_idx: bool,
    pub mrg_rxbuf: bool,
    /// HOST_TSO4 + CSUM: we may send TSO frames.
    pub host_tso4: bool,
    /// GUEST_TSO4 + GUEST_CSUM: the backend may give us large frames.
    pub guest_tso4: bool,
    /// VHOST_USER_F_PROTOCOL_FEATURES negotiated: rings start disabled.
    pub protocol_features: bool,
}

impl Negotiated {
    pub fn to_json(&self, queue_pairs: u16) -> serde_json::Value {
        serde_json::json!({
            "backend_features": format!("{:#x}", self.backend_features),
            "acked_features": format!("{:#x}", self.acked_features),
            "acked_feature_names": proto::feature_names(self.acked_features),
            "backend_feature_names": proto::feature_names(self.backend_features),
            "backend_protocol_features": self.backend_protocol_features.map(|v| format!("{v:#x}")),
            "acked_protocol_features": self.acked_protocol_features.map(|v| format!("{v:#x}")),
            "acked_protocol_feature_names": self.acked_protocol_features.map(proto::protocol_feature_names),
            "queue_num": self.queue_num,
            "queue_pairs": queue_pairs,
            "reply_ack": self.reply_ack,
            "event_idx": self.event_idx,
            "mrg_rxbuf": self.mrg_rxbuf,
            "host_tso4": self.host_tso4,
            "guest_tso4": self.guest_tso4,
        })
    }
}

/// Feature negotiation up to and including SET_FEATURES.
pub fn negotiate(conn: &mut Conn, opts: &SetupOpts) -> Result<Negotiated> {
    let mut n = Negotiated {
        backend_features: conn.get_u64(req::GET_FEATURES)?,
        ..Default::default()
    };
    let offered = n.backend_features;
    if offered & proto::F_VERSION_1 == 0 {
        bail!("backend does not offer VIRTIO_F_VERSION_1 (features {offered:#x})");
    }
    conn.request(req::SET_OWNER, &[], &[])?;
    if offered & proto::F_PROTOCOL_FEATURES != 0 {
        n.protocol_features = true;
        let pf = conn.get_u64(req::GET_PROTOCOL_FEATURES)?;
        n.backend_protocol_features = Some(pf);
        // MQ and REPLY_ACK if offered; never CONFIGURE_MEM_SLOTS (we use SET_MEM_TABLE).
        let ack = pf & (proto::PF_MQ | proto::PF_REPLY_ACK);
        conn.request(req::SET_PROTOCOL_FEATURES, &proto::u64_payload(ack), &[])?;
        n.acked_protocol_features = Some(ack);
        n.reply_ack = ack & proto::PF_REPLY_ACK != 0;
        conn.reply_ack = n.reply_ack;
        if ack & proto::PF_MQ != 0 {
            n.queue_num = Some(conn.get_u64(req::GET_QUEUE_NUM)?);
        }
    }
    if opts.queue_pairs > 1 {
        if offered & proto::F_MQ == 0 {
            bail!(
                "--queue-pairs {} but the backend does not offer VIRTIO_NET_F_MQ",
                opts.queue_pairs
            );
        }
        match n.queue_num {
            Some(q) if q >= opts.queue_pairs as u64 => {}
            Some(q) => bail!(
                "--queue-pairs {} but the backend supports {q} queues",
                opts.queue_pairs
            ),
            None => bail!("--queue-pairs needs the MQ protocol feature"),
        }
    }
    let mut want = proto::F_VERSION_1 | proto::F_PROTOCOL_FEATURES;
    if opts.mrg_rxbuf {
        want |= proto::F_MRG_RXBUF;
    }
    if opts.event_idx {
        want |= proto::F_EVENT_IDX;
    }
    if opts.queue_pairs > 1 {
        want |= proto::F_MQ;
    }
    if opts.offload {
        want |= proto::F_CSUM | proto::F_GUEST_CSUM | proto::F_HOST_TSO4 | proto::F_GUEST_TSO4;
    }
    let mut ack = want & offered;
    // Dependencies from the virtio spec: TSO needs the matching checksum feature.
    if ack & proto::F_CSUM == 0 {
        ack &= !proto::F_HOST_TSO4;
    }
    if ack & proto::F_GUEST_CSUM == 0 {
        ack &= !proto::F_GUEST_TSO4;
    }
    conn.request(req::SET_FEATURES, &proto::u64_payload(ack), &[])?;
    n.acked_features = ack;
    n.event_idx = ack & proto::F_EVENT_IDX != 0;
    n.mrg_rxbuf = ack & proto::F_MRG_RXBUF != 0;
    n.host_tso4 = ack & proto::F_HOST_TSO4 != 0;
    n.guest_tso4 = ack & proto::F_GUEST_TSO4 != 0;
    Ok(n)
}

/// SET_MEM_TABLE with the one normal region.
pub fn set_mem_table(conn: &Conn, mem: &GuestMem) -> Result<(), ConnError> {
    conn.request(
        req::SET_MEM_TABLE,
        &proto::mem_table(1, &[mem.region()]),
        &[mem.fd()],
    )
}

/// One ring as set up on the backend.
pub struct Queue {
    pub index: u32,
    pub layout: RingLayout,
    pub kick: EventFd,
    pub call: EventFd,
}

impl Queue {
    pub fn is_rx(&self) -> bool {
        self.index.is_multiple_of(2)
    }
}

/// SET_VRING_NUM, SET_VRING_BASE 0, SET_VRING_ADDR, SET_VRING_CALL, SET_VRING_KICK (call before
/// kick, so the first interrupt cannot be lost); the ring memory is zeroed first.
pub fn setup_ring(
    conn: &Conn,
    mem: &Arc<GuestMem>,
    index: u32,
    layout: RingLayout,
) -> Result<Queue> {
    mem.fill(layout.desc, layout.size, 0);
    let kick = EventFd::new(EFD_NONBLOCK).context("eventfd")?;
    let call = EventFd::new(EFD_NONBLOCK).context("eventfd")?;
    conn.request(
        req::SET_VRING_NUM,
        &proto::vring_state(index, layout.num as u32),
        &[],
    )?;
    conn.request(req::SET_VRING_BASE, &proto::vring_state(index, 0), &[])?;
    conn.request(
        req::SET_VRING_ADDR,
        &proto::vring_addr(
            index,
            0,
            mem.uva(layout.desc),
            mem.uva(layout.used),
            mem.uva(layout.avail),
            0,
        ),
        &[],
    )?;
    conn.request(
        req::SET_VRING_CALL,
        &proto::u64_payload(index as u64),
        &[call.as_raw_fd()],
    )?;
    conn.request(
        req::SET_VRING_KICK,
        &proto::u64_payload(index as u64),
        &[kick.as_raw_fd()],
    )?;
    Ok(Queue {
        index,
        layout,
        kick,
        call,
    })
}

/// SET_VRING_ENABLE (only meaningful with protocol features).
pub fn enable_ring(conn: &Conn, index: u32, on: bool) -> Result<(), ConnError> {
    conn.request(
        req::SET_VRING_ENABLE,
        &proto::vring_state(index, on as u32),
        &[],
    )
}

/// A device that is up: negotiated, memory shared, rings running.
pub struct Device {
    pub conn: Conn,
    pub mem: Arc<GuestMem>,
    pub neg: Negotiated,
    pub queues: Vec<Queue>,
    pub opts: SetupOpts,
}

impl Device {
    /// Connects and brings up 2 * queue_pairs rings in a fresh memfd of `mem_mb` (times
    /// `mem_factor` mapped, only `mem_mb` declared).
    pub fn open(endpoint: &Endpoint, opts: &SetupOpts, mem_factor: usize) -> Result<Self> {
        let stream = endpoint.open(opts.timeout)?;
        Self::open_on(stream, opts, mem_factor)
    }

    pub fn open_on(stream: UnixStream, opts: &SetupOpts, mem_factor: usize) -> Result<Self> {
        let mut conn = Conn::new(stream, opts.timeout);
        let neg = negotiate(&mut conn, opts)?;
        let region = opts
            .mem_mb
            .checked_mul(1 << 20)
            .context("--mem-mb too large")?;
        let mem = Arc::new(GuestMem::new(region, region * mem_factor, opts.gpa_base)?);
        if mem_factor > 1 {
            mem.fill_canary();
        }
        set_mem_table(&conn, &mem)?;
        let mut queues = Vec::new();
        for i in 0..(2 * opts.queue_pairs as u32) {
            let off = mem.alloc(RingLayout::reserve(opts.ring_size)?, PAGE)?;
            let layout = RingLayout::new(opts.ring_size, off)?;
            queues.push(setup_ring(&conn, &mem, i, layout)?);
        }
        if neg.protocol_features {
            for q in &queues {
                enable_ring(&conn, q.index, true)?;
            }
        }
        // Without REPLY_ACK nothing tells us the backend has processed the setup; a request
        // with a reply does (messages are handled in order), so kicks cannot overtake it.
        if !neg.reply_ack {
            conn.get_u64(req::GET_FEATURES)?;
        }
        Ok(Device {
            conn,
            mem,
            neg,
            queues,
            opts: opts.clone(),
        })
    }

    /// A driver-side handle for queue `i` (the ring memory was zeroed at setup).
    pub fn driver_ring(&self, i: usize) -> DriverRing {
        DriverRing::new(self.mem.clone(), self.queues[i].layout, self.neg.event_idx)
    }

    /// Stops all rings (GET_VRING_BASE), as a VMM does before disconnecting. Errors are
    /// returned so callers can report a backend that already went away.
    pub fn stop(&self) -> Result<Vec<u32>, ConnError> {
        let mut bases = Vec::new();
        for q in &self.queues {
            bases.push(self.conn.get_vring_base(q.index)?);
        }
        Ok(bases)
    }
}
