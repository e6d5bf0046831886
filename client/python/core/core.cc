// sluice._core: the C++ sluice::Reader (client/include/sluice/reader.h) as
// a Python extension, so that a Python trainer reads through the same
// session, fetch and report code as a C++ one.
//
//   r = _core.Reader(coordinator="head:7070", job="cifar", rank=3,
//                    decode=spec.SerializeToString())
//   kind, epoch, payload = r.next()
//
// next() blocks without the GIL and returns ("sample", epoch, sample dict),
// ("epoch_begin", epoch, counts dict), ("epoch_end", epoch, None) or
// ("done", epoch, message). TLS: PEM file paths (ca_cert, and client_cert
// with client_key for mutual TLS), or none for plaintext. A sample dict has the
// sample's place (key, shard_index, shard_url, source, index, data_server,
// skipped, skip_reason) and "fields": name -> bytes (raw), a read-only numpy
// array owning the received tensor bytes (no copy), an int or a str. Cursors
// and DecodeSpecs cross as serialized protos. Errors raise RuntimeError
// carrying the status (code and message). Not for a process that forks
// after creating one: gRPC's threads do not survive fork.
#include <grpc/event_engine/event_engine.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/python/core/local_cluster_bindings.h"
#include "server/common/grpc_status.h"
#include "sluice/audit.h"
#include "sluice/coordination.h"
#include "sluice/jobs.h"
#include "sluice/reader.h"
#include "sluice/tls.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/coordinator.pb.h"
#include "sluice/v1/dataserver.pb.h"

namespace py = pybind11;

// gRPC 1.51 declares this in src/core/lib/event_engine/default_event_engine.h,
// a header Debian does not install; libgrpc exports it. The default engine
// lives while anything holds it (a weak reference inside gRPC).
namespace grpc_event_engine::experimental {
std::shared_ptr<EventEngine> GetDefaultEventEngine();
}  // namespace grpc_event_engine::experimental

