// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* vnet's kernel fast path: tcx programs that forward what the compiled forwarding table can
 * decide exactly (known unicast between fast-path ports and plain udp links) and hand
 * everything else to vnetd, the slow path, through a punt TAP (ports) or the stack (underlay).
 *
 *   port_ingress      tcx ingress of a port's host-side netdev: what the guest sends
 *   underlay_ingress  tcx ingress of an underlay netdev: VXLAN for local fast-path ports,
 *                     directly or through a relay, and on a relay what it forwards
 *   punt_ingress      tcx ingress of a port's punt TAP: what vnetd sends to the guest
 *   tunnel_ingress    tcx ingress of a collect-metadata VXLAN device (variant (a), measured)
 *
 * The layouts of the maps' keys and values, the settings, flags and counter indexes are in
 * fastpath_layout.h, which build.rs writes from src/layout_def.rs (their one definition; the
 * Rust side is src/layout.rs). The loader is src/load.rs and its neighbours. GPL-compatible
 * licence because bpf_probe_read_kernel (the GRO check) needs it. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/udp.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "fastpath_layout.h"

/* An action word: ACT_* kind in the top byte, port or link slot below. */
#define ACT_KIND(a) ((a) >> ACT_SHIFT)
#define ACT_SLOT(a) ((a) & ACT_SLOT_MASK)

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* tcx verdicts (linux/bpf.h of 6.6+; Debian 12's headers are 6.1). */
#define TCX_NEXT (-1)
#define TCX_PASS 0
#define TCX_DROP 2
#define TCX_REDIRECT 7

/* bpf_skb_adjust_room flags of 6.3+ (not in 6.1's header). */
#define ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)
#define ADJ_ROOM_ENCAP_L2(len) (((__u64)(len) & 0xff) << 56)

#define VXLAN_HLEN 8
#define OUTER_LEN (sizeof(struct iphdr) + sizeof(struct udphdr) + VXLAN_HLEN) /* 36 */
#define ENCAP_LEN (OUTER_LEN + ETH_HLEN)                                        /* 50 */
#define SKB_GSO_UDP_TUNNEL (1u << 10)
#define SKB_GSO_UDP_TUNNEL_CSUM (1u << 11)

/* Set by the loader before load (FastPathConfig), through the skeleton's typed .rodata. */
const volatile struct fp_config cfg = {
	.outer_cache_ns = 1000000000ULL,
	.max_ports = 256,
	.vxlan_port_be = bpf_htons(4789),
};
#define cfg_outer_cache_ns cfg.outer_cache_ns
#define cfg_max_ports cfg.max_ports
#define cfg_vxlan_port_be cfg.vxlan_port_be

/* A map definition, as libbpf reads it from BTF. Sizes are placeholders: the loader sets every
 * max_entries from FastPathConfig. */
#define FP_MAP(kind, entries, key_type, value_type)                                            \
	struct {                                                                               \
		__uint(type, kind);                                                            \
		__uint(max_entries, entries);                                                  \
		__type(key, key_type);                                                         \
		__type(value, value_type);                                                     \
	}

FP_MAP(BPF_MAP_TYPE_HASH, 256, __u32, struct port_val) ports SEC(".maps"); /* by ifindex */
FP_MAP(BPF_MAP_TYPE_ARRAY, 256, __u32, struct port_val) port_slots SEC(".maps"); /* by slot */
/* punt TAP ifindex -> port slot */
FP_MAP(BPF_MAP_TYPE_HASH, 256, __u32, __u32) punts SEC(".maps");
FP_MAP(BPF_MAP_TYPE_HASH, 256, struct link_key, __u32) links_rx SEC(".maps"); /* -> link slot */
FP_MAP(BPF_MAP_TYPE_ARRAY, 256, __u32, struct link_val) links SEC(".maps"); /* by link slot */
/* Relayed links by (relay endpoint, VNI, peer's tag) -> link slot. */
FP_MAP(BPF_MAP_TYPE_HASH, 256, struct relay_rx_key, __u32) relay_rx SEC(".maps");
/* A relay's pairs that vnetd admitted: (source member's endpoint, destination's tag). */
FP_MAP(BPF_MAP_TYPE_HASH, 1024, struct relay_fwd_key, struct relay_val) relay_fwd SEC(".maps");
/* by link slot */
FP_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, 256, __u32, struct link_cache) link_cache SEC(".maps");
/* Bumped by vnetd when the underlay's routes, neighbours, links or addresses change: a cached
 * outer next hop filled under an older value is not used again. */
