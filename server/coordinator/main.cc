// sluice-coordinator: hands out epoch-consistent shard leases to trainers.
#include <prometheus/registry.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/common/lease_token.h"
#include "server/common/logging.h"
#include "server/common/server_host.h"
#include "server/common/status_macros.h"
#include "server/common/tls_files.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/etcd_journal.h"
#include "server/coordinator/grpc_coordinator_service.h"
#include "server/coordinator/open_journal.h"

ABSL_FLAG(std::string, journal_dir, "sluice-journal",
          "Directory of the coordinator's journal (created if missing). Jobs, "
          "acknowledged progress and leases survive restarts through it.");
ABSL_FLAG(std::string, journal, "",
          "Where the journal lives instead of --journal_dir: "
          "etcd://HOST:PORT[,HOST:PORT...]/PREFIX keeps it in etcd v3 under "
          "PREFIX, so any number of coordinators may run against it: one "
          "leads, the others wait as standbys and take over when it dies. A "
          "standby listens, reports readiness NOT_SERVING and answers every "
          "RPC with UNAVAILABLE naming the leader. A coordinator that loses "
          "the lead exits with status 75 (its supervisor restarts it as a "
          "standby).");
ABSL_FLAG(std::string, etcd_ca_cert, "",
          "CA certificate (PEM) to verify etcd's client port with; empty = "
          "plaintext to etcd.");
ABSL_FLAG(std::string, etcd_cert, "",
          "Client certificate (PEM) for etcd's client port (mutual TLS).");
ABSL_FLAG(std::string, etcd_key, "", "Private key (PEM) for --etcd_cert.");
ABSL_FLAG(absl::Duration, election_ttl, absl::Seconds(2),
          "With an etcd journal: the leader's etcd lease TTL. A standby takes "
          "over this long after the leader's last keep-alive; a leader whose "
          "keep-alives go unanswered this long steps down. For an etcd "
          "member's death to be only latency, it must outlast etcd's own "
          "leader election (etcd's default election timeout is 1 s, "
          "randomized up to 2 s) plus a third of itself: e.g. 5s.");
ABSL_FLAG(std::string, advertise, "",
          "With an etcd journal: the address written as the leader's "
          "address, given to clients in the UNAVAILABLE a standby answers "
          "with (default: the --listen host, or this host's name when it is "
          "a wildcard, and the bound port).");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "How often trainers heartbeat (sent to them in Welcome). A job "
          "whose readers would together send more than 2,000 heartbeats a "
          "second is asked for fewer (at most every 0.4 of its lease TTL).");
ABSL_FLAG(absl::Duration, default_lease_ttl, absl::Seconds(10),
          "Lease TTL for jobs that do not set lease_ttl_ms; a job with more "
          "readers (world_size x num_workers) than 800 per second of it gets "
          "readers / 800 seconds, so that its heartbeats fit 2,000 a second.");
ABSL_FLAG(absl::Duration, fleet_interval, absl::Seconds(5),
          "How often the coordinator re-estimates the data servers the jobs "
          "need (sluice_coordinator_desired_data_servers); 0 = never.");
ABSL_FLAG(absl::Duration, fleet_window, absl::Seconds(30),
          "The span of trainer input wait, consumption and server load that "
          "estimate is taken over.");
ABSL_FLAG(absl::Duration, fleet_up_cooldown, absl::Seconds(30),
          "The estimate rises at most once per this long.");
ABSL_FLAG(absl::Duration, fleet_down_stabilization, absl::Minutes(2),
          "The estimate falls only to the highest recommendation of this "
          "long, at most once per this long (as Kubernetes' HPA stabilises "
          "scale-down).");
ABSL_FLAG(int32_t, fleet_max_servers, 64,
          "The most data servers the estimate asks for.");
ABSL_FLAG(int64_t, journal_compact_bytes, 64 << 20,
          "Compact the journal into one snapshot record when it grows past "
          "this many bytes "
          "(and past twice the last snapshot).");
ABSL_FLAG(
    bool, wait_for_data_servers, true,
    "Hold grants back while no data server is registered and live (trainers "
    "are told "
    "why). Turn off only for tests with scripted trainers that read nothing.");
