#include "server/coordinator/etcd_journal.h"

#include <arpa/inet.h>

#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/common/backoff.h"
#include "server/common/logging.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"

namespace sluice {
namespace {

using etcdserverpb::Compare;
using etcdserverpb::RequestOp;

constexpr absl::string_view kFormat = "sluice-journal 1";
// One chunk per transaction, below etcd's default 1.5 MiB request limit.
constexpr size_t kChunkBytes = 1 << 20;
constexpr uint8_t kFirst = 1, kLast = 2;
// A frame claiming more than this is corruption, not a record.
constexpr uint32_t kMaxRecordBytes = 512u << 20;
// Keys per Range page (each up to a chunk).
constexpr int64_t kPageKeys = 16;
constexpr absl::Duration kRpcTimeout = absl::Seconds(10);

std::string Seq20(uint64_t n) {
  char b[24];
  std::snprintf(b, sizeof(b), "%020llu", static_cast<unsigned long long>(n));
  return b;
}

std::string Seq6(uint64_t n) {
  char b[24];
  std::snprintf(b, sizeof(b), "%06llu", static_cast<unsigned long long>(n));
  return b;
}

// The end of the range of every key starting with `prefix`.
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

void Frame(const JournalRecord& record, std::string* out) {
  const size_t size = record.ByteSizeLong();
  PutU32LE(out, static_cast<uint32_t>(size));
  const size_t at = out->size();
  out->resize(at + size);
  record.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(out->data() + at));
}

// Applies every frame of `bytes` (from `key`, for messages).
absl::Status ApplyFrames(
    const std::string& bytes, const std::string& key,
    const std::function<absl::Status(const JournalRecord&)>& apply,
    int64_t* applied) {
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 4) {
      return absl::DataLossError(absl::StrCat(
          "etcd journal: a frame header is cut short in the commit ending at ",
          key));
    }
    const uint32_t length = GetU32LE(bytes.data() + at);
    if (length == 0 || length > kMaxRecordBytes ||
        length > bytes.size() - at - 4) {
      return absl::DataLossError(
          absl::StrCat("etcd journal: a frame of ", length,
                       " bytes does not fit the commit ending at ", key));
    }
    JournalRecord record;
    if (!record.ParseFromArray(bytes.data() + at + 4,
                               static_cast<int>(length))) {
      return absl::DataLossError(
          absl::StrCat("etcd journal: a record in the commit ending at ", key,
                       " does not parse"));
    }
    RETURN_IF_ERROR(apply(record));
    ++*applied;
    at += 4 + length;
  }
  return absl::OkStatus();
}

RequestOp PutOp(std::string key, std::string value, int64_t lease = 0) {
  RequestOp op;
  auto* put = op.mutable_request_put();
  put->set_key(std::move(key));
  put->set_value(std::move(value));
  if (lease != 0) put->set_lease(lease);
  return op;
}

RequestOp DeleteOp(std::string begin, std::string end) {
  RequestOp op;
  auto* del = op.mutable_request_delete_range();
  del->set_key(std::move(begin));
  del->set_range_end(std::move(end));
  return op;
}

}  // namespace

absl::StatusOr<EtcdJournalOptions> ParseEtcdJournalUrl(absl::string_view url,
                                                       absl::string_view flag) {
  absl::string_view rest = url;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", QuotePrefix(std::string(url)), ": ", why,
                     " (etcd://HOST:PORT[,HOST:PORT...]/PREFIX)"));
  };
  if (!absl::ConsumePrefix(&rest, "etcd://")) return bad("not an etcd URL");
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos) return bad("no /PREFIX");
  EtcdJournalOptions options;
  for (absl::string_view e : absl::StrSplit(rest.substr(0, slash), ',')) {
    const size_t colon = e.rfind(':');
    int port = 0;
    if (e.empty() || colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(e.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      return bad(absl::StrCat("endpoint \"", e, "\" is not HOST:PORT"));
    }
    options.endpoints.emplace_back(e);
  }
  if (options.endpoints.size() > 1) {
    // Several endpoints become one gRPC "ipv4:" target (pick_first).
    for (const std::string& e : options.endpoints) {
      in_addr addr;
      if (inet_pton(AF_INET, e.substr(0, e.rfind(':')).c_str(), &addr) != 1) {
        return bad(absl::StrCat(
            "several endpoints must be IPv4 addresses (\"", e,
            "\" is not); for host names give one name that resolves to "
            "every member, such as a Kubernetes Service"));
      }
    }
  }
  absl::string_view prefix = rest.substr(slash);
  while (absl::ConsumeSuffix(&prefix, "/")) {
  }
  if (prefix.empty()) return bad("the PREFIX is empty");
  options.prefix = std::string(prefix);
  return options;
}

