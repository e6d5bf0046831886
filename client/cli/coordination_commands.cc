// sluicectl once / barrier.

#include <cstdio>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"
#include "client/cli/subprocess.h"
#include "nlohmann/json.hpp"
#include "sluice/coordination.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(bool, json);
ABSL_FLAG(std::string, scope, "default",
          "once/barrier: scope of the name (e.g. the job).");
ABSL_FLAG(
    std::string, id, "",
    "once/barrier: this participant's id (e.g. rank-3; default host-pid).");
ABSL_FLAG(absl::Duration, ttl, absl::Seconds(10),
          "once: the runner's execution lease; a waiter takes over after this "
          "long without a heartbeat.");
ABSL_FLAG(
    bool, fail_all, false,
    "once: a failed run fails every later caller too (default: retryable).");
ABSL_FLAG(int32_t, participants, 0,
          "barrier: how many distinct ids must arrive.");
ABSL_FLAG(bool, list, false,
          "once: list the finished and running steps (of the SCOPE given, "
          "else of every scope) instead of running one.");
ABSL_FLAG(bool, reset, false,
          "once: forget the finished step NAME (in --scope), so that its next "
          "caller runs it again.");

namespace sluice::cli {
namespace {

// Runs argv in the foreground, returning its exit status (128+signal when
// killed; 127 when it cannot be run). The child dies with us, so a killed
// runner leaves nothing behind.
int RunCommand(const std::vector<std::string>& argv) {
  absl::StatusOr<Subprocess> child =
      Subprocess::Spawn(argv, "", "", /*die_with_parent=*/true);
  if (!child.ok()) {
    std::fprintf(stderr, "sluicectl once: cannot run %s: %s\n", argv[0].c_str(),
                 child.status().ToString().c_str());
    return 127;
  }
  absl::StatusOr<int> code = child->Wait(absl::InfiniteDuration());
  return code.ok() ? *code : 1;
}

}  // namespace

namespace {

int OnceListCommand(const std::vector<std::string>& args) {
  if (args.size() > 1) return Usage("once --list [SCOPE]");
  v1::ListOnceRequest request;
  if (!args.empty()) request.set_scope(args[0]);
  v1::ListOnceResponse response;
  absl::Status s = Rpc(CoordinatorStub(absl::GetFlag(FLAGS_coordinator))
                           ->ListOnce(Deadline().get(), request, &response),
                       "once --list");
  if (!s.ok()) return Fail(s);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s", ToJson(response).c_str());
    return kOk;
  }
  if (response.steps().empty()) {
    std::printf("no once steps%s\n",
                args.empty() ? "" : (" in scope " + args[0]).c_str());
    return kOk;
  }
  for (const v1::OnceStep& step : response.steps()) {
    std::string state;
    switch (step.state()) {
      case v1::OnceStep::STATE_DONE:
        state = step.result().empty() ? std::string("done")
                                      : absl::StrCat("done: ", step.result());
        break;
      case v1::OnceStep::STATE_FAILED:
        state = absl::StrCat("failed: ", step.error());
        break;
      default:
        state = absl::StrCat(
            "running (", step.runner().empty() ? "no runner" : step.runner(),
            ", ", step.waiting(), " waiting)");
    }
    std::printf("%s/%s  run %lld  %s\n", step.scope().c_str(),
                step.name().c_str(), static_cast<long long>(step.run()),
                state.c_str());
  }
  return kOk;
}

int OnceResetCommand(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("once --reset NAME [--scope S]");
  v1::ResetOnceRequest request;
  request.set_scope(absl::GetFlag(FLAGS_scope));
  request.set_name(args[0]);
  v1::ResetOnceResponse response;
  absl::Status s = Rpc(CoordinatorStub(absl::GetFlag(FLAGS_coordinator))
                           ->ResetOnce(Deadline().get(), request, &response),
                       "once --reset");
  if (!s.ok()) return Fail(s);
  std::printf("once %s/%s: reset; its next caller runs it\n",
              request.scope().c_str(), request.name().c_str());
  return kOk;
}

}  // namespace