FP_MAP(BPF_MAP_TYPE_ARRAY, 1, __u32, __u32) outer_epoch SEC(".maps");
FP_MAP(BPF_MAP_TYPE_HASH, 4096, struct fwd_key, struct fwd_val) fwd SEC(".maps");
/* by port slot, or max_ports + link slot */
FP_MAP(BPF_MAP_TYPE_ARRAY, 512, __u32, struct rate_val) rates SEC(".maps");
/* by port slot, or max_ports + link slot */
FP_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, 512, __u32, __u64[C_COUNT]) counters SEC(".maps");
FP_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, 1, __u32, __u64[G_COUNT]) global SEC(".maps");
/* The traffic matrix: per CPU (no CPU writes another's counts: nothing shared on the hot
 * path), one entry per (VNI, source, destination) pair, allocated when the pair first appears
 * (BPF_F_NO_PREALLOC). Preallocated, a per-CPU map costs one per-CPU allocation per entry at
 * creation, all under the kernel's one per-CPU allocator lock (65,536 entries: tens of ms per
 * vnetd start, seconds when many start at once). Not an LRU: an evicted pair would take its
 * counts with it unseen. When it is full, the frames of new pairs are counted
 * (G_MATRIX_FULL), as vnet_core::TrafficMatrix counts its overflow. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct matrix_key);
	__type(value, struct matrix_val);
} matrix SEC(".maps");

/* CO-RE views of the kernel's skb, for the GSO type (not in __sk_buff). */
struct sk_buff___fp {
	unsigned char *head;
	unsigned int end;
} __attribute__((preserve_access_index));

struct skb_shared_info___fp {
	unsigned int gso_type;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

static __always_inline __u64 *counters_of(__u32 idx)
{
	return bpf_map_lookup_elem(&counters, &idx);
}

static __always_inline void count(__u64 *c, int what, __u64 n)
{
	if (c)
		c[what & (C_COUNT - 1)] += n;
}

static __always_inline void count_global(int what)
{
	__u32 zero = 0;
	__u64 *g = bpf_map_lookup_elem(&global, &zero);

	if (g)
		g[what & (G_COUNT - 1)] += 1;
}

static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	/* Bytewise: the MACs sit at odd offsets on the stack and in packets. */
	return ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) | (a[4] ^ b[4]) |
		(a[5] ^ b[5])) == 0;
}

/* Whether two relay tags are the same (bytewise: no memcmp in BPF). */
static __always_inline int tag_eq(const __u8 *a, const __u8 *b)
{
	__u8 d = 0;

#pragma unroll
	for (int i = 0; i < 8; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

static __always_inline void mac_copy(__u8 *d, const __u8 *s)
{
	__builtin_memcpy(d, s, 6);
}

/* The GSO type of the skb (0 for a non-GSO skb, or when it cannot be read). */
static __always_inline __u32 gso_type_of(struct __sk_buff *ctx)
{
	struct sk_buff___fp *skb = bpf_cast_to_kern_ctx(ctx);
	struct skb_shared_info___fp *shinfo;
	__u32 type = 0;

	if (!ctx->gso_size)
		return 0;
	shinfo = (void *)(BPF_CORE_READ(skb, head) + BPF_CORE_READ(skb, end));
	bpf_probe_read_kernel(&type, sizeof(type), &shinfo->gso_type);
	return type;
}

/* Whether the token bucket `r` (in a map value) lets `len` bytes pass now; takes them. */
static __always_inline int bucket_take(struct rate_val *r, __u64 len)
{
	__u64 now = bpf_ktime_get_ns();
	int ok;

	bpf_spin_lock(&r->lock);
	if (now > r->last_ns) {
		__u64 elapsed = now - r->last_ns;

		if (elapsed >= r->fill_ns)
			r->tokens = r->cap;
		else {
			__s64 t = r->tokens + (__s64)(elapsed * r->rate_bps);

			r->tokens = t > r->cap ? r->cap : t;
		}
		r->last_ns = now;
	}
	ok = r->tokens > 0;
	if (ok)
		r->tokens -= (__s64)(len * 8000000000ULL);
	bpf_spin_unlock(&r->lock);
	return ok;
}

/* The token bucket of slot `idx`: whether a frame of `len` bytes may pass now. */
static __always_inline int rate_admit(__u32 idx, __u64 len)
{
	struct rate_val *r = bpf_map_lookup_elem(&rates, &idx);

	return r ? bucket_take(r, len) : 1;
}

/* Counts a frame of (vni, src, dst) in this CPU's traffic matrix. A pair that is not there
 * yet is inserted (this CPU's value set, the others' zero), and if another CPU inserted it
 * first (EEXIST) added to. A frame whose pair finds no room (the map is full, or the kernel
 * had no memory for the entry) is counted in G_MATRIX_FULL, so the readout says what it
 * lacks. */
static __always_inline void matrix_count(__u32 vni, const __u8 *src, const __u8 *dst, __u64 len)
{
	struct matrix_key k = { .vni = vni };
	struct matrix_val *v, nv = { .frames = 1, .bytes = len };

	mac_copy(k.src, src);
	mac_copy(k.dst, dst);
	v = bpf_map_lookup_elem(&matrix, &k);
	if (!v) {
		long rc = bpf_map_update_elem(&matrix, &k, &nv, BPF_NOEXIST);

		if (!rc)
			return;
		v = rc == -17 /* EEXIST */ ? bpf_map_lookup_elem(&matrix, &k) : 0;
		if (!v) {
			count_global(G_MATRIX_FULL);
			return;
		}
	}
	v->frames += 1;
	v->bytes += len;
}

/* Counts a frame of `len` bytes forwarded from counters `from` to counters `to`, and in the
 * traffic matrix. */
static __always_inline void count_forwarded(__u64 *from, __u64 *to, __u32 vni,
					    const struct ethhdr *eth, __u64 len)
{
	count(from, C_RX_FRAMES, 1);
	count(from, C_RX_BYTES, len);
	count(to, C_TX_FRAMES, 1);
	count(to, C_TX_BYTES, len);
	matrix_count(vni, eth->h_source, eth->h_dest, len);
}

/* The entry of key `k` narrowed to source `src` (as `kind`), when `v` says such entries exist
 * for it; NULL otherwise. */
static __always_inline struct fwd_val *fwd_by_src(const struct fwd_val *v, struct fwd_key *k,
						  __u16 kind, const __u8 *src)
{
	if (!(v->flags & FWDF_CHECK_SRC))
		return 0;
	k->kind = kind;
	mac_copy(k->src, src);
	return bpf_map_lookup_elem(&fwd, k);
}

/* The compiled forwarding decision for (vni, src, dst): ACT_* << 24 | slot; ACT_NONE when no
 * rule matches. Ranks, as vnet_core::RouteTable: (src,dst) > (any,dst) > (src,any) > (any,any). */
static __always_inline __u32 fwd_decide(__u32 vni, const __u8 *src, const __u8 *dst)
{
	struct fwd_key k = { .vni = vni, .kind = FWD_DST };
	struct fwd_val *v, *s;

	mac_copy(k.dst, dst);
	v = bpf_map_lookup_elem(&fwd, &k);
	if (v) {
		s = fwd_by_src(v, &k, FWD_SRC_DST, src);
		if (s)
			return s->action;
		if (ACT_KIND(v->action) != ACT_NONE)
			return v->action;
	}
	__builtin_memset(&k, 0, sizeof(k));
	k.vni = vni;
	k.kind = FWD_ANY;
	v = bpf_map_lookup_elem(&fwd, &k);
	if (!v)
		return ACT_NONE << 24;
	s = fwd_by_src(v, &k, FWD_SRC, src);
	return s ? s->action : v->action;
}

/* Header lengths of a GSO frame's L3 + L4 (for the gso_size check), or 0 if unknown. */
static __always_inline __u32 l3l4_len(struct __sk_buff *skb, __u16 proto_be)
{
	__u8 b[2];

	if (proto_be == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		__u32 ihl;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
			return 0;
		ihl = ip.ihl * 4;
		if (ip.protocol == IPPROTO_TCP) {
			if (bpf_skb_load_bytes(skb, ETH_HLEN + (ihl & 0x3f) + 12, b, 1))
				return 0;
			return ihl + (b[0] >> 4) * 4;
		}
		return ihl + sizeof(struct udphdr);
	}
	if (proto_be == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)))
			return 0;
		if (ip6.nexthdr == IPPROTO_TCP) {
			if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip6) + 12, b, 1))
				return 0;
			return sizeof(ip6) + (b[0] >> 4) * 4;
		}
		return sizeof(ip6) + sizeof(struct udphdr);
	}
	return 0;
}

