// SPDX-License-Identifier: (MIT OR Apache-2.0)
// rdaq's XDP program: steers the UDP datagrams addressed to a receiver's data ports into its
// AF_XDP socket and passes everything else (ARP, ICMP, control traffic, IP fragments, other
// ports) to the kernel. Multi-buffer aware ("xdp.frags"): 8 KiB JUNGFRAU and rdaq datagrams
// arrive as several buffers; only the headers, which lie in the first, are read here.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// AF_XDP sockets by receive queue.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

// Data ports (host byte order) of the receiver: present means steer.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u16);
	__type(value, __u32);
} ports SEC(".maps");

// The receiver's IPv4 address (network byte order) at index 0; 0 accepts any destination.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} dest SEC(".maps");

SEC("xdp.frags")
int rdaq_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return XDP_PASS;
	// fragments go to the kernel, which reassembles them
	if (ip->frag_off & bpf_htons(0x3fff))
		return XDP_PASS;
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end)
		return XDP_PASS;
	__u32 zero = 0;
	__u32 *want = bpf_map_lookup_elem(&dest, &zero);
	if (want && *want && *want != ip->daddr)
		return XDP_PASS;
	__u16 port = bpf_ntohs(udp->dest);
	if (!bpf_map_lookup_elem(&ports, &port))
		return XDP_PASS;
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
