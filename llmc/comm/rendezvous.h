/*
 * comm/rendezvous.h: hands a small blob (the NCCL unique id) from rank 0 to every other rank over TCP, the
 * way torchrun's ranks meet: at MASTER_ADDR:MASTER_PORT, with neither MPI nor a shared folder.
 *
 * Rank 0 listens on the port; every other rank connects (retrying while rank 0 has not started yet) and
 * says hello; rank 0 answers each complete hello at once, with the blob when it accepts it, and returns
 * when all world - 1 ranks hold the blob, closing its listening socket, so the port is free again.
 *
 *     rank r -> rank 0   hello:   magic, version, r,      world size, blob bytes, job identity
 *     rank 0 -> rank r   answer:  magic, version, status, world size, blob bytes, job identity [, blob]
 *
 * Why a handshake: a port is shared by everything on the node. Another job may listen on it, a rank of
 * another job may knock on ours, or the program there is no trainer at all. Rank 0 checks each hello
 * (magic, version, world size, job identity, blob size, a rank not taken yet) and refuses a mismatch with
 * an answer carrying its own values, so the refused rank prints one line naming what differed; rank 0
 * keeps waiting for the ranks of its own job, and names the refusals if they never come.
 *
 * Every wait has the caller's deadline (--comm-timeout; 0: none): sockets are non-blocking, and connect,
 * accept, read and write all wait in poll(). Rank 0 serves its connections all at once, so a peer that
 * connects and says nothing, or dies halfway through its hello, delays no one; sends use MSG_NOSIGNAL,
 * so a dead peer is an error to handle, never a SIGPIPE. On failure the functions return -1 and leave
 * one line in err for the caller to print. Plain POSIX sockets, no CUDA: both targets compile it.
 */
#pragma once

#include "../common.h"  // wall_seconds, calloc_check, realloc_check; fcntl, errno, va_list
#include <arpa/inet.h>   // htonl, ntohl
#include <netdb.h>       // getaddrinfo
#include <netinet/in.h>  // sockaddr_in, sockaddr_in6
#include <poll.h>        // poll
#include <sys/socket.h>  // socket, bind, listen, accept, connect, send, recv

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif
#define RDZV_MAGIC 0x4c4c5a52u  // "LLZR"
#define RDZV_VERSION 1u
#define RDZV_JOB_CHARS 128

enum { RDZV_OK, RDZV_BAD_VERSION, RDZV_BAD_WORLD, RDZV_BAD_JOB, RDZV_BAD_BYTES, RDZV_BAD_RANK };

// the hello (rank r -> rank 0) and the answer (rank 0 -> rank r); integers in network byte order
typedef struct {
    uint32_t magic, version;
    uint32_t rank_or_status;   // hello: the sender's rank; answer: RDZV_OK or what differed
    uint32_t world, bytes;     // the sender's world size and blob size
    char job[RDZV_JOB_CHARS];  // the sender's job identity, zero-padded
} RdzvMessage;

__attribute__((format(printf, 3, 4))) static int rdzv_fail(char* err, size_t n, const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(err, n, fmt, args);
    va_end(args);
    return -1;
}

static int rdzv_expired(double deadline) { return deadline > 0 && wall_seconds() >= deadline; }
// poll's timeout: until the deadline (0: none), at most one second, so every loop rechecks it
static int rdzv_poll_ms(double deadline) {
    if (deadline <= 0) return 1000;
    double left = deadline - wall_seconds();
    return left <= 0 ? 0 : left >= 1.0 ? 1000 : (int)(left * 1000.0) + 1;
}

// waits until fd is ready for events; 0 when the deadline passed first
static int rdzv_ready(int fd, short events, double deadline) {
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = events, .revents = 0};
        int r = poll(&pf, 1, rdzv_poll_ms(deadline));
        if (r > 0 || (r < 0 && errno != EINTR)) return 1;  // (an error shows in the next call on fd)
        if (rdzv_expired(deadline)) return 0;
    }
}

