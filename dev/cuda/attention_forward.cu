/*
 * attention_forward: causal multi-head self-attention, forward.
 *
 *   qkv (B,T,3C): q | k | v per position, each C = NH heads of HS = C/NH channels
 *   out (B,T,C):  softmax(q k^T / sqrt(HS)) v per head, causal, heads concatenated
 *
 * versions
 *   1  the project's kernel (llmc/attention.h): heads split out to (B,NH,T,HS), two cuBLAS
 *      strided-batched products with a causal softmax kernel in between. It materializes the whole
 *      (B,NH,T,T) score and probability matrices (2 x 400 MB at GPT-2 124M shapes) and computes the
 *      masked half too.
 *   2  flash attention, simple: one block of 64 threads per (batch, head, tile of 64 queries), one thread
 *      per query. Tiles of 64 keys and values are staged in shared memory; each thread keeps its q row
 *      and its output row (64 + 64 floats) in registers and runs the online softmax: per key tile,
 *      scores go to shared memory, the running max m and sum l are updated, the output is rescaled
 *      once by exp(m_old - m_new) and the tile's p * v added. Key tiles above the diagonal are skipped,
 *      the diagonal tile is masked. No T x T matrix exists anywhere.
 *   3  flash attention, tiled: one block of 256 threads per (batch, head, tile of 64 queries). Q, K, V
 *      and P tiles of 64 x 64 live in shared memory (rows padded to 68 floats so the float4 reads of a
 *      warp hit distinct banks; 68 KiB in all). The 256 threads form a 16 x 16 grid and each computes a
 *      4 x 4 block of S = Q K^T (rows ty*4.., keys tx, tx+16, tx+32, tx+48) from float4 reads (8 shared
 *      loads per 64 FMAs), then the online-softmax statistics per row are reduced over the 16 threads
 *      sharing the row with warp shuffles, P is written to shared memory and each thread accumulates a
 *      4 x 4 block of O = P V (rows ty*4.., channels tx*4..). Blocks of the last query tiles (the most
 *      key tiles under the causal mask) are launched first.
 *   4  flash attention on tensor cores, bf16 (llmc/attention_flash.h, the trainer's `--attention flash`):
 *      FlashAttention-2 with mma.sync m16n8k16 (bf16 operands, fp32 accumulation) and ldmatrix, 4 warps
 *      of 16 query rows per 64-query tile, K/V tiles double-buffered by cp.async, online softmax in
 *      registers with exp2. Reads qkv in place and writes out (B,T,C) and lse; the algorithm is written
 *      out atop llmc/attention_flash.h, the tiling and fragment layouts atop attention_flash_mma.h.
 *   5  the same kernel with fp16 operands.
 * Versions 2 to 5 also write the logsumexp of each score row, lse (B,NH,T) = m + log(l), which the
 * flash backward pass (attention_backward.cu) uses to recompute the probabilities. They need HS = 64
 * (true of every GPT-2 size); any T works (tiles past T are zero-filled and masked).
 *
 * CPU reference: attention_forward_cpu (llmc/attention.h) for out (and att, checked for version 1), and
 * the logsumexp recomputed on the host (attention_lse_cpu, attention_common.cuh) for versions 2-3. Checked at an
 * odd shapes (T = 37, 64, 100, 129, 200; B 1..3; NH 1..12: partial tiles, a single tile, one head) and at
 * GPT-2 124M shapes. The inputs are rounded to bf16 first (attention_common.cuh), so all versions see
 * the same numbers. Tolerances:
 *   versions 1-3: 1e-4 abs + 1e-3 rel (fp32 throughout; the sums run in a different order than on the CPU).
 *   version 4 (bf16): out 1e-2 abs + 1e-2 rel. Scores are exact products of bf16 inputs summed in fp32,
 *      so the error comes from rounding P to bf16 before P V (relative 2^-9 per term, so at most
 *      2^-9 * max|v| ~ 0.01 for |v| <= 5 of N(0,1) inputs, far less on average) plus rounding out to bf16
 *      (2^-9 relative). lse is fp32 from fp32 sums: 1e-3 abs + 1e-3 rel (exp2f/log2f approximations).
 *   version 5 (fp16, unit roundoff 2^-11, 4x finer): out 3e-3 abs + 3e-3 rel, lse as for bf16.
 *   A wrong fragment layout, mask or rescaling gives errors of order 1, far outside these.
 *
 * Benchmark: TFLOP/s counting the causal work only, 2 * B * NH * T^2 * HS (two T x T x HS products,
 * halved by the mask), for every version.
 */
