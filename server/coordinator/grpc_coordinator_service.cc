#include "server/coordinator/grpc_coordinator_service.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "server/common/grpc_status.h"
#include "server/common/grpc_stream_writer.h"
#include "server/common/quote.h"
#include "server/coordinator/job_spec.h"

namespace sluice {
namespace {

using v1::CoordinatorMessage;
using v1::TrainerMessage;

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx,
                               const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A reply that fills `resp` and finishes the call (from whichever thread
// the service answers on; the call and `resp` live until Finish).
CoordinatorService::JobReply JobInto(grpc::ServerUnaryReactor* reactor,
                                     v1::Job* resp) {
  return [reactor, resp](absl::StatusOr<v1::Job> job) {
    if (!job.ok()) return reactor->Finish(ToGrpcStatus(job.status()));
    *resp = *std::move(job);
    reactor->Finish(grpc::Status::OK);
  };
}

// A stream refused before it starts (a standby's): finishes with `status`
// at once.
template <typename Request, typename Response>
class RefusedStream final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit RefusedStream(const absl::Status& status) {
    this->Finish(ToGrpcStatus(status));
  }
  void OnDone() override { delete this; }
};

// One Session stream. The service talks to it through Sink, which outlives
// the reactor: after OnDone, messages for the stream are dropped.
class SessionReactor
    : public grpc::ServerBidiReactor<TrainerMessage, CoordinatorMessage> {
 public:
  class Sink : public SessionSink {
   public:
    explicit Sink(SessionReactor* reactor) : writer_(reactor) {}
    void Send(CoordinatorMessage m) override { writer_.Send(std::move(m)); }
    void Finish(const absl::Status& status) override {
      writer_.Finish(ToGrpcStatus(status));
    }
    void OnWriteDone(bool ok) { writer_.OnWriteDone(ok); }
    void Detach() { writer_.Detach(); }

   private:
    StreamWriter<SessionReactor, CoordinatorMessage> writer_;
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

namespace {

// What the call presents: its client certificate's common name and subject
// alternative names (over mutual TLS) and its authorization metadata.
Peer PeerOf(const grpc::CallbackServerContext* ctx) {
  Peer peer;
  std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const char* property :
         {"x509_common_name", "x509_subject_alternative_name"}) {
      for (const grpc::string_ref& value : auth->FindPropertyValues(property))
        peer.identities.emplace_back(value.data(), value.size());
    }
  }
  const auto& metadata = ctx->client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end())
    peer.authorization.emplace(it->second.data(), it->second.size());
  return peer;
}

}  // namespace

// One data server's registration stream: Register, then heartbeats in;
// DataServerRegistered, then prefetch hints out (through Sink, queued). The
// server is dropped from routing when the stream ends.
class RegistrationReactor
    : public grpc::ServerBidiReactor<v1::DataServerMessage,
                                     v1::CoordinatorToDataServer> {
 public:
  class Sink : public DataServerSink {
   public:
    explicit Sink(RegistrationReactor* reactor) : writer_(reactor) {}
    void Send(const v1::CoordinatorToDataServer& m) override {
      writer_.Send(m);
    }
    void Finish(const absl::Status& status) {
      writer_.Finish(ToGrpcStatus(status));
    }
    void OnWriteDone(bool ok) { writer_.OnWriteDone(ok); }
    void Detach() { writer_.Detach(); }

   private:
    StreamWriter<RegistrationReactor, v1::CoordinatorToDataServer> writer_;
  };

  RegistrationReactor(CoordinatorService* service,
                      GrpcCoordinatorService* owner, absl::Status allowed)
      : service_(service),
        owner_(owner),
        sink_(std::make_shared<Sink>(this)),
        allowed_(std::move(allowed)) {
    StartRead(&in_);
  }

  // Reads are serialized by gRPC; id_ is touched only here and in OnDone.
  void OnReadDone(bool ok) override {
    if (!ok) {
      sink_->Finish(absl::OkStatus());
      return;
    }
    if (in_.has_register_()) {
      if (!allowed_.ok()) {
        sink_->Finish(allowed_);
        return;
      }
      if (absl::Status allowed = service_->CheckRegistration(in_.register_());
          !allowed.ok()) {
        sink_->Finish(allowed);
        return;
      }
      if (id_ == 0) {
        id_ = service_->RegisterDataServer(
            in_.register_().address(), in_.register_().capacity(), sink_,
            in_.register_().max_fence_seen(), in_.register_().node(),
            in_.register_().pool());
      }
    } else if (in_.has_heartbeat()) {
      if (id_ == 0) {
        sink_->Finish(absl::FailedPreconditionError(
            "data server sent a heartbeat before registering"));
        return;
      }
      if (absl::Status fence = CheckFenceSeen("heartbeat.max_fence_seen",
                                              in_.heartbeat().max_fence_seen());
          !fence.ok()) {
        sink_->Finish(fence);
        return;
      }
      const v1::DataServerHeartbeat& beat = in_.heartbeat();
      DataServerRegistry::Load load;
      load.samples_served = std::max<int64_t>(beat.samples_served(), 0);
      load.cpu_seconds = std::isfinite(beat.cpu_seconds())
                             ? std::max(beat.cpu_seconds(), 0.0)
                             : 0.0;
      load.cores = std::max(beat.cores(), 0);
      service_->DataServerHeartbeat(id_, beat.max_fence_seen(), &load);
      v1::CoordinatorToDataServer ack;
      ack.mutable_heartbeat_ack();
      sink_->Send(ack);
    } else if (in_.has_draining()) {
      if (id_ == 0) {
        sink_->Finish(absl::FailedPreconditionError(
            "data server sent draining before registering"));
        return;
      }
      service_->DataServerDraining(id_);
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }

  // Drain ends the stream through it (it outlives the reactor), so the
  // server reconnects elsewhere/later.
  std::shared_ptr<Sink> sink() const { return sink_; }

  void OnDone() override {
    owner_->ForgetRegistration(this);
    sink_->Detach();
    if (id_ != 0) service_->UnregisterDataServer(id_);
    delete this;
  }

 private:
  CoordinatorService* const service_;
  GrpcCoordinatorService* const owner_;
  std::shared_ptr<Sink> sink_;
  v1::DataServerMessage in_;
  // Not OK: the stream may not register (its certificate is not a data
  // server's); said when it tries.
  const absl::Status allowed_;
  int64_t id_ = 0;
};

// One Once stream: reads go to OnceBarrier; responses are queued with one
// write in flight; Finish exactly once, after queued writes.
class OnceReactor
    : public grpc::ServerBidiReactor<v1::OnceRequest, v1::OnceResponse> {
 public:
  class Sink : public OnceSink {
   public:
    explicit Sink(OnceReactor* r) : writer_(r) {}
    void Send(const v1::OnceResponse& m) override { writer_.Send(m); }
    void Finish(const absl::Status& status) override {
      writer_.Finish(ToGrpcStatus(status));
    }
    void OnWriteDone(bool ok) { writer_.OnWriteDone(ok); }
    void Detach() { writer_.Detach(); }
    bool finishing() { return writer_.finishing(); }

   private:
    StreamWriter<OnceReactor, v1::OnceResponse> writer_;
  };

  explicit OnceReactor(OnceBarrier* logic)
      : logic_(logic), sink_(std::make_shared<Sink>(this)) {
    id_ = logic_->OpenOnce(sink_);
    if (!sink_->finishing()) StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      // The caller went away (or half-closed): a runner loses its run.
      logic_->CloseOnce(id_);
      sink_->Finish(absl::CancelledError("once: stream closed by the caller"));
      return;
    }
    logic_->OnOnceMessage(id_, in_);
    if (!sink_->finishing())
      StartRead(&in_);  // no new operations once finishing
  }
  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnDone() override {
    sink_->Detach();
    logic_->CloseOnce(id_);
    delete this;
  }

 private:
  OnceBarrier* const logic_;
  std::shared_ptr<Sink> sink_;
  int64_t id_ = 0;
  v1::OnceRequest in_;
};

GrpcCoordinatorService::GrpcCoordinatorService(CoordinatorService* service,
                                               AccessPolicy access)
    : owned_gate_(service), gate_(&owned_gate_), admin_(std::move(access)) {}

GrpcCoordinatorService::GrpcCoordinatorService(const LeadershipGate* gate,
                                               AccessPolicy access)
    : gate_(gate), admin_(std::move(access)) {}

GrpcCoordinatorService::~GrpcCoordinatorService() = default;

grpc::ServerUnaryReactor* GrpcCoordinatorService::Refuse(
    grpc::CallbackServerContext* ctx) const {
  return Done(ctx, gate_->NotLeaderStatus());
}

void GrpcCoordinatorService::Drain() {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) return;
  service->Drain();
  service->once_barrier().Drain();
  std::vector<std::shared_ptr<RegistrationReactor::Sink>> registrations;
  {
    absl::MutexLock lock(
        &mu_);  // a reactor leaves the set before it is deleted
    for (RegistrationReactor* r : registrations_)
      registrations.push_back(r->sink());
  }
  for (const auto& sink : registrations) {
    sink->Finish(absl::UnavailableError("coordinator is shutting down"));
  }
}

