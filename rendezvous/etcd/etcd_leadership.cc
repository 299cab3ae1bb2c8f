#include "rendezvous/etcd/etcd_leadership.h"

#include <spdlog/spdlog.h>

#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace meshrun::rdzv {

namespace {

constexpr char kMarkerPrefix[] = "meshrun-rdzvd state 1 deployment=";

// The first key after every key that starts with `prefix` (etcd's range end
// for a prefix).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    auto last = static_cast<unsigned char>(prefix.back());
    if (last < 0xff) {
      prefix.back() = static_cast<char>(last + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

// etcd's refusals of a request itself (auth on without a user, no permission
// on the prefix) are the operator's to fix: exit 2 at start, not a retry.
absl::Status AtStart(const absl::Status& status) {
  if (status.ok() || status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kDeadlineExceeded)
    return status;
  return absl::InvalidArgumentError(status.message());
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdLeadership>> EtcdLeadership::Open(
    std::shared_ptr<EtcdClient> etcd, EtcdLeadershipOptions options) {
  if (options.prefix.empty() || options.prefix.back() != '/') options.prefix += '/';
  std::unique_ptr<EtcdLeadership> self(new EtcdLeadership());
  self->etcd_ = std::move(etcd);
  self->options_ = options;
  const std::string meta = options.prefix + "meta";
  const std::string marker = kMarkerPrefix + options.deployment;
  auto judge = [&](const std::string& value) -> absl::Status {
    if (value == marker) return absl::OkStatus();
    if (absl::StartsWith(value, kMarkerPrefix)) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd prefix ", options.prefix, " belongs to meshrun deployment '",
                       value.substr(strlen(kMarkerPrefix)), "', not '",
                       options.deployment, "' (--etcd-deployment); nothing written"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd prefix ", options.prefix, " holds keys that meshrun-rdzvd did not write (",
        meta, " = '", value.substr(0, 64),
        "'); give it a prefix of its own (--etcd-prefix)"));
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    etcdserverpb::RangeRequest get;
    get.set_key(meta);
    auto found = self->etcd_->Range(get);
    if (!found.ok()) return AtStart(found.status());
    if (found->kvs_size() > 0) {
      if (absl::Status s = judge(found->kvs(0).value()); !s.ok()) return s;
      return self;
    }
    etcdserverpb::RangeRequest count;
    count.set_key(options.prefix);
    count.set_range_end(PrefixEnd(options.prefix));
    count.set_count_only(true);
    auto counted = self->etcd_->Range(count);
    if (!counted.ok()) return AtStart(counted.status());
    if (counted->count() > 0) {
      if (attempt == 0) continue;  // another daemon's marker, written meanwhile?
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd prefix ", options.prefix, " holds ", counted->count(),
          " keys that meshrun-rdzvd did not write; give it a prefix of its own "
          "(--etcd-prefix); nothing written"));
    }
    etcdserverpb::TxnRequest mark;
    auto* absent = mark.add_compare();
    absent->set_key(meta);
    absent->set_target(etcdserverpb::Compare::VERSION);
    absent->set_result(etcdserverpb::Compare::EQUAL);
    absent->set_version(0);
    auto* put = mark.add_success()->mutable_request_put();
    put->set_key(meta);
    put->set_value(marker);
    auto marked = self->etcd_->Txn(mark);
    if (!marked.ok()) return AtStart(marked.status());
    if (marked->succeeded()) return self;
    // Another daemon marked it meanwhile: judge its marker.
  }
  return absl::InternalError("etcd prefix " + options.prefix + ": marker changed twice");
}

EtcdLeadership::~EtcdLeadership() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (keep_alive_.joinable()) keep_alive_.join();
}

