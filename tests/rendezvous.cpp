/*
 * rendezvous.cpp: checks llmc/comm/rendezvous.h, the exchange of the NCCL id over TCP, with real
 * processes on this machine (127.0.0.1). Each case forks the ranks (and, where the case needs one, a
 * process that plays a stranger: a dead peer, a program that is no trainer, torchrun's agent), waits for
 * them and checks what each one printed and how it ended:
 *   exchange     8 ranks, rank 0 starting last: every rank holds rank 0's random blob, byte for byte,
 *                and rank 0 has closed its listening socket when it returns
 *   big-blob     4 MiB through 3 ranks (many partial reads and writes)
 *   strangers    a connection that stays silent, one that dies halfway through its hello and one that
 *                speaks another protocol come first: the real ranks still get the blob
 *   env          rendezvous_from_env: on MASTER_PORT, and on MASTER_PORT + 1 while "torchrun's agent"
 *                holds MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True)
 * and the failures, each one error line within the deadline (4 s), never a hang nor a signal:
 *   no-rank0     rank 0 never starts
 *   world        a rank with another world size (refused at once; rank 0 names it at its deadline)
 *   job          a rank of another job
 *   port-in-use  rank 0's port is taken
 *   not-trainer  the port belongs to a program that is no trainer
 *   peer-dies    a rank dies halfway through its hello; another dies while the blob is being sent
 *   rank0-dies   rank 0 closes the connection before sending the id
 * Usage: test_rendezvous CASE (tests/rendezvous.sh runs each under timeout). Exit 0 when it passed.
 * By hand, under a launcher: `torchrun --nproc_per_node 4 --no_python build/cpu/test_rendezvous
 * launched-rank` makes each process one rank of an exchange, printing a hash of the bytes it holds.
 */
#include "../llmc/comm/rendezvous.h"
#include <functional>
#include <signal.h>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <vector>

// the rendezvous deadline of the failure cases (seconds); a case that must fail at once may take half of
// it (a loaded CI machine can delay a child's start by a second), one that must wait it out 3 s more
static const double DEADLINE = 4.0, AT_ONCE = DEADLINE / 2, WAITED = DEADLINE + 3.0;
static int failures = 0;

static void expect(bool ok, const std::string& what, const std::string& detail = "") {
    printf("  %s  %s%s%s\n", ok ? "ok  " : "FAIL", what.c_str(), ok || detail.empty() ? "" : ": ", ok ? "" : detail.c_str());
    failures += !ok;
}

// a process of the case: its exit, what it wrote to stderr, how long it ran
struct Proc {
    pid_t pid;
    int err_fd;
    double start, secs;
    int status;
    std::string err;
};

static Proc spawn(const std::function<int()>& body) {
    int fds[2];
    if (pipe(fds) != 0) fatal("pipe: %s", strerror(errno));
    fflush(stdout), fflush(stderr);
    Proc p = {fork(), fds[0], wall_seconds(), 0, 0, ""};
    if (p.pid < 0) fatal("fork: %s", strerror(errno));
    if (p.pid == 0) {
        dup2(fds[1], 2), close(fds[0]), close(fds[1]);
        alarm(15);  // a hang ends in SIGALRM, which the checks report
        fflush(stdout);
        _exit(body());
    }
    close(fds[1]);
    return p;
}

static void finish(Proc& p) {
    waitpid(p.pid, &p.status, 0);
    p.secs = wall_seconds() - p.start;
    char buf[4096];
    ssize_t k;
    while ((k = read(p.err_fd, buf, sizeof(buf))) > 0) p.err.append(buf, (size_t)k);
    close(p.err_fd);
}

static std::string ended(const Proc& p) {  // how it ended, for a failed check
    char s[200];
    if (WIFSIGNALED(p.status)) snprintf(s, sizeof(s), "killed by signal %d after %.1f s", WTERMSIG(p.status), p.secs);
    else snprintf(s, sizeof(s), "exit %d after %.1f s", WEXITSTATUS(p.status), p.secs);
    return std::string(s) + (p.err.empty() ? "" : ", stderr: " + p.err);
}

// p succeeded silently
static void expect_ok(const Proc& p, const std::string& who) {
    expect(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0 && p.err.empty(), who + " succeeds", ended(p));
}

// p failed with exactly one error line that contains `text`, within the deadline (plus a margin)
static void expect_error(const Proc& p, const std::string& who, const std::string& text, double within) {
    bool one_line = p.err.rfind("error: ", 0) == 0 && p.err.find('\n') == p.err.size() - 1;
    bool ok = WIFEXITED(p.status) && WEXITSTATUS(p.status) == 1 && one_line && p.err.find(text) != std::string::npos && p.secs < within;
    std::string line = one_line ? p.err.substr(0, p.err.size() - 1) : "";
    expect(ok, who + " fails in one line within " + std::to_string((int)within) + " s" + (ok ? ": " + line : ""),
           ended(p) + " (wanted: '" + text + "')");
}

