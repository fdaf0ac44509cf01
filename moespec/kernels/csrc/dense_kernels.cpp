// Native dense linear layer of moespec's verification pass: y = x W^T + b for a few tokens at once.
//
// Shape legend
//   n     tokens, rows of x and y (1..16; to 256 on the AMX and lanes paths)
//   K     input features: columns of x and of W
//   M     output features: rows of W, columns of y
//   x     [n, K], row stride ldx elements, fp32 or bf16
//   W     [M, K], contiguous (torch nn.Linear layout), fp32 or bf16
//   b     [M] or null, fp32 or bf16
//   y     [n, M], row stride ldy elements, fp32 or bf16, written
//
// Physics. At n <= 16 the layer is a stream of W past a handful of input rows: n multiply-adds per weight.
// DRAM feeds this machine's two cores ~30-35 GB/s together, ~8 G bf16 weights/s each, while a core does
// ~58 G fp32 FMA lanes/s (AVX2) or ~110 G bf16 multiply-adds/s (AVX512-BF16): so up to n of ~5 (fma path)
// or ~8 (dot path) the layer costs M * K * sizeof(W) bytes at the streaming-read bandwidth, the same for
// n = 1 as for n = 5, provided each W row is read from memory exactly once per call and applied to all n
// tokens, whose inputs (converted once, up front) sit in L1 beside the few rows being applied. Beyond, the
// multiply-adds set the time and it grows with n. Both paths accumulate in fp32:
//   fma : AVX2 + FMA, any dtypes. Weights are widened to fp32 (bf16 is the top half of an fp32, so a
//         shift or a mask does it) and multiplied by fp32 inputs with 8-lane FMAs.
//   dot : AVX512-BF16 (vdpbf16ps, 256-bit form), bf16 weights and bf16 x only, chosen at run time when
//         the CPU has it (the rest of the library needs AVX2 + FMA only). One instruction multiplies 16
//         bf16 pairs exactly and adds them in fp32: twice the fma path's rate, and no widening.
//   amx : the AMX tiles (amx_tiles.h), bf16 weights and bf16 x with K a multiple of 32, on a CPU whose tiles
//         amx_ready grants, every such call: 16 weight rows x 16 tokens x 32 columns an instruction, so the layer
//         stays a stream of W to dozens of rows (a batched pass's B n), where the dot path is bound by its
//         multiply-adds from ~4-8. The only path past kMaxTokens rows (to kAmxMaxTokens). A row's sums do not
//         depend on the other rows of the call, so a token gets the same bits in a pass of any size.
//   lanes: AVX2 + FMA, any dtypes, up to kLaneMaxTokens rows: the tokens in the lanes of the registers, W widened
//         once per chunk and applied to panels of 16 tokens (lane_tiles.h); the many-token pass of a CPU without
//         the tiles or the dot path, where the fma path is bound by its multiply-adds (bf16 W from kLaneMinTokens
//         rows; any call on request, isa 4).
// Rows of M are cut into tasks of ~kTaskBytes of weights that the OpenMP threads take in turn, so a
// descheduled thread on a shared machine holds back one task, not half the matrix.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#include "amx_tiles.h"
#include "lane_tiles.h"
#include "simd_common.h"
#include <utility>
#include <vector>

