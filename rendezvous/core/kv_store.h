#pragma once

// The daemon's key-value store with c10d::Store semantics, as a pure class:
// no threads, no clock, no I/O. Blocking operations (get, wait, multi_get)
// register a waiter that a later mutation wakes or ExpireWaiters() times out;
// every call returns the waiters it woke, and the caller (the gRPC adapter)
// delivers them.
//
// Thread-safety: none; the owner serialises all calls.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace meshrun::rdzv {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// Defaults follow torch's libuv TCPStore server where it has a limit (keys of
// 8 KiB, 128 Ki keys a query); values are 64 MiB, as its classic server
// stores.
struct StoreLimits {
  size_t max_key_bytes = 8192;
  size_t max_value_bytes = 64 << 20;
  size_t max_keys_per_namespace = 1 << 20;
  // Sum of key and value bytes in one namespace.
  size_t max_bytes_per_namespace = size_t{1} << 30;
  size_t max_namespaces = 100000;
  size_t max_keys_per_request = 128 << 10;
  // Bytes of values (multi_get) or of keys and their 8-byte lengths
  // (list_keys) one reply may carry: a
  // reply is budgeted before it is built, and one over this is refused
  // (RESOURCE_EXHAUSTED). Never below max_value_bytes, so any one value can
  // be read.
  size_t max_reply_bytes = 64 << 20;
  // Blocked requests (get, wait, multi_get, barrier) parked in one namespace,
  // and in the whole store (the backstop): one run cannot use up every
  // other run's waits.
  size_t max_waiters_per_namespace = 1 << 18;
  size_t max_waiters = 1 << 20;
  // Answers remembered for repeats (KvStore::Remember), per namespace, kept
  // until their sender says it has them (Forget): none is ever forgotten
  // otherwise, since a repeat after that would be applied again. Past either
  // bound a request with a new dedup id is refused instead (CanRemember).
  // A relay forgets each answer with its next request, so a namespace holds
  // about its relays' requests in flight.
  size_t max_remembered_per_namespace = 65536;
  size_t max_remembered_bytes_per_namespace = 256 << 20;
};

// The answer to a request that carried a dedup id (StoreRequest.dedup_id),
// kept so that a repeat gets it without being applied again. `code` is a
// meshrun.v1.StoreCode; the rest are StoreResponse's fields.
struct StoredAnswer {
  int32_t code = 0;
  std::string error;
  int64_t number = 0;
  std::vector<std::string> values;
  bool flag = false;

  bool operator==(const StoredAnswer& other) const {
    return code == other.code && error == other.error && number == other.number &&
           values == other.values && flag == other.flag;
  }
};

// What a queue item costs beyond its key and value bytes (its node and
// string), counted against max_bytes_per_namespace; each item also counts as
// a key against max_keys_per_namespace.
inline constexpr size_t kQueueItemOverheadBytes = 64;

using WaiterId = uint64_t;

// A blocked request that became ready (or failed). `values` holds the keys'
// values in request order for get/multi_get, and is empty for wait.
struct Wakeup {
  WaiterId waiter = 0;
  absl::Status status;
  std::vector<std::string> values;
  // A get or multi_get woken after the woken-value budget ran out: OK with no
  // values; the caller reads them when it can deliver them (MultiGet with the
  // same waiter id answers at once, or parks it again if a key went away).
  bool reread = false;
};

// The result of a blocking operation: either done now (`ready`), or parked
// as waiter `waiter` until a Wakeup with that id is returned by a later call.
struct BlockingResult {
  bool ready = false;
  absl::Status status;
  std::vector<std::string> values;
};

class KvStore {
 public:
  explicit KvStore(StoreLimits limits = {});

