// The vocabulary loss's footprints as pure functions: phases, what each holds, element
// sizes, the automatic mode, and errors that name the option. (Measured == footprint
// against the Arena is vocab_footprint_mpi_test.cc.)
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/schedules/vocab_footprint.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::uint64_t R(std::uint64_t bytes) { return arena_reserved(bytes); }
std::uint64_t vocab_in(const Footprint& f, const char* phase) {
  return f.phase(phase).device[static_cast<std::size_t>(Component::vocab)];
}

template <typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one with '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(VocabFootprint, RingWeightsBackwardHoldsFiveShardBuffers) {
  // P = 4, V = 1000 (250 rows each), H = 64, T = 512 per rank, chunk 256: weights mode.
  const auto s = VocabLossShape::uniform(512, {1000, 64}, 4, 1);
  VocabLossOptions o;
  EXPECT_EQ(ring_dtp_mode(s, o), RingMode::weights);
  const Footprint f = ring_dtp_footprint(s, o, 4);
  const std::uint64_t shard = R(250 * 64 * 4), block = R(256 * 250 * 4), lse = R(512 * 4);
  EXPECT_EQ(vocab_in(f, "forward"), lse + R(3 * 512 * 4) + block + 2 * shard);  // two travelling shards
  EXPECT_EQ(vocab_in(f, "saved"), lse);
  // The shard double-buffered, the dW accumulator double-buffered, and our partial dW.
  EXPECT_EQ(vocab_in(f, "backward"), lse + block + 5 * shard);
  EXPECT_EQ(f.device_peak(Component::vocab), vocab_in(f, "backward"));
}

TEST(VocabFootprint, FusedStepIsOneBlockAtOneRank) {
  VocabLossOptions o;  // chunk 256
  for (std::int64_t T : {1000, 4000}) {
    const auto s = VocabLossShape::uniform(T, {1001, 64}, 1, 0);
    EXPECT_TRUE(ring_dtp_fuses(s));
    const Footprint f = ring_dtp_step_footprint(s, o, 4);
    ASSERT_EQ(f.phases().size(), 1u);
    EXPECT_EQ(vocab_in(f, "forward_backward"), R(256 * 1001 * 4)) << "no lse, no statistics: one block";
    EXPECT_EQ(f.device_peak(Component::vocab), R(256 * 1001 * 4)) << T << " tokens";
  }
  // Fewer tokens than a chunk: a smaller block.
  EXPECT_EQ(ring_dtp_step_footprint(VocabLossShape::uniform(3, {1001, 64}, 1, 0), o, 4).device_peak(Component::vocab),
            R(3 * 1001 * 4));
  // Several ranks: forward_backward is forward + backward, the ring's footprint.
  const auto s4 = VocabLossShape::uniform(512, {1000, 64}, 4, 1);
  EXPECT_FALSE(ring_dtp_fuses(s4));
  EXPECT_EQ(ring_dtp_step_footprint(s4, o, 4).device_peak(Component::vocab),
            ring_dtp_footprint(s4, o, 4).device_peak(Component::vocab));
}

TEST(VocabFootprint, RingActivationsTravellingSets) {
  // Few tokens, big shards: activations. Uneven: this rank 10 tokens, the largest 30.
  VocabLossShape s;
  s.tokens = {10, 30, 0};
  s.dims = {30000, 16};
  s.rank = 0;
  VocabLossOptions o;
  o.chunk = 8;
  EXPECT_EQ(ring_dtp_mode(s, o), RingMode::activations);
  const RingDtpBuffers b = ring_dtp_buffers(s, o, 4);
  ASSERT_EQ(b.fwd_lanes.size(), 3u);
  ASSERT_EQ(b.bwd_lanes.size(), 4u);
  EXPECT_EQ(b.fwd_block.bytes, 8u * 10000 * 4);  // [min(chunk, Tmax), own rows]
  EXPECT_EQ(b.fwd_lanes[RingDtpBuffers::kHidden].bytes, 30u * 16 * 4);
  EXPECT_EQ(b.fwd_lanes[RingDtpBuffers::kTargets].bytes, 30u * 4);
  EXPECT_EQ(b.fwd_lanes[RingDtpBuffers::kStats].bytes, 3u * 30 * 4);
  EXPECT_EQ(b.bwd_lanes[RingDtpBuffers::kLse].bytes, 30u * 4);
  EXPECT_EQ(b.bwd_lanes[RingDtpBuffers::kHiddenGrad].bytes, 30u * 16 * 4);
  EXPECT_EQ(b.lse.bytes, 10u * 4);  // own tokens only
  const Footprint f = ring_dtp_footprint(s, o, 4);
  std::uint64_t bwd = R(b.lse.bytes) + R(b.bwd_block.bytes) + R(b.bwd_partial.bytes);
  for (const BufferSpec& l : b.bwd_lanes) bwd += 2 * R(l.bytes);
  EXPECT_EQ(vocab_in(f, "backward"), bwd);
}

