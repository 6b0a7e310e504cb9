#include "peakbound/train/sequence_source.h"

#include <cmath>
#include <limits>
#include <utility>

#include "peakbound/core/error.h"
#include "peakbound/core/splitmix.h"

namespace peakbound {

namespace {

// Evaluation sequences of the task are numbered from here: no training run reaches it.
constexpr std::int64_t kEvalBase = std::int64_t{1} << 48;

// A built-in task (KvRetrievalTask or CopyTask): sequence n of the task's stream, the
// evaluation sequences from kEvalBase on.
template <typename Task>
class TaskSource final : public SequenceSource {
 public:
  TaskSource(const Task& t, std::int32_t ignore, std::string description)
      : task_(t), ignore_(ignore), description_(std::move(description)) {
    task_.validate();
    seq_len_ = t.seq_len;
  }
  std::string describe() const override { return description_; }
  void train(std::int64_t n, std::int32_t* in, std::int32_t* tg) const override { fill(n, in, tg); }
  void eval(std::int64_t n, std::int32_t* in, std::int32_t* tg) const override { fill(kEvalBase + n, in, tg); }
  std::int64_t eval_sequences() const override { return std::numeric_limits<std::int64_t>::max() / 4; }
  double blind_loss() const override { return task_.unigram_entropy(); }

 private:
  void fill(std::int64_t n, std::int32_t* in, std::int32_t* tg) const {
    const typename Task::Sequence s = task_.sequence(n, ignore_);
    std::copy(s.inputs.begin(), s.inputs.end(), in);
    std::copy(s.targets.begin(), s.targets.end(), tg);
  }
  Task task_;
  std::int32_t ignore_;
  std::string description_;
};

// Uniform random ids: token t of sequence n is a hash of (seed, n, t) modulo the
// vocabulary; sequence n's inputs are tokens 0..S-1 and its targets tokens 1..S.
class RandomIdsSource final : public SequenceSource {
 public:
  RandomIdsSource(std::int64_t vocab, std::int64_t S, std::uint64_t seed) : vocab_(vocab), seed_(seed) {
    if (vocab < 1 || S < 1) throw InvalidArgument("random ids: need a vocabulary and a sequence length of at least 1");
    seq_len_ = S;
  }
  std::string describe() const override {
    return "random ids (uniform over the " + std::to_string(vocab_) + "-token vocabulary, every token scored)";
  }
  void train(std::int64_t n, std::int32_t* in, std::int32_t* tg) const override { fill(n, in, tg); }
  void eval(std::int64_t n, std::int32_t* in, std::int32_t* tg) const override { fill(kEvalBase + n, in, tg); }
  std::int64_t eval_sequences() const override { return std::numeric_limits<std::int64_t>::max() / 4; }
  double blind_loss() const override { return std::log(static_cast<double>(vocab_)); }

 private:
  std::int32_t id(std::int64_t n, std::int64_t t) const {
    // splitmix64's finalizer over the three, then the remainder (a bias below 2^-40).
    const std::uint64_t z = mix64(seed_ ^ (static_cast<std::uint64_t>(n) * kSplitmixGamma) ^
                                  (static_cast<std::uint64_t>(t) * 0xD1B54A32D192ED03ull));
    return static_cast<std::int32_t>(z % static_cast<std::uint64_t>(vocab_));
  }
  void fill(std::int64_t n, std::int32_t* in, std::int32_t* tg) const {
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      in[t] = id(n, t);
      tg[t] = id(n, t + 1);
    }
  }
  std::int64_t vocab_;
  std::uint64_t seed_;
};

class FileSource final : public SequenceSource {
 public:
  FileSource(const std::string& path, std::int64_t S, double fraction, std::int64_t vocab)
      : file_(TokenFile::open(path)) {
    if (S < 1) throw InvalidArgument("sequence length must be >= 1");
    seq_len_ = S;
    split_ = file_.split(fraction, S);
    train_windows_ = TokenFile::windows(0, split_.train_end, S);
    eval_windows_ = TokenFile::windows(split_.eval_begin, file_.tokens(), S);
    if (train_windows_ < 1 || eval_windows_ < 1)
      throw InvalidArgument("token file '" + path + "': " + std::to_string(file_.tokens()) +
                            " tokens hold no training and evaluation window of " + std::to_string(S) +
                            " tokens each at eval fraction " + std::to_string(fraction));
    for (std::int64_t i = 0; i < file_.tokens(); ++i)
      if (file_.at(i) >= static_cast<std::uint32_t>(vocab))
        throw InvalidArgument("token file '" + path + "': token " + std::to_string(file_.at(i)) + " at position " +
                              std::to_string(i) + " is outside the model's vocabulary of " + std::to_string(vocab));
  }
  std::string describe() const override {
    return "token file " + file_.path() + " (" + std::to_string(train_windows_) + " training and " +
           std::to_string(eval_windows_) + " held-out windows of " + std::to_string(seq_len_) + ")";
  }
  void train(std::int64_t n, std::int32_t* in, std::int32_t* tg) const override {
    file_.window(0, split_.train_end, seq_len_, n % train_windows_, in, tg);
  }
  void eval(std::int64_t n, std::int32_t* in, std::int32_t* tg) const override {
    file_.window(split_.eval_begin, file_.tokens(), seq_len_, n, in, tg);
  }
  std::int64_t eval_sequences() const override { return eval_windows_; }
  double blind_loss() const override { return std::nan(""); }

 private:
  TokenFile file_;
  TokenFile::Split split_;
  std::int64_t train_windows_ = 0, eval_windows_ = 0;
};

}  // namespace

std::unique_ptr<SequenceSource> copy_task_source(const CopyTask& task, std::int32_t ignore_index) {
  return std::make_unique<TaskSource<CopyTask>>(
      task, ignore_index,
      "copy task (a segment of " + std::to_string(task.segment()) + " random symbols of " +
          std::to_string(task.symbol_count()) + ", then itself: " + std::to_string(task.segment() - 1) +
          " scored tokens per sequence, each " + std::to_string(task.segment() + 1) + " tokens after its copy)");
}

std::unique_ptr<SequenceSource> kv_retrieval_source(const KvRetrievalTask& task, std::int32_t ignore_index) {
  return std::make_unique<TaskSource<KvRetrievalTask>>(
      task, ignore_index,
      "kv retrieval task (" + std::to_string(task.pairs) + " pairs, " + std::to_string(task.queries) +
          " scored queries per sequence, " + std::to_string(task.values()) + " values)");
}

std::unique_ptr<SequenceSource> random_ids_source(std::int64_t vocab, std::int64_t seq_len, std::uint64_t seed) {
  return std::make_unique<RandomIdsSource>(vocab, seq_len, seed);
}

std::unique_ptr<SequenceSource> token_file_source(const std::string& path, std::int64_t seq_len,
                                                  double eval_fraction, std::int64_t vocab) {
  return std::make_unique<FileSource>(path, seq_len, eval_fraction, vocab);
}

}  // namespace peakbound
