// kernels/cp/rowprod.cu's kernels on the CPU (cuda_host.h) for
// tests/unit/test_kernels_cp_rowprod.py: host_<kernel>(grid x, grid y, block x, block y,
// the kernel's own arguments) launches it as CuPy would with that grid.
#include "cuda_host.h"
#include "../../../kernels/cp/rowprod.cu"

extern "C" void host_rows_times_f32(int gx, int gy, int bx, int by, const float* a, long long lda, const float* b,
                                    long long sbk, long long sbn, float* out, long long ldo, int M, int N, int K) {
    aepar_launch({gx, gy, 1}, {bx, by, 1}, rows_times_f32, a, lda, b, sbk, sbn, out, ldo, M, N, K);
}

extern "C" void host_block_outer_sum_f32(int gx, int gy, int bx, int by, const float* A, long long lda,
                                         const float* D, long long ldd, const long long* starts,
                                         const long long* merges, int blocks, const float* alphas, float* out,
                                         long long ldo, int M, int N) {
    aepar_launch({gx, gy, 1}, {bx, by, 1}, block_outer_sum_f32, A, lda, D, ldd, starts, merges, blocks, alphas,
                 out, ldo, M, N);
}
