#include "rendezvous/core/kv_store.h"

#include <algorithm>
#include <limits>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace meshrun::rdzv {
namespace {

// A timeout message stays one readable line even for a 100,000-key wait.
constexpr size_t kMaxKeysInMessage = 10;

// Keys are arbitrary bytes; messages end up on a terminal.
std::string Quote(const std::string& key) {
  return absl::StrCat("'", absl::CHexEscape(key), "'");
}

BlockingResult Done(absl::Status status, std::vector<std::string> values = {}) {
  return BlockingResult{true, std::move(status), std::move(values)};
}

// c10d's servers read a counter with std::stoll: leading blanks, a sign, then
// decimal digits; whatever follows is ignored. Without a digit, or out of
// int64's range, it is not a counter.
bool ParseCounter(std::string_view text, int64_t* out) {
  size_t i = 0;
  while (i < text.size() && (text[i] == ' ' || (text[i] >= '\t' && text[i] <= '\r'))) ++i;
  size_t end = i;
  if (end < text.size() && (text[end] == '+' || text[end] == '-')) ++end;
  const size_t digits_start = end;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  if (end == digits_start) return false;
  std::string_view number = text.substr(i, end - i);
  if (number[0] == '+') number.remove_prefix(1);
  return absl::SimpleAtoi(absl::string_view(number.data(), number.size()), out);
}

}  // namespace

KvStore::KvStore(StoreLimits limits) : limits_(limits) {
  limits_.max_reply_bytes = std::max(limits_.max_reply_bytes, limits_.max_value_bytes);
}

