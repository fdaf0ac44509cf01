// The register tiles of moespec's native expert kernels (expert_kernels.cpp): res[r * ldr + t] += <row r of w,
// xs[t]> over a column range, for a few weight rows and tokens held in registers, on three paths:
//   fma  : AVX2 + FMA, fp32 inputs, fp32 or bf16 weights (widened in registers), 4 rows x up to 3 tokens;
//   dot  : AVX512-BF16 (vdpbf16ps, 256-bit), bf16 weights and inputs, 4 rows x up to 3 tokens;
//   wide : AVX512-BF16, 512-bit, bf16 weights and inputs, 4 rows x up to 6 tokens (experts serving several tokens).
// The dot and wide paths are compiled for their ISA per function and chosen at run time (cpu_has_dot); the rest of
// the library needs AVX2 + FMA only. expert_kernels.cpp owns the scheduling: which tile a group of tokens takes,
// the row chunks, column blocks and prefetch distances.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "simd_common.h"

namespace moespec_tiles {

using namespace moespec_simd;  // bf16, to_f32, to_bf16, hsum

// fp32 lanes in one AVX2 register.
constexpr int kLanes = 8;
// Register tile: kTileRows weight rows x up to kTileTokens tokens (simd_common.h; on the fma path in Widen::blocks
// blocks), 12 accumulators plus the tokens' inputs and one widened weight vector in the 16 ymm registers. Each input
// load then feeds 4 FMAs and each weight load 3, which keeps the two FMA pipes busy (a 1 x 8 tile, one load per FMA,
// runs at ~half the rate); and 4 rows of a 4 KiB-strided matrix still leave L1 ways free (8 rows would conflict in
// one set).
constexpr int kTileRows = 4;

// The wide tiles, which the dot path takes for experts serving several tokens (kWideMinTokens in
// expert_kernels.cpp): 512-bit vdpbf16ps, 32 columns per instruction, kTileRows rows x up to kWideTokens tokens.
// 24 accumulators, the 6 tokens' inputs and one weight vector take 31 of the 32 zmm registers; each weight load
// feeds 6 instructions and each input load 4, twice the columns per instruction of the 256-bit tile and twice its
// tokens.
constexpr int kWideTokens = 6;


// Weight formats: the widening (Widen, simd_common.h) and how the inputs a weight multiplies are packed to match.
template <class W>
struct Fmt;

template <>
struct Fmt<float> : Widen<float> {
    static void pack(const float* src, int64_t lo, int64_t hi, int64_t, float* dst) {
        std::copy(src + lo, src + hi, dst + lo);
    }
};

template <>
struct Fmt<bf16> : Widen<bf16> {
    // Packs columns [lo, hi) of a length-K vector; lo is a multiple of kStep. A partial last block stays.
    static void pack(const float* src, int64_t lo, int64_t hi, int64_t K, float* dst) {
        int64_t b = lo;
        for (; b + kStep <= std::min(hi, K / kStep * kStep); b += kStep)
            for (int i = 0; i < kStep / 2; ++i) {
                dst[b + i] = src[b + 2 * i];
                dst[b + kStep / 2 + i] = src[b + 2 * i + 1];
            }
        std::copy(src + b, src + hi, dst + b);
    }
};


// res[r * ldr + t] += <row r of w, xs[t]> over columns [k0, k1), for R rows (stride ldw) and G packed token
// vectors. Each step widens one weight vector at a time (per row, per half) against the inputs of all G
// tokens held in registers.
// With `pw` not null, each cache line of weights read at row r, column k also requests the line of
// pw + r * ldw + k into L2 (the same columns of rows further down the stream).
// (The fma path: fp32 inputs, any weights.)
template <class W, int R, int G>
inline void dot_tile(const W* w, int64_t ldw, const float* const* xs, int64_t k0, int64_t k1, const W* pw,
                     float* res, int64_t ldr) {
    using F = Fmt<W>;
    constexpr int V = F::kVecs;
    // Accumulators per (row, token): per half, and for the smallest tiles per half and step parity too, so
    // that at least 4 FMA chains (one-row tiles) or 8 hide the FMA latency.
    constexpr int A = R * G * V <= 4 ? 2 * V : R * G * V <= 8 ? V : 1;
    constexpr int64_t kLineCols = 64 / sizeof(W);
    static_assert(kLineCols == 2 * F::kStep, "a cache line is two steps");
    __m256 acc[R][G][A];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t)
            _Pragma("GCC unroll 4") for (int a = 0; a < A; ++a) acc[r][t][a] = _mm256_setzero_ps();
    auto step = [&](int64_t k, int p) __attribute__((always_inline)) {
        _Pragma("GCC unroll 2") for (int v = 0; v < V; ++v) {
            __m256 xv[G];
            _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) xv[t] = _mm256_loadu_ps(xs[t] + k + v * kLanes);
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
                const __m256 wv = F::half(w + r * ldw + k, v);
                _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t)
                    acc[r][t][(p * V + v) % A] = _mm256_fmadd_ps(wv, xv[t], acc[r][t][(p * V + v) % A]);
            }
        }
    };
    int64_t k = k0;
    if (pw)
        for (; k + kLineCols <= k1; k += kLineCols) {
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
                _mm_prefetch(reinterpret_cast<const char*>(pw + r * ldw + k), _MM_HINT_T1);
            step(k, 0);
            step(k + F::kStep, 1);
        }
    for (; k + kLineCols <= k1; k += kLineCols) {
        step(k, 0);
        step(k + F::kStep, 1);
    }
    for (; k + F::kStep <= k1; k += F::kStep) step(k, 0);
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) {
            __m256 sum = acc[r][t][0];
            _Pragma("GCC unroll 4") for (int a = 1; a < A; ++a) sum = _mm256_add_ps(sum, acc[r][t][a]);
            float s = hsum(sum);
            for (int64_t kk = k; kk < k1; ++kk) s += to_f32(w[r * ldw + kk]) * xs[t][kk];
            res[r * ldr + t] += s;
        }
}