  // Mutations. Each returns its result and appends woken waiters to `woken`.
  absl::Status Set(const std::string& ns, const std::string& key, std::string value,
                   std::vector<Wakeup>* woken);
  absl::Status MultiSet(const std::string& ns,
                        const std::vector<std::pair<std::string, std::string>>& entries,
                        std::vector<Wakeup>* woken);
  // Values are decimal integers read as c10d's servers read them (std::stoll:
  // leading blanks and a sign, digits, anything after them ignored, so
  // "12abc" is 12); a value with no leading integer is an error.
  absl::StatusOr<int64_t> Add(const std::string& ns, const std::string& key,
                              int64_t delta, std::vector<Wakeup>* woken);
  // c10d semantics: absent key and empty `expected` -> set to `desired`;
  // absent key otherwise -> returns `expected`; present and equal -> set,
  // returns `desired`; present and different -> returns the current value.
  absl::StatusOr<std::string> CompareSet(const std::string& ns, const std::string& key,
                                         const std::string& expected, std::string desired,
                                         std::vector<Wakeup>* woken);
  absl::Status Append(const std::string& ns, const std::string& key,
                      const std::string& value, std::vector<Wakeup>* woken);
  // True when the key existed.
  bool Delete(const std::string& ns, const std::string& key);

  // Queues (c10d's queue_push / queue_pop / queue_len), beside the keys: a
  // queue's name is not a key (NumKeys, ListKeys), but a wait or check on it
  // is satisfied while it holds an item, as with torch's libuv server (a
  // blocking queue_pop is a wait, then a pop). A get or multi_get reads
  // values only: it waits for a value, whatever queue has the name. A push
  // completes one waiter, not all, since one item serves one popper.
  absl::Status QueuePush(const std::string& ns, const std::string& key, std::string value,
                         std::vector<Wakeup>* woken);
  struct Popped {
    int64_t length_before = 0;  // 0: the queue was empty, nothing popped
    std::string value;
  };
  absl::StatusOr<Popped> QueuePop(const std::string& ns, const std::string& key);
  int64_t QueueLength(const std::string& ns, const std::string& key) const;

  // Non-blocking queries.
  int64_t NumKeys(const std::string& ns) const;
  // Sorted. RESOURCE_EXHAUSTED when the keys' bytes exceed max_reply_bytes.
  absl::StatusOr<std::vector<std::string>> ListKeys(const std::string& ns) const;
  // Non-blocking multi_get: "" for an absent key. RESOURCE_EXHAUSTED when the
  // values' bytes exceed max_reply_bytes.
  absl::StatusOr<std::vector<std::string>> PeekMany(
      const std::string& ns, const std::vector<std::string>& keys) const;
  absl::StatusOr<bool> Check(const std::string& ns,
                             const std::vector<std::string>& keys) const;

  // Blocking queries: answered now when every key exists, otherwise parked as
  // `waiter` (an id unique among live waiters, chosen by the caller) until
  // `deadline`. A timeout's status is DEADLINE_EXCEEDED and names the keys
  // still missing. A get or multi_get whose values exceed max_reply_bytes is
  // answered RESOURCE_EXHAUSTED (now, or when woken).
  BlockingResult Get(const std::string& ns, const std::string& key, WaiterId waiter,
                     TimePoint deadline);
  BlockingResult MultiGet(const std::string& ns, const std::vector<std::string>& keys,
                          WaiterId waiter, TimePoint deadline);
  BlockingResult Wait(const std::string& ns, const std::vector<std::string>& keys,
                      WaiterId waiter, TimePoint deadline);
  // c10d's barrier(key, world_size): adds 1 to the integer at `key`, then
  // blocks until it reaches `world_size`. A key that reached it lets every
  // later arrival through at once, as c10d's does (one key per barrier), and
  // so does a world size <= 0 (after counting the arrival), as torch's
  // servers do.
  BlockingResult Barrier(const std::string& ns, const std::string& key,
                         int64_t world_size, WaiterId waiter, TimePoint deadline,
                         std::vector<Wakeup>* woken);

  // Times out every waiter whose deadline is <= now.
  void ExpireWaiters(TimePoint now, std::vector<Wakeup>* woken);
  // Forgets a waiter whose client went away; no Wakeup is produced.
  void CancelWaiter(WaiterId waiter);
  // Earliest deadline among live waiters, if any.
  std::optional<TimePoint> NextDeadline() const;

  // Bytes of values that Wakeups may carry from now until the next call:
  // each woken get copies its values, and a write can wake any number of
  // them. Beyond it, Wakeups have `reread` set. Unlimited until first set.
  void set_woken_value_budget(size_t bytes) { woken_value_budget_ = bytes; }

