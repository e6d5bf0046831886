#include "server/format/tar_shard_reader.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace sluice::dataserver {
namespace {

// webdataset's tar_file_iterator skips "__x__" at top level (meta_prefix /
// meta_suffix) and anything matching skip_meta = r"__[^/]*__($|/)".
bool IsMetaName(absl::string_view path) {
  size_t slash = path.find('/');
  if (slash == absl::string_view::npos) {
    if (absl::StartsWith(path, "__") && absl::EndsWith(path, "__")) {
      return true;
    }
    // Python's "$" also matches before a final newline.
    return path.size() >= 5 && absl::StartsWith(path, "__") &&
           absl::EndsWith(path, "__\n");
  }
  absl::string_view first = path.substr(0, slash);
  return first.size() >= 4 && absl::StartsWith(first, "__") &&
         absl::EndsWith(first, "__");
}

}  // namespace

std::optional<MemberName> SplitMemberName(absl::string_view path) {
  if (IsMetaName(path)) return std::nullopt;
  // A faithful walk of Python's backtracking for
  //   ^((?:.*/|)[^.]+)[.]([^/]*)$
  // The alternative ".*/" is tried first with the longest ".*" (which cannot
  // cross a newline), then shorter ones, then the empty alternative. For a
  // start point i, "[^.]+" runs to the first "." after i (at least one
  // character), and "[^/]*$" needs no "/" after that dot.
  std::vector<size_t> starts;
  size_t newline = path.find('\n');
  for (size_t s = path.size(); s-- > 0;) {
    if (path[s] == '/' && (newline == absl::string_view::npos || newline > s)) {
      starts.push_back(s + 1);
    }
  }
  starts.push_back(0);
  for (size_t i : starts) {
    size_t dot = path.find('.', i);
    if (dot == absl::string_view::npos || dot == i) continue;
    if (path.find('/', dot + 1) != absl::string_view::npos) continue;
    MemberName name;
    name.key = std::string(path.substr(0, dot));
    // group_by_keys lower-cases the suffix (lcase=True); ASCII only here.
    name.field = absl::AsciiStrToLower(path.substr(dot + 1));
    return name;
  }
  return std::nullopt;
}

// ------------------------------------------------------------ member iterator

long TarMemberIterator::ReadCallback(struct archive*, void* self,
                                     const void** buffer) {
  auto* it = static_cast<TarMemberIterator*>(self);
  absl::string_view bytes = it->shard_->bytes();
  int64_t remaining = static_cast<int64_t>(bytes.size()) - it->pos_;
  if (remaining <= 0) return 0;
  // The whole rest of the mapping as one block: libarchive then returns
  // member data as pointers into it.
  *buffer = bytes.data() + it->pos_;
  it->pos_ += remaining;
  return static_cast<long>(remaining);
}

int64_t TarMemberIterator::SkipCallback(struct archive*, void* self,
                                        int64_t request) {
  auto* it = static_cast<TarMemberIterator*>(self);
  int64_t remaining = it->shard_->size() - it->pos_;
  int64_t n = std::max<int64_t>(0, std::min(request, remaining));
  it->pos_ += n;
  return n;
}

absl::StatusOr<std::unique_ptr<TarMemberIterator>> TarMemberIterator::Open(
    std::shared_ptr<const ShardData> shard, int64_t offset) {
  if (offset < 0 || offset > shard->size()) {
    return absl::OutOfRangeError(
        absl::StrCat("shard \"", shard->path(), "\": offset ", offset,
                     " is beyond its ", shard->size(), " bytes"));
  }
  std::unique_ptr<TarMemberIterator> it(new TarMemberIterator());
  it->shard_ = std::move(shard);
  it->start_ = offset;
  it->pos_ = offset;
  it->archive_ = archive_read_new();
  if (it->archive_ == nullptr)
    return absl::ResourceExhaustedError("libarchive");
  archive_read_support_format_tar(it->archive_);
  archive_read_support_format_empty(it->archive_);
  archive_read_support_filter_all(it->archive_);
  if (archive_read_open2(it->archive_, it.get(), nullptr, &ReadCallback,
                         &SkipCallback, nullptr) != ARCHIVE_OK) {
    return it->ArchiveError("cannot open as a tar archive", "");
  }
  return it;
}

TarMemberIterator::~TarMemberIterator() {
  if (archive_ != nullptr) archive_read_free(archive_);
}

