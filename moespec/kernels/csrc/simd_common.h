// What moespec's native kernel files share: the bf16 type and its conversions, eight values widened to fp32 (load8), a
// weight format's widening in the fma tiles (Widen), a horizontal sum of an AVX2 register, and the run-time check for
// the AVX512-BF16 dot-product instructions. Everything here is inline, so the translation units of the one library
// include it without clashing.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace moespec_simd {

typedef uint16_t bf16;

inline float to_f32(float v) { return v; }
inline float to_f32(bf16 v) {
    uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

inline bf16 to_bf16(float v) {  // round to nearest even, as torch does; NaN stays NaN
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((u >> 16) | 0x40);
    return static_cast<bf16>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Eight consecutive values as fp32, in natural order (biases, a row of cached keys or values).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// A weight format's AVX2 widening: a step is the columns one 256-bit weight load covers; it widens to kVecs fp32
// vectors, one at a time (half(p, v)), so a tile holds a single widened weight vector. bf16 is the top half of an
// fp32: one load holds 16 bf16, i.e. 8 dwords of (even, odd) element pairs; shifting each dword left by 16 gives the
// even elements as fp32, masking off its low half the odd ones, two in-lane operations instead of a cross-lane
// widening. The inputs such a weight multiplies are packed to match: within every 16-column block, even columns
// first, then odd ones.
template <class W>
struct Widen;

// Tokens of the largest 256-bit register tile (4 rows x 3 tokens) of the dense and expert kernels.
constexpr int kTileTokens = 3;

// blocks(G): how many token blocks a tile of 4 rows applies G tokens in (sizes as even as possible, at most kTileTokens
// a block). At 4 x 3, fp32's accumulators, the tokens' inputs and one widened weight take the 16 ymm registers; bf16's
// widening mask takes one more, so the compiler spills accumulators to the stack every step and blocks of 2 multiply
// faster, with one block of 3 where G is odd rather than a block of 1, whose weights feed one FMA a load (on an
// AVX2-only Zen 3, interleaved: a 2048 x 2048 dense layer +12-23% from 6 rows, +1-9% in a faster state of its host;
// an OLMoE layer's experts at 72 tokens +7-15%).
template <>
struct Widen<float> {
    static constexpr int kStep = 8, kVecs = 1;
    static constexpr int64_t blocks(int64_t G) { return (G + kTileTokens - 1) / kTileTokens; }
    static inline __m256 half(const float* p, int) { return _mm256_loadu_ps(p); }
};

template <>
struct Widen<bf16> {
    static constexpr int kStep = 16, kVecs = 2;
    static constexpr int64_t blocks(int64_t G) { return G < 2 ? 1 : G / 2; }
    static inline __m256 half(const bf16* p, int v) {
        __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return _mm256_castsi256_ps(v == 0 ? _mm256_slli_epi32(raw, 16)
                                          : _mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
    }
};

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline bool cpu_has_dot() {
    // MOESPEC_NATIVE_DOT=0 keeps the AVX2 path on a CPU that has the dot instructions (the tests use it, so the
    // path every AVX2-only machine runs is checked here too); read once per process.
    static const bool on = [] {
        const char* env = std::getenv("MOESPEC_NATIVE_DOT");
        __builtin_cpu_init();
        return !(env && env[0] == '0') && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl");
    }();
    return on;
}

inline bool one_token_tiles() {
    // One-token calls read their rows in prefetched tiles of kTileRows rows, as larger calls do, on Intel CPUs, and
    // one row after the other with no software prefetch elsewhere: AMD's hardware prefetcher serves a plain
    // sequential read faster (an EPYC's 2 cores: ~29 GB/s a core sequential, ~21-27 GB/s in tiles; an LM head ~63
    // against ~54 GB/s), Intel's slower (a Xeon's 2 cores at a ~25 GB/s streaming read: an OLMoE layer's one-token
    // expert op 21.5 -> 27.0 GB/s, an LM head 17.3 -> 26.8 GB/s in tiles; benchmarks/one_token_paths.py).
    // The streaming read (the ceiling) prefetches where this holds. MOESPEC_NATIVE_ONE_TOKEN=rows or =tiles takes one
    // path on any CPU (the tests check both); read once a process.
    static const bool on = [] {
        const char* env = std::getenv("MOESPEC_NATIVE_ONE_TOKEN");
        if (env && std::strcmp(env, "tiles") == 0) return true;
        if (env && std::strcmp(env, "rows") == 0) return false;
        __builtin_cpu_init();
        return __builtin_cpu_is("intel") != 0;
    }();
    return on;
}

}  // namespace moespec_simd
