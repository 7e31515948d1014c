/*
 * attention_flash_emulate.cpp: runs the tensor-core flash attention (llmc/attention_flash*.h), forward and
 * backward, on the host without a GPU: each kernel's loop over tiles and warps is replayed with ldmatrix
 * and mma.sync emulated (attention_flash_replay.h), the kernels' own element-wise code
 * (attention_flash_softmax.h: mask, online softmax, lse, P, dS) called lane by lane, and the quad
 * shuffles done across the emulated lanes. bf16 rounding is applied where the kernels round (inputs, P and
 * dS as mma operands, the stored outputs). The results are compared with the CPU reference
 * (llmc/attention.h) at the tolerances of the GPU checks (dev/cuda/attention_forward.cu version 4,
 * attention_backward.cu version 3), on shapes with T below, at and past one 64-row tile, and every output
 * element must be written exactly once.
 *
 * This checks the arithmetic, the masks at tile boundaries and past T, the scale factors and the lse
 * round trip between forward and backward. The tile walks below mirror the kernels' loops (which tiles,
 * which rows): a change there must be made in both. What it cannot check: the PTX itself, cp.async and
 * the barriers, the hardware's rounding inside mma (fp32 here). Build and run: `make -C dev/cuda layout`.
 */
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "../../llmc/attention.h"
#include "attention_flash_replay.h"

typedef float Acc[32][8][4];  // one warp's 16 x 64 accumulator, [lane][n-tile][element]

// load_tile_async: rows [row0, row0+64) of one head's 64 channels, zero past T
static void tile_load(float* tile, const float* src, int row0, int T, size_t stride) {
    for (int r = 0; r < FLASH_TILE; r++)
        for (int c = 0; c < FLASH_HS; c++) tile[r * FLASH_LDS + c] = row0 + r < T ? src[(size_t)(row0 + r) * stride + c] : 0.0f;
}

// store_rows: each lane's rows row0 + g (times mul[l][0]) and row0 + g + 8 (times mul[l][1]) of dst, rounded
// to 16 bits; writes (laid out like dst) counts them
static void tile_store(float* dst, int* writes, size_t stride, Acc x, const float mul[32][2], int row0, int T) {
    for (int l = 0; l < 32; l++)
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                int r = row0 + flash_acc_row(l, e), c = flash_acc_col(l, nt, e);
                if (r >= T) continue;
                dst[(size_t)r * stride + c] = emu_round16(x[l][nt][e] * mul[l][e >> 1]);
                writes[(size_t)r * stride + c]++;
            }
}

// quad_max / quad_sum: v[l][i] over the 4 lanes of l's quad, for both rows i
static void quad_reduce(float v[32][2], bool max) {
    for (int q = 0; q < 8; q++)
        for (int i = 0; i < 2; i++) {
            float r = v[4 * q][i];
            for (int j = 1; j < 4; j++) r = max ? fmaxf(r, v[4 * q + j][i]) : r + v[4 * q + j][i];
            for (int j = 0; j < 4; j++) v[4 * q + j][i] = r;
        }
}

static const float scale = 0.125f;  // 1/sqrt(64)
static const float scale_log2 = 0.125f * FLASH_LOG2E;

// flash_tc_forward_kernel, block (query tile qt, head bh = b*NH + h), warp w; lse_w counts lse writes
static void forward_warp(float* out, int* out_w, float* lse, int* lse_w, const float* qkv, int T, int C, int NH, int bh, int qt, int w) {
    int b = bh / NH, h = bh % NH, q0 = qt * FLASH_TILE;
    size_t stride = 3 * (size_t)C;
    const float* base = qkv + (size_t)b * T * stride + (size_t)h * FLASH_HS;
    static float Qs[FLASH_TILE_ELEMS], Ks[FLASH_TILE_ELEMS], Vs[FLASH_TILE_ELEMS];
    static Reg qf[32][4][4];
    static Acc o, s;
    float m[32][2], l[32][2], mx[32][2], inv[32][2];
    tile_load(Qs, base, q0, T, stride);
    emu_load_a_frags(qf, Qs, 16 * w);
    memset(o, 0, sizeof(o));
    for (int i = 0; i < 32; i++) m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        tile_load(Ks, base + C, kt * FLASH_TILE, T, stride);
        tile_load(Vs, base + 2 * C, kt * FLASH_TILE, T, stride);
        memset(s, 0, sizeof(s));
        emu_mma_a_xt(s, qf, Ks);
        for (int i = 0; i < 32; i++) flash_fwd_scores(s[i], mx[i], m[i], i, q0 + 16 * w, kt * FLASH_TILE, kt == qt, scale_log2);
        quad_reduce(mx, true);
        for (int i = 0; i < 32; i++) flash_fwd_online_softmax(s[i], o[i], m[i], l[i], mx[i]);
        emu_mma_p_x(o, s, Vs);
    }
    quad_reduce(l, false);
    for (int i = 0; i < 32; i++) inv[i][0] = 1.0f / l[i][0], inv[i][1] = 1.0f / l[i][1];
    size_t off = (size_t)b * T * C + (size_t)h * FLASH_HS;
    tile_store(out + off, out_w + off, C, o, inv, q0 + 16 * w, T);
    for (int i = 0; i < 32; i += 4)  // lane c == 0 of each quad
        for (int r = 0; r < 2; r++) {
            int t = q0 + 16 * w + i / 4 + 8 * r;
            if (t < T) lse[(size_t)bh * T + t] = flash_lse(m[i][r], l[i][r]), lse_w[(size_t)bh * T + t]++;
        }
}