// ----------------------------------------------------------------------------------------------------
// sockets of the test itself

static int port_free(int port) {  // as rank 0 binds it: IPv4 "any", which a dual-stack listener holds too
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET, a.sin_port = htons((uint16_t)port);
    int ok = bind(fd, (struct sockaddr*)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

// a random port with `count` free ones from it, below Linux's ephemeral range (where the test's own
// outgoing connections take their ports)
static int pick_port(int count) {
    srand((unsigned)(getpid() ^ (int)(wall_seconds() * 1000)));
    for (;;) {
        int port = 20000 + rand() % 10000, all = 1;
        for (int i = 0; i < count; i++) all &= port_free(port + i);
        if (all) return port;
    }
}

static int listen_on(int port) {  // a listening socket of a program that is not rank 0
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET, a.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr*)&a, sizeof(a)) != 0 || listen(fd, 16) != 0) fatal("cannot listen on %d: %s", port, strerror(errno));
    return fd;
}

static int connect_to(int port) {  // a blocking connection to 127.0.0.1:port (the strangers)
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET, a.sin_port = htons((uint16_t)port), a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr*)&a, sizeof(a)) != 0) fatal("cannot connect to %d: %s", port, strerror(errno));
    return fd;
}

static void wait_listening(int port) {  // until someone listens on port (without connecting to it)
    double start = wall_seconds();
    while (port_free(port))
        if (wall_seconds() - start > 5) fatal("nobody listens on port %d after 5 s", port);
        else usleep(10000);
}

// ----------------------------------------------------------------------------------------------------
// ranks

