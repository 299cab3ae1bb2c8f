#include "worker_lib/training/checkpoint.h"

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace meshrun::worker::parallel {

namespace {

namespace fs = std::filesystem;

struct Entry {
  std::string name;
  std::vector<int64_t> global_shape;
  Box box;
  at::Tensor values;
};

std::vector<int64_t> ToVector(const c10::IValue& list) { return list.toIntVector(); }

absl::StatusOr<std::vector<Entry>> ReadShardFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof())
    return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  std::vector<Entry> entries;
  try {
    c10::IValue root = torch::pickle_load(bytes);
    for (const c10::IValue& item : root.toListRef()) {
      const auto& fields = item.toTupleRef().elements();
      if (fields.size() != 4) throw std::runtime_error("entry is not a 4-tuple");
      Entry entry{fields[0].toStringRef(), ToVector(fields[1]),
                  Box{ToVector(fields[2]), {}}, fields[3].toTensor()};
      entry.box.sizes = entry.values.sizes().vec();
      if (entry.box.offsets.size() != entry.global_shape.size() ||
          entry.box.sizes.size() != entry.global_shape.size())
        throw std::runtime_error("entry '" + entry.name + "' has inconsistent ranks");
      entries.push_back(std::move(entry));
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::DataLossError(
        absl::StrCat(path.string(),
                     " is not a meshrun shard file: ", what.substr(0, what.find('\n'))));
  }
  return entries;
}

// The slice of `t` (whose top-left is at `origin` in global coordinates)
// covering global box `region`.
at::Tensor SliceOf(at::Tensor t, const std::vector<int64_t>& origin, const Box& region) {
  for (size_t d = 0; d < region.sizes.size(); ++d)
    t = t.narrow(d, region.offsets[d] - origin[d], region.sizes[d]);
  return t;
}

}  // namespace

absl::Status SaveShards(const std::string& dir, const std::string& tag,
                        const std::vector<std::shared_ptr<Param>>& params) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error)
    return absl::UnavailableError(
        absl::StrCat("cannot create ", dir, ": ", error.message()));
  c10::impl::GenericList entries(c10::AnyType::get());
  for (const auto& param : params) {
    Box box = param->box();
    entries.push_back(c10::ivalue::Tuple::create(
        {param->name(), c10::IValue(param->global_shape()), c10::IValue(box.offsets),
         // On the CPU: a file written from CUDA tensors loads anywhere.
         param->LocalValues()
             .detach()
             .to(at::kCPU, /*non_blocking=*/false, /*copy=*/true)
             .contiguous()}));
  }
  std::vector<char> bytes = torch::pickle_save(c10::IValue(entries));
  return WriteFileAtomically(
      (fs::path(dir) / absl::StrCat("shard-", tag, ".pt")).string(),
      std::string_view(bytes.data(), bytes.size()));
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const fs::path target(path);
  const fs::path partial =
      target.parent_path() / absl::StrCat(".", target.filename().string(), ".partial");
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.good())
      return absl::UnavailableError(absl::StrCat("cannot write ", partial.string()));
  }
  std::error_code error;
  fs::rename(partial, target, error);
  if (error)
    return absl::UnavailableError(
        absl::StrCat("cannot rename to ", path, ": ", error.message()));
  return absl::OkStatus();
}

absl::Status LoadShards(const std::string& dir,
                        const std::vector<std::shared_ptr<Param>>& params) {
  std::error_code error;
  fs::directory_iterator listing(dir, error);
  if (error)
    return absl::NotFoundError(
        absl::StrCat("no checkpoint at ", dir, ": ", error.message()));
  std::multimap<std::string, Entry> by_name;
  for (const auto& file : listing) {
    const std::string name = file.path().filename().string();
    if (name.rfind("shard-", 0) != 0 || file.path().extension() != ".pt") continue;
    auto entries = ReadShardFile(file.path());
    if (!entries.ok()) return entries.status();
    for (Entry& entry : *entries) by_name.emplace(entry.name, std::move(entry));
  }
  if (by_name.empty())
    return absl::NotFoundError(absl::StrCat("no shard files in ", dir));

  // Everything is assembled first and copied in only when every param is
  // covered, so a failed load leaves the model as it was.
  std::vector<at::Tensor> assembled;
  for (const auto& param : params) {
    const Box mine = param->box();
    at::Tensor values = at::zeros(mine.sizes, param->data().options());
    at::Tensor covered = at::zeros(mine.sizes, at::kBool);
    auto [begin, end] = by_name.equal_range(param->name());
    if (begin == end)
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", dir, " has no '", param->name(), "'"));
    for (auto it = begin; it != end; ++it) {
      const Entry& entry = it->second;
      if (entry.global_shape != param->global_shape()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "'", param->name(), "' is [", absl::StrJoin(entry.global_shape, ", "),
            "] in the checkpoint but [", absl::StrJoin(param->global_shape(), ", "),
            "] in the model"));
      }
      const Box overlap = Intersect(mine, entry.box);
      if (overlap.empty()) continue;
      SliceOf(values, mine.offsets, overlap)
          .copy_(SliceOf(entry.values, entry.box.offsets, overlap));
      SliceOf(covered, mine.offsets, overlap).fill_(true);
    }
    if (!covered.all().item<bool>()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", dir, " does not cover all of '", param->name(),
                       "' (", covered.logical_not().sum().item<int64_t>(), " of ",
                       mine.numel(), " local elements missing)"));
    }
    assembled.push_back(values);
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i]->LocalValues().copy_(assembled[i]);
  return absl::OkStatus();
}

}  // namespace meshrun::worker::parallel