namespace sluice {
namespace {

// The process that opened gRPC channels through this module (0: none yet).
std::atomic<pid_t> g_grpc_user{0};

// Called by each entry point that opens a channel.
void NoteGrpcUse() { g_grpc_user.store(getpid(), std::memory_order_relaxed); }

// Lets gRPC's default event engine go on this thread before the process
// exits, and says how: "released", "kept" or "unused".
//
// A subchannel whose connection failed holds the engine until its reconnect
// backoff timer fires, about a second later, and the timer's thread then
// destroys the engine. If that falls while exit() runs the static
// destructors, the engine's destructor unlinks its poller from gRPC's fork
// support list after the list was freed, and a program that finished its
// work dies with SIGSEGV. So this waits, for at most `timeout` seconds, until
// this thread holds the last reference, and drops it here (the engine is
// destroyed now, before the exit handlers). A holder that stays longer (a
// channel still open, a longer backoff) gets the engine kept for the rest of
// the process: never destroyed, so never destroyed during exit.
std::string ReleaseGrpcAtExit(double timeout) {
  if (g_grpc_user.load(std::memory_order_relaxed) != getpid()) return "unused";
  py::gil_scoped_release unlocked;
  std::shared_ptr<grpc_event_engine::experimental::EventEngine> engine =
      grpc_event_engine::experimental::GetDefaultEventEngine();
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout);
  while (engine.use_count() > 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (engine.use_count() > 1) {
    static auto* const kept =
        new std::shared_ptr<grpc_event_engine::experimental::EventEngine>();
    *kept = std::move(engine);
    return "kept";
  }
  engine.reset();
  return "released";
}

[[noreturn]] void Raise(const absl::Status& status) {
  throw std::runtime_error(status.ToString());
}

// The numpy dtype of a Tensor's DType (uint8 for one this build does not
// know, as the Python client does).
py::dtype DtypeOf(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_INT8:
      return py::dtype::of<int8_t>();
    case v1::DTYPE_INT16:
      return py::dtype::of<int16_t>();
    case v1::DTYPE_UINT16:
      return py::dtype::of<uint16_t>();
    case v1::DTYPE_INT32:
      return py::dtype::of<int32_t>();
    case v1::DTYPE_UINT32:
      return py::dtype::of<uint32_t>();
    case v1::DTYPE_INT64:
      return py::dtype::of<int64_t>();
    case v1::DTYPE_UINT64:
      return py::dtype::of<uint64_t>();
    case v1::DTYPE_FLOAT16:
      return py::dtype("float16");
    case v1::DTYPE_FLOAT32:
      return py::dtype::of<float>();
    case v1::DTYPE_FLOAT64:
      return py::dtype::of<double>();
    case v1::DTYPE_BOOL:
      return py::dtype::of<bool>();
    default:
      return py::dtype::of<uint8_t>();
  }
}

// A read-only array over the tensor's bytes, which it takes over.
py::object TensorArray(v1::Tensor* tensor) {
  py::dtype dtype = DtypeOf(tensor->dtype());
  auto* bytes = new std::string(std::move(*tensor->mutable_data()));
  py::capsule owner(bytes,
                    [](void* p) { delete static_cast<std::string*>(p); });
  const auto itemsize = static_cast<size_t>(dtype.itemsize());
  if (bytes->size() % itemsize != 0) {
    throw std::runtime_error(absl::StrCat("tensor of ", bytes->size(),
                                          " bytes is not a whole number of ",
                                          itemsize, "-byte elements"));
  }
  std::vector<py::ssize_t> shape(tensor->shape().begin(),
                                 tensor->shape().end());
  if (shape.empty())
    shape.push_back(static_cast<py::ssize_t>(bytes->size() / itemsize));
  // The shape must cover exactly the bytes received: numpy would read past
  // them otherwise.
  size_t elements = 1;
  for (py::ssize_t d : shape) {
    if (d < 0 || (d > 0 && elements > bytes->size() / static_cast<size_t>(d)))
      throw std::runtime_error(
          "DATA_LOSS: tensor shape does not fit its bytes");
    elements *= static_cast<size_t>(d);
  }
  if (elements * itemsize != bytes->size()) {
    throw std::runtime_error(absl::StrCat(
        "DATA_LOSS: tensor shape has ", elements, " elements of ", itemsize,
        " bytes, but ", bytes->size(), " bytes were received"));
  }
  py::array array(dtype, shape, bytes->data(), owner);
  array.attr("setflags")(py::arg("write") = false);
  return std::move(array);
}

py::object FieldValue(v1::Field* field) {
  switch (field->value_case()) {
    case v1::Field::kRaw:
      return py::bytes(field->raw());
    case v1::Field::kTensor:
      return TensorArray(field->mutable_tensor());
    case v1::Field::kIntValue:
      return py::int_(field->int_value());
    case v1::Field::kText:
      return py::str(field->text());
    default:
      return py::bytes("");
  }
}

py::dict SampleDict(Sample* sample) {
  py::dict fields;
  for (v1::Field& f : sample->fields)
    fields[py::str(f.name())] = FieldValue(&f);
  py::dict out;
  out["rank"] = sample->rank;
  out["shard_index"] = sample->shard_index;
  out["shard_url"] = sample->shard_url;
  out["source"] = sample->source;
  out["index"] = sample->index;
  out["key"] = sample->key;
  out["data_server"] = sample->data_server;
  out["skipped"] = sample->skipped;
  out["skip_reason"] = sample->skip_reason;
  out["fields"] = std::move(fields);
  return out;
}

// TLS from PEM file paths: none without ca_cert (plaintext).
std::optional<ClientTls> TlsFromFiles(const std::string& ca_cert,
                                      const std::string& client_cert,
                                      const std::string& client_key) {
  if (ca_cert.empty()) {
    if (!client_cert.empty() || !client_key.empty()) {
      throw std::invalid_argument(
          "client_cert (mutual TLS) needs ca_cert to verify the server");
    }
    return std::nullopt;
  }
  absl::StatusOr<ClientTls> tls =
      ReadClientTls(ca_cert, client_cert, client_key);
  if (!tls.ok()) throw std::invalid_argument(tls.status().ToString());
  return *std::move(tls);
}

class PyReader {
 public:
  static constexpr absl::Duration kSignalCheckInterval =
      absl::Milliseconds(100);