ABSL_FLAG(int, prefetch_hint_units, 8,
          "After each grant, look this many units ahead in the grant's queue "
          "and send the "
          "data servers they will be routed to a PrefetchHint for their remote "
          "shards "
          "(http/https/s3). 0 = no hints.");
ABSL_FLAG(bool, steer_shared_shards, true,
          "Grant a dynamic job's reader, among the next 64 units of its queue, "
          "one of a shard another job is reading now, before the front one: "
          "jobs over the same dataset (a sweep of trials) then read each "
          "shard together, and the data server decodes each image once for "
          "all of them (its --shared_decode_bytes). Static jobs keep their "
          "planned order.");
ABSL_FLAG(std::string, lease_secret_file, "",
          "File holding the lease-token secret shared with the data servers "
          "(HMAC-SHA256 over each lease). Empty = leases carry no token.");

ABSL_FLAG(std::vector<std::string>, manifest_roots, {},
          "Directories CreateJob's manifest_path may name files in "
          "(comma-separated; \"..\" "
          "and symlinks are resolved first). Empty = manifest_path is refused "
          "and manifests "
          "are sent inline, as sluicectl does.");
ABSL_FLAG(std::string, admin_token_file, "",
          "File holding an operator token: CreateJob and DeleteJob are "
          "accepted with the "
          "metadata \"authorization: Bearer <token>\" (sluicectl "
          "--admin_token_file). "
          "Use with TLS: the token crosses the wire.");
ABSL_FLAG(std::vector<std::string>, admin_identities, {},
          "Client-certificate names (common name or subject alternative name, "
          "comma-separated) whose mutual-TLS calls may CreateJob and "
          "DeleteJob. Needs "
          "--tls_client_ca.");
ABSL_FLAG(std::vector<std::string>, data_server_identities, {},
          "Client-certificate names (common name or subject alternative name, "
          "comma-separated) that may RegisterDataServer over mutual TLS; "
          "others are refused "
          "(PERMISSION_DENIED). Empty = any client the TLS settings admit "
          "(with a lease "
          "secret, only those holding it). Needs --tls_client_ca.");
ABSL_FLAG(
    bool, allow_unauthenticated_admin, false,
    "Let anyone who reaches the port create and delete jobs even though TLS or "
    "a lease "
    "secret is configured. Without TLS and a lease secret this is always so.");
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_client_ca);
ABSL_FLAG(int32_t, max_world_size, 65536,
          "Largest JobSpec.world_size accepted.");
ABSL_FLAG(int64_t, max_units_per_epoch, 4000000,
          "Most work units one epoch of a job may be planned into (shards x "
          "samples / "
          "max_samples_per_lease); each costs memory in the plan, the queues "
          "and the journal.");
ABSL_FLAG(int64_t, max_sessions_per_job, 65536,
          "Most open trainer sessions per job; a Hello beyond it is "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_jobs_per_tenant, 0,
          "Most jobs one tenant (JobSpec.tenant; sluicectl job create "
          "--tenant) may hold; a CreateJob beyond it is RESOURCE_EXHAUSTED. "
          "0 = no limit.");
ABSL_FLAG(int64_t, max_sessions_per_tenant, 0,
          "Most open trainer sessions over all of one tenant's jobs; a Hello "
          "beyond it is RESOURCE_EXHAUSTED. 0 = no limit.");
ABSL_FLAG(int32_t, max_barrier_participants, 100000,
          "Most participants one Barrier may name.");
ABSL_FLAG(int64_t, max_manifest_bytes, 256 << 20,
          "Largest manifest file read for manifest_path.");