// flash_tc_backward_dot_kernel: D = scale rowsum(dout * out) per (b, h, t), in fp32
static void backward_dot(float* D, const float* dout, const float* out, int B, int T, int C, int NH) {
    for (int bt = 0; bt < B * T; bt++)
        for (int h = 0; h < NH; h++) {
            float s = 0.0f;
            for (int i = 0; i < FLASH_HS; i++) s += dout[(size_t)bt * C + h * FLASH_HS + i] * out[(size_t)bt * C + h * FLASH_HS + i];
            D[((size_t)(bt / T) * NH + h) * T + bt % T] = scale * s;
        }
}

// load_row_stats: lse times log2 e and D of rows [row0, row0+64), 0 past T
static void row_stats(float lse2[64], float Dr[64], const float* lse, const float* D, int row0, int T) {
    for (int i = 0; i < 64; i++) lse2[i] = row0 + i < T ? lse[row0 + i] * FLASH_LOG2E : 0.0f, Dr[i] = row0 + i < T ? D[row0 + i] : 0.0f;
}

// flash_tc_backward_dkdv_kernel, block (key tile kt, head bh), warp w
static void dkdv_warp(float* dqkv, int* writes, const float* qkv, const float* dout, const float* lse, const float* D, int T, int C,
                      int NH, int bh, int kt, int w) {
    int b = bh / NH, h = bh % NH, k0 = kt * FLASH_TILE, ntiles = (T + FLASH_TILE - 1) / FLASH_TILE;
    size_t stride = 3 * (size_t)C;
    const float* base = qkv + (size_t)b * T * stride + (size_t)h * FLASH_HS;
    const float* dbase = dout + (size_t)b * T * C + (size_t)h * FLASH_HS;
    static float Ks[FLASH_TILE_ELEMS], Vs[FLASH_TILE_ELEMS], Qs[FLASH_TILE_ELEMS], dOs[FLASH_TILE_ELEMS];
    static Reg kf[32][4][4], vf[32][4][4];
    static Acc dk, dv, st, dpt;
    float lse2[64], Dr[64], mul_one[32][2];
    tile_load(Ks, base + C, k0, T, stride);
    tile_load(Vs, base + 2 * C, k0, T, stride);
    emu_load_a_frags(kf, Ks, 16 * w);
    emu_load_a_frags(vf, Vs, 16 * w);
    memset(dk, 0, sizeof(dk)), memset(dv, 0, sizeof(dv));
    for (int qt = kt; qt < ntiles; qt++) {
        int q0 = qt * FLASH_TILE;
        tile_load(Qs, base, q0, T, stride);
        tile_load(dOs, dbase, q0, T, C);
        row_stats(lse2, Dr, lse + (size_t)bh * T, D + (size_t)bh * T, q0, T);
        memset(st, 0, sizeof(st)), memset(dpt, 0, sizeof(dpt));
        emu_mma_a_xt(st, kf, Qs);
        emu_mma_a_xt(dpt, vf, dOs);
        bool edge = qt == kt || q0 + FLASH_TILE > T;
        for (int i = 0; i < 32; i++) flash_bwd_ds_t(st[i], dpt[i], lse2, Dr, i, k0 + 16 * w, q0, T, edge, scale, scale_log2);
        emu_mma_p_x(dv, st, dOs);
        emu_mma_p_x(dk, dpt, Qs);
    }
    for (int i = 0; i < 32; i++) mul_one[i][0] = mul_one[i][1] = 1.0f;  // (the softmax scale is in dS)
    size_t off = (size_t)b * T * stride + (size_t)h * FLASH_HS;
    tile_store(dqkv + off + C, writes + off + C, stride, dk, mul_one, k0 + 16 * w, T);
    tile_store(dqkv + off + 2 * C, writes + off + 2 * C, stride, dv, mul_one, k0 + 16 * w, T);
}