static __always_inline __u16 ip_csum(const void *ip)
{
	const __u16 *p = ip;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < (int)sizeof(struct iphdr) / 2; i++)
		sum += p[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* The fast-path port in `slot` if a frame of VNI `vni` may go to it: never into another VNI
 * (counted), as isolation does not rest on compile() alone. NULL otherwise. */
static __always_inline struct port_val *port_of_vni(__u32 slot, __u32 vni)
{
	struct port_val *to = bpf_map_lookup_elem(&port_slots, &slot);

	if (!to || !to->ifindex)
		return 0;
	if (to->vni != vni) {
		count_global(G_VNI_MISMATCH);
		return 0;
	}
	return to;
}

/* Deliver a frame to a fast-path port's guest. */
static __always_inline int deliver(const struct port_val *to, int ip_frame)
{
	/* redirect_peer keeps skb->protocol as it is, so only IP frames (whose protocol the
	 * decapsulation set right) take it; others go through the veth, which parses them again. */
	if ((to->flags & PORT_DELIVER_PEER) && ip_frame)
		return bpf_redirect_peer(to->ifindex, 0);
	return bpf_redirect(to->ifindex, 0);
}

/* Fills `c` with the outer next hop of `l`: from the per-CPU cache, or bpf_fib_lookup.
 * Returns 0, or the counter to count the punt with. */
static __always_inline int outer_hop(struct __sk_buff *skb, const struct link_val *l, __u32 lslot,
				     struct link_cache *out)
{
	struct link_cache *c = 0;
	struct bpf_fib_lookup fib = {};
	__u64 now = 0;
	__u32 zero = 0, epoch = 0;
	long rc;

	if (cfg_outer_cache_ns) {
		__u32 *e = bpf_map_lookup_elem(&outer_epoch, &zero);

		/* Read before the lookup: an entry filled from a route or neighbour that changed
		 * after this read carries the old epoch, which vnetd's bump (after the change's
		 * netlink event) has already left behind. */
		if (e)
			epoch = *(volatile __u32 *)e;
		c = bpf_map_lookup_elem(&link_cache, &lslot);
		now = bpf_ktime_get_ns();
		if (c && c->expires_ns > now && c->epoch == epoch) {
			*out = *c;
			return 0;
		}
	}
	/* Looked up as if the port's device forwarded the packet (input mode: the loader turns
	 * on IPv4 forwarding on the port's device, which bpf_fib_lookup requires of the device it
	 * is given; port_ingress takes every frame of it, so the stack never routes any). */
	fib.family = 2; /* AF_INET */
	fib.ipv4_src = l->local_be;
	fib.ipv4_dst = l->remote_be;
	fib.ifindex = skb->ifindex;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return C_NEIGH_MISS;
	if (rc != BPF_FIB_LKUP_RET_SUCCESS) {
		count_global(G_FIB_FAIL);
		return C_ENCAP_FAIL;
	}
	out->ifindex = fib.ifindex;
	out->mtu = fib.mtu_result;
	mac_copy(out->smac, fib.smac);
	mac_copy(out->dmac, fib.dmac);
	out->expires_ns = now + cfg_outer_cache_ns;
	out->epoch = epoch;
	if (c)
		*c = *out;
	return 0;
}

/* The outer headers of a VXLAN datagram on the wire. */
struct vxlan_outer {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	__u32 vx_flags;
	__u32 vx_vni;
} __attribute__((packed));

/* What follows the UDP header of a relay datagram whose payload is VXLAN. */
struct relay_vxlan {
	__u32 word; /* RELAY_WORD */
	__u8 tag[8];
	__u32 vx_flags;
	__u32 vx_vni;
} __attribute__((packed));

/* Everything a relayed link's datagram carries in front of the guest's frame. */
struct relay_outer {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	struct relay_vxlan r;
	struct ethhdr inner;
} __attribute__((packed));

/* Encapsulates the frame in VXLAN to link `l` and sends it out of the underlay. Returns the
 * tc verdict, or -counter to punt with. */
static __always_inline int encap_to_link(struct __sk_buff *skb, const struct link_val *l, __u32 lslot,
					 const struct port_val *from, __u16 proto_be)
{
	struct {
		struct vxlan_outer o;
		struct ethhdr inner;
	} __attribute__((packed)) h;
	struct link_cache hop;
	__u32 len = skb->len, hash, tot, mtu;
	/* A relayed link's datagrams carry the relay header too. */
	__u32 extra = (l->flags & LINK_RELAYED) ? RELAY_HLEN : 0;
	__u64 flags;
	int rc;

	if (proto_be != bpf_htons(ETH_P_IP) && proto_be != bpf_htons(ETH_P_IPV6))
		return -C_ENCAP_FAIL; /* bpf_skb_adjust_room encapsulates IP only */
	if (bpf_skb_load_bytes(skb, 0, &h.inner, sizeof(h.inner)))
		return -C_ENCAP_FAIL;

	if (l->via_ifindex) {
		/* Variant (a): the kernel's collect-metadata VXLAN device does the rest. */
		struct bpf_tunnel_key key = {};

		key.tunnel_id = l->vni;
		key.remote_ipv4 = bpf_ntohl(l->remote_be);
		key.tunnel_ttl = 64;
		if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), BPF_F_ZERO_CSUM_TX))
			return -C_ENCAP_FAIL;
		return bpf_redirect(l->via_ifindex, 0);
	}

	rc = outer_hop(skb, l, lslot, &hop);
	if (rc)
		return -rc;
	/* A frame the path cannot carry whole goes to vnetd: it lets IP fragment it (a plain
	 * link) or tells the sender (a reach link, whose datagrams carry DF). The path's MTU is the
	 * route's, or the smaller one vnetd learned for a reach link; a TSO frame's segments are
	 * what must fit (the guest's TCP lowers them once told). */
	mtu = hop.mtu;
	if (l->path_mtu && (!mtu || l->path_mtu < mtu))
		mtu = l->path_mtu;
	if (mtu) {
		__u32 seg = 0;

		if (skb->gso_size) {
			__u32 hdrs = l3l4_len(skb, proto_be);

			seg = hdrs ? skb->gso_size + hdrs + ETH_HLEN : from->mtu + ETH_HLEN;
		}
		if ((skb->gso_size ? seg + OUTER_LEN : len + OUTER_LEN) + extra > mtu)
			return -C_ENCAP_FAIL;
	}

	hash = bpf_get_hash_recalc(skb);
	/* Source port from the flow hash in 32768..60999, as the kernel's VXLAN picks it, unless
	 * the link's is fixed (a reach link: a NAT keeps one mapping, for the socket's port). */
	hash ^= hash << 16;

	tot = len + OUTER_LEN + extra;
	mac_copy(h.o.eth.h_dest, hop.dmac);
	mac_copy(h.o.eth.h_source, hop.smac);
	h.o.eth.h_proto = bpf_htons(ETH_P_IP);
	h.o.ip.version = 4;
	h.o.ip.ihl = 5;
	h.o.ip.tos = 0;
	/* A GSO skb's lengths are rewritten per segment when it is cut; cap the placeholder. */
	h.o.ip.tot_len = bpf_htons(tot > 0xffff ? 0xffff : tot);
	h.o.ip.id = (__u16)bpf_get_prandom_u32();
	/* DF on a reach link: its path MTU is learned, never left to fragments a NAT or a
	 * firewall may drop. */
	h.o.ip.frag_off = l->sport_be ? bpf_htons(0x4000) : 0;
	h.o.ip.ttl = 64;
	h.o.ip.protocol = IPPROTO_UDP;
	h.o.ip.check = 0;
	h.o.ip.saddr = l->local_be;
	h.o.ip.daddr = l->remote_be;
	h.o.ip.check = ip_csum(&h.o.ip);
	h.o.udp.source = l->sport_be ? l->sport_be :
				       bpf_htons(32768 + (__u16)(((__u64)hash * (60999 - 32768)) >> 32));
	h.o.udp.dest = l->dport_be;
	tot -= sizeof(struct iphdr);
	h.o.udp.len = bpf_htons(tot > 0xffff ? 0xffff : tot);
	h.o.udp.check = 0;
	h.o.vx_flags = bpf_htonl(0x08000000);
	h.o.vx_vni = bpf_htonl(l->vni << 8);

	flags = BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 |
		BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
		ADJ_ROOM_ENCAP_L2(ETH_HLEN);
	if (extra) {
		/* The relay header between UDP and VXLAN: the kernel's UDP tunnel GSO copies
		 * everything from the outer UDP header to the inner MAC header into each segment. */
		struct relay_outer r;

		__builtin_memcpy(&r, &h.o, sizeof(struct ethhdr) + sizeof(struct iphdr) +
						   sizeof(struct udphdr));
		r.r.word = bpf_htonl(RELAY_WORD);
		__builtin_memcpy(r.r.tag, l->relay_tag, sizeof(r.r.tag));
		r.r.vx_flags = h.o.vx_flags;
		r.r.vx_vni = h.o.vx_vni;
		r.inner = h.inner;
		if (bpf_skb_adjust_room(skb, ENCAP_LEN + RELAY_HLEN, BPF_ADJ_ROOM_MAC, flags))
			return -C_ENCAP_FAIL;
		if (bpf_skb_store_bytes(skb, 0, &r, sizeof(r), 0))
			return TCX_DROP;
		return bpf_redirect(hop.ifindex, 0);
	}
	if (bpf_skb_adjust_room(skb, ENCAP_LEN, BPF_ADJ_ROOM_MAC, flags))
		return -C_ENCAP_FAIL;
	if (bpf_skb_store_bytes(skb, 0, &h, sizeof(h), 0))
		return TCX_DROP; /* cannot happen after a successful grow; never send half a header */
	return bpf_redirect(hop.ifindex, 0);
}

