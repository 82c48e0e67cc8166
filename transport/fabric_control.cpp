// The callers' side of the progress thread: queueing commands and submissions for it, waking it,
// starting and stopping it (the design is at the top of fabric_engine.hpp).
#include <unistd.h>

#include "transport/fabric_engine.hpp"

namespace ferry::transport::detail {

void fabric_engine::run_queued(std::function<void()> task) {
  if (on_progress_thread()) return task();
  {
    std::unique_lock<std::mutex> lock(queue_mutex_);
    if (state_ == run_state::running || state_ == run_state::draining) {
      // Asynchronous: the caller must not block on the fabric (nor on a stop's drain, which
      // runs what is queued meanwhile); FIFO order with submissions makes everything submitted
      // before this call see the task's effect.
      queue_.push_back(work_item{nullptr, std::move(task)});
      queue_nonempty_.store(true);
      lock.unlock();
      wake();
      return;
    }
  }
  std::lock_guard<std::recursive_mutex> guard(fabric_mutex_);
  task();
}

uint32_t fabric_engine::submit(write_batch batch) {
  const uint32_t notes = notifications(batch);
  auto b = std::make_unique<batch_state>(std::move(batch));
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (state_ == run_state::idle || state_ == run_state::running) {
      queue_.push_back(work_item{std::move(b), nullptr});
      queue_nonempty_.store(true);
    }
  }
  if (b) {
    // Stopped: nobody will post it; fail here, on the caller's thread.
    b->abort_unposted(stopped_error);
    invoke_callback(*log_, "batch_done", b->batch.done, std::move(b->result));
    return notes;
  }
  wake();
  return notes;
}

void fabric_engine::cancel_writes(std::shared_ptr<write_cancel> cancel) {
  if (!cancel) return;
  // The flag covers batches still in the submission queue and later ones (`admit`); the task
  // takes those already waiting in the posting queue out of it now, so their `done` need not
  // wait for their turn.
  cancel->cancelled.store(true);
  run_queued([this, cancel] { do_cancel_writes(cancel.get()); });
}

void fabric_engine::return_immediate_credit() {
  credit_returned_.store(true);
  wake();
}

void fabric_engine::expect_writes(std::chrono::milliseconds window) {
  if (wait_kind_ == wait_kind::fd) return;  // arrivals wake the thread through the CQ's fd
  const int64_t until = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            (clock_type::now() + window).time_since_epoch())
                            .count();
  int64_t seen = expect_until_ns_.load();
  while (seen < until && !expect_until_ns_.compare_exchange_weak(seen, until)) {
  }
  wake();  // a thread in a long sleep starts again from its shortest step
}

void fabric_engine::wake() {
  // Pairs with the sleeping_ store / queue re-check in block(): one of the two sides always sees
  // the other (both seq_cst), so a wake-up is never lost and the common case costs no syscall.
  if (sleeping_.load()) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
  }
}

void fabric_engine::start(std::function<void(immediate_counts)> immediates) {
  std::lock_guard<std::mutex> lifecycle(lifecycle_mutex_);
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (state_ != run_state::idle) {
      log_->warn("engine::start called twice or after stop; ignored");
      return;
    }
    state_ = run_state::running;
  }
  immediates_ = std::move(immediates);
  // The thread takes fabric_mutex_ before touching anything; direct callers cannot interleave
  // because state_ is already running.
  thread_ = std::thread([this] { run(); });
}

void fabric_engine::stop() {
  if (on_progress_thread()) {
    // From a callback: the thread cannot join itself; it winds down after this iteration and
    // the destructor joins it.
    stop_requested_.store(true);
    return;
  }
  std::lock_guard<std::mutex> lifecycle(lifecycle_mutex_);
  std::deque<work_item> never_started;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (state_ == run_state::idle) {
      state_ = run_state::stopped;
      never_started.swap(queue_);
    }
  }
  if (thread_.joinable()) {
    stop_requested_.store(true);
    wake();
    thread_.join();
  }
  // Work queued before a start that never came: fail batches, run commands directly.
  std::lock_guard<std::recursive_mutex> guard(fabric_mutex_);
  for (auto& item : never_started) {
    if (item.batch) {
      item.batch->abort_unposted(stopped_error);
      invoke_callback(*log_, "batch_done", item.batch->batch.done, std::move(item.batch->result));
    } else if (item.task) {
      item.task();
    }
  }
}

}  // namespace ferry::transport::detail
