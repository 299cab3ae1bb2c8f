#include "worker_lib/data/batch_file.h"

#include <torch/serialize.h>

#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace meshrun::worker::parallel {

absl::StatusOr<std::vector<InputTarget>> ReadBatchFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open batch file ", path));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  std::vector<InputTarget> batches;
  try {
    c10::IValue root = torch::pickle_load(bytes);
    if (!root.isList()) throw std::runtime_error("not a list");
    for (const c10::IValue& item : root.toListRef()) {
      if (!item.isTuple()) throw std::runtime_error("an entry is not a tuple");
      const auto& fields = item.toTupleRef().elements();
      if (fields.size() != 2 || !fields[0].isTensor() || !fields[1].isTensor())
        throw std::runtime_error("an entry is not an (input, target) pair of tensors");
      at::Tensor input = fields[0].toTensor();
      at::Tensor target = fields[1].toTensor();
      if (input.dim() == 0 || target.dim() == 0 || input.size(0) != target.size(0))
        throw std::runtime_error(
            absl::StrCat("batch ", batches.size(), ": input and target rows differ"));
      batches.emplace_back(input, target);
    }
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return absl::DataLossError(
        absl::StrCat(path, " is not a batch file: ", what.substr(0, what.find('\n'))));
  }
  return batches;
}

absl::Status WriteBatchFile(const std::string& path,
                            const std::vector<InputTarget>& batches) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const auto& [input, target] : batches)
    list.push_back(c10::ivalue::Tuple::create({input.contiguous(), target.contiguous()}));
  std::vector<char> bytes = torch::pickle_save(c10::IValue(list));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace meshrun::worker::parallel
