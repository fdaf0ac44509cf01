// What moespec's native kernel files share: the bf16 type and its conversions, eight values widened to fp32 (load8), a horizontal sum of an
// AVX2 register, and the run-time check for the AVX512-BF16 dot-product instructions. Everything here is inline,
// so the translation units of the one library include it without clashing.
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

}  // namespace moespec_simd