template <class W, int R>
void dot_tile_tokens(const W* w, int64_t ldw, const float* const* xs, int G, int64_t k0, int64_t k1, const W* pf,
                     float* res, int64_t ldr) {
    static_assert(kTileTokens == 3, "dispatches token blocks of 1 to 3");
    switch (G) {
        case 1: dot_tile<W, R, 1>(w, ldw, xs, k0, k1, pf, res, ldr); break;
        case 2: dot_tile<W, R, 2>(w, ldw, xs, k0, k1, pf, res, ldr); break;
        default: dot_tile<W, R, 3>(w, ldw, xs, k0, k1, pf, res, ldr); break;
    }
}

#define MOESPEC_DOT_ISA "avx512f,avx512bw,avx512vl,avx512bf16"
#define MOESPEC_DOT_TARGET __attribute__((target(MOESPEC_DOT_ISA)))

// The same tile on the dot path (AVX512-BF16, chosen at run time): vdpbf16ps adds w[2i] x[2i] + w[2i+1]
// x[2i+1], both products exact, into fp32 lane i, so bf16 weights meet bf16 inputs in their natural order,
// 16 columns per instruction, with no widening: one load and one instruction per 16 weights and token
// where the fma tile spends two widenings, two input loads and two FMAs. Small tiles keep two
// accumulators per (row, token), for even and odd steps, to hide the instruction's latency. Phase 1 on
// this path measured +5-9% at ~35 GB/s and +10-20% at ~60 GB/s (with the sequential one-token rows).
template <int R, int G>
MOESPEC_DOT_TARGET void dot_tile_bf16(const bf16* w, int64_t ldw, const bf16* const* xs, int64_t k0, int64_t k1,
                                      const bf16* pw, float* res, int64_t ldr) {
    constexpr int A = R * G <= 4 ? 2 : 1;
    __m256 acc[R][G][A];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t)
            _Pragma("GCC unroll 2") for (int a = 0; a < A; ++a) acc[r][t][a] = _mm256_setzero_ps();
    auto step = [&](int64_t k, int a) __attribute__((always_inline, target(MOESPEC_DOT_ISA))) {
        __m256bh xv[G];
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t)
            xv[t] = (__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[t] + k));
        _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
            const __m256bh wv = (__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * ldw + k));
            _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) acc[r][t][a] = _mm256_dpbf16_ps(acc[r][t][a], wv, xv[t]);
        }
    };
    int64_t k = k0;
    for (; k + 32 <= k1; k += 32) {  // one cache line per row
        if (pw)
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
                _mm_prefetch(reinterpret_cast<const char*>(pw + r * ldw + k), _MM_HINT_T1);
        step(k, 0);
        step(k + 16, A - 1);
    }
    if (k + 16 <= k1) {
        step(k, 0);
        k += 16;
    }
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) {
            __m256 sum = acc[r][t][0];
            if constexpr (A == 2) sum = _mm256_add_ps(sum, acc[r][t][1]);
            float s = hsum(sum);
            for (int64_t kk = k; kk < k1; ++kk) s += to_f32(w[r * ldw + kk]) * to_f32(xs[t][kk]);
            res[r * ldr + t] += s;
        }
}