absl::Status KvStore::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("key must not be empty");
  if (key.size() > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("key of ", key.size(),
                                                   " bytes exceeds the limit of ",
                                                   limits_.max_key_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::CheckValueSize(size_t value_bytes) const {
  if (value_bytes > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("value of ", value_bytes,
                                                     " bytes exceeds the limit of ",
                                                     limits_.max_value_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::CheckRequestSize(size_t num_keys) const {
  if (num_keys > limits_.max_keys_per_request) {
    return absl::InvalidArgumentError(absl::StrCat("request names ", num_keys,
                                                   " keys, more than the limit of ",
                                                   limits_.max_keys_per_request));
  }
  return absl::OkStatus();
}

absl::Status KvStore::CheckNewNamespace(const Namespace* space) const {
  if (space == nullptr && namespaces_.size() >= limits_.max_namespaces) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "store already holds the limit of ", limits_.max_namespaces, " namespaces"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::CheckCapacity(const std::string& ns, const Namespace* space,
                                    size_t added_keys, size_t bytes_after) const {
  if (added_keys > 0) {
    if (absl::Status status = CheckNewNamespace(space); !status.ok()) return status;
  }
  const size_t keys_after =
      (space == nullptr ? 0 : space->data.size() + space->queue_items) + added_keys;
  if (keys_after > limits_.max_keys_per_namespace) {
    return absl::ResourceExhaustedError(
        absl::StrCat("namespace ", Quote(ns), " would hold ", keys_after,
                     " keys, more than the limit of ", limits_.max_keys_per_namespace));
  }
  if (bytes_after > limits_.max_bytes_per_namespace) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "namespace ", Quote(ns), " would hold ", bytes_after,
        " bytes, more than the limit of ", limits_.max_bytes_per_namespace, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::CheckWrite(const std::string& ns, const std::string& key,
                                 size_t value_bytes) const {
  if (absl::Status status = CheckKey(key); !status.ok()) return status;
  if (absl::Status status = CheckValueSize(value_bytes); !status.ok()) return status;
  const Namespace* space = FindNamespace(ns);
  size_t bytes = space == nullptr ? 0 : space->bytes;
  size_t added_keys = 1;
  if (space != nullptr) {
    if (auto it = space->data.find(key); it != space->data.end()) {
      bytes -= key.size() + it->second.size();
      added_keys = 0;
    }
  }
  return CheckCapacity(ns, space, added_keys, bytes + key.size() + value_bytes);
}

const KvStore::Namespace* KvStore::FindNamespace(const std::string& ns) const {
  auto it = namespaces_.find(ns);
  return it == namespaces_.end() ? nullptr : &it->second;
}

void KvStore::Put(const std::string& ns, const std::string& key, std::string value,
                  std::vector<WaiterId>* ready) {
  Namespace& space = namespaces_[ns];
  auto [it, created] = space.data.try_emplace(key);
  if (!created) space.bytes -= key.size() + it->second.size();
  space.bytes += key.size() + value.size();
  it->second = std::move(value);
  if (!space.barriers.empty()) ReleaseBarriers(space, key, ready);
  if (!created) return;

  // Waits and gets alike: a value satisfies both. In id order.
  std::vector<WaiterId> ids;
  for (auto* waiting_on : {&space.waiting_on, &space.getting_on}) {
    auto waiting = waiting_on->find(key);
    if (waiting == waiting_on->end()) continue;
    ids.insert(ids.end(), waiting->second.begin(), waiting->second.end());
    waiting_on->erase(waiting);
  }
  std::sort(ids.begin(), ids.end());
  for (WaiterId id : ids) {
    Waiter& waiter = waiters_.find(id)->second;
    if (--waiter.missing == 0) ready->push_back(id);
  }
}

bool KvStore::Present(const Namespace& space, const std::string& key, bool wants_values) {
  return space.data.count(key) != 0 || (!wants_values && space.queues.count(key) != 0);
}

void KvStore::ReleaseBarriers(Namespace& space, const std::string& key,
                              std::vector<WaiterId>* ready) {
  auto barrier = space.barriers.find(key);
  if (barrier == space.barriers.end()) return;
  int64_t count = 0;
  if (!ParseCounter(space.data.find(key)->second, &count)) return;
  for (auto id = barrier->second.begin(); id != barrier->second.end();) {
    if (waiters_.find(*id)->second.barrier_size <= count) {
      ready->push_back(*id);
      id = barrier->second.erase(id);
    } else {
      ++id;
    }
  }
  if (barrier->second.empty()) space.barriers.erase(barrier);
}

void KvStore::Deliver(const std::vector<WaiterId>& ready, std::vector<Wakeup>* woken) {
  for (WaiterId id : ready) {
    auto it = waiters_.find(id);
    Waiter& waiter = it->second;
    // The namespace exists: it holds the key whose write made this waiter
    // ready, and nothing deletes between that write and this call.
    Namespace& space = namespaces_.find(waiter.ns)->second;
    if (waiter.barrier_size == 0) {
      waiter.missing = Park(space, id, waiter.keys, waiter.wants_values);
      if (waiter.missing > 0) continue;
    }
    Wakeup wake{id, absl::OkStatus(), {}};
    if (waiter.wants_values) {
      size_t bytes = 0;
      for (const std::string& key : waiter.keys)
        bytes += space.data.find(key)->second.size();
      if (bytes > limits_.max_reply_bytes) {
        wake.status = absl::ResourceExhaustedError(
            absl::StrCat("reply of ", bytes, " bytes exceeds the limit of ",
                         limits_.max_reply_bytes, " bytes"));
      } else if (bytes <= woken_value_budget_) {
        woken_value_budget_ -= bytes;
        wake.values = *ValuesOf(&space, waiter.keys);
      } else {
        wake.reread = true;
      }
    }
    deadlines_.erase(waiter.deadline);
    --space.num_waiters;
    waiters_.erase(it);
    woken->push_back(std::move(wake));
  }
}

size_t KvStore::Park(Namespace& space, WaiterId waiter,
                     const std::vector<std::string>& keys, bool wants_values) {
  size_t registered = 0;
  for (const std::string& key : keys) {
    if (Present(space, key, wants_values)) continue;
    // A key named twice in one request is waited for once.
    auto& waiting_on = wants_values ? space.getting_on : space.waiting_on;
    if (waiting_on[key].insert(waiter).second) ++registered;
  }
  return registered;
}

absl::StatusOr<std::vector<std::string>> KvStore::ValuesOf(
    const Namespace* space, const std::vector<std::string>& keys) const {
  std::vector<const std::string*> found(keys.size(), nullptr);
  size_t bytes = 0;
  if (space != nullptr) {
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = space->data.find(keys[i]);
      if (it == space->data.end()) continue;
      found[i] = &it->second;
      bytes += it->second.size();
    }
  }
  if (bytes > limits_.max_reply_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("reply of ", bytes,
                                                     " bytes exceeds the limit of ",
                                                     limits_.max_reply_bytes, " bytes"));
  }
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string* value : found) values.push_back(value ? *value : std::string());
  return values;
}

absl::Status KvStore::CheckWaiterRoom(const std::string& ns,
                                      const Namespace* space) const {
  if (waiters_.size() >= limits_.max_waiters) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "store already holds the limit of ", limits_.max_waiters, " blocked requests"));
  }
  if (space != nullptr && space->num_waiters >= limits_.max_waiters_per_namespace) {
    return absl::ResourceExhaustedError(
        absl::StrCat("namespace ", Quote(ns), " already holds the limit of ",
                     limits_.max_waiters_per_namespace, " blocked requests"));
  }
  return absl::OkStatus();
}

size_t KvStore::num_waiters(const std::string& ns) const {
  const Namespace* space = FindNamespace(ns);
  return space == nullptr ? 0 : space->num_waiters;
}

std::string KvStore::MissingKeysMessage(const Waiter& waiter) const {
  const Namespace* space = FindNamespace(waiter.ns);
  if (waiter.barrier_size > 0) {
    std::optional<std::string> count = Peek(waiter.ns, waiter.keys[0]);
    return absl::StrCat("timed out at barrier ", Quote(waiter.keys[0]), ": ",
                        count.value_or("0"), " of ", waiter.barrier_size, " arrived");
  }
  std::unordered_set<std::string_view> seen;
  std::vector<std::string> shown;
  size_t missing = 0;
  for (const std::string& key : waiter.keys) {
    if (space != nullptr && Present(*space, key, waiter.wants_values)) continue;
    if (!seen.insert(key).second) continue;
    if (++missing <= kMaxKeysInMessage) shown.push_back(Quote(key));
  }
  std::string message =
      absl::StrCat("timed out waiting for keys: ", absl::StrJoin(shown, ", "));
  if (missing > shown.size())
    absl::StrAppend(&message, " and ", missing - shown.size(), " more");
  return message;
}

void KvStore::RemoveWaiter(WaiterId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  auto space = namespaces_.find(it->second.ns);
  if (space != namespaces_.end()) {
    auto& waiting_on = it->second.barrier_size > 0 ? space->second.barriers
                       : it->second.wants_values   ? space->second.getting_on
                                                   : space->second.waiting_on;
    for (const std::string& key : it->second.keys) {
      auto waiting = waiting_on.find(key);
      if (waiting == waiting_on.end()) continue;
      waiting->second.erase(id);
      if (waiting->second.empty()) waiting_on.erase(waiting);
    }
    --space->second.num_waiters;
  }
  deadlines_.erase(it->second.deadline);
  waiters_.erase(it);
  if (space != namespaces_.end()) EraseIfEmpty(space);
}

void KvStore::EraseIfEmpty(std::unordered_map<std::string, Namespace>::iterator it) {
  const Namespace& space = it->second;
  if (space.data.empty() && space.waiting_on.empty() && space.getting_on.empty() &&
      space.queues.empty() && space.barriers.empty()) {
    namespaces_.erase(it);
  }
}

absl::Status KvStore::Set(const std::string& ns, const std::string& key,
                          std::string value, std::vector<Wakeup>* woken) {
  if (absl::Status status = CheckWrite(ns, key, value.size()); !status.ok())
    return status;
  std::vector<WaiterId> ready;
  Put(ns, key, std::move(value), &ready);
  Deliver(ready, woken);
  return absl::OkStatus();
}

absl::Status KvStore::MultiSet(
    const std::string& ns,
    const std::vector<std::pair<std::string, std::string>>& entries,
    std::vector<Wakeup>* woken) {
  if (absl::Status status = CheckRequestSize(entries.size()); !status.ok()) return status;
  for (const auto& [key, value] : entries) {
    if (absl::Status status = CheckKey(key); !status.ok()) return status;
    if (absl::Status status = CheckValueSize(value.size()); !status.ok()) return status;
  }
  // All-or-nothing: the namespace must fit the batch as a whole, where a key
  // written twice counts once, with its last value.
  const Namespace* space = FindNamespace(ns);
  size_t bytes = space == nullptr ? 0 : space->bytes;
  size_t added_keys = 0;
  std::unordered_set<std::string_view> seen;
  for (auto entry = entries.rbegin(); entry != entries.rend(); ++entry) {
    const auto& [key, value] = *entry;
    if (!seen.insert(key).second) continue;
    const std::string* old = nullptr;
    if (space != nullptr) {
      if (auto it = space->data.find(key); it != space->data.end()) old = &it->second;
    }
    if (old == nullptr) {
      ++added_keys;
    } else {
      bytes -= key.size() + old->size();
    }
    bytes += key.size() + value.size();
  }
  if (absl::Status status = CheckCapacity(ns, space, added_keys, bytes); !status.ok()) {
    return status;
  }

  std::vector<WaiterId> ready;
  for (const auto& [key, value] : entries) Put(ns, key, value, &ready);
  Deliver(ready, woken);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& ns, const std::string& key,
                                     int64_t delta, std::vector<Wakeup>* woken) {
  if (absl::Status status = CheckKey(key); !status.ok()) return status;
  int64_t current = 0;
  if (const Namespace* space = FindNamespace(ns); space != nullptr) {
    if (auto it = space->data.find(key); it != space->data.end()) {
      if (!ParseCounter(it->second, &current)) {
        return absl::InvalidArgumentError(
            absl::StrCat("key ", Quote(key), " holds a value that is not an integer"));
      }
    }
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  if ((delta > 0 && current > kMax - delta) || (delta < 0 && current < kMin - delta)) {
    return absl::OutOfRangeError(absl::StrCat("adding ", delta, " to key ", Quote(key),
                                              " (", current, ") overflows int64"));
  }
  const int64_t sum = current + delta;
  std::string value = absl::StrCat(sum);
  if (absl::Status status = CheckWrite(ns, key, value.size()); !status.ok())
    return status;
  std::vector<WaiterId> ready;
  Put(ns, key, std::move(value), &ready);
  Deliver(ready, woken);
  return sum;
}

absl::StatusOr<std::string> KvStore::CompareSet(const std::string& ns,
                                                const std::string& key,
                                                const std::string& expected,
                                                std::string desired,
                                                std::vector<Wakeup>* woken) {
  // Checked even when nothing is stored, so that whether an oversized value
  // is refused does not depend on the race the caller lost.
  if (absl::Status status = CheckKey(key); !status.ok()) return status;
  if (absl::Status status = CheckValueSize(desired.size()); !status.ok()) return status;
  const Namespace* space = FindNamespace(ns);
  const std::string* current = nullptr;
  if (space != nullptr) {
    if (auto it = space->data.find(key); it != space->data.end()) current = &it->second;
  }
  if (current == nullptr && !expected.empty()) return expected;
  if (current != nullptr && *current != expected) return *current;

  if (absl::Status status = CheckWrite(ns, key, desired.size()); !status.ok())
    return status;
  std::string result = desired;
  std::vector<WaiterId> ready;
  Put(ns, key, std::move(desired), &ready);
  Deliver(ready, woken);
  return result;
}

absl::Status KvStore::Append(const std::string& ns, const std::string& key,
                             const std::string& value, std::vector<Wakeup>* woken) {
  if (absl::Status status = CheckKey(key); !status.ok()) return status;
  auto space = namespaces_.find(ns);
  if (space != namespaces_.end()) {
    auto it = space->second.data.find(key);
    if (it != space->second.data.end()) {
      // In place: the existing value may be tens of megabytes.
      const size_t size = it->second.size() + value.size();
      if (absl::Status status = CheckValueSize(size); !status.ok()) return status;
      if (absl::Status status =
              CheckCapacity(ns, &space->second, 0, space->second.bytes + value.size());
          !status.ok()) {
        return status;
      }
      it->second.append(value);
      space->second.bytes += value.size();
      return absl::OkStatus();
    }
  }
  return Set(ns, key, value, woken);
}

bool KvStore::Delete(const std::string& ns, const std::string& key) {
  auto space = namespaces_.find(ns);
  if (space == namespaces_.end()) return false;
  auto it = space->second.data.find(key);
  if (it == space->second.data.end()) return false;
  space->second.bytes -= key.size() + it->second.size();
  space->second.data.erase(it);
  EraseIfEmpty(space);
  return true;
}

int64_t KvStore::NumKeys(const std::string& ns) const {
  const Namespace* space = FindNamespace(ns);
  return space == nullptr ? 0 : static_cast<int64_t>(space->data.size());
}

absl::StatusOr<bool> KvStore::Check(const std::string& ns,
                                    const std::vector<std::string>& keys) const {
  if (absl::Status status = CheckRequestSize(keys.size()); !status.ok()) return status;
  for (const std::string& key : keys) {
    if (absl::Status status = CheckKey(key); !status.ok()) return status;
  }
  const Namespace* space = FindNamespace(ns);
  for (const std::string& key : keys) {
    if (space == nullptr || !Present(*space, key, /*wants_values=*/false)) return false;
  }
  return true;
}

absl::StatusOr<std::vector<std::string>> KvStore::ListKeys(const std::string& ns) const {
  std::vector<std::string> keys;
  if (const Namespace* space = FindNamespace(ns)) {
    // Each key with its length, as both wires carry it: a reply within the
    // budget also fits a gRPC message.
    size_t bytes = 0;
    for (const auto& [key, value] : space->data) bytes += key.size() + sizeof(uint64_t);
    if (bytes > limits_.max_reply_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "list of ", space->data.size(), " keys (", bytes,
          " bytes) exceeds the reply limit of ", limits_.max_reply_bytes, " bytes"));
    }
    keys.reserve(space->data.size());
    for (const auto& [key, value] : space->data) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

absl::StatusOr<std::vector<std::string>> KvStore::PeekMany(
    const std::string& ns, const std::vector<std::string>& keys) const {
  if (absl::Status status = CheckRequestSize(keys.size()); !status.ok()) return status;
  return ValuesOf(FindNamespace(ns), keys);
}

absl::Status KvStore::QueuePush(const std::string& ns, const std::string& key,
                                std::string value, std::vector<Wakeup>* woken) {
  if (absl::Status status = CheckKey(key); !status.ok()) return status;
  if (absl::Status status = CheckValueSize(value.size()); !status.ok()) return status;
  const Namespace* existing = FindNamespace(ns);
  const size_t bytes = (existing == nullptr ? 0 : existing->bytes) + key.size() +
                       value.size() + kQueueItemOverheadBytes;
  if (absl::Status status = CheckCapacity(ns, existing, 1, bytes); !status.ok())
    return status;
  Namespace& space = namespaces_[ns];
  space.bytes = bytes;
  space.queues[key].push_back(std::move(value));
  ++space.queue_items;
  // Waits only (a get waits for a value). One item, one popper: the
  // longest-waiting wait (lowest id) that this item completes is woken, and
  // the waits after it stay parked for the next item (the woken one will
  // most likely pop this one). A multi-key wait before it, still short of
  // another key, stops waiting on this one; if the queue is empty again when
  // its last key comes, Deliver parks it here again. Each wait is looked at
  // once, so a push costs O(log n) amortized, however many are parked.
  std::vector<WaiterId> ready;
  if (auto waiting = space.waiting_on.find(key); waiting != space.waiting_on.end()) {
    std::set<WaiterId>& ids = waiting->second;
    for (auto id = ids.begin(); id != ids.end();) {
      Waiter& waiter = waiters_.find(*id)->second;
      const bool completes = --waiter.missing == 0;
      if (completes) ready.push_back(*id);
      id = ids.erase(id);
      if (completes) break;
    }
    if (ids.empty()) space.waiting_on.erase(waiting);
  }
  Deliver(ready, woken);
  return absl::OkStatus();
}

absl::StatusOr<KvStore::Popped> KvStore::QueuePop(const std::string& ns,
                                                  const std::string& key) {
  if (absl::Status status = CheckKey(key); !status.ok()) return status;
  Popped popped;
  auto space = namespaces_.find(ns);
  if (space == namespaces_.end()) return popped;
  auto queue = space->second.queues.find(key);
  if (queue == space->second.queues.end()) return popped;
  popped.length_before = static_cast<int64_t>(queue->second.size());
  popped.value = std::move(queue->second.front());
  queue->second.pop_front();
  space->second.bytes -= key.size() + popped.value.size() + kQueueItemOverheadBytes;
  --space->second.queue_items;
  if (queue->second.empty()) {
    space->second.queues.erase(queue);
    EraseIfEmpty(space);
  }
  return popped;
}

int64_t KvStore::QueueLength(const std::string& ns, const std::string& key) const {
  const Namespace* space = FindNamespace(ns);
  if (space == nullptr) return 0;
  auto queue = space->queues.find(key);
  return queue == space->queues.end() ? 0 : static_cast<int64_t>(queue->second.size());
}

BlockingResult KvStore::Get(const std::string& ns, const std::string& key,
                            WaiterId waiter, TimePoint deadline) {
  return Block(ns, {key}, /*wants_values=*/true, waiter, deadline);
}

BlockingResult KvStore::MultiGet(const std::string& ns,
                                 const std::vector<std::string>& keys, WaiterId waiter,
                                 TimePoint deadline) {
  return Block(ns, keys, /*wants_values=*/true, waiter, deadline);
}

BlockingResult KvStore::Wait(const std::string& ns, const std::vector<std::string>& keys,
                             WaiterId waiter, TimePoint deadline) {
  return Block(ns, keys, /*wants_values=*/false, waiter, deadline);
}

BlockingResult KvStore::Block(const std::string& ns, const std::vector<std::string>& keys,
                              bool wants_values, WaiterId waiter, TimePoint deadline) {
  if (absl::Status status = CheckRequestSize(keys.size()); !status.ok()) {
    return Done(std::move(status));
  }
  for (const std::string& key : keys) {
    if (absl::Status status = CheckKey(key); !status.ok()) return Done(std::move(status));
  }
  // Refused even when the answer is ready: a reused id means the adapter
  // would misroute a later Wakeup.
  if (waiters_.count(waiter) != 0) {
    return Done(absl::InvalidArgumentError(
        absl::StrCat("waiter id ", waiter, " is already in use")));
  }

  const Namespace* space = FindNamespace(ns);
  bool all_present = true;
  for (const std::string& key : keys) {
    if (space == nullptr || !Present(*space, key, wants_values)) {
      all_present = false;
      break;
    }
  }
  if (all_present) {
    if (!wants_values || keys.empty()) return Done(absl::OkStatus());
    absl::StatusOr<std::vector<std::string>> values = ValuesOf(space, keys);
    if (!values.ok()) return Done(values.status());
    return Done(absl::OkStatus(), *std::move(values));
  }

  if (absl::Status status = CheckWaiterRoom(ns, space); !status.ok()) {
    return Done(std::move(status));
  }
  if (absl::Status status = CheckNewNamespace(space); !status.ok()) {
    return Done(std::move(status));
  }
  Waiter& parked = waiters_[waiter];
  parked.ns = ns;
  parked.keys = keys;
  parked.wants_values = wants_values;
  parked.deadline = deadlines_.emplace(deadline, waiter);
  Namespace& parked_in = namespaces_[ns];
  ++parked_in.num_waiters;
  parked.missing = Park(parked_in, waiter, keys, wants_values);
  return BlockingResult{};
}

BlockingResult KvStore::Barrier(const std::string& ns, const std::string& key,
                                int64_t world_size, WaiterId waiter, TimePoint deadline,
                                std::vector<Wakeup>* woken) {
  if (waiters_.count(waiter) != 0) {
    return Done(absl::InvalidArgumentError(
        absl::StrCat("waiter id ", waiter, " is already in use")));
  }
  // Refused before arriving, so a refused arrival is not counted.
  if (absl::Status status = CheckWaiterRoom(ns, FindNamespace(ns)); !status.ok()) {
    return Done(std::move(status));
  }
  absl::StatusOr<int64_t> arrived = Add(ns, key, 1, woken);
  if (!arrived.ok()) return Done(arrived.status());
  if (*arrived >= world_size) return Done(absl::OkStatus());
  Waiter& parked = waiters_[waiter];
  parked.ns = ns;
  parked.keys = {key};
  parked.barrier_size = world_size;
  parked.missing = 1;
  parked.deadline = deadlines_.emplace(deadline, waiter);
  Namespace& space = namespaces_[ns];
  ++space.num_waiters;
  space.barriers[key].insert(waiter);
  return BlockingResult{};
}

void KvStore::ExpireWaiters(TimePoint now, std::vector<Wakeup>* woken) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const WaiterId id = deadlines_.begin()->second;
    woken->push_back(
        Wakeup{id,
               absl::DeadlineExceededError(MissingKeysMessage(waiters_.find(id)->second)),
               {}});
    RemoveWaiter(id);
  }
}

