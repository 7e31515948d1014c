/*
 * comm/liveness.h: tells a rank, within a moment, that a peer process has ended, for launches without mpirun.
 *
 * Under mpirun a rank that dies is noticed by mpirun, which ends the others. Started by torchrun-style
 * variables (or by srun, or by hand) nothing does that, and the NCCL engine sees a dead peer only as a
 * collective that never completes: the other ranks wait out their deadline. Around file I/O that is
 * --io-timeout (an hour by default), so a rank killed during a checkpoint left the others waiting an hour.
 *
 * The signal used: a TCP connection from every rank to rank 0, opened at start-up and never written to
 * again. When a process ends, however it ends (an error, SIGKILL, the OOM killer), its kernel closes its
 * sockets and the peer reads end-of-stream. Rank 0 holds one connection per rank, every other rank one
 * to rank 0: a rank that waits sees at once when the rank it is connected to is gone (a dead rank r
 * ends rank 0 as soon as rank 0 waits, and rank 0's end ends the rest). A stopped or hung process keeps
 * its sockets open: for those the deadlines stay. Plain POSIX sockets (rendezvous.h's helpers).
 */
#pragma once

#include <arpa/inet.h>  // ntohs, htonl, ntohl, inet_ntop
#include <ifaddrs.h>    // getifaddrs
#include <net/if.h>     // IFF_LOOPBACK

#include "../common.h"   // malloc_check, wall_seconds
#include "rendezvous.h"  // rdzv_listen, rdzv_transfer, rdzv_connect_once, rdzv_fail: the socket helpers

typedef struct {
    int listener;   // rank 0, at start-up: where the others connect
    int* fds;       // rank 0: one per rank (fds[r], -1 for itself); others: fds[0], the connection to rank 0
    int n;          // entries of fds (0: no connections, nothing to watch)
    double checked; // when liveness_lost last looked
} Liveness;

static Liveness g_liveness = {-1, NULL, 0, 0.0};

// rank 0, before the NCCL id goes out: a listening socket on a free port, whose number goes out with the id
static int liveness_listen(char* err, size_t n) {
    int fd = rdzv_listen(0, err, n);
    if (fd < 0) return -1;
    struct sockaddr_storage a;
    socklen_t len = sizeof(a);
    if (getsockname(fd, (struct sockaddr*)&a, &len) != 0) {
        close(fd);
        return rdzv_fail(err, n, "rank 0: getsockname: %s", strerror(errno));
    }
    g_liveness.listener = fd;
    return ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6*)&a)->sin6_port : ((struct sockaddr_in*)&a)->sin_port);
}

// rank 0, after the id went out: every other rank connects and says its rank (4 bytes), before the deadline
static int liveness_accept(int world, double timeout_s, char* err, size_t n) {
    double deadline = timeout_s > 0 ? wall_seconds() + timeout_s : 0;
    g_liveness.fds = (int*)malloc_check((size_t)world * sizeof(int));
    for (int r = 0; r < world; r++) g_liveness.fds[r] = -1;
    g_liveness.n = world;
    for (int joined = 0; joined < world - 1;) {
        if (!rdzv_ready(g_liveness.listener, POLLIN, deadline))
            return rdzv_fail(err, n, "rank 0: %d of %d ranks did not open their connection to rank 0 within %.0f s "
                             "(--comm-timeout)", world - 1 - joined, world - 1, timeout_s);
        int fd = accept(g_liveness.listener, NULL, NULL);
        if (fd < 0 || rdzv_prepare(fd) != 0) {
            if (fd >= 0) close(fd);
            continue;
        }
        uint32_t rank;
        if (rdzv_transfer(fd, &rank, sizeof(rank), 0, deadline) != 0 || (rank = ntohl(rank)) < 1 ||
            (int)rank >= world || g_liveness.fds[rank] >= 0) {
            close(fd);  // (no rank of this run: another program knocking on the port)
            continue;
        }
        g_liveness.fds[rank] = fd;
        joined++;
    }
    close(g_liveness.listener);
    g_liveness.listener = -1;
    return 0;
}