  PyReader(const std::string& coordinator, const std::string& job, int32_t rank,
           int32_t worker, int32_t num_workers, const std::string& trainer_id,
           int32_t units_in_flight, int32_t buffer_samples,
           const py::bytes& decode, const std::vector<std::string>& fields,
           int64_t max_batch_bytes, double progress_interval,
           double stall_timeout, double reconnect_timeout,
           const std::optional<py::bytes>& resume_from,
           const std::string& resume_attempt, const std::string& launch_id,
           const std::string& ca_cert, const std::string& client_cert,
           const std::string& client_key, const std::string& node) {
    NoteGrpcUse();
    ReaderOptions o;
    o.node = node;
    o.tls = TlsFromFiles(ca_cert, client_cert, client_key);
    o.coordinator = coordinator;
    o.job = job;
    o.rank = rank;
    o.worker = worker;
    o.num_workers = num_workers;
    o.trainer_id = trainer_id;
    o.units_in_flight = units_in_flight;
    o.buffer_samples = buffer_samples;
    if (!o.decode.ParseFromString(std::string(decode)))
      throw std::invalid_argument("decode is not a serialized DecodeSpec");
    o.fields = fields;
    o.max_batch_bytes = max_batch_bytes;
    o.progress_interval = absl::Seconds(progress_interval);
    o.stall_timeout = absl::Seconds(stall_timeout);
    o.reconnect_timeout = absl::Seconds(reconnect_timeout);
    if (resume_from.has_value()) {
      v1::Cursor cursor;
      if (!cursor.ParseFromString(std::string(*resume_from)))
        throw std::invalid_argument("resume_from is not a serialized Cursor");
      o.resume_from = std::move(cursor);
    }
    o.resume_attempt = resume_attempt;
    o.launch_id = launch_id;
    absl::StatusOr<std::unique_ptr<Reader>> reader;
    {
      py::gil_scoped_release unlocked;
      reader = Reader::Create(std::move(o));
    }
    if (!reader.ok()) Raise(reader.status());
    reader_ = *std::move(reader);
  }

  // In a forked child (a DataLoader worker holding a copy of its parent's
  // objects) the Reader's threads and gRPC's do not exist: closing it there
  // would wait for them forever, so the child's copy is left alone.
  ~PyReader() {
    if (getpid() != owner_) new std::shared_ptr<Reader>(std::move(reader_));
  }
  PyReader(const PyReader&) = delete;
  PyReader& operator=(const PyReader&) = delete;

  // timeout: seconds, or None to wait for as long as it takes.
  // The wait is cut into slices with a look at Python's signal handlers in
  // between, so Ctrl-C reaches a loop waiting on a stalled stream.
  py::tuple Next(std::optional<double> timeout) {
    const std::shared_ptr<Reader> reader = Open();
    const absl::Time deadline =
        timeout.has_value()
            ? absl::Now() + absl::Seconds(std::max(0.0, *timeout))
            : absl::InfiniteFuture();
    absl::StatusOr<ReaderEvent> event;
    while (true) {
      {
        py::gil_scoped_release unlocked;
        event = reader->NextWithin(
            std::min(kSignalCheckInterval, deadline - absl::Now()));
      }
      if (event.ok() || !absl::IsDeadlineExceeded(event.status())) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (absl::Now() >= deadline) {
        PyErr_SetString(PyExc_TimeoutError, "no event within the timeout");
        throw py::error_already_set();
      }
    }
    if (!event.ok()) Raise(event.status());
    switch (event->kind) {
      case ReaderEvent::Kind::kSample:
        return py::make_tuple("sample", event->epoch,
                              SampleDict(&event->sample));
      case ReaderEvent::Kind::kEpochBegin: {
        py::dict counts;
        counts["samples_for_rank"] = event->samples_for_rank;
        counts["already_consumed"] = event->already_consumed;
        counts["samples_for_worker"] = event->samples_for_worker;
        counts["already_consumed_by_worker"] =
            event->already_consumed_by_worker;
        return py::make_tuple("epoch_begin", event->epoch, counts);
      }
      case ReaderEvent::Kind::kEpochEnd:
        return py::make_tuple("epoch_end", event->epoch, py::none());
      case ReaderEvent::Kind::kDone:
        return py::make_tuple("done", event->epoch, event->message);
    }
    return py::make_tuple("done", event->epoch, "");
  }

  py::bytes Cursor() {
    const std::shared_ptr<Reader> reader = Open();
    absl::StatusOr<v1::Cursor> cursor;
    {
      py::gil_scoped_release unlocked;
      cursor = reader->Cursor();
    }
    if (!cursor.ok()) Raise(cursor.status());
    return py::bytes(cursor->SerializeAsString());
  }

  py::dict Stats() const {
    CheckOwner();
    const ReaderStats s = reader_ != nullptr ? reader_->stats() : closed_stats_;
    py::dict out;
    out["delivered"] = s.delivered;
    out["units_completed"] = s.units_completed;
    out["reroutes"] = s.reroutes;
    out["handed_back"] = s.handed_back;
    out["dropped_units"] = s.dropped_units;
    out["reconnects"] = s.reconnects;
    out["batches"] = s.batches;
    out["input_wait_seconds"] = s.input_wait_seconds;
    return out;
  }