void KvStore::CancelWaiter(WaiterId waiter) { RemoveWaiter(waiter); }

std::optional<TimePoint> KvStore::NextDeadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

namespace {

// "<digits><then>" at the front of `text`: consumes both.
bool ConsumeNumber(std::string_view& text, std::string_view then) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || text.substr(digits, then.size()) != then) return false;
  text.remove_prefix(digits + then.size());
  return true;
}

}  // namespace

std::vector<std::string> KvStore::NamespacesOfRun(const std::string& run_id) const {
  const std::string prefix = run_id + "/";
  auto of_run = [&](const std::string& name) {
    if (name.compare(0, prefix.size(), prefix) != 0) return false;
    std::string_view rest = std::string_view(name).substr(prefix.size());
    // "e<epoch>.r<round>", or "r<round>" as before epochs.
    if (!rest.empty() && rest[0] == 'e') {
      rest.remove_prefix(1);
      if (!ConsumeNumber(rest, ".")) return false;
    }
    if (rest.empty() || rest[0] != 'r') return false;
    rest.remove_prefix(1);
    return ConsumeNumber(rest, "") && rest.empty();
  };
  std::vector<std::string> names;
  for (const auto& [name, space] : namespaces_)
    if (of_run(name)) names.push_back(name);
  // A namespace whose keys are all gone may still remember answers.
  for (const auto& [name, memory] : remembered_)
    if (namespaces_.count(name) == 0 && of_run(name)) names.push_back(name);
  return names;
}