TEST(VocabFootprint, SingleRankHasNoTravellingBuffers) {
  const auto s = VocabLossShape::uniform(100, {5000, 32}, 1);
  for (RingMode m : {RingMode::activations, RingMode::weights}) {
    VocabLossOptions o;
    o.mode = m;
    const RingDtpBuffers b = ring_dtp_buffers(s, o, 4);
    EXPECT_TRUE(b.fwd_lanes.empty());
    EXPECT_TRUE(b.bwd_lanes.empty());
    EXPECT_EQ(b.bwd_partial.bytes, 0u);
  }
}

TEST(VocabFootprint, MaterializedHoldsTheGroupsLogits) {
  VocabLossShape s;
  s.tokens = {100, 50};
  s.dims = {1001, 8};
  s.rank = 1;  // rows 500
  const Footprint f = materialized_vocab_footprint(s, {}, 4);
  const std::uint64_t saved = R(150 * 8 * 4) + R(150 * 4) + R(150 * 500 * 4) + R(150 * 4);
  EXPECT_EQ(vocab_in(f, "saved"), saved);
  EXPECT_EQ(vocab_in(f, "forward"), saved + 2 * R(150 * 4));
  EXPECT_EQ(vocab_in(f, "backward"), saved + R(150 * 8 * 4));
}

TEST(VocabFootprint, ElemBytesScaleOnlyTheHiddenWideTensors) {
  const auto s = VocabLossShape::uniform(4096, {129280, 7168}, 8);
  VocabLossOptions o;
  const RingDtpBuffers f32 = ring_dtp_buffers(s, o, 4), bf16 = ring_dtp_buffers(s, o, 2);
  EXPECT_EQ(bf16.bwd_lanes[0].bytes * 2, f32.bwd_lanes[0].bytes);
  EXPECT_EQ(bf16.bwd_block.bytes, f32.bwd_block.bytes);  // logits blocks stay fp32
  EXPECT_EQ(bf16.lse.bytes, f32.lse.bytes);
  const MaterializedVocabBuffers m32 = materialized_vocab_buffers(s, o, 4), m16 = materialized_vocab_buffers(s, o, 2);
  EXPECT_EQ(m16.hidden_all.bytes * 2, m32.hidden_all.bytes);
  EXPECT_EQ(m16.logits.bytes, m32.logits.bytes);
}

TEST(VocabFootprint, RingPeakHasNoTokensTimesVocabTerm) {
  VocabLossOptions o;
  o.mode = RingMode::weights;
  const VocabDims d{129280, 7168};
  const Footprint a = ring_dtp_footprint(VocabLossShape::uniform(8192, d, 8), o, 2);
  const Footprint b = ring_dtp_footprint(VocabLossShape::uniform(8 * 8192, d, 8), o, 2);
  // Only per-token fp32 state grows: lse and the running max/sum/target (16 bytes/token).
  EXPECT_LE(b.device_peak(Component::vocab) - a.device_peak(Component::vocab), 16u * 7 * 8192 + 2 * 256);
  // The baseline holds [8 x 65536, V/8] fp32 logits there: over 30 GB against ~1.2 GB.
  const Footprint mb = materialized_vocab_footprint(VocabLossShape::uniform(8 * 8192, d, 8), o, 2);
  EXPECT_GT(mb.device_peak(Component::vocab), 20 * b.device_peak(Component::vocab));
}

