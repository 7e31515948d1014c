/*
 * attention_flash_layout.cpp: checks, on the host and without a GPU, the index maps that the tensor-core
 * flash attention kernels (llmc/attention_flash.h) use to feed ldmatrix and mma.sync.
 *
 * The two warp instructions are emulated here from their PTX ISA definitions:
 *   ldmatrix.m8n8.x4(.trans).b16: lanes 8i..8i+7 give the addresses of rows 0..7 of matrix i; register i
 *     of lane l gets matrix i's row l/4, elements 2(l%4) and 2(l%4)+1 (with .trans: elements
 *     (2(l%4), l/4) and (2(l%4)+1, l/4)).
 *   mma.m16n8k16.row.col (16-bit A, B; fp32 C), g = l/4, c = l%4: A registers (g, 2c..), (g+8, 2c..),
 *     (g, 2c+8..), (g+8, 2c+8..); B registers (2c.., g), (2c+8.., g); C elements (g, 2c), (g, 2c+1),
 *     (g+8, 2c), (g+8, 2c+1).
 * Then the kernels' two tile products are replayed lane by lane with the header's maps (the loop nests
 * mirror mma_a_xt, mma_p_x and load_a_frags) and compared with plain matrix products:
 *   S = A X^T  (S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T)
 *   O = P X    (O = P V, dV = P^T dO, dK = dS^T Q, dQ = dS K), P taken from an accumulator in registers.
 * Small integers make every sum exact, so the comparison is for equality. It also checks that the 8 row
 * addresses of every ldmatrix matrix fall on distinct bank groups (no shared-memory bank conflicts with
 * the padded row of FLASH_LDS elements).
 *
 * What this cannot check: that the emulation matches the hardware (it encodes the PTX ISA text), the
 * PTX strings, cp.async, the softmax arithmetic. dev/cuda/attention_{forward,backward} check those on a GPU.
 *
 * build and run: g++ -O1 -std=c++17 -DLLMC_CPU attention_flash_layout.cpp -o build/attention_flash_layout
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "../../llmc/attention_flash.h"

struct Reg { float v[2]; };  // one 32-bit register: two 16-bit values (low, high)

static int failures = 0;
static void expect(bool ok, const char* what, int lane, int a, int b, float got, float want) {
    if (!ok && failures++ < 10) printf("  FAIL %s: lane %d (%d, %d): got %g want %g\n", what, lane, a, b, got, want);
}

// ldmatrix.x4 from a tile with rows of FLASH_LDS elements; lane l points at (row[l], col[l])
static void ldmatrix_x4(Reg out[32][4], const float* tile, const int row[32], const int col[32], bool trans) {
    for (int i = 0; i < 4; i++)
        for (int l = 0; l < 32; l++)
            for (int j = 0; j < 2; j++) {
                int r, e;  // row of matrix i (whose address lane 8i + r gave) and element within it
                if (!trans) r = l / 4, e = 2 * (l % 4) + j;
                else r = 2 * (l % 4) + j, e = l / 4;
                int src = 8 * i + r;
                out[l][i].v[j] = tile[row[src] * FLASH_LDS + col[src] + e];
            }
}

// acc (per lane 4 floats, one 16x8 tile) += A (16x16) . B (16x8), from per-lane registers
static void mma_16816(float acc[32][4], const Reg a[32][4], const Reg b0[32], const Reg b1[32]) {
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l / 4, c = l % 4;
        for (int j = 0; j < 2; j++) {
            A[g][2 * c + j] = a[l][0].v[j];
            A[g + 8][2 * c + j] = a[l][1].v[j];
            A[g][2 * c + 8 + j] = a[l][2].v[j];
            A[g + 8][2 * c + 8 + j] = a[l][3].v[j];
            B[2 * c + j][g] = b0[l].v[j];
            B[2 * c + 8 + j][g] = b1[l].v[j];
        }
    }
    for (int l = 0; l < 32; l++) {
        int g = l / 4, c = l % 4;
        for (int e = 0; e < 4; e++) {
            int r = g + (e >= 2 ? 8 : 0), n = 2 * c + (e & 1);
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += A[r][k] * B[k][n];
            acc[l][e] += s;
        }
    }
}

static void fill(float* x, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int)(seed >> 28) - 8);  // integers in [-8, 7]: every product sum is exact in fp32
    }
}

static void check_banks(const int row[32], const int col[32], const char* what) {
    for (int i = 0; i < 4; i++) {
        bool used[32] = {false};
        for (int r = 0; r < 8; r++) {
            int word = (row[8 * i + r] * FLASH_LDS + col[8 * i + r]) * 2 / 4;  // 16-bit elements -> 32-bit words
            for (int w = 0; w < 4; w++) {
                int bank = (word + w) % 32;
                if (used[bank] && failures++ < 10) printf("  FAIL %s: bank conflict in matrix %d\n", what, i);
                used[bank] = true;
            }
        }
    }
}

// one warp (warp index w of the block) computes S (16 x 64) = A[16w..16w+15][0..63] . X^T, X a 64 x 64 tile
static void check_a_xt(int w) {
    static float Atile[FLASH_TILE_ELEMS], X[FLASH_TILE_ELEMS];
    fill(Atile, FLASH_TILE_ELEMS, 1 + w), fill(X, FLASH_TILE_ELEMS, 100 + w);
    Reg af[4][32][4];  // [k-step][lane][reg], as load_a_frags
    int row[32], col[32];
    for (int ks = 0; ks < 4; ks++) {
        for (int l = 0; l < 32; l++) row[l] = 16 * w + flash_a_row(l), col[l] = 16 * ks + flash_a_col(l);
        check_banks(row, col, "A operand");
        ldmatrix_x4(af[ks], Atile, row, col, false);
    }
    static float acc[8][32][4];
    memset(acc, 0, sizeof(acc));
    for (int np = 0; np < 4; np++)
        for (int ks = 0; ks < 4; ks++) {
            Reg b[32][4], b0[32], b1[32], b2[32], b3[32];
            for (int l = 0; l < 32; l++) row[l] = 16 * np + flash_bt_row(l), col[l] = 16 * ks + flash_bt_col(l);
            check_banks(row, col, "B = X^T operand");
            ldmatrix_x4(b, X, row, col, false);
            for (int l = 0; l < 32; l++) b0[l] = b[l][0], b1[l] = b[l][1], b2[l] = b[l][2], b3[l] = b[l][3];
            mma_16816(acc[2 * np], af[ks], b0, b1);
            mma_16816(acc[2 * np + 1], af[ks], b2, b3);
        }
    for (int l = 0; l < 32; l++)
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                int r = 16 * w + flash_acc_row(l, e), n = flash_acc_col(l, nt, e);
                float want = 0.0f;
                for (int d = 0; d < 64; d++) want += Atile[r * FLASH_LDS + d] * X[n * FLASH_LDS + d];
                expect(acc[nt][l][e] == want, "S = A X^T", l, r, n, acc[nt][l][e], want);
            }
}

// one warp computes O (16 x 64) = P (16 x 64, held as an accumulator) . X, X a 64 x 64 tile
static void check_p_x(int seed) {
    static float P[16][64], X[FLASH_TILE_ELEMS];
    fill(&P[0][0], 16 * 64, 7 + seed), fill(X, FLASH_TILE_ELEMS, 300 + seed);
    static float p[8][32][4], o[8][32][4];
    for (int l = 0; l < 32; l++)  // P into the accumulator layout
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) p[nt][l][e] = P[flash_acc_row(l, e)][flash_acc_col(l, nt, e)];
    memset(o, 0, sizeof(o));
    int row[32], col[32];
    for (int ks = 0; ks < 4; ks++) {
        Reg a[32][4];
        for (int l = 0; l < 32; l++)
            for (int r = 0; r < 4; r++) {
                const float* src = p[flash_acc_to_a_ntile(ks, r)][l] + flash_acc_to_a_elem(r);
                a[l][r].v[0] = src[0], a[l][r].v[1] = src[1];
            }
        for (int np = 0; np < 4; np++) {
            Reg b[32][4], b0[32], b1[32], b2[32], b3[32];
            for (int l = 0; l < 32; l++) row[l] = 16 * ks + flash_b_row(l), col[l] = 16 * np + flash_b_col(l);
            check_banks(row, col, "B = X operand (.trans)");
            ldmatrix_x4(b, X, row, col, true);
            for (int l = 0; l < 32; l++) b0[l] = b[l][0], b1[l] = b[l][1], b2[l] = b[l][2], b3[l] = b[l][3];
            mma_16816(o[2 * np], a, b0, b1);
            mma_16816(o[2 * np + 1], a, b2, b3);
        }
    }
    for (int l = 0; l < 32; l++)
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                int r = flash_acc_row(l, e), n = flash_acc_col(l, nt, e);
                float want = 0.0f;
                for (int j = 0; j < 64; j++) want += P[r][j] * X[j * FLASH_LDS + n];
                expect(o[nt][l][e] == want, "O = P X", l, r, n, o[nt][l][e], want);
            }
}

int main() {
    for (int w = 0; w < FLASH_THREADS / 32; w++) check_a_xt(w);
    for (int s = 0; s < 2; s++) check_p_x(s);
    // every (row, column) of a 16 x 64 accumulator is held by exactly one (lane, n-tile, element)
    int seen[16][64] = {{0}};
    for (int l = 0; l < 32; l++)
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) seen[flash_acc_row(l, e)][flash_acc_col(l, nt, e)]++;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 64; n++)
            if (seen[r][n] != 1 && failures++ < 10) printf("  FAIL accumulator element (%d, %d) held %d times\n", r, n, seen[r][n]);
    if (failures) {
        printf("attention_flash_layout: FAILED (%d)\n", failures);
        return 1;
    }
    printf("attention_flash_layout: ldmatrix/mma index maps of the flash kernels reproduce S = A X^T and O = P X "
           "exactly, conflict-free: PASS\n");
    return 0;
}
