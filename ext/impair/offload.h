/*
 * Frames with a virtio-net header, as an AF_PACKET socket with PACKET_VNET_HDR
 * reads and writes them: the engine's side of the offloads a NIC performs.
 *
 * With offloads on, a sender's UDP GSO send crosses its veth as one super-frame
 * (up to 64 KB, its checksum left for the device to fill in), as it would reach a
 * NIC that segments and checksums in hardware. The engine is that NIC: it cuts the
 * super-frame into the datagrams the link carries, each impaired on its own, and
 * hands them on with their checksum still to be filled in, which a veth delivers as
 * already checked, as a NIC that verified it would. Without this, the kernel cut
 * every burst and summed every datagram on the sending thread, and summed it again
 * on the receiving one: work the hosts being emulated never do in software.
 */
#ifndef WANXPORT_IMPAIR_OFFLOAD_H
#define WANXPORT_IMPAIR_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#define WX_VNET_HDR_LEN 10
#define WX_VNET_F_NEEDS_CSUM 1
#define WX_VNET_GSO_NONE 0
#define WX_VNET_GSO_UDP_L4 5
/* The largest frame a super-frame can be: a 64 KB IP packet and its Ethernet header. */
#define WX_VNET_MAX_FRAME (65535 + 14)
/* The most datagrams one super-frame is cut into (the kernel's UDP_MAX_SEGMENTS is
   128 or 256): a header claiming more is refused, not a 64 K-step loop. */
#define WX_GSO_MAX_SEGMENTS 256

/* The header in the byte order the kernel uses for an AF_PACKET socket (a legacy
   virtio header: the host's own). */
typedef struct {
    uint8_t flags, gso_type;
    uint16_t hdr_len, gso_size, csum_start, csum_offset;
} wx_vnet_hdr;

void wx_vnet_read(wx_vnet_hdr *h, const unsigned char *raw);
void wx_vnet_write(const wx_vnet_hdr *h, unsigned char *raw);
/* The header a single datagram leaves with: its checksum still owed when it came so. */
wx_vnet_hdr wx_vnet_plain(const wx_vnet_hdr *h);

/* A UDP GSO super-frame (IPv4 or IPv6, no extension headers) and how it is cut. */
typedef struct {
    const unsigned char *frame;
    size_t l3, l4;   /* offsets of the IP and UDP headers */
    int v6;
    size_t seg;      /* payload bytes per datagram (the last may hold fewer) */
    size_t payload;  /* the super-frame's UDP payload */
    size_t count;    /* datagrams */
} wx_gso;

/* 0 and `g` set when `frame` (after an Ethernet header of `l2` bytes) is a UDP GSO
   super-frame this engine can cut; -1 when it is not. */
int wx_gso_open(wx_gso *g, const unsigned char *frame, size_t len, const wx_vnet_hdr *h, size_t l2);

/* Datagram `i` of `g` written to `out` (at most `cap` bytes) with its header in `oh`:
   its length, or 0 when it does not fit. */
size_t wx_gso_datagram(const wx_gso *g, size_t i, unsigned char *out, size_t cap, wx_vnet_hdr *oh);

#endif
