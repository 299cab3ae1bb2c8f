#include "worker_lib/data/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace meshrun::worker::parallel {

namespace fs = std::filesystem;

namespace {

// SplitMix64: a small, well-mixed generator whose whole state is one word,
// so that a batch depends on nothing but its (seed, step, split).
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (in.bad()) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return text;
}

}  // namespace

absl::StatusOr<TextCorpus> TextCorpus::FromText(std::string text,
                                                const CorpusOptions& options) {
  if (!(options.validation_fraction > 0 && options.validation_fraction < 1))
    return absl::InvalidArgumentError(absl::StrCat(
        "the validation fraction must be in (0, 1), got ", options.validation_fraction));
  if (options.vocab_multiple < 1)
    return absl::InvalidArgumentError("the vocabulary multiple must be at least 1");
  const auto validation = static_cast<int64_t>(static_cast<double>(text.size()) *
                                               options.validation_fraction);
  const int64_t train = static_cast<int64_t>(text.size()) - validation;
  if (validation < 2 || train < 2)
    return absl::InvalidArgumentError(
        absl::StrCat("a text of ", text.size(),
                     " bytes is too short to split into training and validation"));

  TextCorpus corpus;
  corpus.id_of_byte_.assign(256, -1);
  bool present[256] = {};
  for (unsigned char c : text) present[c] = true;
  for (int b = 0; b < 256; ++b) {
    if (!present[b]) continue;
    corpus.id_of_byte_[b] = static_cast<int64_t>(corpus.byte_of_id_.size());
    corpus.byte_of_id_.push_back(static_cast<char>(b));
  }
  const int64_t distinct = static_cast<int64_t>(corpus.byte_of_id_.size());
  corpus.vocab_size_ = (distinct + options.vocab_multiple - 1) / options.vocab_multiple *
                       options.vocab_multiple;
  corpus.ids_ = corpus.Encode(text);
  corpus.train_size_ = train;
  return corpus;
}

absl::StatusOr<TextCorpus> TextCorpus::FromFiles(const std::vector<std::string>& paths,
                                                 const CorpusOptions& options) {
  std::string text;
  for (const std::string& path : paths) {
    auto contents = ReadWhole(path);
    if (!contents.ok()) return contents.status();
    text += *contents;
  }
  return FromText(std::move(text), options);
}

int64_t TextCorpus::size(Split split) const {
  return split == Split::kTrain ? train_size_
                                : static_cast<int64_t>(ids_.size()) - train_size_;
}

std::vector<int64_t> TextCorpus::Encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text)
    if (id_of_byte_[c] >= 0) ids.push_back(id_of_byte_[c]);
  return ids;
}

std::string TextCorpus::Decode(const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int64_t id : ids)
    text.push_back(
        id >= 0 && id < static_cast<int64_t>(byte_of_id_.size()) ? byte_of_id_[id] : '?');
  return text;
}

TokenWindows TextCorpus::Windows(Split split, uint64_t seed, int64_t step, int64_t batch,
                                 int64_t seq) const {
  const int64_t begin = split == Split::kTrain ? 0 : train_size_;
  const int64_t starts =
      size(split) - seq;  // offsets 0..starts-1 leave room for the target
  uint64_t state = seed * 0x100000001B3ull ^ static_cast<uint64_t>(step) * 2 ^
                   (split == Split::kTrain ? 0 : 1);
  TokenWindows w;
  w.batch = batch;
  w.seq = seq;
  w.tokens.reserve(static_cast<size_t>(batch * seq));
  w.targets.reserve(static_cast<size_t>(batch * seq));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t offset =
        begin + static_cast<int64_t>(SplitMix64(state) % static_cast<uint64_t>(starts));
    w.tokens.insert(w.tokens.end(), ids_.begin() + offset, ids_.begin() + offset + seq);
    w.targets.insert(w.targets.end(), ids_.begin() + offset + 1,
                     ids_.begin() + offset + seq + 1);
  }
  return w;
}

std::string StripCookieSeparators(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    const bool last = end == std::string_view::npos;
    if (last) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (line != "%") out.append(line);
    if (!last) out.push_back('\n');
    start = end + 1;
  }
  return out;
}

absl::StatusOr<std::string> ReadFortunes(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code error;
  fs::directory_iterator listing(dir, error);
  if (error)
    return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", error.message()));
  for (const auto& entry : listing) {
    const fs::path& path = entry.path();
    std::error_code ignored;  // an entry that vanished or cannot be read is skipped
    if (entry.is_symlink(ignored) || !entry.is_regular_file(ignored)) continue;
    if (path.extension() == ".dat" || path.extension() == ".u8") continue;
    paths.push_back(path.string());
  }
  if (paths.empty())
    return absl::NotFoundError(absl::StrCat(
        "no fortune files in ", dir, " (Debian's `fortunes` package installs them)"));
  std::sort(paths.begin(), paths.end());
  std::string text;
  for (const std::string& path : paths) {
    auto contents = ReadWhole(path);
    if (!contents.ok()) return contents.status();
    text += StripCookieSeparators(*contents);
  }
  return text;
}

}  // namespace meshrun::worker::parallel
