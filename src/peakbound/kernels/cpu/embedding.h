// Token embedding lookup and its gradient, llm.c style, over one vocabulary shard:
// the table holds rows [row_offset, row_offset + rows) of the full [V, H] embedding.
//
//   forward:  out[t, :] = table[ids[t] - row_offset, :]   when ids[t] is in the shard,
//             0 otherwise (a vocabulary-parallel embedding sums the shards' outputs)
//   backward: dtable[ids[t] - row_offset, :] += dout[t, :] for ids[t] in the shard,
//             tokens in order, so the result does not depend on threading.
//
// bf16 (mixed precision): the forward's table (the gathered parameter shard) and out are
// bf16 together (a copy: out's bits are the table's); the backward reads a bf16 dout and
// ADDS INTO an fp32 dtable (a parameter gradient), widening each element and adding in
// the same order as the f32 form, so dtable is bitwise the f32 result on the widened dout.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"

namespace peakbound::cpu {

// ids [T] read; table [rows, H] read; out [T, H] WRITTEN.
void embedding_forward(float* out, const std::int32_t* ids, const float* table, std::int64_t T, std::int64_t H,
                       std::int64_t row_offset, std::int64_t rows);
void embedding_forward(bf16* out, const std::int32_t* ids, const bf16* table, std::int64_t T, std::int64_t H,
                       std::int64_t row_offset, std::int64_t rows);

// ids [T] read; dout [T, H] read; dtable [rows, H] ADDED INTO (fp32 in both forms).
void embedding_backward(float* dtable, const std::int32_t* ids, const float* dout, std::int64_t T, std::int64_t H,
                        std::int64_t row_offset, std::int64_t rows);
void embedding_backward(float* dtable, const std::int32_t* ids, const bf16* dout, std::int64_t T, std::int64_t H,
                        std::int64_t row_offset, std::int64_t rows);

}  // namespace peakbound::cpu
