// A tar writer for tests that lays shards out as webdataset's TarWriter
// (Python tarfile) does, plus the odd cases real shards contain: GNU
// long-name and pax path headers, directory entries, symlinks, empty
// members. Output is byte-exact and deterministic (mtime 0, uid/gid 0).
#ifndef SLUICE_TESTS_TESTING_TAR_WRITER_H_
#define SLUICE_TESTS_TESTING_TAR_WRITER_H_

#include <string>
#include <vector>

namespace sluice::testing {

class TarWriter {
 public:
  enum class LongNames { kGnu, kPax };
  explicit TarWriter(LongNames long_names = LongNames::kPax)
      : long_names_(long_names) {}

  // A regular file. Names over 100 bytes get a GNU 'L' or pax 'x' header.
  TarWriter& File(const std::string& name, const std::string& data);
  // A regular file preceded by a pax header even if the name is short.
  TarWriter& PaxFile(const std::string& name, const std::string& data);
  TarWriter& Directory(const std::string& name);
  TarWriter& Symlink(const std::string& name, const std::string& target);

  // Offset where the next member's first header will start.
  size_t offset() const { return out_.size(); }
  // The archive with its two zero end blocks.
  std::string Finish() const;

 private:
  void Header(const std::string& name, char type, size_t size,
              const std::string& linkname, bool gnu_magic);
  void Data(const std::string& data);
  void LongName(const std::string& name, bool force_pax);

  LongNames long_names_;
  std::string out_;
};

// Writes `bytes` to `path` (test helper; aborts the test on failure).
void WriteFile(const std::string& path, const std::string& bytes);
std::string ReadFileOrDie(const std::string& path);

// Gzip-compresses (for .tar.gz shards).
std::string Gzip(const std::string& bytes);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_TAR_WRITER_H_