// flash_tc_backward_dq_kernel, block (query tile qt, head bh), warp w
static void dq_warp(float* dqkv, int* writes, const float* qkv, const float* dout, const float* lse, const float* D, int T, int C,
                    int NH, int bh, int qt, int w) {
    int b = bh / NH, h = bh % NH, q0 = qt * FLASH_TILE;
    size_t stride = 3 * (size_t)C;
    const float* base = qkv + (size_t)b * T * stride + (size_t)h * FLASH_HS;
    static float Qs[FLASH_TILE_ELEMS], dOs[FLASH_TILE_ELEMS], Ks[FLASH_TILE_ELEMS], Vs[FLASH_TILE_ELEMS];
    static Reg qf[32][4][4], df[32][4][4];
    static Acc dq, s, dp;
    float lse2[64], Dr[64], lse_r[32][2], D_r[32][2], mul_one[32][2];
    tile_load(Qs, base, q0, T, stride);
    tile_load(dOs, dout + (size_t)b * T * C + (size_t)h * FLASH_HS, q0, T, C);
    row_stats(lse2, Dr, lse + (size_t)bh * T, D + (size_t)bh * T, q0, T);
    emu_load_a_frags(qf, Qs, 16 * w);
    emu_load_a_frags(df, dOs, 16 * w);
    for (int i = 0; i < 32; i++)
        for (int r = 0; r < 2; r++) lse_r[i][r] = lse2[16 * w + i / 4 + 8 * r], D_r[i][r] = Dr[16 * w + i / 4 + 8 * r];
    memset(dq, 0, sizeof(dq));
    for (int kt = 0; kt <= qt; kt++) {
        tile_load(Ks, base + C, kt * FLASH_TILE, T, stride);
        tile_load(Vs, base + 2 * C, kt * FLASH_TILE, T, stride);
        memset(s, 0, sizeof(s)), memset(dp, 0, sizeof(dp));
        emu_mma_a_xt(s, qf, Ks);
        emu_mma_a_xt(dp, df, Vs);
        for (int i = 0; i < 32; i++) flash_bwd_ds(s[i], dp[i], lse_r[i], D_r[i], i, q0 + 16 * w, kt * FLASH_TILE, kt == qt, scale, scale_log2);
        emu_mma_p_x(dq, s, Ks);
    }
    for (int i = 0; i < 32; i++) mul_one[i][0] = mul_one[i][1] = 1.0f;  // (the softmax scale is in dS)
    tile_store(dqkv + (size_t)b * T * stride + (size_t)h * FLASH_HS, writes + (size_t)b * T * stride + (size_t)h * FLASH_HS,
               stride, dq, mul_one, q0 + 16 * w, T);
}

// ----------------------------------------------------------------------------------------------------

static int failures = 0;

// |got - ref| <= atol + rtol |ref| everywhere (NaN fails), and every element written exactly once
static void check(const char* what, const float* got, const float* ref, const int* writes, size_t n, double tol) {
    double max_err = 0.0, worst = 0.0;  // worst: the largest error as a share of its tolerance
    size_t bad = 0, bad_writes = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]), share = err / (tol + tol * fabs(ref[i]));
        if (!(share <= 1.0)) bad++;
        if (err != err) err = share = INFINITY;
        if (err > max_err) max_err = err;
        if (share > worst) worst = share;
        if (writes[i] != 1) bad_writes++;
    }
    printf("    %-5s max |err| %.2e, %3.0f%% of the tolerance (%.0e abs + rel): %s", what, max_err, 100 * worst, tol, bad ? "FAIL" : "ok");
    if (bad_writes) printf(", %zu elements not written exactly once: FAIL", bad_writes);
    printf("\n");
    if (bad || bad_writes) failures++;
}

static unsigned rng = 12345;
static float normal_bf16() {  // N(0,1) by Box-Muller, rounded to bf16 as the trainer's inputs are
    rng = rng * 1664525u + 1013904223u;
    float u1 = ((rng >> 8) + 1.0f) / 16777217.0f;
    rng = rng * 1664525u + 1013904223u;
    float u2 = (rng >> 8) / 16777216.0f;
    return round_bf16(sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2));
}

