#include "actors/name_resolver.hpp"

#include <netdb.h>
#include <pthread.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

namespace ferry {

struct name_resolver::state {
  struct lookup {
    std::string host;
    uint16_t port = 0;
    done_fn done;
  };
  std::mutex m;
  std::condition_variable cv;
  bool stopping = false;          // guarded by m
  std::deque<lookup> queue;       // guarded by m
  std::optional<lookup> current;  // guarded by m: the one being resolved
  std::thread thread;             // started with the first lookup

  void run() {
    pthread_setname_np(pthread_self(), "ferry.resolver");
    std::unique_lock lk(m);
    for (;;) {
      cv.wait(lk, [&] { return stopping || !queue.empty(); });
      if (stopping) return;
      current = std::move(queue.front());
      queue.pop_front();
      const std::string host = current->host;
      const std::string service = std::to_string(current->port);
      lk.unlock();
      addrinfo hints{}, *res = nullptr;
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_flags = AI_NUMERICSERV;
      const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);  // may take long
      lk.lock();
      if (stopping) {  // stop() answered it
        if (rc == 0) freeaddrinfo(res);
        return;
      }
      auto l = std::move(*current);
      current.reset();
      if (rc != 0) {
        l.done(nullptr, "cannot resolve " + host + ": " + gai_strerror(rc));
        continue;
      }
      address a;
      std::memcpy(&a.addr, res->ai_addr, res->ai_addrlen);
      a.len = res->ai_addrlen;
      freeaddrinfo(res);
      l.done(&a, {});
    }
  }
};

name_resolver::name_resolver() : s_(std::make_shared<state>()) {}

name_resolver::~name_resolver() { stop(); }

void name_resolver::resolve(std::string host, uint16_t port, done_fn done) {
  {
    std::lock_guard g(s_->m);
    if (!s_->stopping) {
      s_->queue.push_back({std::move(host), port, std::move(done)});
      if (!s_->thread.joinable()) s_->thread = std::thread([s = s_] { s->run(); });
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
    if (s_->current) {
      left.push_back(std::move(*s_->current));
      s_->current.reset();
    }
    s_->cv.notify_one();
    // Not joined: it may be inside getaddrinfo for as long as the system's resolver retries.
    if (s_->thread.joinable()) s_->thread.detach();
  }
  for (auto& l : left) l.done(nullptr, "the daemon is stopping");
}

}  // namespace ferry
