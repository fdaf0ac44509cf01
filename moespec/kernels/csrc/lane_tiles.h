// The lanes path of the dense kernel (dense_kernels.cpp, isa 4): a call of dozens of tokens on AVX2 + FMA, where the
// layer is bound by its multiply-adds, not by W's bytes.
//
// Shape legend
//   R      weight rows of a tile, 1..kLaneRows          V   8-token vectors of a panel, 1 or 2 (8 or 16 tokens)
//   cols   columns of the current chunk, <= kLaneChunk
//   wf     [R][kLaneChunk] fp32: the R rows' columns of the chunk, widened once
//   xt     [cols][8 V] fp32: a panel's inputs column by column; token j of the panel in lane j % 8 of vector j / 8
//   acc    [R][8 V] fp32: the panel's sums for the R rows, carried from chunk to chunk
//
// Physics. The row tiles of the fma path widen a weight vector for every token block it meets (blocks of 2-3 tokens)
// and take 8-lane partial sums along K. Here the tokens lie in the lanes instead: a chunk of R rows is widened to fp32
// once into L1, and each weight, broadcast, multiplies a whole panel of 16 tokens in two FMAs. A column costs two input
// loads, R broadcasts and 2 R FMAs; at R = 6 the 12 accumulators, 2 inputs and the broadcast weight take 15 of the 16
// ymm registers, and every panel after the first reads W from L1. Sums run along K in one accumulator per (row, token)
// (two in a panel of 8), so no horizontal sum is needed; each row is summed by one thread, in one order.
#pragma once

#include <immintrin.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "simd_common.h"

namespace moespec_lanes {

using moespec_simd::bf16;

constexpr int kLaneRows = 6;           // rows per tile: 6 x 2 accumulators + 2 inputs + 1 weight = 15 ymm
constexpr int kPanelTokens = 16;       // tokens per panel: two 8-lane vectors
// columns widened at a time: the 6 rows' 6 KiB of fp32 weights and a panel's 16 KiB of inputs sit in L1
constexpr int64_t kLaneChunk = 256;

// Rows [0, R) of w (row stride ldw), columns [0, cols), as fp32 into wf (row stride kLaneChunk).
template <class W>
inline void widen_rows(const W* w, int64_t ldw, int R, int64_t cols, float* wf) {
    for (int r = 0; r < R; ++r) {
        const W* src = w + r * ldw;
        float* dst = wf + r * kLaneChunk;
        int64_t k = 0;
        for (; k + 8 <= cols; k += 8) _mm256_storeu_ps(dst + k, moespec_simd::load8(src + k));
        for (; k < cols; ++k) dst[k] = moespec_simd::to_f32(src[k]);
    }
}

// acc += wf xt over the chunk's cols columns (acc = wf xt when `first`), for R rows and a panel of 8 V tokens. A panel
// of 8 (V = 1) keeps two accumulators a row, for even and odd columns, so that its 2 R FMA chains hide their latency.
template <int R, int V>
void lane_tile(const float* wf, int64_t cols, const float* xt, float* acc_io, bool first) {
    constexpr int A = V == 1 ? 2 : 1;  // accumulators per (row, vector)
    __m256 acc[R][V][A];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 2") for (int v = 0; v < V; ++v) {
            acc[r][v][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc_io + (r * V + v) * 8);
            if constexpr (A == 2) acc[r][v][1] = _mm256_setzero_ps();
        }
    auto step = [&](int64_t k, int a) __attribute__((always_inline)) {
        __m256 x[V];
        _Pragma("GCC unroll 2") for (int v = 0; v < V; ++v) x[v] = _mm256_loadu_ps(xt + (k * V + v) * 8);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
            const __m256 b = _mm256_broadcast_ss(wf + r * kLaneChunk + k);
            _Pragma("GCC unroll 2") for (int v = 0; v < V; ++v)
                acc[r][v][a] = _mm256_fmadd_ps(b, x[v], acc[r][v][a]);
        }
    };
    int64_t k = 0;
    for (; k + A <= cols; k += A)
        _Pragma("GCC unroll 2") for (int a = 0; a < A; ++a) step(k + a, a);
    for (; k < cols; ++k) step(k, 0);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 2") for (int v = 0; v < V; ++v) {
            __m256 sum = acc[r][v][0];
            if constexpr (A == 2) sum = _mm256_add_ps(sum, acc[r][v][1]);
            _mm256_storeu_ps(acc_io + (r * V + v) * 8, sum);
        }
}