SEC("tcx/ingress")
int port_ingress(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct port_val *p = bpf_map_lookup_elem(&ports, &ifindex);
	struct ethhdr eth;
	__u64 *pc;
	__u32 len = skb->len, act, slot;
	__u32 limit;
	int vlan, rc;

	if (!p) {
		count_global(G_UNKNOWN_PORT);
		return TCX_NEXT;
	}
	pc = counters_of(p->slot);
	if (len < ETH_HLEN || bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth))) {
		count(pc, C_DROP_TRUNCATED, 1);
		return TCX_DROP;
	}
	vlan = skb->vlan_present || eth.h_proto == bpf_htons(ETH_P_8021Q) ||
	       eth.h_proto == bpf_htons(ETH_P_8021AD);
	limit = p->mtu + ETH_HLEN + (vlan ? 4 : 0);
	if (skb->gso_size) {
		__u32 hdrs = l3l4_len(skb, eth.h_proto);

		if (skb->gso_size + (hdrs ? hdrs : sizeof(struct iphdr)) > p->mtu) {
			count(pc, C_DROP_OVERSIZE, 1);
			return TCX_DROP;
		}
	} else if (len > limit) {
		count(pc, C_DROP_OVERSIZE, 1);
		return TCX_DROP;
	}
	if (!(p->flags & PORT_ANY_SOURCE) && !mac_eq(eth.h_source, p->mac)) {
		count(pc, C_DROP_SPOOFED_SRC, 1);
		return TCX_DROP;
	}
	if ((p->flags & PORT_RATE) && !rate_admit(p->slot, len)) {
		count(pc, C_DROP_RATE_LIMITED, 1);
		return TCX_DROP;
	}
	if (vlan || (eth.h_dest[0] & 1))
		goto punt;
	act = fwd_decide(p->vni, eth.h_source, eth.h_dest);
	slot = ACT_SLOT(act);
	switch (ACT_KIND(act)) {
	case ACT_PORT: {
		struct port_val *to;

		if (slot == p->slot)
			goto punt; /* decide() drops this; vnetd will too */
		to = port_of_vni(slot, p->vni);
		if (!to)
			goto punt;
		count_forwarded(pc, counters_of(slot), p->vni, &eth, len);
		return deliver(to, 1);
	}
	case ACT_LINK: {
		struct link_val *l = bpf_map_lookup_elem(&links, &slot);

		if (!l || !l->remote_be || (l->flags & LINK_PUNT))
			goto punt; /* vnetd sends it (no path known yet, or a TCP tunnel's) */
		if (l->vni != p->vni) {
			count_global(G_VNI_MISMATCH);
			goto punt;
		}
		rc = encap_to_link(skb, l, slot, p, eth.h_proto);
		if (rc < 0) {
			count(pc, -rc, 1);
			goto punt;
		}
		count_forwarded(pc, counters_of(cfg_max_ports + slot), p->vni, &eth, len);
		return rc;
	}
	default:
		break;
	}
