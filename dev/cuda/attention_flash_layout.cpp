/*
 * attention_flash_layout.cpp: checks, on the host and without a GPU, the index maps that the tensor-core
 * flash attention kernels (llmc/attention_flash.h) use to feed ldmatrix and mma.sync.
 *
 * The two warp instructions are emulated from their PTX ISA definitions (dev/emulate/emulate_tensor_core.h,
 * the model the CPU emulation of CUDA runs too), and the kernels' two tile products are replayed lane by
 * lane with the header's maps (attention_flash_replay.h: the loop nests mirror mma_a_xt, mma_p_x and
 * load_a_frags) and compared with plain matrix products:
 *   S = A X^T  (S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T)
 *   O = P X    (O = P V, dV = P^T dO, dK = dS^T Q, dQ = dS K), P taken from an accumulator in registers.
 * Small integers make every sum exact, so the comparison is for equality. It also checks that the 8 row
 * addresses of every ldmatrix matrix fall on distinct bank groups (no shared-memory bank conflicts with
 * the padded row of FLASH_LDS elements).
 *
 * What this cannot check: that the emulation matches the hardware (it encodes the PTX ISA text), the
 * PTX strings, cp.async. attention_flash_emulate.cpp runs the whole algorithm on this emulation;
 * dev/cuda/attention_{forward,backward} check everything on a GPU.
 *
 * build and run: g++ -O1 -std=c++17 -DLLMC_CPU attention_flash_layout.cpp -o build/attention_flash_layout
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "attention_flash_replay.h"

static int failures = 0;
static void expect(bool ok, const char* what, int lane, int a, int b, float got, float want) {
    if (!ok && failures++ < 10) printf("  FAIL %s: lane %d (%d, %d): got %g want %g\n", what, lane, a, b, got, want);
}

static void fill(float* x, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int)(seed >> 28) - 8);  // integers in [-8, 7]: every product sum is exact in fp32
    }
}

// one warp (warp index w of the block) computes S (16 x 64) = A[16w..16w+15][0..63] . X^T, X a 64 x 64 tile
static void check_a_xt(int w) {
    static float Atile[FLASH_TILE_ELEMS], X[FLASH_TILE_ELEMS];
    fill(Atile, FLASH_TILE_ELEMS, 1 + w), fill(X, FLASH_TILE_ELEMS, 100 + w);
    static Reg af[32][4][4];
    static float acc[32][8][4];
    emu_load_a_frags(af, Atile, 16 * w);
    memset(acc, 0, sizeof(acc));
    emu_mma_a_xt(acc, af, X);
    for (int l = 0; l < 32; l++)
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                int r = 16 * w + flash_acc_row(l, e), n = flash_acc_col(l, nt, e);
                float want = 0.0f;
                for (int d = 0; d < 64; d++) want += Atile[r * FLASH_LDS + d] * X[n * FLASH_LDS + d];
                expect(acc[l][nt][e] == want, "S = A X^T", l, r, n, acc[l][nt][e], want);
            }
}

// one warp computes O (16 x 64) = P (16 x 64, held as an accumulator) . X, X a 64 x 64 tile
static void check_p_x(int seed) {
    static float P[16][64], X[FLASH_TILE_ELEMS];
    fill(&P[0][0], 16 * 64, 7 + seed), fill(X, FLASH_TILE_ELEMS, 300 + seed);
    static float p[32][8][4], o[32][8][4];
    for (int l = 0; l < 32; l++)  // P into the accumulator layout
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) p[l][nt][e] = P[flash_acc_row(l, e)][flash_acc_col(l, nt, e)];
    memset(o, 0, sizeof(o));
    emu_mma_p_x(o, p, X);
    for (int l = 0; l < 32; l++)
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                int r = flash_acc_row(l, e), n = flash_acc_col(l, nt, e);
                float want = 0.0f;
                for (int j = 0; j < 64; j++) want += P[r][j] * X[j * FLASH_LDS + n];
                expect(o[l][nt][e] == want, "O = P X", l, r, n, o[l][nt][e], want);
            }
}

int main() {
    for (int w = 0; w < FLASH_THREADS / 32; w++) check_a_xt(w);
    for (int s = 0; s < 2; s++) check_p_x(s);
    if (emu_bank_conflicts && failures++ < 10) printf("  FAIL %d shared-memory bank conflicts in ldmatrix\n", emu_bank_conflicts);
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