namespace {

// Operators are checked whenever the deployment is secured at all (TLS or a
// lease secret): a secured cluster whose jobs anyone can delete is not.
absl::StatusOr<sluice::AccessPolicy> AccessPolicyFromFlags(
    bool has_lease_secret) {
  sluice::AccessPolicy admin;
  ASSIGN_OR_RETURN(admin.token,
                   sluice::ReadSecretFile(absl::GetFlag(FLAGS_admin_token_file),
                                          "admin_token_file"));
  admin.identities = absl::GetFlag(FLAGS_admin_identities);
  admin.data_server_identities = absl::GetFlag(FLAGS_data_server_identities);
  for (const char* flag : {"admin_identities", "data_server_identities"}) {
    const bool set = std::string(flag) == "admin_identities"
                         ? !admin.identities.empty()
                         : !admin.data_server_identities.empty();
    if (set && absl::GetFlag(FLAGS_tls_client_ca).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag,
          " needs --tls_client_ca: without mutual TLS no call carries a "
          "client certificate"));
    }
  }
  const bool secured =
      has_lease_secret || !absl::GetFlag(FLAGS_tls_cert).empty();
  const bool configured = !admin.token.empty() || !admin.identities.empty();
  if (absl::GetFlag(FLAGS_allow_unauthenticated_admin)) {
    if (configured) {
      return absl::InvalidArgumentError(
          "--allow_unauthenticated_admin contradicts "
          "--admin_token_file/--admin_identities");
    }
    sluice::LogWarning(
        "--allow_unauthenticated_admin: anyone who can reach this port can "
        "create and delete jobs");
    return admin;
  }
  admin.enforce = secured || configured;
  if (!admin.enforce) {
    sluice::LogWarning(
        "no TLS, lease secret or operator credential: anyone who can reach "
        "this port can "
        "create and delete jobs");
  } else if (!configured) {
    sluice::LogWarning(
        "TLS or a lease secret is configured but no operator credential: "
        "CreateJob and "
        "DeleteJob are refused (give --admin_token_file or "
        "--admin_identities)");
  }
  return admin;
}

// --journal=etcd://... and the etcd TLS flags; nullopt for a local journal.
absl::StatusOr<std::optional<sluice::EtcdJournalOptions>>
EtcdJournalFromFlags() {
  const std::string url = absl::GetFlag(FLAGS_journal);
  if (url.empty()) return std::nullopt;
  ASSIGN_OR_RETURN(sluice::EtcdJournalOptions etcd,
                   sluice::ParseEtcdJournalUrl(url, "--journal"));
  etcd.election_ttl = absl::GetFlag(FLAGS_election_ttl);
  if (etcd.election_ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        "--election_ttl must be at least 1s (etcd leases count seconds)");
  }
  sluice::ClientTlsFiles tls;
  tls.ca = absl::GetFlag(FLAGS_etcd_ca_cert);
  tls.cert = absl::GetFlag(FLAGS_etcd_cert);
  tls.key = absl::GetFlag(FLAGS_etcd_key);
  tls.ca_flag = "--etcd_ca_cert";
  tls.cert_flag = "--etcd_cert";
  tls.key_flag = "--etcd_key";
  ASSIGN_OR_RETURN(etcd.credentials, sluice::ClientCredentialsFromFiles(tls));
  // Empty: this host's name and the bound port (set once listening).
  etcd.identity = absl::GetFlag(FLAGS_advertise);
  etcd.on_leadership_lost = [](const absl::Status& why) {
    // Crash-only: the journal refuses this coordinator's writes from now
    // on; trainers and data servers reconnect to the new leader as after a
    // crash, and the supervisor restarts this one as a standby.
    sluice::LogError("no longer leading (%s); exiting with status 75",
                     why.message());
    std::fflush(nullptr);
    _exit(75);
  };
  return etcd;
}

