#pragma once

// Metrics for the daemon's /metrics: counters and histograms that the code
// updates where an event happens, and their rendering in Prometheus' text
// exposition format 0.0.4. No I/O; the HTTP server serves the text.
//
// Counter and Histogram are thread-safe and lock-free to update (relaxed
// atomics: a scrape may see one update without a neighbouring one, never a
// torn value). The Metric* structs are plain data, built per scrape.

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace meshrun::rdzv {

class Counter {
 public:
  void Inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

struct HistogramSnapshot {
  std::vector<double> bounds;        // upper bounds, ascending; +Inf implied
  std::vector<uint64_t> cumulative;  // per bound, then +Inf (= count)
  double sum = 0;
  uint64_t count = 0;
};

class Histogram {
 public:
  // REQUIRES: `bounds` ascending and finite.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  HistogramSnapshot Snapshot() const;

 private:
  const std::vector<double> bounds_;
  std::vector<std::atomic<uint64_t>> buckets_;  // per bound, then +Inf
  std::atomic<uint64_t> sum_bits_{0};           // a double, CAS-updated
};

// Latency buckets in seconds, 50 us .. 60 s: store ops range from a map
// lookup to a barrier that waits for the slowest rank.
std::vector<double> LatencyBuckets();

using Labels = std::vector<std::pair<std::string, std::string>>;

struct MetricSample {
  std::string suffix;  // "", "_bucket", "_sum", "_count"
  Labels labels;
  double value = 0;
};

struct MetricFamily {
  MetricFamily(std::string name, std::string help, std::string type)
      : name(std::move(name)), help(std::move(help)), type(std::move(type)) {}

  std::string name;
  std::string help;
  std::string type;  // counter, gauge, histogram
  std::vector<MetricSample> samples;

  void Add(Labels labels, double value) {
    samples.push_back({"", std::move(labels), value});
  }
  // The _bucket (with le), _sum and _count samples of one labelled histogram.
  void AddHistogram(const Labels& labels, const HistogramSnapshot& histogram);
};

// The text exposition format 0.0.4: # HELP, # TYPE, then the samples; label
// values escaped (\\, \", \n), integers printed exactly, +Inf as such.
std::string RenderPrometheusText(const std::vector<MetricFamily>& families);

// Prometheus' content type for the above.
inline constexpr const char* kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

}  // namespace meshrun::rdzv
