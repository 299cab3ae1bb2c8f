#include "rendezvous/status/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace meshrun::rdzv {
namespace {

uint64_t Bits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

double FromBits(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Counts stay exact up to 2^53; print them without an exponent.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  return buf;
}

void AppendEscaped(const std::string& text, bool escape_quotes, std::string* out) {
  for (char c : text) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '"' && escape_quotes) {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1) {}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  uint64_t old_bits = sum_bits_.load(std::memory_order_relaxed);
  while (!sum_bits_.compare_exchange_weak(old_bits, Bits(FromBits(old_bits) + value),
                                          std::memory_order_relaxed)) {
  }
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot snapshot;
  snapshot.bounds = bounds_;
  snapshot.cumulative.reserve(buckets_.size());
  uint64_t running = 0;
  for (const auto& bucket : buckets_) {
    running += bucket.load(std::memory_order_relaxed);
    snapshot.cumulative.push_back(running);
  }
  snapshot.count = running;
  snapshot.sum = FromBits(sum_bits_.load(std::memory_order_relaxed));
  return snapshot;
}

std::vector<double> LatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,    0.1,    0.25,    0.5,    1,     2.5,    10,    60};
}

void MetricFamily::AddHistogram(const Labels& labels,
                                const HistogramSnapshot& histogram) {
  for (size_t i = 0; i <= histogram.bounds.size(); ++i) {
    Labels with_le = labels;
    with_le.emplace_back("le", i < histogram.bounds.size()
                                   ? FormatValue(histogram.bounds[i])
                                   : std::string("+Inf"));
    samples.push_back(
        {"_bucket", std::move(with_le), static_cast<double>(histogram.cumulative[i])});
  }
  samples.push_back({"_sum", labels, histogram.sum});
  samples.push_back({"_count", labels, static_cast<double>(histogram.count)});
}

std::string RenderPrometheusText(const std::vector<MetricFamily>& families) {
  std::string out;
  for (const MetricFamily& family : families) {
    absl::StrAppend(&out, "# HELP ", family.name, " ");
    AppendEscaped(family.help, /*escape_quotes=*/false, &out);
    absl::StrAppend(&out, "\n# TYPE ", family.name, " ", family.type, "\n");
    for (const MetricSample& sample : family.samples) {
      absl::StrAppend(&out, family.name, sample.suffix);
      if (!sample.labels.empty()) {
        out.push_back('{');
        for (size_t i = 0; i < sample.labels.size(); ++i) {
          if (i > 0) out.push_back(',');
          absl::StrAppend(&out, sample.labels[i].first, "=\"");
          AppendEscaped(sample.labels[i].second, /*escape_quotes=*/true, &out);
          out.push_back('"');
        }
        out.push_back('}');
      }
      absl::StrAppend(&out, " ", FormatValue(sample.value), "\n");
    }
  }
  return out;
}

}  // namespace meshrun::rdzv