namespace {

using namespace moespec_simd;  // bf16, to_f32, to_bf16, hsum, cpu_has_dot
using namespace moespec_amx;   // the AMX tiles (amx_tiles.h)
using namespace moespec_lanes; // the lanes path (lane_tiles.h)


constexpr int64_t kMaxTokens = 16;  // rows of the fma and dot paths
constexpr int64_t kAmxMaxTokens = 256;  // rows of the AMX path: a batched pass of up to 16 sequences x 16 tokens
constexpr int64_t kLaneMaxTokens = 256;  // rows of the lanes path, the same passes on AVX2
// From this many rows `auto` runs a bf16 W on the lanes path where neither the tiles nor the dot path run (a Zen 3's
// two cores, 5 runs of benchmarks/dense_paths.py: at 16 rows an LM head 1.12x the fma path's rate, a 2048 x 2048
// layer level with it; at 18-72 rows 0.72-0.89x the time of the fma path's row blocks of 16)
constexpr int64_t kLaneMinTokens = 16;
// Tokens past whole panels of 16 that go to the fma path instead of a last panel (an LM head: 2 rows ~8.7 ms on the
// fma path, an 8-lane panel ~15 ms within the lanes pass; 8 rows ~16.5 ms on the fma path)
constexpr int64_t kLaneRestMax = 5;
constexpr int kLanes = 8;  // fp32 lanes of one AVX2 register
// Rows of W per register tile. Each input vector loaded feeds kTileRows multiply-adds.
constexpr int kTileRows = 4;
// Rows per tile where the call's token count lies in a path's [kNarrowMin, kNarrowMax]: there the first token
// block is the whole call (or nearly), so the tile's rows come straight from DRAM as its multiply-adds run, and
// two rows read side by side keep the stream closer to sequential than four: +6-21% on the dot path at n =
// 4..6 and +2-16% on the fma path at n = 2 (LM head and 2048 x 2048 bf16, cold, two cores); elsewhere 2 rows
// lose up to 26%. The sums are the same products in the same order per row; only the final lane sums group
// differently (hsum8 or hsum), so results can differ from a 4-row tile's in the last bit.
constexpr int kNarrowRows = 2;
// Columns per block: the inputs of all n tokens over one column block fit in 16 KiB, half of L1, beside
// the kTileRows weight rows being applied to them, so the token blocks after the first read only L1.
constexpr int64_t kColBlockBytes = 16 << 10;
// Software prefetch, one request per weight cache line read, in two stages. While the first token block
// streams a row tile's column block, it requests the same lines this many row tiles further down into
// L2, so that DRAM always has the next ~32 KiB of the stream in flight per core (the hardware prefetcher
// alone leaves ~20% of the bandwidth unused at small n). While the second token block re-reads the
// column block from L1, it requests the next column block (of this tile, or the next tile's first) from
// L2 into L1, so the first token block of a compute-bound n rarely waits on L2: +10% at n = 9 and 16 on
// the dot path; on the fma path +15% at n = 4, but -10% from n = 6, where its FMAs already saturate the
// core and the prefetch instructions only take their issue slots (each path's kL1PrefetchMaxTokens).
constexpr int64_t kPrefetchTiles = 2;
// One-token calls read their rows one after the other, one row per tile, with no software prefetch, or in tiles as
// larger calls do, by the CPU's prefetcher (simd_common.h, one_token_tiles; the expert kernels take the same rule).
// Weights per task (~0.5 MiB): ~16 tasks for a 2048 x 2048 bf16 matrix, ~256 for an LM head.
constexpr int64_t kTaskBytes = 512 << 10;
// Padding of the fp32/bf16 input rows, in elements: strides that are multiples of 4 KiB would put the same
// column of every token in the same L1 set.
constexpr int64_t kPadElems = 32;



// An fp32 or bf16 array (dtype code 0 or 1), read or written as fp32.
struct Arr {
    const void* p;
    int dtype;
    float get(int64_t i) const {
        return dtype == 0 ? static_cast<const float*>(p)[i] : to_f32(static_cast<const bf16*>(p)[i]);
    }
    void set(int64_t i, float v) const {
        if (dtype == 0) static_cast<float*>(const_cast<void*>(p))[i] = v;
        else static_cast<bf16*>(const_cast<void*>(p))[i] = to_bf16(v);
    }
    Arr from(int64_t i) const {  // the array from element i on
        return {static_cast<const char*>(p) + i * (dtype == 0 ? 4 : 2), dtype};
    }
};

// The prefetch requests of a tile: row r, column k asks for the line of element w + r * ldw + k + off, into
// L1 or into L2; off 0: none.
struct Prefetch {
    int64_t off;
    bool l1;
};

// A prefetch hint as a type, so that a tile's loop is compiled once per hint, without a branch inside.
template <int H>
using Hint = std::integral_constant<int, H>;

template <int H, class T>
inline void prefetch(const T* p, Hint<H>) {
    _mm_prefetch(reinterpret_cast<const char*>(p), static_cast<_mm_hint>(H));
}


// The sums of 8 consecutive 8-lane vectors p[0..8), p[8..16), ... as one vector.
inline __m256 hsum8(const float* p) {
    __m256 v[8];
    for (int i = 0; i < 8; ++i) v[i] = _mm256_load_ps(p + i * kLanes);
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));  // 128-bit halves
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// ---- Register tiles. tile<R, G>(w, ldw, x, ldx, cols, part, ldp, first, pf): for rows r < R (stride ldw)
// and tokens t < G (stride ldx), over `cols` columns (a multiple of the path's kStep), adds the 8-lane
// partial dot product of row r and token t into part[r * ldp + 8 t .. + 8], or stores it there when
// `first`, issuing the prefetch requests pf. The partials stay vectors until the row
// tile has seen all columns, so a column block costs R * G loads and stores, not R * G horizontal sums.