// The coordinator's services. With a local journal the coordinator serves
// as soon as it listens. With the journal in etcd it listens at once as a
// standby (readiness NOT_SERVING, every RPC UNAVAILABLE naming the leader)
// while a thread campaigns, and serves, ready, once it leads.
class CoordinatorServices : public sluice::ServiceSet {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServices>> Create(
      std::shared_ptr<prometheus::Registry> registry) {
    auto services =
        std::unique_ptr<CoordinatorServices>(new CoordinatorServices());
    services->metrics_ =
        std::make_unique<sluice::CoordinatorMetrics>(*registry);
    sluice::CoordinatorOptions& options = services->options_;
    services->journal_dir_ = absl::GetFlag(FLAGS_journal_dir);
    ASSIGN_OR_RETURN(services->etcd_, EtcdJournalFromFlags());
    options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
    options.fleet_interval = absl::GetFlag(FLAGS_fleet_interval);
    options.fleet.window = absl::GetFlag(FLAGS_fleet_window);
    options.fleet.up_cooldown = absl::GetFlag(FLAGS_fleet_up_cooldown);
    options.fleet.down_stabilization =
        absl::GetFlag(FLAGS_fleet_down_stabilization);
    options.fleet.max_servers = absl::GetFlag(FLAGS_fleet_max_servers);
    if (options.fleet_interval < absl::ZeroDuration() ||
        options.fleet.window <= absl::ZeroDuration() ||
        options.fleet.up_cooldown < absl::ZeroDuration() ||
        options.fleet.down_stabilization < absl::ZeroDuration() ||
        options.fleet.max_servers < options.fleet.min_servers) {
      return absl::InvalidArgumentError(
          "--fleet_interval, --fleet_up_cooldown and "
          "--fleet_down_stabilization must not be negative, --fleet_window "
          "must be positive and --fleet_max_servers at least 1");
    }
    options.journal_compact_bytes = absl::GetFlag(FLAGS_journal_compact_bytes);
    options.wait_for_data_servers = absl::GetFlag(FLAGS_wait_for_data_servers);
    options.default_lease_ttl = absl::GetFlag(FLAGS_default_lease_ttl);
    options.metrics = services->metrics_.get();
    // A journal write or fsync failed (a full or failing disk): nothing more
    // can be acknowledged, and what this process holds in memory is ahead of
    // the journal. Exit so that the supervisor (systemd, the kubelet) starts
    // a coordinator from what the journal holds; readiness goes with the
    // process, and trainers reconnect to the new one.
    services->on_journal_failure_ = [](const absl::Status& why) {
      sluice::LogError(
          "journal write failed (%s); exiting with status 74 so that a "
          "supervisor restarts the coordinator from its journal",
          why.message());
      std::fflush(nullptr);
      _exit(74);
    };
    options.prefetch_hint_units = absl::GetFlag(FLAGS_prefetch_hint_units);
    options.steer_shared_shards = absl::GetFlag(FLAGS_steer_shared_shards);
    options.manifest_roots = absl::GetFlag(FLAGS_manifest_roots);
    options.max_manifest_bytes = absl::GetFlag(FLAGS_max_manifest_bytes);
    options.job_limits.max_world_size = absl::GetFlag(FLAGS_max_world_size);
    options.job_limits.max_units_per_epoch =
        absl::GetFlag(FLAGS_max_units_per_epoch);
    options.max_sessions_per_job = absl::GetFlag(FLAGS_max_sessions_per_job);
    options.max_jobs_per_tenant = absl::GetFlag(FLAGS_max_jobs_per_tenant);
    options.max_sessions_per_tenant =
        absl::GetFlag(FLAGS_max_sessions_per_tenant);
    options.max_barrier_participants =
        absl::GetFlag(FLAGS_max_barrier_participants);
    if (options.prefetch_hint_units < 0) {
      return absl::InvalidArgumentError("--prefetch_hint_units must be >= 0");
    }
    ASSIGN_OR_RETURN(
        options.lease_secret,
        sluice::ReadSecretFile(absl::GetFlag(FLAGS_lease_secret_file),
                               "lease_secret_file"));
    if (options.lease_secret.empty()) {
      sluice::LogWarning(
          "no --lease_secret_file: leases carry no token, so data servers "
          "cannot "
          "tell a granted lease from a forged one");
    }
    ASSIGN_OR_RETURN(services->admin_,
                     AccessPolicyFromFlags(!options.lease_secret.empty()));
    services->grpc_ = std::make_unique<sluice::GrpcCoordinatorService>(
        &services->gate_, services->admin_);
    if (services->etcd_.has_value()) {
      sluice::LeadershipGate* gate = &services->gate_;
      services->etcd_->on_standby = [gate](const std::string& leader) {
        gate->SetLeader(leader == "?" ? "" : leader);
      };
      services->etcd_->cancel = &services->cancel_;
      return services;
    }
    RETURN_IF_ERROR(services->StartLeading());
    return services;
  }

  ~CoordinatorServices() override { StopCampaign(); }

  // Called before Started, on one thread.
  std::vector<grpc::Service*> services() override { return {grpc_.get()}; }
  bool ReadyWhenStarted() const override { return !standby_first(); }

