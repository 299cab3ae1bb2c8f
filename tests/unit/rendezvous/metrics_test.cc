// Prometheus text rendering and the histogram / counter primitives.

#include "rendezvous/status/metrics.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace meshrun::rdzv {
namespace {

TEST(MetricsTest, RendersFamiliesInTextFormat) {
  MetricFamily ops("meshrun_store_ops_total", "Store operations.", "counter");
  ops.Add({{"op", "get"}}, 3);
  ops.Add({{"op", "set"}}, 12345678901);
  MetricFamily up("meshrun_up", "Whether it is up.", "gauge");
  up.Add({}, 1);
  EXPECT_EQ(RenderPrometheusText({ops, up}),
            "# HELP meshrun_store_ops_total Store operations.\n"
            "# TYPE meshrun_store_ops_total counter\n"
            "meshrun_store_ops_total{op=\"get\"} 3\n"
            "meshrun_store_ops_total{op=\"set\"} 12345678901\n"
            "# HELP meshrun_up Whether it is up.\n"
            "# TYPE meshrun_up gauge\n"
            "meshrun_up 1\n");
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  MetricFamily family("m", "a \\ help\nline", "gauge");
  family.Add({{"run", "a\"b\\c\nd"}, {"x", "y"}}, 0.5);
  EXPECT_EQ(RenderPrometheusText({family}),
            "# HELP m a \\\\ help\\nline\n"
            "# TYPE m gauge\n"
            "m{run=\"a\\\"b\\\\c\\nd\",x=\"y\"} 0.5\n");
}

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  Histogram histogram({0.001, 0.01, 1});
  histogram.Observe(0.0005);
  histogram.Observe(0.001);  // on the bound: counted in it (le)
  histogram.Observe(0.5);
  histogram.Observe(30);
  HistogramSnapshot snapshot = histogram.Snapshot();
  EXPECT_EQ(snapshot.cumulative, (std::vector<uint64_t>{2, 2, 3, 4}));
  EXPECT_EQ(snapshot.count, 4u);
  EXPECT_DOUBLE_EQ(snapshot.sum, 30.5015);

  MetricFamily family("lat_seconds", "Latency.", "histogram");
  family.AddHistogram({{"op", "get"}}, snapshot);
  EXPECT_EQ(RenderPrometheusText({family}),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{op=\"get\",le=\"0.001\"} 2\n"
            "lat_seconds_bucket{op=\"get\",le=\"0.01\"} 2\n"
            "lat_seconds_bucket{op=\"get\",le=\"1\"} 3\n"
            "lat_seconds_bucket{op=\"get\",le=\"+Inf\"} 4\n"
            "lat_seconds_sum{op=\"get\"} 30.5015\n"
            "lat_seconds_count{op=\"get\"} 4\n");
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  Counter counter;
  Histogram histogram(LatencyBuckets());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        counter.Inc();
        histogram.Observe(0.25);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(counter.value(), 40000u);
  HistogramSnapshot snapshot = histogram.Snapshot();
  EXPECT_EQ(snapshot.count, 40000u);
  EXPECT_DOUBLE_EQ(snapshot.sum, 10000.0);
}

}  // namespace
}  // namespace meshrun::rdzv
