/*
 * adamw: the AdamW update of llmc/adamw.h (PyTorch semantics), elementwise over all parameters:
 *   g = grad * grad_scale;  p = p * (1 - lr * wd);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * In the FP32 build the parameters are the master copy (param_copy = NULL). Memory-bound: read master,
 * grad, m, v and write master, m, v: 28 bytes per parameter.
 *
 * versions
 *   1  the project's kernel (llmc/adamw.h): one thread per parameter.
 *   2  float4: one thread per 4 parameters, 16-byte loads and stores of all four arrays (the tail,
 *      n % 4, per element). The arithmetic is adamw_element from llmc/adamw.h, applied to each lane of
 *      the float4, so the results are bitwise the same as version 1.
 *   3  the trainer's optimizer step (llmc/adamw.h adamw_update_ranges): the parameters as 148 tensors of
 *      uneven sizes (GPT-2 124M has 148), every other one without weight decay (as biases and
 *      LayerNorms), ADAMW_BATCH of them per launch of adamw_batch_kernel; each element as in version 1.
 *      Its reference is adamw_cpu over the same tensors.
 *   4  version 3 with the gradient factor and the skip flag read from the device (the --fused-kernels
 *      step's verdict, llmc/step_outputs.h), the host's grad_scale deliberately wrong: version 3's result;
 *      then with the skip flag set: master, m and v exactly as they were.
 *
 * CPU reference: adamw_cpu (llmc/adamw.h) at step t = 5 from random m, v. Tolerances (the device
 * contracts a*b+c into FMAs, the host does not): master 1e-7 abs, m 1e-9 abs, v 1e-12 abs, 1e-5 rel.
 */
#include "common.cuh"
#include "../../llmc/adamw.h"

__global__ void adamw_float4_kernel(float* master, const float* grad, float* m, float* v, size_t n, AdamWArgs a,
                                    float bc1, float bc2_sqrt) {
    size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (i + 3 < n) {
        float4 p = *(float4*)(master + i), g = *(const float4*)(grad + i), mm = *(float4*)(m + i), vv = *(float4*)(v + i);
        adamw_element(&p.x, &mm.x, &vv.x, g.x, a, bc1, bc2_sqrt);
        adamw_element(&p.y, &mm.y, &vv.y, g.y, a, bc1, bc2_sqrt);
        adamw_element(&p.z, &mm.z, &vv.z, g.z, a, bc1, bc2_sqrt);
        adamw_element(&p.w, &mm.w, &vv.w, g.w, a, bc1, bc2_sqrt);
        *(float4*)(master + i) = p, *(float4*)(m + i) = mm, *(float4*)(v + i) = vv;
    } else {
        for (; i < n; i++) adamw_element(master + i, m + i, v + i, grad[i], a, bc1, bc2_sqrt);
    }
}

static const int NV = 4;
static const char* version_names[NV + 1] = {"", "one thread per parameter (llmc)", "float4: one thread per 4 parameters",
                                            "148 tensors, batched launches (llmc step)", "version 3, the factor and skip flag from the device"};
static float* d_verdict;  // version 4: (2) on the device: the skip flag, the gradient factor

// version 3's tensors over the n parameters: uneven sizes (0.5, 1, 1.5 x the mean), every other one
// without weight decay
static const int TENSORS = 148;
static void tensors(AdamWRange* r, float* master, const float* grad, float* m, float* v, size_t n, float weight_decay) {
    size_t start = 0, avg = n / TENSORS;
    for (int j = 0; j < TENSORS; j++) {
        size_t len = j == TENSORS - 1 ? n - start : avg / 2 + avg * (j % 3) / 2;
        r[j] = (AdamWRange){.master = master + start, .param_copy = NULL, .grad = grad + start, .m = m + start, .v = v + start,
                            .n = len, .index_base = start, .weight_decay = j % 2 ? weight_decay : 0.0f};
        start += len;
    }
}

