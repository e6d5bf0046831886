// A fresh directory removed (recursively) when the object goes away.
#ifndef SLUICE_TESTS_TESTING_TEMP_DIR_H_
#define SLUICE_TESTS_TESTING_TEMP_DIR_H_

#include <set>
#include <string>

namespace sluice::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The names of the entries directly in `dir`.
std::set<std::string> FileNames(const std::string& dir);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_TEMP_DIR_H_
