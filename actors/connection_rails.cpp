// The Connection's exchange of fabric endpoints with its peer (peer protocol 7, `peer_rails`):
// the prefill side lists its endpoints once ready; the decode side makes them known on its
// own rails (engine::add_peer_rails: its fence then cuts them too) and only then answers with
// its own, which the prefill adds in turn. A list that does not check ends the connection.
#include "actors/connection_state.hpp"
#include "actors/peer_hello.hpp"

namespace ferry::conn {

namespace {

/// The peer's fabric endpoints: pair them with ours and make them known on our rails; the answer
/// arrives as `rails_added`. A list that does not check ends the connection.
void take_rails(connection_actor* self, const peer_rails& m) {
  auto& st = self->state;
  auto kinds = check_peer_rails(m);
  if (!kinds) return apply(self, st.machine.on(hs::ev::lost{kinds.message}));
  const bool answer = st.machine.which() == hs::side::connecting;
  auto add = rails_to_add(*st.ctx->engine, m, kinds.value);
  auto me = caf::actor_cast<caf::actor>(self);
  st.ctx->engine->add_peer_rails(*st.handle, std::move(add), [me, answer](result<uint32_t> r) {
    caf::anon_send(me, rails_added{std::move(r), answer});
  });
}

}  // namespace

void rails_when_ready(connection_actor* self) {
  auto& st = self->state;
  if (st.info->version < peer_rails_version) return;  // an older peer could not read a list
  if (st.machine.which() == hs::side::accepting) {
    send(st, describe_rails(*st.ctx->engine));
  } else if (st.early_rails) {
    auto m = std::move(*st.early_rails);
    st.early_rails.reset();
    take_rails(self, m);
  }
}

void on_peer_rails(connection_actor* self, peer_rails& m) {
  auto& st = self->state;
  if (st.machine.closed()) return;
  if (!st.machine.ready()) {
    // The prefill sends its rails right behind its hello, before our insertion answered.
    if (st.machine.which() == hs::side::connecting) st.early_rails = std::move(m);
    return;
  }
  heard(st);
  take_rails(self, m);
}

void on_rails_added(connection_actor* self, rails_added& m) {
  auto& st = self->state;
  if (st.machine.closed()) return;  // the fence removes what was added, on every rail
  if (!m.outcome)
    st.ctx->log_peer->warn("peer={} fabric endpoints could not all be added: {}", st.address,
                           m.outcome.message);
  if (m.answer) {
    // Only the endpoints we can cut: after a failure, rail 0 alone.
    auto ours = describe_rails(*st.ctx->engine);
    if (!m.outcome) ours.rails.resize(1);
    send(st, ours);
  }
  const auto used = st.ctx->engine->peer_rails(*st.handle);
  st.ctx->log_peer->info("peer={} fabric endpoints: {} of ours in use with it", st.address,
                         used.size());
}

}  // namespace ferry::conn
