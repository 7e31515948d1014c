/*
 * emulate_nccl.h: the NCCL calls of llmc/comm_nccl.h, for the CPU emulation of CUDA (emulate.h includes
 * this file when built with -DEMULATE_NCCL), so that the NCCL engine of an emulated train_gpt runs on a
 * machine without a GPU: its start-up (the id through MPI, a shared folder or TCP), the group splits, every
 * collective and send/receive with the arguments the engine gives them, the non-blocking protocol
 * (ncclInProgress, polled through ncclCommGetAsyncError against the engine's deadline) and finalize.
 *
 * The ranks are processes on one machine. With EMU_DEVICES=N the emulated machine has N GPUs (emulate_
 * runtime.h: each its own UUID), so ranks launched by mpirun take different ones and `--comm auto` picks
 * NCCL; with the default of one GPU they share it and get the MPI engine, as on a real GPU.
 *
 * Transport: files in a folder per communicator under $EMU_NCCL_DIR (default /dev/shm, else /tmp), named
 * after the communicator's key (the unique id's text; a split appends its number and colour). Each file is
 * written whole and renamed into place, so a reader never sees half of one.
 *   collective number s:  every rank writes c<s>.<rank> (its whole send buffer), waits until all n files
 *                         exist, reads them, and computes the result itself, in rank order (so every rank
 *                         gets the same bits, as from NCCL's rings). A rank at collective s knows every rank
 *                         has finished s-2 (each wrote s-1 after reading s-2), so it removes its own s-2 file.
 *   send number k to p:   p<me>to<p>.<k>, which the receiver removes after reading it. Sends never wait for
 *                         their receive (NCCL's may: a send/receive order that deadlocks on a GPU can pass
 *                         here).
 * A call returns ncclSuccess once complete; one that must wait for peers returns ncclInProgress on a
 * non-blocking communicator (config.blocking = 0, as llmc's) and completes in later ncclCommGetAsyncError
 * calls; on a blocking one it waits, at most $EMU_NCCL_TIMEOUT s (default 300). Each communicator has at
 * most one call in progress, as NCCL's non-blocking ones: the engine settles one before the next.
 * Reductions run in double precision and round once. Not modelled: streams (every call has finished in
 * the host's order when it completes), the transport's speed, and the few files the last collective of
 * each communicator leaves in the folder (a test removes $EMU_NCCL_DIR).
 */
#pragma once

#include <nccl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

struct ncclComm {
    std::string key, dir;  // the communicator's name, and its folder
    int rank, size;
    int blocking;
    long collectives = 0;                          // the number of the next collective
    std::vector<long> sends, recvs;                // per peer: the number of the next send to it / receive from it
    int splits = 0;                                // the number of the next split
    std::function<bool()> pending;                 // the call in progress: true once complete
    int aborted = 0;
    ncclResult_t error = ncclSuccess;
};

namespace emu_nccl {

[[noreturn]] inline void fail(const std::string& what) {
    fprintf(stderr, "emulated NCCL, pid %d: %s\n", (int)getpid(), what.c_str());
    exit(1);
}

inline double timeout_s() {
    const char* t = getenv("EMU_NCCL_TIMEOUT");
    return t ? atof(t) : 300.0;
}
inline std::string root_dir() {
    if (const char* d = getenv("EMU_NCCL_DIR")) return d;
    struct stat st;
    return stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
}
inline size_t type_bytes(ncclDataType_t t) {
    switch (t) {
        case ncclFloat: return 4;
        case ncclDouble: return 8;
        case ncclHalf: case ncclBfloat16: return 2;
        default: emu_nccl::fail("a data type llmc does not use");
    }
}
inline double load(const char* p, ncclDataType_t t, size_t i) {
    switch (t) {
        case ncclFloat: return ((const float*)p)[i];
        case ncclDouble: return ((const double*)p)[i];
        case ncclHalf: return __half2float(((const __half*)p)[i]);
        default: return __bfloat162float(((const __nv_bfloat16*)p)[i]);
    }
}
inline void store(void* p, ncclDataType_t t, size_t i, double v) {
    switch (t) {
        case ncclFloat: ((float*)p)[i] = (float)v; break;
        case ncclDouble: ((double*)p)[i] = v; break;
        case ncclHalf: ((__half*)p)[i] = __float2half((float)v); break;
        default: ((__nv_bfloat16*)p)[i] = __float2bfloat16((float)v); break;
    }
}

// a whole file, written under a temporary name and renamed into place
inline void put(const std::string& path, const void* data, size_t bytes) {
    std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (f == NULL || (bytes > 0 && fwrite(data, 1, bytes, f) != bytes) || fclose(f) != 0 || rename(tmp.c_str(), path.c_str()) != 0)
        emu_nccl::fail("cannot write " + path);
}
// the file's bytes, if it is there
inline bool take(const std::string& path, std::vector<char>* out) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == NULL) return false;
    fseek(f, 0, SEEK_END);
    out->resize(ftell(f));
    fseek(f, 0, SEEK_SET);
    size_t got = out->empty() ? 0 : fread(out->data(), 1, out->size(), f);
    fclose(f);
    if (got != out->size()) emu_nccl::fail("cannot read " + path);
    return true;
}