punt:
	count(pc, C_PUNT_FRAMES, 1);
	count(pc, C_PUNT_BYTES, len);
	if (!p->punt_ifindex)
		return TCX_DROP;
	return bpf_redirect(p->punt_ifindex, 0);
}

/* Delivers a decapsulated frame arriving from link `l` if the table sends it to a local
 * fast-path port; returns TCX_NEXT for anything vnetd must see. `off` is where the inner
 * Ethernet header starts, `decap` how many bytes of outer headers after the outer Ethernet
 * header are still in the packet (0: none). The caller has charged the link's rate. */
static __always_inline int from_link(struct __sk_buff *skb, __u32 lslot, const struct link_val *l,
				     __u32 off, __u32 decap)
{
	struct ethhdr in;
	struct port_val *to;
	__u64 *lc;
	__u32 act, slot, ilen = skb->len - off;
	int ip;

	if (skb->len < off + ETH_HLEN || bpf_skb_load_bytes(skb, off, &in, sizeof(in)))
		return TCX_NEXT; /* vnetd counts it */
	if (in.h_dest[0] & 1 || in.h_proto == bpf_htons(ETH_P_8021Q) ||
	    in.h_proto == bpf_htons(ETH_P_8021AD))
		return TCX_NEXT;
	act = fwd_decide(l->vni, in.h_source, in.h_dest);
	if (ACT_KIND(act) != ACT_PORT)
		return TCX_NEXT;
	slot = ACT_SLOT(act);
	to = port_of_vni(slot, l->vni);
	if (!to)
		return TCX_NEXT;
	if (!skb->gso_size && ilen > to->mtu + ETH_HLEN)
		return TCX_NEXT; /* vnetd drops it as oversize */
	lc = counters_of(cfg_max_ports + lslot);
	ip = in.h_proto == bpf_htons(ETH_P_IP) || in.h_proto == bpf_htons(ETH_P_IPV6);
	if (decap) {
		__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;

		if (in.h_proto == bpf_htons(ETH_P_IPV6))
			flags |= ADJ_ROOM_DECAP_L3_IPV6;
		if (bpf_skb_adjust_room(skb, -(__s32)decap, BPF_ADJ_ROOM_MAC, flags)) {
			count(lc, C_ENCAP_FAIL, 1);
			return TCX_NEXT;
		}
		if (bpf_skb_store_bytes(skb, 0, &in, sizeof(in), 0))
			return TCX_DROP;
	}
	count_forwarded(lc, counters_of(slot), l->vni, &in, ilen);
	return deliver(to, ip);
}