grpc::ServerBidiReactor<v1::OnceRequest, v1::OnceResponse>*
GrpcCoordinatorService::Once(grpc::CallbackServerContext*) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) {
    return new RefusedStream<v1::OnceRequest, v1::OnceResponse>(
        gate_->NotLeaderStatus());
  }
  return new OnceReactor(&service->once_barrier());
}

namespace {

// One Barrier call. A call that ends first (the caller died or gave up)
// withdraws its arrival, so it no longer counts towards the generation.
class BarrierReactor : public grpc::ServerUnaryReactor {
 public:
  BarrierReactor(OnceBarrier* logic, const v1::BarrierRequest& request,
                 v1::BarrierResponse* response)
      : logic_(logic) {
    // gRPC calls OnCancel only after this reactor is returned, so waiter_ is
    // set by then; a Finish from inside Barrier is held until then.
    waiter_ = logic_->Barrier(
        request, [this, response](absl::StatusOr<v1::BarrierResponse> r) {
          const grpc::Status status = ToGrpcStatus(r.status());
          if (r.ok()) *response = *std::move(r);
          Finish(status);
        });
  }
  void OnCancel() override {
    if (waiter_ != 0) logic_->CancelBarrier(waiter_);
  }
  void OnDone() override { delete this; }

 private:
  OnceBarrier* const logic_;
  int64_t waiter_ = 0;
};

}  // namespace

