// Convolution data movement and 2x2 max-pooling for kernels/cp/conv.py (NCHW, row-major).
// The GEMMs are cuBLAS (gemm.py); these kernels gather, scatter and sum the bias gradients.
//
// Column matrix of a chunk of nb images starting at image n0:
//   cols[k, b*P + p], k = (c*kh + i)*kw + j, p = ho*Wo + wo, P = Ho*Wo,
//   = xpad[n0 + b, c, ho*stride + i, wo*stride + j]   (zero outside the image).
// Grid-stride loops; 64-bit flat indices (a batch of 32x32x64 maps passes 2^31 in cols).

template <typename T>
__global__ void im2col(const T* __restrict__ x, T* __restrict__ cols, int n0, int nb, int C,
                       int H, int W, int kh, int kw, int stride, int pad, int Ho, int Wo) {
    const long long P = (long long)Ho * Wo;
    const long long ncol = (long long)nb * P;
    const long long total = (long long)C * kh * kw * ncol;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const long long k = idx / ncol, col = idx % ncol;
        const int b = (int)(col / P), p = (int)(col % P);
        const int ho = p / Wo, wo = p % Wo;
        const int j = (int)(k % kw), i = (int)((k / kw) % kh), c = (int)(k / ((long long)kw * kh));
        const int h = ho * stride + i - pad, w = wo * stride + j - pad;
        T v = 0;
        if (h >= 0 && h < H && w >= 0 && w < W)
            v = x[(((long long)(n0 + b) * C + c) * H + h) * W + w];
        cols[idx] = v;
    }
}

// dx[n0 + b, c, h, w] = bias[c] + sum of the cols entries im2col copied from (h, w):
// a gather (one thread per dx element), so no atomics and a deterministic sum order.
template <typename T>
__global__ void col2im(const T* __restrict__ cols, const T* __restrict__ bias, T* __restrict__ dx,
                       int n0, int nb, int C, int H, int W, int kh, int kw, int stride, int pad,
                       int Ho, int Wo) {
    const long long P = (long long)Ho * Wo;
    const long long ncol = (long long)nb * P;
    const long long total = (long long)nb * C * H * W;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const int w = (int)(idx % W), h = (int)((idx / W) % H);
        const int c = (int)((idx / ((long long)W * H)) % C);
        const int b = (int)(idx / ((long long)W * H * C));
        T s = bias[c];
        for (int i = 0; i < kh; ++i) {
            const int hp = h + pad - i;
            if (hp < 0 || hp % stride) continue;
            const int ho = hp / stride;
            if (ho >= Ho) continue;
            for (int j = 0; j < kw; ++j) {
                const int wp = w + pad - j;
                if (wp < 0 || wp % stride) continue;
                const int wo = wp / stride;
                if (wo >= Wo) continue;
                s += cols[(long long)((c * kh + i) * kw + j) * ncol + (long long)b * P + ho * Wo + wo];
            }
        }
        dx[(long long)n0 * C * H * W + idx] = s;
    }
}

// Between NCHW maps g, y and the GEMMs' (C, nb*P) matrices G, Y of a chunk of images:
//   pack_maps:   G[c, b*P + p] = g[n0 + b, c, p]
//   unpack_maps: y[n0 + b, c, p] = Y[c, b*P + p] + bias[c]   (one thread per y element)
template <typename T>
__global__ void pack_maps(const T* __restrict__ g, T* __restrict__ G, int n0, int nb, int C, long long P) {
    const long long ncol = (long long)nb * P;
    const long long total = (long long)C * ncol;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const long long c = idx / ncol, col = idx % ncol;
        G[idx] = g[((n0 + col / P) * C + c) * P + col % P];
    }
}

template <typename T>
__global__ void unpack_maps(const T* __restrict__ Y, const T* __restrict__ bias, T* __restrict__ y, int n0,
                            int nb, int C, long long P) {
    const long long total = (long long)nb * C * P;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const long long p = idx % P, c = (idx / P) % C, b = idx / (P * C);
        y[(long long)n0 * C * P + idx] = Y[(c * nb + b) * P + p] + bias[c];
    }
}