TEST(VocabFootprint, AutoPicksTheSmallerTravellingSet) {
  VocabLossOptions o;
  EXPECT_EQ(ring_dtp_mode(VocabLossShape::uniform(99, {400, 8}, 4), o), RingMode::activations);  // 99 < 100 rows
  EXPECT_EQ(ring_dtp_mode(VocabLossShape::uniform(100, {400, 8}, 4), o), RingMode::weights);
  o.mode = RingMode::activations;
  EXPECT_EQ(ring_dtp_mode(VocabLossShape::uniform(100000, {400, 8}, 4), o), RingMode::activations);
}

TEST(VocabFootprint, ErrorsNameTheOption) {
  const auto s = VocabLossShape::uniform(10, {100, 8}, 2);
  VocabLossOptions o;
  o.chunk = 0;
  expect_error([&] { ring_dtp_footprint(s, o, 4); }, "vocab loss chunk must be positive");
  o = {};
  o.z_loss = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { ring_dtp_footprint(s, o, 4); }, "vocab loss z_loss must be finite");
  o.z_loss = std::numeric_limits<float>::infinity();
  expect_error([&] { materialized_vocab_footprint(s, o, 4); }, "vocab loss z_loss must be finite");
  o.z_loss = -0.1f;
  expect_error([&] { validate(o); }, "vocab loss z_loss");
  expect_error([] { parse_ring_mode("x"); }, "vocab loss mode 'x' is not auto, activations or weights");
  expect_error([&] { ring_dtp_footprint(VocabLossShape::uniform(10, {0, 8}, 2), {}, 4); }, "vocab loss vocab must be positive");
  expect_error([&] { ring_dtp_footprint(VocabLossShape::uniform(-1, {100, 8}, 2), {}, 4); }, "token count");
  expect_error([&] { ring_dtp_footprint(VocabLossShape::uniform(10, {100, 8}, 2, 2), {}, 4); }, "rank 2");
  // A shape whose buffers do not fit 64 bits is an error, not a wrapped size.
  expect_error([&] { materialized_vocab_footprint(VocabLossShape::uniform(std::int64_t{1} << 50, {1 << 20, 1 << 16}, 2), {}, 4); },
               "overflows 64 bits");
}

// The Precision form under f32 is the elem_bytes = 4 form byte for byte (the bf16-only
// buffers are 0 bytes), in every phase of every footprint, for both modes, fused and not.
TEST(VocabFootprint, PrecisionF32IsElemBytesFourExactly) {
  auto same = [](const Footprint& a, const Footprint& b) {
    EXPECT_EQ(a.to_json().dump(), b.to_json().dump());  // names, phases in order, every component's bytes
  };
  VocabLossShape uneven;
  uneven.tokens = {13, 0, 29};
  uneven.dims = {97, 12};
  uneven.rank = 2;
  for (const VocabLossShape& s : {VocabLossShape::uniform(37, {97, 12}, 1),
                                  VocabLossShape::uniform(300, {1001, 16}, 4, 3), uneven,
                                  VocabLossShape::uniform(5, {2, 8}, 3, 2)}) {
    for (RingMode m : {RingMode::automatic, RingMode::activations, RingMode::weights}) {
      VocabLossOptions o;
      o.mode = m;
      o.chunk = 7;
      SCOPED_TRACE("P=" + std::to_string(s.ranks()) + " mode " + std::string(ring_mode_name(m)));
      same(ring_dtp_footprint(s, o, Precision::f32), ring_dtp_footprint(s, o, 4));
      same(ring_dtp_step_footprint(s, o, Precision::f32), ring_dtp_step_footprint(s, o, 4));
      same(materialized_vocab_footprint(s, o, Precision::f32), materialized_vocab_footprint(s, o, 4));
      const RingDtpBuffers b = ring_dtp_buffers(s, o, Precision::f32);
      EXPECT_EQ(b.g16.bytes + b.dx_tile.bytes + b.d_hidden32.bytes + b.fused_g16.bytes, 0u);
      const MaterializedVocabBuffers mb = materialized_vocab_buffers(s, o, Precision::f32);
      EXPECT_EQ(mb.g16.bytes + mb.d_hidden32.bytes, 0u);
    }
  }
}

