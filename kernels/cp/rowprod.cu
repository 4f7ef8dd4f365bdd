// Products whose every element is one FMA chain in a fixed order, for kernels/cp/rowprod.py:
// the GPU's counterpart of kernels/nb/rowprod.py, with the same sums in the same order.
//
// rows_times_f32: out[m, n] = fma(a[m, K-1], b[K-1, n], ... fma(a[m, 0], b[0, n], 0)), a[m, k]
//   at a[m * sam + k * sak] and b[k, n] at b[k * sbk + n * sbn] (W: sbk = ldw, sbn = 1; W.T:
//   sbk = 1, sbn = ldw; either operand may be a transposed view). A row's result depends on
//   that row of a alone, not on the rows beside it, so all blocks' rows go in one launch and
//   each block keeps the bits it has alone. blockIdx.z picks one product of a stack: a, b
//   and out advanced by z times sza, szb and szo elements (a convolution's images, each its
//   own chain over its pixels, in one launch).
// block_outer_sum_f32: out = the fixed tree over blocks b of alphas[b] * A_b.T @ D_b, A_b and
//   D_b the rows starts[b]..starts[b+1] of A (R x M) and D (R x N): per block an FMA chain
//   over its rows in order from 0, one rounded multiply by alphas[b] (unless it is 1), then
//   merges[b] additions of the partial sums on a stack (a postfix tree), as the CPU's tiles.
//   With parts = 2 a block's chain runs over its rows of (A, D), then over the same rows of
//   (A2, D2): the chain of the two parts interleaved block by block, without the copy.
//
// A block of 16 x 16 threads takes a 16R x 16R tile of out, each thread R x R elements
// (rows ty + 16 i, columns tx + 16 j: a warp's loads from shared memory are broadcasts or
// consecutive); the operands pass through shared memory TK steps at a time. Each kernel
// comes in three instances: wide (R = 4, TK = 16: 64 x 64 tiles), thin (R = 1, TK = 64),
// whose 16 x 16 tiles give a small product enough blocks to fill the multiprocessors and
// whose longer chunks take fewer waits for memory, and mid (R = 2, TK = 32: 32 x 32 tiles),
// between them: a thin thread loads two floats from shared memory for each FMA, a mid one
// one, for a quarter of the blocks (a batch of 100 through a 1000-wide layer: 128 blocks).
// An element's chain is the same in every instance (the tiles and chunks only cut it into
// steps), so are its bits. The k loop of a chunk
// stops at the operands' end, so no padding enters a sum. Only fmaf, __fmul_rn and
// __fadd_rn do arithmetic (compiled with --fmad=false): no contraction can change a rounding.

#define RP_THREADS 256
#define RP_MAX_DEPTH 16  // block_outer_sum_f32's stack: a postfix tree at most this deep

// acc[i][j] (row ty + 16 i, column tx + 16 j of the tile) += the chunk's kn steps, in order
template <int R>
__device__ __forceinline__ void fma_steps(const float (*As)[16 * R + 1], const float (*Bs)[16 * R + 1], int kn,
                                          float acc[R][R]) {
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int kk = 0; kk < kn; ++kk) {
        float av[R], bv[R];
        for (int i = 0; i < R; ++i) av[i] = As[kk][ty + 16 * i];
        for (int j = 0; j < R; ++j) bv[j] = Bs[kk][tx + 16 * j];
        for (int i = 0; i < R; ++i)
            for (int j = 0; j < R; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
}

// this thread's elements of the tile at (m0, n0) into out, those inside M x N
template <int R>
__device__ __forceinline__ void store_tile(float* __restrict__ out, long long ldo, int m0, int n0, int M, int N,
                                           const float acc[R][R]) {
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < R; ++j) {
            const int m = m0 + threadIdx.y + 16 * i, n = n0 + threadIdx.x + 16 * j;
            if (m < M && n < N) out[(long long)m * ldo + n] = acc[i][j];
        }
}