absl::Status TarMemberIterator::ArchiveError(absl::string_view what,
                                             absl::string_view member) {
  const char* message = archive_error_string(archive_);
  return absl::DataLossError(absl::StrCat(
      "shard \"", shard_->path(), "\"",
      member.empty() ? "" : absl::StrCat(", member \"", member, "\""), ": ",
      what, ": ", message != nullptr ? message : "unknown libarchive error"));
}

bool TarMemberIterator::seekable() const {
  return archive_filter_code(archive_, 0) == ARCHIVE_FILTER_NONE;
}

int64_t TarMemberIterator::consumed() const {
  return archive_filter_bytes(archive_, 0);
}

absl::StatusOr<std::optional<TarMemberIterator::Member>>
TarMemberIterator::Next() {
  struct archive_entry* entry = nullptr;
  if (at_end_)
    return std::optional<Member>();  // libarchive refuses a second call
  int r = archive_read_next_header(archive_, &entry);
  if (r == ARCHIVE_EOF) {
    at_end_ = true;
    return std::optional<Member>();
  }
  if (r < ARCHIVE_WARN) {
    // The position is an error code itself once the archive is in a state
    // that has none (e.g. after the end was seen).
    const int64_t at = archive_read_header_position(archive_);
    return ArchiveError(
        at >= 0 ? absl::StrCat("damaged tar header near offset ", start_ + at)
                : std::string("damaged tar header"),
        "");
  }
  Member member;
  const char* path = archive_entry_pathname(entry);
  member.path = path != nullptr ? path : "";
  member.header_offset = start_ + archive_read_header_position(archive_);
  member.size = archive_entry_size(entry);
  member.regular = archive_entry_filetype(entry) == AE_IFREG &&
                   archive_entry_hardlink(entry) == nullptr;
  data_consumed_ = false;
  return std::optional<Member>(std::move(member));
}

absl::StatusOr<Payload> TarMemberIterator::ReadData(const Member& member) {
  data_consumed_ = true;
  absl::string_view mapping = shard_->bytes();
  const void* block = nullptr;
  size_t size = 0;
  int64_t offset = 0;
  std::shared_ptr<std::string> copy;
  Payload payload;
  bool first = true;
  while (true) {
    int r = archive_read_data_block(archive_, &block, &size, &offset);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) return ArchiveError("cannot read data", member.path);
    if (size == 0) continue;
    const char* p = static_cast<const char*>(block);
    bool in_mapping =
        p >= mapping.data() && p + size <= mapping.data() + mapping.size();
    if (first && offset == 0 && static_cast<int64_t>(size) == member.size &&
        in_mapping) {
      payload.bytes = absl::string_view(p, size);
      payload.owner = shard_;
      first = false;
      continue;
    }
    if (member.size > max_copy_bytes_ ||
        offset + static_cast<int64_t>(size) > max_copy_bytes_) {
      // A compressed member is copied out whole: one that claims (or turns
      // out) larger than the cap would be held in memory for each reader.
      return absl::ResourceExhaustedError(absl::StrCat(
          "member \"", member.path, "\" of shard \"", shard_->path(), "\" is ",
          std::max<int64_t>(member.size, offset + static_cast<int64_t>(size)),
          " bytes; the limit is ", max_copy_bytes_, " (--max_sample_bytes)"));
    }
    if (copy == nullptr) {
      copy = std::make_shared<std::string>();
      copy->reserve(static_cast<size_t>(std::max<int64_t>(member.size, 0)));
      if (!payload.bytes.empty()) {
        copy->append(payload.bytes.data(), payload.bytes.size());
      }
    }
    // Sparse members: holes read as zeros.
    if (offset > static_cast<int64_t>(copy->size())) {
      copy->resize(static_cast<size_t>(offset), '\0');
    }
    copy->replace(static_cast<size_t>(offset), size, p, size);
    first = false;
  }
  if (copy != nullptr) {
    if (static_cast<int64_t>(copy->size()) < member.size) {
      copy->resize(static_cast<size_t>(member.size), '\0');
    }
    payload.bytes = *copy;
    payload.owner = copy;
  }
  return payload;
}

