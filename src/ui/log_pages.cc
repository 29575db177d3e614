#include "ui/log_pages.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/unique_fd.h"

namespace shoal::ui {
namespace {

constexpr int64_t kChunk = 64 << 10;

bool Wanted(const LogLine& line, const std::string& task) { return task.empty() || line.task == task; }

ssize_t ReadAt(int fd, char* buf, size_t n, int64_t offset) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, buf + done, n - done, offset + static_cast<int64_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? r : static_cast<ssize_t>(done);
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

}  // namespace

void SplitLogLine(std::string_view line, LogLine& out) {
  size_t bar = line.find(" | ");
  // A task name is "<role>:<index>": short, no spaces.
  if (bar != std::string_view::npos && bar < 128 && line.substr(0, bar).find(' ') == std::string_view::npos &&
      line.substr(0, bar).find(':') != std::string_view::npos) {
    out.task = std::string(line.substr(0, bar));
    out.text = std::string(line.substr(bar + 3));
  } else {
    out.task.clear();
    out.text = std::string(line);
  }
}

absl::StatusOr<LogPage> ReadLogPage(const std::string& path, const LogPageRequest& request) {
  if (request.before && request.after) {
    return absl::InvalidArgumentError("give either before or after, not both");
  }
  if (request.limit < 1 || request.limit > 5000) {
    return absl::InvalidArgumentError("limit: must be between 1 and 5000");
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return absl::NotFoundError("the job has no output yet");
    return ErrnoStatus(absl::StrCat("open ", path), errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat ", path), errno);
  LogPage page;
  page.file_size = st.st_size;
  for (auto* offset : {&request.before, &request.after}) {
    if (*offset && (**offset < 0 || **offset > page.file_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          offset == &request.before ? "before" : "after", ": offset ", **offset,
          " is outside the log (0..", page.file_size, ")"));
    }
  }
  std::string buf;
  if (request.after) {
    // Forward: whole lines from `after`, up to the last newline in reach.
    int64_t pos = *request.after;
    int64_t scanned = 0;
    std::string carry;
    int64_t carry_offset = pos;
    page.start_offset = pos;
    page.end_offset = pos;
    while (pos < page.file_size && static_cast<int>(page.lines.size()) < request.limit &&
           scanned < request.max_scan_bytes) {
      int64_t n = std::min(kChunk, page.file_size - pos);
      buf.resize(static_cast<size_t>(n));
      ssize_t got = ReadAt(fd.get(), buf.data(), buf.size(), pos);
      if (got <= 0) break;
      buf.resize(static_cast<size_t>(got));
      size_t begin = 0;
      for (size_t nl = buf.find('\n'); nl != std::string::npos; nl = buf.find('\n', begin)) {
        std::string_view piece(buf.data() + begin, nl - begin);
        LogLine line;
        line.offset = carry.empty() ? pos + static_cast<int64_t>(begin) : carry_offset;
        if (!carry.empty()) {
          carry.append(piece);
          SplitLogLine(carry, line);
          carry.clear();
        } else {
          SplitLogLine(piece, line);
        }
        page.end_offset = pos + static_cast<int64_t>(nl) + 1;
        begin = nl + 1;
        if (Wanted(line, request.task)) {
          page.lines.push_back(std::move(line));
          if (static_cast<int>(page.lines.size()) >= request.limit) break;
        }
      }
      if (static_cast<int>(page.lines.size()) >= request.limit) break;
      if (carry.empty()) carry_offset = pos + static_cast<int64_t>(begin);
      carry.append(buf, begin, std::string::npos);
      pos += got;
      scanned += got;
    }
    page.more_before = page.start_offset > 0;
    return page;
  }
  // Backward: from `before` (or the end of the last complete line) towards the start.
  // `before` from an earlier page is a line start; any other is taken back to one.
  int64_t end = request.before.value_or(page.file_size);
  if (end > 0) {
    // Drop a line still being written.
    int64_t pos = end;
    bool found = false;
    while (pos > 0 && !found && end - pos < request.max_scan_bytes) {
      int64_t n = std::min(kChunk, pos);
      buf.resize(static_cast<size_t>(n));
      if (ReadAt(fd.get(), buf.data(), buf.size(), pos - n) != n) break;
      size_t nl = buf.rfind('\n');
      if (nl != std::string::npos) {
        end = pos - n + static_cast<int64_t>(nl) + 1;
        found = true;
      }
      pos -= n;
    }
    if (!found) end = 0;
  }
  page.end_offset = end;
  // `data` holds the bytes [data_start, boundary): boundary is a line start (or `end`), so
  // data's last byte is a newline; lines are cut off its end one by one.
  std::vector<LogLine> reversed;
  std::string data;
  int64_t data_start = end;
  int64_t boundary = end;
  int64_t scanned = 0;
  bool done = end == 0;
  while (!done && static_cast<int>(reversed.size()) < request.limit &&
         scanned < request.max_scan_bytes) {
    int64_t n = std::min(kChunk, data_start);
    buf.resize(static_cast<size_t>(n));
    if (ReadAt(fd.get(), buf.data(), buf.size(), data_start - n) != n) break;
    data.insert(0, buf);
    data_start -= n;
    scanned += n;
    size_t stop = data.size();
    while (stop > 0 && static_cast<int>(reversed.size()) < request.limit) {
      size_t nl = stop >= 2 ? data.rfind('\n', stop - 2) : std::string::npos;
      size_t line_begin;
      if (nl != std::string::npos) {
        line_begin = nl + 1;
      } else if (data_start == 0) {
        line_begin = 0;
      } else {
        break;  // the line starts in an earlier chunk
      }
      LogLine line;
      line.offset = data_start + static_cast<int64_t>(line_begin);
      SplitLogLine(std::string_view(data.data() + line_begin, stop - line_begin - 1), line);
      if (Wanted(line, request.task)) reversed.push_back(std::move(line));
      stop = line_begin;
    }
    data.resize(stop);
    boundary = data_start + static_cast<int64_t>(stop);
    done = boundary == 0;
  }
  int64_t first_line_start = boundary;
  page.start_offset = first_line_start;
  page.more_before = page.start_offset > 0;
  page.lines.assign(std::make_move_iterator(reversed.rbegin()),
                    std::make_move_iterator(reversed.rend()));
  return page;
}

}  // namespace shoal::ui