template <int R, int TK>
__device__ __forceinline__ void rows_times_tile(const float* __restrict__ a, long long sam, long long sak,
                                                const float* __restrict__ b, long long sbk, long long sbn,
                                                float* __restrict__ out, long long ldo, int M, int N, int K) {
    constexpr int TM = 16 * R, TN = 16 * R;
    __shared__ float As[TK][TM + 1];
    __shared__ float Bs[TK][TN + 1];
    const int tx = threadIdx.x, ty = threadIdx.y, t = ty * 16 + tx;
    const int m0 = blockIdx.y * TM, n0 = blockIdx.x * TN;
    float acc[R][R];
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < R; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TK) {
        const int kn = min(TK, K - k0);
        for (int e = t; e < TK * TM; e += RP_THREADS) {  // a along its contiguous axis
            const int kk = sak == 1 ? e % TK : e / TM, mm = sak == 1 ? e / TK : e % TM, m = m0 + mm;
            As[kk][mm] = (m < M && kk < kn) ? a[(long long)m * sam + (long long)(k0 + kk) * sak] : 0.0f;
        }
        for (int e = t; e < TK * TN; e += RP_THREADS) {  // b along its contiguous axis
            const int kk = sbn == 1 ? e / TN : e % TK, nn = sbn == 1 ? e % TN : e / TK;
            const int n = n0 + nn;
            Bs[kk][nn] = (n < N && kk < kn) ? b[(long long)(k0 + kk) * sbk + (long long)n * sbn] : 0.0f;
        }
        __syncthreads();
        fma_steps<R>(As, Bs, kn, acc);
        __syncthreads();
    }
    store_tile<R>(out, ldo, m0, n0, M, N, acc);
}

#define RP_ROWS_TIMES_ARGS const float* __restrict__ a, long long sza, long long sam, long long sak, \
    const float* __restrict__ b, long long szb, long long sbk, long long sbn, float* __restrict__ out, long long szo, \
    long long ldo, int M, int N, int K
#define RP_ROWS_TIMES_OF_Z a + blockIdx.z * sza, sam, sak, b + blockIdx.z * szb, sbk, sbn, out + blockIdx.z * szo, \
    ldo, M, N, K
extern "C" __global__ void rows_times_f32(RP_ROWS_TIMES_ARGS) {
    rows_times_tile<4, 16>(RP_ROWS_TIMES_OF_Z);
}
extern "C" __global__ void rows_times_thin_f32(RP_ROWS_TIMES_ARGS) {
    rows_times_tile<1, 64>(RP_ROWS_TIMES_OF_Z);
}
extern "C" __global__ void rows_times_mid_f32(RP_ROWS_TIMES_ARGS) {
    rows_times_tile<2, 32>(RP_ROWS_TIMES_OF_Z);
}

// the blocks' factors, as block_outer_sum_f32 and block_outer_sum_sgd_f32 take them
#define RP_FACTORS const float* __restrict__ A, long long lda, const float* __restrict__ D, long long ldd, \
    const float* __restrict__ A2, long long lda2, const float* __restrict__ D2, long long ldd2, int parts, \
    const long long* __restrict__ starts, const long long* __restrict__ merges, int blocks, \
    const float* __restrict__ alphas
#define RP_FACTOR_ARGS A, lda, D, ldd, A2, lda2, D2, ldd2, parts, starts, merges, blocks, alphas

// acc = this thread's elements of the tile at (m0, n0) of block_outer_sum_f32's sum
template <int R, int TK>
__device__ __forceinline__ void tree_of_tiles(RP_FACTORS, int M, int N, int m0, int n0, float acc[R][R]) {
    constexpr int TM = 16 * R, TN = 16 * R;
    __shared__ float As[TK][TM + 1];
    __shared__ float Ds[TK][TN + 1];
    const int tx = threadIdx.x, ty = threadIdx.y, t = ty * 16 + tx;
    float stack[RP_MAX_DEPTH][R][R];
    int top = 0;
    for (int blk = 0; blk < blocks; ++blk) {
        for (int i = 0; i < R; ++i)
            for (int j = 0; j < R; ++j) acc[i][j] = 0.0f;
        const long long end = starts[blk + 1];
        for (int part = 0; part < parts; ++part) {
            const float* __restrict__ Ap = part ? A2 : A;
            const float* __restrict__ Dp = part ? D2 : D;
            const long long la = part ? lda2 : lda, ld = part ? ldd2 : ldd;
            for (long long r0 = starts[blk]; r0 < end; r0 += TK) {
                const int kn = (int)min((long long)TK, end - r0);
                for (int e = t; e < TK * TM; e += RP_THREADS) {  // A's rows: i runs along them
                    const int kk = e / TM, mm = e % TM, m = m0 + mm;
                    As[kk][mm] = (m < M && kk < kn) ? Ap[(r0 + kk) * la + m] : 0.0f;
                }
                for (int e = t; e < TK * TN; e += RP_THREADS) {
                    const int kk = e / TN, nn = e % TN, n = n0 + nn;
                    Ds[kk][nn] = (n < N && kk < kn) ? Dp[(r0 + kk) * ld + n] : 0.0f;
                }
                __syncthreads();
                fma_steps<R>(As, Ds, kn, acc);
                __syncthreads();
            }
        }
        const float alpha = alphas[blk];
        if (alpha != 1.0f)
            for (int i = 0; i < R; ++i)
                for (int j = 0; j < R; ++j) acc[i][j] = __fmul_rn(acc[i][j], alpha);
        for (long long q = 0; q < merges[blk]; ++q) {
            --top;
            for (int i = 0; i < R; ++i)
                for (int j = 0; j < R; ++j) acc[i][j] = __fadd_rn(stack[top][i][j], acc[i][j]);
        }
        if (blk + 1 < blocks) {
            for (int i = 0; i < R; ++i)
                for (int j = 0; j < R; ++j) stack[top][i][j] = acc[i][j];
            ++top;
        }
    }
}

