/*
 * Cutting UDP GSO super-frames into datagrams, as a NIC's segmentation offload does
 * (see offload.h). Each datagram gets the super-frame's headers with its own lengths:
 * the IPv4 total length, identification (one more per datagram, as the kernel's own
 * software segmentation numbers them) and header checksum, or the IPv6 payload length;
 * the UDP length; and the UDP checksum field, which in a frame whose checksum is still
 * owed holds the sum of the pseudo-header, adjusted for the datagram's length.
 */
#include "offload.h"

#include <arpa/inet.h>
#include <string.h>

#define UDP_HEADER 8
#define IPPROTO_UDP_NUMBER 17

void wx_vnet_read(wx_vnet_hdr *h, const unsigned char *raw) {
    h->flags = raw[0];
    h->gso_type = raw[1];
    memcpy(&h->hdr_len, raw + 2, 2);
    memcpy(&h->gso_size, raw + 4, 2);
    memcpy(&h->csum_start, raw + 6, 2);
    memcpy(&h->csum_offset, raw + 8, 2);
}

void wx_vnet_write(const wx_vnet_hdr *h, unsigned char *raw) {
    raw[0] = h->flags;
    raw[1] = h->gso_type;
    memcpy(raw + 2, &h->hdr_len, 2);
    memcpy(raw + 4, &h->gso_size, 2);
    memcpy(raw + 6, &h->csum_start, 2);
    memcpy(raw + 8, &h->csum_offset, 2);
}

wx_vnet_hdr wx_vnet_plain(const wx_vnet_hdr *h) {
    wx_vnet_hdr out = {0};
    if (h->flags & WX_VNET_F_NEEDS_CSUM) {
        out.flags = WX_VNET_F_NEEDS_CSUM;
        out.csum_start = h->csum_start;
        out.csum_offset = h->csum_offset;
    }
    return out;
}

static uint16_t get16(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static void put16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }

/* Ones' complement sum of two 16-bit words (either byte order, both the same). */
static uint16_t csum_add(uint16_t a, uint16_t b) {
    uint32_t s = (uint32_t)a + b;
    return (uint16_t)((s & 0xffff) + (s >> 16));
}

static uint16_t ipv4_header_checksum(const unsigned char *ip, size_t ihl) {
    uint32_t s = 0;
    for (size_t k = 0; k < ihl; k += 2)
        s += (uint32_t)(ip[k] << 8 | ip[k + 1]);
    while (s >> 16)
        s = (s & 0xffff) + (s >> 16);
    return htons((uint16_t)~s);
}

int wx_gso_open(wx_gso *g, const unsigned char *frame, size_t len, const wx_vnet_hdr *h, size_t l2) {
    if (h->gso_type != WX_VNET_GSO_UDP_L4 || !(h->flags & WX_VNET_F_NEEDS_CSUM) || h->gso_size == 0 ||
        len <= l2)
        return -1;
    const unsigned char *ip = frame + l2;
    size_t l4;
    int v6 = (ip[0] >> 4) == 6;
    if ((ip[0] >> 4) == 4) {
        size_t ihl = (size_t)(ip[0] & 0x0f) * 4;
        /* Not a fragment (offset and more-fragments clear), UDP, headers whole. */
        if (ihl < 20 || len < l2 + ihl + UDP_HEADER || ip[9] != IPPROTO_UDP_NUMBER ||
            (ntohs(get16(ip + 6)) & 0x3fff) != 0)
            return -1;
        l4 = l2 + ihl;
    } else if (v6) {
        if (len < l2 + 40 + UDP_HEADER || ip[6] != IPPROTO_UDP_NUMBER)
            return -1;
        l4 = l2 + 40;
    } else {
        return -1;
    }
    if (h->csum_start != l4 || h->csum_offset != 6 || len == l4 + UDP_HEADER)
        return -1;
    g->frame = frame;
    g->l3 = l2;
    g->l4 = l4;
    g->v6 = v6;
    g->seg = h->gso_size;
    g->payload = len - l4 - UDP_HEADER;
    g->count = (g->payload + g->seg - 1) / g->seg;
    return g->count <= WX_GSO_MAX_SEGMENTS ? 0 : -1;
}

size_t wx_gso_datagram(const wx_gso *g, size_t i, unsigned char *out, size_t cap, wx_vnet_hdr *oh) {
    size_t start = i * g->seg;
    if (i >= g->count)
        return 0;
    size_t plen = g->payload - start < g->seg ? g->payload - start : g->seg;
    size_t headers = g->l4 + UDP_HEADER, total = headers + plen;
    if (total > cap)
        return 0;
    memcpy(out, g->frame, headers);
    memcpy(out + headers, g->frame + headers + start, plen);
    unsigned char *ip = out + g->l3, *udp = out + g->l4;
    uint16_t old_len = get16(udp + 4), new_len = htons((uint16_t)(UDP_HEADER + plen));
    put16(udp + 4, new_len);
    put16(udp + 6, csum_add(csum_add(get16(udp + 6), (uint16_t)~old_len), new_len));
    if (g->v6) {
        put16(ip + 4, new_len);
    } else {
        size_t ihl = g->l4 - g->l3;
        put16(ip + 2, htons((uint16_t)(ihl + UDP_HEADER + plen)));
        put16(ip + 4, htons((uint16_t)(ntohs(get16(ip + 4)) + i)));
        put16(ip + 10, 0);
        put16(ip + 10, ipv4_header_checksum(ip, ihl));
    }
    oh->flags = WX_VNET_F_NEEDS_CSUM;
    oh->gso_type = WX_VNET_GSO_NONE;
    oh->hdr_len = 0;
    oh->gso_size = 0;
    oh->csum_start = (uint16_t)g->l4;
    oh->csum_offset = 6;
    return total;
}
