// CoordinatorFrontDoor: the Coordinator gRPC service a coordinator whose
// journal is in etcd registers. It listens from the start, so clients given
// every coordinator's address can tell the leader from a standby: until this
// coordinator leads, every RPC is answered with UNAVAILABLE whose message and
// NotLeader details name the leader; once it leads, every call is forwarded
// to the GrpcCoordinatorService built then.
//
// Thread-safe: SetLeader and Lead may be called from any thread while calls
// arrive.
#ifndef SLUICE_SERVER_COORDINATOR_COORDINATOR_FRONT_DOOR_H_
#define SLUICE_SERVER_COORDINATOR_COORDINATOR_FRONT_DOOR_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <string>

#include "absl/synchronization/mutex.h"
#include "server/coordinator/grpc_coordinator_service.h"
#include "sluice/v1/coordinator.grpc.pb.h"

namespace sluice {

class CoordinatorFrontDoor final : public v1::Coordinator::CallbackService {
 public:
  CoordinatorFrontDoor() = default;

  // While standing by: the leader's advertised address ("" = none known).
  void SetLeader(const std::string& leader);
  // From now on every call goes to `leading` (not owned; outlives this).
  void Lead(GrpcCoordinatorService* leading);
  GrpcCoordinatorService* leading() const { return leading_.load(); }

  // The UNAVAILABLE a standby answers with.
  grpc::Status NotLeaderStatus() const;

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
  grpc::ServerUnaryReactor* ResetOnce(grpc::CallbackServerContext* ctx,
                                      const v1::ResetOnceRequest* req,
                                      v1::ResetOnceResponse* resp) override;

 private:
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx) const;

  std::atomic<GrpcCoordinatorService*> leading_{nullptr};
  mutable absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COORDINATOR_COORDINATOR_FRONT_DOOR_H_
