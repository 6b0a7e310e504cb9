// Training checkpoints (issue 13): what a stopped run needs to continue bit for bit, on
// the same layout or another one.
//
// A checkpoint is a folder DIR/step-NNNNNNNN holding, per rank r of W,
//   rank-RRRRR.model.safetensors   the rank's optimizer-shard pieces of the parameters
//                                  (the fp32 master weights: the trained parameters in
//                                  either precision, docs/precision.md), one 1-D tensor per
//                                  piece under its Hugging Face name; rank 0's also holds
//                                  the router buffers whole (DeepSeek's
//                                  e_score_correction_bias: model state the optimizer does
//                                  not own, the same on every rank)
//   rank-RRRRR.optim.safetensors   AdamW's m and v for the same pieces (NAME.exp_avg,
//                                  NAME.exp_avg_sq)
//   config.json                    (rank 0) the Hugging Face config of a model started
//                                  from a Hugging Face directory, for export_hf
// each piece's place in its tensor in the file's metadata (NAME -> {"tensor", "begin",
// "shape"}: elements [begin, begin + n) of the flattened tensor of that full shape, as
// torch.distributed.checkpoint records chunks), and manifest.json (rank 0): the format
// version, the step, the data position, the seed, the model config, the layout, the
// optimizer, the run's flags and every file's size and CRC-32.
//
// Writing is atomic at every level: the files go into DIR/.step-NNNNNNNN.tmp, each written
// to a temporary name, flushed and renamed; the manifest last; then the folder is renamed
// to step-NNNNNNNN, DIR is flushed, and DIR/latest (the step folder's name) is replaced
// atomically. A run killed at any point leaves `latest` naming a complete checkpoint (or
// no `latest` at all). Older step folders beyond the last `keep` are then removed.
//
// Loading reads the manifest, checks every file it opens against the recorded size and
// CRC-32, and fills this rank's shard from whichever pieces overlap its segments
// (Trainer::shard_segments): a checkpoint taken with other DP, EP, CP or vocabulary
// sizes loads as well (resharding on load), and a piece missing or of another shape is a
// one-line error naming the tensor. All ranks must see the same folder (a shared file
// system across nodes).
//
// A save folder belongs to one run. CheckpointWriter::claim (before the first step) takes
// an exclusive lock on DIR/.lock, held by rank 0 for the writer's life (every rank of the
// run writes into the folder only after rank 0 has claimed it, so one lock covers the run;
// flock works across nodes on NFS), and refuses a folder that holds another run's
// identity (DIR/run.json: the run id and the settings that define the run, written
// atomically at the first save) or anything not made by peakbound. A run that resumes
// from a checkpoint carries that checkpoint's run id: it is the same run. Pruning (keep)
// removes only step folders whose manifest names this run's id, never a look-alike.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "peakbound/core/dtype.h"
#include "peakbound/model/model_config.h"
#include "peakbound/train/process_groups.h"
#include "peakbound/train/trainer.h"

