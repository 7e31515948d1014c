/*
 * emulate_nccl.h: the NCCL calls of llmc/comm/nccl_engine.h, for the CPU emulation of CUDA (emulate.h includes
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
 *   collective number s:  every rank writes c<s>.<rank> (what it calls, then its whole send buffer), waits
 *                         until all n files exist, reads them, checks that every rank calls the same
 *                         operation (kind, type, reduction, count: else one line naming both, exit
 *                         1), and computes the result itself, in rank order (so every rank gets the same
 *                         bits, as from NCCL's rings). A rank at collective s knows every rank has finished
 *                         s-2 (each wrote s-1 after reading s-2), so it removes its own s-2 file.
 *   send number k to p:   p<me>to<p>.<k> (type, count, data); the receiver reads and removes it and writes
 *                         the acknowledgement a<me>to<p>.<k>, which completes the send: a send waits for its
 *                         receive, as NCCL's may, so an order of sends and receives that deadlocks on a GPU
 *                         deadlocks here (ncclGroupStart/End lets a send and a receive progress together).
 * NCCL's contract with streams: a collective, send or receive is queued on its stream when it is called
 * (the call itself completes at once) and carried out when that stream runs it, which the emulated
 * runtime makes as late as CUDA allows (emulate_runtime.h, "streams and events": when the host waits for
 * the stream). So the operation reads its send buffer and writes its receive buffer then, not at the call,
 * and a program that touches those buffers before waiting for the stream (fine with blocking calls, a
 * race on a GPU) gets wrong results here. Creating, splitting and finalizing a communicator are host calls
 * (every stream is completed first): one returns ncclSuccess once complete, or, waiting for peers on a
 * non-blocking communicator (config.blocking = 0, as llmc's), ncclInProgress, completed in later
 * ncclCommGetAsyncError calls; a blocking one waits, at most $EMU_NCCL_TIMEOUT s (default 300), the same
 * limit as a stream waiting for a peer that never comes (a deadlock). Reductions run in double precision
 * and round once. Not modelled: the transport's speed, and the few files the last collective of each
 * communicator leaves in the folder (a test removes $EMU_NCCL_DIR).
 */
#pragma once

#include <nccl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
    std::atomic<int> aborted{0};                   // (set by any thread: ncclCommAbort)
    ncclResult_t error = ncclSuccess;
};