size_t KvStore::BytesOf(const std::string& id, const StoredAnswer& answer) {
  // Each entry's map node, deque slot and strings, roughly.
  size_t bytes = 2 * id.size() + answer.error.size() + 128;
  for (const std::string& value : answer.values) bytes += value.size() + 32;
  return bytes;
}

bool KvStore::Remember(const std::string& ns, const std::string& id,
                       StoredAnswer answer) {
  auto found = remembered_.find(ns);
  if (found == remembered_.end()) {
    if (remembered_.size() >= limits_.max_namespaces) return false;
    found = remembered_.emplace(ns, Memory{}).first;
  }
  Memory& memory = found->second;
  const size_t bytes = BytesOf(id, answer);
  auto [it, inserted] = memory.answers.try_emplace(id);
  if (!inserted) {
    memory.bytes -= BytesOf(id, it->second.answer);
  } else {
    it->second.seq = memory.next_seq++;
    memory.order.emplace(it->second.seq, id);
  }
  it->second.answer = std::move(answer);
  memory.bytes += bytes;
  return true;
}

bool KvStore::CanRemember(const std::string& ns) const {
  auto found = remembered_.find(ns);
  if (found == remembered_.end()) return remembered_.size() < limits_.max_namespaces;
  return found->second.answers.size() < limits_.max_remembered_per_namespace &&
         found->second.bytes < limits_.max_remembered_bytes_per_namespace;
}

