#include "rendezvous/status/status_render.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace meshrun::rdzv {
namespace {

// Length of the valid UTF-8 sequence at text[i], or 0 if there is none.
size_t Utf8Length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t n;
  uint32_t min;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) {
    n = 2;
    min = 0x80;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3;
    min = 0x800;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  uint32_t code = c & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3f);
  }
  // Overlong forms, surrogates and beyond U+10FFFF are not valid UTF-8.
  if (code < min || (code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff) return 0;
  return n;
}

void AppendJsonString(const std::string& text, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out->append(buf);
        } else if (c < 0x80) {
          out->push_back(static_cast<char>(c));
        } else if (size_t n = Utf8Length(text, i); n > 0) {
          out->append(text, i, n);
          i += n;
          continue;
        } else {
          out->append("\\ufffd");
        }
    }
    ++i;
  }
  out->push_back('"');
}

// A tiny JSON writer: keys and commas are its business, values the caller's.
class Json {
 public:
  std::string Take() { return std::move(out_); }
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  void Key(const char* key) {
    Comma();
    AppendJsonString(key, &out_);
    out_.push_back(':');
    after_key_ = true;
  }
  void String(const std::string& value) {
    Comma();
    AppendJsonString(value, &out_);
  }
  template <typename Int>
  void Number(Int value) {
    Comma();
    absl::StrAppend(&out_, value);
  }
  void Bool(bool value) {
    Comma();
    out_.append(value ? "true" : "false");
  }
  void Null() {
    Comma();
    out_.append("null");
  }
  template <typename Int>
  void Field(const char* key, Int value) {
    Key(key);
    Number(value);
  }
  void Field(const char* key, const std::string& value) {
    Key(key);
    String(value);
  }

 private:
  void Comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_.push_back(',');
      first_.back() = false;
    }
  }
  void Open(char bracket) {
    Comma();
    out_.push_back(bracket);
    first_.push_back(true);
  }
  void Close(char bracket) {
    out_.push_back(bracket);
    first_.pop_back();
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

void WriteExit(const WorkerExitRecord& exit, Json* json) {
  json->BeginObject();
  json->Field("local_rank", exit.local_rank);
  json->Field("global_rank", exit.global_rank);
  json->Field("exit_code", exit.exit_code);
  json->Field("signal", exit.signal);
  json->Field("description", DescribeExit(exit));
  json->Field("time_unix_ms", exit.time_unix_ms);
  json->EndObject();
}

void WriteRun(const RunStatusRecord& run, Json* json) {
  json->BeginObject();
  json->Field("run_id", run.run_id);
  json->Field("state", run.state);
  json->Field("outcome", run.outcome);
  json->Field("closed_reason", run.closed_reason);
  json->Field("round", run.round);
  json->Field("restart_count", run.restart_count);
  json->Field("max_restarts", run.max_restarts);
  json->Field("min_nodes", run.min_nodes);
  json->Field("max_nodes", run.max_nodes);
  json->Field("world_size", run.world_size);
  json->Key("nodes");
  json->BeginArray();
  for (const NodeStatusRecord& node : run.nodes) {
    json->BeginObject();
    json->Field("node_id", node.node_id);
    json->Field("host", node.host);
    json->Field("state", node.state);
    json->Field("group_rank", node.group_rank);
    json->Field("nproc", node.nproc);
    json->Field("rank_base", node.rank_base);
    // The global ranks this node's workers hold in the round, inclusive.
    json->Key("ranks");
    if (node.group_rank >= 0 && node.nproc > 0) {
      json->BeginArray();
      json->Number(node.rank_base);
      json->Number(static_cast<uint64_t>(node.rank_base) + node.nproc - 1);
      json->EndArray();
    } else {
      json->Null();
    }
    json->Field("heartbeat_age_ms", node.heartbeat_age_ms);
    if (!node.health.empty()) json->Field("health", node.health);
    json->EndObject();
  }
  json->EndArray();
  json->Key("last_failure");
  if (run.last_failure) {
    const FailureStatusRecord& failure = *run.last_failure;
    json->BeginObject();
    json->Field("round", failure.round);
    json->Field("node_id", failure.node_id);
    json->Field("host", failure.host);
    json->Key("root_cause");
    if (failure.cause) {
      json->BeginObject();
      json->Key("exit");
      WriteExit(failure.cause->exit, json);
      json->Field("message", failure.cause->message);
      json->Field("traceback", failure.cause->traceback);
      json->EndObject();
    } else {
      json->Null();
    }
    json->Field("detail", failure.detail);
    json->EndObject();
  } else {
    json->Null();
  }
  json->Key("worker_exits");
  json->BeginArray();
  for (const NodeExitsRecord& node : run.worker_exits) {
    json->BeginObject();
    json->Field("node_id", node.node_id);
    json->Field("host", node.host);
    json->Field("round", node.round);
    json->Key("exits");
    json->BeginArray();
    for (const WorkerExitRecord& exit : node.exits) WriteExit(exit, json);
    json->EndArray();
    json->EndObject();
  }
  json->EndArray();
  json->Key("stragglers");
  json->BeginArray();
  for (const ReplicaLagRecord& lag : run.stragglers) {
    json->BeginObject();
    json->Field("replica", lag.replica);
    json->Field("mean_lag_ms", std::round(lag.mean_lag_ms * 10) / 10);
    json->Field("last_lag_ms", std::round(lag.last_lag_ms * 10) / 10);
    json->Field("quorums", lag.quorums);
    json->Field("slowest", lag.slowest);
    json->EndObject();
  }
  json->EndArray();
  json->Key("slow_ranks");
  json->BeginArray();
  for (const SlowRankRecord& slow : run.slow_ranks) {
    json->BeginObject();
    json->Field("rank", slow.rank);
    json->Field("node_id", slow.node_id);
    json->Field("host", slow.host);
    json->Field("mean_step_ms", std::round(slow.mean_seconds * 10000) / 10);
    json->Field("times_median", std::round(slow.times_median * 100) / 100);
    json->Field("steps", slow.steps);
    json->EndObject();
  }
  json->EndArray();
  json->EndObject();
}

std::string FormatAge(int64_t ms) {
  if (ms < 0) ms = 0;
  char buf[32];
  if (ms < 60000) {
    std::snprintf(buf, sizeof buf, "%.1fs", static_cast<double>(ms) / 1000.0);
  } else if (ms < 3600000) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(ms / 60000),
                  static_cast<long long>((ms / 1000) % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(ms / 3600000),
                  static_cast<long long>((ms / 60000) % 60));
  }
  return buf;
}

