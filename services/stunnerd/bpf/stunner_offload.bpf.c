// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * TURN-UDP ChannelData relayed in the kernel (RFC 8656 §12), for channels stunnerd has bound.
 *
 * Two hash maps, filled and emptied by stunnerd's user space, which stays the authority:
 *   stunner_chan: (client ip:port, listener port, channel) -> how to send to the peer
 *   stunner_peer: (peer ip:port, relay port)                -> how to send to the client
 * A ChannelData datagram from a client on a bound channel leaves as a plain UDP datagram from the
 * allocation's relay address to the peer; a datagram from a peer with a bound channel leaves as
 * ChannelData from the listener's address to the client. Everything else (STUN, Send/Data
 * indications, unbound channels, padded ChannelData, IP options, fragments, GSO, IPv6, oversized
 * datagrams) goes on to user space untouched.
 *
 * Two attach points share the maps: `stunner_tc` (clsact ingress) and `stunner_xdp` (native XDP).
 * TC keeps the IP/UDP headers in place and moves the payload by 4 bytes, so that a CHECKSUM_PARTIAL
 * skb (a locally generated one) keeps its checksum start: removing or adding bytes before the
 * payload would move the UDP header away from it. Per packet it costs one map lookup, the payload
 * copied out and back, two checksum helper calls (the kernel alone knows the skb's checksum
 * state: one call for the pseudo header, one for the datagram), direct writes for the rest and
 * one tail change. It sends with `bpf_redirect` when the entry carries the MAC addresses user
 * space resolved (refreshed with the channel), else with `bpf_redirect_neigh` (a route and a
 * neighbour lookup per packet). XDP moves the headers, updates the checksums incrementally and
 * needs those MAC addresses; entries without them pass to user space.
 *
 * A destination on this host itself (a peer in the same network namespace) cannot be reached from
 * here: a packet re-entering the stack with one of our own addresses as its source is a martian.
 * Those entries carry FWD_LOCAL and that direction stays in user space; the other direction (the
 * local peer's datagrams, seen on lo's ingress) is relayed.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define MAX_ENTRIES 65536
#define MAX_PAYLOAD 1472      /* client -> peer: ChannelData payload moved by TC */
#define MAX_GROW_PAYLOAD 1400 /* peer -> client: leave room for the 4-byte header under a 1500 MTU */
#define SCRATCH_BYTES 2048
#define DEFAULT_TTL 64

#define FWD_LOCAL 1    /* destination is an address of this host: left to user space */
#define FWD_HAS_MACS 2 /* smac/dmac/ifindex resolved: XDP may send it */
#define FWD_PEER_DEV 4 /* ifindex is a veth (or netkit) whose far end is in another namespace */

#define L3_OFF ((int)sizeof(struct ethhdr))
#define L4_OFF (L3_OFF + (int)sizeof(struct iphdr))
#define PAYLOAD_OFF (L4_OFF + (int)sizeof(struct udphdr))
#define IP_CSUM_OFF (L3_OFF + (int)offsetof(struct iphdr, check))
#define UDP_CSUM_OFF (L4_OFF + (int)offsetof(struct udphdr, check))

/* Keys hold the remote address and the local port, not the local address: like a UDP socket
 * bound to the wildcard address, an entry serves every address of this host. */
struct client_key {
	__be32 client_ip;
	__be16 client_port;
	__be16 local_port;
	__u16 channel; /* host order */
	__u16 pad;
};

struct peer_key {
	__be32 peer_ip;
	__be16 peer_port;
	__be16 relay_port;
};

struct fwd {
	__be32 src_ip; /* the new outer addresses */
	__be32 dst_ip;
	__be16 src_port;
	__be16 dst_port;
	__u16 channel; /* peer -> client: the channel to frame with; host order */
	__u16 flags;
	__u32 ifindex;
	__u8 smac[ETH_ALEN];
	__u8 dmac[ETH_ALEN];
	__u32 pad;
	__u64 packets; /* relayed here, payload bytes (without the ChannelData header) */
	__u64 bytes;
};