namespace emu_nccl {

[[noreturn]] inline void fail(const std::string& what) {
    fprintf(stderr, "emulated NCCL, pid %d: %s\n", (int)getpid(), what.c_str());
    exit(1);
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

// Starts a host call (creating, splitting, finalizing): complete now (ncclSuccess), or in progress
// (ncclInProgress on a non-blocking communicator, completed by ncclCommGetAsyncError; a blocking one waits
// here). `step` returns true once complete.
inline ncclResult_t start(ncclComm* c, std::function<bool()> step) {
    if (c->aborted || c->error != ncclSuccess) return ncclInvalidUsage;
    if (c->pending) emu_nccl::fail("a call on a communicator whose previous call is still in progress");
    if (step()) return ncclSuccess;
    if (!c->blocking) {
        c->pending = step;
        return ncclInProgress;
    }
    emu::wait_until(step, "a blocking NCCL call (creating, splitting or finalizing a communicator)");
    return ncclSuccess;
}

// What a rank calls, at the head of each collective and send file: the ranks of a collective must all
// call the same, and a receive must match its send.
enum class Kind : int32_t { init, split, finalize, all_reduce, reduce_scatter, all_gather, send };
struct OpHeader {
    Kind kind;
    int32_t type, op;        // ncclDataType_t, ncclRedOp_t (-1: none)
    uint64_t count;          // elements (per rank where NCCL counts so)
    bool operator!=(const OpHeader& o) const { return kind != o.kind || type != o.type || op != o.op || count != o.count; }
};
inline std::string describe(const OpHeader& h) {
    static const char* kinds[] = {"creating the communicator", "a split", "finalize", "an all-reduce", "a reduce-scatter",
                                  "an all-gather", "a send"};
    std::string d = kinds[(int)h.kind];
    if (h.kind < Kind::all_reduce) return d;
    if (h.op >= 0) d += h.op == ncclMax ? " (max)" : h.op == ncclAvg ? " (avg)" : " (sum)";
    const char* type = h.type == ncclFloat ? "float" : h.type == ncclDouble ? "double" : h.type == ncclHalf ? "half" : "bf16";
    return d + " of " + std::to_string(h.count) + " " + type;
}
inline std::vector<char> with_header(const OpHeader& h, const void* data, size_t bytes) {
    std::vector<char> v(sizeof(h) + bytes);
    memcpy(v.data(), &h, sizeof(h));
    if (bytes > 0) memcpy(v.data() + sizeof(h), data, bytes);
    return v;
}
inline OpHeader header_of(const std::vector<char>& file, const std::string& path) {
    OpHeader h;
    if (file.size() < sizeof(h)) emu_nccl::fail("a short file " + path);
    memcpy(&h, file.data(), sizeof(h));
    return h;
}

typedef std::function<void(std::vector<std::vector<char>>&)> Finish;  // the ranks' contributions, in rank order

// The progress of collective number s: on its first call writes this rank's file (`data` read then), then
// (in this and later calls) waits for every rank's, checks that they all call what this rank calls, and
// hands the contributions, in rank order, to `finish`. True once complete.
inline std::function<bool()> collective_step(ncclComm* c, long s, OpHeader mine, const void* data, size_t bytes, Finish finish) {
    auto name = [c, s](long seq, int r) { return c->dir + "/c" + std::to_string(seq) + "." + std::to_string(r); };
    auto written = std::make_shared<bool>(false);
    auto parts = std::make_shared<std::vector<std::vector<char>>>(c->size);
    auto have = std::make_shared<std::vector<bool>>(c->size, false);
    return [=]() {
        if (c->aborted) return true;
        if (!*written) {
            if (s >= 2) remove(name(s - 2, c->rank).c_str());  // every rank has read it (see the top of this file)
            std::vector<char> file = with_header(mine, data, bytes);
            put(name(s, c->rank), file.data(), file.size());
            *written = true;
        }
        for (int r = 0; r < c->size; r++)
            if (!(*have)[r] && !((*have)[r] = take(name(s, r), &(*parts)[r]))) return false;
        for (int r = 0; r < c->size; r++) {
            OpHeader theirs = header_of((*parts)[r], name(s, r));
            if (theirs != mine)
                emu_nccl::fail("collective " + std::to_string(s) + " of communicator " + c->key + ": rank " + std::to_string(r) + " calls " +
                               describe(theirs) + ", rank " + std::to_string(c->rank) + " " + describe(mine));
            (*parts)[r].erase((*parts)[r].begin(), (*parts)[r].begin() + sizeof(OpHeader));
        }
        finish(*parts);
        return true;
    };
}

// a host call's collective (creating, splitting, finalizing): the streams' queued work first, since it
// holds the communicator's earlier collectives; `data` is copied at the call
inline ncclResult_t host_collective(ncclComm* c, OpHeader mine, const void* data, size_t bytes, Finish finish) {
    if (c->aborted || c->error != ncclSuccess) return ncclInvalidUsage;
    emu::drain_all(describe(mine).c_str());
    auto copy = std::make_shared<std::vector<char>>((const char*)data, (const char*)data + bytes);
    long s = c->collectives++;
    auto step = collective_step(c, s, mine, copy->data(), bytes, finish);
    return start(c, [copy, step]() { return step(); });
}

// a collective on a stream: queued now (numbered in the host's order of calls), carried out when the
// stream runs it
inline ncclResult_t stream_collective(ncclComm* c, cudaStream_t stream, OpHeader mine, const void* data, size_t bytes, Finish finish) {
    if (c->aborted || c->error != ncclSuccess) return ncclInvalidUsage;
    long s = c->collectives++;
    emu::queue_op(stream, collective_step(c, s, mine, data, bytes, finish),
                  "collective " + std::to_string(s) + " (" + describe(mine) + ") of communicator " + c->key + " waits for a peer");
    return ncclSuccess;
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

inline std::string pair_file(const ncclComm* c, const char* what, int from, int to, long k) {
    return c->dir + "/" + what + std::to_string(from) + "to" + std::to_string(to) + "." + std::to_string(k);
}
// The progress of send number k to `peer`: on its first call writes the data (`buf` read then), then waits
// for the receiver's acknowledgement: a send completes only with its receive.
inline std::function<bool()> send_step(ncclComm* c, const void* buf, OpHeader mine, size_t bytes, int peer) {
    long k = c->sends[peer]++;
    std::string path = pair_file(c, "p", c->rank, peer, k), ack = pair_file(c, "a", c->rank, peer, k);
    auto written = std::make_shared<bool>(false);
    return [=]() {
        if (c->aborted) return true;
        if (!*written) {
            std::vector<char> file = with_header(mine, buf, bytes);
            put(path, file.data(), file.size());
            *written = true;
        }
        struct stat st;
        if (stat(ack.c_str(), &st) != 0) return false;
        remove(ack.c_str());
        return true;
    };
}
// The progress of receive number k from `peer`: once the peer's data is there, checks it against what
// this rank receives, copies it into buf, removes it and acknowledges it.
inline std::function<bool()> recv_step(ncclComm* c, void* buf, OpHeader mine, size_t bytes, int peer) {
    long k = c->recvs[peer]++;
    std::string path = pair_file(c, "p", peer, c->rank, k), ack = pair_file(c, "a", peer, c->rank, k);
    return [=]() {
        if (c->aborted) return true;
        std::vector<char> data;
        if (!take(path, &data)) return false;
        OpHeader theirs = header_of(data, path);
        if (theirs.type != mine.type || theirs.count != mine.count)
            emu_nccl::fail("receive " + std::to_string(k) + " from rank " + std::to_string(peer) + " of communicator " + c->key + ": it sends " +
                           describe(theirs) + ", rank " + std::to_string(c->rank) + " receives " + std::to_string(mine.count));
        memcpy(buf, data.data() + sizeof(OpHeader), bytes);
        remove(path.c_str());
        put(ack, NULL, 0);
        return true;
    };
}
inline std::string pair_what(const ncclComm* c, const char* what, int peer, const OpHeader& h) {
    return std::string(what) + " " + std::to_string(peer) + " (" + std::to_string(h.count) + " elements) of communicator " + c->key;
}

// between ncclGroupStart and ncclGroupEnd: the sends and receives, queued together at the end as one
// operation whose parts progress together (so a send and a receive between two ranks cannot deadlock)
struct GroupCall {
    ncclComm* comm;
    cudaStream_t stream;
    std::function<bool()> step;
    std::string what;
};
inline int group_depth = 0;
inline std::vector<GroupCall> grouped;
// queues a send or receive (or, inside a group, keeps it for ncclGroupEnd)
inline ncclResult_t queue_pair_op(ncclComm* c, cudaStream_t stream, std::function<bool()> step, std::string what) {
    if (group_depth > 0) grouped.push_back({c, stream, std::move(step), std::move(what)});
    else emu::queue_op(stream, std::move(step), std::move(what));
    return ncclSuccess;
}

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
    emu_nccl::OpHeader mine = {emu_nccl::Kind::init, -1, -1, 0};
    return emu_nccl::host_collective(c, mine, &nranks, sizeof(nranks), [c, nranks](std::vector<std::vector<char>>& parts) {
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
    emu_nccl::OpHeader what = {emu_nccl::Kind::split, -1, -1, 0};
    return emu_nccl::host_collective(parent, what, mine, sizeof(mine), [=](std::vector<std::vector<char>>& parts) {
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
// a collective like any other (after every stream's queued work), so that no rank leaves while another
// still waits for its files
ncclResult_t ncclCommFinalize(ncclComm_t c) {
    if (c == NULL) return ncclInvalidArgument;
    emu_nccl::OpHeader what = {emu_nccl::Kind::finalize, -1, -1, 0};
    return emu_nccl::host_collective(c, what, NULL, 0, [](std::vector<std::vector<char>>&) {});
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (c == NULL) return ncclInvalidArgument;
    if (c->pending) emu_nccl::fail("ncclCommDestroy with a call in progress (finalize first)");
    delete c;
    return ncclSuccess;
}
// As NCCL's, callable from another thread (llmc/comm/watchdog.h's, while the host waits in a CUDA call: the
// waits read only `aborted`, atomic for it)
ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (c != NULL) c->aborted = 1, c->pending = nullptr;  // (its queued operations complete at once; the object is leaked: the program is ending)
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t stream) {
    if (c == NULL || (op != ncclSum && op != ncclAvg && op != ncclMax)) return ncclInvalidArgument;
    size_t bytes = count * emu_nccl::type_bytes(t);
    emu_nccl::OpHeader what = {emu_nccl::Kind::all_reduce, t, op, count};
    return emu_nccl::stream_collective(c, stream, what, send, bytes, [=](std::vector<std::vector<char>>& parts) {
        emu_nccl::check_sizes(parts, bytes);
        emu_nccl::reduce(parts, 0, count, t, op, recv);
    });
}
// send holds size x recvcount elements; this rank gets the reduction of block `rank`
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t stream) {
    if (c == NULL || (op != ncclSum && op != ncclAvg && op != ncclMax)) return ncclInvalidArgument;
    size_t block = recvcount * emu_nccl::type_bytes(t);
    emu_nccl::OpHeader what = {emu_nccl::Kind::reduce_scatter, t, op, recvcount};
    return emu_nccl::stream_collective(c, stream, what, send, block * c->size, [=](std::vector<std::vector<char>>& parts) {
        emu_nccl::check_sizes(parts, block * c->size);
        emu_nccl::reduce(parts, block * c->rank, recvcount, t, op, recv);
    });
}
// recv holds size x sendcount elements: block r is rank r's send (which may lie in recv, in place)
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t t, ncclComm_t c, cudaStream_t stream) {
    if (c == NULL) return ncclInvalidArgument;
    size_t block = sendcount * emu_nccl::type_bytes(t);
    emu_nccl::OpHeader what = {emu_nccl::Kind::all_gather, t, -1, sendcount};
    return emu_nccl::stream_collective(c, stream, what, send, block, [=](std::vector<std::vector<char>>& parts) {
        emu_nccl::check_sizes(parts, block);
        for (size_t r = 0; r < parts.size(); r++) memcpy((char*)recv + r * block, parts[r].data(), block);
    });
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t stream) {
    if (!emu_nccl::valid(c, peer) || c->aborted) return ncclInvalidArgument;
    emu_nccl::OpHeader what = {emu_nccl::Kind::send, t, -1, count};
    return emu_nccl::queue_pair_op(c, stream, emu_nccl::send_step(c, send, what, count * emu_nccl::type_bytes(t), peer),
                                   emu_nccl::pair_what(c, "a send to rank", peer, what) + " waits for its receive");
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t stream) {
    if (!emu_nccl::valid(c, peer) || c->aborted) return ncclInvalidArgument;
    emu_nccl::OpHeader what = {emu_nccl::Kind::send, t, -1, count};
    return emu_nccl::queue_pair_op(c, stream, emu_nccl::recv_step(c, recv, what, count * emu_nccl::type_bytes(t), peer),
                                   emu_nccl::pair_what(c, "a receive from rank", peer, what) + " waits for its send");
}
ncclResult_t ncclGroupStart() {
    emu_nccl::group_depth++;
    return ncclSuccess;
}
// the group's sends and receives, as one operation on their stream (llmc's groups have one stream)
ncclResult_t ncclGroupEnd() {
    if (emu_nccl::group_depth == 0) return ncclInvalidUsage;
    if (--emu_nccl::group_depth > 0) return ncclSuccess;
    std::vector<emu_nccl::GroupCall> calls;
    calls.swap(emu_nccl::grouped);
    if (calls.empty()) return ncclSuccess;
    std::string what;
    for (auto& g : calls) {
        if (g.stream != calls[0].stream) emu_nccl::fail("a group over several streams");
        what += (what.empty() ? "" : " and ") + g.what;
    }
    auto done = std::make_shared<std::vector<bool>>(calls.size(), false);
    emu::queue_op(calls[0].stream, [calls, done]() {
        bool all = true;
        for (size_t i = 0; i < calls.size(); i++)
            if (!(*done)[i]) all &= ((*done)[i] = calls[i].step());
        return all;
    }, "a group: " + what);
    return ncclSuccess;
}
}
