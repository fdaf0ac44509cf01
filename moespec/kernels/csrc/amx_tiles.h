// The AMX paths of moespec's native kernels, on the tile registers (AMX-TILE and AMX-BF16, chosen at run time:
// amx_ready): y[t * ldy + r - lo] = <row r of w, xs[t]> for rows [lo, hi) of a bf16 matrix and G bf16 token vectors
// (amx_rows: the expert kernels' experts serving many tokens, expert_kernels.cpp; attention's scores, the cached keys
// as the rows), and the product of a few rows of weights with values packed in pairs of rows (amx_values:
// attention's sums of values, attention_kernels.cpp).
//
// One tdpbf16ps multiplies a tile of 16 weight rows x 32 columns, loaded straight from the row-major matrix (16 rows
// at stride K: the weights are never repacked), by the same 32 columns of 16 tokens packed in pairs (the layout the
// instruction takes for its second operand), into 16 x 16 fp32 sums: 8192 multiply-adds an instruction where a
// 512-bit vdpbf16ps does 32. Past a few tokens an expert's wide tiles (expert_tiles.h) are bound by their
// multiply-adds; on the tiles a group of 16 tokens costs about the stream of its weights, one of 32 ~25% more.
//
// Shapes (K a multiple of kAmxCols):
//   w    [rows, K] bf16, row-major, stride ldw >= K
//   xs   G pointers to K bf16 each (the group's tokens, or their activations h)
//   xp   [ceil(G / 16)][K / 32][16][32] bf16, packed by amx_pack: xp[b][c][i][2 n + j] = xs[16 b + n][32 c + 2 i + j],
//        zero for tokens past G
//   sums [32][32] fp32 scratch: one 16 x 16 tile per (16 rows, 16 tokens) of a block
//   p    [ceil(rows / 16) 16, ldp] bf16 weights of the values (zero past `rows` and past L keys)
//   vp   [ceil(L / 32)][Dv / 16][16][32] bf16, packed by amx_pack_pairs:
//        vp[c][b][i][2 e + j] = v[32 c + 2 i + j][16 b + e], zero for keys past L
// Tiles (amx_rows): tmm0-3 the sums of (row tile, token tile), tmm4-5 the two row tiles, tmm6-7 the two token tiles.
#pragma once

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "simd_common.h"

namespace moespec_amx {

using moespec_simd::bf16;

constexpr int kAmxRows = 16;    // weight rows of a tile
constexpr int kAmxTokens = 16;  // tokens of a tile
constexpr int kAmxCols = 32;    // columns of a tile: 64 bytes of bf16, one cache line of each weight row
constexpr int64_t kAmxPacked = kAmxTokens * kAmxCols;  // bf16 of one packed (token tile, column block)

// The tile intrinsics came with GCC 11 and Clang 12; an older compiler (or MOESPEC_NO_AMX, which the tests define to
// check this build) gets a library without them: amx_ready() false, and the kernels never call the others.
#if !defined(MOESPEC_NO_AMX) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define MOESPEC_AMX 1
#endif

#ifndef MOESPEC_AMX
inline bool amx_ready() { return false; }
inline void amx_pack(const bf16* const*, int64_t, int64_t, bf16*) {}
inline int64_t amx_rows(const bf16*, int64_t, int64_t, int64_t lo, int64_t, const bf16*, int64_t, float*, int64_t,
                        float*) {
    return lo;
}
inline void amx_pack_pairs(const bf16*, int64_t, int64_t, int64_t, bf16*) {}
inline void amx_values(const bf16*, int64_t, int64_t, int64_t, const bf16*, int64_t, float*) {}
#else

// Whether this process runs the tiles: the CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22) and
// Linux grants the tile registers' state (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, Linux 5.16+; a
// process must ask before its first tile instruction). MOESPEC_NATIVE_AMX=0 keeps the wide tiles on any CPU (the
// tests check both). Read once a process.
inline bool amx_ready() {
    static const bool on = [] {
        const char* env = std::getenv("MOESPEC_NATIVE_AMX");
        if (env && env[0] == '0') return false;
        unsigned a = 0, b = 0, c = 0, d = 0;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 22) & 1)) return false;
        constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
        return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
    }();
    return on;
}