EtcdJournal::EtcdJournal(EtcdJournalOptions options)
    : GroupCommitJournal(&Frame),
      options_(std::move(options)),
      prefix_(options_.prefix + "/") {
  endpoints_text_ = absl::StrJoin(options_.endpoints, ",");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetLoadBalancingPolicyName("pick_first");
  // Reconnect within a fraction of the election TTL.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  const std::string target = options_.endpoints.size() == 1
                                 ? options_.endpoints[0]
                                 : absl::StrCat("ipv4:", endpoints_text_);
  channel_ = grpc::CreateCustomChannel(target,
                                       options_.credentials
                                           ? options_.credentials
                                           : grpc::InsecureChannelCredentials(),
                                       args);
  kv_ = etcdserverpb::KV::NewStub(channel_);
  lease_ = etcdserverpb::Lease::NewStub(channel_);
}

std::unique_ptr<grpc::ClientContext> EtcdJournal::Context(
    absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  ctx->set_wait_for_ready(true);
  return ctx;
}

absl::Status EtcdJournal::Unavailable(absl::string_view what,
                                      const grpc::Status& status) const {
  return absl::UnavailableError(absl::StrCat(
      "etcd ", endpoints_text_, ": ", what, ": ", status.error_message()));
}

absl::StatusOr<std::unique_ptr<EtcdJournal>> EtcdJournal::Open(
    EtcdJournalOptions options,
    const std::function<absl::Status(const JournalRecord&)>& apply,
    const std::function<void()>& reset) {
  if (options.endpoints.empty() || options.prefix.empty()) {
    return absl::InvalidArgumentError("etcd journal: no endpoints or prefix");
  }
  std::unique_ptr<EtcdJournal> journal(new EtcdJournal(std::move(options)));
  if (!journal->channel_->WaitForConnected(absl::ToChronoTime(
          absl::Now() + journal->options_.connect_timeout))) {
    return absl::UnavailableError(
        absl::StrCat("etcd ", journal->endpoints_text_, " unreachable for ",
                     absl::FormatDuration(journal->options_.connect_timeout),
                     " (--journal): is etcd running there?"));
  }
  bool formatted = false;
  // A standby keeps applying what the leader writes, so taking over needs
  // only the last few commits.
  auto catch_up = [&](bool leading) {
    return journal->CatchUp(apply, reset, leading);
  };
  // Once etcd has answered, a standby rides out etcd's own trouble (a lost
  // quorum, a raft election: UNAVAILABLE) and keeps trying; anything else
  // (a foreign prefix, a damaged log) ends Open.
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(2));
  while (true) {
    absl::Status waited = [&]() -> absl::Status {
      RETURN_IF_ERROR(journal->CheckFormat(&formatted));
      RETURN_IF_ERROR(catch_up(false));
      return journal->Campaign([&] { return catch_up(false); });
    }();
    if (waited.ok()) break;
    const bool cancelled =
        journal->options_.cancel != nullptr && journal->options_.cancel->load();
    if (waited.code() != absl::StatusCode::kUnavailable || cancelled) {
      return waited;
    }
    LogWarning("etcd journal %s%s: %s; trying again as a standby",
               journal->endpoints_text_, journal->options_.prefix,
               waited.message());
    absl::SleepFor(backoff.NextWait());
  }
  journal->keepalive_ = std::thread([j = journal.get()] { j->KeepAlive(); });
  if (!formatted) {
    RETURN_IF_ERROR(journal->FencedTxn(
        {PutOp(journal->Key("format"), std::string(kFormat))}));
  }
  RETURN_IF_ERROR(catch_up(true));
  return journal;
}