  void Want(int32_t units) {
    const std::shared_ptr<Reader> reader = Open();
    py::gil_scoped_release unlocked;
    reader->Want(units);
  }

  // Closes the Reader and frees it (its threads, channels and buffers) once
  // no other call uses it; the stats stay readable. Members change only
  // under the GIL; the C++ Reader's calls run without it.
  void Close() {
    if (getpid() != owner_ || closed_) return;
    closed_ = true;
    const std::shared_ptr<Reader> reader = reader_;
    {
      py::gil_scoped_release unlocked;
      reader->Close();
    }
    closed_stats_ = reader->stats();
    reader_.reset();
  }

 private:
  // For every call but stats() and close(): the Reader, this process's and
  // open (held by the call, so that a close() from another thread does not
  // free it under the call).
  std::shared_ptr<Reader> Open() const {
    CheckOwner();
    if (closed_) throw std::runtime_error("CANCELLED: reader closed");
    return reader_;
  }

  void CheckOwner() const {
    if (getpid() != owner_) {
      throw std::runtime_error(
          absl::StrCat("FAILED_PRECONDITION: this Reader belongs to process ",
                       owner_, " (this is a forked child, ", getpid(),
                       "); create a Reader in the process that reads"));
    }
  }

  const pid_t owner_ = getpid();
  std::shared_ptr<Reader> reader_;  // null once closed
  bool closed_ = false;
  ReaderStats closed_stats_;
};

// Once for a Python `with` block: RunOnce on a thread of its own whose
// step is the block. Begin() returns when this caller is to run the block
// (("run", run, "")) or the step is over (("done", run, result)); Finish()
// ends a run with its result or error once the coordinator confirmed it.
// Errors raise RuntimeError("CODE: message").
class PyOnce {
 public:
  PyOnce(const std::string& coordinator, const std::string& scope,
         const std::string& name, const std::string& participant, double ttl,
         bool fail_all, std::optional<double> timeout,
         const std::string& ca_cert, const std::string& client_cert,
         const std::string& client_key) {
    NoteGrpcUse();
    options_.coordinator = coordinator;
    options_.scope = scope;
    options_.name = name;
    options_.participant = participant;
    options_.ttl = absl::Seconds(ttl);
    options_.fail_all = fail_all;
    if (timeout.has_value()) options_.timeout = absl::Seconds(*timeout);
    options_.tls = TlsFromFiles(ca_cert, client_cert, client_key);
    options_.cancel = &cancel_;
    options_.on_run = [this](int64_t run) {
      absl::MutexLock lock(&mu_);
      run_ = run;
    };
  }

  ~PyOnce() {
    if (!thread_.joinable()) return;
    {
      absl::MutexLock lock(&mu_);
      // A block that never finished (its process is ending): a failed run.
      if (!step_result_.has_value())
        step_result_ = absl::AbortedError("the block was abandoned");
    }
    py::gil_scoped_release unlocked;
    thread_.join();
  }
  PyOnce(const PyOnce&) = delete;
  PyOnce& operator=(const PyOnce&) = delete;

  py::tuple Begin() {
    if (thread_.joinable()) throw std::logic_error("Once.begin() called twice");
    bool chosen = false;
    bool interrupted = false;
    int64_t run = 0;
    {
      py::gil_scoped_release unlocked;
      thread_ = std::thread([this] {
        absl::StatusOr<OnceOutcome> outcome =
            RunOnce(options_, [this]() -> absl::StatusOr<std::string> {
              absl::MutexLock lock(&mu_);
              chosen_ = true;
              mu_.Await(absl::Condition(
                  +[](std::optional<absl::StatusOr<std::string>>* r) {
                    return r->has_value();
                  },
                  &step_result_));
              return *step_result_;
            });
        absl::MutexLock lock(&mu_);
        outcome_ = std::move(outcome);
        over_ = true;
      });
      // Waits in slices with a look at Python's signal handlers in between:
      // Ctrl-C ends the wait (the call is cancelled) and raises.
      while (true) {
        {
          absl::MutexLock lock(&mu_);
          if (mu_.AwaitWithTimeout(
                  absl::Condition(
                      +[](PyOnce* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                           self->mu_) { return self->chosen_ || self->over_; },
                      this),
                  PyReader::kSignalCheckInterval)) {
            chosen = chosen_;
            run = run_;
            break;
          }
        }
        py::gil_scoped_acquire locked;
        if (PyErr_CheckSignals() != 0) {
          interrupted = true;
          break;
        }
      }
      if (interrupted) {
        cancel_.Cancel();
        {
          absl::MutexLock lock(&mu_);
          // Chosen meanwhile: the step is reported failed.
          if (chosen_ && !step_result_.has_value())
            step_result_ = absl::CancelledError("interrupted");
        }
        thread_.join();
      } else if (!chosen) {
        thread_.join();  // the step is over without this caller
      }
    }
    if (interrupted) throw py::error_already_set();
    if (chosen) return py::make_tuple("run", run, py::str(""));
    const OnceOutcome& o = Outcome();
    return py::make_tuple("done", o.run, py::str(o.result));
  }

