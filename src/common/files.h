#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shoal {

// Replaces `path` with `contents` so that a reader sees either the old or the new file, never a
// torn one, even across a crash: write a temporary sibling, fsync it, rename, fsync the directory.
absl::Status WriteFileAtomically(const std::string& path, std::string_view contents,
                                 int mode = 0644);
// The same without the fsyncs: readers never see a torn file, but a machine crash may lose
// the update. For state that does not outlive the machine's processes (pids, live holds),
// where two fsyncs would cost more than the whole operation.
absl::Status ReplaceFile(const std::string& path, std::string_view contents, int mode = 0644);

// Writes all of `data` to `fd` (retrying short writes and EINTR); the error names `path`.
absl::Status WriteAll(int fd, std::string_view data, std::string_view path);

absl::StatusOr<std::string> ReadFile(const std::string& path);

// A credential from a file: its content without surrounding whitespace. InvalidArgument names
// the file when it cannot be read or is empty; the token itself is never in a message.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// mkdir -p with a clear error naming the path.
absl::Status MakeDirs(const std::string& path, int mode = 0755);

// A new directory `parent`/`prefix`XXXXXX, mode 0700, under a name no other caller gets
// (mkdtemp). `parent` empty: $TMPDIR, else /tmp. The error names the directory it tried.
absl::StatusOr<std::string> MakeTemporaryDirectory(std::string_view prefix,
                                                   std::string parent = "");

// $TMPDIR, else /tmp.
std::string TemporaryDirectoryRoot();

// An error status naming `what` and strerror(errno).
absl::Status ErrnoStatus(std::string_view what, int err);

}  // namespace shoal