std::string FormatTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm utc;
  gmtime_r(&seconds, &utc);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &utc);
  char out[64];
  std::snprintf(out, sizeof out, "%s.%03d UTC", buf, static_cast<int>(unix_ms % 1000));
  return out;
}

// Left-aligned columns, two spaces apart, every line indented.
std::string Table(const std::vector<std::vector<std::string>>& rows,
                  const std::string& indent) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i)
      widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string DescribeExit(const WorkerExitRecord& exit) {
  if (exit.signal != 0) {
    const char* abbrev = exit.signal > 0 ? sigabbrev_np(exit.signal) : nullptr;
    return abbrev ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", exit.signal);
  }
  return absl::StrCat("exit ", exit.exit_code);
}

std::string RenderStatusJson(const StatusSnapshot& snapshot) {
  Json json;
  json.BeginObject();
  json.Field("now_unix_ms", snapshot.now_unix_ms);
  if (!snapshot.version.empty()) {
    json.Field("version", snapshot.version);
    json.Field("commit", snapshot.commit);
  }
  if (snapshot.etcd) {
    json.Key("etcd");
    json.BeginObject();
    json.Field("leader_term", snapshot.etcd->leader_term);
    json.Key("reachable");
    json.Bool(snapshot.etcd->reachable);
    json.Field("member", snapshot.etcd->member);
    json.EndObject();
  }
  json.Key("runs");
  json.BeginArray();
  for (const RunStatusRecord& run : snapshot.runs) WriteRun(run, &json);
  json.EndArray();
  json.EndObject();
  return json.Take();
}

