// The C++ side of the TCPStore wire-protocol conformance suite
// (tests/e2e/tcpstore_conformance.py --client cpp): libtorch's stock
// c10d::TCPStore client against whatever server listens on --host/--port
// (torch's libuv or classic server, or meshrun-rdzvd). Each case prints one
// line, "CASE <name> <json outcome>"; the harness runs this program against
// every server and compares the outcomes as data. Case names and meanings are
// those of the Python cases of the same name; the encoding is this program's.
//
// Usage: tcpstore_client_conformance --host H --port P [CASE...]

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>
#include <vector>

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kClientTimeout{
    20000};                          // a broken server fails a case, never hangs it
constexpr milliseconds kShort{300};  // the timeouts the cases provoke
constexpr std::chrono::seconds kParkDeadline{20};
constexpr std::chrono::seconds kJoinDeadline{20};

std::string g_host;
uint16_t g_port = 0;

// ---------------------------------------------------------------------------
// JSON text, as much as the outcomes need.

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

class Obj {
 public:
  Obj& Add(const std::string& key, const std::string& json) {
    fields_ += (fields_.empty() ? "" : ", ") + Quote(key) + ": " + json;
    return *this;
  }
  std::string Str() const { return "{" + fields_ + "}"; }

 private:
  std::string fields_;
};

std::string Bool(bool b) { return b ? "true" : "false"; }
std::string Int(int64_t v) { return std::to_string(v); }
constexpr const char* kNull = "null";

// Bytes as the Python side shows them: printable ASCII as text, else hex;
// long values by length only (the cases compare long values themselves).
std::string Val(const std::vector<uint8_t>& b) {
  if (b.size() > 256) return Obj().Add("len", Int(static_cast<int64_t>(b.size()))).Str();
  bool printable = true;
  for (uint8_t c : b) printable = printable && c >= 0x20 && c < 0x7f;
  if (printable) return Quote(std::string(b.begin(), b.end()));
  std::string hex = "hex:";
  for (uint8_t c : b) {
    char buf[3];
    std::snprintf(buf, sizeof(buf), "%02x", c);
    hex += buf;
  }
  return Quote(hex);
}
std::string List(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

std::vector<uint8_t> B(const std::string& s) { return {s.begin(), s.end()}; }

// An exception as data: its c10 class, and for store errors the first line
// of the message with addresses masked. Network errors keep the class only
// (reset vs EOF is a race, not behaviour).
std::string Err(const std::exception& e) {
  std::string type = "std::exception";
  std::string msg = e.what();
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e))
    msg = c10e->what_without_backtrace();
  if (dynamic_cast<const c10::DistNetworkError*>(&e)) {
    return Obj().Add("error", Quote("DistNetworkError")).Str();
  } else if (dynamic_cast<const c10::DistQueueEmptyError*>(&e)) {
    type = "QueueEmptyError";
  } else if (dynamic_cast<const c10::DistStoreError*>(&e)) {
    type = "DistStoreError";
  } else if (dynamic_cast<const c10::DistError*>(&e)) {
    type = "DistError";
  } else if (dynamic_cast<const c10::Error*>(&e)) {
    type = "c10::Error";
  }
  msg = msg.substr(0, msg.find('\n'));
  static const std::regex kAddress(
      R"(\[?[0-9a-fA-F.:]*\]?:\d{2,5}\b|127\.0\.0\.1|localhost)");
  msg = std::regex_replace(msg, kAddress, "<addr>");
  return Obj().Add("error", Quote(type)).Add("msg", Quote(msg)).Str();
}

std::string Attempt(const std::function<std::string()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Err(e);
  }
}

c10::intrusive_ptr<c10d::TCPStore> Client(milliseconds timeout = kClientTimeout) {
  c10d::TCPStoreOptions opts;
  opts.port = g_port;
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(g_host, opts);
}

// A client whose store timeout is kShort. It connects with the long timeout:
// the constructor's connect, validate and ping are bound by its timeout too,
// and on a loaded machine they can take longer than kShort.
c10::intrusive_ptr<c10d::TCPStore> ShortClient() {
  auto c = Client();
  c->setTimeout(kShort);
  return c;
}