static int rdzv_prepare(int fd) {  // non-blocking, and not inherited by programs this one starts
    return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 ? -1 : 0;
}

// Moves exactly n bytes over the non-blocking socket fd (out: send, else receive) before the deadline.
// 0: done; -1: the peer closed the connection (errno 0) or it broke (errno set); -2: the deadline passed.
static int rdzv_transfer(int fd, void* buf, size_t n, int out, double deadline) {
    char* p = (char*)buf;
    size_t done = 0;
    while (done < n) {
        ssize_t k = out ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, 0);
        if (k > 0) done += (size_t)k;
        else if (k == 0) {
            errno = 0;
            return -1;
        } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        else if (errno != EINTR && !rdzv_ready(fd, out ? POLLOUT : POLLIN, deadline)) return -2;
    }
    return 0;
}

static void rdzv_message(RdzvMessage* m, uint32_t rank_or_status, int world, size_t bytes, const char* job) {
    memset(m, 0, sizeof(*m));
    m->magic = htonl(RDZV_MAGIC);
    m->version = htonl(RDZV_VERSION);
    m->rank_or_status = htonl(rank_or_status);
    m->world = htonl((uint32_t)world);
    m->bytes = htonl((uint32_t)bytes);
    memcpy(m->job, job, strnlen(job, RDZV_JOB_CHARS - 1));  // (zero-padded by the memset)
}

// a job identity from the wire, printable for a message ("" shows as "none")
static const char* rdzv_job_text(const char* job, char* out) {
    size_t i = 0;
    for (; i < RDZV_JOB_CHARS - 1 && job[i]; i++) out[i] = job[i] >= 32 && job[i] < 127 ? job[i] : '?';
    out[i] = 0;
    return i ? out : "none";
}

// ----------------------------------------------------------------------------------------------------
// every rank but 0: connect, say hello, receive the answer and the blob

// Linux connects a socket to itself when nothing listens on a local port of the ephemeral range and the
// kernel happens to pick that port as the source: that is no rank 0
static int rdzv_self_connected(int fd) {
    struct sockaddr_storage a, b;
    socklen_t la = sizeof(a), lb = sizeof(b);
    return getsockname(fd, (struct sockaddr*)&a, &la) == 0 && getpeername(fd, (struct sockaddr*)&b, &lb) == 0 &&
           la == lb && memcmp(&a, &b, la) == 0;
}