absl::Status EtcdJournal::Campaign(
    const std::function<absl::Status()>& while_waiting) {
  const int64_t ttl_s = std::max<int64_t>(
      1, absl::ToInt64Seconds(options_.election_ttl + absl::Milliseconds(999)));
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse granted;
  lease_renewed_at_ = absl::Now();
  {
    auto ctx = Context(kRpcTimeout);
    grpc::Status s = lease_->LeaseGrant(ctx.get(), grant, &granted);
    if (!s.ok()) return Unavailable("LeaseGrant", s);
  }
  if (!granted.error().empty()) {
    return absl::UnavailableError(absl::StrCat(
        "etcd ", endpoints_text_, ": LeaseGrant: ", granted.error()));
  }
  lease_id_ = granted.id();
  const std::string leader_key = Key("leader");
  std::string last_seen;
  absl::Time last_keepalive = absl::Now();
  while (true) {
    etcdserverpb::TxnRequest txn;
    Compare* c = txn.add_compare();
    c->set_key(leader_key);
    c->set_target(Compare::CREATE);
    c->set_result(Compare::EQUAL);
    c->set_create_revision(0);  // absent
    *txn.add_success() = PutOp(leader_key, options_.identity, lease_id_);
    auto* get = txn.add_failure()->mutable_request_range();
    get->set_key(leader_key);
    etcdserverpb::TxnResponse resp;
    {
      auto ctx = Context(kRpcTimeout);
      grpc::Status s = kv_->Txn(ctx.get(), txn, &resp);
      if (!s.ok()) return Unavailable("campaign for the leader key", s);
    }
    if (resp.succeeded()) {
      leader_revision_ = resp.header().revision();
      LogInfo("etcd journal %s%s: leading (lease %x, revision %d)",
              endpoints_text_, options_.prefix, lease_id_, leader_revision_);
      return absl::OkStatus();
    }
    std::string leader = "?";
    if (resp.responses_size() > 0 &&
        resp.responses(0).response_range().kvs_size() > 0) {
      leader = resp.responses(0).response_range().kvs(0).value();
    }
    if (leader != last_seen) {
      if (options_.on_standby) options_.on_standby(leader);
      LogInfo("etcd journal %s%s: standby; %s leads", endpoints_text_,
              options_.prefix, leader);
      last_seen = leader;
    }
    // Our own lease must outlive the wait.
    if (absl::Now() - last_keepalive > options_.election_ttl / 3) {
      const absl::Time sent = absl::Now();
      auto ctx = Context(kRpcTimeout);
      auto stream = lease_->LeaseKeepAlive(ctx.get());
      etcdserverpb::LeaseKeepAliveRequest ka;
      ka.set_id(lease_id_);
      etcdserverpb::LeaseKeepAliveResponse kr;
      if (stream->Write(ka) && stream->Read(&kr) && kr.ttl() > 0) {
        last_keepalive = absl::Now();
        lease_renewed_at_ = sent;
      }
      stream->WritesDone();
      ctx->TryCancel();
      stream->Finish().ok();
    }
    if (stopping_.load() ||
        (options_.cancel != nullptr && options_.cancel->load())) {
      return absl::CancelledError("stopped while standing by");
    }
    RETURN_IF_ERROR(while_waiting());
    absl::SleepFor(
        std::min(options_.election_ttl / 4, absl::Milliseconds(250)));
  }
}