int OnceCommand(const std::vector<std::string>& args) {
  if (absl::GetFlag(FLAGS_list) && absl::GetFlag(FLAGS_reset)) {
    return Usage("once: --list and --reset exclude each other");
  }
  if (absl::GetFlag(FLAGS_list)) return OnceListCommand(args);
  if (absl::GetFlag(FLAGS_reset)) return OnceResetCommand(args);
  if (args.size() < 2) return Usage("once NAME -- COMMAND [ARGS...]");
  OnceOptions o;
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.tls = ClientTlsOrNone();
  o.scope = absl::GetFlag(FLAGS_scope);
  o.name = args[0];
  o.participant = absl::GetFlag(FLAGS_id);
  o.ttl = absl::GetFlag(FLAGS_ttl);
  o.fail_all = absl::GetFlag(FLAGS_fail_all);
  o.on_wait = [&](const std::string& runner, int64_t run) {
    std::fprintf(stderr, "once %s/%s: waiting for %s (run %lld)\n",
                 o.scope.c_str(), o.name.c_str(), runner.c_str(),
                 static_cast<long long>(run));
  };
  const std::vector<std::string> command(args.begin() + 1, args.end());
  int exit_code = 0;
  auto outcome = RunOnce(o, [&]() -> absl::StatusOr<std::string> {
    std::fprintf(stderr, "once %s/%s: running %s\n", o.scope.c_str(),
                 o.name.c_str(), absl::StrJoin(command, " ").c_str());
    exit_code = RunCommand(command);
    if (exit_code != 0)
      return absl::InternalError(absl::StrCat("exit ", exit_code));
    return std::string();
  });
  if (!outcome.ok()) return Fail(outcome.status());
  if (outcome->ran) return exit_code;
  if (!outcome->failed) {
    std::fprintf(stderr, "once %s/%s: done by another participant (run %lld)\n",
                 o.scope.c_str(), o.name.c_str(),
                 static_cast<long long>(outcome->run));
    return kOk;
  }
  std::fprintf(stderr, "once %s/%s: the run failed: %s\n", o.scope.c_str(),
               o.name.c_str(), outcome->error.c_str());
  int code = 1;
  if (absl::StartsWith(outcome->error, "exit ") &&
      absl::SimpleAtoi(outcome->error.substr(5), &code) && code > 0 &&
      code < 256) {
    return code;  // the command's status, everywhere
  }
  return kError;
}

int BarrierCommand(const std::vector<std::string>& args) {
  if (args.size() != 1)
    return Usage("barrier NAME --participants N --id ID [--timeout 60s]");
  BarrierOptions o;
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.tls = ClientTlsOrNone();
  o.scope = absl::GetFlag(FLAGS_scope);
  o.name = args[0];
  o.participant = absl::GetFlag(FLAGS_id);
  o.participants = absl::GetFlag(FLAGS_participants);
  o.timeout = absl::GetFlag(FLAGS_timeout);
  if (o.participant.empty()) return Usage("barrier: --id is required");
  if (o.participants <= 0) return Usage("barrier: --participants must be > 0");
  auto response = WaitBarrier(o);
  if (!response.ok()) {
    if (!absl::IsDeadlineExceeded(response.status())) {
      return Fail(response.status());
    }
    std::fprintf(stderr, "sluicectl: DEADLINE_EXCEEDED: %s\n",
                 std::string(response.status().message()).c_str());
    return kBarrierTimeout;
  }
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::ordered_json out;
    out["generation"] = response->generation();
    out["arrived"] = std::vector<std::string>(response->arrived().begin(),
                                              response->arrived().end());
    std::printf("%s\n", out.dump(-1, ' ', false,
                                 nlohmann::json::error_handler_t::replace)
                            .c_str());
  } else {
    std::printf("barrier %s/%s generation %lld: %d arrived\n", o.scope.c_str(),
                o.name.c_str(), static_cast<long long>(response->generation()),
                response->arrived_size());
  }
  return kOk;
}

}  // namespace sluice::cli