#include "attention_common.cuh"

#define FA_HS 64             // head size
#define FA_BR 64             // queries per block
#define FA_BC 64             // keys per tile
#define FA_LD (FA_HS + 4)    // padded row of a shared tile (floats); 272 bytes keeps float4 alignment


// ----------------------------------------------------------------------------------------------------
// version 2: one thread per query row

// grid (T/64 query tiles, B*NH), block 64; dynamic shared memory: K, V tiles (64 x 64) and scores (64 x 64)
__global__ void __launch_bounds__(FA_BR) flash_forward_simple_kernel(float* out, float* lse, const float* qkv, int B,
                                                                     int T, int C, int NH, float scale) {
    extern __shared__ float4 smem4[];
    float* Ks = (float*)smem4;         // [FA_BC][FA_HS]
    float* Vs = Ks + FA_BC * FA_HS;    // [FA_BC][FA_HS]
    float* Ss = Vs + FA_BC * FA_HS;    // [FA_BC][FA_BR]: score of key j for thread (query) i at j*FA_BR + i
    int ntiles = (T + FA_BR - 1) / FA_BR;
    int qt = ntiles - 1 - blockIdx.x;  // the largest query tiles (most work) start first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    size_t stride = 3 * (size_t)C;
    const float* base = qkv + (size_t)b * T * stride + (size_t)h * FA_HS;
    int i = threadIdx.x;
    int t = qt * FA_BR + i;
    bool valid = t < T;

    float q[FA_HS], o[FA_HS];
#pragma unroll
    for (int d = 0; d < FA_HS; d++) {
        q[d] = valid ? base[(size_t)t * stride + d] * scale : 0.0f;
        o[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * FA_BC;
        __syncthreads();  // everyone is done with the previous tile
        for (int idx = threadIdx.x; idx < FA_BC * FA_HS / 4; idx += blockDim.x) {
            int j = idx / (FA_HS / 4), d = 4 * (idx % (FA_HS / 4));
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
            if (k0 + j < T) {
                kv = *(const float4*)(base + (size_t)(k0 + j) * stride + C + d);
                vv = *(const float4*)(base + (size_t)(k0 + j) * stride + 2 * C + d);
            }
            *(float4*)(Ks + j * FA_HS + d) = kv;
            *(float4*)(Vs + j * FA_HS + d) = vv;
        }
        __syncthreads();
        // keys of this tile this query may see: u < T and u <= t (the diagonal tile is masked)
        int jmax = min(FA_BC, T - k0);
        if (kt == qt) jmax = min(jmax, i + 1);
        float tile_max = -INFINITY;
        for (int j = 0; j < jmax; j++) {
            const float* k = Ks + j * FA_HS;  // the same address for every thread: a broadcast
            float s = 0.0f;
#pragma unroll
            for (int d = 0; d < FA_HS; d++) s += q[d] * k[d];
            Ss[j * FA_BR + i] = s;
            tile_max = fmaxf(tile_max, s);
        }
        if (jmax > 0) {  // always true for kt <= qt, kept as a guard
            float m_new = fmaxf(m, tile_max);
            float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
            l *= corr;
#pragma unroll
            for (int d = 0; d < FA_HS; d++) o[d] *= corr;
            for (int j = 0; j < jmax; j++) {
                float p = expf(Ss[j * FA_BR + i] - m_new);
                l += p;
                const float* v = Vs + j * FA_HS;
#pragma unroll
                for (int d = 0; d < FA_HS; d++) o[d] += p * v[d];
            }
            m = m_new;
        }
    }
    if (valid) {
        float inv = 1.0f / l;
        float* y = out + ((size_t)b * T + t) * C + (size_t)h * FA_HS;
#pragma unroll
        for (int d = 0; d < FA_HS; d += 4) *(float4*)(y + d) = make_float4(o[d] * inv, o[d + 1] * inv, o[d + 2] * inv, o[d + 3] * inv);
        lse[(size_t)bh * T + t] = m + logf(l);
    }
}

// ----------------------------------------------------------------------------------------------------
// version 3: 64 x 64 tiles, 256 threads, 4 x 4 register blocks

// rows [row0, row0 + 64) of one head's 64 channels (row stride `stride` floats) -> tile [64][FA_LD],
// times `mul`; rows past T are zero. All 256 threads take part (4 float4 each).
__device__ static inline void load_tile_64(float* tile, const float* src, int row0, int T, size_t stride, float mul) {
    for (int idx = threadIdx.x; idx < 64 * (FA_HS / 4); idx += blockDim.x) {
        int r = idx / (FA_HS / 4), d = 4 * (idx % (FA_HS / 4));
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row0 + r < T) {
            x = *(const float4*)(src + (size_t)(row0 + r) * stride + d);
            x.x *= mul, x.y *= mul, x.z *= mul, x.w *= mul;
        }
        *(float4*)(tile + r * FA_LD + d) = x;
    }
}