// Under bf16 what the runtime allocates: carried hidden rows and W shards in bf16, every
// dW/dX accumulator in fp32, plus the narrowing buffers.
TEST(VocabFootprint, Bf16CarriesHalfAndAccumulatesInF32) {
  VocabLossOptions o;
  o.chunk = 64;
  o.mode = RingMode::weights;
  const auto s = VocabLossShape::uniform(300, {1001, 16}, 4, 1);  // rows 251 / 250, rows_max 251
  RingDtpBuffers w = ring_dtp_buffers(s, o, Precision::bf16);
  EXPECT_EQ(w.bwd_lanes[RingDtpBuffers::kWeight].bytes, 251u * 16 * 2);
  EXPECT_EQ(w.bwd_lanes[RingDtpBuffers::kWeightGrad].bytes, 251u * 16 * 4);
  EXPECT_EQ(w.bwd_partial.bytes, 251u * 16 * 4);
  EXPECT_EQ(w.bwd_block.bytes, 64u * 251 * 4);
  EXPECT_EQ(w.g16.bytes, 64u * 251 * 2);
  EXPECT_EQ(w.d_hidden32.bytes, 300u * 16 * 4);
  EXPECT_EQ(w.dx_tile.bytes, 0u);
  const Footprint fw = ring_dtp_footprint(s, o, Precision::bf16);
  EXPECT_EQ(vocab_in(fw, "backward"), R(300 * 4) + R(64 * 251 * 4) + R(251 * 16 * 4) + 2 * R(251 * 16 * 2) +
                                          2 * R(251 * 16 * 4) + R(64 * 251 * 2) + R(300 * 16 * 4));
  EXPECT_EQ(vocab_in(fw, "forward"), R(300 * 4) + R(64 * 251 * 4) + R(3 * 300 * 4) + 2 * R(251 * 16 * 2));
  o.mode = RingMode::activations;
  RingDtpBuffers a = ring_dtp_buffers(s, o, Precision::bf16);
  EXPECT_EQ(a.bwd_lanes[RingDtpBuffers::kHidden].bytes, 300u * 16 * 2);
  EXPECT_EQ(a.bwd_lanes[RingDtpBuffers::kHiddenGrad].bytes, 300u * 16 * 4);
  EXPECT_EQ(a.bwd_partial.bytes, 300u * 16 * 4);
  EXPECT_EQ(a.g16.bytes, 64u * 250 * 2);
  EXPECT_EQ(a.d_hidden32.bytes + a.dx_tile.bytes, 0u);  // the finished dX is narrowed from its lane
  // One rank: the fused block, its bf16 copy and one chunk's fp32 dX.
  const auto one = VocabLossShape::uniform(300, {1001, 16}, 1);
  const Footprint fused = ring_dtp_step_footprint(one, o, Precision::bf16);
  EXPECT_EQ(vocab_in(fused, "forward_backward"), R(64 * 1001 * 4) + R(64 * 1001 * 2) + R(64 * 16 * 4));
  // The baseline: bf16 gathered hidden states, fp32 dHidden of the group, a 256-row bf16
  // gradient tile, and (equal counts) the reduce-scatter's fp32 [T, H].
  const MaterializedVocabBuffers m = materialized_vocab_buffers(s, o, Precision::bf16);
  EXPECT_EQ(m.hidden_all.bytes, 1200u * 16 * 2);
  EXPECT_EQ(m.d_hidden_all.bytes, 1200u * 16 * 4);
  EXPECT_EQ(m.g16.bytes, 256u * 250 * 2);
  EXPECT_EQ(m.d_hidden32.bytes, 300u * 16 * 4);
  VocabLossShape uneven = s;
  uneven.tokens = {300, 301, 300, 300};
  EXPECT_EQ(materialized_vocab_buffers(uneven, o, Precision::bf16).d_hidden32.bytes, 0u);  // narrowed from dHg
}

TEST(VocabFootprint, DefaultsLiveInTheOptions) {
  const VocabLossOptions o;
  EXPECT_EQ(o.chunk, 256);
  EXPECT_EQ(o.z_loss, 0.0f);
  EXPECT_EQ(o.ignore_index, -100);
  EXPECT_EQ(o.mode, RingMode::automatic);
  EXPECT_EQ(o.precision, Precision::f32);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