using LaneFn = void (*)(const float*, int64_t, const float*, float*, bool);

template <int V, int... I>
constexpr std::array<LaneFn, sizeof...(I)> lane_table(std::integer_sequence<int, I...>) {
    return {&lane_tile<I + 1, V>...};
}

// lane_tiles(V)[R - 1]: the tile of R rows and a panel of 8 V tokens, R = 1..kLaneRows.
inline const std::array<LaneFn, kLaneRows>& lane_tiles(int V) {
    static constexpr auto one = lane_table<1>(std::make_integer_sequence<int, kLaneRows>{});
    static constexpr auto two = lane_table<2>(std::make_integer_sequence<int, kLaneRows>{});
    return V == 1 ? one : two;
}

// The whole call y = x W^T + b of dense_kernels.cpp's Problem pb (any dtypes): the tokens packed once into panels of 16
// (one of 8 or a padded 16 for the remainder), then row tasks of whole 6-row tiles of ~task_bytes of weights, taken
// dynamically. Per tile, each chunk of K is widened once and applied to every panel; the panels' sums stay in a
// per-thread block until the tile has seen all of K.
template <class W, class Problem>
void run_lanes(const Problem& pb, int64_t task_bytes) {
    const int64_t n = pb.n, K = pb.K, M = pb.M;
    const W* w = static_cast<const W*>(pb.w);
    struct Panel {
        int64_t t0, count, width, off;  // first token, tokens, lanes (8 or 16), offset of its [K][width] inputs
    };
    std::vector<Panel> panels;
    for (int64_t t0 = 0, off = 0; t0 < n; t0 += kPanelTokens) {
        const int64_t count = std::min<int64_t>(kPanelTokens, n - t0), width = count <= 8 ? 8 : kPanelTokens;
        panels.push_back({t0, count, width, off});
        off += K * width;
    }
    std::vector<float> xt(panels.back().off + K * panels.back().width, 0.0f);  // padded lanes stay zero
    const int64_t task_rows = std::max<int64_t>(
        kLaneRows, task_bytes / (K * int64_t(sizeof(W))) / kLaneRows * kLaneRows);
    const int64_t tasks = (M + task_rows - 1) / task_rows;
    const int nt = static_cast<int>(std::min<int64_t>(pb.nthreads, tasks));
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n; ++t) {
            const Panel& p = panels[t / kPanelTokens];
            float* dst = xt.data() + p.off + (t - p.t0);
            for (int64_t k = 0; k < K; ++k) dst[k * p.width] = pb.x.get(t * pb.ldx + k);
        }
        alignas(32) float wf[kLaneRows * kLaneChunk];
        std::vector<float> acc(panels.size() * kLaneRows * kPanelTokens);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t hi = std::min(M, (task + 1) * task_rows);
            for (int64_t r0 = task * task_rows; r0 < hi; r0 += kLaneRows) {
                const int R = static_cast<int>(std::min<int64_t>(kLaneRows, hi - r0));
                for (int64_t k0 = 0; k0 < K; k0 += kLaneChunk) {
                    const int64_t cols = std::min(kLaneChunk, K - k0);
                    widen_rows(w + r0 * K + k0, K, R, cols, wf);
                    for (size_t i = 0; i < panels.size(); ++i)
                        lane_tiles(int(panels[i].width / 8))[R - 1](
                            wf, cols, xt.data() + panels[i].off + k0 * panels[i].width,
                            acc.data() + i * kLaneRows * kPanelTokens, k0 == 0);
                }
                for (size_t i = 0; i < panels.size(); ++i) {
                    const Panel& p = panels[i];
                    const float* sums = acc.data() + i * kLaneRows * kPanelTokens;  // [R][width]
                    for (int r = 0; r < R; ++r) {
                        const float b = pb.bias.p ? pb.bias.get(r0 + r) : 0.0f;
                        for (int64_t j = 0; j < p.count; ++j)
                            pb.y.set((p.t0 + j) * pb.ldy + r0 + r, sums[r * p.width + j] + b);
                    }
                }
            }
        }
    }
}

}  // namespace moespec_lanes