// rank 0, for a launch through a shared folder: where the others may reach it, space-separated, most
// specific first: its host name (which need not resolve on the other nodes, nor even here: a container's
// often does not), then its interfaces' addresses, loopback last (right when every rank is on this machine)
static void liveness_addresses(char* out, size_t n) {
    if (gethostname(out, n - 1) != 0) out[0] = 0;
    out[n - 1] = 0;
    struct ifaddrs* list = NULL;
    if (getifaddrs(&list) == 0) {
        for (struct ifaddrs* a = list; a != NULL; a = a->ifa_next) {
            if (a->ifa_addr == NULL || (a->ifa_flags & IFF_LOOPBACK) ||
                (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6))
                continue;
            char text[INET6_ADDRSTRLEN];
            const void* raw = a->ifa_addr->sa_family == AF_INET
                                  ? (const void*)&((struct sockaddr_in*)a->ifa_addr)->sin_addr
                                  : (const void*)&((struct sockaddr_in6*)a->ifa_addr)->sin6_addr;
            if (inet_ntop(a->ifa_addr->sa_family, raw, text, sizeof(text)) == NULL || strchr(text, '%')) continue;
            if (strlen(out) + strlen(text) + 2 + 10 < n)  // (room left for loopback)
                strcat(strcat(out, out[0] ? " " : ""), text);
        }
        freeifaddrs(list);
    }
    strcat(strcat(out, out[0] ? " " : ""), "127.0.0.1");
}

// every other rank, once it has the id: connect to rank 0 at one of `hosts` (space-separated, tried in
// order, see liveness_addresses) and `port`, and say this rank
static int liveness_connect(const char* hosts, int port, int rank, double timeout_s, char* err, size_t n) {
    double deadline = timeout_s > 0 ? wall_seconds() + timeout_s : 0;
    char port_text[16], why[256] = "", list[256];
    snprintf(port_text, sizeof(port_text), "%d", port);
    int fd = -1;
    for (;;) {
        int all_hopeless = 1;
        snprintf(list, sizeof(list), "%s", hosts);
        for (char *save = NULL, *host = strtok_r(list, " ", &save); host != NULL && fd < 0;
             host = strtok_r(NULL, " ", &save)) {
            int hopeless = 0;
            fd = rdzv_connect_once(host, port_text, deadline, why, sizeof(why), &hopeless);
            all_hopeless &= hopeless;
        }
        if (fd >= 0) break;
        if (all_hopeless || rdzv_expired(deadline))
            return rdzv_fail(err, n, "rank %d: cannot open a connection to rank 0 at any of %s (port %d) within %.0f s "
                             "(--comm-timeout): %s", rank, hosts, port, timeout_s, why);
        usleep(100000);
    }
    uint32_t r = htonl((uint32_t)rank);
    if (rdzv_transfer(fd, &r, sizeof(r), 1, deadline) != 0) {
        close(fd);
        return rdzv_fail(err, n, "rank %d: the connection to rank 0 (at one of %s, port %d) broke at once",
                         rank, hosts, port);
    }
    g_liveness.fds = (int*)malloc_check(sizeof(int));
    g_liveness.fds[0] = fd;
    g_liveness.n = 1;
    return 0;
}

// The rank whose process has ended (its connection reached end-of-stream or broke), or -1 when all are
// there. Looks at most every 0.2 s (it is called from polling loops).
static int liveness_lost(void) {
    double now = wall_seconds();
    if (g_liveness.n == 0 || now - g_liveness.checked < 0.2) return -1;
    g_liveness.checked = now;
    for (int r = 0; r < g_liveness.n; r++) {
        int fd = g_liveness.fds[r];
        if (fd < 0) continue;
        char byte;
        ssize_t k = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return r;
    }
    return -1;
}

static void liveness_close(void) {
    for (int r = 0; r < g_liveness.n; r++)
        if (g_liveness.fds[r] >= 0) close(g_liveness.fds[r]);
    if (g_liveness.listener >= 0) close(g_liveness.listener);
    free(g_liveness.fds);
    g_liveness = (Liveness){-1, NULL, 0, 0.0};
}