// one rank; blob: this rank's slot of memory shared with the test (rank 0's holds what it hands out)
static int rank_main(int port, int rank, int world, const char* job, unsigned char* blob, size_t bytes, double timeout_s) {
    char err[1024];
    if (rendezvous_broadcast("127.0.0.1", port, rank, world, job, blob, bytes, timeout_s, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    if (rank == 0 && !port_free(port)) {  // its listening socket must be closed by now
        fprintf(stderr, "rank 0 still holds port %d after the exchange\n", port);
        return 2;
    }
    return 0;
}

static Proc spawn_rank(int port, int rank, int world, const char* job, unsigned char* blob, size_t bytes, double timeout_s, int delay_ms = 0) {
    return spawn([=] {
        usleep((useconds_t)delay_ms * 1000);
        return rank_main(port, rank, world, job, blob, bytes, timeout_s);
    });
}

// world slots of `bytes`, shared with the children: rank 0's random, the others zero
static unsigned char* shared_blobs(int world, size_t bytes) {
    void* m = mmap(NULL, (size_t)world * bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fatal("mmap: %s", strerror(errno));
    unsigned char* blobs = (unsigned char*)m;
    Rng rng = {(uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(wall_seconds() * 1e6)};
    for (size_t i = 0; i < bytes; i++) blobs[i] = (unsigned char)rng_next_u64(&rng);
    return blobs;
}

// all ranks of a world succeed and hold rank 0's blob
static void exchange(int world, size_t bytes, int rank0_delay_ms, const std::string& name) {
    int port = pick_port(1);
    unsigned char* blobs = shared_blobs(world, bytes);
    std::vector<Proc> ranks;
    for (int r = 0; r < world; r++) ranks.push_back(spawn_rank(port, r, world, "job", blobs + r * bytes, bytes, 30, r == 0 ? rank0_delay_ms : 0));
    for (Proc& p : ranks) finish(p);
    int exact = 0;
    for (int r = 0; r < world; r++) {
        expect_ok(ranks[r], name + ": rank " + std::to_string(r));
        exact += memcmp(blobs, blobs + r * bytes, bytes) == 0;
    }
    expect(exact == world, name + ": every rank holds rank 0's " + std::to_string(bytes) + " random bytes exactly",
           std::to_string(world - exact) + " differ");
    munmap(blobs, (size_t)world * bytes);
}

// ----------------------------------------------------------------------------------------------------
// the cases

static void case_strangers(void) {
    int port = pick_port(1), world = 3;
    size_t bytes = 128;
    unsigned char* blobs = shared_blobs(world, bytes);
    Proc r0 = spawn_rank(port, 0, world, "job", blobs, bytes, 30);
    wait_listening(port);
    int silent = connect_to(port);  // stays open and says nothing until the end
    Proc half = spawn([=] {         // half a hello, then gone
        RdzvMessage m;
        rdzv_message(&m, 2, world, bytes, "job");
        int fd = connect_to(port);
        return write(fd, &m, sizeof(m) / 2) > 0 ? 0 : 1;
    });
    Proc other = spawn([=] {  // another protocol
        const char* get = "GET / HTTP/1.0\r\n\r\n";
        int fd = connect_to(port);
        return write(fd, get, strlen(get)) > 0 ? 0 : 1;
    });
    finish(half), finish(other);
    Proc r1 = spawn_rank(port, 1, world, "job", blobs + bytes, bytes, 30), r2 = spawn_rank(port, 2, world, "job", blobs + 2 * bytes, bytes, 30);
    finish(r0), finish(r1), finish(r2);
    close(silent);
    expect_ok(r0, "strangers: rank 0"), expect_ok(r1, "strangers: rank 1"), expect_ok(r2, "strangers: rank 2");
    expect(!memcmp(blobs, blobs + bytes, bytes) && !memcmp(blobs, blobs + 2 * bytes, bytes), "strangers: ranks 1 and 2 hold the blob");
}

static void case_env(void) {
    for (int agent = 1; agent >= 0; agent--) {
        int port = pick_port(2), world = 2;
        size_t bytes = 128;
        unsigned char* blobs = shared_blobs(world, bytes);
        int agent_fd = agent ? listen_on(port) : -1;  // torchrun's agent and its store
        std::vector<Proc> ranks;
        for (int r = 0; r < world; r++)
            ranks.push_back(spawn([=] {
                char port_text[16], err[1024];
                snprintf(port_text, sizeof(port_text), "%d", port);
                setenv("MASTER_ADDR", "localhost", 1), setenv("MASTER_PORT", port_text, 1), setenv("TORCHELASTIC_RUN_ID", "run7", 1);
                if (agent) setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
                if (rendezvous_from_env(r, world, blobs + r * bytes, bytes, 30, err, sizeof(err)) == 0) return 0;
                fprintf(stderr, "error: %s\n", err);
                return 1;
            }));
        for (Proc& p : ranks) finish(p);
        std::string name = agent ? "env: MASTER_PORT + 1 beside torchrun's agent" : "env: MASTER_PORT";
        expect_ok(ranks[0], name + ", rank 0"), expect_ok(ranks[1], name + ", rank 1");
        expect(!memcmp(blobs, blobs + bytes, bytes), name + ": rank 1 holds the blob");
        if (agent_fd >= 0) close(agent_fd);
    }
}

static void case_no_rank0(void) {
    int port = pick_port(1);
    unsigned char blob[128];
    Proc r1 = spawn_rank(port, 1, 2, "job", blob, sizeof(blob), DEADLINE);
    finish(r1);
    expect_error(r1, "no-rank0: rank 1", "rank 0 did not answer at 127.0.0.1:" + std::to_string(port) + " within 4 s", WAITED);
    expect(r1.secs >= DEADLINE - 0.05, "no-rank0: rank 1 waited the whole deadline", ended(r1));
}

// rank 1 differs from rank 0 (world size or job): refused at once; rank 0 names the refusal at its deadline
static void case_mismatch(const char* name, int world1, const char* job1, const std::string& rank1_text, const std::string& rank0_text) {
    int port = pick_port(1);
    unsigned char* blobs = shared_blobs(3, 128);
    Proc r0 = spawn_rank(port, 0, 2, "job-a", blobs, 128, DEADLINE);
    Proc r1 = spawn_rank(port, 1, world1, job1, blobs + 128, 128, DEADLINE);
    finish(r1), finish(r0);
    expect_error(r1, std::string(name) + ": rank 1", rank1_text, AT_ONCE);
    expect_error(r0, std::string(name) + ": rank 0", rank0_text, WAITED);
}

static void case_port_in_use(void) {
    int port = pick_port(1), fd = listen_on(port);
    unsigned char blob[128] = {0};
    Proc r0 = spawn_rank(port, 0, 2, "job", blob, sizeof(blob), DEADLINE);
    finish(r0);
    close(fd);
    expect_error(r0, "port-in-use: rank 0", "port " + std::to_string(port) + " is already in use", AT_ONCE);
}

static void case_not_trainer(void) {
    int port = pick_port(1), fd = listen_on(port);
    unsigned char blob[128];
    Proc server = spawn([=] {  // greets every connection like an SSH server, then waits
        for (;;) {
            int c = accept(fd, NULL, NULL);
            if (c >= 0 && write(c, "SSH-2.0-OpenSSH_9.2\r\n", 21) < 0) return 1;
        }
    });
    Proc r1 = spawn_rank(port, 1, 2, "job", blob, sizeof(blob), DEADLINE);
    finish(r1);
    kill(server.pid, SIGKILL), finish(server), close(fd);
    expect_error(r1, "not-trainer: rank 1", "answered, but not as rank 0 of this trainer", AT_ONCE);
}

static void case_peer_dies(void) {
    // a rank that dies halfway through its hello: rank 0 waits on for it, and names it at the deadline
    int port = pick_port(1);
    unsigned char* blobs = shared_blobs(3, 128);
    Proc r0 = spawn_rank(port, 0, 3, "job", blobs, 128, DEADLINE), r1 = spawn_rank(port, 1, 3, "job", blobs + 128, 128, DEADLINE);
    wait_listening(port);
    Proc dying = spawn([=] {
        RdzvMessage m;
        rdzv_message(&m, 2, 3, 128, "job");
        int fd = connect_to(port);
        return write(fd, &m, 20) == 20 ? 0 : 1;
    });
    finish(dying), finish(r1), finish(r0);
    expect_ok(r1, "peer-dies: rank 1");
    expect_error(r0, "peer-dies: rank 0", "missing: 2; a connection closed after 20 of the hello's", WAITED);
    // a rank that dies while 16 MiB of blob are on the way to it: no SIGPIPE for rank 0
    port = pick_port(1);
    size_t big = 16 << 20;
    unsigned char* blob = shared_blobs(1, big);
    r0 = spawn_rank(port, 0, 2, "job", blob, big, DEADLINE);
    wait_listening(port);
    dying = spawn([=] {
        RdzvMessage m;
        rdzv_message(&m, 1, 2, big, "job");
        int fd = connect_to(port);
        char answer[sizeof(m) + 1];
        return write(fd, &m, sizeof(m)) == (ssize_t)sizeof(m) && read(fd, answer, sizeof(answer)) > 0 ? 0 : 1;
    });
    finish(dying), finish(r0);
    expect_error(r0, "peer-dies: rank 0 (blob half sent)", "missing: 1; rank 1 closed its connection before it had the id", WAITED);
}

static void case_rank0_dies(void) {
    int port = pick_port(1), fd = listen_on(port);
    unsigned char blob[128];
    Proc fake0 = spawn([=] {  // reads the hello, then ends
        RdzvMessage m;
        int c = accept(fd, NULL, NULL);
        return read(c, &m, sizeof(m)) > 0 ? 0 : 1;
    });
    close(fd);
    Proc r1 = spawn_rank(port, 1, 2, "job", blob, sizeof(blob), DEADLINE);
    finish(r1), finish(fake0);
    expect_error(r1, "rank0-dies: rank 1", "closed the connection before this rank had the id", AT_ONCE);
}

// one rank as a launcher starts it (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT...): rank 0 hands out random
// bytes, and every rank prints a hash of the bytes it holds, for the script to compare
static int launched_rank(void) {
    const char *rank_text = getenv("RANK"), *world_text = getenv("WORLD_SIZE");
    int rank = rank_text ? atoi(rank_text) : -1, world = world_text ? atoi(world_text) : 0;
    if (rank < 0 || world < 1) fatal("RANK and WORLD_SIZE are not set");
    unsigned char* blob = shared_blobs(1, 128);
    if (rank != 0) memset(blob, 0, 128);
    char err[1024];
    if (rendezvous_from_env(rank, world, blob, 128, 30, err, sizeof(err)) != 0) fatal("%s", err);
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 128; i++) h = (h ^ blob[i]) * 0x100000001b3ull;
    printf("rank %d of %d holds %016llx (MASTER_PORT %s, TORCHELASTIC_USE_AGENT_STORE %s)\n", rank, world, (unsigned long long)h,
           getenv("MASTER_PORT"), getenv("TORCHELASTIC_USE_AGENT_STORE") ? getenv("TORCHELASTIC_USE_AGENT_STORE") : "unset");
    return 0;
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    std::string c = argc > 1 ? argv[1] : "";
    if (c == "exchange") exchange(8, 128, 300, "exchange");
    else if (c == "big-blob") exchange(3, 4 << 20, 0, "big-blob");
    else if (c == "strangers") case_strangers();
    else if (c == "env") case_env();
    else if (c == "no-rank0") case_no_rank0();
    else if (c == "world") case_mismatch("world", 3, "job-a", "its world size is 2, this rank's 3", "missing: 1; refused a rank 1 with another world size");
    else if (c == "job") case_mismatch("job", 2, "job-b", "it belongs to job 'job-a', this rank to 'job-b'", "missing: 1; refused a rank 1 with another job");
    else if (c == "port-in-use") case_port_in_use();
    else if (c == "not-trainer") case_not_trainer();
    else if (c == "peer-dies") case_peer_dies();
    else if (c == "rank0-dies") case_rank0_dies();
    else if (c == "launched-rank") return launched_rank();
    else {
        fprintf(stderr, "usage: %s exchange|big-blob|strangers|env|no-rank0|world|job|port-in-use|not-trainer|peer-dies|rank0-dies\n", argv[0]);
        return 2;
    }
    return failures ? 1 : 0;
}