// One round of attempts on every address of host:port, each at most 5 s (a firewall may drop them
// silently): a connected socket, or -1 with why filled in (and *hopeless set when the name does not
// resolve, which retrying would not change).
static int rdzv_connect_once(const char* host, const char* port, double deadline, char* why, size_t n, int* hopeless) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g != 0) {
        snprintf(why, n, "%s", gai_strerror(g));
        *hopeless = g != EAI_AGAIN;
        return -1;
    }
    int fd = -1;
    for (struct addrinfo* a = res; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        int e = fd < 0 || rdzv_prepare(fd) != 0 ? errno : connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
        if (e == EINPROGRESS || e == EINTR) {  // the connection goes on: wait for its outcome
            socklen_t len = sizeof(e);
            double attempt = wall_seconds() + 5.0;
            if (!rdzv_ready(fd, POLLOUT, deadline > 0 && deadline < attempt ? deadline : attempt)) e = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
        }
        if (e == 0 && rdzv_self_connected(fd)) e = ECONNREFUSED;
        if (e != 0 && fd >= 0) close(fd);
        if (e != 0) {
            snprintf(why, n, "%s", strerror(e));
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

static int rdzv_check_answer(const RdzvMessage* a, const char* at, int rank, int world, size_t bytes, const char* job,
                             char* err, size_t n) {
    char why[400], theirs[RDZV_JOB_CHARS], ours[RDZV_JOB_CHARS];
    uint32_t status = ntohl(a->rank_or_status);
    if (ntohl(a->magic) != RDZV_MAGIC)
        return rdzv_fail(err, n,
                         "rank %d: %s answered, but not as rank 0 of this trainer (another program uses the port)",
                         rank, at);
    if (status == RDZV_OK) return 0;
    const size_t w = sizeof(why);
    if (status == RDZV_BAD_VERSION)
        snprintf(why, w, "it speaks rendezvous version %u, this rank %u (another build)",
                 ntohl(a->version), RDZV_VERSION);
    else if (status == RDZV_BAD_WORLD)
        snprintf(why, w, "its world size is %u, this rank's %d (ranks of different launches)", ntohl(a->world), world);
    else if (status == RDZV_BAD_JOB)
        snprintf(why, w, "it belongs to job '%s', this rank to '%s' (another job uses the port)",
                 rdzv_job_text(a->job, theirs), rdzv_job_text(job, ours));
    else if (status == RDZV_BAD_BYTES)
        snprintf(why, w, "it hands out %u bytes, this rank expects %zu (another build)", ntohl(a->bytes), bytes);
    else if (status == RDZV_BAD_RANK) snprintf(why, w, "a rank %d has joined already (two ranks with one RANK?)", rank);
    else snprintf(why, w, "status %u", status);
    return rdzv_fail(err, n, "rank %d: rank 0 at %s refused this rank: %s", rank, at, why);
}

static int rdzv_join(const char* host, int port, int rank, int world, const char* job, void* blob, size_t bytes,
                     double timeout_s, double deadline, char* err, size_t n) {
    char port_text[16], at[300], why[256] = "";
    snprintf(port_text, sizeof(port_text), "%d", port);
    snprintf(at, sizeof(at), "%s:%d", host, port);
    int hopeless = 0, fd;
    while ((fd = rdzv_connect_once(host, port_text, deadline, why, sizeof(why), &hopeless)) < 0) {
        if (hopeless)
            return rdzv_fail(err, n, "rank %d: cannot find rank 0's host '%s' (MASTER_ADDR): %s", rank, host, why);
        if (rdzv_expired(deadline))
            return rdzv_fail(err, n, "rank %d: rank 0 did not answer at %s within %.0f s (--comm-timeout; is it "
                             "running? last attempt: %s)", rank, at, timeout_s, why);
        usleep(100000);  // rank 0 may start later than this rank
    }
    RdzvMessage m;
    rdzv_message(&m, (uint32_t)rank, world, bytes, job);
    int r = rdzv_transfer(fd, &m, sizeof(m), 1, deadline);  // then the answer into m, its magic first: a program
    if (r == 0) r = rdzv_transfer(fd, &m, sizeof(m.magic), 0, deadline);  // that is no trainer is named as such at once
    if (r == 0 && ntohl(m.magic) == RDZV_MAGIC)
        r = rdzv_transfer(fd, &m.version, sizeof(m) - sizeof(m.magic), 0, deadline);
    if (r == 0 && (r = rdzv_check_answer(&m, at, rank, world, bytes, job, err, n)) != 0) r = -3;
    if (r == 0) r = rdzv_transfer(fd, blob, bytes, 0, deadline);
    int e = errno;
    close(fd);
    if (r == -1)
        return rdzv_fail(err, n, "rank %d: %s closed the connection before this rank had the id (%s; did rank 0 end?)",
                         rank, at, e ? strerror(e) : "end of stream");
    if (r == -2)
        return rdzv_fail(err, n, "rank %d: %s did not complete the exchange within %.0f s (--comm-timeout; is "
                         "something else listening there?)", rank, at, timeout_s);
    return r == 0 ? 0 : -1;
}

// ----------------------------------------------------------------------------------------------------
// rank 0: listen, and serve every connection at once until each rank holds the blob

typedef struct {
    int fd;
    size_t got, sent;  // bytes of the hello received; bytes of the answer (and then the blob) sent
    int answering;     // the hello is complete and judged: sending the answer
    int rank;          // the rank it joins as once accepted; -1 while unknown or refused
    RdzvMessage hello, answer;
} RdzvPeer;

typedef struct {
    int world;  // and the job identity, blob and bytes: those of rendezvous_broadcast
    const char* job;
    const void* blob;
    size_t bytes;
    RdzvPeer* peers;  // the connections being served
    int npeers, cap;
    char* joined;     // (world) 1 once the rank was accepted (its blob on the way), 2 once it was sent
    int served;       // ranks that hold the blob, rank 0 included
    char note[300];   // the last connection that went wrong, for the message at the deadline
} RdzvServer;

// rank 0's socket on every interface: IPv6 with IPv4 mapped in, or IPv4 where the host has no IPv6
static int rdzv_listen(int port, char* err, size_t n) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0), v6 = fd >= 0, one = 1, zero = 0;
    if (!v6) fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return rdzv_fail(err, n, "rank 0: cannot open a socket: %s", strerror(errno));
    union { struct sockaddr_in6 v6; struct sockaddr_in v4; } any;  // the address "any" is all zeros in both
    memset(&any, 0, sizeof(any));
    if (v6) {
        any.v6.sin6_family = AF_INET6;
        any.v6.sin6_port = htons((uint16_t)port);
    } else {
        any.v4.sin_family = AF_INET;
        any.v4.sin_port = htons((uint16_t)port);
    }
    // an earlier run's closed connections do not hold the port
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (v6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    socklen_t len = v6 ? sizeof(any.v6) : sizeof(any.v4);
    if (rdzv_prepare(fd) != 0 || bind(fd, (struct sockaddr*)&any, len) != 0 || listen(fd, SOMAXCONN) != 0) {
        int e = errno;
        close(fd);
        if (e == EADDRINUSE)
            return rdzv_fail(err, n, "rank 0: port %d is already in use: another job or program listens there "
                             "(choose another MASTER_PORT)", port);
        return rdzv_fail(err, n, "rank 0: cannot listen on port %d: %s", port, strerror(e));
    }
    return fd;
}

// a complete hello: accepted (answer RDZV_OK, the rank reserved) or refused (the answer says why)
static void rdzv_judge(RdzvServer* s, RdzvPeer* p) {
    const RdzvMessage* h = &p->hello;
    int rank = (int)ntohl(h->rank_or_status);
    uint32_t status = RDZV_OK;
    char job[RDZV_JOB_CHARS];
    if (ntohl(h->version) != RDZV_VERSION) status = RDZV_BAD_VERSION;
    else if ((int)ntohl(h->world) != s->world) status = RDZV_BAD_WORLD;
    else if (strncmp(h->job, s->job, RDZV_JOB_CHARS - 1) != 0) status = RDZV_BAD_JOB;
    else if (ntohl(h->bytes) != s->bytes) status = RDZV_BAD_BYTES;
    else if (rank < 1 || rank >= s->world || s->joined[rank]) status = RDZV_BAD_RANK;
    static const char* what[] = {"", "another rendezvous version", "another world size", "another job",
                                 "another blob size", "a rank taken or out of range"};
    if (status != RDZV_OK)
        snprintf(s->note, sizeof(s->note), "refused a rank %d with %s (its world size %u, job '%s')", rank,
                 what[status], ntohl(h->world), rdzv_job_text(h->job, job));
    else {
        s->joined[rank] = 1;
        p->rank = rank;
    }
    rdzv_message(&p->answer, status, s->world, s->bytes, s->job);
    p->answering = 1;
}

// One step of serving connection p, when poll says it is ready; 1 when done with it (close it).
static int rdzv_serve_peer(RdzvServer* s, RdzvPeer* p) {
    if (!p->answering) {  // receiving the hello
        ssize_t k = recv(p->fd, (char*)&p->hello + p->got, sizeof(p->hello) - p->got, 0);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
        if (k <= 0) {
            snprintf(s->note, sizeof(s->note), "a connection closed after %zu of the hello's %zu bytes", p->got,
                     sizeof(p->hello));
            return 1;
        }
        p->got += (size_t)k;
        if (p->got >= sizeof(uint32_t) && ntohl(p->hello.magic) != RDZV_MAGIC) {
            snprintf(s->note, sizeof(s->note), "a connection that is not a rank of this trainer (no rendezvous magic)");
            return 1;
        }
        if (p->got == sizeof(p->hello)) rdzv_judge(s, p);
        return 0;
    }
    size_t head = sizeof(p->answer), total = head + (p->rank > 0 ? s->bytes : 0);  // the answer, then the blob
    const char* from = p->sent < head ? (const char*)&p->answer + p->sent : (const char*)s->blob + (p->sent - head);
    ssize_t k = send(p->fd, from, (p->sent < head ? head : total) - p->sent, MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (k < 0 && p->rank > 0) {  // (it may come again)
        snprintf(s->note, sizeof(s->note), "rank %d closed its connection before it had the id", p->rank);
        s->joined[p->rank] = 0;
    }
    if (k < 0) return 1;
    p->sent += (size_t)k;
    if (p->sent < total) return 0;
    if (p->rank > 0) {
        s->joined[p->rank] = 2;
        s->served++;
    }
    return 1;
}

static void rdzv_accept(RdzvServer* s, int listener) {
    for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd >= 0 && rdzv_prepare(fd) != 0) {  // (try the next one)
            close(fd);
            fd = -1;
            errno = EINTR;
        }
        if (fd < 0 && (errno == EINTR || errno == ECONNABORTED)) continue;
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) usleep(10000);  // out of descriptors: the others finish first
            return;
        }
        if (s->npeers == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 16;
            s->peers = (RdzvPeer*)realloc_check(s->peers, (size_t)s->cap * sizeof(RdzvPeer));
        }
        RdzvPeer* p = &s->peers[s->npeers++];
        memset(p, 0, sizeof(*p));
        p->fd = fd;
        p->rank = -1;
    }
}

