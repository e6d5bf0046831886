// gRPC adapter of the data server: ReadSamples is a raw (ByteBuffer)
// callback method so that encoded SampleBatch chunks go to gRPC as slices
// over their own buffers; the reactor only pumps a SampleStream (one write in
// flight, Finish exactly once). IndexShard scans on the service's pool, off
// gRPC's callback threads.
#ifndef SLUICE_SERVER_DATASERVER_GRPC_DATASERVER_SERVICE_H_
#define SLUICE_SERVER_DATASERVER_GRPC_DATASERVER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/dataserver/dataserver_service.h"
#include "sluice/v1/dataserver.grpc.pb.h"

namespace sluice::dataserver {

// The message as a ByteBuffer of slices that keep each chunk's owner alive.
grpc::ByteBuffer ToByteBuffer(const EncodedMessage& message);

class GrpcDataServerService final
    : public v1::DataServer::WithRawCallbackMethod_ReadSamples<
          v1::DataServer::CallbackService> {
 public:
  explicit GrpcDataServerService(DataServerService* service)
      : service_(service) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadSamples(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ReplaySample(grpc::CallbackServerContext* context,
                                         const v1::ReadRequest* request,
                                         v1::ReplayedSample* response) override;
  grpc::ServerUnaryReactor* ReplayDraws(
      grpc::CallbackServerContext* context,
      const v1::ReplayDrawsRequest* request,
      v1::ReplayDrawsResponse* response) override;
  grpc::ServerUnaryReactor* IndexShard(grpc::CallbackServerContext* context,
                                       const v1::IndexShardRequest* request,
                                       v1::ShardIndex* response) override;

  // Waits until no ReadSamples call has been open for `quiet` (a call is
  // open until its status has gone out, after its last sample), or until
  // `deadline`; true when quiet. While draining, the calls that arrive are
  // refused at once (HandedBack) and start the wait over: readers whose
  // next unit was routed here learn of the drain before the server goes.
  bool AwaitQuiet(absl::Duration quiet, absl::Time deadline);
  int open_calls() const {
    absl::MutexLock lock(&mu_);
    return open_calls_;
  }

  // The reactor's bookkeeping.
  void CallStarted();
  void CallDone();

 private:
  DataServerService* const service_;
  mutable absl::Mutex mu_;
  int open_calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_call_done_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_GRPC_DATASERVER_SERVICE_H_