void KvStore::Forget(const std::string& ns, const std::string& id) {
  auto found = remembered_.find(ns);
  if (found == remembered_.end()) return;
  Memory& memory = found->second;
  auto it = memory.answers.find(id);
  if (it == memory.answers.end()) return;
  memory.bytes -= BytesOf(id, it->second.answer);
  memory.order.erase(it->second.seq);
  memory.answers.erase(it);
  if (memory.answers.empty()) remembered_.erase(found);
}

std::optional<StoredAnswer> KvStore::Recall(const std::string& ns,
                                            const std::string& id) const {
  auto found = remembered_.find(ns);
  if (found == remembered_.end()) return std::nullopt;
  auto it = found->second.answers.find(id);
  if (it == found->second.answers.end()) return std::nullopt;
  return it->second.answer;
}

size_t KvStore::num_remembered(const std::string& ns) const {
  auto found = remembered_.find(ns);
  return found == remembered_.end() ? 0 : found->second.answers.size();
}

size_t KvStore::remembered_bytes(const std::string& ns) const {
  auto found = remembered_.find(ns);
  return found == remembered_.end() ? 0 : found->second.bytes;
}

void KvStore::ForEachRemembered(
    const std::function<void(const std::string&, const std::string&,
                             const StoredAnswer&)>& visit) const {
  for (const auto& [ns, memory] : remembered_)
    for (const auto& [seq, id] : memory.order)
      visit(ns, id, memory.answers.at(id).answer);
}