  void Finish(bool ok, const std::string& text) {
    {
      absl::MutexLock lock(&mu_);
      if (!chosen_ || step_result_.has_value())
        throw std::logic_error("Once.finish() without a run to finish");
      step_result_ = ok ? absl::StatusOr<std::string>(text)
                        : absl::StatusOr<std::string>(absl::AbortedError(text));
    }
    {
      py::gil_scoped_release unlocked;
      thread_.join();
    }
    Outcome();
  }

 private:
  // The finished call's outcome; raises for a transport error or a failed
  // run.
  const OnceOutcome& Outcome() {
    if (!outcome_.ok()) Raise(outcome_.status());
    if (outcome_->failed) {
      Raise(absl::AbortedError(
          absl::StrCat("run ", outcome_->run, " failed: ", outcome_->error)));
    }
    return *outcome_;
  }

  OnceOptions options_;
  OnceCancel cancel_;
  std::thread thread_;
  absl::Mutex mu_;
  bool chosen_ ABSL_GUARDED_BY(mu_) = false;
  bool over_ ABSL_GUARDED_BY(mu_) = false;
  int64_t run_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::StatusOr<std::string>> step_result_ ABSL_GUARDED_BY(mu_);
  absl::StatusOr<OnceOutcome> outcome_;  // set by the thread, read after join
};

// WaitBarrier: ("OK", arrived, []) or ("DEADLINE_EXCEEDED: message",
// arrived, missing); any other error raises RuntimeError("CODE: message").
py::tuple Barrier(const std::string& coordinator, const std::string& scope,
                  const std::string& name, const std::string& participant,
                  int32_t participants, double timeout,
                  const std::string& ca_cert, const std::string& client_cert,
                  const std::string& client_key) {
  NoteGrpcUse();
  BarrierOptions o;
  o.coordinator = coordinator;
  o.scope = scope;
  o.name = name;
  o.participant = participant;
  o.participants = participants;
  o.timeout = absl::Seconds(timeout);
  o.tls = TlsFromFiles(ca_cert, client_cert, client_key);
  absl::StatusOr<v1::BarrierResponse> response;
  {
    py::gil_scoped_release unlocked;
    response = WaitBarrier(o);
  }
  std::vector<std::string> arrived, missing;
  if (response.ok()) {
    arrived.assign(response->arrived().begin(), response->arrived().end());
    return py::make_tuple("OK", arrived, missing);
  }
  if (!absl::IsDeadlineExceeded(response.status())) Raise(response.status());
  // Who arrived and who did not, from the status details.
  if (absl::optional<absl::Cord> details =
          response.status().GetPayload(kGrpcDetailsPayloadUrl)) {
    v1::RpcStatus status;
    if (status.ParseFromString(std::string(*details))) {
      for (const v1::AnyDetail& any : status.details()) {
        v1::BarrierTimeout t;
        if (absl::EndsWith(any.type_url(), "/sluice.v1.BarrierTimeout") &&
            t.ParseFromString(any.value())) {
          arrived.assign(t.arrived().begin(), t.arrived().end());
          missing.assign(t.missing().begin(), t.missing().end());
        }
      }
    }
  }
  return py::make_tuple(response.status().ToString(), arrived, missing);
}

// The draws as the dict entries source_size, steps, flip_horizontal and
// flip_vertical.
void PutDraws(const v1::SampleDraws& draws, py::dict& out) {
  py::list steps;
  for (const v1::GeometryStep& s : draws.steps()) {
    py::dict step;
    if (s.kind() == "crop") {
      step["crop"] = py::make_tuple(s.left(), s.top(), s.width(), s.height());
    } else {
      step["resize"] = py::make_tuple(s.width(), s.height());
    }
    steps.append(std::move(step));
  }
  out["source_size"] =
      py::make_tuple(draws.source_width(), draws.source_height());
  out["steps"] = std::move(steps);
  out["flip_horizontal"] = draws.flip_horizontal();
  out["flip_vertical"] = draws.flip_vertical();
}

// sluice::Audit: (samples as dicts, total, keys_missing); an error raises
// RuntimeError("CODE: message"). A non-empty `decode` (a serialized
// DecodeSpec) adds each sample's draws.
py::tuple AuditSamples(const std::string& coordinator, const std::string& job,
                       int64_t epoch, int32_t rank, int32_t worker,
                       int64_t from, int64_t count, int64_t step,
                       int64_t batch_size, int32_t num_workers,
                       bool rolled_back, bool keys, const py::bytes& decode,
                       const std::vector<std::string>& fields, double timeout,
                       const std::string& ca_cert,
                       const std::string& client_cert,
                       const std::string& client_key) {
  NoteGrpcUse();
  AuditOptions o;
  o.coordinator = coordinator;
  o.job = job;
  o.epoch = epoch;
  o.rank = rank;
  o.worker = worker;
  o.from = from;
  o.count = count;
  o.step = step;
  o.batch_size = batch_size;
  o.num_workers = num_workers;
  o.rolled_back = rolled_back;
  o.keys = keys;
  if (const std::string spec(decode); !spec.empty()) {
    o.decode.emplace();
    if (!o.decode->ParseFromString(spec))
      throw std::invalid_argument("decode is not a serialized DecodeSpec");
  }
  o.fields = fields;
  o.timeout = absl::Seconds(timeout);
  o.tls = TlsFromFiles(ca_cert, client_cert, client_key);
  absl::StatusOr<AuditResult> audit;
  {
    py::gil_scoped_release unlocked;
    audit = Audit(o);
  }
  if (!audit.ok()) Raise(audit.status());
  py::list samples;
  for (const AuditedSample& s : audit->samples) {
    py::dict d;
    d["position"] = s.position;
    // Keys are bytes from the shard: decoded with replacement, never an
    // exception.
    d["key"] = py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(
        s.key.data(), static_cast<Py_ssize_t>(s.key.size()), "replace"));
    d["source"] = s.source;
    d["shard"] = s.shard_index;
    d["url"] = s.shard_url;
    d["index"] = s.index;
    d["unit"] = s.unit;
    d["unit_kind"] = s.unit_kind;
    d["reread"] = s.reread;
    if (o.decode.has_value()) PutDraws(s.draws, d);
    samples.append(std::move(d));
  }
  return py::make_tuple(samples, audit->total, audit->keys_missing);
}

