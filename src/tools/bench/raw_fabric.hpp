#pragma once
/// Raw libfabric one-sided write baseline for the benchmark: plain `FI_EP_RDM` + `fi_writedata`,
/// deliberately independent of Ferry's transport engine, so Ferry's numbers can be compared with
/// what the fabric itself delivers on the same machine in the same run.
///
/// Usage: two processes (typically a fork) share a connected stream socket (socketpair or TCP).
/// One calls `raw_target`, the other `raw_initiator`, on the same provider.
///
/// Protocol on the socket (same binary on both ends, native byte order): the target sends a
/// `hello` (fabric address, region key, remote base, length); the initiator answers `start`
/// (how many remote CQ data entries to expect) and posts its writes; the target counts the
/// arrived remote CQ data entries, then replies `done` (count and optional checksum of its
/// buffer). Either side sends `error` with a text instead if it fails, so the other does not
/// wait for its timeout.
///
/// Commit styles (`raw_options::cq_data_per_write`):
/// - true (Ferry's design): every write is an `fi_writedata`; the target counts one entry per
///   write, so arrival is proven per write.
/// - false: plain `fi_write`s, then, after all their local completions, one `fi_writedata`
///   marker (8 bytes re-written at the last write's destination). Valid on tcp (writes on one
///   connection arrive in order) and shm (a plain write is copied by the initiator before it
///   completes). It measures shm's fast path: libfabric's shm takes its single-command
///   CMA path (initiator-side process_vm_writev) only for writes without remote CQ data and
///   without FI_DELIVERY_COMPLETE; with remote CQ data the target pulls the bytes itself.
///
/// Waiting: providers with an FI_WAIT_FD CQ (tcp) block in poll() on the CQ fd and the socket
/// when idle; others (shm) poll the CQ and back off with short sleeps. Neither side spins
/// forever, which matters on 2-core machines.
///
/// Not thread-safe; each call opens and closes its own fabric objects.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ferry::bench {

/// One write: initiator bytes [src_offset, src_offset+length) to target bytes
/// [dst_offset, dst_offset+length).
struct raw_write {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
};

/// Settings shared by both sides.
struct raw_options {
  std::string provider = "tcp";       ///< libfabric provider ("tcp" resolves to tcp;ofi_rxm)
  std::string address = "127.0.0.1";  ///< bind address for IP providers; ignored by shm
  int timeout_ms = 30000;             ///< bound on the whole call
  int poll_us = 30;  ///< empty CQ polls continue this long before waiting; < 0: never wait
                     ///< (busy-poll: unfair on few cores, often slower there)
  bool cq_data_per_write = true;  ///< initiator only: see "Commit styles" above
  /// Paced: the writes form rooms of `room_writes` consecutive writes, and the initiator may
  /// post a room's writes only once the target granted the room with one `go` message on the
  /// socket; the target grants `rooms_in_flight` rooms at the start and one more each time a
  /// room's last notification arrives. One control message and one notification count per
  /// room, as a decode room's prepare and commit: the raw bound of a room's round trip.
  /// 0: not paced (every write may go at once, the window permitting).
  uint32_t room_writes = 0;
  uint32_t rooms_in_flight = 1;
  /// Not paced: the first `warmup_writes` writes go first and complete before the clock starts,
  /// and their bytes are not counted: the timed writes then find both buffers already touched
  /// by the fabric, as an engine's pools are (first touches of fresh memory cost up to 40 x a
  /// later access on some VMs, docs/performance.md §24).
  size_t warmup_writes = 0;
};

/// What the target saw.
struct raw_target_result {
  std::string error;      ///< empty = success
  uint64_t writes = 0;    ///< remote CQ data entries counted (the initiator's announced count)
  uint64_t checksum = 0;  ///< raw_checksum of the buffer after all writes (if requested)
};

/// What the initiator measured.
struct raw_initiator_result {
  std::string error;             ///< empty = success (including the target's own error text)
  double seconds = 0;            ///< first post until the target's `done` arrived
  uint64_t bytes = 0;            ///< sum of the writes' lengths
  uint64_t target_writes = 0;    ///< writes the target counted
  uint64_t target_checksum = 0;  ///< the target's checksum (0 if it was not asked for one)
  std::string provider;          ///< provider actually used, e.g. "tcp;ofi_rxm"
};