/* A hash map from `key_type` to how to send on (both maps hold `struct fwd` values). */
#define FWD_MAP(name, key_type)                  \
	struct {                                 \
		__uint(type, BPF_MAP_TYPE_HASH); \
		__uint(max_entries, MAX_ENTRIES); \
		__type(key, key_type);           \
		__type(value, struct fwd);       \
	} name SEC(".maps")

FWD_MAP(stunner_chan, struct client_key);
FWD_MAP(stunner_peer, struct peer_key);

struct scratch {
	__u8 buf[SCRATCH_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} stunner_scratch SEC(".maps");

/* What the parser found: addresses in network order, lengths in host order. */
struct pkt {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u16 tot_len;
	__u16 udp_len;
	__u16 payload; /* UDP payload bytes */
	__u8 ttl;
	__be16 udp_check;
	__u32 chan_hdr; /* first 4 payload bytes, network order, when payload >= 4 */
};

static __always_inline int parse(void *data, void *end, struct pkt *p)
{
	struct ethhdr *eth = data;
	struct iphdr *ip = data + L3_OFF;
	struct udphdr *udp = data + L4_OFF;

	if ((void *)(udp + 1) > end)
		return -1;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	if (ip->ihl != 5 || ip->version != 4 || ip->protocol != IPPROTO_UDP)
		return -1;
	if (ip->frag_off & bpf_htons(0x3fff)) /* MF or an offset: a fragment */
		return -1;
	p->tot_len = bpf_ntohs(ip->tot_len);
	p->udp_len = bpf_ntohs(udp->len);
	if (p->udp_len < sizeof(struct udphdr) || p->tot_len != p->udp_len + sizeof(struct iphdr))
		return -1;
	p->saddr = ip->saddr;
	p->daddr = ip->daddr;
	p->sport = udp->source;
	p->dport = udp->dest;
	p->ttl = ip->ttl;
	p->udp_check = udp->check;
	p->payload = p->udp_len - sizeof(struct udphdr);
	p->chan_hdr = 0;
	if (p->payload >= 4) {
		__u8 *c = data + PAYLOAD_OFF;
		if ((void *)(c + 4) > end)
			return -1;
		p->chan_hdr = *(__u32 *)c;
	}
	return 0;
}

/* The ChannelData frame of a bound channel, unpadded, or NULL. */
static __always_inline struct fwd *client_entry(struct pkt *p)
{
	struct client_key key = {};
	__u8 *h = (__u8 *)&p->chan_hdr;
	__u16 len;

	if (p->payload < 4 || h[0] < 0x40 || h[0] > 0x7f)
		return NULL;
	len = ((__u16)h[2] << 8) | h[3];
	if (len != p->payload - 4 || len == 0 || len > MAX_PAYLOAD)
		return NULL;
	key.client_ip = p->saddr;
	key.client_port = p->sport;
	key.local_port = p->dport;
	key.channel = ((__u16)h[0] << 8) | h[1];
	return bpf_map_lookup_elem(&stunner_chan, &key);
}

static __always_inline struct fwd *peer_entry(struct pkt *p)
{
	struct peer_key key = {};

	if (p->payload == 0 || p->payload > MAX_GROW_PAYLOAD)
		return NULL;
	key.peer_ip = p->saddr;
	key.peer_port = p->sport;
	key.relay_port = p->dport;
	return bpf_map_lookup_elem(&stunner_peer, &key);
}

/* ----------------------------------------------------------------------- checksums */

static __always_inline __u16 csum_fold(__u64 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* RFC 1624: HC' = ~(~HC + ~m + m'), over 32-bit words given in network order. */
static __always_inline __u64 csum_swap32(__u64 sum, __u32 old, __u32 new)
{
	return sum + (~old & 0xffff) + (~old >> 16) + (new & 0xffff) + (new >> 16);
}

static __always_inline __u64 csum_swap16(__u64 sum, __u16 old, __u16 new)
{
	return sum + (__u16)~old + new;
}

/* The IP header's checksum after the rewrite every relayed datagram gets (addresses, length,
 * TTL), from the one it arrived with. */
static __always_inline __u16 ip_check(struct pkt *p, struct fwd *f, __be16 old_check,
				      __be16 new_tot)
{
	__u64 sum = (__u16)~old_check;

	sum = csum_swap32(sum, p->saddr, f->src_ip);
	sum = csum_swap32(sum, p->daddr, f->dst_ip);
	sum = csum_swap16(sum, bpf_htons(p->tot_len), new_tot);
	sum = csum_swap16(sum, bpf_htons((__u16)p->ttl << 8), bpf_htons((__u16)DEFAULT_TTL << 8));
	return ~csum_fold(sum);
}

/* The UDP checksum's change in two parts, as the kernel's helpers want them: the pseudo header
 * (addresses, length), which a CHECKSUM_PARTIAL seed must follow, and the datagram itself
 * (ports, length, the 4 ChannelData bytes removed or added), which such a seed must not. */
static __always_inline __u16 udp_pseudo_diff(struct pkt *p, struct fwd *f, __be16 new_ulen)
{
	__u64 sum = csum_swap32(0, p->saddr, f->src_ip);

	sum = csum_swap32(sum, p->daddr, f->dst_ip);
	return csum_fold(csum_swap16(sum, bpf_htons(p->udp_len), new_ulen));
}

static __always_inline __u16 udp_body_diff(struct pkt *p, struct fwd *f, __be16 new_ulen,
					   __u32 removed, __u32 added)
{
	__u32 old_ports = ((__u32)p->dport << 16) | p->sport;
	__u32 new_ports = ((__u32)f->dst_port << 16) | f->src_port;
	__u64 sum = csum_swap16(0, bpf_htons(p->udp_len), new_ulen);

	sum = csum_swap32(sum, old_ports, new_ports);
	return csum_fold(csum_swap32(sum, removed, added));
}

/* ------------------------------------------------------------------------------------ TC */

/* Rewrite the IP and UDP headers in place for a datagram whose UDP length becomes new_udp_len;
 * removed/added are the 4 payload bytes that went or came (0 for none). The UDP checksum goes
 * through the kernel's helpers, which alone know the skb's checksum state (two calls: one per
 * part of the change); the rest is written straight into the packet, the IP checksum updated
 * here (RFC 1624). Every checksum stays consistent, so a CHECKSUM_COMPLETE sum stays right. */
static __always_inline int tc_rewrite(struct __sk_buff *skb, struct pkt *p, struct fwd *f,
				      __u16 new_udp_len, __u32 removed, __u32 added)
{
	__be16 new_tot = bpf_htons(new_udp_len + sizeof(struct iphdr));
	__be16 new_ulen = bpf_htons(new_udp_len);
	__u64 mangled = BPF_F_MARK_MANGLED_0;
	struct iphdr *ip;
	struct udphdr *udp;
	void *data, *end;

	if (p->udp_check &&
	    (bpf_l4_csum_replace(skb, UDP_CSUM_OFF, 0, udp_pseudo_diff(p, f, new_ulen),
				 mangled | BPF_F_PSEUDO_HDR) ||
	     bpf_l4_csum_replace(skb, UDP_CSUM_OFF, 0,
				 udp_body_diff(p, f, new_ulen, removed, added), mangled)))
		return -1;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	ip = data + L3_OFF;
	udp = data + L4_OFF;
	if ((void *)(udp + 1) > end)
		return -1;
	ip->check = ip_check(p, f, ip->check, new_tot);
	ip->saddr = f->src_ip;
	ip->daddr = f->dst_ip;
	ip->tot_len = new_tot;
	ip->ttl = DEFAULT_TTL;
	udp->source = f->src_port;
	udp->dest = f->dst_port;
	udp->len = new_ulen;
	return 0;
}

/* With the MAC addresses user space resolved, the frame is finished here and goes straight to
 * the device; without them the kernel's neighbour lookup (and a route lookup) addresses it. A
 * veth's frame goes straight into its far end's ingress (`bpf_redirect_peer`), as if that end
 * had received it, without the trip through the veth's transmit path and the backlog queue. */
static __always_inline int tc_send(struct __sk_buff *skb, struct fwd *f)
{
	struct ethhdr *eth = (void *)(long)skb->data;

	if (!(f->flags & FWD_HAS_MACS))
		return bpf_redirect_neigh(f->ifindex, NULL, 0, 0);
	if ((void *)(eth + 1) > (void *)(long)skb->data_end)
		return TC_ACT_SHOT;
	__builtin_memcpy(eth->h_source, f->smac, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, f->dmac, ETH_ALEN);
	if (f->flags & FWD_PEER_DEV)
		return bpf_redirect_peer(f->ifindex, 0);
	return bpf_redirect(f->ifindex, 0);
}

/* n, already checked to be in [1, SCRATCH_BYTES], in a form whose bounds the verifier sees on the
 * very register handed to a helper (clang otherwise checks a derived copy). */
static __always_inline __u32 verifier_size(__u32 n)
{
	barrier_var(n);
	return ((n - 1) & (SCRATCH_BYTES - 1)) + 1;
}

static __always_inline struct scratch *scratch(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&stunner_scratch, &zero);
}

