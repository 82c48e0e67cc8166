#include "os/name_resolver.hpp"

#include <netdb.h>
#include <pthread.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

namespace ferry {

struct name_resolver::state {
  struct lookup {
    std::string host;
    uint16_t port = 0;
    done_fn done;
    uint64_t id = 0;
  };
  std::mutex m;
  std::condition_variable cv;
  bool stopping = false;                      // guarded by m
  std::deque<lookup> queue;                   // guarded by m
  std::unordered_map<uint64_t, lookup> busy;  // guarded by m: being resolved, by id
  uint64_t next_id = 0;                       // guarded by m
  size_t threads = 0, idle = 0;               // guarded by m
  std::vector<std::thread> pool;              // guarded by m
  lookup_fn look_up;                          // how a name is looked up

  void run() {
    pthread_setname_np(pthread_self(), "ferry.resolver");
    std::unique_lock lk(m);
    for (;;) {
      ++idle;
      cv.wait(lk, [&] { return stopping || !queue.empty(); });
      --idle;
      if (stopping) return;
      auto l = std::move(queue.front());
      queue.pop_front();
      const uint64_t id = l.id;
      const std::string host = l.host;
      const uint16_t port = l.port;
      busy.emplace(id, std::move(l));
      lk.unlock();
      address a;
      std::string error;
      const bool found = look_up(host, port, a, error);  // may take long
      lk.lock();
      if (stopping) return;  // stop() answered it
      auto it = busy.find(id);
      auto done = std::move(it->second.done);
      busy.erase(it);
      if (!found) {
        done(nullptr, "cannot resolve " + host + ": " + error);
        continue;
      }
      done(&a, {});
    }
  }
};

bool name_resolver::system_lookup(const std::string& host, uint16_t port, address& out,
                                  std::string& error) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  if (const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res)) {
    error = gai_strerror(rc);
    return false;
  }
  std::memcpy(&out.addr, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  freeaddrinfo(res);
  return true;
}

name_resolver::name_resolver(lookup_fn lookup) : s_(std::make_shared<state>()) {
  s_->look_up = std::move(lookup);
}

name_resolver::~name_resolver() { stop(); }

void name_resolver::resolve(std::string host, uint16_t port, done_fn done) {
  {
    std::lock_guard g(s_->m);
    if (!s_->stopping) {
      s_->queue.push_back({std::move(host), port, std::move(done), s_->next_id++});
      // A thread per lookup in progress, up to max_threads: one name whose DNS server does not
      // answer holds one thread, not every lookup behind it.
      if (s_->idle == 0 && s_->threads < max_threads) {
        ++s_->threads;
        s_->pool.emplace_back([s = s_] { s->run(); });
      }
      s_->cv.notify_one();
      return;
    }
  }
  done(nullptr, "the daemon is stopping");
}

void name_resolver::stop() {
  std::deque<state::lookup> left;
  {
    std::lock_guard g(s_->m);
    if (s_->stopping) return;
    s_->stopping = true;
    left.swap(s_->queue);
    for (auto& [id, l] : s_->busy) left.push_back(std::move(l));
    s_->busy.clear();
    s_->cv.notify_all();
    // Not joined: a thread may be inside getaddrinfo for as long as the system's resolver
    // retries.
    for (auto& t : s_->pool) t.detach();
    s_->pool.clear();
  }
  for (auto& l : left) l.done(nullptr, "the daemon is stopping");
}

}  // namespace ferry