  absl::Status Started(const sluice::HostPort& bound) override {
    if (!standby_first()) return absl::OkStatus();
    if (absl::GetFlag(FLAGS_advertise).empty()) {
      // The bound port (--listen may have asked for port 0), and the listen
      // host unless it is a wildcard.
      std::string host = bound.host;
      if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") {
        char name[256] = {};
        gethostname(name, sizeof(name) - 1);
        host = name;
      }
      etcd_->identity = sluice::HostPort{host, bound.port}.ToString();
    }
    metrics_->is_leader.Set(0);
    campaign_ = std::thread([this] {
      absl::Status led = StartLeading();
      if (led.ok() || cancel_.load()) return;
      // Nothing to serve without the journal (etcd unreachable, a foreign
      // prefix ...): the same exit as failing before listening.
      sluice::LogError("%s", led.message());
      std::fflush(nullptr);
      _exit(led.code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
    });
    return absl::OkStatus();
  }

  void Drain(absl::Duration /*timeout*/) override {
    StopCampaign();
    absl::MutexLock lock(&mu_);  // not while StartLeading installs the logic
    grpc_->Drain();
  }

 private:
  CoordinatorServices() = default;

  bool standby_first() const { return etcd_.has_value(); }

  // Opens the journal (with etcd: blocks until this coordinator leads),
  // then serves.
  absl::Status StartLeading() {
    absl::StatusOr<sluice::RecoveredJournal> journal =
        etcd_.has_value()
            ? sluice::OpenEtcdJournal(*etcd_, metrics_.get())
            : sluice::OpenFileJournal(journal_dir_, metrics_.get(),
                                      on_journal_failure_);
    if (!journal.ok()) return journal.status();
    ASSIGN_OR_RETURN(
        std::unique_ptr<sluice::CoordinatorService> logic,
        sluice::CoordinatorService::Create(options_, *std::move(journal)));
    absl::MutexLock lock(&mu_);
    if (cancel_.load()) return absl::CancelledError("draining");
    logic_ = std::move(logic);
    logic_->StartExpiryThread();
    gate_.Lead(logic_.get());
    metrics_->is_leader.Set(1);
    metrics_->leader_changes.Increment();
    set_ready(true);
    return absl::OkStatus();
  }

  void StopCampaign() {
    cancel_.store(true);
    if (campaign_.joinable()) campaign_.join();
  }

  sluice::CoordinatorOptions options_;
  // The journal: in etcd when set, else in journal_dir_.
  std::optional<sluice::EtcdJournalOptions> etcd_;
  std::string journal_dir_;
  // A write or fsync of the journal directory failed.
  std::function<void(const absl::Status&)> on_journal_failure_;
  sluice::AccessPolicy admin_;
  std::unique_ptr<sluice::CoordinatorMetrics> metrics_;
  std::atomic<bool> cancel_{false};
  std::thread campaign_;
  // Standing by (etcd) until StartLeading has the logic lead.
  sluice::LeadershipGate gate_;
  absl::Mutex mu_;
  std::unique_ptr<sluice::CoordinatorService> logic_ ABSL_GUARDED_BY(mu_);
  // Built with the services, before the server starts.
  std::unique_ptr<sluice::GrpcCoordinatorService> grpc_;
};

}  // namespace

int main(int argc, char** argv) {
  sluice::ServerMainOptions options;
  options.program = "sluice-coordinator";
  options.usage =
      "Hands out epoch-consistent shard leases to "
      "trainers.\n\nUsage: sluice-coordinator [flags]\nStops cleanly on "
      "SIGTERM/SIGINT (exit 0).";
  options.default_listen = "0.0.0.0:7070";
  options.default_metrics_listen = "0.0.0.0:9070";
  options.make_services = [](std::shared_ptr<prometheus::Registry> registry)
      -> absl::StatusOr<std::unique_ptr<sluice::ServiceSet>> {
    ASSIGN_OR_RETURN(auto services,
                     CoordinatorServices::Create(std::move(registry)));
    return std::unique_ptr<sluice::ServiceSet>(std::move(services));
  };
  return sluice::RunServerMain(argc, argv, options);
}
