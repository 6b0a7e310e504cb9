// MXFP4 (OCP Microscaling FP4), the format gpt-oss's Hugging Face checkpoints store their
// expert weights in, dequantized on import.
//
// A block is 32 E2M1 elements sharing one E8M0 scale. A checkpoint holds a weight W as two
// U8 tensors (transformers' integrations/mxfp4.py, `convert_moe_packed_tensors`):
//   W_blocks [E, N, G, 16]  two elements a byte, the low nibble the even one
//   W_scales [E, N, G]      the shared exponent + 127
// and transformers' parameter is
//   W[e, 32 g + 2 j + h, n] = e2m1(nibble h of blocks[e, n, g, j]) * 2^(scales[e, n, g] - 127)
// (the dequantized [E, N, G*32] with its last two axes swapped: [E, G*32, N]). e2m1 codes
// 0-7 are +0, 0.5, 1, 1.5, 2, 3, 4, 6 and 8-15 their negatives. Every value is exact in f32
// (and in bf16: two significant bits), so dequantizing in f32 and narrowing later gives
// transformers' bf16 bits.
//
// Refused, as InvalidArgument naming the file and tensor: a missing half, a dtype other
// than U8, shapes that do not match as above, a scale of 255 (E8M0's NaN), and a value the
// f32 range cannot hold (6 * 2^126 and up: a scale past 252 under a large code; smaller
// codes under it stay finite, as in transformers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "peakbound/io/safetensors.h"

namespace peakbound {

inline constexpr std::int64_t kMxfp4BlockElements = 32;  // elements sharing a scale
inline constexpr std::int64_t kMxfp4BlockBytes = 16;     // two elements a byte

// The E2M1 value of a 4-bit code (the low four bits of `code`).
float e2m1_value(std::uint8_t code);

// `rows` rows of `groups` blocks each: out[r, 32 g + 2 j + h] (rows x groups*32, row-major)
// from blocks[r, g, j] (rows x groups x 16 bytes) and scales[r, g]. `what` names the
// tensor in an error (a scale of 255, a value past f32's range).
void dequantize_mxfp4_rows(const std::uint8_t* blocks, const std::uint8_t* scales, std::int64_t rows,
                           std::int64_t groups, float* out, const std::string& what);

// A dequantized weight: transformers' shape and values, row-major.
struct Mxfp4Weight {
  std::vector<std::int64_t> shape;  // [E, G*32, N]
  std::vector<float> values;
};

// The names of a weight's two halves: `weight` + "_blocks" / "_scales".
bool has_mxfp4(const SafeTensorsFile& file, std::string_view weight);
// Reads and dequantizes `weight` (e.g. "model.layers.0.mlp.experts.gate_up_proj") from its
// `_blocks` and `_scales` in `file`, as transformers' parameter [E, G*32, N], or only the
// experts [first, last) of it (an expert-parallel rank's; last -1: through the end):
// [last - first, G*32, N]. An error names the expert and its block.
Mxfp4Weight read_mxfp4(const SafeTensorsFile& file, std::string_view weight, std::int64_t first = 0,
                       std::int64_t last = -1);

}  // namespace peakbound
