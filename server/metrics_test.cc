// ring-server metrics of the hops between the coordinator and the stages: transport time
// and frame bytes per hop, labelled by the hop's name only (bounded by the stage count).
#include "server/metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "server/ring.h"

namespace ring {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST(ServerMetrics, HopLatencyAndBytesPerHop) {
  ServerMetrics m;
  m.ObserveHop(0, 0.00003, 100, 4096);
  m.ObserveHop(0, 0.002, 20, 4000);
  m.ObserveHop(1, 0.5, 4096, 1024);
  const std::string t = m.Render();
  EXPECT_TRUE(Has(t, "ring_hop_latency_seconds_count{hop=\"coordinator-stage0\"} 2")) << t;
  EXPECT_TRUE(Has(t, "ring_hop_latency_seconds_count{hop=\"coordinator-stage1\"} 1")) << t;
  // Loopback hops are tens of microseconds: the buckets resolve them.
  EXPECT_TRUE(Has(t, "ring_hop_latency_seconds_bucket{hop=\"coordinator-stage0\",le=\"5e-05\"} 1")) << t;
  EXPECT_TRUE(Has(t, "ring_hop_bytes_total{direction=\"sent\",hop=\"coordinator-stage0\"} 120")) << t;
  EXPECT_TRUE(Has(t, "ring_hop_bytes_total{direction=\"received\",hop=\"coordinator-stage0\"} 8096")) << t;
  EXPECT_TRUE(Has(t, "ring_hop_bytes_total{direction=\"received\",hop=\"coordinator-stage1\"} 1024")) << t;
}

TEST(ServerMetrics, AHopWithoutTheWorkersTimeCountsBytesButNoLatency) {
  ServerMetrics m;
  m.ObserveHop(2, std::nullopt, 10, 30);
  const std::string t = m.Render();
  EXPECT_FALSE(Has(t, "ring_hop_latency_seconds_count{hop=\"coordinator-stage2\"}")) << t;
  EXPECT_TRUE(Has(t, "ring_hop_bytes_total{direction=\"sent\",hop=\"coordinator-stage2\"} 10")) << t;
}

TEST(StageStep, TransportIsTheRoundTripMinusTheWorkersTime) {
  StageStep st;
  st.round_trip_seconds = 0.010;
  EXPECT_FALSE(st.TransportSeconds().has_value()) << "unknown without the worker's time";
  st.worker_seconds = 0.004;
  ASSERT_TRUE(st.TransportSeconds().has_value());
  EXPECT_DOUBLE_EQ(*st.TransportSeconds(), 0.006);
  st.worker_seconds = 0.011;  // never negative, whatever the clocks' resolution
  EXPECT_EQ(*st.TransportSeconds(), 0.0);
}

}  // namespace
}  // namespace ring