// sluice::Replay: a dict of where the sample came from, its fields (numpy
// arrays for tensors) and the geometry its transforms drew; an error raises
// RuntimeError("CODE: message").
py::dict ReplaySample(
    const std::string& coordinator, const std::string& job, int64_t epoch,
    int32_t rank, int32_t worker, int64_t position, const std::string& key,
    const py::bytes& decode, const std::vector<std::string>& fields,
    const std::string& data_server, double timeout, const std::string& ca_cert,
    const std::string& client_cert, const std::string& client_key) {
  NoteGrpcUse();
  ReplayOptions o;
  o.coordinator = coordinator;
  o.job = job;
  o.epoch = epoch;
  o.rank = rank;
  o.worker = worker;
  o.position = position;
  o.key = key;
  if (!o.decode.ParseFromString(std::string(decode)))
    throw std::invalid_argument("decode is not a serialized DecodeSpec");
  o.fields = fields;
  o.data_server = data_server;
  o.timeout = absl::Seconds(timeout);
  o.tls = TlsFromFiles(ca_cert, client_cert, client_key);
  absl::StatusOr<ReplayResult> r;
  {
    py::gil_scoped_release unlocked;
    r = Replay(o);
  }
  if (!r.ok()) Raise(r.status());
  py::dict values;
  for (v1::Field& f : *r->replayed.mutable_sample()->mutable_fields())
    values[py::str(f.name())] = FieldValue(&f);
  py::dict out;
  out["rank"] = r->rank;
  out["worker"] = r->worker;
  out["position"] = r->audited.position;
  out["key"] = r->audited.key;
  out["source"] = r->audited.source;
  out["shard"] = r->audited.shard_index;
  out["url"] = r->audited.shard_url;
  out["index"] = r->audited.index;
  out["unit"] = r->audited.unit;
  out["data_server"] = r->data_server;
  PutDraws(r->replayed.draws(), out);
  out["fields"] = std::move(values);
  return out;
}

