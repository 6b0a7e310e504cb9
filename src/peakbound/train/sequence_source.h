// Where a run's sequences come from, by global sequence number, so that any rank can
// produce its own share of any step without reading anyone else's:
//   copy task     the built-in copy task (train/copy_task.h), the same way
//   kv retrieval  the built-in task (train/kv_retrieval_task.h); evaluation sequences
//                 come from a disjoint range of sequence numbers
//   random ids    uniform random token ids over the whole vocabulary, the next id the
//                 target: every token scored, nothing to learn (the blind bound log V).
//                 The data of the speed comparisons (bench reach, PyTorch FSDP2's peer):
//                 every token does the same work
//   token file    a tokenized corpus (io/token_file.h), llm.c windows: training windows
//                 from the first part, evaluation windows from the held-out split
//                 (the last eval_fraction of the tokens); training wraps around the
//                 training windows, evaluation takes them in order
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "peakbound/io/token_file.h"
#include "peakbound/train/copy_task.h"
#include "peakbound/train/kv_retrieval_task.h"

namespace peakbound {

class SequenceSource {
 public:
  virtual ~SequenceSource() = default;
  virtual std::string describe() const = 0;
  std::int64_t seq_len() const { return seq_len_; }
  // Training sequence n (any n >= 0): inputs [S], targets [S] (ignore_index where unscored).
  virtual void train(std::int64_t n, std::int32_t* inputs, std::int32_t* targets) const = 0;
  // Evaluation sequence n, 0 <= n < eval_sequences().
  virtual void eval(std::int64_t n, std::int32_t* inputs, std::int32_t* targets) const = 0;
  virtual std::int64_t eval_sequences() const = 0;
  // The loss a model without context cannot beat on the scored tokens (the task's
  // unigram entropy), or NaN when unknown (a corpus).
  virtual double blind_loss() const = 0;

 protected:
  std::int64_t seq_len_ = 0;
};

std::unique_ptr<SequenceSource> copy_task_source(const CopyTask& task, std::int32_t ignore_index);
std::unique_ptr<SequenceSource> kv_retrieval_source(const KvRetrievalTask& task, std::int32_t ignore_index);
std::unique_ptr<SequenceSource> random_ids_source(std::int64_t vocab, std::int64_t seq_len, std::uint64_t seed);
// Throws InvalidArgument naming the file when it has too few tokens for one training
// and one evaluation window, or a token id >= vocab (checked over the whole file).
std::unique_ptr<SequenceSource> token_file_source(const std::string& path, std::int64_t seq_len,
                                                  double eval_fraction, std::int64_t vocab);

}  // namespace peakbound
