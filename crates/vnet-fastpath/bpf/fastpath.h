/* The layouts shared by the BPF programs (fastpath.bpf.c) and the loader (src/layout.rs).
 * Every struct here has a Rust twin of the same size and field offsets; src/layout.rs checks
 * the sizes in its tests. Integers are host order unless named *_be (network order). */
#ifndef VNET_FASTPATH_H
#define VNET_FASTPATH_H

/* Port flags. */
#define PORT_ANY_SOURCE   1u  /* the guest may send with any source MAC */
#define PORT_DELIVER_PEER 2u  /* deliver with bpf_redirect_peer (veth whose peer is in another netns) */
#define PORT_RATE         4u  /* the port has a token bucket in `rates` */

/* Link flags. */
#define LINK_RATE         4u  /* the link has a token bucket in `rates` (what arrives from it) */

/* Forwarding actions: kind in the top byte, port or link slot below. */
#define ACT_NONE  0u          /* no rule of this rank: look at the next rank */
#define ACT_SLOW  1u          /* only vnetd can decide: punt */
#define ACT_PORT  2u          /* deliver to the fast-path port in the slot */
#define ACT_LINK  3u          /* encapsulate to the plain udp link in the slot */
#define ACT_KIND(a) ((a) >> 24)
#define ACT_SLOT(a) ((a) & 0xffffffu)

/* Forwarding key kinds, in rank order (see src/compile.rs). */
#define FWD_SRC_DST 0u        /* (source MAC, destination MAC) */
#define FWD_DST     1u        /* (any, destination MAC) */
#define FWD_SRC     2u        /* (source MAC, any) */
#define FWD_ANY     3u        /* (any, any) */

/* Forwarding entry flags. */
#define FWDF_CHECK_SRC 1u     /* exact-source entries exist at this destination rank: look first */

/* Counter indexes (u64 each) in `counters`, per port slot or per (max_ports + link slot). */
enum vnet_counter {
	C_RX_FRAMES,      /* frames taken from the port / link by the kernel path */
	C_RX_BYTES,
	C_TX_FRAMES,      /* frames the kernel path delivered to the port / sent on the link */
	C_TX_BYTES,
	C_PUNT_FRAMES,    /* frames handed to vnetd (punt TAP for a port, the stack for a link) */
	C_PUNT_BYTES,
	C_SLOW_TX_FRAMES, /* frames vnetd wrote to the punt TAP, delivered to the guest */
	C_SLOW_TX_BYTES,
	C_DROP_TRUNCATED,
	C_DROP_OVERSIZE,
	C_DROP_SPOOFED_SRC,
	C_DROP_RATE_LIMITED,
	C_NEIGH_MISS,     /* outer next hop unresolved: punted so vnetd's send resolves it */
	C_ENCAP_FAIL,     /* the kernel refused to add or remove the outer headers: punted */
	C_GRO_PASSED,     /* a GRO/GSO aggregate of several UDP datagrams: passed to the stack */
	C_BAD_LENGTH,     /* outer IPv4 / UDP lengths disagree with the datagram: passed to the stack */
	C_COUNT           /* a power of two: indexes are masked with C_COUNT - 1 */
};

/* Global counter indexes in `global`. */
enum vnet_global {
	G_UNKNOWN_PORT,   /* a program ran on a device with no port / punt entry */
	G_NOT_VXLAN,      /* underlay traffic that is not VXLAN to our port: passed */
	G_UNKNOWN_LINK,   /* VXLAN from an unknown (source IP, VNI): passed (vnetd counts it) */
	G_FIB_FAIL,       /* no route to a link's remote address: punted */
	G_VNI_MISMATCH,   /* a table decision into another VNI (a bug): punted / passed, not followed */
	G_SPARE5,
	G_SPARE6,
	G_SPARE7,
	G_COUNT           /* a power of two: indexes are masked with G_COUNT - 1 */
};

/* Load-time settings (.rodata). */
struct fp_config {
	__u64 outer_cache_ns; /* 0: bpf_fib_lookup for every packet; else cache outer headers */
	__u32 max_ports;      /* link slot n uses counters/rates index max_ports + n */
	__u16 vxlan_port_be;  /* the VXLAN UDP port that underlay_ingress decapsulates */
	__u16 pad;
};

struct port_val {
	__u32 slot;          /* index of the port's counters, rate bucket and `port_slots` entry */
	__u32 vni;
	__u32 mtu;
	__u32 flags;         /* PORT_* */
	__u32 ifindex;       /* the port's host-side netdev */
	__u32 punt_ifindex;  /* vnetd's punt TAP for this port */
	__u8 mac[6];         /* the guest's MAC */
	__u16 pad;
};

struct link_key {
	__u32 remote_be;     /* remote IPv4 */
	__u32 vni;
};

struct link_val {
	__u32 slot;
	__u32 vni;
	__u32 remote_be;
	__u32 local_be;      /* our address on the underlay (outer source) */
	__u16 dport_be;      /* the remote's VXLAN UDP port */
	__u16 flags;         /* LINK_* */
	__u32 reserved;
	__u32 via_ifindex;   /* variant (a): a collect-metadata VXLAN device; 0 = encapsulate here */
	__u32 pad;
};

/* ONCache-style cached outer header state, per CPU, filled by the program from
 * bpf_fib_lookup and expired after `outer_cache_ns`, or as soon as `outer_epoch` moves on. */
struct link_cache {
	__u64 expires_ns;
	__u32 ifindex;       /* egress device */
	__u32 mtu;           /* its MTU */
	__u8 smac[6];
	__u8 dmac[6];
	__u32 epoch;         /* the `outer_epoch` read before the lookup that filled it */
};

struct fwd_key {
	__u32 vni;
	__u16 kind;          /* FWD_* */
	__u8 src[6];         /* zero unless kind uses it */
	__u8 dst[6];
	__u16 pad;
};

struct fwd_val {
	__u32 action;        /* ACT_* << 24 | slot */
	__u32 flags;         /* FWDF_* */
};

/* Token bucket, as vnet_core::TokenBucket: tokens in units of 1/8e9 byte, a frame passes while
 * any token is left and takes its whole length (so a 64 KB GSO frame is never starved). */
struct rate_val {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 rate_bps;      /* bits per second */
	__s64 cap;           /* burst in units (burst_bytes * 8e9) */
	__u64 fill_ns;       /* time to fill an empty bucket: cap / rate_bps */
	__s64 tokens;
	__u64 last_ns;
};

struct matrix_key {
	__u32 vni;
	__u8 src[6];
	__u8 dst[6];
};

struct matrix_val {
	__u64 frames;
	__u64 bytes;
};

#endif