inline ncclComm* make_comm(const std::string& key, int rank, int size, int blocking) {
    ncclComm* c = new ncclComm;
    c->key = key, c->dir = root_dir() + "/" + key, c->rank = rank, c->size = size, c->blocking = blocking;
    c->sends.assign(size, 0), c->recvs.assign(size, 0);
    mkdir(c->dir.c_str(), 0700);  // (every rank tries; all but one find it there)
    return c;
}

// Starts a call: complete now (ncclSuccess), or in progress (ncclInProgress on a non-blocking communicator,
// completed by ncclCommGetAsyncError; a blocking one waits here). `step` returns true once complete.
inline ncclResult_t start(ncclComm* c, std::function<bool()> step) {
    if (c->aborted || c->error != ncclSuccess) return ncclInvalidUsage;
    if (c->pending) emu_nccl::fail("a call on a communicator whose previous call is still in progress");
    if (step()) return ncclSuccess;
    if (!c->blocking) {
        c->pending = step;
        return ncclInProgress;
    }
    auto begun = std::chrono::steady_clock::now();
    while (!step()) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count() > timeout_s())
            emu_nccl::fail("a blocking call waited longer than EMU_NCCL_TIMEOUT for its peers");
        usleep(200);
    }
    return ncclSuccess;
}

// Collective number s: writes this rank's contribution, then (in the step) waits for every rank's and
// hands them, in rank order, to `finish`.
inline ncclResult_t collective(ncclComm* c, const void* data, size_t bytes, std::function<void(std::vector<std::vector<char>>&)> finish) {
    if (c->aborted || c->error != ncclSuccess) return ncclInvalidUsage;
    long s = c->collectives++;
    auto name = [c, s](long seq, int r) { return c->dir + "/c" + std::to_string(seq) + "." + std::to_string(r); };
    if (s >= 2) remove(name(s - 2, c->rank).c_str());  // every rank has read it (see the top of this file)
    put(name(s, c->rank), data, bytes);
    auto parts = std::make_shared<std::vector<std::vector<char>>>(c->size);
    auto have = std::make_shared<std::vector<bool>>(c->size, false);
    return start(c, [=]() {
        for (int r = 0; r < c->size; r++)
            if (!(*have)[r] && !((*have)[r] = take(name(s, r), &(*parts)[r]))) return false;
        finish(*parts);
        return true;
    });
}

inline void check_sizes(const std::vector<std::vector<char>>& parts, size_t bytes) {
    for (const auto& p : parts)
        if (p.size() != bytes) emu_nccl::fail("the ranks of a collective gave different counts");
}

inline void reduce(const std::vector<std::vector<char>>& parts, size_t offset, size_t count, ncclDataType_t t, ncclRedOp_t op, void* out) {
    for (size_t i = 0; i < count; i++) {
        double acc = load(parts[0].data() + offset, t, i);
        for (size_t r = 1; r < parts.size(); r++) {
            double v = load(parts[r].data() + offset, t, i);
            acc = op == ncclMax ? std::max(acc, v) : acc + v;
        }
        if (op == ncclAvg) acc /= (double)parts.size();
        store(out, t, i, acc);
    }
}

