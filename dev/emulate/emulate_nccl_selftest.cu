/*
 * emulate_nccl_selftest.cu: the emulated NCCL (emulate_nccl.h) keeps NCCL's contract with streams. Each
 * case runs in two processes (this program forks them) on one emulated communicator of two ranks:
 *   exchange    a grouped send and receive each way, then an all-reduce: the right values
 *   late-send   rank 0 writes its send buffer after ncclSend and before waiting for the stream: rank 1
 *               receives the later value (a queued operation reads its buffer when its stream runs it)
 *   early-read  rank 1 reads its receive buffer before waiting for the stream: the old value is there
 *               (and the received one after the wait)
 *   deadlock    each rank sends, then receives, outside a group: each send waits for a receive the peer
 *               never reaches, so both end (EMU_NCCL_TIMEOUT=2) with a line naming the deadlock
 *   mismatch    rank 0 calls an all-reduce where rank 1 calls a broadcast: a line naming both, exit 1
 * The first three would also pass on a real GPU; late-send and early-read are races there (results may
 * go either way), which the emulation resolves to the later reading, so that a program with such a race
 * gives wrong results in the emulated suites. The last two fail on a GPU too (a hang, an undefined result).
 * Built and run by `make -C dev/emulate selftest` where nccl.h is found.
 * usage: emulate_nccl_selftest [case]   (default: every case; exit 0 when each behaves as stated)
 */
#include <sys/wait.h>

#include <string>

static const int N = 4;  // floats per buffer

static void check(bool ok, const char* what, int rank) {
    if (ok) return;
    fprintf(stderr, "rank %d: %s\n", rank, what);
    exit(2);
}
static void fill(float* dev, float v) {
    float host[N];
    for (int i = 0; i < N; i++) host[i] = v;
    cudaMemcpy(dev, host, sizeof(host), cudaMemcpyHostToDevice);
}
static bool holds(const float* dev, float v) {
    float host[N];
    cudaMemcpy(host, dev, sizeof(host), cudaMemcpyDeviceToHost);
    for (int i = 0; i < N; i++)
        if (host[i] != v) return false;
    return true;
}

// one rank of one case; returns its exit code (the emulation itself exits 1 on a deadlock or mismatch)
static int run_rank(const std::string& which, int rank, ncclUniqueId id) {
    ncclComm_t comm;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    check(ncclCommInitRankConfig(&comm, 2, id, rank, &config) == ncclSuccess, "ncclCommInitRankConfig failed", rank);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *send, *recv;
    cudaMalloc((void**)&send, N * sizeof(float));
    cudaMalloc((void**)&recv, N * sizeof(float));
    int peer = 1 - rank;
    if (which == "exchange") {
        fill(send, rank + 1.0f), fill(recv, -1.0f);
        ncclGroupStart();
        ncclSend(send, N, ncclFloat, peer, comm, s);
        ncclRecv(recv, N, ncclFloat, peer, comm, s);
        ncclGroupEnd();
        cudaStreamSynchronize(s);
        check(holds(recv, peer + 1.0f), "exchange: the peer's values did not arrive", rank);
        ncclAllReduce(send, send, N, ncclFloat, ncclSum, comm, s);
        cudaStreamSynchronize(s);
        check(holds(send, 3.0f), "exchange: the all-reduce's sum is wrong", rank);
    } else if (which == "late-send") {
        if (rank == 0) {
            fill(send, 1.0f);
            ncclSend(send, N, ncclFloat, peer, comm, s);
            fill(send, 2.0f);  // the race: the send has not run yet
        } else {
            ncclRecv(recv, N, ncclFloat, peer, comm, s);
        }
        cudaStreamSynchronize(s);
        if (rank == 1) check(holds(recv, 2.0f), "late-send: the send read its buffer at the call, not when its stream ran it", rank);
    } else if (which == "early-read") {
        if (rank == 0) {
            fill(send, 5.0f);
            ncclSend(send, N, ncclFloat, peer, comm, s);
        } else {
            fill(recv, -1.0f);
            ncclRecv(recv, N, ncclFloat, peer, comm, s);
            check(holds(recv, -1.0f), "early-read: the receive wrote its buffer before its stream was waited for", rank);
        }
        cudaStreamSynchronize(s);
        if (rank == 1) check(holds(recv, 5.0f), "early-read: the value never arrived", rank);
    } else if (which == "deadlock") {
        ncclSend(send, N, ncclFloat, peer, comm, s);
        ncclRecv(recv, N, ncclFloat, peer, comm, s);
        cudaStreamSynchronize(s);  // (the emulation ends the process here)
    } else if (which == "mismatch") {
        if (rank == 0) ncclAllReduce(send, send, N, ncclFloat, ncclSum, comm, s);
        else ncclAllGather(send, recv, N / 2, ncclFloat, comm, s);
        cudaStreamSynchronize(s);
    }
    ncclCommFinalize(comm);
    ncclCommDestroy(comm);
    return 0;
}

// Runs a case in two processes; `fails`: the case must end both with exit 1 and a stderr line holding
// `words`, else both must exit 0.
static bool run_case(const std::string& which, bool fails, const char* words) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    pid_t pids[2];
    char err[2][64];
    fflush(stdout);  // (else the children inherit what is buffered and print it again)
    for (int r = 0; r < 2; r++) {
        snprintf(err[r], sizeof(err[r]), "/tmp/emulate_nccl_selftest.%d.%d", (int)getpid(), r);
        if ((pids[r] = fork()) == 0) {
            if (freopen(err[r], "w", stderr) == NULL) _exit(3);
            exit(run_rank(which, r, id));
        }
    }
    bool ok = true;
    for (int r = 0; r < 2; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
        std::string text;
        if (FILE* f = fopen(err[r], "r")) {
            char line[2048];
            while (fgets(line, sizeof(line), f)) text += line;
            fclose(f);
        }
        remove(err[r]);
        bool as_stated = fails ? code == 1 && text.find(words) != std::string::npos : code == 0;
        if (!as_stated) printf("  rank %d: exit %d, stderr: %s", r, code, text.empty() ? "(none)\n" : text.c_str());
        else if (fails && r == 0) printf("  rank 0 ended as expected: %s", text.c_str());
        ok &= as_stated;
    }
    printf("%-10s %s\n", which.c_str(), ok ? "PASS" : "FAIL");
    return ok;
}

int main(int argc, char** argv) {
    setenv("EMU_NCCL_TIMEOUT", "2", 1);  // the deadlock's wait; the other cases complete at once
    struct Case {
        const char* name;
        bool fails;
        const char* words;
    } cases[] = {{"exchange", false, ""},
                 {"late-send", false, ""},
                 {"early-read", false, ""},
                 {"deadlock", true, "deadlock: cudaStreamSynchronize waited"},
                 {"mismatch", true, "an all-gather"}};
    int failed = 0, ran = 0;
    for (const Case& c : cases) {
        if (argc > 1 && std::string(argv[1]) != c.name) continue;
        ran++;
        if (!run_case(c.name, c.fails, c.words)) failed++;
    }
    if (ran == 0) {
        fprintf(stderr, "usage: emulate_nccl_selftest [exchange|late-send|early-read|deadlock|mismatch]\n");
        return 1;
    }
    printf(failed ? "emulate_nccl_selftest: %d case(s) FAILED\n" : "emulate_nccl_selftest: all cases behaved as stated\n", failed);
    return failed ? 1 : 0;
}