// max / sum over the 16 lanes that share a row (lanes differing only in bits 0..3)
__device__ static inline float group16_max(float v) {
    for (int off = 8; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, off));
    return v;
}
__device__ static inline float group16_sum(float v) {
    for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    return v;
}

__device__ static inline float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

static const size_t FLASH3_SMEM = 4 * 64 * FA_LD * sizeof(float);  // Q, K, V, P: 69632 bytes

// grid (T/64 query tiles, B*NH), block 256
__global__ void __launch_bounds__(256) flash_forward_tiled_kernel(float* out, float* lse, const float* qkv, int B, int T,
                                                                  int C, int NH, float scale) {
    extern __shared__ float4 smem4[];
    float* Qs = (float*)smem4;  // [64][FA_LD], pre-scaled by 1/sqrt(HS)
    float* Ks = Qs + 64 * FA_LD;
    float* Vs = Ks + 64 * FA_LD;
    float* Ps = Vs + 64 * FA_LD;  // probabilities of the current tile, [query][key]
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int ntiles = (T + FA_BR - 1) / FA_BR;
    int qt = ntiles - 1 - blockIdx.x;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    size_t stride = 3 * (size_t)C;
    const float* base = qkv + (size_t)b * T * stride + (size_t)h * FA_HS;
    int q0 = qt * FA_BR;

    load_tile_64(Qs, base, q0, T, stride, scale);
    float o[4][4], m[4], l[4];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        m[a] = -INFINITY, l[a] = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; e++) o[a][e] = 0.0f;
    }

    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * FA_BC;
        __syncthreads();  // the previous tile's K, V, P are no longer read
        load_tile_64(Ks, base + C, k0, T, stride, 1.0f);
        load_tile_64(Vs, base + 2 * C, k0, T, stride, 1.0f);
        __syncthreads();

        // S block: rows ty*4 + a, keys tx + 16*c
        float s[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[a][c] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < FA_HS; d += 4) {
            float4 qf[4], kf[4];
#pragma unroll
            for (int a = 0; a < 4; a++) qf[a] = *(const float4*)(Qs + (ty * 4 + a) * FA_LD + d);
#pragma unroll
            for (int c = 0; c < 4; c++) kf[c] = *(const float4*)(Ks + (tx + 16 * c) * FA_LD + d);
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int c = 0; c < 4; c++) s[a][c] += dot4(qf[a], kf[c]);
        }

        // causal mask, online softmax per row, P to shared memory
#pragma unroll
        for (int a = 0; a < 4; a++) {
            int r = q0 + ty * 4 + a;
            float mx = -INFINITY;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int u = k0 + tx + 16 * c;
                if (u > r || u >= T) s[a][c] = -INFINITY;
                mx = fmaxf(mx, s[a][c]);
            }
            mx = group16_max(mx);
            float m_new = fmaxf(m[a], mx);
            float corr = m[a] == -INFINITY ? 0.0f : expf(m[a] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float p = s[a][c] == -INFINITY ? 0.0f : expf(s[a][c] - m_new);
                Ps[(ty * 4 + a) * FA_LD + tx + 16 * c] = p;
                sum += p;
            }
            sum = group16_sum(sum);
            l[a] = l[a] * corr + sum;
            m[a] = m_new;