// Each renewal is a short keep-alive stream whose deadline is when the
// lease may lapse: a silent partition from etcd cannot hold a read past it.
// Leadership is given up `margin` before the lease can lapse at etcd (the
// last acknowledged request's send time plus the TTL), so a standby, which
// can win only once etcd has expired the lease, never finds this
// coordinator still serving.
void EtcdJournal::KeepAlive() {
  const absl::Duration interval = options_.election_ttl / 3;
  const absl::Duration margin =
      std::min(options_.election_ttl / 10, absl::Milliseconds(250));
  absl::Time expires = lease_renewed_at_ + options_.election_ttl;
  while (!stopping_.load()) {
    const absl::Time sent = absl::Now();
    const absl::Time step_down_at = expires - margin;
    if (sent >= step_down_at) {
      if (leadership().ok()) {
        LoseLeadership(absl::UnavailableError(
            absl::StrCat("no etcd keep-alive of ", Key("leader"),
                         " acknowledged within the election TTL (",
                         absl::FormatDuration(options_.election_ttl),
                         "): stepping down before the lease can lapse")));
      }
      return;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(step_down_at));
    {
      absl::MutexLock lock(&keepalive_mu_);
      if (stopping_.load()) return;
      keepalive_ctx_ = &ctx;
    }
    auto stream = lease_->LeaseKeepAlive(&ctx);
    etcdserverpb::LeaseKeepAliveRequest req;
    req.set_id(lease_id_);
    etcdserverpb::LeaseKeepAliveResponse resp;
    const bool acked = stream->Write(req) && stream->Read(&resp);
    stream->WritesDone();
    ctx.TryCancel();
    stream->Finish().ok();
    {
      absl::MutexLock lock(&keepalive_mu_);
      keepalive_ctx_ = nullptr;
    }
    if (stopping_.load() || !leadership().ok()) return;
    absl::Time next = sent + absl::Milliseconds(100);  // retry a failure
    if (acked) {
      if (resp.ttl() <= 0) {
        LoseLeadership(absl::UnavailableError(absl::StrCat(
            "etcd lease ", absl::Hex(lease_id_), " of ", Key("leader"),
            " expired: another coordinator may lead now")));
        return;
      }
      expires =
          sent + std::min(absl::Seconds(resp.ttl()), options_.election_ttl);
      next = sent + interval;
    }
    while (!stopping_.load() &&
           absl::Now() < std::min(next, expires - margin)) {
      absl::SleepFor(std::min(interval, absl::Milliseconds(50)));
    }
  }
}

void EtcdJournal::LoseLeadership(const absl::Status& why) {
  bool report = false;
  {
    absl::MutexLock lock(&mu_);
    if (leadership_.ok()) leadership_ = why;
    report = !lost_reported_;
    lost_reported_ = true;
  }
  Fail(why);
  if (report) {
    LogError("etcd journal %s%s: %s", endpoints_text_, options_.prefix,
             why.message());
    if (options_.on_leadership_lost) options_.on_leadership_lost(why);
  }
}

absl::Status EtcdJournal::leadership() const {
  absl::MutexLock lock(&mu_);
  return leadership_;
}

EtcdJournal::~EtcdJournal() {
  stopping_.store(true);
  {
    absl::MutexLock lock(&keepalive_mu_);
    if (keepalive_ctx_ != nullptr) keepalive_ctx_->TryCancel();
  }
  if (keepalive_.joinable()) keepalive_.join();
  if (lease_id_ != 0 && leadership().ok()) {
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(lease_id_);
    etcdserverpb::LeaseRevokeResponse resp;
    auto ctx = Context(absl::Seconds(2));
    ctx->set_wait_for_ready(false);
    lease_->LeaseRevoke(ctx.get(), req, &resp).ok();
  }
}

