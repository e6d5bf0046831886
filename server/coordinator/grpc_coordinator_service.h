// GrpcCoordinatorService: the gRPC adapter over CoordinatorService. Converts
// protos and statuses, runs Session streams as callback reactors, and runs
// the lease-expiry thread. No coordination logic lives here.
#ifndef SLUICE_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_
#define SLUICE_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_

#include <memory>
#include <thread>

#include "absl/container/flat_hash_set.h"

#include "absl/synchronization/mutex.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/once_barrier.h"
#include "sluice/v1/coordinator.grpc.pb.h"

namespace sluice {

class RegistrationReactor;

class GrpcCoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  // `admin_token` non-empty: CreateJob and DeleteJob need the metadata
  // "authorization: Bearer <admin_token>" (UNAUTHENTICATED without it,
  // PERMISSION_DENIED with another token); trainers' calls need none.
  explicit GrpcCoordinatorService(CoordinatorService* service, std::string admin_token = "");
  ~GrpcCoordinatorService() override;

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* ctx,
                                      const v1::CreateJobRequest* req, v1::Job* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const v1::GetJobRequest* req, v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx,
                                      const v1::DeleteJobRequest* req,
                                      v1::DeleteJobResponse* resp) override;
  grpc::ServerBidiReactor<v1::TrainerMessage, v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* ctx) override;

  grpc::ServerBidiReactor<v1::DataServerMessage, v1::CoordinatorToDataServer>*
  RegisterDataServer(grpc::CallbackServerContext* ctx) override;
  grpc::ServerBidiReactor<v1::OnceRequest, v1::OnceResponse>* Once(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx,
                                    const v1::BarrierRequest* req,
                                    v1::BarrierResponse* resp) override;

  // Ends every session and registration (UNAVAILABLE) and stops the expiry
  // thread.
  void Drain();
  // Called by a registration stream when it is done.
  void ForgetRegistration(RegistrationReactor* reactor);

 private:
  void ExpiryLoop();

  // OK for an operator's call (see the constructor); `what` names the RPC.
  absl::Status AuthorizeAdmin(const grpc::CallbackServerContext* ctx,
                              absl::string_view what) const;

  CoordinatorService* const service_;
  const std::string admin_token_;
  OnceBarrier once_barrier_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread expiry_thread_;
  absl::flat_hash_set<RegistrationReactor*> registrations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_