// one shape in bf16 or fp16 (inputs bf16 values in both, as in the GPU checks), at the GPU checks' tolerances
static void run_shape(int B, int T, int NH, bool fp16) {
    emu_round16 = fp16 ? round_fp16 : round_bf16;
    int C = NH * FLASH_HS, ntiles = (T + FLASH_TILE - 1) / FLASH_TILE;
    size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    std::vector<float> qkv(n_qkv), dout(n_out), out_ref(n_out), att((size_t)B * NH * T * T), lse_ref(n_lse), dqkv_ref(n_qkv);
    for (float& x : qkv) x = emu_round16(normal_bf16());
    for (float& x : dout) x = emu_round16(normal_bf16());
    attention_forward_cpu(out_ref.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_backward_cpu(dqkv_ref.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    for (int bh = 0; bh < B * NH; bh++)  // the logsumexp of each scaled score row, in double
        for (int t = 0; t < T; t++) {
            const float* q = qkv.data() + ((size_t)(bh / NH) * T + t) * 3 * C + (bh % NH) * FLASH_HS;
            std::vector<double> s(t + 1);
            double mx = -INFINITY, sum = 0.0;
            for (int u = 0; u <= t; u++) {
                const float* k = qkv.data() + ((size_t)(bh / NH) * T + u) * 3 * C + C + (bh % NH) * FLASH_HS;
                s[u] = 0.0;
                for (int i = 0; i < FLASH_HS; i++) s[u] += (double)q[i] * k[i] * scale;
                mx = fmax(mx, s[u]);
            }
            for (int u = 0; u <= t; u++) sum += exp(s[u] - mx);
            lse_ref[(size_t)bh * T + t] = (float)(mx + log(sum));
        }

    std::vector<float> out(n_out, NAN), lse(n_lse, NAN), D(n_lse), dqkv(n_qkv, NAN);
    std::vector<int> out_w(n_out), lse_w(n_lse), dqkv_w(n_qkv);
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < ntiles; t++)
            for (int w = 0; w < FLASH_THREADS / 32; w++) {
                forward_warp(out.data(), out_w.data(), lse.data(), lse_w.data(), qkv.data(), T, C, NH, bh, t, w);
            }
    // backward from what the forward stored (out in bf16, lse), as the trainer runs it
    backward_dot(D.data(), dout.data(), out.data(), B, T, C, NH);
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < ntiles; t++)
            for (int w = 0; w < FLASH_THREADS / 32; w++) {
                dkdv_warp(dqkv.data(), dqkv_w.data(), qkv.data(), dout.data(), lse.data(), D.data(), T, C, NH, bh, t, w);
                dq_warp(dqkv.data(), dqkv_w.data(), qkv.data(), dout.data(), lse.data(), D.data(), T, C, NH, bh, t, w);
            }
    printf("  %s B=%d T=%d NH=%d\n", fp16 ? "fp16" : "bf16", B, T, NH);
    check("out", out.data(), out_ref.data(), out_w.data(), n_out, fp16 ? 3e-3 : 1e-2);
    check("lse", lse.data(), lse_ref.data(), lse_w.data(), n_lse, 1e-3);
    check("dqkv", dqkv.data(), dqkv_ref.data(), dqkv_w.data(), n_qkv, fp16 ? 1e-2 : 3e-2);
}

int main() {
    printf("attention_flash_emulate: the tensor-core flash attention on emulated ldmatrix/mma (bf16, fp16) against the CPU reference\n");
    // below one tile, exactly one, one row past it (a 1-row last tile), two heads and batches, a partial 4th tile
    const int shapes[][3] = {{1, 37, 1}, {1, 64, 1}, {2, 65, 2}, {1, 129, 1}, {1, 200, 2}};
    for (int fp16 = 0; fp16 < 2; fp16++)
        for (const auto& s : shapes) run_shape(s[0], s[1], s[2], fp16);
    if (getenv("FLASH_EMU_T"))  // a longer run on request, e.g. FLASH_EMU_T=1024 FLASH_EMU_NH=4 (seconds)
        for (int fp16 = 0; fp16 < 2; fp16++) run_shape(1, atoi(getenv("FLASH_EMU_T")), atoi(getenv("FLASH_EMU_NH")), fp16);
    if (emu_bank_conflicts) printf("  %d shared-memory bank conflicts in ldmatrix: FAIL\n", emu_bank_conflicts), failures++;
    printf("attention_flash_emulate: %s\n", failures ? "FAILED" : "PASS");
    return failures ? 1 : 0;
}
