// The small MoE model the trainer's multi-rank tests share: vocab 300, hidden 32, 3 layers
// (the first dense), 8 experts top-2 of width 24, GQA 4 / 2 heads of 8 with q/k norms, aux
// loss 0.01, init std 0.1. Small enough for 4 oversubscribed ranks, with every feature the
// schedules touch (a dense layer, experts over EP, the head over the vocabulary group).
#pragma once

#include <string>

#include "peakbound/model/model_config.h"

namespace peakbound::testing {

inline ModelConfig small_train_config(std::string name) {
  ModelConfig c;
  c.name = std::move(name);
  c.family = "peakbound";
  c.vocab_size = 300;
  c.hidden_size = 32;
  c.num_layers = 3;
  c.num_dense_layers = 1;
  c.dense_intermediate_size = 48;
  c.num_experts = 8;
  c.top_k = 2;
  c.moe_intermediate_size = 24;
  c.norm_topk_prob = true;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.qk_norm = true;
  c.router_aux_loss_coef = 0.01;
  c.initializer_range = 0.1;
  return c;
}

}  // namespace peakbound::testing