absl::Status EtcdJournal::FencedTxn(const std::vector<RequestOp>& ops) {
  etcdserverpb::TxnRequest txn;
  Compare* c = txn.add_compare();
  c->set_key(Key("leader"));
  c->set_target(Compare::CREATE);
  c->set_result(Compare::EQUAL);
  c->set_create_revision(leader_revision_);
  for (const RequestOp& op : ops) *txn.add_success() = op;
  etcdserverpb::TxnResponse resp;
  const absl::Time start = absl::Now();
  // A transaction cut off with its connection (an etcd member dying, a
  // raft election, a network blip) may or may not have been applied. Every
  // write here puts a value fixed by its key or deletes a range, so it is
  // sent again, on whichever member the channel reaches now, while this
  // coordinator still leads (its lease kept alive; every attempt is fenced
  // anyway), for at most kRetryWrites.
  constexpr absl::Duration kRetryWrites = absl::Seconds(30);
  grpc::Status s;
  absl::Duration pause = absl::Milliseconds(20);
  while (true) {
    resp.Clear();
    auto ctx = Context(kRpcTimeout);
    s = kv_->Txn(ctx.get(), txn, &resp);
    const bool transient =
        s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!transient || stopping_.load() || !leadership().ok() ||
        absl::Now() - start > kRetryWrites) {
      break;
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(200));
  }
  if (options_.on_commit)
    options_.on_commit(absl::ToDoubleSeconds(absl::Now() - start));
  if (!s.ok()) {
    // Whether it was applied is unknown, so nothing more may be written:
    // step down (crash-only) rather than serve on a journal that refuses.
    absl::Status failed = Unavailable("journal transaction", s);
    LoseLeadership(failed);
    return failed;
  }
  if (!resp.succeeded()) {
    absl::Status fenced = absl::FailedPreconditionError(absl::StrCat(
        "etcd journal write refused: ", Key("leader"),
        " is no longer the key this coordinator created at revision ",
        leader_revision_, " (another coordinator leads)"));
    LoseLeadership(fenced);
    return fenced;
  }
  return absl::OkStatus();
}

absl::Status EtcdJournal::RangeAll(
    const std::string& begin, const std::string& end, int64_t revision,
    const std::function<absl::Status(const mvccpb::KeyValue&)>& fn) {
  std::string from = begin;
  while (true) {
    etcdserverpb::RangeRequest req;
    req.set_key(from);
    req.set_range_end(end);
    req.set_limit(kPageKeys);
    req.set_revision(revision);
    req.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
    req.set_sort_target(etcdserverpb::RangeRequest::KEY);
    etcdserverpb::RangeResponse resp;
    auto ctx = Context(kRpcTimeout);
    grpc::Status s = kv_->Range(ctx.get(), req, &resp);
    if (!s.ok()) return Unavailable(absl::StrCat("Range ", from), s);
    for (const mvccpb::KeyValue& kv : resp.kvs()) RETURN_IF_ERROR(fn(kv));
    if (!resp.more() || resp.kvs_size() == 0) return absl::OkStatus();
    from = resp.kvs(resp.kvs_size() - 1).key() + std::string(1, '\0');
  }
}

absl::Status EtcdJournal::CheckFormat(bool* found) {
  const std::string format_key = Key("format");
  etcdserverpb::RangeRequest req;
  req.set_key(format_key);
  etcdserverpb::RangeResponse resp;
  {
    auto ctx = Context(kRpcTimeout);
    grpc::Status s = kv_->Range(ctx.get(), req, &resp);
    if (!s.ok()) return Unavailable(absl::StrCat("Range ", format_key), s);
  }
  *found = resp.kvs_size() > 0;
  if (*found) {
    if (resp.kvs(0).value() == kFormat) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd key ", format_key, " holds ", QuotePrefix(resp.kvs(0).value()),
        ", not \"", kFormat,
        "\": another program's data or a newer journal format; use another "
        "prefix"));
  }
  // No format key: the prefix must hold nothing but (at most) a leader key.
  req.Clear();
  req.set_key(prefix_);
  req.set_range_end(PrefixEnd(prefix_));
  req.set_limit(2);
  req.set_keys_only(true);
  {
    auto ctx = Context(kRpcTimeout);
    grpc::Status s = kv_->Range(ctx.get(), req, &resp);
    if (!s.ok()) return Unavailable(absl::StrCat("Range ", prefix_), s);
  }
  for (const mvccpb::KeyValue& kv : resp.kvs()) {
    if (kv.key() != Key("leader")) {
      return absl::FailedPreconditionError(
          absl::StrCat("etcd prefix ", options_.prefix, " holds ",
                       QuotePrefix(kv.key()), " but no ", format_key,
                       ": not a Sluice journal; use another prefix"));
    }
  }
  return absl::OkStatus();
}

