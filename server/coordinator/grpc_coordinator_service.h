// GrpcCoordinatorService: the gRPC adapter over CoordinatorService. Converts
// protos and statuses, runs Session, Once, Barrier and registration streams
// as callback reactors, authorizes operators, and refuses every call while
// its LeadershipGate has no service (a standby). No coordination logic (and
// no thread of its own) lives here.
#ifndef SLUICE_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_
#define SLUICE_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator/access_policy.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/leadership_gate.h"
#include "server/coordinator/once_barrier.h"
#include "sluice/v1/coordinator.grpc.pb.h"

namespace sluice {

class RegistrationReactor;

class GrpcCoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  // With `access.enforce`, CreateJob, DeleteJob and ResetOnce need an
  // operator's
  // credential (see AccessPolicy): UNAUTHENTICATED without any,
  // PERMISSION_DENIED with one that is not an operator's; with nothing
  // configured to accept, they are PERMISSION_DENIED for everyone.
  explicit GrpcCoordinatorService(CoordinatorService* service,
                                  AccessPolicy access = {});
  // Serving whichever service `gate` leads, refusing calls while it leads
  // none (`gate` outlives this).
  explicit GrpcCoordinatorService(const LeadershipGate* gate,
                                  AccessPolicy access = {});

  const AccessPolicy& access() const { return admin_; }
  ~GrpcCoordinatorService() override;

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* ctx,
                                      const v1::CreateJobRequest* req,
                                      v1::Job* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx,
                                      const v1::DeleteJobRequest* req,
                                      v1::DeleteJobResponse* resp) override;
  grpc::ServerUnaryReactor* Audit(grpc::CallbackServerContext* ctx,
                                  const v1::AuditRequest* req,
                                  v1::AuditResponse* resp) override;
  grpc::ServerBidiReactor<v1::TrainerMessage, v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* ctx) override;

  grpc::ServerBidiReactor<v1::DataServerMessage, v1::CoordinatorToDataServer>*
  RegisterDataServer(grpc::CallbackServerContext* ctx) override;
  grpc::ServerBidiReactor<v1::OnceRequest, v1::OnceResponse>* Once(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx,
                                    const v1::BarrierRequest* req,
                                    v1::BarrierResponse* resp) override;
  grpc::ServerUnaryReactor* ListOnce(grpc::CallbackServerContext* ctx,
                                     const v1::ListOnceRequest* req,
                                     v1::ListOnceResponse* resp) override;
  // An operator's call, authorized as DeleteJob.
  grpc::ServerUnaryReactor* ResetOnce(grpc::CallbackServerContext* ctx,
                                      const v1::ResetOnceRequest* req,
                                      v1::ResetOnceResponse* resp) override;

  // Ends every session, Once stream and registration (UNAVAILABLE); the
  // service stops its expiry thread. Nothing while standing by.
  void Drain();
  // Called by a registration stream when it is done.
  void ForgetRegistration(RegistrationReactor* reactor);

 private:
  // OK for an operator's call (see the constructor); `what` names the RPC.
  absl::Status AuthorizeAdmin(const grpc::CallbackServerContext* ctx,
                              absl::string_view what) const;

  // A standby's refusal of a unary call.
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx) const;

  const LeadershipGate owned_gate_;  // when built over one service
  const LeadershipGate* const gate_;
  const AccessPolicy admin_;
  absl::Mutex mu_;
  absl::flat_hash_set<RegistrationReactor*> registrations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_
