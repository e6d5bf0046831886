#include "server/dataserver/dataserver_metrics.h"

namespace sluice::dataserver {
namespace {

prometheus::Family<prometheus::Counter>& Counters(prometheus::Registry& r,
                                                  const char* name,
                                                  const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

}  // namespace

const char* CorruptReasonLabel(CorruptReason reason) {
  switch (reason) {
    case CorruptReason::kDamagedTar: return "damaged_tar";
    case CorruptReason::kDuplicateField: return "duplicate_field";
    case CorruptReason::kUndecodable: return "undecodable";
    case CorruptReason::kLost: return "lost_after_damage";
  }
  return "unknown";
}

DataServerMetrics::DataServerMetrics(prometheus::Registry& r)
    : samples_served(Counters(r, "sluice_dataserver_samples_served_total",
                              "Samples sent to trainers (skipped ones included).")
                         .Add({})),
      bytes_served(Counters(r, "sluice_dataserver_bytes_served_total",
                            "Bytes of SampleBatch messages sent to trainers.")
                       .Add({})),
      active_streams(prometheus::BuildGauge()
                         .Name("sluice_dataserver_active_streams")
                         .Help("ReadSamples streams in progress.")
                         .Register(r)
                         .Add({})),
      index_cache_hits(Counters(r, "sluice_dataserver_index_cache_hits_total",
                                "Shard index lookups served from the cache.")
                           .Add({})),
      index_cache_misses(Counters(r, "sluice_dataserver_index_cache_misses_total",
                                  "Shard index lookups that scanned the shard.")
                             .Add({})),
      decode_seconds_(prometheus::BuildHistogram()
                          .Name("sluice_dataserver_decode_seconds")
                          .Help("Time to decode one field, by codec.")
                          .Register(r)),
      skipped_(Counters(r, "sluice_dataserver_samples_skipped_total",
                        "Samples reported as skipped (on_corrupt=skip), by reason.")),
      corrupt_(Counters(r, "sluice_dataserver_corrupt_samples_total",
                        "Corrupt samples found, under either policy, by reason.")),
      stream_errors_(Counters(r, "sluice_dataserver_stream_errors_total",
                              "ReadSamples/IndexShard calls that ended in an "
                              "error, by gRPC status code.")) {}

prometheus::Histogram& DataServerMetrics::DecodeSeconds(const char* codec) {
  // JPEG decodes take ~1 ms at 500x375 on one core; text/int take microseconds.
  return decode_seconds_.Add(
      {{"codec", codec}},
      prometheus::Histogram::BucketBoundaries{0.00001, 0.00005, 0.0001, 0.00025,
                                              0.0005, 0.001, 0.0025, 0.005,
                                              0.01, 0.025, 0.1});
}

prometheus::Counter& DataServerMetrics::Skipped(CorruptReason reason) {
  return skipped_.Add({{"reason", CorruptReasonLabel(reason)}});
}

prometheus::Counter& DataServerMetrics::Corrupt(CorruptReason reason) {
  return corrupt_.Add({{"reason", CorruptReasonLabel(reason)}});
}

prometheus::Counter& DataServerMetrics::StreamErrors(const std::string& code) {
  return stream_errors_.Add({{"code", code}});
}

}  // namespace sluice::dataserver