// fma path: the weights widened to fp32 (Widen, simd_common.h), the inputs packed to match.

// Up to R * G = 12 accumulators, G inputs and one widened weight vector fill the 16 ymm registers (the token blocks
// per format: Widen::blocks); each input load feeds R FMAs, each weight vector G. Small tiles (R * G * kVecs <= 8)
// keep one accumulator per half so that 8 FMA chains hide the FMA latency.
template <class W, int R, int G>
void fma_tile(const W* w, int64_t ldw, const float* x, int64_t ldx, int64_t cols, float* part, int64_t ldp,
              bool first, Prefetch pf) {
    using F = Widen<W>;
    constexpr int V = F::kVecs;
    constexpr int A = R * G * V <= 8 ? V : 1;
    __m256 acc[R][G][A];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) {
            acc[r][t][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(part + r * ldp + t * kLanes);
            if constexpr (A == 2) acc[r][t][1] = _mm256_setzero_ps();
        }
    auto step = [&](int64_t k) __attribute__((always_inline)) {
        _Pragma("GCC unroll 2") for (int v = 0; v < V; ++v) {
            __m256 xv[G];
            _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) xv[t] = _mm256_loadu_ps(x + t * ldx + k + v * kLanes);
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
                const __m256 wv = F::half(w + r * ldw + k, v);
                _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t)
                    acc[r][t][v % A] = _mm256_fmadd_ps(wv, xv[t], acc[r][t][v % A]);
            }
        }
    };
    constexpr int64_t kLine = 64 / sizeof(W);  // columns per cache line, two steps
    int64_t k = 0;
    auto prefetching = [&](auto hint) __attribute__((always_inline)) {
        for (; k + kLine <= cols; k += kLine) {
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) prefetch(w + r * ldw + k + pf.off, hint);
            step(k);
            step(k + F::kStep);
        }
    };
    if (pf.off && pf.l1) prefetching(Hint<_MM_HINT_T0>{});
    else if (pf.off) prefetching(Hint<_MM_HINT_T1>{});
    for (; k < cols; k += F::kStep) step(k);
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) {
            __m256 s = acc[r][t][0];
            if constexpr (A == 2) s = _mm256_add_ps(s, acc[r][t][1]);
            _mm256_storeu_ps(part + r * ldp + t * kLanes, s);
        }
}

#define MOESPEC_DOT_ISA "avx512f,avx512bw,avx512vl,avx512bf16"
#define MOESPEC_DOT_TARGET __attribute__((target(MOESPEC_DOT_ISA)))

