#pragma once

// A character-level text corpus for language-model training, as plain data
// (no tensors, no torch): the text's distinct bytes are the vocabulary, the
// corpus is split into a training part and a validation part (its tail), and
// training windows are drawn at offsets that depend only on (seed, step), so
// a run resumed from a checkpoint at step s sees exactly the batches an
// uninterrupted run sees from step s on.
//
//   auto corpus = TextCorpus::FromText(ReadFortunes("/usr/share/games/fortunes").value(),
//                                      {.validation_fraction = 0.05}).value();
//   TokenWindows w = corpus.Windows(Split::kTrain, seed, step, 32, 64);
//   // w.tokens[b * 64 + t] predicts w.targets[b * 64 + t], the next byte.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace meshrun::worker::parallel {

enum class Split { kTrain, kValidation };

struct CorpusOptions {
  // The tail of the text held out for validation loss.
  double validation_fraction = 0.05;
  // The vocabulary is padded to a multiple of this (a tensor-parallel
  // embedding splits it evenly over tp ranks).
  int vocab_multiple = 8;
};

// Row-major [batch, seq] token ids and their next-token targets.
struct TokenWindows {
  int64_t batch = 0;
  int64_t seq = 0;
  std::vector<int64_t> tokens;
  std::vector<int64_t> targets;
};

class TextCorpus {
 public:
  // The text itself. INVALID_ARGUMENT when either split would be shorter
  // than 2 bytes or the fraction is outside (0, 1).
  static absl::StatusOr<TextCorpus> FromText(std::string text,
                                             const CorpusOptions& options);
  // The files' contents, joined in the order given. NOT_FOUND naming the
  // first file that cannot be read.
  static absl::StatusOr<TextCorpus> FromFiles(const std::vector<std::string>& paths,
                                              const CorpusOptions& options);

  // Distinct bytes of the text, padded up to the vocabulary multiple (the
  // padding ids never occur).
  int64_t vocab_size() const { return vocab_size_; }
  int64_t size(Split split) const;
  // Bytes not in the vocabulary are dropped.
  std::vector<int64_t> Encode(std::string_view text) const;
  // Padding ids decode to '?'.
  std::string Decode(const std::vector<int64_t>& ids) const;

  // `batch` windows of `seq` tokens from `split` at offsets drawn from
  // (seed, step, split) alone. REQUIRES: seq + 1 <= size(split).
  TokenWindows Windows(Split split, uint64_t seed, int64_t step, int64_t batch,
                       int64_t seq) const;

 private:
  TextCorpus() = default;

  std::vector<int64_t> ids_;  // the whole text, encoded
  int64_t train_size_ = 0;    // ids_[0, train_size_) trains; the rest validates
  int64_t vocab_size_ = 0;
  std::vector<int64_t> id_of_byte_;  // 256 entries, -1 for bytes not in the text
  std::string byte_of_id_;
};

// The text of a fortunes directory (Debian's `fortunes` package installs
// /usr/share/games/fortunes): its regular files that are not indexes (*.dat)
// or links (*.u8), in name order, each through StripCookieSeparators.
// NOT_FOUND when it holds none.
absl::StatusOr<std::string> ReadFortunes(const std::string& dir);
// A fortune file's text with its '%' separator lines made blank.
std::string StripCookieSeparators(std::string_view text);

}  // namespace meshrun::worker::parallel
