#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>

#include "shoal/v1/shoal.grpc.pb.h"

namespace shoal::master {

class ControlPlane;
class AsyncCall;

// The gRPC face of a job's master (its ControlPlane, control_plane.h), on gRPC's completion-queue API served by one thread of its own.
// Handlers only post to the master or read its snapshot; every call must carry the job token.
//
// Why one completion queue and one thread: a master hears from every agent once a heartbeat
// interval, each at its own moment, so nearly every message is a wake-up of its own. With
// gRPC's synchronous or callback API two or more threads take turns polling and each wake-up
// became two thread switches (one to poll, one to hand the poller role on), a third of the
// master's CPU under 10,000 heartbeating tasks. One thread that polls and handles what it finds
// wakes once. Thousands of agents and watchers still cost no thread each, and the master never
// blocks on a slow agent (writes are queued per stream).
class MasterService {
 public:
  explicit MasterService(ControlPlane* master) : master_(master) {}
  ~MasterService();

  // Before the server is built: registers the methods and makes the completion queue.
  void Register(grpc::ServerBuilder* builder);
  // After BuildAndStart: starts the thread and waits for the first calls.
  void Start();
  // After the server's Shutdown: drains the queue, ends the thread, frees the calls left.
  void Stop();

  // ---- for the calls (on the service's thread, or Send/Close from any thread)
  ControlPlane* master() const { return master_; }
  v1::Master::AsyncService* service() { return &service_; }
  grpc::ServerCompletionQueue* queue() { return queue_.get(); }
  bool Authorized(const grpc::ServerContextBase* context) const;
  // Held (shared) while an operation is started on the queue, so that none starts once Stop
  // shut it down; false when stopping.
  std::shared_mutex& start_mu() { return start_mu_; }
  bool stopping() const { return stopping_; }
  // Every call not yet deleted, so that Stop frees those gRPC never completed (a watcher that
  // had no write in flight when the server shut down).
  void Track(AsyncCall* call);
  void Untrack(AsyncCall* call);

 private:
  void Serve();

  ControlPlane* master_;  // outlives the service
  v1::Master::AsyncService service_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::thread thread_;
  std::shared_mutex start_mu_;
  bool stopping_ = false;  // guarded by start_mu_
  bool stopped_ = false;
  std::mutex live_mu_;
  std::set<AsyncCall*> live_;
};

}  // namespace shoal::master