  size_t num_waiters() const { return waiters_.size(); }
  size_t num_waiters(const std::string& ns) const;
  size_t num_namespaces() const { return namespaces_.size(); }
  // Answers of requests that carried a dedup id, per namespace, kept until
  // Forget or DropNamespace, whatever their number and size (see
  // StoreLimits; CanRemember says whether to take another). Apart from the
  // keys: not counted in NumKeys, ListKeys or the per-namespace limits, and
  // kept while the namespace has no key. False when nothing was remembered:
  // the store already remembers for max_namespaces namespaces. Remembering
  // an id again replaces its answer.
  bool Remember(const std::string& ns, const std::string& id, StoredAnswer answer);
  // Whether a request with a new dedup id may be applied: its answer could
  // be remembered, and `ns` holds fewer answers (and bytes of them) than
  // StoreLimits' bounds.
  bool CanRemember(const std::string& ns) const;
  // The sender has the answer and will never repeat the id. No-op for an id
  // not remembered.
  void Forget(const std::string& ns, const std::string& id);
  std::optional<StoredAnswer> Recall(const std::string& ns, const std::string& id) const;
  size_t num_remembered(const std::string& ns) const;
  size_t remembered_bytes(const std::string& ns) const;
  // Every remembered answer, each namespace's in the order remembered
  // (snapshots).
  void ForEachRemembered(
      const std::function<void(const std::string& ns, const std::string& id,
                               const StoredAnswer& answer)>& visit) const;

  // Drops a whole namespace (run finished), with what it remembers; its
  // waiters fail with ABORTED.
  void DropNamespace(const std::string& ns, std::vector<Wakeup>* woken);
  // Names of run `run_id`'s namespaces: "<run_id>/e<epoch>.r<round>", the
  // store prefix the rendezvous gives each round (or "<run_id>/r<round>",
  // its form before epochs). Exactly those: run ids may contain '/', and run
  // "a/b"'s "a/b/e1.r1" is not run "a"'s.
  std::vector<std::string> NamespacesOfRun(const std::string& run_id) const;

  // For persistence (state_codec): a non-blocking read, a walk over every
  // entry, and writes that skip the limit checks (restored entries passed
  // them when first written; a daemon restarted with lower limits keeps them)
  // and wake nobody (waiters are never persisted).
  std::optional<std::string> Peek(const std::string& ns, const std::string& key) const;
  void ForEachEntry(
      const std::function<void(const std::string& ns, const std::string& key,
                               const std::string& value)>& visit) const;
  void RestoreSet(const std::string& ns, const std::string& key, std::string value);
  void RestoreAppend(const std::string& ns, const std::string& key,
                     const std::string& value);
  void ForEachQueueItem(
      const std::function<void(const std::string& ns, const std::string& key,
                               const std::string& value)>& visit) const;
  void RestoreQueuePush(const std::string& ns, const std::string& key, std::string value);
  void RestoreQueuePop(const std::string& ns, const std::string& key);
  size_t num_entries() const;

 private:
  struct Namespace {
    std::unordered_map<std::string, std::string> data;
    // Sum of key and value sizes, kept exact for max_bytes_per_namespace.
    size_t bytes = 0;
    // key -> waiters registered until it exists: waits (a queue holding an
    // item satisfies them too) and, apart, gets (values only), so that a
    // push looks at waits alone. Sets are never left empty, so empty maps
    // mean no waiter is parked here. Ordered so that wake order is
    // deterministic.
    std::unordered_map<std::string, std::set<WaiterId>> waiting_on;
    std::unordered_map<std::string, std::set<WaiterId>> getting_on;
    std::unordered_map<std::string, std::deque<std::string>> queues;  // never empty
    size_t queue_items = 0;  // in all queues: each counts as a key
    size_t num_waiters = 0;  // parked here (get, wait, multi_get, barrier)
    // key -> barrier waiters, woken when the key's integer reaches their size.
    std::unordered_map<std::string, std::set<WaiterId>> barriers;
  };
  // Remembered answers of one namespace, and the order they came in.
  struct Memory {
    struct Entry {
      StoredAnswer answer;
      uint64_t seq = 0;  // its key in `order`
    };
    std::unordered_map<std::string, Entry> answers;  // by dedup id
    std::map<uint64_t, std::string> order;           // seq -> dedup id
    uint64_t next_seq = 0;
    size_t bytes = 0;
  };
  static size_t BytesOf(const std::string& id, const StoredAnswer& answer);
  struct Waiter {
    std::string ns;
    std::vector<std::string> keys;  // in request order
    // How many waiting_on (or getting_on) sets hold this waiter. A Delete can make it
    // stale (a key counted as present may vanish), so reaching zero only means "recheck";
    // see Deliver().
    size_t missing = 0;
    bool wants_values = false;
    // > 0: a barrier waiter (keys = {its key}), registered in `barriers`.
    int64_t barrier_size = 0;
    // Held so cancel and wake erase in O(1) even when 10,000 waiters share
    // one deadline.
    std::multimap<TimePoint, WaiterId>::iterator deadline;
  };