#define MOESPEC_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))

// The tile configuration every call loads (palette 1): the 8 tiles all 16 rows of 64 bytes.
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
    TileConfig() {
        for (int t = 0; t < 8; ++t) {
            colsb[t] = 64;
            rows[t] = kAmxRows;
        }
    }
};

// The 16 x 16 32-bit words of r transposed in place: word j of r[i] to word i of r[j].
MOESPEC_AMX_TARGET inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {  // pairs of words
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // 4 x 4 words within each 128-bit lane
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {  // then the 4 x 4 lanes: rows i, i + 4, i + 8, i + 12 hold one word column each
        const __m512i a = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88), b = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        const __m512i c = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88), d = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
        t[i] = _mm512_shuffle_i32x4(a, c, 0x88);
        t[i + 8] = _mm512_shuffle_i32x4(a, c, 0xdd);
        t[i + 4] = _mm512_shuffle_i32x4(b, d, 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(b, d, 0xdd);
    }
    for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Packs G token vectors of K bf16 into xp (the layout above): a block's 32 columns of a token are 16 pairs, i.e.
// 16 words, and the block's tile is the transpose of its 16 tokens' words (zero rows past G).
MOESPEC_AMX_TARGET inline void amx_pack(const bf16* const* xs, int64_t G, int64_t K, bf16* xp) {
    const int64_t blocks = K / kAmxCols;
    for (int64_t t0 = 0; t0 < G; t0 += kAmxTokens) {
        const int64_t tn = std::min<int64_t>(kAmxTokens, G - t0);
        bf16* tile = xp + t0 / kAmxTokens * blocks * kAmxPacked;
        for (int64_t c = 0; c < blocks; ++c) {
            __m512i r[16];
            for (int64_t i = 0; i < kAmxTokens; ++i)
                r[i] = i < tn ? _mm512_loadu_si512(xs[t0 + i] + c * kAmxCols) : _mm512_setzero_si512();
            transpose16(r);
            for (int i = 0; i < 16; ++i) _mm512_storeu_si512(tile + c * kAmxPacked + i * kAmxCols, r[i]);
        }
    }
}

// Loads the tile configuration every call of this file runs under (its caller releases the tiles at the end).
MOESPEC_AMX_TARGET inline void amx_configure() {
    static const TileConfig config;
    _tile_loadconfig(&config);
}