absl::Status TarMemberIterator::SkipData(const Member& member) {
  data_consumed_ = true;
  if (archive_read_data_skip(archive_) < ARCHIVE_WARN) {
    return ArchiveError("cannot skip data", member.path);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- the index

ShardIndex BuildShardIndex(const std::shared_ptr<const ShardData>& shard) {
  ShardIndex index;
  index.size_bytes = shard->size();
  auto opened = TarMemberIterator::Open(shard, 0);
  if (!opened.ok()) {
    index.damage = std::string(opened.status().message());
    return index;
  }
  TarMemberIterator& members = **opened;
  absl::flat_hash_set<std::string> fields;
  IndexedSample* current = nullptr;
  bool first = true;
  int64_t data_end = -1;  // after the last member's (padded) data
  std::string last_member;
  while (true) {
    const int64_t before = members.consumed();
    auto next = members.Next();
    if (first) {
      index.seekable = members.seekable();
      first = false;
    }
    if (!next.ok()) {
      index.damage = std::string(next.status().message());
      // The sample being assembled may be missing members.
      if (current != nullptr && current->corrupt.empty()) {
        current->corrupt = index.damage;
        current->damage = SampleDamage::kDamagedTar;
      }
      break;
    }
    if (!next->has_value()) {
      // A tar ends with zero blocks. Without them the file was cut at a
      // header boundary, and the last sample may be missing members.
      if (data_end >= 0 &&
          members.consumed() - std::max(before, data_end) < 512) {
        index.damage = absl::StrCat(
            "shard \"", shard->path(),
            "\" ends without the tar end-of-archive marker (truncated after "
            "member \"",
            last_member, "\")");
        if (current != nullptr && current->corrupt.empty()) {
          current->corrupt = index.damage;
          current->damage = SampleDamage::kDamagedTar;
        }
      }
      break;
    }
    const TarMemberIterator::Member& member = **next;
    std::optional<MemberName> name;
    if (member.regular) name = SplitMemberName(member.path);
    if (name.has_value()) {
      if (current == nullptr || current->key != name->key) {
        IndexedSample sample;
        sample.key = name->key;
        sample.offset = member.header_offset;
        index.samples.push_back(std::move(sample));
        current = &index.samples.back();
        fields.clear();
      }
      if (!fields.insert(name->field).second && current->corrupt.empty()) {
        current->corrupt =
            absl::StrCat("shard \"", shard->path(), "\", member \"",
                         member.path, "\": duplicate field \"", name->field,
                         "\" in sample \"", name->key, "\"");
        current->damage = SampleDamage::kDuplicateField;
      }
      current->bytes += member.size;
    }
    absl::Status skipped = members.SkipData(member);
    data_end = members.consumed();
    last_member = member.path;
    if (!skipped.ok()) {
      index.damage = std::string(skipped.message());
      if (current != nullptr && name.has_value() && current->corrupt.empty()) {
        current->corrupt = index.damage;
        current->damage = SampleDamage::kDamagedTar;
      }
      break;
    }
  }
  return index;
}

// ------------------------------------------------------------ sample reader

absl::StatusOr<std::unique_ptr<TarSampleReader>> TarSampleReader::Open(
    std::shared_ptr<const ShardData> shard,
    std::shared_ptr<const ShardIndex> index, int64_t begin,
    int64_t max_member_bytes) {
  if (begin < 0 || begin > index->num_samples()) {
    return absl::OutOfRangeError(
        absl::StrCat("shard \"", shard->path(), "\": sample ", begin,
                     " is beyond its ", index->num_samples(), " samples"));
  }
  std::unique_ptr<TarSampleReader> reader(new TarSampleReader());
  reader->shard_ = std::move(shard);
  reader->index_ = std::move(index);
  reader->next_index_ = begin;
  reader->max_member_bytes_ = max_member_bytes;
  RETURN_IF_ERROR(reader->Reposition(begin));
  return reader;
}

absl::Status TarSampleReader::Reposition(int64_t sample) {
  pending_.reset();
  pending_name_.reset();
  broken_ = false;
  if (sample >= index_->num_samples()) {
    members_.reset();
    return absl::OkStatus();
  }
  int64_t offset = index_->seekable ? index_->samples[sample].offset : 0;
  ASSIGN_OR_RETURN(members_, TarMemberIterator::Open(shard_, offset));
  members_->set_max_copy_bytes(max_member_bytes_);
  next_index_ = index_->seekable ? sample : 0;
  // A compressed shard is read from the start: skip whole samples.
  skip_data_ = true;
  while (next_index_ < sample) {
    auto skipped = Next();
    if (!skipped.ok() || !skipped->has_value() || broken_) {
      skip_data_ = false;
      if (!skipped.ok()) return skipped.status();
      if (skipped->has_value()) return absl::DataLossError((*skipped)->corrupt);
      break;
    }
  }
  skip_data_ = false;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<RawSample>> TarSampleReader::Next() {
  if (next_index_ >= index_->num_samples()) return std::optional<RawSample>();
  if (broken_) {
    if (!index_->seekable) {
      // Cannot re-enter a compressed stream past the break: the rest of the
      // shard is lost with the same error.
      RawSample lost;
      lost.index = next_index_;
      lost.key = index_->samples[next_index_].key;
      lost.corrupt =
          absl::StrCat("unreadable after an earlier error in shard \"",
                       shard_->path(), "\"");
      lost.damage = SampleDamage::kLost;
      ++next_index_;
      return std::optional<RawSample>(std::move(lost));
    }
    RETURN_IF_ERROR(Reposition(next_index_));
  }
  const IndexedSample& expected = index_->samples[next_index_];
  RawSample sample;
  sample.index = next_index_;
  sample.key = expected.key;
  ++next_index_;
  // A sample the index already knows is bad: skip to the next sample's
  // offset (seekable) or walk past its members.
  bool known_corrupt = !expected.corrupt.empty();
  if (known_corrupt) {
    sample.corrupt = expected.corrupt;
    sample.damage = expected.damage;
  }
  if (known_corrupt && index_->seekable) {
    broken_ = true;  // forces a seek to the next sample on the next call
    return std::optional<RawSample>(std::move(sample));
  }
  bool first = true;
  while (true) {
    std::optional<TarMemberIterator::Member> member;
    std::optional<MemberName> name;
    if (pending_.has_value()) {
      member = std::move(pending_);
      name = std::move(pending_name_);
      pending_.reset();
      pending_name_.reset();
    } else {
      // The next regular member with a sample name.
      while (true) {
        auto next = members_->Next();
        if (!next.ok()) {
          if (first) return next.status();  // the index promised a sample
          broken_ = true;
          sample.fields.clear();
          sample.corrupt = std::string(next.status().message());
          sample.damage = SampleDamage::kDamagedTar;
          return std::optional<RawSample>(std::move(sample));
        }
        if (!next->has_value()) break;
        if ((*next)->regular) name = SplitMemberName((*next)->path);
        if (name.has_value()) {
          member = std::move(*next);
          break;
        }
        absl::Status skipped = members_->SkipData(**next);
        if (!skipped.ok()) {
          broken_ = true;
          sample.fields.clear();
          sample.corrupt = std::string(skipped.message());
          sample.damage = SampleDamage::kDamagedTar;
          return std::optional<RawSample>(std::move(sample));
        }
      }
    }
    if (!member.has_value()) {
      if (first) {
        return absl::DataLossError(
            absl::StrCat("shard \"", shard_->path(), "\" ended before sample ",
                         sample.index, " (\"", sample.key,
                         "\") that its index lists; has the file changed?"));
      }
      break;
    }
    if (name->key != sample.key) {
      if (first) {
        return absl::DataLossError(absl::StrCat(
            "shard \"", shard_->path(), "\": expected sample ", sample.index,
            " \"", sample.key, "\" at offset ", expected.offset, ", found \"",
            member->path, "\"; has the file changed?"));
      }
      pending_ = std::move(member);
      pending_name_ = std::move(name);
      break;
    }
    first = false;
    if (known_corrupt || skip_data_) {
      absl::Status skipped = members_->SkipData(*member);
      if (!skipped.ok()) broken_ = true;
      continue;
    }
    auto data = members_->ReadData(*member);
    if (!data.ok() &&
        data.status().code() == absl::StatusCode::kResourceExhausted &&
        members_->SkipData(*member).ok()) {
      // Too large to hold: the sample is corrupt, its other members skipped.
      sample.fields.clear();
      sample.corrupt = std::string(data.status().message());
      sample.damage = SampleDamage::kDamagedTar;
      known_corrupt = true;
      continue;
    }
    if (!data.ok()) {
      broken_ = true;
      sample.fields.clear();
      sample.corrupt = std::string(data.status().message());
      sample.damage = SampleDamage::kDamagedTar;
      return std::optional<RawSample>(std::move(sample));
    }
    sample.fields.push_back(RawField{std::move(name->field), *std::move(data)});
  }
  return std::optional<RawSample>(std::move(sample));
}

}  // namespace sluice::dataserver
