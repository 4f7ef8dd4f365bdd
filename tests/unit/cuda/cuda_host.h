// Just enough of CUDA to run a .cu kernel's code on the CPU, for tests of its arithmetic:
// each block of the grid in turn, its threads as std::threads, __syncthreads a barrier,
// __shared__ arrays one static copy (blocks never run at once). The arithmetic is C++'s
// (compile with -ffp-contract=off): fmaf is the correctly rounded fused multiply-add, as
// on the GPU, and __fmul_rn / __fadd_rn are one rounded operation each.
#pragma once
#include <algorithm>
#include <barrier>
#include <math.h>
#include <thread>
#include <vector>

struct aepar_dim3 { int x = 1, y = 1, z = 1; };
inline thread_local aepar_dim3 threadIdx, blockIdx;
inline aepar_dim3 blockDim, gridDim;
inline std::barrier<>* aepar_block_barrier = nullptr;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
using std::min;
using std::max;

inline void __syncthreads() { aepar_block_barrier->arrive_and_wait(); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

// kernel<<<grid, block>>>(args...): every block in turn, all its threads at once
template <typename Kernel, typename... Args>
void aepar_launch(aepar_dim3 grid, aepar_dim3 block, Kernel kernel, Args... args) {
    gridDim = grid;
    blockDim = block;
    const int threads = block.x * block.y * block.z;
    for (int bz = 0; bz < grid.z; ++bz)
        for (int by = 0; by < grid.y; ++by)
            for (int bx = 0; bx < grid.x; ++bx) {
                std::barrier<> barrier(threads);
                aepar_block_barrier = &barrier;
                std::vector<std::thread> team;
                for (int t = 0; t < threads; ++t)
                    team.emplace_back([=] {
                        blockIdx = {bx, by, bz};
                        threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        kernel(args...);
                    });
                for (auto& th : team) th.join();
            }
}