// The wide tile (dot path, 512-bit): res[r * ldr + t] += <row r of w, xs[t]> over columns [k0, k1) for R rows
// and G <= kWideTokens tokens. A last partial step of fewer than 32 columns loads under a mask (masked lanes
// read nothing and add zero), so any K works. With `pw` not null each row's cache line at column k also
// requests the line of pw + r * ldw + k into L2.
template <int R, int G>
MOESPEC_DOT_TARGET void wide_tile(const bf16* w, int64_t ldw, const bf16* const* xs, int64_t k0, int64_t k1,
                                  const bf16* pw, float* res, int64_t ldr) {
    __m512 acc[R][G];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) acc[r][t] = _mm512_setzero_ps();
    auto step = [&](int64_t k, __mmask32 mask) __attribute__((always_inline, target(MOESPEC_DOT_ISA))) {
        __m512bh xv[G];
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t)
            xv[t] = (__m512bh)_mm512_maskz_loadu_epi16(mask, xs[t] + k);
        _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
            const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + r * ldw + k);
            _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv, xv[t]);
        }
    };
    int64_t k = k0;
    if (pw)
        for (; k + 32 <= k1; k += 32) {
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
                _mm_prefetch(reinterpret_cast<const char*>(pw + r * ldw + k), _MM_HINT_T1);
            step(k, ~__mmask32(0));
        }
    for (; k + 32 <= k1; k += 32) step(k, ~__mmask32(0));
    if (k < k1) step(k, static_cast<__mmask32>((uint64_t(1) << (k1 - k)) - 1));
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) res[r * ldr + t] += _mm512_reduce_add_ps(acc[r][t]);
}

template <int R>
void wide_tile_tokens(const bf16* w, int64_t ldw, const bf16* const* xs, int G, int64_t k0, int64_t k1, const bf16* pw,
                      float* res, int64_t ldr) {
    static_assert(kWideTokens == 6, "dispatches token blocks of 1 to 6");
    switch (G) {
        case 1: wide_tile<R, 1>(w, ldw, xs, k0, k1, pw, res, ldr); break;
        case 2: wide_tile<R, 2>(w, ldw, xs, k0, k1, pw, res, ldr); break;
        case 3: wide_tile<R, 3>(w, ldw, xs, k0, k1, pw, res, ldr); break;
        case 4: wide_tile<R, 4>(w, ldw, xs, k0, k1, pw, res, ldr); break;
        case 5: wide_tile<R, 5>(w, ldw, xs, k0, k1, pw, res, ldr); break;
        default: wide_tile<R, 6>(w, ldw, xs, k0, k1, pw, res, ldr); break;
    }
}

// fp32 values rounded to bf16 (nearest even, as to_bf16), 16 at a time.
MOESPEC_DOT_TARGET inline void round_bf16(const float* src, int64_t count, bf16* dst) {
    int64_t i = 0;
    for (; i + 16 <= count; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
    for (; i < count; ++i) dst[i] = to_bf16(src[i]);
}

// A tile of R rows for G = 1..kTileTokens tokens: the fma path for fp32 inputs, the dot path for bf16.
template <int R, class W>
void tile_tokens(const W* w, int64_t ldw, const float* const* xs, int G, int64_t k0, int64_t k1, const W* pf,
                 float* res, int64_t ldr) {
    dot_tile_tokens<W, R>(w, ldw, xs, G, k0, k1, pf, res, ldr);
}
template <int R>
void tile_tokens(const bf16* w, int64_t ldw, const bf16* const* xs, int G, int64_t k0, int64_t k1, const bf16* pf,
                 float* res, int64_t ldr) {
    switch (G) {
        case 1: dot_tile_bf16<R, 1>(w, ldw, xs, k0, k1, pf, res, ldr); break;
        case 2: dot_tile_bf16<R, 2>(w, ldw, xs, k0, k1, pf, res, ldr); break;
        default: dot_tile_bf16<R, 3>(w, ldw, xs, k0, k1, pf, res, ldr); break;
    }
}

}  // namespace moespec_tiles