absl::Status EtcdJournal::CatchUp(
    const std::function<absl::Status(const JournalRecord&)>& apply,
    const std::function<void()>& reset, bool leading) {
  // Everything is read at one etcd revision: a compaction by the leader
  // between two reads cannot make records vanish unseen.
  int64_t revision = 0;
  uint64_t gen = 0;
  {
    etcdserverpb::RangeRequest req;
    req.set_key(Key("snap"));
    etcdserverpb::RangeResponse resp;
    auto ctx = Context(kRpcTimeout);
    grpc::Status s = kv_->Range(ctx.get(), req, &resp);
    if (!s.ok()) return Unavailable(absl::StrCat("Range ", Key("snap")), s);
    revision = resp.header().revision();
    if (resp.kvs_size() > 0 && !absl::SimpleAtoi(resp.kvs(0).value(), &gen)) {
      return absl::DataLossError(
          absl::StrCat("etcd key ", Key("snap"), " is not a generation"));
    }
  }
  if (gen != replayed_gen_) {
    // A new snapshot (ours at the first catch-up, or the leader compacted
    // since the last one): start over from it.
    if (replayed_ > 0 || replayed_seq_ > 0) {
      if (!reset) {
        return absl::InternalError(
            "etcd journal: the leader compacted and this journal cannot "
            "reset its reader's state");
      }
      reset();
    }
    replayed_ = 0;
    replayed_seq_ = 0;
    replayed_bytes_ = 0;
    replayed_gen_ = gen;
    if (gen > 0) {
      std::string snapshot;
      const std::string dir = Key(absl::StrCat("snapdata/", Seq20(gen), "/"));
      std::string last_key;
      RETURN_IF_ERROR(RangeAll(
          dir, PrefixEnd(dir), revision, [&](const mvccpb::KeyValue& kv) {
            if (kv.value().empty()) {
              return absl::DataLossError(
                  absl::StrCat("etcd key ", kv.key(), " is empty"));
            }
            snapshot.append(kv.value(), 1);
            last_key = kv.key();
            return absl::OkStatus();
          }));
      if (last_key.empty()) {
        return absl::DataLossError(
            absl::StrCat("etcd key ", Key("snap"), " names snapshot ", gen,
                         " but no key under ", dir, " holds it"));
      }
      replayed_bytes_ += static_cast<int64_t>(snapshot.size());
      RETURN_IF_ERROR(ApplyFrames(snapshot, last_key, apply, &replayed_));
    }
  }
  // The log after what was applied, commit by commit.
  const std::string log = Key("log/");
  std::string commit, commit_first_key, last_key;
  bool open = false;
  uint64_t last_seq = replayed_seq_;
  RETURN_IF_ERROR(RangeAll(
      Key(absl::StrCat("log/", Seq20(replayed_seq_ + 1))), PrefixEnd(log),
      revision, [&](const mvccpb::KeyValue& kv) -> absl::Status {
        uint64_t seq = 0;
        if (!absl::SimpleAtoi(absl::string_view(kv.key()).substr(log.size()),
                              &seq) ||
            kv.value().empty()) {
          return absl::DataLossError(
              absl::StrCat("etcd key ", kv.key(), " is not a log chunk"));
        }
        const uint8_t flags = static_cast<uint8_t>(kv.value()[0]);
        if (flags & kFirst) {
          if (open) {
            return absl::DataLossError(absl::StrCat(
                "etcd journal: the commit starting at ", commit_first_key,
                " has no last chunk before ", kv.key()));
          }
          open = true;
          commit.clear();
          commit_first_key = kv.key();
        } else if (!open) {
          return absl::DataLossError(absl::StrCat(
              "etcd key ", kv.key(), " continues a commit that never began"));
        }
        commit.append(kv.value(), 1);
        last_key = kv.key();
        last_seq = seq;
        if (flags & kLast) {
          open = false;
          RETURN_IF_ERROR(ApplyFrames(commit, kv.key(), apply, &replayed_));
          replayed_seq_ = seq;
          replayed_bytes_ += static_cast<int64_t>(commit.size());
        }
        return absl::OkStatus();
      }));
  if (!leading) return absl::OkStatus();  // the leader may be mid-commit
  if (open) {
    // A torn last commit: it was never acknowledged.
    LogWarning(
        "etcd journal: deleting the unfinished last commit %s .. %s "
        "(interrupted before it was acknowledged)",
        commit_first_key, last_key);
    RETURN_IF_ERROR(FencedTxn({DeleteOp(commit_first_key, PrefixEnd(log))}));
  }
  absl::MutexLock lock(&mu_);
  next_log_seq_ = std::max({gen, last_seq + 1, replayed_seq_ + 1});
  snap_gen_ = gen;
  set_bytes_written(replayed_bytes_);
  return absl::OkStatus();
}