grpc::ServerUnaryReactor* GrpcCoordinatorService::Barrier(
    grpc::CallbackServerContext* ctx, const v1::BarrierRequest* req,
    v1::BarrierResponse* resp) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) return Refuse(ctx);
  return new BarrierReactor(&service->once_barrier(), *req, resp);
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::ListOnce(
    grpc::CallbackServerContext* ctx, const v1::ListOnceRequest* req,
    v1::ListOnceResponse* resp) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) return Refuse(ctx);
  if (req->scope().size() > kMaxKeyBytes) {
    return Done(ctx, absl::InvalidArgumentError(absl::StrCat(
                         "scope is longer than ", kMaxKeyBytes, " bytes")));
  }
  std::vector<v1::OnceStep> steps =
      service->once_barrier().Running(req->scope());
  for (const v1::internal::OnceFinished& f :
       service->ListOnceFinished(req->scope())) {
    v1::OnceStep& step = steps.emplace_back();
    step.set_scope(f.scope());
    step.set_name(f.name());
    step.set_run(f.run());
    if (f.error().empty()) {
      step.set_state(v1::OnceStep::STATE_DONE);
      step.set_result(f.result());
    } else {
      step.set_state(v1::OnceStep::STATE_FAILED);
      step.set_error(f.error());
    }
  }
  std::sort(steps.begin(), steps.end(),
            [](const v1::OnceStep& a, const v1::OnceStep& b) {
              return std::tie(a.scope(), a.name()) <
                     std::tie(b.scope(), b.name());
            });
  for (v1::OnceStep& step : steps) *resp->add_steps() = std::move(step);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::ResetOnce(
    grpc::CallbackServerContext* ctx, const v1::ResetOnceRequest* req,
    v1::ResetOnceResponse*) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) return Refuse(ctx);
  if (absl::Status allowed = AuthorizeAdmin(ctx, "ResetOnce"); !allowed.ok()) {
    return Done(ctx, allowed);
  }
  if (req->name().empty()) {
    return Done(ctx, absl::InvalidArgumentError("ResetOnce: name is required"));
  }
  if (req->scope().size() > kMaxKeyBytes || req->name().size() > kMaxKeyBytes) {
    return Done(ctx, absl::InvalidArgumentError(
                         absl::StrCat("ResetOnce: scope and name are at most ",
                                      kMaxKeyBytes, " bytes")));
  }
  for (const v1::OnceStep& step :
       service->once_barrier().Running(req->scope())) {
    if (step.name() != req->name()) continue;
    return Done(
        ctx, absl::FailedPreconditionError(absl::StrCat(
                 "once ", req->scope(), "/", req->name(), " is running (run ",
                 step.run(), " by ",
                 step.runner().empty() ? "none yet" : step.runner(), ", ",
                 step.waiting(), " waiting): reset it once no one is in it")));
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  service->ResetOnce(req->scope(), req->name(), [reactor](absl::Status s) {
    reactor->Finish(ToGrpcStatus(s));
  });
  return reactor;
}