/* client -> peer: drop the 4-byte ChannelData header by moving the payload down. */
static __always_inline int tc_to_peer(struct __sk_buff *skb, struct pkt *p, struct fwd *f)
{
	struct scratch *s = scratch();
	__u32 n = p->payload - 4;

	if (!s || (f->flags & FWD_LOCAL) || n < 1 || n > MAX_PAYLOAD)
		return TC_ACT_OK;
	n = verifier_size(n);
	if (bpf_skb_load_bytes(skb, PAYLOAD_OFF + 4, s->buf, n))
		return TC_ACT_OK;
	/* From here on the packet is ours: a failure drops it rather than pass a half-rewrite. */
	if (bpf_skb_store_bytes(skb, PAYLOAD_OFF, s->buf, n, BPF_F_RECOMPUTE_CSUM))
		return TC_ACT_SHOT;
	if (tc_rewrite(skb, p, f, n + sizeof(struct udphdr), p->chan_hdr, 0))
		return TC_ACT_SHOT;
	if (bpf_skb_change_tail(skb, skb->len - 4, 0))
		return TC_ACT_SHOT;
	__sync_fetch_and_add(&f->packets, 1);
	__sync_fetch_and_add(&f->bytes, n);
	return tc_send(skb, f);
}

/* peer -> client: grow by 4 bytes, move the payload up and write the ChannelData header. */
static __always_inline int tc_to_client(struct __sk_buff *skb, struct pkt *p, struct fwd *f)
{
	struct scratch *s = scratch();
	__u32 n = p->payload;
	__u32 hdr;

	if (!s || (f->flags & FWD_LOCAL) || n < 1 || n > MAX_GROW_PAYLOAD)
		return TC_ACT_OK;
	n = verifier_size(n);
	if (bpf_skb_load_bytes(skb, PAYLOAD_OFF, s->buf, n))
		return TC_ACT_OK;
	if (bpf_skb_change_tail(skb, skb->len + 4, 0))
		return TC_ACT_OK; /* nothing changed yet */
	if (bpf_skb_store_bytes(skb, PAYLOAD_OFF + 4, s->buf, n, BPF_F_RECOMPUTE_CSUM))
		return TC_ACT_SHOT;
	hdr = bpf_htonl(((__u32)f->channel << 16) | n);
	if (bpf_skb_store_bytes(skb, PAYLOAD_OFF, &hdr, 4, BPF_F_RECOMPUTE_CSUM))
		return TC_ACT_SHOT;
	if (tc_rewrite(skb, p, f, n + 4 + sizeof(struct udphdr), 0, hdr))
		return TC_ACT_SHOT;
	__sync_fetch_and_add(&f->packets, 1);
	__sync_fetch_and_add(&f->bytes, n);
	return tc_send(skb, f);
}