/* Whether link `lslot` may take `len` more inner bytes now (its rate); counts the drop. */
static __always_inline int link_admit(__u32 lslot, const struct link_val *l, __s64 len)
{
	if (!(l->flags & LINK_RATE) || rate_admit(cfg_max_ports + lslot, len > 0 ? len : 0))
		return 1;
	count(counters_of(cfg_max_ports + lslot), C_DROP_RATE_LIMITED, 1);
	return 0;
}

/* The UDP payload bytes of a datagram, or about those of the datagrams a GSO skb becomes: each
 * segment beyond the first counted 34 bytes more (the relay, VXLAN and inner Ethernet headers
 * a tunnel aggregate's segments repeat; not their inner IP and TCP headers). */
static __always_inline __u64 payload_bytes(struct __sk_buff *skb, __u32 ihl)
{
	__u64 segs = skb->gso_segs > 1 ? skb->gso_segs : 1;
	__u64 hdrs = ETH_HLEN + ihl + sizeof(struct udphdr);

	if (skb->len <= hdrs)
		return 0;
	return skb->len - hdrs + (segs - 1) * (RELAY_HLEN + VXLAN_HLEN + ETH_HLEN);
}

#define UDP_CSUM_OFF (ETH_HLEN + sizeof(struct iphdr) + __builtin_offsetof(struct udphdr, check))

/* A relay forwards a datagram of a pair vnetd admitted (`relay_fwd`): from the source
 * member's endpoint to the destination member's binding, from this host's address and VXLAN
 * port, the destination's tag replaced by the source's; one datagram out per datagram in, the
 * same size, within the pair's budget. The payload is not read (an encrypted link stays end
 * to end). Over the budget: dropped and counted, as vnetd drops (a datagram passed on instead
 * could be a tunnel GSO aggregate, which vnetd's socket cannot take apart). TCX_NEXT: not
 * such a pair here, or not a plain datagram to this host (vnetd decides, as it does for every
 * relay datagram the kernel does not take). */