/// Target side: open an endpoint, register `buffer` (`length` bytes, caller-owned and
/// preferably pre-faulted), publish it on `fd`, progress the CQ until the remote CQ data entries
/// announced by the initiator arrived, optionally checksum the buffer, and reply `done` on `fd`.
raw_target_result raw_target(const raw_options& options, int fd, void* buffer, uint64_t length,
                             bool checksum);

/// Initiator side: open an endpoint, register `source` (`length` bytes), read the target's
/// `hello` from `fd`, post `writes` in order with at most `window` in flight (with remote CQ
/// data = the write's index, per `cq_data_per_write`), wait for all local completions and the
/// target's `done`. `seconds` runs from the first post to the arrival of `done`.
raw_initiator_result raw_initiator(const raw_options& options, int fd, const void* source,
                                   uint64_t length, const std::vector<raw_write>& writes,
                                   uint32_t window);

/// The latency reference (raw_latency.cpp): one TCP control message, then a room's writes with
/// remote CQ data, and the target's notifications, timed by the target from the moment it sends
/// the message until it has counted the last notification. Two processes on one machine:
/// - the target (this process) measures: for each sample it stays idle for the gap, then sends
///   `go` on a loopback TCP connection (TCP_NODELAY) and progresses its CQ until every write of
///   the room has been notified;
/// - the initiator (a forked child) has a control thread blocked in a read of that connection
///   (as ferryd's peer connections are read) that queues each `go` for its progress thread and
///   wakes it through an eventfd; the progress thread posts the writes (`fi_writedata`, at most
///   `window` in flight) and reads its CQ.
/// Both progress loops wait as Ferry's progress thread does (transport/fabric_progress.cpp, its
/// constants copied, not shared): spin 30 µs after activity, then on an FI_WAIT_FD CQ (tcp)
/// fi_trywait and ppoll on the CQ's fd and the eventfd, at most 1 ms while writes are in flight
/// and 10 ms otherwise; without one (shm) sleeps doubling from 20 µs, capped at 200 µs within
/// 20 ms of the last activity or within 100 ms of the target's `go` (a decode room's prepares give
/// its engine that hint, engine::expect_writes), 1 ms within 1 s, 4 ms beyond.
class raw_latency_reference {
 public:
  /// Fork the initiator, open both endpoints and exchange addresses. `room`: the room's writes
  /// (offsets into source and target buffers this object allocates, sized to the writes; the
  /// source is filled with a pattern). Null with `error` set when something failed.
  static std::unique_ptr<raw_latency_reference> start(const raw_options& options,
                                                      std::vector<raw_write> room, uint32_t window,
                                                      std::string& error);
  /// Tells the initiator to stop and waits for it (bounded; killed after 5 s).
  ~raw_latency_reference();
  raw_latency_reference(const raw_latency_reference&) = delete;
  raw_latency_reference& operator=(const raw_latency_reference&) = delete;

  /// `warmup` untimed rooms, then `samples` timed ones, each after `gap` of idleness; with
  /// `single_write` the room is one write of all its bytes (source offset 0 to target offset
  /// 0) instead of its writes. Appends the latencies in ms to `ms_out`; returns an error text
  /// (empty on success).
  std::string measure(bool single_write, std::chrono::microseconds gap, uint32_t warmup,
                      uint32_t samples, std::vector<double>& ms_out);
  /// The provider actually used, e.g. "tcp;ofi_rxm".
  const std::string& provider() const;
  /// The buffers (the target's is written by the samples), `bytes()` long.
  const uint8_t* source() const;
  const uint8_t* target() const;
  uint64_t bytes() const;
  /// Writes of one room, and notifications counted so far.
  size_t room_writes() const;
  uint64_t notifications() const;

  struct state;

 private:
  explicit raw_latency_reference(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

/// Order-sensitive 64-bit checksum over whole 8-byte words plus the tail bytes (fast enough to
/// verify a 1 GiB target buffer).
uint64_t raw_checksum(const void* data, uint64_t length);

}  // namespace ferry::bench
