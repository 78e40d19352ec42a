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

#endif