static __always_inline int relay_forward(struct __sk_buff *skb, const struct vxlan_outer *h,
					 __u32 ihl, const struct relay_vxlan *r)
{
	struct relay_fwd_key k = { .src_be = h->ip.saddr, .src_port_be = h->udp.source };
	struct relay_val *v;
	struct iphdr ip;
	__be16 ports[2];
	__u64 segs, bytes;
	__s64 diff;

	__builtin_memcpy(k.dst_tag, r->tag, sizeof(k.dst_tag));
	v = bpf_map_lookup_elem(&relay_fwd, &k);
	if (!v)
		return TCX_NEXT;
	if (ihl != sizeof(struct iphdr) || (h->ip.frag_off & bpf_htons(0x3fff)) ||
	    skb->pkt_type != PACKET_HOST)
		return TCX_NEXT;
	segs = skb->gso_segs > 1 ? skb->gso_segs : 1;
	bytes = payload_bytes(skb, ihl);
	if (!bucket_take((struct rate_val *)v, bytes)) {
		__sync_fetch_and_add(&v->rate_limited, segs);
		return TCX_DROP;
	}
	/* The UDP checksum follows each change (left 0 when it is 0: VXLAN's usual), the IP
	 * header's is computed anew. */
	diff = bpf_csum_diff((__be32 *)r->tag, sizeof(r->tag), (__be32 *)v->src_tag,
			     sizeof(v->src_tag), 0);
	ports[0] = h->udp.dest;
	ports[1] = v->dst_port_be;
	if (bpf_l4_csum_replace(skb, UDP_CSUM_OFF, h->ip.saddr, v->local_be,
				BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | 4) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, h->ip.daddr, v->dst_be,
				BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | 4) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, h->udp.source, ports[0],
				BPF_F_MARK_MANGLED_0 | 2) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, h->udp.dest, ports[1],
				BPF_F_MARK_MANGLED_0 | 2) ||
	    bpf_l4_csum_replace(skb, UDP_CSUM_OFF, 0, diff, BPF_F_MARK_MANGLED_0))
		return TCX_DROP; /* cannot happen on a header loaded above; never half rewritten */
	ip = h->ip;
	ip.saddr = v->local_be;
	ip.daddr = v->dst_be;
	ip.ttl = 64;
	ip.check = 0;
	ip.check = ip_csum(&ip);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &ip, sizeof(ip), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(ip), ports, sizeof(ports), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(ip) + sizeof(struct udphdr) + 4,
				v->src_tag, sizeof(v->src_tag), 0))
		return TCX_DROP; /* half rewritten: never sent */
	__sync_fetch_and_add(&v->frames, segs);
	__sync_fetch_and_add(&v->bytes, bytes);
	/* The route and neighbour towards the member, as the relay's own send would take. */
	return bpf_redirect_neigh(v->ifindex, 0, 0, 0);
}