// dot path: vdpbf16ps adds w[2i] x[2i] + w[2i+1] x[2i+1] into fp32 lane i, so weights and inputs are both
// used in their natural bf16 order, 16 columns per instruction. AVX-512VL gives 32 ymm registers: up to
// R * G = 24 accumulators, G <= 6 inputs and one weight vector. Small tiles keep A accumulators per (row,
// token), one per step of a 64-column round, so that at least 4 instruction chains hide its latency.
template <int R, int G>
MOESPEC_DOT_TARGET void dot_tile(const bf16* w, int64_t ldw, const bf16* x, int64_t ldx, int64_t cols, float* part,
                                 int64_t ldp, bool first, Prefetch pf) {
    constexpr int A = R * G == 1 ? 4 : R * G <= 4 ? 2 : 1;
    __m256 acc[R][G][A];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) {
            acc[r][t][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(part + r * ldp + t * kLanes);
            _Pragma("GCC unroll 4") for (int a = 1; a < A; ++a) acc[r][t][a] = _mm256_setzero_ps();
        }
    auto step = [&](int64_t k, int a) __attribute__((always_inline, target(MOESPEC_DOT_ISA))) {
        __m256bh xv[G];
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t)
            xv[t] = (__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + t * ldx + k));
        _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
            const __m256bh wv = (__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * ldw + k));
            _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t)
                acc[r][t][a % A] = _mm256_dpbf16_ps(acc[r][t][a % A], wv, xv[t]);
        }
    };
    auto round = [&](int64_t k) __attribute__((always_inline, target(MOESPEC_DOT_ISA))) {  // two cache lines a row
        _Pragma("GCC unroll 4") for (int s = 0; s < 4; ++s) step(k + 16 * s, s);
    };
    int64_t k = 0;
    auto prefetching = [&](auto hint) __attribute__((always_inline, target(MOESPEC_DOT_ISA))) {
        for (; k + 64 <= cols; k += 64) {
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
                prefetch(w + r * ldw + k + pf.off, hint);
                prefetch(w + r * ldw + k + 32 + pf.off, hint);
            }
            round(k);
        }
    };
    if (pf.off && pf.l1) prefetching(Hint<_MM_HINT_T0>{});
    else if (pf.off) prefetching(Hint<_MM_HINT_T1>{});
    for (; k + 64 <= cols; k += 64) round(k);
    for (; k < cols; k += 16) step(k, 0);
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int t = 0; t < G; ++t) {
            __m256 s = acc[r][t][0];
            _Pragma("GCC unroll 4") for (int a = 1; a < A; ++a) s = _mm256_add_ps(s, acc[r][t][a]);
            _mm256_storeu_ps(part + r * ldp + t * kLanes, s);
        }
}

// ---- Paths: weight and packed-input types, step, tile, largest token block, input packing.
template <class W_>
struct FmaPath {
    using W = W_;
    using X = float;
    static constexpr int kStep = Widen<W>::kStep, kMaxG = kTileTokens, kL1PrefetchMaxTokens = 4, kNarrowMin = 2,
                         kNarrowMax = 2;
    static constexpr int64_t blocks(int64_t n) { return Widen<W>::blocks(n); }
    template <int R, int G>
    static void tile(const W* w, int64_t ldw, const X* x, int64_t ldx, int64_t cols, float* part, int64_t ldp,
                     bool first, Prefetch pf) {
        fma_tile<W, R, G>(w, ldw, x, ldx, cols, part, ldp, first, pf);
    }
    // One token's K inputs (fp32 or bf16 S) as fp32 into dst[0, Kp), Kp = K rounded up to 16, zeros past
    // K; for bf16 weights every 16-column block is reordered even columns first, then odd ones.
    template <class S>
    static void pack(const S* src, int64_t K, int64_t Kp, X* dst) {
        if constexpr (kStep == 8) {
            for (int64_t k = 0; k < K; ++k) dst[k] = to_f32(src[k]);
            std::fill(dst + K, dst + Kp, 0.0f);
        } else {
            for (int64_t b = 0; b < Kp; b += 16)
                for (int64_t i = 0; i < 8; ++i) {
                    const int64_t e = b + 2 * i, o = e + 1;
                    dst[b + i] = e < K ? to_f32(src[e]) : 0.0f;
                    dst[b + 8 + i] = o < K ? to_f32(src[o]) : 0.0f;
                }
        }
    }
};

struct DotPath {
    using W = bf16;
    using X = bf16;
    static constexpr int kStep = 16, kMaxG = 6, kL1PrefetchMaxTokens = kMaxTokens, kNarrowMin = 4, kNarrowMax = 6;
    static constexpr int64_t blocks(int64_t n) { return (n + kMaxG - 1) / kMaxG; }
    template <int R, int G>
    static void tile(const W* w, int64_t ldw, const X* x, int64_t ldx, int64_t cols, float* part, int64_t ldp,
                     bool first, Prefetch pf) {
        dot_tile<R, G>(w, ldw, x, ldx, cols, part, ldp, first, pf);
    }
    template <class S>
    static void pack(const S* src, int64_t K, int64_t Kp, X* dst) {
        static_assert(std::is_same_v<S, bf16>, "the dot path multiplies bf16 inputs");
        std::copy(src, src + K, dst);
        std::fill(dst + K, dst + Kp, bf16{0});
    }
};