  absl::Status CheckKey(const std::string& key) const;
  absl::Status CheckValueSize(size_t value_bytes) const;
  absl::Status CheckRequestSize(size_t num_keys) const;
  // `space` is null when namespace `ns` does not exist yet.
  absl::Status CheckNewNamespace(const Namespace* space) const;
  absl::Status CheckCapacity(const std::string& ns, const Namespace* space,
                             size_t added_keys, size_t bytes_after) const;
  // Everything a single-key write of `value_bytes` must satisfy.
  absl::Status CheckWrite(const std::string& ns, const std::string& key,
                          size_t value_bytes) const;
  const Namespace* FindNamespace(const std::string& ns) const;

  // Stores an already validated write. Waiters whose last registered key it
  // creates are appended to `ready`; Deliver() must follow before the call
  // that did the write returns.
  void Put(const std::string& ns, const std::string& key, std::string value,
           std::vector<WaiterId>* ready);
  // Wakes `ready` waiters with values read now, i.e. after the whole
  // mutation, and re-parks any that a Delete left short of a key.
  void Deliver(const std::vector<WaiterId>& ready, std::vector<Wakeup>* woken);
  // A key a waiter is satisfied by: stored, or (a wait, not a read of
  // values) a queue holding an item.
  static bool Present(const Namespace& space, const std::string& key, bool wants_values);
  // After a write of `key`: barrier waiters whose size its value reached.
  void ReleaseBarriers(Namespace& space, const std::string& key,
                       std::vector<WaiterId>* ready);
  BlockingResult Block(const std::string& ns, const std::vector<std::string>& keys,
                       bool wants_values, WaiterId waiter, TimePoint deadline);
  // Registers `waiter` under each distinct key of `keys` absent from `space`;
  // returns how many.
  size_t Park(Namespace& space, WaiterId waiter, const std::vector<std::string>& keys,
              bool wants_values);
  // The values of `keys` ("" for an absent one), or RESOURCE_EXHAUSTED past
  // max_reply_bytes (checked before any copy).
  absl::StatusOr<std::vector<std::string>> ValuesOf(
      const Namespace* space, const std::vector<std::string>& keys) const;
  // Refuses a new waiter in `space` (null: not created yet) past either cap.
  absl::Status CheckWaiterRoom(const std::string& ns, const Namespace* space) const;
  std::string MissingKeysMessage(const Waiter& waiter) const;
  void RemoveWaiter(WaiterId id);
  // Namespaces with neither keys nor waiters are dropped, so stray waits in
  // mistyped namespaces do not use up max_namespaces forever.
  void EraseIfEmpty(std::unordered_map<std::string, Namespace>::iterator it);

  StoreLimits limits_;
  std::unordered_map<std::string, Namespace> namespaces_;
  // Apart from namespaces_, which drops a namespace once it has no key.
  std::unordered_map<std::string, Memory> remembered_;
  std::unordered_map<WaiterId, Waiter> waiters_;
  std::multimap<TimePoint, WaiterId> deadlines_;
  size_t woken_value_budget_ = std::numeric_limits<size_t>::max();
};

}  // namespace meshrun::rdzv