// 0 once every rank holds the blob; -1 at the deadline
static int rdzv_serve(RdzvServer* s, int listener, double deadline) {
    struct pollfd* pf = NULL;
    int pf_cap = 0;
    while (s->served < s->world && !rdzv_expired(deadline)) {
        if (pf_cap < s->npeers + 1) {
            pf_cap = 2 * (s->npeers + 1);
            pf = (struct pollfd*)realloc_check(pf, (size_t)pf_cap * sizeof(struct pollfd));
        }
        pf[0] = {.fd = listener, .events = POLLIN, .revents = 0};
        for (int i = 0; i < s->npeers; i++)
            pf[i + 1] = {.fd = s->peers[i].fd, .events = (short)(s->peers[i].answering ? POLLOUT : POLLIN),
                         .revents = 0};
        if (poll(pf, (nfds_t)(s->npeers + 1), rdzv_poll_ms(deadline)) <= 0) continue;
        for (int i = s->npeers - 1; i >= 0; i--) {  // from the end: a finished one is replaced by the last
            if (pf[i + 1].revents == 0 || !rdzv_serve_peer(s, &s->peers[i])) continue;
            close(s->peers[i].fd);
            s->peers[i] = s->peers[--s->npeers];
        }
        if (pf[0].revents) rdzv_accept(s, listener);
    }
    free(pf);
    return s->served == s->world ? 0 : -1;
}

