// The client side of one connection as a pure machine (core/client_session.hpp).
#include "core/client_session.hpp"

#include <fmt/format.h>

#include <string_view>

namespace ferry::proto {

namespace {

/// The reply each request expects (an error may answer any); ok for a type that is no request.
msg_type expected_reply(msg_type t) {
  switch (t) {
    case msg_type::hello:
      return msg_type::hello_reply;
    case msg_type::poll:
      return msg_type::poll_reply;
    case msg_type::info:
      return msg_type::info_reply;
    case msg_type::poll_many:
      return msg_type::poll_many_reply;
    case msg_type::discover:
      return msg_type::discover_reply;
    default:
      return msg_type::ok;
  }
}

std::string waiting_text(const std::vector<uint32_t>& seqs) {
  if (seqs.empty()) return "no request is outstanding";
  std::string out = "waiting for ";
  for (size_t i = 0; i < seqs.size() && i < 8; ++i)
    out += fmt::format("{}seq {}", i ? ", " : "", seqs[i]);
  if (seqs.size() > 8) out += fmt::format(" and {} more", seqs.size() - 8);
  return out;
}

session_outcome ended(errc code, std::string text) {
  session_outcome o;
  o.what = session_outcome::kind::ended;
  o.err = {code, std::move(text)};
  return o;
}

}  // namespace

std::pair<uint32_t, std::vector<uint8_t>> client_session::start(const message& m) {
  uint32_t seq = last_seq_;
  do seq = seq % 0xFFFFFFFFu + 1;  // 1..2^32-1: seq 0 is for events
  while (pending_.contains(seq) || abandoned_.contains(seq));
  last_seq_ = seq;
  const auto t = type_of(m);
  pending_[seq] = {t, expected_reply(t)};
  return {seq, encode(m, seq, version_)};
}

std::vector<uint32_t> client_session::outstanding() const {
  std::vector<uint32_t> out;
  out.reserve(pending_.size());
  for (const auto& [seq, r] : pending_) out.push_back(seq);
  return out;
}

bool client_session::abandon(uint32_t seq) {
  if (pending_.erase(seq) == 0) return false;
  abandoned_.insert(seq);
  return true;
}

std::vector<uint32_t> client_session::end() {
  auto out = outstanding();
  pending_.clear();
  abandoned_.clear();
  return out;
}

session_outcome client_session::on_frame(uint16_t type, uint16_t flags, uint32_t seq,
                                         std::span<const uint8_t> body) {
  if (flags != 0)
    return ended(errc::malformed_frame, fmt::format("frame flags must be 0, got {:#06x}", flags));
  const auto t = static_cast<msg_type>(type);
  if (seq == 0 && (t == msg_type::event || t == msg_type::error)) {
    auto d = decode(type, 0, body, version_);
    if (!d.msg) return ended(d.code, d.error);
    if (auto* e = std::get_if<error>(&*d.msg))  // about the connection; ferryd closes it
      return ended(e->code, e->message);
    session_outcome o;
    o.what = session_outcome::kind::pushed;
    o.msg = std::move(d.msg);
    return o;
  }
  const auto it = pending_.find(seq);
  if (it == pending_.end()) {
    if (abandoned_.erase(seq) != 0) {
      session_outcome o;
      o.what = session_outcome::kind::dropped;
      o.seq = seq;
      return o;
    }
    return ended(errc::malformed_frame,
                 fmt::format("protocol error: ferryd sent a reply of type {} ({}) with seq {}, "
                             "which matches no outstanding request ({})",
                             to_string(t), type, seq, waiting_text(outstanding())));
  }
  const request req = it->second;
  pending_.erase(it);
  session_outcome o;
  o.seq = seq;
  auto d = decode(type, seq, body, version_);  // a hello_reply is read by its own version field
  if (!d.msg) {  // the stream is still in step: only this request fails
    o.what = session_outcome::kind::failed;
    o.err = {d.code, std::move(d.error)};
    return o;
  }
  if (auto* e = std::get_if<error>(&*d.msg)) {
    o.what = session_outcome::kind::refused;
    o.err = *e;
    o.draining = own_drain(*e);
    return o;
  }
  if (t != req.expect) {
    o.what = session_outcome::kind::failed;
    o.err = {errc::malformed_frame,
             fmt::format("protocol error: ferryd answered {} (seq {}) with {}, expected {}",
                         to_string(req.type), seq, to_string(t), to_string(req.expect))};
    return o;
  }
  o.what = session_outcome::kind::reply;
  o.msg = std::move(d.msg);
  return o;
}

bool own_drain(const ferry::error& e) {
  if (e.code != errc::draining) return false;
  std::string_view v(e.message);
  if (v.starts_with("room ")) {
    size_t i = 5;
    while (i < v.size() && v[i] >= '0' && v[i] <= '9') ++i;
    if (i > 5 && v.substr(i).starts_with(": ")) v.remove_prefix(i + 2);
  }
  return v.starts_with("ferryd is draining");
}

hello_outcome read_hello(session_outcome o, uint16_t lo, uint16_t hi) {
  hello_outcome h;
  switch (o.what) {
    case session_outcome::kind::reply: {
      h.reply = std::get<hello_reply>(std::move(*o.msg));
      if (h.reply.version < lo || h.reply.version > hi) {
        h.err = {errc::unsupported_version,
                 fmt::format("protocol error: ferryd answered in protocol version {}, outside "
                             "the range {}..{} this client offered",
                             h.reply.version, lo, hi)};
        return h;
      }
      h.what = hello_outcome::kind::accepted;
      return h;
    }
    case session_outcome::kind::refused:
      // A daemon that speaks only version 3 cannot read a v4 hello: it answers
      // unsupported_version, or (not knowing the trailing min_version) malformed_frame.
      h.what = hello_outcome::kind::refused;
      h.err = std::move(o.err);
      h.retry_v3 = hi >= 4 && lo <= 3 &&
                   (h.err.code == errc::unsupported_version || h.err.code == errc::malformed_frame);
      return h;
    case session_outcome::kind::failed:
    case session_outcome::kind::ended:
      h.err = std::move(o.err);
      return h;
    default:
      h.err = {errc::malformed_frame,
               "protocol error: ferryd sent an event before its hello_reply"};
      return h;
  }
}

}  // namespace ferry::proto