// One block: RB row tiles (16 RB rows from w, stride ldw) x TB token tiles (xp, the next token tile at xp + tile_step),
// over all K columns, into sums[16 RB][32] (row r, token t at r * 32 + t). No software prefetch: the hardware's
// keeps up with the 16-32 row streams (a prefetch of the next block's rows measured 3-4% slower).
template <int RB, int TB>
MOESPEC_AMX_TARGET void amx_block(const bf16* w, int64_t K, int64_t ldw, const bf16* xp, int64_t tile_step,
                                  float* sums) {
    _tile_zero(0);
    if constexpr (TB == 2) _tile_zero(1);
    if constexpr (RB == 2) _tile_zero(2);
    if constexpr (RB == 2 && TB == 2) _tile_zero(3);
    const int64_t stride = ldw * static_cast<int64_t>(sizeof(bf16));
    for (int64_t c = 0; c < K; c += kAmxCols) {
        const bf16* x = xp + c / kAmxCols * kAmxPacked;
        _tile_loadd(4, w + c, stride);
        _tile_loadd(6, x, 64);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (TB == 2) {
            _tile_loadd(7, x + tile_step, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if constexpr (RB == 2) {
            _tile_loadd(5, w + kAmxRows * ldw + c, stride);
            _tile_dpbf16ps(2, 5, 6);
            if constexpr (TB == 2) _tile_dpbf16ps(3, 5, 7);
        }
    }
    constexpr int64_t ld = 2 * kAmxTokens * sizeof(float);
    _tile_stored(0, sums, ld);
    if constexpr (TB == 2) _tile_stored(1, sums + kAmxTokens, ld);
    if constexpr (RB == 2) _tile_stored(2, sums + kAmxRows * 2 * kAmxTokens, ld);
    if constexpr (RB == 2 && TB == 2) _tile_stored(3, sums + kAmxRows * 2 * kAmxTokens + kAmxTokens, ld);
}

// y[t * ldy + r - lo] = <row r of w, xs[t]> for rows [lo, lo + 16 j), the most whole row tiles in [lo, hi), of w's
// rows at stride ldw (>= K), from the packed tokens xp (amx_pack) of G tokens; returns the first row it did not do
// (the caller's other tiles take the rest). Blocks of 32 rows (16 for a last odd tile) x 32 tokens. `sums`: 32 x 32
// fp32 scratch.
MOESPEC_AMX_TARGET inline int64_t amx_rows(const bf16* w, int64_t K, int64_t ldw, int64_t lo, int64_t hi,
                                           const bf16* xp, int64_t G, float* y, int64_t ldy, float* sums) {
    amx_configure();
    const int64_t tile_step = K / kAmxCols * kAmxPacked;
    const int64_t end = lo + (hi - lo) / kAmxRows * kAmxRows;
    for (int64_t r = lo; r < end; r += 2 * kAmxRows) {
        const int RB = end - r >= 2 * kAmxRows ? 2 : 1;
        for (int64_t t0 = 0; t0 < G; t0 += 2 * kAmxTokens) {
            const int TB = G - t0 > kAmxTokens ? 2 : 1;
            const bf16* x = xp + t0 / kAmxTokens * tile_step;
            const bf16* wr = w + r * ldw;
            if (RB == 2 && TB == 2) amx_block<2, 2>(wr, K, ldw, x, tile_step, sums);
            else if (RB == 2) amx_block<2, 1>(wr, K, ldw, x, tile_step, sums);
            else if (TB == 2) amx_block<1, 2>(wr, K, ldw, x, tile_step, sums);
            else amx_block<1, 1>(wr, K, ldw, x, tile_step, sums);
            const int64_t tn = std::min<int64_t>(TB * kAmxTokens, G - t0);
            for (int64_t t = 0; t < tn; ++t)
                for (int64_t i = 0; i < RB * kAmxRows; ++i) y[(t0 + t) * ldy + r + i - lo] = sums[i * 2 * kAmxTokens + t];
        }
    }
    _tile_release();
    return end;
}

// Packs the values of L keys (rows of Dv bf16 at stride v_sl, Dv a multiple of 32) in pairs of keys (vp above), the
// layout of a tile's second operand when the keys are what the product sums over.
MOESPEC_AMX_TARGET inline void amx_pack_pairs(const bf16* v, int64_t v_sl, int64_t L, int64_t Dv, bf16* vp) {
    alignas(64) int16_t lo[32], hi[32];
    for (int e = 0; e < 16; ++e) {  // word 2 e from the first row, 2 e + 1 from the second (index + 32)
        lo[2 * e] = static_cast<int16_t>(e), lo[2 * e + 1] = static_cast<int16_t>(32 + e);
        hi[2 * e] = static_cast<int16_t>(16 + e), hi[2 * e + 1] = static_cast<int16_t>(48 + e);
    }
    const __m512i ilo = _mm512_load_si512(lo), ihi = _mm512_load_si512(hi);
    const int64_t blocks = Dv / 16;
    for (int64_t k0 = 0; k0 < L; k0 += 2) {
        const int64_t c = k0 / kAmxCols, i = k0 % kAmxCols / 2;
        for (int64_t h = 0; h < Dv; h += kAmxCols) {
            const __m512i a = _mm512_loadu_si512(v + k0 * v_sl + h);
            const __m512i b = k0 + 1 < L ? _mm512_loadu_si512(v + (k0 + 1) * v_sl + h) : _mm512_setzero_si512();
            bf16* out = vp + ((c * blocks + h / 16) * kAmxRows + i) * kAmxCols;
            _mm512_storeu_si512(out, _mm512_permutex2var_epi16(a, ilo, b));
            _mm512_storeu_si512(out + kAmxPacked, _mm512_permutex2var_epi16(a, ihi, b));
        }
    }
    const int64_t padded = (L + kAmxCols - 1) / kAmxCols * kAmxCols;  // the last block's pairs past L: zero
    for (int64_t k0 = (L + 1) / 2 * 2; k0 < padded; k0 += 2)
        for (int64_t b = 0; b < blocks; ++b)
            std::memset(vp + ((k0 / kAmxCols * blocks + b) * kAmxRows + k0 % kAmxCols / 2) * kAmxCols, 0,
                        kAmxCols * sizeof(bf16));
}

// NB column blocks of 16 of one 16-row tile of acc over every key block: acc[r][16 b + e] = sum over keys of
// p[r][key] vp's (key, column), tmm0..NB-1 the sums, tmm4 the weights' tile, tmm5-7 the values' in turn.
template <int NB>
MOESPEC_AMX_TARGET void amx_value_tile(const bf16* p, int64_t ldp, int64_t key_blocks, const bf16* vp,
                                       int64_t blocks, float* acc, int64_t lda) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (NB == 4) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t c = 0; c < key_blocks; ++c) {
        const bf16* vc = vp + c * blocks * kAmxPacked;
        _tile_loadd(4, p + c * kAmxCols, ldp * static_cast<int64_t>(sizeof(bf16)));
        _tile_loadd(5, vc, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, vc + kAmxPacked, 64);
        _tile_dpbf16ps(1, 4, 6);
        if constexpr (NB == 4) {
            _tile_loadd(7, vc + 2 * kAmxPacked, 64);
            _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(5, vc + 3 * kAmxPacked, 64);
            _tile_dpbf16ps(3, 4, 5);
        }
    }
    const int64_t ld = lda * static_cast<int64_t>(sizeof(float));
    _tile_stored(0, acc, ld);
    _tile_stored(1, acc + 16, ld);
    if constexpr (NB == 4) {
        _tile_stored(2, acc + 32, ld);
        _tile_stored(3, acc + 48, ld);
    }
}

// acc[r * Dv + e] = sum_j p[r * ldp + j] v[j][e] for r < rows rounded up to 16 (acc has those rows; p's rows past
// `rows` and its keys from L to ldp zero, ldp >= L rounded up to 32) and e < Dv (a multiple of 32), from the values
// packed by amx_pack_pairs.
MOESPEC_AMX_TARGET inline void amx_values(const bf16* p, int64_t ldp, int64_t rows, int64_t L, const bf16* vp,
                                          int64_t Dv, float* acc) {
    amx_configure();
    const int64_t key_blocks = (L + kAmxCols - 1) / kAmxCols, blocks = Dv / 16;
    for (int64_t r0 = 0; r0 < rows; r0 += kAmxRows)
        for (int64_t b = 0; b < blocks; b += 4) {
            const bf16* pr = p + r0 * ldp;
            float* out = acc + r0 * Dv + b * 16;
            if (blocks - b >= 4) amx_value_tile<4>(pr, ldp, key_blocks, vp + b * kAmxPacked, blocks, out, Dv);
            else amx_value_tile<2>(pr, ldp, key_blocks, vp + b * kAmxPacked, blocks, out, Dv);
        }
    _tile_release();
}

#endif  // MOESPEC_AMX

}  // namespace moespec_amx