bool ServesOthers(const std::string& p) {
  try {
    auto c = Client();
    c->set(p + "probe", B("alive"));
    return c->get(p + "probe") == B("alive");
  } catch (const std::exception&) {
    return false;
  }
}

// ---------------------------------------------------------------------------
// A call on a thread of its own; "parked" once that thread sits in poll() or
// recv on its socket, which a blocking query does after sending it.

bool Parked(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/syscall");
  long nr = -1;
  if (!(f >> nr)) return false;
  static const std::set<long> kParked = {7, 45, 47, 232, 271, 281};
  return kParked.count(nr) > 0;
}

class Blocked {
 public:
  explicit Blocked(std::function<std::string()> fn) {
    thread_ = std::thread([this, fn = std::move(fn)] {
      tid_ = static_cast<pid_t>(::syscall(SYS_gettid));
      result_ = Attempt(fn);
      done_ = true;
    });
  }
  ~Blocked() {
    // A call still blocked returns by its own client timeout.
    if (thread_.joinable()) thread_.join();
  }
  bool WaitParked() {
    const auto end = Clock::now() + kParkDeadline;
    while (Clock::now() < end && !done_) {
      if (tid_ != 0 && Parked(tid_)) return true;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return false;
  }
  bool StillParked() const { return !done_ && Parked(tid_); }
  bool Join() {
    const auto end = Clock::now() + kJoinDeadline;
    while (!done_ && Clock::now() < end) std::this_thread::sleep_for(milliseconds(5));
    if (done_ && thread_.joinable()) thread_.join();
    return done_;
  }
  const std::string& result() const { return result_; }

 private:
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> done_{false};
  std::string result_ = kNull;  // until the call returns
  std::thread thread_;
};

// Whether every call returned (each bounded by kJoinDeadline), and their results.
std::pair<bool, std::vector<std::string>> JoinAll(
    std::vector<std::unique_ptr<Blocked>>& calls) {
  bool returned = true;
  std::vector<std::string> results;
  for (auto& call : calls) {
    returned = call->Join() && returned;
    results.push_back(call->result());
  }
  return {returned, results};
}

// ---------------------------------------------------------------------------
// The cases.

using Case = std::function<std::string(const std::string& prefix)>;

std::string ConnectPing(const std::string&) {
  auto c = Client();  // the constructor validates (magic) and pings
  return Obj()
      .Add("connected", "true")
      .Add("has_extended_api", Bool(c->hasExtendedApi()))
      .Str();
}

std::string SetGet(const std::string& p) {
  auto c = Client();
  auto rt = [&](const std::string& key, const std::vector<uint8_t>& v) {
    return Attempt([&] {
      c->set(key, v);
      return Val(c->get(key));
    });
  };
  std::vector<uint8_t> big(4 << 20, 'x');
  return Obj()
      .Add("plain", rt(p + "a", B("1")))
      .Add("overwrite", rt(p + "a", B("2")))
      .Add("bytes_value", rt(p + "b", {0, 0xff, 0}))
      .Add("empty_value", rt(p + "e", {}))
      .Add("unicode_key", rt(p + "ключ/ü", B("v")))
      .Add("long_key", rt(p + std::string(4000, 'k'), B("v")))
      .Add("value_4mib", Attempt([&] {
             c->set(p + "m", big);
             return Bool(c->get(p + "m") == big);
           }))
      .Add("other_client_sees", Attempt([&] { return Val(Client()->get(p + "a")); }))
      .Str();
}

std::string GetMissingTimesOut(const std::string& p) {
  auto c = ShortClient();
  return Obj().Add("get", Attempt([&] { return Val(c->get(p + "missing")); })).Str();
}

std::string ClientUsableAfterTimeout(const std::string& p) {
  auto c = Client();
  c->setTimeout(kShort);
  Obj o;
  o.Add("first", Attempt([&] { return Val(c->get(p + "missing")); }));
  o.Add("second", Attempt([&] {
          c->wait({p + "missing2"}, kShort);
          return std::string(kNull);
        }));
  c->setTimeout(kClientTimeout);
  o.Add("then_set_get", Attempt([&] {
          c->set(p + "k", B("v"));
          return Val(c->get(p + "k"));
        }));
  o.Add("then_add", Attempt([&] { return Int(c->add(p + "n", 3)); }));
  o.Add("then_late_key_then_get", Attempt([&] {
          Client()->set(p + "missing", B("late"));
          return Val(c->get(p + "missing"));
        }));
  return o.Str();
}

std::string Add(const std::string& p) {
  auto c = Client();
  auto add = [&](const std::string& key, int64_t v) {
    return Attempt([&] { return Int(c->add(key, v)); });
  };
  Obj o;
  o.Add("absent", add(p + "n", 5));
  o.Add("negative", add(p + "n", -2));
  o.Add("zero", add(p + "n", 0));
  o.Add("get_after", Attempt([&] { return Val(c->get(p + "n")); }));
  o.Add("on_set_integer", Attempt([&] {
          c->set(p + "s", B("7"));
          return Int(c->add(p + "s", 1));
        }));
  o.Add("large", add(p + "big", int64_t{1} << 62));
  o.Add("get_large", Attempt([&] { return Val(c->get(p + "big")); }));
  return o.Str();
}

std::string AddNonInteger(const std::string& p) {
  auto c = Client();
  c->set(p + "s", B("abc"));
  Obj o;
  o.Add("add", Attempt([&] { return Int(c->add(p + "s", 1)); }));
  o.Add("same_client_after", Attempt([&] { return Val(c->get(p + "s")); }));
  o.Add("serves_others", Bool(ServesOthers(p)));
  o.Add("value_kept", Attempt([&] { return Val(Client()->get(p + "s")); }));
  return o.Str();
}

std::string CompareSet(const std::string& p) {
  auto c = Client();
  auto cas = [&](const std::string& k, const std::string& e, const std::string& d) {
    return Attempt([&] { return Val(c->compareSet(k, B(e), B(d))); });
  };
  auto get = [&](const std::string& k) {
    return Attempt([&] { return Val(c->get(k)); });
  };
  Obj o;
  o.Add("absent_expected_empty", cas(p + "a", "", "new"));
  o.Add("absent_expected_empty_get", get(p + "a"));
  o.Add("absent_expected_nonempty", cas(p + "b", "old", "new"));
  o.Add("absent_expected_nonempty_check",
        Attempt([&] { return Bool(c->check({p + "b"})); }));
  c->set(p + "c", B("cur"));
  o.Add("present_equal", cas(p + "c", "cur", "next"));
  o.Add("present_equal_get", get(p + "c"));
  o.Add("present_different", cas(p + "c", "nope", "other"));
  o.Add("present_different_get", get(p + "c"));
  c->set(p + "d", {});
  o.Add("present_empty_expected_empty", cas(p + "d", "", "z"));
  o.Add("present_empty_expected_empty_get", get(p + "d"));
  o.Add("desired_empty", cas(p + "c", "next", ""));
  o.Add("desired_empty_get", get(p + "c"));
  return o.Str();
}

std::string Check(const std::string& p) {
  auto c = Client();
  c->set(p + "a", B("1"));
  auto check = [&](const std::vector<std::string>& keys) {
    return Attempt([&] { return Bool(c->check(keys)); });
  };
  return Obj()
      .Add("empty_list",
           Attempt([&] { return Bool(Client()->check({})); }))  // its own client
      .Add("present", check({p + "a"}))
      .Add("present_and_absent", check({p + "a", p + "z"}))
      .Add("absent", check({p + "z"}))
      .Str();
}

std::string WaitTimeout(const std::string& p) {
  auto wait = [](c10::intrusive_ptr<c10d::TCPStore> c, std::vector<std::string> keys,
                 std::optional<milliseconds> timeout) {
    return Attempt([&] {
      if (timeout) {
        c->wait(keys, *timeout);
      } else {
        c->wait(keys);
      }
      return std::string(kNull);
    });
  };
  Obj o;
  o.Add("one_key", wait(Client(), {p + "a"}, kShort));
  o.Add("two_keys", wait(Client(), {p + "a", p + "b"}, kShort));
  o.Add("default_timeout", wait(ShortClient(), {p + "a"}, std::nullopt));
  o.Add("empty_list", wait(Client(), {}, kShort));
  Client()->set(p + "c", B("1"));
  o.Add("present_returns", wait(Client(), {p + "c"}, kShort));
  return o.Str();
}

std::string DeleteKey(const std::string& p) {
  auto c = Client();
  c->set(p + "a", B("1"));
  auto del = [&](const std::string& k) {
    return Attempt([&] { return Bool(c->deleteKey(k)); });
  };
  Obj o;
  o.Add("present", del(p + "a"));
  o.Add("again", del(p + "a"));
  o.Add("absent", del(p + "never"));
  o.Add("check_after", Attempt([&] { return Bool(c->check({p + "a"})); }));
  o.Add("counter_deleted_then_add", Attempt([&] {
          c->add(p + "n", 4);
          c->deleteKey(p + "n");
          return Int(c->add(p + "n", 1));
        }));
  return o.Str();
}

std::string NumKeysAndListKeys(const std::string& p) {
  auto c = Client();
  const int64_t n0 = c->getNumKeys();
  c->set(p + "a", B("1"));
  c->add(p + "b", 1);
  c->multiSet({p + "c", p + "d"}, {B("3"), B("4")});
  const int64_t n1 = c->getNumKeys();
  c->deleteKey(p + "a");
  const int64_t n2 = c->getNumKeys();
  std::string mine = Attempt([&] {
    std::set<std::string> keys;
    for (const auto& k : c->listKeys()) {
      if (k.rfind(p, 0) == 0) keys.insert(k);
    }
    std::vector<std::string> quoted;
    for (const auto& k : keys) quoted.push_back(Quote(k));
    return List(quoted);
  });
  return Obj()
      .Add("delta_after_4", Int(n1 - n0))
      .Add("delta_after_delete", Int(n2 - n0))
      .Add("list_keys_mine", mine)
      .Str();
}

std::string Values(const std::vector<std::vector<uint8_t>>& values) {
  std::vector<std::string> items;
  for (const auto& v : values) items.push_back(Val(v));
  return List(items);
}

std::string MultiGetSet(const std::string& p) {
  auto c = Client();
  Obj o;
  o.Add("multi_set_then_get", Attempt([&] {
          c->multiSet({p + "a", p + "b"}, {B("1"), {0}});
          return Values(c->multiGet({p + "a", p + "b"}));
        }));
  o.Add("overwrite", Attempt([&] {
          c->multiSet({p + "a"}, {B("9")});
          return Val(c->get(p + "a"));
        }));
  o.Add("empty_multi_set", Attempt([&] {  // clients of their own
          Client()->multiSet({}, {});
          return std::string(kNull);
        }));
  o.Add("empty_multi_get", Attempt([&] { return Values(Client()->multiGet({})); }));
  o.Add("duplicate_keys", Attempt([&] {
          return Values(c->multiGet({p + "a", p + "a"}));
        }));
  o.Add("missing_times_out", Attempt([&] {
          return Values(ShortClient()->multiGet({p + "a", p + "zz"}));
        }));
  return o.Str();
}

std::string Append(const std::string& p) {
  auto c = Client();
  Obj o;
  o.Add("absent_creates", Attempt([&] {
          c->append(p + "a", B("x"));
          return Val(c->get(p + "a"));
        }));
  o.Add("present_appends", Attempt([&] {
          c->append(p + "a", B("yz"));
          return Val(c->get(p + "a"));
        }));
  o.Add("to_counter", Attempt([&] {
          c->add(p + "n", 41);
          c->append(p + "n", B("0"));
          return Int(c->add(p + "n", 1));
        }));
  return o.Str();
}

std::string Queue(const std::string& p) {
  auto c = Client();
  const std::string q = p + "q";
  Obj o;
  o.Add("len_absent", Attempt([&] { return Int(c->queueLen(q)); }));
  o.Add("push3", Attempt([&] {
          for (const char* v : {"a", "b", "c"}) c->queuePush(q, B(v));
          return std::string(kNull);
        }));
  o.Add("len", Attempt([&] { return Int(c->queueLen(q)); }));
  o.Add("pop", Attempt([&] { return Val(c->queuePop(q, true)); }));
  o.Add("pop_nonblocking", Attempt([&] { return Val(c->queuePop(q, false)); }));
  o.Add("check", Attempt([&] { return Bool(c->check({q})); }));
  o.Add("wait", Attempt([&] {
          c->wait({q}, kShort);
          return std::string(kNull);
        }));
  o.Add("len_after", Attempt([&] { return Int(c->queueLen(q)); }));
  o.Add("drain", Attempt([&] { return Val(c->queuePop(q, true)); }));
  o.Add("empty_nonblocking", Attempt([&] { return Val(Client()->queuePop(q, false)); }));
  o.Add("empty_blocking_times_out",
        Attempt([&] { return Val(ShortClient()->queuePop(q, true)); }));
  o.Add("serves_others", Bool(ServesOthers(p)));
  return o.Str();
}

std::string QueuePopBlocksUntilPush(const std::string& p) {
  auto pusher = Client();
  auto popper = Client();
  Blocked b([&] { return Val(popper->queuePop(p + "q", true)); });
  const bool parked = b.WaitParked();
  std::string pushed = Attempt([&] {
    pusher->queuePush(p + "q", B("item"));
    return std::string(kNull);
  });
  const bool returned = b.Join();
  return Obj()
      .Add("parked", Bool(parked))
      .Add("pushed", pushed)
      .Add("returned", Bool(returned))
      .Add("popped", b.result())
      .Str();
}

std::string GetBlocksUntilSet(const std::string& p) {
  auto setter = Client();
  auto getter = Client();
  Blocked b([&] { return Val(getter->get(p + "k")); });
  const bool parked = b.WaitParked();
  setter->set(p + "k", B("v"));
  const bool returned = b.Join();
  return Obj()
      .Add("parked", Bool(parked))
      .Add("returned", Bool(returned))
      .Add("got", b.result())
      .Str();
}

std::string WaitReturnsOnLastKey(const std::string& p) {
  auto setter = Client();
  auto waiter = Client();
  const std::vector<std::string> keys = {p + "k1", p + "k2", p + "k3"};
  Blocked b([&] {
    waiter->wait(keys, kClientTimeout);
    return std::string(kNull);
  });
  Obj o;
  o.Add("parked", Bool(b.WaitParked()));
  setter->set(keys[0], B("1"));
  setter->add(keys[1], 1);
  setter->get(keys[1]);  // a round trip after both: a wrong wake-up would be on its way
  o.Add("still_parked_after_2_of_3", Bool(b.StillParked()));
  setter->set(keys[2], B("3"));
  o.Add("returned", Bool(b.Join()));
  o.Add("result", b.result());
  return o.Str();
}

std::string ManyWaitersOneSet(const std::string& p) {
  std::vector<c10::intrusive_ptr<c10d::TCPStore>> clients;
  for (int i = 0; i < 16; ++i) clients.push_back(Client());
  std::vector<std::unique_ptr<Blocked>> waiters;
  for (auto& c : clients) {
    waiters.push_back(std::make_unique<Blocked>([c, p] { return Val(c->get(p + "k")); }));
  }
  bool parked = true;
  for (auto& w : waiters) parked = w->WaitParked() && parked;
  Client()->set(p + "k", B("go"));
  const auto [returned, all] = JoinAll(waiters);
  const std::set<std::string> results(all.begin(), all.end());
  return Obj()
      .Add("parked", Bool(parked))
      .Add("returned", Bool(returned))
      .Add("results", List({results.begin(), results.end()}))
      .Str();
}

std::string ConcurrentAdd64Clients(const std::string& p) {
  constexpr int kClients = 64;
  constexpr int kAdds = 20;
  const std::string key = p + "counter";
  std::vector<c10::intrusive_ptr<c10d::TCPStore>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(Client());
  std::vector<std::vector<int64_t>> returned(kClients);
  std::atomic<int> errors{0};
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      ++arrived;
      const auto end = Clock::now() + kJoinDeadline;
      while (arrived.load() < kClients && Clock::now() < end) std::this_thread::yield();
      try {
        for (int j = 0; j < kAdds; ++j) returned[i].push_back(clients[i]->add(key, 1));
      } catch (const std::exception&) {
        ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();  // each add is bounded by its client's timeout
  std::vector<int64_t> all;
  for (const auto& r : returned) all.insert(all.end(), r.begin(), r.end());
  std::sort(all.begin(), all.end());
  bool each_once = static_cast<int>(all.size()) == kClients * kAdds;
  for (size_t i = 0; each_once && i < all.size(); ++i)
    each_once = all[i] == int64_t(i) + 1;
  return Obj()
      .Add("errors", Int(errors))
      .Add("final", Attempt([&] { return Int(Client()->add(key, 0)); }))
      .Add("each_value_once", Bool(each_once))
      .Str();
}

std::string Barrier(const std::string& p) {
  std::vector<c10::intrusive_ptr<c10d::TCPStore>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(Client());
  std::vector<std::unique_ptr<Blocked>> parties;
  for (auto& c : clients) {
    parties.push_back(std::make_unique<Blocked>([c, p] {
      c->barrier(p + "b", 3, kClientTimeout);
      return std::string(kNull);
    }));
  }
  const auto [returned, results] = JoinAll(parties);
  return Obj()
      .Add("returned", Bool(returned))
      .Add("results", List(results))
      .Add("short_times_out", Attempt([&] {
             Client()->barrier(p + "c", 2, kShort);
             return std::string(kNull);
           }))
      .Add("world_1", Attempt([&] {
             auto c = Client();
             static_cast<c10d::Store&>(*c).barrier(p + "d", 1);  // the default timeout
             return std::string(kNull);
           }))
      .Str();
}

std::string LargeValue64MiB(const std::string& p) {
  std::vector<uint8_t> value(64 << 20);
  std::mt19937_64 rng(15);
  for (auto& b : value) b = static_cast<uint8_t>(rng());
  Obj o;
  auto setter = Client();
  o.Add("set", Attempt([&] {
          setter->set(p + "big", value);
          return std::string(kNull);
        }));
  // SET has no reply: a round trip on the same connection orders it before
  // the other client's queries.
  o.Add("setter_check", Attempt([&] { return Bool(setter->check({p + "big"})); }));
  auto reader = Client();
  bool present = false;
  o.Add("check", Attempt([&] {
          present = reader->check({p + "big"});
          return Bool(present);
        }));
  o.Add("get_matches",
        present ? Attempt([&] { return Bool(reader->get(p + "big") == value); }) : kNull);
  o.Add("serves_others", Bool(ServesOthers(p)));
  return o.Str();
}

const std::vector<std::pair<std::string, Case>>& Cases() {
  static const std::vector<std::pair<std::string, Case>> kCases = {
      {"connect_ping", ConnectPing},
      {"set_get", SetGet},
      {"get_missing_times_out", GetMissingTimesOut},
      {"client_usable_after_timeout", ClientUsableAfterTimeout},
      {"add", Add},
      {"add_non_integer", AddNonInteger},
      {"compare_set", CompareSet},
      {"check", Check},
      {"wait_timeout", WaitTimeout},
      {"delete_key", DeleteKey},
      {"num_keys_and_list_keys", NumKeysAndListKeys},
      {"multi_get_set", MultiGetSet},
      {"append", Append},
      {"queue", Queue},
      {"queue_pop_blocks_until_push", QueuePopBlocksUntilPush},
      {"get_blocks_until_set", GetBlocksUntilSet},
      {"wait_returns_on_last_key", WaitReturnsOnLastKey},
      {"many_waiters_one_set", ManyWaitersOneSet},
      {"concurrent_add_64_clients", ConcurrentAdd64Clients},
      {"barrier", Barrier},
      {"large_value_64mib", LargeValue64MiB},
  };
  return kCases;
}

}  // namespace

int main(int argc, char** argv) {
  std::set<std::string> only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--host" && i + 1 < argc) {
      g_host = argv[++i];
    } else if (arg == "--port" && i + 1 < argc) {
      g_port = static_cast<uint16_t>(std::stoi(argv[++i]));
    } else {
      only.insert(arg);
    }
  }
  if (g_host.empty() || g_port == 0) {
    std::cerr << "usage: tcpstore_client_conformance --host H --port P [CASE...]\n";
    return 2;
  }
  for (const auto& [name, run] : Cases()) {
    if (!only.empty() && only.count(name) == 0) continue;
    std::string outcome;
    try {
      outcome = run(name + "/");
    } catch (const std::exception& e) {
      outcome = Obj().Add("case_failed", Err(e)).Str();
    }
    std::cout << "CASE " << name << " " << outcome << std::endl;
  }
  return 0;
}
