// Just enough of CUDA to run a .cu kernel's code on the CPU, for tests of its arithmetic:
// each block of the grid in turn, its threads as std::threads (or, for a kernel that never
// synchronises, one after another on this thread), __syncthreads a barrier that a returned
// thread leaves, __shared__ arrays one static copy (blocks never run at once). The
// arithmetic is C++'s (compile with -ffp-contract=off): fmaf is the correctly rounded fused
// multiply-add, as on the GPU, and __fmul_rn / __fadd_rn are one rounded operation each.
// The CPU's exp, log, ... are not CUDA's: they may differ in the last bits.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <math.h>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

struct aepar_dim3 { int x = 1, y = 1, z = 1; };
inline thread_local aepar_dim3 threadIdx, blockIdx;
inline aepar_dim3 blockDim, gridDim;
inline std::barrier<>* aepar_block_barrier = nullptr;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
using std::min;
using std::max;

inline void __syncthreads() { aepar_block_barrier->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
template <typename T> T atomicAdd(T* address, T value) { return std::atomic_ref<T>(*address).fetch_add(value); }

// kernel<<<grid, block>>>(args...): every block in turn; all its threads at once where the
// kernel synchronises them (threaded: one team of threads for the launch, a fresh barrier
// for each block), else one after another on this thread
template <typename Kernel, typename... Args>
void aepar_launch_as(bool threaded, aepar_dim3 grid, aepar_dim3 block, Kernel kernel, Args... args) {
    gridDim = grid;
    blockDim = block;
    const int threads = block.x * block.y * block.z;
    const long long blocks = (long long)grid.x * grid.y * grid.z;
    auto place = [&](long long b) { return aepar_dim3{int(b % grid.x), int(b / grid.x % grid.y), int(b / grid.x / grid.y)}; };
    auto thread_of = [&](int t) { return aepar_dim3{t % block.x, t / block.x % block.y, t / (block.x * block.y)}; };
    if (!threaded) {
        for (long long b = 0; b < blocks; ++b) {
            blockIdx = place(b);
            for (int t = 0; t < threads; ++t) {
                threadIdx = thread_of(t);
                kernel(args...);
            }
        }
        return;
    }
    std::optional<std::barrier<>> within;  // __syncthreads of the block being run
    within.emplace(threads);
    aepar_block_barrier = &*within;
    long long current = 0;
    auto next_block = [&]() noexcept {
        if (++current < blocks) {
            within.emplace(threads);
            aepar_block_barrier = &*within;
        }
    };
    std::barrier<decltype(next_block)> between(threads, next_block);
    std::vector<std::thread> team;
    for (int t = 0; t < threads; ++t)
        team.emplace_back([&, t] {
            threadIdx = thread_of(t);
            while (current < blocks) {
                blockIdx = place(current);
                kernel(args...);
                aepar_block_barrier->arrive_and_drop();  // as on the GPU, a finished thread is not waited for
                between.arrive_and_wait();
            }
        });
    for (auto& th : team) th.join();
}

template <typename Kernel, typename... Args>
void aepar_launch(aepar_dim3 grid, aepar_dim3 block, Kernel kernel, Args... args) {
    aepar_launch_as(true, grid, block, kernel, args...);
}

// A launch as cuLaunchKernel makes it: each parameter read, as the kernel declares it, from
// the bytes that args[i] points to. aepar_params gives the parameters' sizes (negative for
// pointers) for the caller to check what it passes.
template <typename... P, std::size_t... I>
void aepar_launch_from(bool threaded, void (*kernel)(P...), aepar_dim3 grid, aepar_dim3 block, void** args,
                       std::index_sequence<I...>) {
    aepar_launch_as(threaded, grid, block, kernel, *static_cast<std::decay_t<P>*>(args[I])...);
}
template <typename... P>
void aepar_launch_from(bool threaded, void (*kernel)(P...), aepar_dim3 grid, aepar_dim3 block, void** args) {
    aepar_launch_from(threaded, kernel, grid, block, args, std::index_sequence_for<P...>{});
}
template <typename... P>
int aepar_params(void (*)(P...), long long* sizes) {
    int i = 0;
    ((sizes[i++] = std::is_pointer_v<std::decay_t<P>> ? -1 : (long long)sizeof(std::decay_t<P>)), ...);
    return (int)sizeof...(P);
}