SEC("tc")
int stunner_tc(struct __sk_buff *skb)
{
	struct pkt p;
	struct fwd *f;

	if (skb->protocol != bpf_htons(ETH_P_IP) || skb->gso_size)
		return TC_ACT_OK;
	/* Direct access needs the headers (and the ChannelData header) in the linear part. */
	if ((void *)(long)skb->data + PAYLOAD_OFF + 4 > (void *)(long)skb->data_end &&
	    bpf_skb_pull_data(skb, PAYLOAD_OFF + 4) && bpf_skb_pull_data(skb, PAYLOAD_OFF))
		return TC_ACT_OK;
	if (parse((void *)(long)skb->data, (void *)(long)skb->data_end, &p))
		return TC_ACT_OK;
	f = client_entry(&p);
	if (f)
		return tc_to_peer(skb, &p, f);
	f = peer_entry(&p);
	if (f)
		return tc_to_client(skb, &p, f);
	return TC_ACT_OK;
}

/* ----------------------------------------------------------------------------------- XDP */

/* A stack copy of the headers; the pad keeps the IP header 4-byte aligned. */
struct hdrs {
	__u16 pad;
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
};

#define HDRS_BYTES (PAYLOAD_OFF)

/* Rewrite the header copy `h` for the new addresses and UDP length; XDP sees only complete
 * checksums, so both are updated here (RFC 1624). */