#pragma unroll
            for (int e = 0; e < 4; e++) o[a][e] *= corr;
        }
        __syncthreads();

        // O block += P V: rows ty*4 + a, channels tx*4 + e
#pragma unroll 4
        for (int j = 0; j < FA_BC; j += 4) {
            float4 pf[4], vf[4];
#pragma unroll
            for (int a = 0; a < 4; a++) pf[a] = *(const float4*)(Ps + (ty * 4 + a) * FA_LD + j);
#pragma unroll
            for (int c = 0; c < 4; c++) vf[c] = *(const float4*)(Vs + (j + c) * FA_LD + tx * 4);
#pragma unroll
            for (int a = 0; a < 4; a++) {
                o[a][0] += pf[a].x * vf[0].x + pf[a].y * vf[1].x + pf[a].z * vf[2].x + pf[a].w * vf[3].x;
                o[a][1] += pf[a].x * vf[0].y + pf[a].y * vf[1].y + pf[a].z * vf[2].y + pf[a].w * vf[3].y;
                o[a][2] += pf[a].x * vf[0].z + pf[a].y * vf[1].z + pf[a].z * vf[2].z + pf[a].w * vf[3].z;
                o[a][3] += pf[a].x * vf[0].w + pf[a].y * vf[1].w + pf[a].z * vf[2].w + pf[a].w * vf[3].w;
            }
        }
    }

#pragma unroll
    for (int a = 0; a < 4; a++) {
        int r = q0 + ty * 4 + a;
        if (r < T) {
            float inv = 1.0f / l[a];
            float* y = out + ((size_t)b * T + r) * C + (size_t)h * FA_HS + tx * 4;
            *(float4*)y = make_float4(o[a][0] * inv, o[a][1] * inv, o[a][2] * inv, o[a][3] * inv);
            if (tx == 0) lse[(size_t)bh * T + r] = m[a] + logf(l[a]);
        }
    }
}

// ----------------------------------------------------------------------------------------------------

static const int NV = 5;
static const char* version_names[NV + 1] = {"", "cuBLAS (llmc)", "flash, thread per query", "flash, tiled 64x64",
                                            "flash, tensor cores (mma.sync bf16)", "flash, tensor cores (mma.sync fp16)"};

// 16-bit copies of qkv and out for versions 4 and 5 (bf16 or fp16 bits, 2 bytes each)
static void* d_qkv16 = NULL;
static void* d_out16 = NULL;
static Scratch trainer_scratch = {NULL, 0};  // version 1's q, k, v, ... (the trainer's model owns one)

static void run_version(int v, float* out, float* att, float* lse, const float* qkv, int B, int T, int C, int NH) {
    float scale = 1.0f / sqrtf((float)(C / NH));
    dim3 grid(ceil_div(T, FA_BR), B * NH);
    switch (v) {
        case 1: attention_forward(out, att, qkv, B, T, C, NH, &trainer_scratch); break;
        case 2: {
            size_t smem = 3 * 64 * 64 * sizeof(float);
            flash_forward_simple_kernel<<<grid, FA_BR, smem, main_stream>>>(out, lse, qkv, B, T, C, NH, scale);
            break;
        }
        case 3: flash_forward_tiled_kernel<<<grid, 256, FLASH3_SMEM, main_stream>>>(out, lse, qkv, B, T, C, NH, scale); break;
        case 4:
            flash_tc_attention_forward((__nv_bfloat16*)d_out16, lse, (const __nv_bfloat16*)d_qkv16, B, T, C, NH, main_stream);
            break;
        case 5: flash_tc_attention_forward((__half*)d_out16, lse, (const __half*)d_qkv16, B, T, C, NH, main_stream); break;
    }
    cudaCheck(cudaGetLastError());
}