template <class P, int R>
using TileFn = void (*)(const typename P::W*, int64_t, const typename P::X*, int64_t, int64_t, float*, int64_t,
                        bool, Prefetch);

// tiles<P, R>()[G - 1] is the tile of R rows and G tokens, G = 1..P::kMaxG.
template <class P, int R, int... I>
constexpr std::array<TileFn<P, R>, sizeof...(I)> tile_table(std::integer_sequence<int, I...>) {
    return {&P::template tile<R, I + 1>...};
}
template <class P, int R>
const std::array<TileFn<P, R>, P::kMaxG>& tiles() {
    static constexpr auto table = tile_table<P, R>(std::make_integer_sequence<int, P::kMaxG>{});
    return table;
}

struct Problem {
    int64_t n, K, M;
    Arr x;
    int64_t ldx;
    const void* w;
    Arr bias;  // p null: none
    Arr y;
    int64_t ldy;
    int nthreads;
};

// Rows [r0, r0 + R) of y for all n tokens. The columns go in blocks whose inputs fit in L1; within a
// block every token block (P::blocks of them, at most kMaxG tokens each, sizes as even as possible) is applied to the
// R rows, the first reading them from memory, the others from L1. The K % kStep last columns run as one more
// step on a zero-padded copy of the rows' tails (the inputs are zero-padded too), so tails are exact.
template <class P, int R>
void row_tile(const Problem& pb, const typename P::X* xp, int64_t ldxp, int64_t r0) {
    using W = typename P::W;
    constexpr int S = P::kStep;
    const int64_t n = pb.n, K = pb.K, kfull = K / S * S;
    const W* w = static_cast<const W*>(pb.w) + r0 * K;
    const auto& tile = tiles<P, R>();
    const int64_t blocks = P::blocks(n);
    int64_t t0s[kMaxTokens + 1];
    for (int64_t b = 0, t = 0; b <= blocks; ++b) {
        t0s[b] = t;
        t += n / blocks + (b < n % blocks);
    }
    const int64_t ldp = n * kLanes;
    const bool ahead = (n > 1 || one_token_tiles()) && r0 + (kPrefetchTiles + 1) * R <= pb.M;
    const bool to_l1 = n <= P::kL1PrefetchMaxTokens, next_tile = r0 + 2 * R <= pb.M;
    alignas(32) float part[R * kMaxTokens * kLanes];
    const int64_t kb = std::max<int64_t>(64, kColBlockBytes / (n * int64_t(sizeof(typename P::X))) / 64 * 64);
    for (int64_t k0 = 0; k0 < kfull; k0 += kb) {
        const int64_t cols = std::min(kb, kfull - k0);
        const bool last = k0 + kb >= kfull;
        for (int64_t b = 0; b < blocks; ++b) {
            Prefetch pf{0, b == 1};
            if (b == 0 && ahead) pf.off = kPrefetchTiles * R * K;
            if (b == 1 && to_l1 && (!last || next_tile)) pf.off = last ? R * K - k0 : kb;
            tile[t0s[b + 1] - t0s[b] - 1](w + k0, K, xp + t0s[b] * ldxp + k0, ldxp, cols, part + t0s[b] * kLanes, ldp,
                                           k0 == 0, pf);
        }
    }
    if (kfull < K) {
        W tail[R][S] = {};
        for (int r = 0; r < R; ++r) std::copy(w + r * K + kfull, w + r * K + K, tail[r]);
        for (int64_t b = 0; b < blocks; ++b)
            tile[t0s[b + 1] - t0s[b] - 1](&tail[0][0], S, xp + t0s[b] * ldxp + kfull, ldxp, S, part + t0s[b] * kLanes,
                                           ldp, kfull == 0, Prefetch{0, false});
    }
    alignas(32) float sums[R * kMaxTokens];  // sums[r * n + t]
    int64_t j = 0;
    for (; j + 8 <= R * n; j += 8) _mm256_store_ps(sums + j, hsum8(part + j * kLanes));
    for (; j < R * n; ++j) sums[j] = hsum(_mm256_load_ps(part + j * kLanes));
    for (int r = 0; r < R; ++r) {
        const float b = pb.bias.p ? pb.bias.get(r0 + r) : 0.0f;
        for (int64_t t = 0; t < n; ++t) pb.y.set(t * pb.ldy + r0 + r, sums[r * n + t] + b);
    }
}