SEC("tcx/ingress")
int underlay_ingress(struct __sk_buff *skb)
{
	struct vxlan_outer h;
	struct link_key key;
	struct link_val *l;
	__u32 *lslot, gso, ihl, wire, tot, ulen, extra = 0;
	__s64 inner;

	/* What the stack would hand to vnetd's socket: IPv4 UDP to its port, not for another
	 * host's MAC. A later fragment is charged with its first (which has the UDP header). */
	if (bpf_skb_load_bytes(skb, 0, &h, sizeof(h)) || h.eth.h_proto != bpf_htons(ETH_P_IP) ||
	    h.ip.version != 4 || h.ip.ihl < 5 || h.ip.protocol != IPPROTO_UDP ||
	    (h.ip.frag_off & bpf_htons(0x1fff)) || skb->pkt_type == PACKET_OTHERHOST) {
		count_global(G_NOT_VXLAN);
		return TCX_NEXT;
	}
	ihl = h.ip.ihl * 4;
	if (ihl != sizeof(struct iphdr) &&
	    bpf_skb_load_bytes(skb, ETH_HLEN + ihl, &h.udp, sizeof(h.udp) + VXLAN_HLEN)) {
		count_global(G_NOT_VXLAN);
		return TCX_NEXT;
	}
	if (h.udp.dest != cfg_vxlan_port_be) {
		count_global(G_NOT_VXLAN);
		return TCX_NEXT;
	}
	if (h.vx_flags == bpf_htonl(RELAY_WORD)) {
		/* A relay datagram: this host relays it, or it is a relayed link's. */
		struct relay_vxlan r;
		struct relay_rx_key rk = {};
		int rc;

		if (bpf_skb_load_bytes(skb, ETH_HLEN + ihl + sizeof(struct udphdr), &r, sizeof(r)))
			return TCX_NEXT;
		rc = relay_forward(skb, &h, ihl, &r);
		if (rc != TCX_NEXT)
			return rc;
		if (!(r.vx_flags & bpf_htonl(0x08000000)))
			return TCX_NEXT; /* not VXLAN (an encrypted link's message): vnetd's */
		rk.relay_be = h.ip.saddr;
		rk.vni = bpf_ntohl(r.vx_vni) >> 8;
		rk.relay_port_be = h.udp.source;
		__builtin_memcpy(rk.tag, r.tag, sizeof(rk.tag));
		lslot = bpf_map_lookup_elem(&relay_rx, &rk);
		if (!lslot) {
			count_global(G_UNKNOWN_LINK);
			return TCX_NEXT;
		}
		l = bpf_map_lookup_elem(&links, lslot);
		/* Only the link relayed for that peer in that VNI (an entry an earlier vnetd left
		 * never names another link). */
		if (!l || !(l->flags & LINK_RELAYED) || l->vni != rk.vni || !tag_eq(l->relay_tag, rk.tag))
			return TCX_NEXT;
		h.vx_flags = r.vx_flags;
		h.vx_vni = r.vx_vni;
		extra = RELAY_HLEN;
	} else {
		/* vnetd takes any datagram with the I flag (RFC 7348: reserved bits are ignored
		 * on receipt), so the link is found as vnetd finds it; the others it drops
		 * (bad_vxlan). */
		if (!(h.vx_flags & bpf_htonl(0x08000000)))
			return TCX_NEXT;
		/* A reach link is found by its peer's port too (two hosts behind one NAT share
		 * its address), any other link by address. */
		key.remote_be = h.ip.saddr;
		key.vni = bpf_ntohl(h.vx_vni) >> 8;
		key.sport_be = h.udp.source;
		key.pad = 0;
		lslot = bpf_map_lookup_elem(&links_rx, &key);
		if (!lslot) {
			key.sport_be = 0;
			lslot = bpf_map_lookup_elem(&links_rx, &key);
		}
		if (!lslot) {
			count_global(G_UNKNOWN_LINK);
			return TCX_NEXT;
		}
		l = bpf_map_lookup_elem(&links, lslot);
		if (!l)
			return TCX_NEXT;
	}
	/* The link's rate is charged here for every datagram vnetd would take from it, delivered
	 * here or passed on (vnetd leaves the rate of the links the kernel serves to this bucket):
	 * the inner bytes, as vnetd counts them. The stack delivers at most the UDP length (of the
	 * reassembled datagram, for a first fragment); a GRO aggregate holds gso_segs datagrams. */
	wire = skb->len - ETH_HLEN; /* >= sizeof(h) - ETH_HLEN: the load above succeeded */
	tot = bpf_ntohs(h.ip.tot_len);
	ulen = bpf_ntohs(h.udp.len);
	gso = gso_type_of(skb);
	if (!skb->gso_size)
		inner = (__s64)ulen - sizeof(struct udphdr) - VXLAN_HLEN - extra;
	else if (gso & (SKB_GSO_UDP_TUNNEL | SKB_GSO_UDP_TUNNEL_CSUM))
		inner = (__s64)wire - ihl - sizeof(struct udphdr) - VXLAN_HLEN - extra;
	else
		inner = (__s64)wire - ihl - sizeof(struct udphdr) -
			(VXLAN_HLEN + extra) * (__s64)(skb->gso_segs ? skb->gso_segs : 1);
	if (!link_admit(*lslot, l, inner))
		return TCX_DROP;
	/* Decapsulated here only: a whole datagram without IP options, sent to this host's MAC
	 * and the link's local address, with a clean VXLAN header. */
	if (ihl != sizeof(struct iphdr) || (h.ip.frag_off & bpf_htons(0x2000)) ||
	    skb->pkt_type != PACKET_HOST || h.vx_flags != bpf_htonl(0x08000000) ||
	    (h.vx_vni & bpf_htonl(0xff)) || (l->local_be && l->local_be != h.ip.daddr))
		return TCX_NEXT;
	/* The outer lengths must describe the datagram exactly: trailing bytes (an Ethernet pad,
	 * junk) would become part of the inner frame, and a shorter UDP length is what the stack
	 * would deliver. Passed on: the stack trims or drops, vnetd decides. An aggregate larger
	 * than 64 KB cannot state its length there. */
	if (!(skb->gso_size && wire > 0xffff) &&
	    (tot != wire || ulen != tot - sizeof(struct iphdr) ||
	     tot < OUTER_LEN + extra + ETH_HLEN)) {
		count(counters_of(cfg_max_ports + *lslot), C_BAD_LENGTH, 1);
		return TCX_NEXT;
	}
	/* Several VXLAN datagrams merged by GRO (or sent as one UDP GSO skb) are not one frame:
	 * the stack splits them for vnetd's socket. Only a tunnel GSO skb (one outer header over
	 * an inner TCP/UDP GSO frame) is decapsulated whole. */
	if (skb->gso_size && !(gso & (SKB_GSO_UDP_TUNNEL | SKB_GSO_UDP_TUNNEL_CSUM))) {
		count(counters_of(cfg_max_ports + *lslot), C_GRO_PASSED, 1);
		return TCX_NEXT;
	}
	return from_link(skb, *lslot, l, sizeof(h) + extra, ENCAP_LEN + extra);
}

SEC("tcx/ingress")
int tunnel_ingress(struct __sk_buff *skb)
{
	struct bpf_tunnel_key tk = {};
	struct link_key key;
	struct link_val *l;
	__u32 *lslot;

	if (bpf_skb_get_tunnel_key(skb, &tk, sizeof(tk), 0))
		return TCX_NEXT;
	key.remote_be = bpf_htonl(tk.remote_ipv4);
	key.vni = tk.tunnel_id;
	key.sport_be = 0;
	key.pad = 0;
	lslot = bpf_map_lookup_elem(&links_rx, &key);
	if (!lslot)
		return TCX_NEXT;
	l = bpf_map_lookup_elem(&links, lslot);
	if (!l)
		return TCX_NEXT;
	if (!link_admit(*lslot, l, skb->len))
		return TCX_DROP;
	return from_link(skb, *lslot, l, 0, 0);
}

SEC("tcx/ingress")
int punt_ingress(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	__u32 *slot = bpf_map_lookup_elem(&punts, &ifindex);
	struct port_val *to;
	__u64 *c;

	if (!slot) {
		count_global(G_UNKNOWN_PORT);
		return TCX_NEXT;
	}
	to = bpf_map_lookup_elem(&port_slots, slot);
	if (!to || !to->ifindex)
		return TCX_DROP;
	c = counters_of(*slot);
	count(c, C_SLOW_TX_FRAMES, 1);
	count(c, C_SLOW_TX_BYTES, skb->len);
	/* The TAP parsed the frame (skb->protocol is right), so the peer shortcut is safe. */
	return deliver(to, 1);
}