// rank 0's line at the deadline: which ranks never got the blob, and what went wrong last
static void rdzv_missing(const RdzvServer* s, int port, double timeout_s, char* err, size_t n) {
    char list[200] = "";
    int listed = 0, missing = s->world - s->served;
    for (int r = 1; r < s->world && listed < 8; r++)
        if (s->joined[r] != 2)
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%d", listed++ ? ", " : "", r);
    if (missing > listed) snprintf(list + strlen(list), sizeof(list) - strlen(list), " and %d more", missing - listed);
    rdzv_fail(err, n,
              "rank 0: %d of %d ranks did not get the id at port %d within %.0f s (--comm-timeout; missing: %s%s%s)",
              missing, s->world - 1, port, timeout_s, list, s->note[0] ? "; " : "", s->note);
}

// Rank 0 hands blob (bytes) to every rank; the others receive it into blob. job: the launch's identity,
// the same on every rank of one job. timeout_s: the deadline of the whole exchange (0: none).
static int rendezvous_broadcast(const char* host, int port, int rank, int world, const char* job, void* blob,
                                size_t bytes, double timeout_s, char* err, size_t n) {
    double deadline = timeout_s > 0 ? wall_seconds() + timeout_s : 0;
    if (world <= 1) return 0;
    if (rank != 0) return rdzv_join(host, port, rank, world, job, blob, bytes, timeout_s, deadline, err, n);
    int listener = rdzv_listen(port, err, n);
    if (listener < 0) return -1;
    RdzvServer s = {};
    s.world = world;
    s.job = job;
    s.blob = blob;
    s.bytes = bytes;
    s.served = 1;
    s.joined = (char*)calloc_check((size_t)world);
    int r = rdzv_serve(&s, listener, deadline);
    if (r != 0) rdzv_missing(&s, port, timeout_s, err, n);
    for (int i = 0; i < s.npeers; i++) close(s.peers[i].fd);  // connections that were no rank of this job
    close(listener);
    free(s.peers);
    free(s.joined);
    return r;
}

