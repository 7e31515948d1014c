/*
 * emulate_tensor_core.h: the two tensor-core warp instructions of the flash attention (llmc/
 * attention_flash_mma.h), as the PTX ISA defines them: which lane's register holds which element of
 * which matrix. The one model of them in the project, used by
 *   - emulate.h: ldmatrix_x4 and mma_16816, run lane by lane on the emulated threads (each lane publishes
 *     its operands to the warp, then computes its own registers from every lane's, with these maps);
 *   - dev/cuda/attention_flash_replay.h: the flash kernels' warp tile products replayed on whole-warp
 *     arrays (`make -C dev/cuda layout`).
 * Plain C++ with no CUDA header, so both can include it.
 *
 *   ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8i..8i+7 give the addresses of rows 0..7 of
 *     matrix i; register i of lane l gets matrix i's row l/4, elements 2(l%4) and 2(l%4)+1 (with .trans:
 *     elements (2(l%4), l/4) and (2(l%4)+1, l/4)).
 *   mma.sync.aligned.m16n8k16.row.col.f32 (16-bit A, B; fp32 C, D), g = l/4, c = l%4: lane l holds A
 *     (16x16) elements (g, 2c..2c+1), (g+8, 2c..), (g, 2c+8..), (g+8, 2c+8..) in registers a0..a3, B (16x8)
 *     elements (2c..2c+1, g) in b0 and (2c+8.., g) in b1, and D (16x8) elements (g, 2c), (g, 2c+1),
 *     (g+8, 2c), (g+8, 2c+1) in d0..d3.
 * A 32-bit register holds two 16-bit elements, the lower-numbered one in its low half.
 */
#pragma once

namespace emu {

// ldmatrix: half j (0 low, 1 high) of register i of lane `lane` is element `element` of row `row` of
// matrix i, the row whose address lane 8i + row gave
struct LdmatrixSource {
    int row, element;
};
inline LdmatrixSource ldmatrix_source(int lane, int j, bool trans) {
    if (trans) return {2 * (lane % 4) + j, lane / 4};
    return {lane / 4, 2 * (lane % 4) + j};
}

// mma: where an operand element lives: half `half` of register `reg` of lane `lane` (A: a0..a3; B: b0, b1)
struct Fragment {
    int lane, reg, half;
};
inline Fragment mma_a_at(int row, int k) { return {(row % 8) * 4 + (k % 8) / 2, (row >= 8) + 2 * (k >= 8), k % 2}; }
inline Fragment mma_b_at(int k, int col) { return {col * 4 + (k % 8) / 2, k >= 8, k % 2}; }
// the (row, col) of D that element e (0..3) of lane `lane` holds
inline void mma_d_at(int lane, int e, int* row, int* col) {
    *row = lane / 4 + (e >= 2 ? 8 : 0);
    *col = 2 * (lane % 4) + (e & 1);
}

// element e of lane `lane`'s D: the sum over k of A (row, k) B (k, col), in fp32, k from 0 to 15 (the
// hardware's internal order and rounding are not modelled), with a(Fragment) and b(Fragment) giving the
// value of an operand element
template <typename A, typename B>
float mma_16816_dot(int lane, int e, A a, B b) {
    int row, col;
    mma_d_at(lane, e, &row, &col);
    float sum = 0.0f;
    for (int k = 0; k < 16; k++) sum += a(mma_a_at(row, k)) * b(mma_b_at(k, col));
    return sum;
}

}  // namespace emu