void KvStore::DropNamespace(const std::string& ns, std::vector<Wakeup>* woken) {
  remembered_.erase(ns);
  auto space = namespaces_.find(ns);
  if (space == namespaces_.end()) return;
  // Every parked waiter is registered under at least one key.
  std::set<WaiterId> parked;
  for (const auto& [key, ids] : space->second.waiting_on)
    parked.insert(ids.begin(), ids.end());
  for (const auto& [key, ids] : space->second.getting_on)
    parked.insert(ids.begin(), ids.end());
  for (const auto& [key, ids] : space->second.barriers)
    parked.insert(ids.begin(), ids.end());
  for (WaiterId id : parked) {
    auto it = waiters_.find(id);
    deadlines_.erase(it->second.deadline);
    waiters_.erase(it);
    woken->push_back(
        Wakeup{id,
               absl::AbortedError(absl::StrCat("namespace ", Quote(ns), " was dropped")),
               {}});
  }
  namespaces_.erase(space);
}

std::optional<std::string> KvStore::Peek(const std::string& ns,
                                         const std::string& key) const {
  const Namespace* space = FindNamespace(ns);
  if (space == nullptr) return std::nullopt;
  auto it = space->data.find(key);
  if (it == space->data.end()) return std::nullopt;
  return it->second;
}

