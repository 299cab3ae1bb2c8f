#pragma once

// Test support: a fresh directory under the temp dir, removed with all it
// holds when the object goes away.

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace meshrun::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "meshrun-test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (!mkdtemp(pattern.data()))
      throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // The path of `name` in the directory.
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  // Writes `text` to the file `name` in the directory with `mode` (owner-only
  // by default, as token files must be); returns its path.
  std::string Write(const std::string& name, const std::string& text,
                    mode_t mode = 0600) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
    chmod(file.c_str(), mode);
    return file;
  }

 private:
  std::string path_;
};

}  // namespace meshrun::testing