grpc::ServerBidiReactor<v1::DataServerMessage, v1::CoordinatorToDataServer>*
GrpcCoordinatorService::RegisterDataServer(grpc::CallbackServerContext* ctx) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) {
    return new RefusedStream<v1::DataServerMessage,
                             v1::CoordinatorToDataServer>(
        gate_->NotLeaderStatus());
  }
  absl::Status allowed = admin_.AuthorizeDataServer(PeerOf(ctx));
  auto* reactor = new RegistrationReactor(service, this, std::move(allowed));
  absl::MutexLock lock(&mu_);
  registrations_.insert(reactor);
  return reactor;
}

void GrpcCoordinatorService::ForgetRegistration(RegistrationReactor* reactor) {
  absl::MutexLock lock(&mu_);
  registrations_.erase(reactor);
}

absl::Status GrpcCoordinatorService::AuthorizeAdmin(
    const grpc::CallbackServerContext* ctx, absl::string_view what) const {
  return admin_.AuthorizeAdmin(PeerOf(ctx), what);
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::CreateJob(
    grpc::CallbackServerContext* ctx, const v1::CreateJobRequest* req,
    v1::Job* resp) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) return Refuse(ctx);
  if (absl::Status allowed = admin_.AuthorizeCreateJob(PeerOf(ctx), *req);
      !allowed.ok()) {
    return Done(ctx, allowed);
  }
  if (!req->copy_of().empty()) {
    if (absl::Status shape = CheckCopyRequest(*req); !shape.ok()) {
      return Done(ctx, shape);
    }
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  CoordinatorService::JobReply done = JobInto(reactor, resp);
  if (req->copy_of().empty()) {
    service->CreateJob(req->spec(), std::move(done));
  } else {
    service->CopyJob(req->copy_of(), req->spec().name(),
                     req->spec().world_size(), std::move(done));
  }
  return reactor;
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::GetJob(
    grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
    v1::Job* resp) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) return Refuse(ctx);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  service->GetJob(req->name(), req->include_manifest(), JobInto(reactor, resp));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::Audit(
    grpc::CallbackServerContext* ctx, const v1::AuditRequest* req,
    v1::AuditResponse* resp) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) return Refuse(ctx);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  service->Audit(*req, [reactor, resp](absl::StatusOr<v1::AuditResponse> r) {
    if (r.ok()) *resp = std::move(*r);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::ListJobs(
    grpc::CallbackServerContext* ctx, const v1::ListJobsRequest*,
    v1::ListJobsResponse* resp) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) return Refuse(ctx);
  // The fleet's figures are soft state (never journaled): read now.
  for (std::string& address : service->LiveDataServers())
    resp->add_live_data_servers(std::move(address));
  resp->set_desired_data_servers(service->desired_data_servers());
  resp->set_input_wait_share(service->input_wait_share());
  for (v1::PoolFleet& pool : service->PoolFleets())
    *resp->add_pools() = std::move(pool);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  service->ListJobs([reactor, resp](absl::StatusOr<std::vector<v1::Job>> jobs) {
    if (jobs.ok()) {
      for (v1::Job& job : *jobs) *resp->add_jobs() = std::move(job);
    }
    reactor->Finish(ToGrpcStatus(jobs.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* GrpcCoordinatorService::DeleteJob(
    grpc::CallbackServerContext* ctx, const v1::DeleteJobRequest* req,
    v1::DeleteJobResponse* resp) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) return Refuse(ctx);
  if (absl::Status allowed = AuthorizeAdmin(ctx, "DeleteJob"); !allowed.ok()) {
    return Done(ctx, allowed);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  service->DeleteJob(
      req->name(),
      [reactor, resp](absl::StatusOr<std::vector<std::string>> deleted) {
        if (deleted.ok()) {
          for (const std::string& name : *deleted) resp->add_deleted(name);
        }
        reactor->Finish(ToGrpcStatus(deleted.status()));
      });
  return reactor;
}

grpc::ServerBidiReactor<TrainerMessage, CoordinatorMessage>*
GrpcCoordinatorService::Session(grpc::CallbackServerContext*) {
  CoordinatorService* service = gate_->leading();
  if (service == nullptr) {
    return new RefusedStream<TrainerMessage, CoordinatorMessage>(
        gate_->NotLeaderStatus());
  }
  return new SessionReactor(service);
}

}  // namespace sluice
