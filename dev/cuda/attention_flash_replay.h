/*
 * attention_flash_replay.h: the warp tile products of the tensor-core flash attention (load_a_frags,
 * mma_a_xt, mma_p_x of llmc/attention_flash_mma.h) replayed on the host, a whole warp at a time, with the
 * header's own index maps, on ldmatrix.x4 (.trans) and mma.sync.m16n8k16 as the CPU emulation of CUDA
 * models them (dev/emulate/emulate_tensor_core.h, the one model of the two instructions, which emulate.h
 * also runs lane by lane). Used by attention_flash_layout.cpp (the index maps against plain matrix
 * products) and attention_flash_emulate.cpp (the whole forward and backward).
 *
 * A warp's registers are arrays over its 32 lanes: an accumulator float[32][8][4] ([lane][n-tile][element],
 * so acc[l] is lane l's `float acc[8][4]` of the kernels), A fragments Reg[32][4][4] ([lane][k-step][reg]).
 * 16-bit values are floats holding bf16 (or fp16) values; packing P into an A operand rounds with
 * emu_round16 (round_bf16 or round_fp16), as pack2 does.
 * Every ldmatrix also checks that the 8 row addresses of each matrix fall on distinct bank groups.
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include "../../llmc/attention_flash_mma.h"
#include "../emulate/emulate_tensor_core.h"

struct Reg { float v[2]; };  // one 32-bit register: two 16-bit values (low, high)

static int emu_bank_conflicts = 0;

// round to the nearest bf16, ties to even (as __floats2bfloat162_rn; the values here are finite)
static float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

// round to the nearest fp16 (11 significant bits, subnormals below 2^-14 in steps of 2^-24), ties to even
static float round_fp16(float x) {
    if (x == 0.0f) return x;
    int e;
    frexpf(x, &e);  // |x| = m 2^e, m in [0.5, 1)
    float q = ldexpf(1.0f, e - 11 < -24 ? -24 : e - 11);
    return nearbyintf(x / q) * q;
}

// what the emulated kernels round their 16-bit operands and outputs with (the Tp of the kernels)
static float (*emu_round16)(float) = round_bf16;

// ldmatrix.x4 (.trans) from a tile with rows of FLASH_LDS elements; lane l points at (row[l], col[l])
static void emu_ldmatrix_x4(Reg out[32][4], const float* tile, const int row[32], const int col[32], bool trans) {
    for (int i = 0; i < 4; i++) {
        bool used[32] = {false};  // 32-bit banks of matrix i's 8 rows of 16 bytes
        for (int r = 0; r < 8; r++) {
            int word = (row[8 * i + r] * FLASH_LDS + col[8 * i + r]) * 2 / 4;
            for (int w = 0; w < 4; w++) {
                if (used[(word + w) % 32]) emu_bank_conflicts++;
                used[(word + w) % 32] = true;
            }
        }
        for (int l = 0; l < 32; l++)
            for (int j = 0; j < 2; j++) {
                emu::LdmatrixSource s = emu::ldmatrix_source(l, j, trans);
                int src = 8 * i + s.row;  // the lane that gave the row's address
                out[l][i].v[j] = tile[row[src] * FLASH_LDS + col[src] + s.element];
            }
    }
}

// acc[l][nt] (one 16x8 fp32 tile) += A (16x16) . B (16x8), from per-lane registers a[l][0..3], b0[l], b1[l]
static void emu_mma_16816(float acc[32][8][4], int nt, const Reg a[32][4], const Reg b0[32], const Reg b1[32]) {
    auto a_value = [&](emu::Fragment f) { return a[f.lane][f.reg].v[f.half]; };
    auto b_value = [&](emu::Fragment f) { return (f.reg ? b1 : b0)[f.lane].v[f.half]; };
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 4; e++) acc[l][nt][e] += emu::mma_16816_dot(l, e, a_value, b_value);
}

// the two n-tiles of one ldmatrix.x4 of B operands: registers 0,1 -> n-tile nt, 2,3 -> n-tile nt + 1
static void emu_mma_pair(float acc[32][8][4], int nt, const Reg a[32][4], const Reg b[32][4]) {
    Reg b0[32], b1[32], b2[32], b3[32];
    for (int l = 0; l < 32; l++) b0[l] = b[l][0], b1[l] = b[l][1], b2[l] = b[l][2], b3[l] = b[l][3];
    emu_mma_16816(acc, nt, a, b0, b1);
    emu_mma_16816(acc, nt + 1, a, b2, b3);
}

// load_a_frags: A fragments of rows [row0, row0+16) x 64 channels of a tile
static void emu_load_a_frags(Reg frag[32][4][4], const float* tile, int row0) {
    int row[32], col[32];
    Reg r[32][4];
    for (int ks = 0; ks < 4; ks++) {
        for (int l = 0; l < 32; l++) row[l] = row0 + flash_a_row(l), col[l] = 16 * ks + flash_a_col(l);
        emu_ldmatrix_x4(r, tile, row, col, false);
        for (int l = 0; l < 32; l++) memcpy(frag[l][ks], r[l], sizeof(r[l]));
    }
}

// mma_a_xt: acc (16 x 64) += A (frags) . X^T, X a tile [64 rows][64]
static void emu_mma_a_xt(float acc[32][8][4], const Reg a[32][4][4], const float* X) {
    int row[32], col[32];
    for (int np = 0; np < 4; np++)
        for (int ks = 0; ks < 4; ks++) {
            Reg b[32][4], ak[32][4];
            for (int l = 0; l < 32; l++) row[l] = 16 * np + flash_bt_row(l), col[l] = 16 * ks + flash_bt_col(l);
            emu_ldmatrix_x4(b, X, row, col, false);
            for (int l = 0; l < 32; l++) memcpy(ak[l], a[l][ks], sizeof(ak[l]));
            emu_mma_pair(acc, 2 * np, ak, b);
        }
}

// mma_p_x: acc (16 x 64) += P (an accumulator, rounded to 16 bits as pack2 does) . X, X a tile [64 (k)][64 (n)]
static void emu_mma_p_x(float acc[32][8][4], const float p[32][8][4], const float* X) {
    int row[32], col[32];
    for (int ks = 0; ks < 4; ks++) {
        Reg a[32][4];
        for (int l = 0; l < 32; l++)
            for (int r = 0; r < 4; r++) {
                const float* src = p[l][flash_acc_to_a_ntile(ks, r)] + flash_acc_to_a_elem(r);
                a[l][r].v[0] = emu_round16(src[0]), a[l][r].v[1] = emu_round16(src[1]);
            }
        for (int np = 0; np < 4; np++) {
            Reg b[32][4];
            for (int l = 0; l < 32; l++) row[l] = 16 * ks + flash_b_row(l), col[l] = 16 * np + flash_b_col(l);
            emu_ldmatrix_x4(b, X, row, col, true);
            emu_mma_pair(acc, 2 * np, a, b);
        }
    }
}