void KvStore::ForEachEntry(
    const std::function<void(const std::string&, const std::string&, const std::string&)>&
        visit) const {
  for (const auto& [ns, space] : namespaces_) {
    for (const auto& [key, value] : space.data) visit(ns, key, value);
  }
}

void KvStore::RestoreSet(const std::string& ns, const std::string& key,
                         std::string value) {
  std::vector<WaiterId> ready;
  Put(ns, key, std::move(value), &ready);
  std::vector<Wakeup> woken;
  Deliver(ready, &woken);
}

void KvStore::RestoreAppend(const std::string& ns, const std::string& key,
                            const std::string& value) {
  auto space = namespaces_.find(ns);
  if (space != namespaces_.end()) {
    auto it = space->second.data.find(key);
    if (it != space->second.data.end()) {
      it->second.append(value);
      space->second.bytes += value.size();
      return;
    }
  }
  RestoreSet(ns, key, value);
}

void KvStore::ForEachQueueItem(
    const std::function<void(const std::string&, const std::string&, const std::string&)>&
        visit) const {
  for (const auto& [ns, space] : namespaces_) {
    for (const auto& [key, items] : space.queues)
      for (const std::string& item : items) visit(ns, key, item);
  }
}

void KvStore::RestoreQueuePush(const std::string& ns, const std::string& key,
                               std::string value) {
  Namespace& space = namespaces_[ns];
  space.bytes += key.size() + value.size() + kQueueItemOverheadBytes;
  space.queues[key].push_back(std::move(value));
  ++space.queue_items;
}

void KvStore::RestoreQueuePop(const std::string& ns, const std::string& key) {
  (void)QueuePop(ns, key);
}

size_t KvStore::num_entries() const {
  size_t n = 0;
  for (const auto& [ns, space] : namespaces_) n += space.data.size();
  return n;
}

}  // namespace meshrun::rdzv