// checks the selected versions at one shape; benchmarks them if `bench`
static void run_shape(int selected, int B, int T, int C, int NH, bool bench) {
    int hs = C / NH;
    printf("shape B=%d T=%d C=%d NH=%d (HS=%d)%s\n", B, T, C, NH, hs, bench ? "" : ": check only");
    if (hs != FA_HS || C % NH != 0) fatal("these kernels need HS = %d", FA_HS);
    size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_att = (size_t)B * NH * T * T, n_lse = (size_t)B * NH * T;
    float* qkv = make_random_normal(n_qkv, 7, 1.0f);
    round_to_bf16(qkv, n_qkv);
    float* out_ref = (float*)malloc_check(n_out * sizeof(float));
    float* att_ref = (float*)malloc_check(n_att * sizeof(float));
    float* lse_ref = (float*)malloc_check(n_lse * sizeof(float));
    double t0 = wall_seconds();
    attention_forward_cpu(out_ref, att_ref, qkv, B, T, C, NH);
    attention_lse_cpu(lse_ref, qkv, B, T, C, NH);
    printf("  CPU reference: %.1f s\n", wall_seconds() - t0);

    float* d_qkv = dev_upload(qkv, n_qkv);
    float* d_out = dev_alloc<float>(n_out);
    float* d_att = dev_alloc<float>(n_att);
    float* d_lse = dev_alloc<float>(n_lse);
    d_qkv16 = dev_alloc<uint16_t>(n_qkv);
    d_out16 = dev_alloc<uint16_t>(n_out);
    double flops = 2.0 * B * NH * (double)T * T * hs;
    for (int v = 1; v <= NV; v++) {
        if (!version_selected(selected, v)) continue;
        printf("version %d: %s\n", v, version_names[v]);
        cudaCheck(cudaMemset(d_out, 0xff, n_out * sizeof(float)));  // NaN: unwritten outputs fail the check
        cudaCheck(cudaMemset(d_lse, 0xff, n_lse * sizeof(float)));
        if (v == 4) to_16bit((__nv_bfloat16*)d_qkv16, d_qkv, n_qkv);
        if (v == 5) to_16bit((__half*)d_qkv16, d_qkv, n_qkv);
        if (v >= 4) cudaCheck(cudaMemset(d_out16, 0xff, n_out * 2));  // NaN in both formats
        run_version(v, d_out, d_att, d_lse, d_qkv, B, T, C, NH);
        if (v == 4) from_16bit(d_out, (const __nv_bfloat16*)d_out16, n_out);
        if (v == 5) from_16bit(d_out, (const __half*)d_out16, n_out);
        double tol = v == 4 ? 1e-2 : v == 5 ? 3e-3 : 0.0;  // the tolerances are justified atop this file
        if (v >= 4) check_close("out", d_out, out_ref, n_out, tol, tol);
        else check_close("out", d_out, out_ref, n_out, 1e-4, 1e-3);
        if (v == 1) check_close("att", d_att, att_ref, n_att, 1e-5, 1e-3);
        else if (v >= 4) check_close("lse", d_lse, lse_ref, n_lse, 1e-3, 1e-3);
        else check_close("lse", d_lse, lse_ref, n_lse, 1e-4, 1e-4);
        if (bench) {
            float ms = benchmark_ms([&] { run_version(v, d_out, d_att, d_lse, d_qkv, B, T, C, NH); }, 20, 2);
            print_flops("attention_forward", ms, flops);
        }
    }
    cudaCheck(cudaFree(d_qkv));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_att));
    cudaCheck(cudaFree(d_lse));
    cudaCheck(cudaFree(d_qkv16));
    scratch_free(&trainer_scratch);
    cudaCheck(cudaFree(d_out16));
    free(qkv), free(out_ref), free(att_ref), free(lse_ref);
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    printf("attention_forward\n");
    bench_init();
    cudaCheck(cudaFuncSetAttribute(flash_forward_simple_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 3 * 64 * 64 * (int)sizeof(float)));
    cudaCheck(cudaFuncSetAttribute(flash_forward_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FLASH3_SMEM));
    for (const AttentionShape& s : odd_shapes) run_shape(selected, s.B, s.T, 64 * s.NH, s.NH, false);
    if (!EMULATED)
    run_shape(selected, 8, 1024, 768, 12, true);  // GPT-2 124M
    return finish();
}