static void run_version(int ver, float* master, const float* grad, float* m, float* v, size_t n, AdamWArgs a) {
    switch (ver) {
        case 1: adamw_update(master, NULL, grad, m, v, n, a); break;
        case 2: {
            float bc1 = 1.0f - powf(a.beta1, (float)a.t), bc2_sqrt = sqrtf(1.0f - powf(a.beta2, (float)a.t));
            adamw_float4_kernel<<<grid_for((n + 3) / 4, 256), 256, 0, main_stream>>>(master, grad, m, v, n, a, bc1, bc2_sqrt);
            break;
        }
        case 3: {
            AdamWRange r[TENSORS];
            tensors(r, master, grad, m, v, n, a.weight_decay);
            adamw_update_ranges(r, TENSORS, a, 1, NULL);
            break;
        }
        case 4: {
            AdamWRange r[TENSORS];
            tensors(r, master, grad, m, v, n, a.weight_decay);
            AdamWArgs wrong = a;
            wrong.grad_scale = -1.0f;  // (the device's factor must replace it)
            adamw_update_ranges(r, TENSORS, wrong, 1, d_verdict);
            break;
        }
    }
    cudaCheck(cudaGetLastError());
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    const size_t n = EMULATED ? 124475904 / 16 : 124475904;  // GPT-2 124M with the vocabulary padded to 50304
    printf("adamw: %zu parameters\n", n);
    bench_init();

    float* master = make_random_uniform(n, 71, -0.1f, 0.1f);
    float* grad = make_random_uniform(n, 72, -0.01f, 0.01f);
    float* m = make_random_uniform(n, 73, -1e-3f, 1e-3f);
    float* v = make_random_uniform(n, 74, 0.0f, 1e-6f);
    AdamWArgs a;
    a.lr = 6e-4f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f;
    a.grad_scale = 0.8f, a.t = 5, a.stochastic = 0, a.index_base = 0;
    float *master_ref = host_copy(master, n), *m_ref = host_copy(m, n), *v_ref = host_copy(v, n);
    adamw_cpu(master_ref, NULL, grad, m_ref, v_ref, n, a);
    float *master_ref3 = host_copy(master, n), *m_ref3 = host_copy(m, n), *v_ref3 = host_copy(v, n);  // version 3's
    AdamWRange r3[TENSORS];
    tensors(r3, master_ref3, grad, m_ref3, v_ref3, n, a.weight_decay);
    for (int j = 0; j < TENSORS; j++) {
        AdamWArgs aj = a;
        aj.weight_decay = r3[j].weight_decay;
        adamw_cpu(r3[j].master, NULL, r3[j].grad, r3[j].m, r3[j].v, r3[j].n, aj);
    }

    float* d_grad = dev_upload(grad, n);
    float *d_master = dev_alloc<float>(n), *d_m = dev_alloc<float>(n), *d_v = dev_alloc<float>(n);
    float apply[2] = {0.0f, a.grad_scale}, skip[2] = {1.0f, a.grad_scale};
    d_verdict = dev_alloc<float>(2);
    dev_set(d_verdict, apply, 2);
    const double bytes = 7.0 * n * sizeof(float);
    for (int ver = 1; ver <= NV; ver++) {
        if (!version_selected(selected, ver)) continue;
        printf("version %d: %s\n", ver, version_names[ver]);
        dev_set(d_master, master, n), dev_set(d_m, m, n), dev_set(d_v, v, n);
        run_version(ver, d_master, d_grad, d_m, d_v, n, a);
        check_close("master", d_master, ver >= 3 ? master_ref3 : master_ref, n, 1e-7, 1e-5);
        check_close("m", d_m, ver >= 3 ? m_ref3 : m_ref, n, 1e-9, 1e-5);
        check_close("v", d_v, ver >= 3 ? v_ref3 : v_ref, n, 1e-12, 1e-5);
        if (ver == 4) {  // a skipped step leaves every bit
            dev_set(d_verdict, skip, 2), dev_set(d_master, master, n), dev_set(d_m, m, n), dev_set(d_v, v, n);
            run_version(ver, d_master, d_grad, d_m, d_v, n, a);
            check_close("skipped: master", d_master, master, n, 0.0, 0.0);
            check_close("skipped: m", d_m, m, n, 0.0, 0.0);
            check_close("skipped: v", d_v, v, n, 0.0, 0.0);
            dev_set(d_verdict, apply, 2);
        }
        float ms = benchmark_ms([&] { run_version(ver, d_master, d_grad, d_m, d_v, n, a); });
        print_bandwidth("adamw", ms, bytes);
    }
    cudaCheck(cudaFree(d_grad)), cudaCheck(cudaFree(d_master)), cudaCheck(cudaFree(d_m)), cudaCheck(cudaFree(d_v)), cudaCheck(cudaFree(d_verdict));
    free(master), free(grad), free(m), free(v), free(master_ref), free(m_ref), free(v_ref), free(master_ref3), free(m_ref3), free(v_ref3);
    return finish();
}