// ----------------------------------------------------------------------------------------------------
// the launch's environment

// The launch's identity as its launcher names it: torchrun's run id, or Slurm's job and step; "" if none.
// Then torchrun's restart count: the workers of a restarted attempt keep the run id, and what an earlier
// attempt left behind (its NCCL id file, a rank still knocking at the port) must not pass for theirs.
static void launch_identity(char* out, size_t n) {
    const char* run = getenv("TORCHELASTIC_RUN_ID");
    const char *job = getenv("SLURM_JOB_ID"),
               *step = getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : getenv("SLURM_STEPID");
    const char* restart = getenv("TORCHELASTIC_RESTART_COUNT");
    out[0] = 0;
    if (run && strcmp(run, "none") != 0) snprintf(out, n, "%s", run);
    else if (job && step) snprintf(out, n, "%s.%s", job, step);
    if (restart && restart[0]) snprintf(out + strlen(out), n - strlen(out), "%srestart %s", out[0] ? " " : "", restart);
}

// The exchange as torchrun launches it: at MASTER_ADDR:MASTER_PORT, within the launch's identity (with
// torchrun's restart count: a rank left from an earlier attempt is refused). Under torchrun's static
// rendezvous (the one --master-addr/--master-port give) torchrun's own agent already listens on
// MASTER_PORT on rank 0's node, and says so with TORCHELASTIC_USE_AGENT_STORE=True: then the exchange
// uses the next port, MASTER_PORT + 1.
static int rendezvous_from_env(int rank, int world, void* blob, size_t bytes, double timeout_s, char* err, size_t n) {
    const char *host = getenv("MASTER_ADDR"), *port_text = getenv("MASTER_PORT"),
               *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    char* end = NULL;
    long port = port_text ? strtol(port_text, &end, 10) : 0;
    int shift = agent != NULL && strcmp(agent, "True") == 0;
    if (host == NULL || !host[0] || port_text == NULL || *end || port < 1 || port + shift > 65535)
        return rdzv_fail(err, n, "MASTER_ADDR '%s' and MASTER_PORT '%s' name no host and port%s", host ? host : "",
                         port_text ? port_text : "", shift ? " (MASTER_PORT + 1 is used under torchrun)" : "");
    char job[RDZV_JOB_CHARS];
    launch_identity(job, sizeof(job));
    int r = rendezvous_broadcast(host, (int)port + shift, rank, world, job, blob, bytes, timeout_s, err, n);
    if (r != 0 && shift)
        snprintf(err + strlen(err), n - strlen(err), " [MASTER_PORT + 1: torchrun's agent holds MASTER_PORT]");
    return r;
}