// The whole call: pack the inputs once (one token per thread), then the row tasks, taken dynamically.
template <class P>
void run(const Problem& pb) {
    using X = typename P::X;
    const int64_t n = pb.n, K = pb.K, M = pb.M;
    const int64_t Kp = (K + 15) / 16 * 16, ldxp = Kp + kPadElems;
    std::unique_ptr<X[]> xp(new X[n * ldxp]);  // columns [Kp, ldxp) of each row are never read
    const int64_t task_rows = std::max<int64_t>(
        kTileRows, kTaskBytes / (K * int64_t(sizeof(typename P::W))) / kTileRows * kTileRows);
    const int64_t tasks = (M + task_rows - 1) / task_rows;
    const int nt = static_cast<int>(std::min<int64_t>(pb.nthreads, tasks));
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n; ++t) {
            X* dst = xp.get() + t * ldxp;
            if constexpr (std::is_same_v<X, float>)  // the fma path takes fp32 or bf16 inputs, the dot path bf16
                if (pb.x.dtype == 0) {
                    P::pack(static_cast<const float*>(pb.x.p) + t * pb.ldx, K, Kp, dst);
                    continue;
                }
            P::pack(static_cast<const bf16*>(pb.x.p) + t * pb.ldx, K, Kp, dst);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t lo = task * task_rows, hi = std::min(M, lo + task_rows);
            int64_t r = lo;
            if (n >= P::kNarrowMin && n <= P::kNarrowMax)
                for (; r + kNarrowRows <= hi; r += kNarrowRows) row_tile<P, kNarrowRows>(pb, xp.get(), ldxp, r);
            else if (n > 1 || one_token_tiles())
                for (; r + kTileRows <= hi; r += kTileRows) row_tile<P, kTileRows>(pb, xp.get(), ldxp, r);
            for (; r < hi; ++r) row_tile<P, 1>(pb, xp.get(), ldxp, r);
        }
    }
}


// The AMX path: the tokens packed once for the tiles (amx_pack), then row tasks of whole 32-row blocks, taken
// dynamically; each task's sums land in a per-thread fp32 block [n][rows], then get the bias and one rounding. The
// M % 16 last rows go through the tiles as a zero-padded copy of 16 rows.
void run_amx(const Problem& pb) {
    const int64_t n = pb.n, K = pb.K, M = pb.M;
    const bf16* w = static_cast<const bf16*>(pb.w);
    std::vector<const bf16*> xs(n);
    for (int64_t t = 0; t < n; ++t) xs[t] = static_cast<const bf16*>(pb.x.p) + t * pb.ldx;
    std::vector<bf16> xp((n + kAmxTokens - 1) / kAmxTokens * kAmxTokens * K);
    amx_pack(xs.data(), n, K, xp.data());
    const int64_t block = 2 * kAmxRows;
    const int64_t task_rows = std::max<int64_t>(block, kTaskBytes / (K * int64_t(sizeof(bf16))) / block * block);
    const int64_t tasks = (M + task_rows - 1) / task_rows, ldb = task_rows + kAmxRows;
    const int nt = static_cast<int>(std::min<int64_t>(pb.nthreads, tasks));
#pragma omp parallel num_threads(nt)
    {
        std::vector<float> sums(4 * kAmxRows * kAmxTokens), part(n * ldb);
        std::vector<bf16> tail;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t lo = task * task_rows, hi = std::min(M, lo + task_rows);
            const int64_t done = amx_rows(w, K, K, lo, hi, xp.data(), n, part.data(), ldb, sums.data());
            if (done < hi) {  // the last task's rows past the whole 16-row tiles
                tail.assign(kAmxRows * K, bf16{0});
                std::copy(w + done * K, w + hi * K, tail.begin());
                amx_rows(tail.data(), K, K, 0, kAmxRows, xp.data(), n, part.data() + (done - lo), ldb, sums.data());
            }
            for (int64_t t = 0; t < n; ++t)
                for (int64_t r = lo; r < hi; ++r)
                    pb.y.set(t * pb.ldy + r, part[t * ldb + r - lo] + (pb.bias.p ? pb.bias.get(r) : 0.0f));
        }
    }
}

