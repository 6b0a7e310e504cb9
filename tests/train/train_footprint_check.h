// Shared by train_footprint_test.cc (one rank) and train_footprint_mpi_test.cc (1-4
// ranks): one Trainer::step of a tiny Qwen3-MoE-shaped model on a fresh CPU device,
// then the Arena's (and HostMemory's) measured peaks against train_footprint, per
// component and in total.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "peakbound/core/host_memory.h"
#include "peakbound/core/precision.h"
#include "peakbound/core/splitmix.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/schedules/moe_dispatch.h"
#include "peakbound/train/train_footprint.h"
#include "peakbound/train/trainer.h"

namespace peakbound::train_footprint_check {

// presets.cc's small_model, tiny: vocab 300, hidden 32, one dense layer then MoE
// layers of 8 experts top-2, heads 4 / 2 of dim 8.
inline ModelConfig tiny_model(std::int64_t layers = 3) {
  ModelConfig c;
  c.name = "trainfp-tiny";
  c.family = "peakbound";
  c.vocab_size = 300;
  c.hidden_size = 32;
  c.num_layers = layers;
  c.num_dense_layers = 1;
  c.dense_intermediate_size = 4 * 32;
  c.num_experts = 8;
  c.top_k = 2;
  c.moe_intermediate_size = 2 * 32;
  c.router_scoring = RouterScoring::softmax;
  c.norm_topk_prob = true;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.router_aux_loss_coef = 0.01;
  return c;
}

struct Variant {
  const char* name;
  DispatchKind dispatch;
  bool ring_dtp;
  CheckpointSchedule checkpoint;
  const char* optimizer;
  bool keep_attention = false;  // ModelSchedules::keep_attention
  std::int64_t moe_tile = 0;    // ModelSchedules::moe_tile
  std::int64_t attention_piece = kRingPieceTokens;  // ModelSchedules::attention_piece
  bool vocab_parallel_embedding = false;            // ModelSchedules::vocab_parallel_embedding
  std::int64_t embedding_rows = kEmbeddingRoundRows;
  bool keep_experts = false;  // ModelSchedules::keep_experts
};
inline const Variant kNone{"none", DispatchKind::standard_ep, false, CheckpointSchedule::resident, "device"};
inline const Variant kAll{"all", DispatchKind::pipelined_llep, true, CheckpointSchedule::sco, "offload_stream"};
inline const Variant kNoneKept{"none, attention kept", DispatchKind::standard_ep, false, CheckpointSchedule::resident,
                               "device", true};
// All four with the MLP sublayers over row tiles of 7 tokens (the default 1024 does not tile
// these few tokens): every per-token buffer of the sublayer one tile's, and the dispatch
// sized by the tile that held the most.
inline const Variant kAllTiled{"all, row tiles of 7", DispatchKind::pipelined_llep, true, CheckpointSchedule::sco,
                               "offload_stream", false, 7};
// All four with the attention in pieces of 5 tokens (ModelSchedules::attention_piece): the
// queries of the forward and the backward a piece at a time, the ring's K/V in pieces.
inline const Variant kAllPieces{"all, attention pieces of 5", DispatchKind::pipelined_llep, true,
                                CheckpointSchedule::sco, "offload_stream", false, 7, 5};
// All four with the vocabulary-parallel embedding in rounds of 7 tokens a rank.
inline const Variant kAllVocabEmbedding{"all, vocabulary-parallel embedding", DispatchKind::pipelined_llep, true,
                                        CheckpointSchedule::sco, "offload_stream", false, 7, 5, true, 7};
inline const Variant kAllKept{"all, attention kept", DispatchKind::pipelined_llep, true, CheckpointSchedule::sco,
                              "offload_stream", true};
// The experts' forward kept for their backward (ModelSchedules::keep_experts): standard EP
// whole, and all four in row tiles of 7 (a store per tile) with the attention kept too.
inline const Variant kNoneKeptExperts{"none, experts kept", DispatchKind::standard_ep, false,
                                      CheckpointSchedule::resident, "device", false, 0, kRingPieceTokens, false,
                                      kEmbeddingRoundRows, true};
inline const Variant kAllKeptExperts{"all, row tiles of 7, attention and experts kept", DispatchKind::pipelined_llep,
                                     true, CheckpointSchedule::sco, "offload_stream", true, 7, kRingPieceTokens, false,
                                     kEmbeddingRoundRows, true};

struct Measured {
  ComponentBytes device{}, host{};
  std::uint64_t device_total = 0, host_total = 0;
  Footprint footprint;      // with every MoE layer's measured dispatch sizes
  Footprint footprint_max;  // with their field-by-field maximum for every MoE layer
};

// One step of `sequences` x `seq_len` tokens per rank; ep the largest divisor of the
// world and E, the head over every rank.
// rank_sequences: every rank's sequences (empty: `sequences` on every rank). precision:
// the model's (ModelSchedules::precision), which train_footprint reads from the same
// schedules.
inline Measured run_step(Communicator& world, const Variant& v, const ModelConfig& config,
                         std::int64_t sequences = 2, std::int64_t seq_len = 24,
                         const CheckpointOptions* checkpoint = nullptr,
                         const std::vector<std::int64_t>& rank_sequences = {}, int cp = 1,
                         Precision precision = Precision::f32) {
  const int W = world.size(), r = world.rank();
  if (!rank_sequences.empty()) sequences = rank_sequences[static_cast<std::size_t>(r)];
  ParallelLayout layout;
  layout.cp = cp;  // the ranks of a cp group hold the same sequences (data keyed by r / cp)
  layout.ep = W;
  while (config.num_experts % layout.ep != 0 || W % layout.ep != 0) --layout.ep;
  layout.vocab = W;
  ProcessGroups groups = ProcessGroups::split(world, layout);

  CpuDevice dev(64 << 20);
  HostMemory host;
  ThreadPool pool(1);
  ModelSchedules sched;
  sched.dispatch = v.dispatch;
  sched.ring_dtp = v.ring_dtp;
  if (checkpoint) sched.checkpoint = *checkpoint;
  sched.checkpoint.schedule = v.checkpoint;
  sched.precision = precision;
  sched.keep_attention = v.keep_attention;
  sched.keep_experts = v.keep_experts;
  sched.moe_tile = v.moe_tile;
  sched.attention_piece = v.attention_piece;
  sched.vocab_parallel_embedding = v.vocab_parallel_embedding;
  sched.embedding_rows = v.embedding_rows;
  MoeTransformer model(dev, host, groups, config, sched);
  model.init_parameters(7);
  TrainerOptions to;
  to.optimizer = v.optimizer;
  Trainer trainer(model, host, pool, to);

  const std::int64_t T = sequences * seq_len;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T)), targets(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) {
    const std::uint64_t k = splitmix64(static_cast<std::uint64_t>(r / cp) * 1000003u + static_cast<std::uint64_t>(t));
    ids[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(k % static_cast<std::uint64_t>(config.vocab_size));
    targets[static_cast<std::size_t>(t)] =
        t % 11 == 5 ? -100 : static_cast<std::int32_t>((k >> 20) % static_cast<std::uint64_t>(config.vocab_size));
  }
  const MicroBatch mb{ids.data(), targets.data(), sequences, seq_len};
  trainer.step(std::span<const MicroBatch>(&mb, 1));

  Measured m;
  for (Component c : kAllComponents) {
    m.device[static_cast<std::size_t>(c)] = dev.arena().peak(c);
    m.host[static_cast<std::size_t>(c)] = host.peak(c);
  }
  m.device_total = dev.arena().peak();
  m.host_total = host.peak();

  TrainFootprintInputs in;
  in.model = config;
  in.layout = layout;
  in.world = W;
  in.rank = r;
  in.sequences = sequences;
  in.seq_len = seq_len;
  in.rank_sequences = rank_sequences;
  in.schedules = sched;
  in.optimizer = v.optimizer;
  std::vector<DispatchSizes> sizes;
  for (const DispatchStats* st : model.dispatch_stats()) sizes.push_back(st->sizes);
  in.dispatch_layers = sizes;
  m.footprint = train_footprint(in);
  in.dispatch_layers.clear();
  in.dispatch = dispatch_sizes_max(sizes);
  m.footprint_max = train_footprint(in);
  return m;
}

