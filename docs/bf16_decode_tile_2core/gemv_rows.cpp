// The one-thread decode GEMV (y = W x, W [N, K] row-major, read from DRAM) with C weight rows per register tile,
// f32 and bf16, beside kernels::linear itself: the measurement behind kernels::linear's 4-row decode tiles for 16-bit
// weights. Each variant is the decode tile's loop (AVX-512: one x vector, C weight vectors widened as loaded, C FMAs
// per 16 terms; the next tile's rows prefetched into L2 at the same column). Matrices rotate through 512 MiB of bf16
// (1 GiB of f32) so every call reads them from DRAM; each line gives the best and the median of 200 calls.
// Build and run (from the repository root, on an AVX-512 machine):
//   g++ -O3 -march=native -std=gnu++20 -DNDEBUG -Wno-maybe-uninitialized -I include -isystem /usr/include/eigen3 -o /tmp/gemv_rows
//       docs/bf16_decode_tile_2core/gemv_rows.cpp -ltbb     (one line), then /tmp/gemv_rows N K (default 4096 4096)
// N and K are given together or not at all; K must be a multiple of 16 (no tail) and N · K at most 2^28.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/linear.hpp"

namespace {

using u16 = std::uint16_t;

__m512 widen16(const u16* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

/// Full tiles of C rows only (N % C rows are left out; the bytes counted are those read).
template <int C, class T>
__attribute__((noinline)) void gemv(const float* x, const T* w, float* y, long N, long K) {
    for (long n = 0; n + C <= N; n += C) {
        __m512 acc[C] = {};
        const T* wr = w + n * K;
        for (long k = 0; k < K; k += 16) {
            const __m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 16
            for (int c = 0; c < C; ++c) {
                const T* p = wr + c * K + k;
                _mm_prefetch(reinterpret_cast<const char*>(p + C * K), _MM_HINT_T1);
                __m512 wv;
                if constexpr (sizeof(T) == 4)
                    wv = _mm512_loadu_ps(reinterpret_cast<const float*>(p));
                else
                    wv = widen16(reinterpret_cast<const u16*>(p));
                acc[c] = _mm512_fmadd_ps(xv, wv, acc[c]);
            }
        }
        for (int c = 0; c < C; ++c) y[n + c] = _mm512_reduce_add_ps(acc[c]);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const long N = argc > 2 ? std::atol(argv[1]) : 4096, K = argc > 2 ? std::atol(argv[2]) : 4096;
    const long count = (1L << 28) / (N * K);  // matrices in the pool
    std::vector<float> x(K), y(N);
    auto* wf = static_cast<float*>(::operator new(N * K * count * 4, std::align_val_t{64}));
    auto* wb = static_cast<u16*>(::operator new(N * K * count * 2, std::align_val_t{64}));
    for (long i = 0; i < K; ++i) x[i] = static_cast<float>(i % 7) * 0.1f;
    for (long i = 0; i < N * K * count; ++i) {  // bf16 values, the same in both pools
        std::uint32_t b = static_cast<std::uint32_t>((i * 2654435761u) % 1000u) * 1000u;
        float f = static_cast<float>(b) * 1e-9f;
        std::memcpy(&b, &f, 4);
        wb[i] = static_cast<u16>(b >> 16);
        b &= 0xFFFF0000u;
        std::memcpy(&wf[i], &b, 4);
    }
    const hymix::cpu_backend be(1);
    long next = 0;
    auto time = [&](const char* name, auto fn, double bytes) {
        std::vector<double> t;
        for (int r = 0; r < 200; ++r) {
            const long m = next++ % count;
            const auto t0 = std::chrono::steady_clock::now();
            fn(m);
            t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(t.begin(), t.end());
        std::printf("%-16s best %7.3f ms %6.2f GB/s   median %7.3f ms %6.2f GB/s\n", name, t[0] * 1e3, bytes / t[0] * 1e-9,
                    t[100] * 1e3, bytes / t[100] * 1e-9);
    };
    const hymix::tensor_view<const float, 2> xv(x.data(), {1, K});
    const hymix::tensor_view<float, 2> yv(y.data(), {1, N});
    const double f32_bytes = 4.0 * N * K, bf16_bytes = 2.0 * N * K;
    auto rows = [&](long c) { return static_cast<double>(N / c * c) / static_cast<double>(N); };
    for (int round = 0; round < 3; ++round) {
        std::printf("N %ld, K %ld, round %d\n", N, K, round + 1);
        time("linear f32", [&](long m) { hymix::kernels::linear(be, xv, hymix::tensor_view<const float, 2>(wf + m * N * K, {N, K}), nullptr, yv); }, f32_bytes);
        time("linear bf16", [&](long m) {
            hymix::kernels::linear(be, xv, hymix::tensor_view<const hymix::bf16, 2>(reinterpret_cast<const hymix::bf16*>(wb) + m * N * K, {N, K}), nullptr, yv);
        }, bf16_bytes);
        time("f32 8 rows", [&](long m) { gemv<8>(x.data(), wf + m * N * K, y.data(), N, K); }, f32_bytes * rows(8));
        time("bf16 2 rows", [&](long m) { gemv<2>(x.data(), wb + m * N * K, y.data(), N, K); }, bf16_bytes * rows(2));
        time("bf16 3 rows", [&](long m) { gemv<3>(x.data(), wb + m * N * K, y.data(), N, K); }, bf16_bytes * rows(3));
        time("bf16 4 rows", [&](long m) { gemv<4>(x.data(), wb + m * N * K, y.data(), N, K); }, bf16_bytes * rows(4));
        time("bf16 5 rows", [&](long m) { gemv<5>(x.data(), wb + m * N * K, y.data(), N, K); }, bf16_bytes * rows(5));
        time("bf16 6 rows", [&](long m) { gemv<6>(x.data(), wb + m * N * K, y.data(), N, K); }, bf16_bytes * rows(6));
        time("bf16 8 rows", [&](long m) { gemv<8>(x.data(), wb + m * N * K, y.data(), N, K); }, bf16_bytes * rows(8));
    }
}