static __always_inline void xdp_rewrite(struct hdrs *h, struct pkt *p, struct fwd *f,
					__u16 new_udp_len, __u32 removed, __u32 added)
{
	__be16 new_ulen = bpf_htons(new_udp_len);
	__be16 new_tot = bpf_htons(new_udp_len + sizeof(struct iphdr));

	__builtin_memcpy(h->eth.h_source, f->smac, ETH_ALEN);
	__builtin_memcpy(h->eth.h_dest, f->dmac, ETH_ALEN);
	h->ip.check = ip_check(p, f, h->ip.check, new_tot);
	h->ip.saddr = f->src_ip;
	h->ip.daddr = f->dst_ip;
	h->ip.tot_len = new_tot;
	h->ip.ttl = DEFAULT_TTL;
	if (p->udp_check) {
		__u64 sum = (__u16)~p->udp_check;
		__u16 res;

		sum += udp_pseudo_diff(p, f, new_ulen);
		sum += udp_body_diff(p, f, new_ulen, removed, added);
		res = ~csum_fold(sum);
		h->udp.check = res ? res : 0xffff;
	}
	h->udp.source = f->src_port;
	h->udp.dest = f->dst_port;
	h->udp.len = new_ulen;
}

static __always_inline int xdp_send(struct xdp_md *ctx, struct fwd *f)
{
	if (f->ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(f->ifindex, 0);
}

static __always_inline int xdp_usable(struct fwd *f)
{
	return (f->flags & FWD_HAS_MACS) && !(f->flags & FWD_LOCAL);
}

SEC("xdp")
int stunner_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct hdrs h;
	struct pkt p;
	__u8 *out;
	struct fwd *f;

	if (parse(data, end, &p))
		return XDP_PASS;
	if (data + HDRS_BYTES > end)
		return XDP_PASS;
	__builtin_memcpy(&h.eth, data, HDRS_BYTES);

	f = client_entry(&p);
	if (f) {
		__u32 n = p.payload - 4;

		if (!xdp_usable(f))
			return XDP_PASS;
		xdp_rewrite(&h, &p, f, n + sizeof(struct udphdr), p.chan_hdr, 0);
		if (bpf_xdp_adjust_head(ctx, 4))
			return XDP_PASS;
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		out = data;
		if ((void *)(out + HDRS_BYTES) > end)
			return XDP_DROP;
		__builtin_memcpy(out, &h.eth, HDRS_BYTES);
		__sync_fetch_and_add(&f->packets, 1);
		__sync_fetch_and_add(&f->bytes, n);
		return xdp_send(ctx, f);
	}
	f = peer_entry(&p);
	if (f) {
		__u32 n = p.payload;
		__u32 hdr = bpf_htonl(((__u32)f->channel << 16) | n);
		__u32 *chan;

		if (!xdp_usable(f))
			return XDP_PASS;
		xdp_rewrite(&h, &p, f, n + 4 + sizeof(struct udphdr), 0, hdr);
		if (bpf_xdp_adjust_head(ctx, -4))
			return XDP_PASS;
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		out = data;
		chan = (__u32 *)(out + HDRS_BYTES);
		if ((void *)(chan + 1) > end)
			return XDP_DROP;
		__builtin_memcpy(out, &h.eth, HDRS_BYTES);
		*chan = hdr;
		__sync_fetch_and_add(&f->packets, 1);
		__sync_fetch_and_add(&f->bytes, n);
		return xdp_send(ctx, f);
	}
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