// db[c] += the sum of dy[n, c, p] over n and p: one block of SUM_THREADS per channel, each
// thread's share in double, then a tree in shared memory (a fixed order: the same bits
// every run).
#define SUM_THREADS 512
template <typename T>
__device__ __forceinline__ double channel_sum(const T* __restrict__ dy, int N, int C, int c, long long P) {
    __shared__ double part[SUM_THREADS];
    const long long count = (long long)N * P;
    double s = 0.0;
    for (long long i = threadIdx.x; i < count; i += SUM_THREADS)
        s += (double)dy[((i / P) * C + c) * P + i % P];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int half = SUM_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    return part[0];
}

template <typename T>
__global__ void channel_sums(const T* __restrict__ dy, T* __restrict__ db, int N, int C, long long P) {
    const double s = channel_sum(dy, N, C, blockIdx.x, P);
    if (threadIdx.x == 0) db[blockIdx.x] += (T)s;
}

// channel_sums of every block of images at once (grid: channels x blocks): block b's
// images starts[b]..starts[b+1] into dbs[b], each the bits of its own channel_sums
template <typename T>
__global__ void block_channel_sums(const T* __restrict__ dy, T* const* __restrict__ dbs,
                                   const long long* __restrict__ starts, int C, long long P) {
    const int b = blockIdx.y;
    const double s = channel_sum(dy + starts[b] * C * P, (int)(starts[b + 1] - starts[b]), C, blockIdx.x, P);
    if (threadIdx.x == 0) dbs[b][blockIdx.x] += (T)s;
}

// outs[b] += the sum of parts[n] over block b's images n = starts[b]..starts[b+1] - 1, added
// in order from the first (parts: one size-element product per image, each its own chain):
// every block's weight gradient in one launch, a block's bits the same in any call
template <typename T>
__global__ void image_sums(const T* __restrict__ parts, T* const* __restrict__ outs,
                           const long long* __restrict__ starts, int blocks, long long size) {
    const long long total = (long long)blocks * size;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const int b = (int)(idx / size);
        const long long e = idx % size, lo = starts[b], hi = starts[b + 1];
        if (lo == hi) continue;
        T s = parts[lo * size + e];
        for (long long n = lo + 1; n < hi; ++n) s += parts[n * size + e];
        outs[b][e] += s;
    }
}

// argmax = 2*di + dj of the window's maximum; strict > keeps the first, like numpy.argmax.
template <typename T>
__global__ void maxpool_fwd(const T* __restrict__ x, T* __restrict__ y, signed char* __restrict__ am,
                            long long total, int H, int W, int Ho, int Wo) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const int wo = (int)(idx % Wo), ho = (int)((idx / Wo) % Ho);
        const long long plane = idx / ((long long)Wo * Ho);
        const T* src = x + plane * H * W + (2 * ho) * W + 2 * wo;
        T best = src[0];
        signed char a = 0;
        if (src[1] > best) { best = src[1]; a = 1; }
        if (src[W] > best) { best = src[W]; a = 2; }
        if (src[W + 1] > best) { best = src[W + 1]; a = 3; }
        y[idx] = best;
        am[idx] = a;
    }
}

// dx must be zeroed by the caller; windows do not overlap, so plain stores suffice.
template <typename T>
__global__ void maxpool_bwd(const T* __restrict__ dy, const signed char* __restrict__ am,
                            T* __restrict__ dx, long long total, int H, int W, int Ho, int Wo) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const int wo = (int)(idx % Wo), ho = (int)((idx / Wo) % Ho);
        const long long plane = idx / ((long long)Wo * Ho);
        const int a = am[idx];
        dx[plane * H * W + (2 * ho + a / 2) * W + 2 * wo + a % 2] = dy[idx];
    }
}