namespace peakbound {

// The run's state beside the tensors.
struct RunState {
  std::int64_t step = 0;                // optimizer steps taken (the learning rate's position)
  std::int64_t sequences_consumed = 0;  // training sequences read over the world (the data position)
  std::uint64_t seed = 0;               // the run's seed (initialisation, built-in tasks)
  nlohmann::json run = nlohmann::json::object();  // the flags the run was started with (informational)
  // The config.json of a model started from a Hugging Face directory, verbatim (empty for
  // a preset): kept in the checkpoint as config.json, so export can write it back.
  std::string hf_config;
  // The run's identity (random, made at the run's start, kept across resumes); "" in a
  // checkpoint written before run ids were recorded.
  std::string run_id;
};

struct SaveOptions {
  int keep = 3;  // step folders kept (>= 1)
};

// Saves that overlap training: start() takes this rank's host copies of the state (so the
// steps that follow may change it) and writes the files on a thread; finish() waits for
// the files and commits the checkpoint (the manifest, the rename, `latest`). Both are
// collective over the trainer's world and must be called on every rank together;
// writing() lets a caller fold "are my files written" into a collective it already makes,
// and call finish() once no rank is still writing. A writer destroyed with a save in
// flight abandons it (its temporary folder never becomes a checkpoint).
class CheckpointWriter {
 public:
  CheckpointWriter(std::string dir, SaveOptions options = {});
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective, before the first save (start() claims with the state's run_id and run
  // when it was not called): creates DIR, takes its lock, and checks that DIR is this
  // run's (or empty, or holds only what an interrupted start of this run left). `adopt`:
  // this run resumed from DIR's checkpoints written before run ids, which makes them its
  // own. AgreedError (one line naming DIR: another live run holds it, with that run's pid;
  // it holds another run's checkpoints; it holds files not made by peakbound).
  void claim(Communicator& world, const std::string& run_id, const nlohmann::json& identity, bool adopt = false);
  // Rank 0 holds DIR's lock (false elsewhere, and where DIR's file system has no locks:
  // then a second live run on DIR is not detected, the identity checks still hold).
  bool locked() const { return lock_fd_ >= 0; }

  // Finishes a save still in flight first.
  void start(const Trainer& trainer, const RunState& state, const ModelConfig& config, const ParallelLayout& layout);
  // The committed step folder ("" when no save was in flight); Error as save_checkpoint.
  std::string finish(Communicator& world);
  bool pending() const { return pending_ != nullptr; }
  // This rank's files of the save in flight are not written yet.
  bool writing() const;

 private:
  struct Pending;
  // Whether step_dir holds a checkpoint of this run (a valid manifest naming its id).
  bool ours(const std::string& step_dir) const;

  std::string dir_;
  SaveOptions options_;
  std::unique_ptr<Pending> pending_;
  bool claimed_ = false;
  int lock_fd_ = -1;  // rank 0: DIR/.lock, flock-ed while the writer lives
  std::string run_id_;
  nlohmann::json identity_;
  bool adopt_ = false;
  bool identity_written_ = false;  // rank 0: DIR/run.json names this run
};

// Collective over the trainer's world: start() and finish() at once. Writes
// DIR/step-<state.step> as above and returns its path. AgreedError (naming the path and
// the system's reason) when a file cannot be written (disk full, no permission): on every
// rank, the previous checkpoint and `latest` intact.
std::string save_checkpoint(const std::string& dir, const Trainer& trainer, const RunState& state,
                            const ModelConfig& config, const ParallelLayout& layout, const SaveOptions& options = {});

// Creates DIR (and its parents) when missing and checks that it is a folder this process
// can write into (a probe file created and removed): what a save needs, found before the
// run trains. InvalidArgument naming DIR and the system's reason.
void prepare_save_folder(const std::string& dir);

// The step folder DIR names: DIR itself when it holds manifest.json, else the folder
// DIR/latest names. InvalidArgument (one line) when there is none, DIR is a file, or
// `latest` is damaged (quoted only when it is short printable text).
std::string resolve_checkpoint(const std::string& dir);
// Whether DIR holds a checkpoint (resolve_checkpoint would succeed).
bool has_checkpoint(const std::string& dir);

// The manifest of a step folder, checked for the fields loading needs.
nlohmann::json read_checkpoint_manifest(const std::string& step_dir);

// Collective. Loads the step folder into the trainer (Trainer::restore) and returns the
// run state. AgreedError (every rank, the lowest failing rank's message) naming the file
// when a file is missing, truncated or corrupted (size or CRC-32 differs from the
// manifest), or when the checkpoint does not hold every element of this rank's shard
// (another model).
RunState load_checkpoint(const std::string& step_dir, Trainer& trainer);

// Writes OUT/model.safetensors (every tensor whole, under its Hugging Face name, assembled
// from every rank's pieces of the fp32 master weights, in `dtype`: F32, or BF16 rounded to
// nearest even) and OUT/config.json (the checkpoint's own, its torch_dtype saying the
// dtype written) for transformers' from_pretrained; returns the dtype written. `dtype`
// f32 or bf16; by default the dtype of the Hugging Face config the run started from
// (hf_config_dtype: bf16 for "bfloat16", else f32). One process, no communication.
// InvalidArgument when the checkpoint holds no config.json (a preset model: transformers
// has no model type for it), a file fails its check, or a tensor is not covered exactly once.
DType export_hf(const std::string& step_dir, const std::string& out_dir, std::optional<DType> dtype = std::nullopt);

}  // namespace peakbound
