#include "server/coordinator/grpc_coordinator_service.h"

#include <deque>

#include "server/common/grpc_status.h"

namespace sluice {
namespace {

using v1::CoordinatorMessage;
using v1::TrainerMessage;

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// One Session stream. The service talks to it through Sink, which outlives
// the reactor: after OnDone, messages for the stream are dropped.
class SessionReactor : public grpc::ServerBidiReactor<TrainerMessage, CoordinatorMessage> {
 public:
  class Sink : public SessionSink {
   public:
    explicit Sink(SessionReactor* reactor) : reactor_(reactor) {}
    void Send(const CoordinatorMessage& m) override {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finish_requested_) return;
      queue_.push_back(m);
      MaybeWriteLocked();
    }
    void Finish(const absl::Status& status) override {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finish_requested_) return;
      finish_requested_ = true;
      finish_status_ = ToGrpcStatus(status);
      MaybeWriteLocked();
    }
    void OnWriteDone(bool ok) {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) queue_.clear();  // the client is gone; Finish still runs once
      MaybeWriteLocked();
    }
    void Detach() {
      absl::MutexLock lock(&mu_);
      reactor_ = nullptr;
    }

   private:
    // One write in flight; Finish only after the queue drains.
    void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (reactor_ == nullptr || writing_) return;
      if (!queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
        reactor_->StartWrite(&current_);
      } else if (finish_requested_ && !finished_) {
        finished_ = true;
        reactor_->Finish(finish_status_);
      }
    }
    absl::Mutex mu_;
    SessionReactor* reactor_ ABSL_GUARDED_BY(mu_);
    std::deque<CoordinatorMessage> queue_ ABSL_GUARDED_BY(mu_);
    CoordinatorMessage current_ ABSL_GUARDED_BY(mu_);
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
    grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  };

  explicit SessionReactor(CoordinatorService* service)
      : service_(service), sink_(std::make_shared<Sink>(this)) {
    id_ = service_->OpenSession(sink_);
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // Client half-closed or the stream broke: leases stay until their TTL.
      service_->CloseSession(id_);
      sink_->Finish(absl::OkStatus());
      return;
    }
    service_->OnMessage(id_, incoming_);
    StartRead(&incoming_);
  }
  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnDone() override {
    sink_->Detach();
    service_->CloseSession(id_);
    delete this;
  }
  void OnCancel() override { service_->CloseSession(id_); }

 private:
  CoordinatorService* const service_;
  std::shared_ptr<Sink> sink_;
  int64_t id_ = 0;
  TrainerMessage incoming_;
};

}  // namespace

GrpcCoordinatorService::GrpcCoordinatorService(CoordinatorService* service)
    : service_(service), expiry_thread_([this] { ExpiryLoop(); }) {}

GrpcCoordinatorService::~GrpcCoordinatorService() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (expiry_thread_.joinable()) expiry_thread_.join();
}

void GrpcCoordinatorService::ExpiryLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Wake at the next expiry, but at least every 100 ms (new leases may
    // expire sooner than the one we saw).
    mu_.Unlock();
    const absl::Time next = std::min(service_->NextExpiry(), absl::Now() + absl::Milliseconds(100));
    mu_.Lock();
    mu_.AwaitWithDeadline(absl::Condition(&stopping_), next);
    if (stopping_) break;
    mu_.Unlock();
    service_->ExpireLeases();
    mu_.Lock();
  }
}

void GrpcCoordinatorService::Drain() {
  service_->Drain();
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::CreateJob(grpc::CallbackServerContext* ctx,
                                                            const v1::CreateJobRequest* req,
                                                            v1::Job* resp) {
  absl::StatusOr<v1::Job> job = service_->CreateJob(req->spec());
  if (job.ok()) *resp = std::move(*job);
  return Done(ctx, job.status());
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::GetJob(grpc::CallbackServerContext* ctx,
                                                         const v1::GetJobRequest* req,
                                                         v1::Job* resp) {
  absl::StatusOr<v1::Job> job = service_->GetJob(req->name(), req->include_manifest());
  if (job.ok()) *resp = std::move(*job);
  return Done(ctx, job.status());
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::ListJobs(grpc::CallbackServerContext* ctx,
                                                           const v1::ListJobsRequest*,
                                                           v1::ListJobsResponse* resp) {
  for (v1::Job& job : service_->ListJobs()) *resp->add_jobs() = std::move(job);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                            const v1::DeleteJobRequest* req,
                                                            v1::DeleteJobResponse*) {
  return Done(ctx, service_->DeleteJob(req->name()));
}

grpc::ServerBidiReactor<TrainerMessage, CoordinatorMessage>* GrpcCoordinatorService::Session(
    grpc::CallbackServerContext*) {
  return new SessionReactor(service_);
}

}  // namespace sluice