absl::StatusOr<bool> EtcdLeadership::TryLead(int64_t lease, uint64_t expected_term,
                                             bool any_term, std::string* leader) {
  const std::string term_key = options_.prefix + "term";
  const std::string leader_key = options_.prefix + "leader";
  etcdserverpb::RangeRequest get_term;
  get_term.set_key(term_key);
  auto term = etcd_->Range(get_term);
  if (!term.ok()) return term.status();
  uint64_t current = 0;
  int64_t term_revision = 0;
  if (term->kvs_size() > 0) {
    term_revision = term->kvs(0).mod_revision();
    if (!absl::SimpleAtoi(term->kvs(0).value(), &current)) {
      return absl::DataLossError("etcd key " + term_key + " is not a number");
    }
  }
  if (!any_term && current != expected_term) {
    *leader = absl::StrCat("(another daemon led meanwhile: term ", current, ")");
    return false;
  }
  const uint64_t new_term = any_term ? current + 1 : current;
  std::random_device random;
  const std::string value = absl::StrCat(options_.endpoint, " term=", new_term,
                                         " id=", (uint64_t{random()} << 32) | random());
  etcdserverpb::TxnRequest txn;
  auto* nobody = txn.add_compare();
  nobody->set_key(leader_key);
  nobody->set_target(etcdserverpb::Compare::CREATE);
  nobody->set_result(etcdserverpb::Compare::EQUAL);
  nobody->set_create_revision(0);
  auto* same_term = txn.add_compare();
  same_term->set_key(term_key);
  same_term->set_target(etcdserverpb::Compare::MOD);
  same_term->set_result(etcdserverpb::Compare::EQUAL);
  same_term->set_mod_revision(term_revision);
  auto* put_leader = txn.add_success()->mutable_request_put();
  put_leader->set_key(leader_key);
  put_leader->set_value(value);
  put_leader->set_lease(lease);
  if (any_term) {
    auto* put_term = txn.add_success()->mutable_request_put();
    put_term->set_key(term_key);
    put_term->set_value(absl::StrCat(new_term));
  }
  txn.add_failure()->mutable_request_range()->set_key(leader_key);
  auto reply = etcd_->Txn(txn);
  if (!reply.ok()) return reply.status();
  if (!reply->succeeded()) {
    leader->clear();
    if (reply->responses_size() > 0 && reply->responses(0).has_response_range() &&
        reply->responses(0).response_range().kvs_size() > 0) {
      *leader = reply->responses(0).response_range().kvs(0).value();
    }
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  lease_ = lease;
  term_ = new_term;
  value_ = value;
  leading_ = true;
  return true;
}

absl::Status EtcdLeadership::Campaign(
    const std::function<bool()>& stop,
    const std::function<void(const std::string&)>& leader_seen) {
  int64_t lease = 0;
  std::string last_seen = "\n";  // nothing seen yet
  while (!stop()) {
    absl::Status status = absl::OkStatus();
    if (lease == 0) {
      auto granted = etcd_->LeaseGrant(options_.lease_ttl_s);
      if (granted.ok()) {
        lease = granted->id();
      } else {
        status = granted.status();
      }
    } else if (auto ttl = etcd_->LeaseKeepAlive(lease); !ttl.ok()) {
      status = ttl.status();
    } else if (*ttl <= 0) {
      lease = 0;
      continue;
    }
    if (status.ok()) {
      std::string leader;
      auto won = TryLead(lease, 0, /*any_term=*/true, &leader);
      if (won.ok() && *won) return absl::OkStatus();
      if (!won.ok()) {
        status = won.status();
      } else if (leader != last_seen) {
        last_seen = leader;
        leader_seen(leader);
      }
    }
    etcd_reachable_ = status.ok();
    if (!status.ok()) {
      if (status.code() == absl::StatusCode::kDataLoss) return status;
      spdlog::warn("standing by: {}", std::string(status.message()));
    }
    std::unique_lock<std::mutex> lock(stop_mu_);
    stop_cv_.wait_for(lock, options_.poll_interval, [&] { return stopping_.load(); });
  }
  if (lease != 0) (void)etcd_->LeaseRevoke(lease);
  return absl::CancelledError("stopped while standing by");
}

void EtcdLeadership::KeepLeading(std::function<void(const std::string&)> lost) {
  lost_ = std::move(lost);
  keep_alive_ = std::thread([this] { KeepAliveLoop(); });
}

void EtcdLeadership::KeepAliveLoop() {
  // Four keep-alives a lease: one late or lost one costs nothing.
  const auto interval = std::chrono::milliseconds(options_.lease_ttl_s * 1000 / 4);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(stop_mu_);
      if (stop_cv_.wait_for(lock, interval, [&] { return stopping_.load(); })) return;
    }
    int64_t lease;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!leading_) return;
      lease = lease_;
    }
    auto ttl = etcd_->LeaseKeepAlive(lease);
    if (!ttl.ok()) {
      if (etcd_reachable_.exchange(false)) {
        spdlog::warn(
            "etcd unreachable ({}); serving what needs no write until it is back",
            std::string(ttl.status().message()));
      }
      continue;
    }
    if (!etcd_reachable_.exchange(true)) spdlog::info("etcd reachable again");
    if (*ttl > 0) continue;
    absl::Status status = Reconfirm();
    if (status.ok() || status.code() == absl::StatusCode::kUnavailable) continue;
    if (lost_) lost_(std::string(status.message()));
    return;
  }
}

absl::Status EtcdLeadership::Reconfirm() {
  std::lock_guard<std::mutex> one(reconfirm_mu_);  // keep-alive thread, flusher
  std::string value;
  uint64_t term;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!leading_) return absl::FailedPreconditionError("not leading");
    value = value_;
    term = term_;
  }
  const std::string leader_key = options_.prefix + "leader";
  etcdserverpb::RangeRequest get;
  get.set_key(leader_key);
  auto found = etcd_->Range(get);
  if (!found.ok()) return found.status();
  if (found->kvs_size() > 0) {
    if (found->kvs(0).value() == value) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(mu_);
    leading_ = false;
    return absl::FailedPreconditionError("another daemon leads now: " +
                                         found->kvs(0).value());
  }
  // The lease ran out (this daemon was paused, or cut off from etcd) and
  // nobody has taken the key: take it back if nobody led in between.
  auto granted = etcd_->LeaseGrant(options_.lease_ttl_s);
  if (!granted.ok()) return granted.status();
  std::string leader;
  auto won = TryLead(granted->id(), term, /*any_term=*/false, &leader);
  if (!won.ok()) return won.status();
  if (*won) {
    spdlog::warn(
        "etcd lease of term {} ran out; took the leader key back (nobody led "
        "meanwhile)",
        term);
    return absl::OkStatus();
  }
  (void)etcd_->LeaseRevoke(granted->id());
  std::lock_guard<std::mutex> lock(mu_);
  leading_ = false;
  return absl::FailedPreconditionError("another daemon leads now: " + leader);
}

void EtcdLeadership::Resign() {
  int64_t lease;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!leading_) return;
    leading_ = false;
    lease = lease_;
  }
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (keep_alive_.joinable()) keep_alive_.join();
  (void)etcd_->LeaseRevoke(lease);
}

etcdserverpb::Compare EtcdLeadership::Fence() {
  etcdserverpb::Compare fence;
  fence.set_key(options_.prefix + "leader");
  fence.set_target(etcdserverpb::Compare::VALUE);
  fence.set_result(etcdserverpb::Compare::EQUAL);
  std::lock_guard<std::mutex> lock(mu_);
  fence.set_value(value_);
  return fence;
}

uint64_t EtcdLeadership::term() {
  std::lock_guard<std::mutex> lock(mu_);
  return term_;
}

}  // namespace meshrun::rdzv