absl::Status EtcdJournal::WriteChunks(const std::string& framed,
                                      const std::string& dir,
                                      uint64_t* next_seq,
                                      bool numbered_by_six) {
  size_t at = 0;
  do {
    const size_t n = std::min(kChunkBytes, framed.size() - at);
    uint8_t flags = 0;
    if (at == 0) flags |= kFirst;
    if (at + n == framed.size()) flags |= kLast;
    std::string value(1, static_cast<char>(flags));
    value.append(framed, at, n);
    const std::string key =
        dir + (numbered_by_six ? Seq6(*next_seq) : Seq20(*next_seq));
    RETURN_IF_ERROR(FencedTxn({PutOp(key, std::move(value))}));
    ++*next_seq;
    at += n;
  } while (at < framed.size());
  return absl::OkStatus();
}

absl::Status EtcdJournal::WriteBatch(const std::string& frames) {
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    seq = next_log_seq_;
  }
  RETURN_IF_ERROR(WriteChunks(frames, Key("log/"), &seq, false));
  absl::MutexLock lock(&mu_);
  next_log_seq_ = seq;
  return absl::OkStatus();
}

std::string EtcdJournal::StagedDir() const {
  return Key(absl::StrCat("snapdata/", Seq20(staged_gen_), "/"));
}

absl::Status EtcdJournal::StageCompacted(const std::string& frames) {
  {
    absl::MutexLock lock(&mu_);
    // Above the snapshot in force, so that writing it never touches that
    // snapshot's chunks, and the older snapshots sort before it.
    staged_gen_ = std::max(next_log_seq_, snap_gen_ + 1);
  }
  staged_chunks_ = 0;
  return WriteChunks(frames, StagedDir(), &staged_chunks_, true);
}

absl::Status EtcdJournal::InstallCompacted(const std::string& tail) {
  if (!tail.empty()) {
    RETURN_IF_ERROR(WriteChunks(tail, StagedDir(), &staged_chunks_, true));
  }
  uint64_t log_end = 0;
  {
    absl::MutexLock lock(&mu_);
    log_end = next_log_seq_;
  }
  // One transaction switches to the new snapshot and drops what it
  // supersedes: the whole log written so far (its records are in the
  // snapshot or its tail) and the older snapshots.
  const std::string dir = StagedDir();
  RETURN_IF_ERROR(FencedTxn(
      {PutOp(Key("snap"), absl::StrCat(staged_gen_)),
       DeleteOp(Key("log/"), Key(absl::StrCat("log/", Seq20(log_end)))),
       DeleteOp(Key("snapdata/"), dir)}));
  absl::MutexLock lock(&mu_);
  snap_gen_ = staged_gen_;
  staged_gen_ = 0;
  return absl::OkStatus();
}

void EtcdJournal::DiscardCompacted() {
  if (staged_gen_ == 0) return;
  // The snapshot in force stays; remove the partial one.
  const std::string dir = StagedDir();
  FencedTxn({DeleteOp(dir, PrefixEnd(dir))}).IgnoreError();
  staged_gen_ = 0;
}

}  // namespace sluice
