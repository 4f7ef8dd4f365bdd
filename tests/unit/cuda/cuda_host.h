// Just enough of CUDA to run a .cu kernel's code on the CPU, for tests of its arithmetic:
// each block of the grid in turn; its threads one after another on this thread where the
// kernel never synchronises them, else as fibers that __syncthreads switches between, so
// that every thread of the block reaches a barrier before any passes it and a returned
// thread is not waited for; __shared__ arrays are one static copy (blocks never run at
// once). A fiber is made once (ucontext) and runs the kernel again for every block; the
// switches are _setjmp/_longjmp, which leave the signal mask alone: swapcontext's two
// system calls a switch made the barriers most of an emulated launch's time (build with
// -U_FORTIFY_SOURCE: a fortified longjmp refuses to jump to another stack). The
// arithmetic is C++'s (compile with -ffp-contract=off): fmaf is the correctly rounded
// fused multiply-add, as on the GPU, and __fmul_rn / __fadd_rn are one rounded operation
// each. The CPU's exp, log, ... are not CUDA's: they may differ in the
// last bits.
#pragma once
#include <algorithm>
#include <atomic>
#include <functional>
#include <math.h>
#include <memory>
#include <setjmp.h>
#include <type_traits>
#include <ucontext.h>
#include <utility>
#include <vector>

struct aepar_dim3 { int x = 1, y = 1, z = 1; };
inline thread_local aepar_dim3 threadIdx, blockIdx;
inline aepar_dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
using std::min;
using std::max;

// the block's threads as fibers: each runs until its next __syncthreads or its end
struct aepar_fibers {
    static constexpr std::size_t STACK = 1 << 18;
    struct jump { jmp_buf at; };
    std::vector<jump> fiber;  // where each fiber waits
    std::vector<std::unique_ptr<char[]>> stacks;  // never written until used: untouched pages cost nothing
    std::vector<char> done;
    jmp_buf scheduler;
    std::function<void()> body;
    int current = 0;
};
inline aepar_fibers aepar_team;
inline bool aepar_in_fiber = false;

// back to the scheduler; the fiber goes on from here when it is next resumed
inline void aepar_yield() {
    if (!_setjmp(aepar_team.fiber[aepar_team.current].at)) _longjmp(aepar_team.scheduler, 1);
}

// a fiber's whole life: the kernel once for each block it is resumed for
inline void aepar_fiber_entry() {
    for (;;) {
        aepar_team.body();
        aepar_team.done[aepar_team.current] = 1;
        aepar_yield();
    }
}

// run fiber t up to its next barrier or its end; its first run (the first round of the
// first launch with t + 1 threads: fibers are made in order) starts it on its stack
inline void aepar_resume(int t) {
    aepar_fibers& team = aepar_team;
    if (_setjmp(team.scheduler)) return;
    if (t < (int)team.fiber.size()) _longjmp(team.fiber[t].at, 1);
    team.fiber.emplace_back();
    ucontext_t start, here;
    getcontext(&start);
    start.uc_stack.ss_sp = team.stacks[t].get();
    start.uc_stack.ss_size = aepar_fibers::STACK;
    start.uc_link = nullptr;  // a fiber never returns
    makecontext(&start, aepar_fiber_entry, 0);
    swapcontext(&here, &start);  // not returned to: the fiber comes back by _longjmp above
}

inline void __syncthreads() {
    if (aepar_in_fiber) aepar_yield();
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
template <typename T> T atomicAdd(T* address, T value) { T old = *address; *address = old + value; return old; }

// kernel<<<grid, block>>>(args...): every block in turn, its threads as fibers where the
// kernel synchronises them (threaded), else one after another
template <typename Kernel, typename... Args>
void aepar_launch_as(bool threaded, aepar_dim3 grid, aepar_dim3 block, Kernel kernel, Args... args) {
    gridDim = grid;
    blockDim = block;
    const int threads = block.x * block.y * block.z;
    const long long blocks = (long long)grid.x * grid.y * grid.z;
    auto thread_of = [&](int t) { return aepar_dim3{t % block.x, t / block.x % block.y, t / (block.x * block.y)}; };
    aepar_fibers& team = aepar_team;
    if (threaded) {
        team.body = [&] { kernel(args...); };
        team.done.assign(threads, 0);
        while ((int)team.stacks.size() < threads) team.stacks.emplace_back(new char[aepar_fibers::STACK]);
    }
    for (long long b = 0; b < blocks; ++b) {
        blockIdx = {int(b % grid.x), int(b / grid.x % grid.y), int(b / grid.x / grid.y)};
        if (!threaded) {
            for (int t = 0; t < threads; ++t) {
                threadIdx = thread_of(t);
                kernel(args...);
            }
            continue;
        }
        std::fill(team.done.begin(), team.done.end(), 0);
        aepar_in_fiber = true;
        for (int live = threads; live > 0;)  // a round: every live thread up to its next barrier
            for (int t = 0; t < threads; ++t) {
                if (team.done[t]) continue;
                team.current = t;
                threadIdx = thread_of(t);
                aepar_resume(t);
                live -= team.done[t];
            }
        aepar_in_fiber = false;
    }
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
