#include "server/dataserver/grpc_dataserver_service.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/common/grpc_status.h"
#include "server/common/logging.h"

namespace sluice::dataserver {
namespace {

void ReleaseOwner(void* owner) {
  delete static_cast<std::shared_ptr<const void>*>(owner);
}

void CountError(DataServerService* service, const absl::Status& status) {
  if (status.ok() || service->metrics() == nullptr) return;
  if (DataServerService::IsHandedBack(status)) {
    service->metrics()->streams_handed_back.Increment();
    return;
  }
  service->metrics()
      ->StreamErrors(absl::StatusCodeToString(status.code()))
      .Increment();
}

// The `done` of a unary call of the service: finishes `reactor` with the
// answer in `response`, or with the error (counted).
template <typename Response>
std::function<void(absl::StatusOr<Response>)> FinishWith(
    DataServerService* service, grpc::ServerUnaryReactor* reactor,
    Response* response) {
  return [service, reactor, response](absl::StatusOr<Response> answer) {
    if (!answer.ok()) {
      CountError(service, answer.status());
      reactor->Finish(ToGrpcStatus(answer.status()));
      return;
    }
    *response = *std::move(answer);
    reactor->Finish(grpc::Status::OK);
  };
}

// Pumps one SampleStream into a server stream.
class ReadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ReadReactor(DataServerService* service, GrpcDataServerService* owner,
              absl::StatusOr<std::shared_ptr<SampleStream>> stream)
      : service_(service), owner_(owner) {
    owner_->CallStarted();
    if (!stream.ok()) {
      CountError(service_, stream.status());
      FinishOnce(stream.status());
      return;
    }
    stream_ = *std::move(stream);
    Pump();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      stream_->Cancel();
      FinishOnce(absl::CancelledError("client went away"));
      return;
    }
    Pump();
  }

  void OnCancel() override {
    if (stream_ != nullptr) stream_->Cancel();
  }

  void OnDone() override {
    owner_->CallDone();
    delete this;
  }

 private:
  void Pump() {
    stream_->Next([this](absl::StatusOr<std::optional<EncodedMessage>> next) {
      if (!next.ok()) {
        if (!absl::IsCancelled(next.status()))
          CountError(service_, next.status());
        FinishOnce(next.status());
        return;
      }
      if (!next->has_value()) {
        FinishOnce(absl::OkStatus());
        return;
      }
      if (service_->handing_back()) {
        // Draining: this batch is not sent; the reader gives back the rest
        // of the lease from the last sample it received.
        stream_->Cancel();
        const absl::Status handed_back = DataServerService::HandedBackStatus(
            "data server draining (shutting down): the rest of this stream's "
            "lease handed back");
        CountError(service_, handed_back);
        FinishOnce(handed_back);
        return;
      }
      buffer_ = ToByteBuffer(**next);
      StartWrite(&buffer_);
    });
  }

  void FinishOnce(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(ToGrpcStatus(status));
  }

  DataServerService* const service_;
  GrpcDataServerService* const owner_;
  std::shared_ptr<SampleStream> stream_;
  grpc::ByteBuffer buffer_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ByteBuffer ToByteBuffer(const EncodedMessage& message) {
  std::vector<grpc::Slice> slices;
  slices.reserve(message.chunks().size());
  for (const EncodedMessage::Chunk& chunk : message.chunks()) {
    slices.emplace_back(const_cast<char*>(chunk.bytes.data()),
                        chunk.bytes.size(), &ReleaseOwner,
                        new std::shared_ptr<const void>(chunk.owner));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GrpcDataServerService::ReadSamples(
    grpc::CallbackServerContext*, const grpc::ByteBuffer* request) {
  std::vector<grpc::Slice> slices;
  v1::ReadRequest parsed;
  std::string bytes;
  if (request->Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  if (!parsed.ParseFromString(bytes)) {
    return new ReadReactor(
        service_, this,
        absl::InvalidArgumentError("ReadRequest does not parse"));
  }
  return new ReadReactor(service_, this, service_->ReadSamples(parsed));
}

void GrpcDataServerService::CallStarted() {
  absl::MutexLock lock(&mu_);
  ++open_calls_;
}

void GrpcDataServerService::CallDone() {
  absl::MutexLock lock(&mu_);
  --open_calls_;
  last_call_done_ = absl::Now();
}

bool GrpcDataServerService::AwaitQuiet(absl::Duration quiet,
                                       absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this] {
    mu_.AssertHeld();
    return open_calls_ == 0;
  };
  auto busy = [this] {
    mu_.AssertHeld();
    return open_calls_ > 0;
  };
  while (true) {
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) return false;
    const absl::Time quiet_from = last_call_done_ + quiet;
    if (absl::Now() >= quiet_from) return true;
    // A call that opens meanwhile starts the wait over.
    if (!mu_.AwaitWithDeadline(absl::Condition(&busy),
                               std::min(quiet_from, deadline))) {
      return absl::Now() >= quiet_from;
    }
  }
}

grpc::ServerUnaryReactor* GrpcDataServerService::ReplaySample(
    grpc::CallbackServerContext* context, const v1::ReadRequest* request,
    v1::ReplayedSample* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  service_->ReplaySample(*request, FinishWith(service_, reactor, response));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcDataServerService::ReplayDraws(
    grpc::CallbackServerContext* context, const v1::ReplayDrawsRequest* request,
    v1::ReplayDrawsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  service_->ReplayDraws(*request, FinishWith(service_, reactor, response));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcDataServerService::IndexShard(
    grpc::CallbackServerContext* context, const v1::IndexShardRequest* request,
    v1::ShardIndex* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  service_->IndexShardAsync(*request, FinishWith(service_, reactor, response));
  return reactor;
}

}  // namespace sluice::dataserver
