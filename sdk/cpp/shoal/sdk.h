// Shoal's training SDK for C++: crash-safe checkpoint files and reports to the node's agent.
//
// Header-only, C++17, POSIX (Linux for abstract socket addresses), nothing beyond the standard
// library and libc. A checkpoint directory is a local path or hdfs://namenode[:port]/path,
// read and written through WebHDFS (a minimal HTTP/1.1 client here, as the Python SDK's
// WebHdfsStorage). The Python SDK (sdk/python/shoal) is the reference; these headers speak the
// same protocol (docs/sdk-protocol.md) and write the same files (docs/sdk.md), so either
// language loads the other's checkpoints (Python with `serializer="raw"`).
//
// Include this header; the ones it includes are its parts. Two independent layers:
// - Checkpoint files (checkpoint.h): SaveCheckpoint / LoadLatestCheckpoint / ListCheckpoints,
//   in a local directory (local_files.h) or through WebHDFS (webhdfs.h, http_client.h), named
//   as checkpoint_format.h says. They never talk to the agent: after a save call
//   ReportCheckpointed(step); after loading (or finding nothing) call ReportResumed(step or 0),
//   which the master waits for after a group restart before handing out data shards.
// - Publishing models (publish.h): PublishModel writes a new version of a model into a model
//   repository for `shoal serve` (a directory, or hdfs:// through WebHDFS), with the Python
//   SDK's protocol (local: lock, hidden directory, fsync, rename; hdfs://: a claimed number, a
//   hidden directory, one rename; numbering, pruning), and reports it to the agent. Returns a
//   PublishResult.
// - Reports (reports.h): ReportProgress / ReportCheckpointed (fire-and-forget) and ReportResumed
//   (waits for the agent's answer), over the agent connection (agent_client.h) or, for
//   progress, the task's progress board (progress_board.h). No-ops when SHOAL_AGENT_SOCKET is
//   unset (not started by Shoal).
//
// Errors are values: nothing here throws (beyond std::bad_alloc). SaveCheckpoint returns a
// SaveResult, ReportResumed a ReportResult; fire-and-forget reports and skipped corrupt
// checkpoints print one line to stderr.
//
// Thread-safety: every function may be called from any thread. The agent connection is one per
// process, guarded by a mutex, and re-made in a forked child (a pthread_atfork handler takes the
// mutex around fork(), so a fork waits for a ReportResumed in flight on another thread).
#pragma once

#include "shoal/checkpoint.h"
#include "shoal/checkpoint_format.h"
#include "shoal/publish.h"
#include "shoal/reports.h"