std::string RenderStatusTable(const StatusSnapshot& snapshot, int max_traceback_lines) {
  std::string out;
  if (snapshot.etcd) {
    const EtcdStatusRecord& etcd = *snapshot.etcd;
    if (etcd.reachable) {
      absl::StrAppend(&out, "etcd: leading in term ", etcd.leader_term, ", member ",
                      etcd.member, "\n");
    } else {
      absl::StrAppend(&out, "etcd: UNREACHABLE (leading in term ", etcd.leader_term,
                      ", last member ", etcd.member,
                      "): runs keep their round; no new round and no store write is "
                      "acknowledged until it is back\n");
    }
  }
  if (snapshot.runs.empty()) return out + "no runs\n";
  const size_t header = out.size();
  for (const RunStatusRecord& run : snapshot.runs) {
    if (out.size() > header) out += "\n";
    absl::StrAppend(&out, "run ", run.run_id, ": ", run.state);
    if (!run.outcome.empty()) absl::StrAppend(&out, " (", run.outcome, ")");
    absl::StrAppend(&out, ", round ", run.round, ", restarts ", run.restart_count, "/",
                    run.max_restarts, ", nodes ", run.min_nodes, "..", run.max_nodes,
                    ", world size ", run.world_size, "\n");
    if (!run.closed_reason.empty())
      absl::StrAppend(&out, "  closed: ", run.closed_reason, "\n");
    std::vector<std::vector<std::string>> rows = {
        {"NODE", "HOST", "STATE", "GROUP_RANK", "RANKS", "NPROC", "HEARTBEAT_AGE"}};
    for (const NodeStatusRecord& node : run.nodes) {
      const bool ranked = node.group_rank >= 0;
      rows.push_back(
          {node.node_id, node.host, node.state,
           ranked ? std::to_string(node.group_rank) : "-",
           ranked ? absl::StrCat(node.rank_base, "-",
                                 static_cast<uint64_t>(node.rank_base) + node.nproc - 1)
                  : "-",
           std::to_string(node.nproc), FormatAge(node.heartbeat_age_ms)});
    }
    if (run.nodes.empty()) {
      out += run.state == "abandoned"
                 ? "  (no live nodes: the run ends as aborted unless a node joins "
                   "within one lease)\n"
                 : "  (no nodes)\n";
    } else {
      out += Table(rows, "  ");
    }
    for (const NodeStatusRecord& node : run.nodes) {
      if (!node.health.empty())
        absl::StrAppend(&out, "  ", node.node_id, " unhealthy: ", node.health, "\n");
    }
    if (run.last_failure) {
      const FailureStatusRecord& failure = *run.last_failure;
      absl::StrAppend(&out, "  last failure: round ", failure.round, ", node ",
                      failure.node_id, " on ", failure.host);
      if (failure.cause) {
        const WorkerExitRecord& exit = failure.cause->exit;
        absl::StrAppend(&out, ": rank ", exit.global_rank, " (local ", exit.local_rank,
                        ") ", DescribeExit(exit), " at ", FormatTime(exit.time_unix_ms),
                        "\n");
        if (!failure.cause->message.empty())
          absl::StrAppend(&out, "    message: ", failure.cause->message, "\n");
        if (!failure.cause->traceback.empty()) {
          std::vector<std::string> lines =
              absl::StrSplit(failure.cause->traceback, '\n', absl::SkipEmpty());
          const size_t keep = static_cast<size_t>(std::max(0, max_traceback_lines));
          const size_t first = lines.size() > keep ? lines.size() - keep : 0;
          absl::StrAppend(&out, "    traceback",
                          first > 0 ? absl::StrCat(" (last ", keep, " lines)") : "",
                          ":\n");
          for (size_t i = first; i < lines.size(); ++i)
            absl::StrAppend(&out, "      ", lines[i], "\n");
        }
      } else {
        absl::StrAppend(&out, "\n");
        std::vector<std::string> lines =
            absl::StrSplit(failure.detail, '\n', absl::SkipEmpty());
        for (const std::string& line : lines) absl::StrAppend(&out, "    ", line, "\n");
      }
    }
    for (const NodeExitsRecord& node : run.worker_exits) {
      std::vector<std::string> parts;
      for (const WorkerExitRecord& exit : node.exits)
        parts.push_back(absl::StrCat("rank ", exit.global_rank, " ", DescribeExit(exit)));
      absl::StrAppend(&out, "  worker exits, round ", node.round, ", ", node.node_id,
                      ": ", parts.empty() ? "none" : "", "");
      for (size_t i = 0; i < parts.size(); ++i)
        absl::StrAppend(&out, i ? ", " : "", parts[i]);
      out += "\n";
    }
    for (const ReplicaLagRecord& lag : run.stragglers) {
      absl::StrAppend(&out, "  replica group ", lag.replica, ": ",
                      absl::StrFormat("%.1f", lag.mean_lag_ms),
                      " ms behind the first at the step quorum (mean), last at ",
                      lag.slowest, " of ", lag.quorums, "\n");
    }
    for (const SlowRankRecord& slow : run.slow_ranks) {
      absl::StrAppend(&out, "  slow rank ", slow.rank, " on ", slow.node_id, ": ",
                      absl::StrFormat("%.1f ms a step, %.2fx the median",
                                      slow.mean_seconds * 1000, slow.times_median),
                      "\n");
    }
  }
  return out;
}

}  // namespace meshrun::rdzv