JobQuery MakeJobQuery(const std::string& coordinator, double timeout,
                      const std::string& ca_cert,
                      const std::string& client_cert,
                      const std::string& client_key) {
  NoteGrpcUse();
  JobQuery q;
  q.coordinator = coordinator;
  q.tls = TlsFromFiles(ca_cert, client_cert, client_key);
  q.timeout = absl::Seconds(timeout);
  return q;
}

// DescribeJob: the serialized v1::Job; an error raises
// RuntimeError("CODE: message").
py::bytes DescribeJobBytes(const std::string& coordinator,
                           const std::string& job, double timeout,
                           const std::string& ca_cert,
                           const std::string& client_cert,
                           const std::string& client_key) {
  const JobQuery q =
      MakeJobQuery(coordinator, timeout, ca_cert, client_cert, client_key);
  absl::StatusOr<v1::Job> described;
  {
    py::gil_scoped_release unlocked;
    described = DescribeJob(q, job);
  }
  if (!described.ok()) Raise(described.status());
  return py::bytes(described->SerializeAsString());
}

// JobForWorldSize; an error raises RuntimeError("CODE: message").
std::string ReadingJob(const std::string& coordinator, const std::string& job,
                       int32_t world_size, double timeout,
                       const std::string& ca_cert,
                       const std::string& client_cert,
                       const std::string& client_key) {
  const JobQuery q =
      MakeJobQuery(coordinator, timeout, ca_cert, client_cert, client_key);
  absl::StatusOr<std::string> reading;
  {
    py::gil_scoped_release unlocked;
    reading = JobForWorldSize(q, job, world_size);
  }
  if (!reading.ok()) Raise(reading.status());
  return *std::move(reading);
}