inline void send_now(ncclComm* c, const void* buf, size_t bytes, int peer) {
    put(c->dir + "/p" + std::to_string(c->rank) + "to" + std::to_string(peer) + "." + std::to_string(c->sends[peer]++), buf, bytes);
}
// the step of a receive: true once the peer's file was read into buf (and removed)
inline std::function<bool()> recv_step(ncclComm* c, void* buf, size_t bytes, int peer) {
    std::string path = c->dir + "/p" + std::to_string(peer) + "to" + std::to_string(c->rank) + "." + std::to_string(c->recvs[peer]++);
    return [=]() {
        std::vector<char> data;
        if (!take(path, &data)) return false;
        if (data.size() != bytes) emu_nccl::fail("a receive's count differs from its send's");
        memcpy(buf, data.data(), bytes);
        remove(path.c_str());
        return true;
    };
}

// between ncclGroupStart and ncclGroupEnd: the receives, started together at the end
struct GroupCall {
    ncclComm* comm;
    std::function<bool()> step;
};
inline int group_depth = 0;
inline std::vector<GroupCall> grouped;

inline bool valid(ncclComm* c, int peer) { return c != NULL && peer >= 0 && peer < c->size; }

}  // namespace emu_nccl

extern "C" {
const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
        case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
        case ncclInProgress: return "operation in progress";
        default: return "error (emulated NCCL)";
    }
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    memset(id, 0, sizeof(*id));
    snprintf(id->internal, sizeof(id->internal), "emu-nccl-%d-%lld", (int)getpid(),
             (long long)std::chrono::steady_clock::now().time_since_epoch().count());
    return ncclSuccess;
}
// every rank must join: a collective over the new communicator, which also checks that they agree on its size
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
    id.internal[sizeof(id.internal) - 1] = 0;
    if (nranks < 1 || rank < 0 || rank >= nranks || strncmp(id.internal, "emu-nccl-", 9) != 0) return ncclInvalidArgument;
    ncclComm* c = emu_nccl::make_comm(id.internal, rank, nranks, config ? config->blocking : 1);
    *comm = c;
    return emu_nccl::collective(c, &nranks, sizeof(nranks), [c, nranks](std::vector<std::vector<char>>& parts) {
        for (auto& p : parts)
            if (*(int*)p.data() != nranks) c->error = ncclInvalidUsage;  // (reported by ncclCommGetAsyncError)
    });
}
// A collective over the parent: every rank gives its colour and key; those of one colour form a
// communicator, ranked by key (then by parent rank), named after the parent, the split's number and the colour.
ncclResult_t ncclCommSplit(ncclComm_t parent, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
    if (parent == NULL) return ncclInvalidArgument;
    *newcomm = NULL;
    int mine[2] = {color, key};
    std::string name = parent->key + "-s" + std::to_string(parent->splits++);
    int blocking = config ? config->blocking : parent->blocking;
    return emu_nccl::collective(parent, mine, sizeof(mine), [=](std::vector<std::vector<char>>& parts) {
        if (color == NCCL_SPLIT_NOCOLOR) return;
        std::vector<std::pair<int, int>> members;  // (key, parent rank) of this colour
        for (int r = 0; r < (int)parts.size(); r++) {
            const int* theirs = (const int*)parts[r].data();
            if (theirs[0] == color) members.push_back({theirs[1], r});
        }
        std::sort(members.begin(), members.end());
        int rank = (int)(std::find(members.begin(), members.end(), std::make_pair(key, parent->rank)) - members.begin());
        *newcomm = emu_nccl::make_comm(name + "c" + std::to_string(color), rank, (int)members.size(), blocking);
    });
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* error) {
    if (c == NULL) return ncclInvalidArgument;
    if (c->pending && c->pending()) c->pending = nullptr;
    *error = c->error != ncclSuccess ? c->error : c->pending ? ncclInProgress : ncclSuccess;
    return ncclSuccess;
}
// a collective like any other, so that no rank leaves while another still waits for its files
ncclResult_t ncclCommFinalize(ncclComm_t c) {
    if (c == NULL) return ncclInvalidArgument;
    return emu_nccl::collective(c, NULL, 0, [](std::vector<std::vector<char>>&) {});
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (c == NULL) return ncclInvalidArgument;
    if (c->pending) emu_nccl::fail("ncclCommDestroy with a call in progress (finalize first)");
    delete c;
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (c != NULL) c->aborted = 1, c->pending = nullptr;  // (the object is leaked: the program is ending)
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
    if (c == NULL || (op != ncclSum && op != ncclAvg && op != ncclMax)) return ncclInvalidArgument;
    size_t bytes = count * emu_nccl::type_bytes(t);
    return emu_nccl::collective(c, send, bytes, [=](std::vector<std::vector<char>>& parts) {
        emu_nccl::check_sizes(parts, bytes);
        emu_nccl::reduce(parts, 0, count, t, op, recv);
    });
}
// send holds size x recvcount elements; this rank gets the reduction of block `rank`
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
    if (c == NULL || (op != ncclSum && op != ncclAvg && op != ncclMax)) return ncclInvalidArgument;
    size_t block = recvcount * emu_nccl::type_bytes(t);
    return emu_nccl::collective(c, send, block * c->size, [=](std::vector<std::vector<char>>& parts) {
        emu_nccl::check_sizes(parts, block * c->size);
        emu_nccl::reduce(parts, block * c->rank, recvcount, t, op, recv);
    });
}
// recv holds size x sendcount elements: block r is rank r's send (which may lie in recv, in place)
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t t, ncclComm_t c, cudaStream_t) {
    if (c == NULL) return ncclInvalidArgument;
    size_t block = sendcount * emu_nccl::type_bytes(t);
    return emu_nccl::collective(c, send, block, [=](std::vector<std::vector<char>>& parts) {
        emu_nccl::check_sizes(parts, block);
        for (size_t r = 0; r < parts.size(); r++) memcpy((char*)recv + r * block, parts[r].data(), block);
    });
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t) {
    if (!emu_nccl::valid(c, root)) return ncclInvalidArgument;
    size_t bytes = count * emu_nccl::type_bytes(t);
    return emu_nccl::collective(c, send, bytes, [=](std::vector<std::vector<char>>& parts) {
        emu_nccl::check_sizes(parts, bytes);
        memcpy(recv, parts[root].data(), bytes);
    });
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t) {
    if (!emu_nccl::valid(c, peer) || c->aborted) return ncclInvalidArgument;
    emu_nccl::send_now(c, send, count * emu_nccl::type_bytes(t), peer);  // (never waits: see the top of this file)
    return ncclSuccess;
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t) {
    if (!emu_nccl::valid(c, peer)) return ncclInvalidArgument;
    auto step = emu_nccl::recv_step(c, recv, count * emu_nccl::type_bytes(t), peer);
    if (emu_nccl::group_depth > 0) {
        emu_nccl::grouped.push_back({c, step});
        return ncclSuccess;
    }
    return emu_nccl::start(c, step);
}
ncclResult_t ncclGroupStart() {
    emu_nccl::group_depth++;
    return ncclSuccess;
}
// the group's receives, as one call in progress on their communicator (llmc's groups have one)
ncclResult_t ncclGroupEnd() {
    if (emu_nccl::group_depth == 0) return ncclInvalidUsage;
    if (--emu_nccl::group_depth > 0) return ncclSuccess;
    std::vector<emu_nccl::GroupCall> calls;
    calls.swap(emu_nccl::grouped);
    if (calls.empty()) return ncclSuccess;
    for (auto& g : calls)
        if (g.comm != calls[0].comm) emu_nccl::fail("a group over several communicators");
    auto done = std::make_shared<std::vector<bool>>(calls.size(), false);
    return emu_nccl::start(calls[0].comm, [calls, done]() {
        bool all = true;
        for (size_t i = 0; i < calls.size(); i++)
            if (!(*done)[i]) all &= ((*done)[i] = calls[i].step());
        return all;
    });
}
}