template <int R, int TK>
__device__ __forceinline__ void block_outer_sum_tile(RP_FACTORS, float* __restrict__ out, long long ldo, int M,
                                                     int N) {
    const int m0 = blockIdx.y * 16 * R, n0 = blockIdx.x * 16 * R;
    float acc[R][R];
    tree_of_tiles<R, TK>(RP_FACTOR_ARGS, M, N, m0, n0, acc);
    store_tile<R>(out, ldo, m0, n0, M, N, acc);
}

extern "C" __global__ void block_outer_sum_f32(RP_FACTORS, float* __restrict__ out, long long ldo, int M, int N) {
    block_outer_sum_tile<4, 16>(RP_FACTOR_ARGS, out, ldo, M, N);
}
extern "C" __global__ void block_outer_sum_thin_f32(RP_FACTORS, float* __restrict__ out, long long ldo, int M,
                                                    int N) {
    block_outer_sum_tile<1, 64>(RP_FACTOR_ARGS, out, ldo, M, N);
}
extern "C" __global__ void block_outer_sum_mid_f32(RP_FACTORS, float* __restrict__ out, long long ldo, int M,
                                                   int N) {
    block_outer_sum_tile<2, 32>(RP_FACTOR_ARGS, out, ldo, M, N);
}

// block_outer_sum_sgd_f32: SGD with momentum on p and v (M x N, row stride ldo) with the
// gradient g = block_outer_sum_f32's, each element stepped where its sum ends instead of
// written out: v = momentum * v - lr * (g + c * p); p += v, each operation rounded on its
// own as in update.py's sgd_many (so the bits of the sum, then the step)
template <int R, int TK>
__device__ __forceinline__ void block_outer_sum_sgd_tile(RP_FACTORS, float* __restrict__ p, float* __restrict__ v,
                                                         long long ldo, int M, int N, const float lr,
                                                         const float momentum, const float c) {
    const int m0 = blockIdx.y * 16 * R, n0 = blockIdx.x * 16 * R;
    float acc[R][R];
    tree_of_tiles<R, TK>(RP_FACTOR_ARGS, M, N, m0, n0, acc);
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < R; ++j) {
            const int m = m0 + threadIdx.y + 16 * i, n = n0 + threadIdx.x + 16 * j;
            if (m < M && n < N) {
                const long long e = (long long)m * ldo + n;
                const float vj = momentum * v[e] - lr * (acc[i][j] + c * p[e]);
                v[e] = vj;
                p[e] += vj;
            }
        }
}

#define RP_SGD_ARGS float* __restrict__ p, float* __restrict__ v, long long ldo, int M, int N, const float lr, \
    const float momentum, const float c
extern "C" __global__ void block_outer_sum_sgd_f32(RP_FACTORS, RP_SGD_ARGS) {
    block_outer_sum_sgd_tile<4, 16>(RP_FACTOR_ARGS, p, v, ldo, M, N, lr, momentum, c);
}
extern "C" __global__ void block_outer_sum_sgd_thin_f32(RP_FACTORS, RP_SGD_ARGS) {
    block_outer_sum_sgd_tile<1, 64>(RP_FACTOR_ARGS, p, v, ldo, M, N, lr, momentum, c);
}
extern "C" __global__ void block_outer_sum_sgd_mid_f32(RP_FACTORS, RP_SGD_ARGS) {
    block_outer_sum_sgd_tile<2, 32>(RP_FACTOR_ARGS, p, v, ldo, M, N, lr, momentum, c);
}