// MergeCursors over serialized cursors; ValueError on a mismatch.
py::bytes MergeSerializedCursors(const std::vector<py::bytes>& serialized) {
  std::vector<v1::Cursor> cursors(serialized.size());
  for (size_t i = 0; i < serialized.size(); ++i) {
    if (!cursors[i].ParseFromString(std::string(serialized[i])))
      throw std::invalid_argument(
          absl::StrCat("cursor ", i, " is not a serialized Cursor"));
  }
  absl::StatusOr<v1::Cursor> merged = MergeCursors(cursors);
  if (!merged.ok())
    throw std::invalid_argument(std::string(merged.status().message()));
  return py::bytes(merged->SerializeAsString());
}

}  // namespace
}  // namespace sluice

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "The C++ sluice::Reader for Python (client/include/sluice/reader.h).";
  // pybind11 looks numpy's C API up on first use, inside a function-local
  // static. Two Readers' first samples arriving in two threads at once
  // would otherwise deadlock: one thread imports numpy (the import lets the
  // GIL go) while the other, holding the GIL, waits for that static. Here
  // the import runs once, under the import of this module.
  (void)py::dtype::of<uint8_t>();
  py::class_<sluice::PyReader>(m, "Reader")
      .def(py::init<const std::string&, const std::string&, int32_t, int32_t,
                    int32_t, const std::string&, int32_t, int32_t,
                    const py::bytes&, const std::vector<std::string>&, int64_t,
                    double, double, double, const std::optional<py::bytes>&,
                    const std::string&, const std::string&, const std::string&,
                    const std::string&, const std::string&,
                    const std::string&>(),
           py::arg("coordinator"), py::arg("job"), py::arg("rank") = 0,
           py::arg("worker") = 0, py::arg("num_workers") = 0,
           py::arg("trainer_id") = "", py::arg("units_in_flight") = 4,
           py::arg("buffer_samples") = 256, py::arg("decode") = py::bytes(""),
           py::arg("fields") = std::vector<std::string>{},
           py::arg("max_batch_bytes") = 0, py::arg("progress_interval") = 0.5,
           py::arg("stall_timeout") = 60.0,
           py::arg("reconnect_timeout") = 120.0,
           py::arg("resume_from") = std::nullopt,
           py::arg("resume_attempt") = "", py::arg("launch_id") = "",
           py::arg("ca_cert") = "", py::arg("client_cert") = "",
           py::arg("client_key") = "", py::arg("node") = "")
      .def("next", &sluice::PyReader::Next, py::arg("timeout") = std::nullopt,
           "The next event: (kind, epoch, payload). Blocks without the GIL, "
           "for at most `timeout` seconds (TimeoutError after) unless None.")
      .def("want", &sluice::PyReader::Want, py::arg("units"),
           "Changes how many units the reader holds at once (0 = no new "
           "work).")
      .def("cursor", &sluice::PyReader::Cursor,
           "The resume cursor (a serialized sluice.v1.Cursor) after the "
           "samples returned so far.")
      .def("stats", &sluice::PyReader::Stats)
      .def("close", &sluice::PyReader::Close);
  py::class_<sluice::PyOnce>(m, "Once")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const std::string&, double, bool, std::optional<double>,
                    const std::string&, const std::string&,
                    const std::string&>(),
           py::arg("coordinator"), py::arg("scope"), py::arg("name"),
           py::arg("participant"), py::arg("ttl") = 10.0,
           py::arg("fail_all") = false, py::arg("timeout") = std::nullopt,
           py::arg("ca_cert") = "", py::arg("client_cert") = "",
           py::arg("client_key") = "")
      .def("begin", &sluice::PyOnce::Begin,
           "Joins: ('run', run, '') when this caller runs the step, or "
           "('done', run, result). Blocks without the GIL.")
      .def("finish", &sluice::PyOnce::Finish, py::arg("ok"), py::arg("text"),
           "Reports this caller's run: its result (ok) or error.");
  m.def("barrier", &sluice::Barrier, py::arg("coordinator"), py::arg("scope"),
        py::arg("name"), py::arg("participant"), py::arg("participants"),
        py::arg("timeout") = 60.0, py::arg("ca_cert") = "",
        py::arg("client_cert") = "", py::arg("client_key") = "",
        "sluice::WaitBarrier: (status, arrived, missing).");
  m.def("audit", &sluice::AuditSamples, py::arg("coordinator"), py::arg("job"),
        py::arg("epoch"), py::arg("rank"), py::arg("worker"), py::arg("from"),
        py::arg("count"), py::arg("step"), py::arg("batch_size"),
        py::arg("num_workers"), py::arg("rolled_back"), py::arg("keys"),
        py::arg("decode"), py::arg("fields"), py::arg("timeout"),
        py::arg("ca_cert") = "", py::arg("client_cert") = "",
        py::arg("client_key") = "",
        "sluice::Audit: (samples as dicts, total, keys_missing).");
  m.def("replay", &sluice::ReplaySample, py::arg("coordinator"), py::arg("job"),
        py::arg("epoch"), py::arg("rank"), py::arg("worker"),
        py::arg("position"), py::arg("key"), py::arg("decode"),
        py::arg("fields"), py::arg("data_server"), py::arg("timeout"),
        py::arg("ca_cert") = "", py::arg("client_cert") = "",
        py::arg("client_key") = "",
        "sluice::Replay: the sample's origin, fields and drawn geometry.");
  m.def("describe_job", &sluice::DescribeJobBytes, py::arg("coordinator"),
        py::arg("job"), py::arg("timeout"), py::arg("ca_cert") = "",
        py::arg("client_cert") = "", py::arg("client_key") = "",
        "sluice::DescribeJob: the job as a serialized sluice.v1.Job.");
  m.def("job_for_world_size", &sluice::ReadingJob, py::arg("coordinator"),
        py::arg("job"), py::arg("world_size"), py::arg("timeout"),
        py::arg("ca_cert") = "", py::arg("client_cert") = "",
        py::arg("client_key") = "",
        "sluice::JobForWorldSize: the job a run of world_size ranks reads.");
  m.def("merge_cursors", &sluice::MergeSerializedCursors, py::arg("cursors"),
        "sluice::MergeCursors over serialized Cursors: the merged one, "
        "serialized. ValueError on a mismatch.");
  m.def("release_grpc_at_exit", &sluice::ReleaseGrpcAtExit,
        py::arg("timeout") = 3.0,
        "Lets gRPC's default event engine go on this thread before exit, "
        "waiting up to `timeout` seconds for reconnect timers to let go: "
        "'released', 'kept' (never destroyed) or 'unused'.");
  sluice::BindLocalCluster(m, &sluice::NoteGrpcUse);
  m.def("tune_malloc", &sluice::TuneMallocForStreaming,
        "sluice::TuneMallocForStreaming(): glibc malloc settings for "
        "streaming; False where the allocator refuses them.");
}
