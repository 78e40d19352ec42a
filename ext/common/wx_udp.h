/*
 * UDP segmentation offload constants for C libraries older than the kernel.
 *
 * Why: glibc's <netinet/udp.h> gained UDP_SEGMENT (GSO, Linux 4.18) and UDP_GRO
 * (Linux 5.0) years after the kernel; building on an older libc would otherwise
 * lose the offloads, which the kernel of the machine that runs us may well have
 * (a socket option it does not know fails at run time, and callers fall back).
 * One definition, shared by the data path (ext/datapath) and the ceilings
 * (ext/limits), so the two never disagree on a value.
 */
#ifndef WANXPORT_WX_UDP_H
#define WANXPORT_WX_UDP_H

#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/udp.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

/* Attach a UDP_SEGMENT control message to msg: the kernel splits the buffer into
 * datagrams of seg bytes. control must hold CMSG_SPACE(sizeof(uint16_t)) bytes. */
static inline void wx_udp_segment_cmsg(struct msghdr *msg, char *control, size_t control_len,
                                       uint16_t seg) {
    memset(control, 0, control_len);
    msg->msg_control = control;
    msg->msg_controllen = control_len;
    struct cmsghdr *c = CMSG_FIRSTHDR(msg);
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    memcpy(CMSG_DATA(c), &seg, sizeof seg);
}

#endif