// The lanes path; past whole panels, a rest of at most kLaneRestMax tokens takes the fma path in a second call (which
// reads W again) rather than a panel of 8 lanes that it would mostly pad.
template <class W>
void run_lanes_and_rest(const Problem& pb) {
    const int64_t rest = pb.n > kPanelTokens && pb.n % kPanelTokens <= kLaneRestMax ? pb.n % kPanelTokens : 0;
    Problem head = pb;
    head.n -= rest;
    run_lanes<W>(head, kTaskBytes);
    if (rest) {
        Problem tail = pb;
        tail.n = rest;
        tail.x = pb.x.from(head.n * pb.ldx);
        tail.y = pb.y.from(head.n * pb.ldy);
        run<FmaPath<W>>(tail);
    }
}

}  // namespace

extern "C" {

// Bumped whenever the signature of an exported function changes (the loader checks it).
int moespec_dense_abi_version() { return 2; }

// 1 when this CPU runs the dot path (AVX512-BF16 with AVX512-VL), else 0.
int moespec_dense_cpu_has_dot() { return cpu_has_dot() ? 1 : 0; }

// y = x W^T + b (see the shape legend). Dtype codes: 0 fp32, 1 bf16. bias may be null (bdtype ignored).
// 1 when this process runs the AMX path for bf16 W and bf16 x with K a multiple of 32, else 0.
int moespec_dense_amx() { return amx_ready() ? 1 : 0; }

// nthreads <= 0: omp_get_max_threads(). isa: 0 auto (the AMX path for bf16 W and x, K % 32 == 0, where the tiles
// run; else the dot path for bf16 W and bf16 x when the CPU has it; else lanes for bf16 W from kLaneMinTokens rows;
// else fma),
// 1 fma path only, 2 dot path only, 3 AMX path only, 4 lanes path only (any dtypes). Returns 0; 1 on a bad dtype or
// isa code; 2 on a bad size (n outside 1..16, or to 256 on the AMX and lanes paths; K or M < 1, ldx < K, ldy < M);
// 3 on a null x, w or y; 4 when the isa asked for cannot run (a CPU without AVX512-BF16 or the tiles, W or x not
// bf16, K not a multiple of 32).
int moespec_linear(int wdtype, int xdtype, int bdtype, int ydtype, int64_t n, int64_t K, int64_t M, const void* x,
                   int64_t ldx, const void* w, const void* bias, void* y, int64_t ldy, int nthreads, int isa) {
    auto code_ok = [](int c) { return c == 0 || c == 1; };
    if (!code_ok(wdtype) || !code_ok(xdtype) || !code_ok(ydtype) || (bias && !code_ok(bdtype)) || isa < 0 || isa > 4)
        return 1;
    const bool dot_dtypes = wdtype == 1 && xdtype == 1;
    const bool tiles = dot_dtypes && K % kAmxCols == 0 && amx_ready();
    const bool amx = isa == 3 || (isa == 0 && tiles);
    const int64_t most = amx ? kAmxMaxTokens : isa == 4 ? kLaneMaxTokens : kMaxTokens;
    if (n < 1 || n > most || K < 1 || M < 1 || ldx < K || ldy < M) return 2;
    if (!x || !w || !y) return 3;
    if ((isa == 2 && !(dot_dtypes && cpu_has_dot())) || (isa == 3 && !tiles)) return 4;
    const Problem pb{n, K, M, Arr{x, xdtype}, ldx, w, Arr{bias, bdtype}, Arr{y, ydtype}, ldy,
                     nthreads > 0 ? nthreads : omp_get_max_threads()};
    const bool dot = (isa == 0 || isa == 2) && dot_dtypes && cpu_has_dot();
    const bool lanes = isa == 4 || (isa == 0 && !amx && !dot && wdtype == 1 && n >= kLaneMinTokens);
    if (amx) run_amx(pb);
    else if (lanes && wdtype == 1) run_lanes_and_rest<bf16>(pb);
    else if (lanes) run_lanes_and_rest<float>(pb);
    else if (dot) run<DotPath>(pb);
    else if (wdtype == 1) run<FmaPath<bf16>>(pb);
    else run<FmaPath<float>>(pb);
    return 0;
}

}  // extern "C"