// Measured == footprint per component (device and host) and in total.
inline void check(Communicator& world, const Variant& v, const ModelConfig& config,
                  const CheckpointOptions* checkpoint = nullptr, const std::vector<std::int64_t>& rank_sequences = {},
                  int cp = 1, std::int64_t seq_len = 24, Precision precision = Precision::f32) {
  SCOPED_TRACE(std::string(v.name) + " at rank " + std::to_string(world.rank()) + " of " +
               std::to_string(world.size()) + ", cp " + std::to_string(cp) + ", " +
               std::string(precision_name(precision)));
  const Measured m = run_step(world, v, config, 2, seq_len, checkpoint, rank_sequences, cp, precision);
  const Footprint& f = m.footprint;
  for (Component c : kAllComponents) {
    EXPECT_EQ(m.device[static_cast<std::size_t>(c)], f.device_peak(c)) << "device " << component_name(c);
    EXPECT_EQ(m.host[static_cast<std::size_t>(c)], f.host_peak(c)) << "host " << component_name(c);
  }
  EXPECT_EQ(m.device_total, f.device_peak_total()) << "device total";
  EXPECT_EQ(m.host_total, f.host_peak_total()) << "host total";
  // One size for every MoE layer (the brief's max over layers) is exact per component
  // except that the field-by-field maximum may exceed every layer's dispatch, and its
  // total may exceed the true peak: the busiest dispatch sits in the phases of the last
  // MoE layer, beside that layer's resident boundaries.
  const Footprint& fm = m.footprint_max;
  for (Component c : kAllComponents) {
    if (c != Component::dispatch) {
      EXPECT_EQ(m.device[static_cast<std::size_t>(c)], fm.device_peak(c)) << "max sizes: device " << component_name(c);
    }
  }
  EXPECT_GE(fm.device_peak(Component::dispatch), m.device[static_cast<std::size_t>(Component::dispatch)]);
  EXPECT_GE(fm.device_peak_total(), m.device_total);
  // A rank without tokens receives nothing when it is its own expert group (ep 1).
  const bool has_tokens = rank_sequences.empty() || rank_sequences[static_cast<std::size_t>(world.rank())] > 0;
  if (has_tokens) {
    EXPECT_GT(f.device_peak(Component::dispatch), 0u);
  }
  EXPECT_GT(f.device_peak(Component::vocab), 0u);
  if (world.rank() == 0) {
    std::printf(
        "%s %s at %d ranks, cp %d: device peak %llu (measured %llu; with the max sizes %llu), host peak %llu "
        "(measured %llu)\n",
        v.name, std::string(precision_name(precision)).c_str(), world.size(), cp,
        static_cast<unsigned long long>(f.device_peak_total()),
        static_cast<unsigned long long>(m.device_total), static_cast<unsigned long long>(fm.device_peak_total()),
        static_cast<unsigned long long>(f.host_peak_total()), static_cast<unsigned long long>(m.host_total));
    for (const Footprint::Phase& p : f.phases())
      std::printf("  %-30s device %8llu host %8llu\n", p.name.c_str(),
                  static_cast<unsigned long long>(p.device_total()), static_cast<unsigned long long>(p.host_total()));
  }
}

}  // namespace peakbound::train_footprint_check
